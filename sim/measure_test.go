package sim

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// bruteOvershoot checks every window [s,e] with s and e at admission
// instants: the excess A(e) − A(s⁻) − B − R·(e−s), scaled by p.
func bruteOvershoot(ts []Micros, costs []int64, c, p, B int64) int64 {
	var best int64
	for i := range ts {
		var sum int64
		for j := i; j < len(ts); j++ {
			sum += costs[j]
			if ex := sum*p - c*(ts[j]-ts[i]) - B*p; ex > best {
				best = ex
			}
		}
	}
	return best
}

func TestMeterMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 7))
	for trial := 0; trial < 200; trial++ {
		count := int64(1 + rng.IntN(50))
		period := time.Duration(1+rng.IntN(3)) * time.Second
		burst := int64(1 + rng.IntN(20))
		w := &world{end: 10_000_000}
		p := us(period)
		g := gcd64(count, p)
		w.rules = []ruleRT{{limit: bucket.Per(bucket.Tokens(count), period).WithBurst(bucket.Tokens(burst)),
			c: count / g, p: p / g, bp: burst * (p / g), keys: 1, spec: RuleSpec{Burst: burst}}}
		w.ruleIdx = []uint16{0}
		w.nb = 1
		m := newMeter(1, newSeries(w.end, 10, 1, 1))
		var ts []Micros
		var costs []int64
		now := Micros(0)
		for i := 0; i < 1+rng.IntN(60); i++ {
			if rng.IntN(4) != 0 { // else several admissions at one instant
				now += Micros(rng.IntN(300_000))
			}
			cst := int64(1 + rng.IntN(5))
			ts = append(ts, now)
			costs = append(costs, cst)
			m.admit(&w.rules[0], 0, 0, cst, now)
		}
		want := bruteOvershoot(ts, costs, w.rules[0].c, w.rules[0].p, burst)
		if m.b[0].peak != want {
			t.Fatalf("trial %d: linear peak=%d, brute force=%d (c=%d p=%d B=%d)", trial, m.b[0].peak, want, w.rules[0].c, w.rules[0].p, burst)
		}
	}
}

// TestMeterTimeWeighted checks the area under the excess for one burst of
// 2B at once: the excess B falls at rate R to 0, a triangle of B²/(2R).
func TestMeterTimeWeighted(t *testing.T) {
	w := &world{end: 10_000_000}
	w.rules = []ruleRT{{c: 10, p: 1_000_000, bp: 10 * 1_000_000, keys: 1}} // 10/s, B=10
	w.ruleIdx = []uint16{0}
	m := newMeter(1, nil)
	m.admit(&w.rules[0], 0, 0, 20, 1_000_000)
	m.finish(w, w.end)
	if got := m.b[0].peak / 1_000_000; got != 10 {
		t.Fatalf("peak = %d tokens, want 10", got)
	}
	// B²/(2R) = 100/(2·10) = 5 token-seconds.
	if got := m.cold[0].area / 1e6 / 1e6; got < 4.999 || got > 5.001 {
		t.Fatalf("area = %v token·s, want 5", got)
	}
}

func TestHistogramQuantiles(t *testing.T) {
	var h histogram
	for i := 1; i <= 1000; i++ {
		h.record(Micros(i))
	}
	if q := h.quantile(0.5); q < 450 || q > 600 {
		t.Fatalf("p50 = %v, want about 500", q)
	}
	if q := h.quantile(0.99); q < 950 || q > 1000 {
		t.Fatalf("p99 = %v, want about 990", q)
	}
}

// TestSeriesBin looks up times mostly in order, as admissions come, with
// jumps back and forth, before 0 and past the end, and checks each bin
// the series returns from its last lookup against the division.
func TestSeriesBin(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, nbins := range []int{1, 2, 7, 240} {
		s := newSeries(10_000_000, nbins, 1, 1)
		tm := Micros(-50_000)
		hits := 0
		for i := 0; i < 20_000; i++ {
			switch rng.IntN(20) {
			case 0:
				tm = rng.Int64N(12_000_000) - 1_000_000
			case 1:
				tm -= rng.Int64N(s.width)
			default:
				tm += rng.Int64N(s.width / 8)
			}
			want := int(tm / s.width)
			want = max(min(want, nbins-1), 0)
			if tm >= s.from && tm < s.to {
				hits++
			}
			if got := s.bin(tm); got != want {
				t.Fatalf("%d bins: bin(%d) = %d, want %d", nbins, tm, got, want)
			}
		}
		if hits == 0 {
			t.Fatalf("%d bins: no lookup found its bin from the last one", nbins)
		}
	}
}
