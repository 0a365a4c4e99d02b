package sim

import (
	"context"
	"errors"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestFailoverLosesUnreplicatedWrites writes one token a millisecond for
// 100 ms with a 10 ms replication lag, fails over, and expects the writes
// of the last 10 ms lost and the replica's state as of 90 ms.
func TestFailoverLosesUnreplicatedWrites(t *testing.T) {
	l := bucket.PerSecond(100).WithBurst(1000)
	rd := newRegionalRedis(1, nodeClock{}, nodeClock{}, 10_000, true)
	for ms := Micros(1); ms <= 100; ms++ {
		if d := rd.decide(0, ms*1000, l, 1); !d.Allowed {
			t.Fatalf("write at %d ms denied", ms)
		}
	}
	before := rd.peek(0, 100_000, l).Remaining
	rd.failover(100_000, 3_000_000)
	if got := rd.lost[0]; got != 10 {
		t.Fatalf("lost %d tokens, want the 10 written in the last 10 ms", got)
	}
	if rd.up(100_000) || rd.up(3_099_999) || !rd.up(3_100_000) {
		t.Fatal("the region must have no primary for the failover window only")
	}
	// The new primary holds the state written at 90 ms: the 10 tokens
	// debited since are available again.
	if after := rd.peek(0, 100_000, l).Remaining; after-before != 10 {
		t.Fatalf("remaining %d before the failover, %d after: want 10 more", before, after)
	}
}

// TestRebaseCarriesTokens: a region whose allocation grows from its floor
// (burst 10, never touched: full) to burst 20 can admit 10 at once, not 20.
func TestRebaseCarriesTokens(t *testing.T) {
	floor := bucket.PerSecond(10).WithBurst(10)
	big := bucket.PerSecond(20).WithBurst(20)
	rd := newRegionalRedis(1, nodeClock{}, nodeClock{}, 0, false)
	if _, ok := rd.rebase(0, 0, floor, big); !ok {
		t.Fatal("rebase with the primary up reported no primary")
	}
	if d := rd.peek(0, 0, big); d.Remaining != 10 {
		t.Fatalf("after an increase remaining = %d, want 10", d.Remaining)
	}
}

// TestSettleRefillsAtTheNewRate: a bucket emptied at 100/s and rebased to
// 10/s the same instant refills 5 tokens in half a second, not 50.
func TestSettleRefillsAtTheNewRate(t *testing.T) {
	old := bucket.PerSecond(100).WithBurst(100)
	small := bucket.PerSecond(10).WithBurst(100)
	rd := newRegionalRedis(1, nodeClock{}, nodeClock{}, 0, false)
	if got := rd.takeUpTo(0, 0, old, 100); got != 100 {
		t.Fatalf("took %d, want 100", got)
	}
	rd.rebase(0, 0, old, small)
	if d := rd.peek(0, 500_000, small); d.Remaining != 5 {
		t.Fatalf("settled: remaining after 0.5 s = %d, want 5", d.Remaining)
	}
	// Unsettled, the state written at 100/s refills at 100/s until the
	// next operation re-expresses it: 50 tokens.
	lazy := newRegionalRedis(1, nodeClock{}, nodeClock{}, 0, false)
	lazy.takeUpTo(0, 0, old, 100)
	if d := lazy.peek(0, 500_000, small); d.Remaining != 50 {
		t.Fatalf("lazy: remaining after 0.5 s = %d, want 50", d.Remaining)
	}
}

// TestRegionStoreUnavailableInFailover: the store the speaking agent
// settles in answers bucket.ErrUnavailable while no primary does, so the
// Speaker lists the change again.
func TestRegionStoreUnavailableInFailover(t *testing.T) {
	_, a := smallWorld(t, "scenarios/01-steady-skewed.yaml", 0.01)
	rd := newRegionalRedis(1, nodeClock{}, nodeClock{}, 0, true)
	a.redis[0] = rd
	s := &regionStore{p: a.plane, rd: rd, r: 0, from: 0}
	key := a.plane.keys[0]
	l := bucket.PerSecond(10).WithBurst(10)
	if _, err := s.Rebase(context.Background(), key, l, l.WithBurst(5), 0); err != nil {
		t.Fatalf("rebase with the primary up: %v", err)
	}
	rd.failover(0, 1_000_000)
	s.t = 500_000
	if _, err := s.TakeUpTo(context.Background(), key, l, 1); !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("take during a failover: err %v, want ErrUnavailable", err)
	}
	s.t = 1_000_000
	if _, err := s.TakeUpTo(context.Background(), key, l, 1); err != nil {
		t.Fatalf("take after the failover: %v", err)
	}
	if _, err := s.Peek(context.Background(), bucket.Key{Rule: key.Rule, Subject: "nope"}, l); err == nil {
		t.Fatal("an unknown key was answered")
	}
}

