package chaos

import (
	"math"
	"math/rand/v2"
	"testing"
	"time"
)

const ms = time.Millisecond

// bruteExcess tries every window [a, b] with a a send and b an answer
// instant, and counts the certain admissions of each directly.
func bruteExcess(adm []Span, rate, burst float64, w Windows) Excess {
	best := Excess{Tokens: math.Inf(-1)}
	for _, x := range adm {
		a := x.Send
		if a < w.ALo || a > w.AHi {
			continue
		}
		for _, y := range adm {
			b := y.Answer
			if b < a || b < w.BLo || b > w.BHi {
				continue
			}
			var n float64
			for _, z := range adm {
				if z.Send >= a && z.Answer <= b {
					n += z.Tokens
				}
			}
			if e := n - burst - rate*(b-a).Seconds(); e > best.Tokens {
				best = Excess{Tokens: e, From: a, To: b, Found: true}
			}
		}
	}
	if !best.Found {
		return Excess{}
	}
	return best
}

// TestExcessCountsOnlyCertainAdmissions checks the send/answer rule on
// histories built by hand: an admission whose span straddles a window's
// edge is not counted in it.
func TestExcessCountsOnlyCertainAdmissions(t *testing.T) {
	// Rate 10/s, burst 3. Four admissions of one token inside [0, 100ms]
	// exceed 3 + 10×0.1 = 4 by nothing; five exceed it by one.
	four := []Span{{0, 1 * ms, 1}, {10 * ms, 11 * ms, 1}, {20 * ms, 21 * ms, 1}, {99 * ms, 100 * ms, 1}}
	if e := MaxExcess(four, 10, 3, All); math.Abs(e.Tokens-(4-3-10*0.1)) > 1e-9 {
		t.Fatalf("four in 100 ms: excess %v, want 0", e.Tokens)
	}
	five := append(four, Span{50 * ms, 51 * ms, 1})
	e := MaxExcess(five, 10, 3, All)
	if math.Abs(e.Tokens-1) > 1e-9 || e.From != 0 || e.To != 100*ms {
		t.Fatalf("five in 100 ms: excess %+v, want 1 over [0, 100ms]", e)
	}
	// The same five, but the fifth was answered only a second later: it
	// may have happened after the burst's window, so it does not count
	// there, and a window long enough to hold it holds more refill.
	late := append(four, Span{50 * ms, 1100 * ms, 1})
	if e := MaxExcess(late, 10, 3, All); e.Tokens > 1e-9 {
		t.Fatalf("a fifth answered a second later: excess %+v, want ≤ 0", e)
	}
	// Sent before the window's start: likewise not counted.
	early := append(four, Span{-500 * ms, 60 * ms, 1})
	if e := MaxExcess(early, 10, 3, All); e.Tokens > 1e-9 {
		t.Fatalf("a fifth sent 500 ms earlier: excess %+v, want ≤ 0", e)
	}
	// Costs count as tokens.
	heavy := []Span{{0, 1 * ms, 3}, {5 * ms, 6 * ms, 2}}
	if e := MaxExcess(heavy, 10, 3, All); math.Abs(e.Tokens-(5-3-10*0.006)) > 1e-9 {
		t.Fatalf("costs 3+2 in 6 ms: excess %v, want %v", e.Tokens, 5-3-10*0.006)
	}
}

// TestExcessMatchesBruteForce compares the O(n log n) sweep with trying
// every window, on random histories with overlapping spans, equal
// instants and every kind of window restriction.
func TestExcessMatchesBruteForce(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for trial := range 400 {
		n := 1 + rng.IntN(40)
		adm := make([]Span, n)
		for i := range adm {
			s := time.Duration(rng.IntN(2000)) * ms / 4
			if rng.IntN(5) == 0 && i > 0 {
				s = adm[rng.IntN(i)].Send // equal sends
			}
			adm[i] = Span{Send: s, Answer: s + time.Duration(rng.IntN(200))*ms/4, Tokens: float64(1 + rng.IntN(3))}
		}
		rate, burst := float64(1+rng.IntN(50)), float64(rng.IntN(10))
		u := time.Duration(rng.IntN(500)) * ms
		v := u + time.Duration(rng.IntN(300))*ms
		for _, w := range []Windows{All, Meeting(u, v), Inside(u, v)} {
			got, want := MaxExcess(adm, rate, burst, w), bruteExcess(adm, rate, burst, w)
			if got.Found != want.Found || math.Abs(got.Tokens-want.Tokens) > 1e-6 {
				t.Fatalf("trial %d, windows %+v: sweep %+v, brute force %+v\n%v", trial, w, got, want, adm)
			}
		}
	}
}

// TestInjectedExcessIsCaught builds an open-loop history that keeps to
// B + R·t, then injects a burst of extra admissions, and checks that the
// checker reports the injected excess (less what the burst's own span
// allows) and only in windows that meet it.
func TestInjectedExcessIsCaught(t *testing.T) {
	const rate, burst = 1000.0, 200.0
	rng := rand.New(rand.NewPCG(7, 7))
	// An exact bucket admits at most B + R·t: every admission decided by
	// IdealAdmits on Poisson arrivals at 1.5× the rate, with answers 0–2 ms
	// after the send.
	var arr []Arrival
	at := time.Duration(0)
	for at < 10*time.Second {
		at += time.Duration(rng.ExpFloat64() / (1.5 * rate) * float64(time.Second))
		arr = append(arr, Arrival{At: at, Tokens: 1})
	}
	ok := IdealAdmits(arr, rate, burst)
	var adm []Span
	for i, a := range arr {
		if ok[i] {
			adm = append(adm, Span{Send: a.At, Answer: a.At + time.Duration(rng.IntN(2000))*time.Microsecond, Tokens: 1})
		}
	}
	if e := MaxExcess(adm, rate, burst, All); e.Tokens > 0 {
		t.Fatalf("an exact bucket's admissions: excess %+v, want ≤ 0", e)
	}
	// 300 extra tokens admitted within 50 ms at 5 s: the excess is about
	// 300 − 1000×0.05 = 250 (the bucket was near empty then).
	for i := range 300 {
		s := 5*time.Second + time.Duration(i)*50*ms/300
		adm = append(adm, Span{Send: s, Answer: s + ms, Tokens: 1})
	}
	e := MaxExcess(adm, rate, burst, All)
	if e.Tokens < 200 || e.From > 5*time.Second+50*ms || e.To < 5*time.Second {
		t.Fatalf("300 injected tokens: excess %+v, want ≥ 200 in a window around 5 s", e)
	}
	if e2 := MaxExcess(adm, rate, burst, Meeting(4*time.Second, 6*time.Second)); e2.Tokens != e.Tokens {
		t.Fatalf("windows meeting [4 s, 6 s]: %+v, want the same %v", e2, e.Tokens)
	}
	if e3 := MaxExcess(adm, rate, burst, Inside(0, 4900*ms)); e3.Tokens > 0 {
		t.Fatalf("windows before the injection: %+v, want ≤ 0", e3)
	}
	if e4 := MaxExcess(adm, rate, burst, Inside(5100*ms, 10*time.Second)); e4.Tokens > 0 {
		t.Fatalf("windows after the injection: %+v, want ≤ 0", e4)
	}
	// Had the injected admissions been answered only two seconds after
	// their sends, none certainly falls in a window that ends before
	// 7 s; a window long enough to hold their spans still holds all 300
	// (the bucket was saturated throughout, so nothing else makes room).
	for i := len(adm) - 300; i < len(adm); i++ {
		adm[i].Answer = adm[i].Send + 2*time.Second
	}
	if e5 := MaxExcess(adm, rate, burst, Inside(0, 6900*ms)); e5.Tokens > 0 {
		t.Fatalf("injected admissions answered 2 s late, windows ending by 6.9 s: %+v, want ≤ 0", e5)
	}
	if e6 := MaxExcess(adm, rate, burst, All); e6.Tokens < 200 || e6.From > 5*time.Second || e6.To < 7*time.Second {
		t.Fatalf("injected admissions answered 2 s late, every window: %+v, want ≥ 200 in a window holding [5 s, 7.05 s]", e6)
	}
}

func TestIdealAdmitsIsAnExactBucket(t *testing.T) {
	// Burst 2, rate 10/s: three at once admit two; the next token is back
	// after 100 ms.
	arr := []Arrival{{0, 1}, {0, 1}, {0, 1}, {50 * ms, 1}, {100 * ms, 1}, {101 * ms, 1}}
	got := IdealAdmits(arr, 10, 2)
	want := []bool{true, true, false, false, true, false}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("arrival %d: admitted %v, want %v (all: %v)", i, got[i], want[i], got)
		}
	}
}

func TestFairShares(t *testing.T) {
	for _, c := range []struct {
		capacity float64
		demand   []float64
		want     []float64
	}{
		{1000, []float64{900, 150, 150}, []float64{700, 150, 150}},
		{1000, []float64{900, 900, 150}, []float64{425, 425, 150}},
		{1000, []float64{100, 100, 100}, []float64{100, 100, 100}},
		{1000, []float64{0, 2000, 0}, []float64{0, 1000, 0}},
	} {
		got := FairShares(c.capacity, c.demand)
		for i := range got {
			if math.Abs(got[i]-c.want[i]) > 1e-9 {
				t.Fatalf("FairShares(%v, %v) = %v, want %v", c.capacity, c.demand, got, c.want)
			}
		}
	}
}