func TestNetworkPartitionsAndLoss(t *testing.T) {
	n := &network{lat: [][]Micros{{500, 40_000}, {40_000, 500}}}
	rng := rand.New(rand.NewPCG(1, 2))
	agent0, redis0 := node{kind: kindAgent, region: 0}, node{kind: kindRedis, region: 0}
	coord := node{kind: kindCoordinator, region: 1}
	if at, ok := n.send(rng, agent0, coord, 1000); !ok || at != 41_000 {
		t.Fatalf("send = %d, %v; want 41000, true", at, ok)
	}
	c := cut{kind: FaultCoordinatorCut, region: 0, agent: -1}
	n.addCut(c)
	if _, ok := n.send(rng, agent0, coord, 0); ok {
		t.Fatal("a coordinator cut let a message through")
	}
	if _, ok := n.send(rng, agent0, redis0, 0); !ok {
		t.Fatal("a coordinator cut blocked the regional Redis")
	}
	n.removeCut(c)
	n.addCut(cut{kind: FaultRedisCut, region: 0, agent: 1})
	if _, ok := n.send(rng, agent0, redis0, 0); !ok {
		t.Fatal("a cut of agent 1 blocked agent 0")
	}
	if _, ok := n.send(rng, node{kind: kindAgent, region: 0, idx: 1}, redis0, 0); ok {
		t.Fatal("a cut of agent 1 let agent 1 through")
	}
	n.cuts = nil
	n.loss = 0.25
	lost := 0
	for i := 0; i < 10000; i++ {
		if _, ok := n.send(rng, agent0, redis0, 0); !ok {
			lost++
		}
	}
	if lost < 2300 || lost > 2700 {
		t.Fatalf("lost %d of 10000 at loss 0.25", lost)
	}
}

// TestTrafficRates checks the arrival processes against their means.
func TestTrafficRates(t *testing.T) {
	sc := synthetic(1, 10, 1, time.Minute)
	cases := []struct {
		name string
		ts   TrafficSpec
		want float64 // mean arrivals per second
	}{
		{"poisson", TrafficSpec{Region: "r00", Rule: "tenant", Rate: 2000, Kind: "poisson", Stop: 100 * time.Second}, 2000},
		{"bursty", TrafficSpec{Region: "r00", Rule: "tenant", Rate: 2000, Kind: "bursty", BurstFactor: 5, BurstOn: time.Second, BurstOff: 4 * time.Second, Stop: 100 * time.Second}, 2000},
		{"diurnal", TrafficSpec{Region: "r00", Rule: "tenant", Rate: 2000, Kind: "poisson", Stop: 100 * time.Second,
			Diurnal: &DiurnalSpec{Amplitude: 0.8, Period: 20 * time.Second}}, 2000},
	}
	for _, c := range cases {
		rng := rand.New(rand.NewPCG(3, 4))
		src := newSource(sc, c.ts, rng, []int{0})
		n := 0
		for at := src.next(rng, -1); at >= 0; at = src.next(rng, at) {
			n++
		}
		got := float64(n) / 100
		if math.Abs(got-c.want)/c.want > 0.1 {
			t.Errorf("%s: %.0f arrivals/s, want about %.0f", c.name, got, c.want)
		}
	}
}

// TestIdealMatchesBucket decides random requests with the ideal bucket's
// integer arithmetic and with bucket.Decide side by side, on limits whose
// emission interval is a whole number of µs and on limits where it is
// not (600 and 7 per second, 1000 per minute), bursts from 1 up to
// several times the count, costs up to beyond the burst, and arrivals
// from far apart to several in one µs: every decision must agree, and
// the requests must include admissions and denials of both kinds.
func TestIdealMatchesBucket(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	limits := []struct {
		count  int64
		period time.Duration
		burst  int64
	}{
		{1000, time.Second, 1000}, {600, time.Second, 600}, {600, time.Second, 60}, {7, time.Second, 1},
		{1000, time.Minute, 5000}, {3, time.Millisecond, 3}, {1_000_000, time.Second, 100},
	}
	for _, lc := range limits {
		sc := &Scenario{Name: "ideal", Duration: time.Hour,
			Regions: []RegionSpec{{Name: "a"}},
			Rules:   []RuleSpec{{Name: "r", Count: lc.count, Period: lc.period, Burst: lc.burst, Keys: 2}},
			Traffic: []TrafficSpec{{Region: "a", Rule: "r", Rate: 1}}}
		sc.setDefaults()
		if err := sc.Validate(); err != nil {
			t.Fatal(err)
		}
		w, err := newWorld(sc, 1, Options{})
		if err != nil {
			t.Fatal(err)
		}
		l := w.rules[0].limit
		states := make([]bucket.State, 2)
		var now Micros
		var admitted, denied, never int
		// The mean gap is about one token's interval, so the buckets
		// both fill and run dry.
		gap := max(float64(lc.period/time.Microsecond)/float64(lc.count), 1)
		for i := 0; i < 20_000 && now < w.end; i++ {
			now += Micros(rng.ExpFloat64() * gap * 1.5)
			b := rng.IntN(2)
			cost := 1 + rng.Int64N(lc.burst+1) // up to burst+1: some never fit
			if rng.IntN(2) == 0 {
				cost = 1
			}
			d, ns, err := bucket.Decide(states[b], wall(now), l, bucket.Tokens(cost))
			want := err == nil && d.Allowed
			if want {
				states[b] = ns
				admitted++
			} else if errors.Is(err, bucket.ErrNeverFits) {
				never++
			} else {
				denied++
			}
			if got := w.idealDecide(w.ruleOf(b), b, now, cost); got != want {
				t.Fatalf("%d per %s burst %d: request %d (budget %d, cost %d at %d µs): ideal says %v, bucket.Decide %v (err %v)",
					lc.count, lc.period, lc.burst, i, b, cost, now, got, want, err)
			}
		}
		if admitted == 0 || denied == 0 || never == 0 {
			t.Errorf("%d per %s burst %d: %d admitted, %d denied, %d never fit: the test needs all three",
				lc.count, lc.period, lc.burst, admitted, denied, never)
		}
	}
}
