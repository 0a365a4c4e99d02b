package lease

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// steadyChanges runs a contested budget whose regions' demand is steady
// within a band of ±5% (b's moves its max-min target by up to 1% of the
// budget), and counts the allocation changes the regions see over 30
// refresh intervals after warming up.
func steadyChanges(t *testing.T, hysteresis float64) (changes int, msgs int) {
	t.Helper()
	cfg := scenarioConfig()
	cfg.Hysteresis = hysteresis
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(3000), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	c := newCluster(t, cfg)
	k := bucket.Key{Rule: "api", Subject: "t1"}
	rng := rand.New(rand.NewPCG(1, 2))
	noisy := func() {
		c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 5000 + bucket.Tokens(rng.IntN(501)) - 250}
		c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 600 + bucket.Tokens(rng.IntN(61)) - 30}
		c.demand["c"] = map[bucket.Key]bucket.Tokens{k: 200}
	}
	for range 300 {
		noisy()
		c.step(100 * time.Millisecond)
	}
	prev := map[string]bucket.Tokens{}
	for _, r := range c.regions {
		l, _ := c.holders[r].Allocation(c.now, k)
		prev[r] = l.Count()
	}
	grants := c.alloc.Stats(c.now).Grants
	for range 600 { // 60 s, 30 refresh intervals
		noisy()
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
		for _, r := range c.regions {
			l, _ := c.holders[r].Allocation(c.now, k)
			if l.Count() != prev[r] {
				changes++
				prev[r] = l.Count()
			}
		}
	}
	return changes, int(c.alloc.Stats(c.now).Grants - grants)
}

// TestSteadyDemandSteadyAllocation: demand that stays within its band
// moves no allocation under the default hysteresis (3% of the budget),
// and only the renewals go out, one per region per refresh interval. With
// the previous 1%, the same demand moves allocations all the time, which
// is what the test must be able to see.
func TestSteadyDemandSteadyAllocation(t *testing.T) {
	changes, grants := steadyChanges(t, DefaultConfig().Hysteresis)
	if changes > 0 {
		t.Errorf("default hysteresis: %d allocation changes over 30 refresh intervals of steady demand, want 0", changes)
	}
	if want := 3 * 30; grants > want+3 {
		t.Errorf("default hysteresis: %d grants over 30 refresh intervals, want about the %d renewals", grants, want)
	}
	low, lowGrants := steadyChanges(t, 0.01)
	t.Logf("changes (grants): hysteresis %.2f %d (%d), 0.01 %d (%d)", DefaultConfig().Hysteresis, changes, grants, low, lowGrants)
	if low == 0 {
		t.Errorf("hysteresis 0.01: no allocation change either; the demand's noise does not reach the band, so the test shows nothing")
	}
}

// TestSmallIncreaseFromFreeCapacity: a region pressing on its allocation
// by less than the hysteresis still gets the increase when free capacity
// covers it: nobody is decreased for it.
func TestSmallIncreaseFromFreeCapacity(t *testing.T) {
	c, k := oneKeyCluster(t, 500, 300, 300)
	for range 300 {
		c.step(100 * time.Millisecond)
	}
	l, _ := c.holders["a"].Allocation(c.now, k)
	before := l.Count()
	if before != 700 {
		t.Fatalf("a holds %d, want its floor, 700\n%s", before, c.show())
	}
	// a presses on its allocation (701 > 700): its target, 737 with
	// headroom, is 37 above it, under the hysteresis of 90; the budget has
	// 3000 − 3×700 of reserve free.
	c.demand["a"][k] = 701
	for range 30 {
		c.step(100 * time.Millisecond)
	}
	if l, _ := c.holders["a"].Allocation(c.now, k); l.Count() != 737 {
		t.Fatalf("a holds %d after pressing on it, want 737: a small increase from free capacity is worth making\n%s", l.Count(), c.show())
	}
}

// TestHolderUrgentReports: between refreshes a Holder reports a key at
// once when it first presses on its allocation, again when its demand
// grows by a quarter while pressing (it is ramping up), and when its
// demand falls below an allocation above its floor and by half since it
// was last reported (it is cooling); reports of one key are a quarter of a
// refresh interval apart, or a thirty-second when the demand grew by half
// or halved; a key that keeps pressing with a steady demand, or presses again
// by less than a quarter of its allocation, waits for the periodic report.
func TestHolderUrgentReports(t *testing.T) {
	h := grantedTestHolder(t, Entry{Key: hk, Count: 300, Burst: 30}) // refresh 3 s; floor 133
	checkReports(t, h, hk, []reportStep{
		{1000 * time.Millisecond, 250, false},  // within its allocation
		{1100 * time.Millisecond, 400, true},   // presses: at once
		{1200 * time.Millisecond, 410, false},  // steady
		{1900 * time.Millisecond, 480, false},  // grew, by less than a quarter
		{2000 * time.Millisecond, 500, true},   // grew by a quarter, ¾ s on
		{2050 * time.Millisecond, 700, false},  // ramping by less than half, within ¾ s of the last
		{2080 * time.Millisecond, 1000, false}, // doubled, but within 3⁄32 s of the last
		{2100 * time.Millisecond, 1000, true},  // doubled, 3⁄32 s on
		{2300 * time.Millisecond, 1200, false}, // ramping, within ¾ s
		{2950 * time.Millisecond, 1250, true},  // grew by a quarter, ¾ s on
		{3050 * time.Millisecond, 1800, false}, // grew by less than half, within ¾ s
		{3100 * time.Millisecond, 1900, true},  // grew by half (1,875), 3⁄32 s on
		{3600 * time.Millisecond, 290, true},   // cooling: below 300 and under half of 1900
		{3650 * time.Millisecond, 140, false},  // halved again, within 3⁄32 s
		{3700 * time.Millisecond, 140, true},   // 3⁄32 s on
		{3750 * time.Millisecond, 60, false},   // within 3⁄32 s
		{4500 * time.Millisecond, 100, false},  // not half of the 140 reported
		{6800 * time.Millisecond, 100, true},   // the periodic report, a refresh interval after the last
		{7000 * time.Millisecond, 330, false},  // presses again, by less than a quarter: noise the next report carries
		{7100 * time.Millisecond, 380, true},   // presses by a quarter of its allocation
	})
}

// TestHolderCapsWantAtTheBudget: a want above the budget's count (600) is
// sent as the count, in urgent reports and periodic ones alike, while the
// urgency rules still read the whole want.
func TestHolderCapsWantAtTheBudget(t *testing.T) {
	h := grantedTestHolder(t, Entry{Key: hk, Count: 300, Burst: 30}) // refresh 3 s
	checkReports(t, h, hk, []reportStep{
		{1100 * time.Millisecond, 900, true},   // presses: at once, as 600
		{2000 * time.Millisecond, 2400, true},  // grew by a quarter, ¾ s on
		{4000 * time.Millisecond, 2400, false}, // steady
		{5100 * time.Millisecond, 2400, true},  // the periodic report
	})
}

// TestHolderReportsAFallsSecondStep: after a fall reported at once, each
// further fall by a third below the allocation is reported at once too,
// above the floor or below it (the first reading of a fall can straddle
// it); a fall by a third is not, when no fall by half started the cooling
// or the demand has risen back since.
func TestHolderReportsAFallsSecondStep(t *testing.T) {
	h := grantedTestHolder(t, Entry{Key: hk, Count: 300, Burst: 30}) // refresh 3 s; floor 133
	checkReports(t, h, hk, []reportStep{
		{1100 * time.Millisecond, 400, true},  // presses: at once
		{1900 * time.Millisecond, 290, false}, // a fall by under half: noise
		{2000 * time.Millisecond, 210, false}, // a third below 400, but not half: no cooling
		{2100 * time.Millisecond, 180, true},  // cooling: under half of 400
		{2200 * time.Millisecond, 115, true},  // the fall's second step: a third below 180
	})
	// The coordinator lowers the allocation below the floor (lending the
	// rest): a further step is still reported, since the floor it does
	// not use is lent.
	if err := h.Step(t0.Add(2250*time.Millisecond), grantMsg(1, 2, 1, 0, false, false, Entry{Key: hk, Count: 125, Burst: 12})); err != nil {
		t.Fatal(err)
	}
	h.Ready() // the acknowledgement
	if got := count(t, h, t0.Add(2250*time.Millisecond)); got != 125 {
		t.Fatalf("allocation %d after the grant, want 125", got)
	}
	checkReports(t, h, hk, []reportStep{
		{2300 * time.Millisecond, 100, false}, // less than a third below 115
		{2400 * time.Millisecond, 76, true},   // a third below 115, under the floor
		{2500 * time.Millisecond, 80, false},  // back above what was reported: cooling ends
		{2600 * time.Millisecond, 50, false},  // a third below 76, but no longer cooling
	})
}

// TestHeldFloorFreedWhenHoldEnds: a region whose use fell keeps its floor
// for the budget's fill time (its peak's hold); when that hold ends while
// another region waits for the capacity, the key is rebalanced then, not at
// the next report or round, which may be most of a refresh interval later.
func TestHeldFloorFreedWhenHoldEnds(t *testing.T) {
	// Burst one second of rate: the fill time, and so the hold, is 1 s.
	c, k := oneKeyCluster(t, 6000, 300, 300)
	for range 100 {
		c.step(100 * time.Millisecond)
	}
	// Move the demand from a to b just after a round, so the next round is
	// a whole refresh interval away.
	rounds := c.alloc.Stats(c.now).Rounds
	for c.alloc.Stats(c.now).Rounds == rounds {
		c.step(100 * time.Millisecond)
	}
	c.demand["a"][k] = 300
	c.demand["b"][k] = 6000
	held := func() bucket.Tokens {
		l, _ := c.holders["b"].Allocation(c.now, k)
		return l.Count()
	}
	for range 6 { // 600 ms: the fall is reported; a keeps its floor, 700
		c.step(100 * time.Millisecond)
	}
	if got := held(); got > 3000-700-285 {
		t.Fatalf("b holds %d 600 ms after the move, want at most 3000 − a's held floor 700 − c's 285 (300 less the margin): the hold is not shown\n%s", got, c.show())
	}
	for range 9 { // 1.5 s: the hold ended about 1.1 s after the move; the next round is at 2 s
		c.step(100 * time.Millisecond)
	}
	if got, want := held(), bucket.Tokens(3000-2*285); got < want { // a and c: 300 less the margin
		t.Fatalf("b holds %d 1.5 s after the move, want %d: a's floor is still held after its hold ended\n%s", got, want, c.show())
	}
	if err := c.checkI1(); err != nil {
		t.Fatal(err)
	}
}

// TestAckFeedsMovesAtOnce: with the Allocator ticked every 200 ms, as the
// coordinator's driver does, an acknowledgement freeing capacity a region
// waits for is answered with the increase in the same step when the region
// is short by a quarter of the budget or more (the demand moved: that Tick
// was most of a move's time), and at the next Tick when it is short by
// less (a contested budget whose demand wanders: the Tick answers every
// ack since in one grant, so steady state does not pay a grant per ack).
func TestAckFeedsMovesAtOnce(t *testing.T) {
	for _, tc := range []struct {
		name         string
		a, b, c      bucket.Tokens // demand before
		from, waiter string        // the region whose ack frees capacity, the one waiting for it
		fromWant     bucket.Tokens // from's demand after
		waiterWant   bucket.Tokens // waiter's demand after
		steps        int           // of 10 ms
		atOnce       bool
		held         bucket.Tokens // the least waiter holds at the end
	}{
		// a's demand moves to b: b waits for most of the budget.
		{"move", 6000, 300, 300, "a", "b", 300, 6000, 100, true, 3000 - 700 - 300},
		// b gives up 300 (a tenth of the budget) that a wants.
		{"wander", 6000, 900, 300, "b", "a", 600, 6000, 300, false, 3000 - 600 - 300 - 30},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, k := tickedCluster(t, tc.a, tc.b, tc.c)
			fed, granted := watchAcks(c, k, tc.from, tc.waiter)
			c.demand[tc.from][k], c.demand[tc.waiter][k] = tc.fromWant, tc.waiterWant
			for range tc.steps {
				c.step(10 * time.Millisecond)
			}
			if *fed == 0 {
				t.Fatalf("no ack from %s arrived while %s waited: the shortfall is not shown\n%s", tc.from, tc.waiter, c.show())
			}
			if (*granted > 0) != tc.atOnce {
				t.Fatalf("%d of %d acks from %s answered with %s's increase in the same step, want at once %v\n%s",
					*granted, *fed, tc.from, tc.waiter, tc.atOnce, c.show())
			}
			if got := allocated(c, tc.waiter, k); got < tc.held {
				t.Fatalf("%s holds %d at the end, want at least %d\n%s", tc.waiter, got, tc.held, c.show())
			}
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// tickedCluster is oneKeyCluster with the Allocator ticked every 200 ms, as
// the coordinator's driver does, run for 10 s of 10 ms steps.
func tickedCluster(t *testing.T, a, b, c bucket.Tokens) (*cluster, bucket.Key) {
	t.Helper()
	cl, k := oneKeyCluster(t, a, b, c)
	cl.tickEvery = 200 * time.Millisecond
	for range 1000 {
		cl.step(10 * time.Millisecond)
	}
	return cl, k
}

// watchAcks counts, from now on, the acknowledgements from region from of a
// new version while region waiter wants more of k than it holds (fed), and
// those answered in the same step with a grant raising waiter's
// allocation of k (granted).
func watchAcks(c *cluster, k bucket.Key, from, waiter string) (fed, granted *int) {
	fed, granted = new(int), new(int)
	rf := c.alloc.byName[from]
	w := slices.Index([]string{"a", "b", "c"}, waiter)
	c.stepped = func(m Message) {
		if m.Type != MsgAck || m.Region != from {
			return
		}
		hk := c.alloc.keys[c.alloc.keyIdx[k]]
		if m.Version != rf.acked || hk.slots[w].want <= hk.slots[w].cur {
			return
		}
		*fed++
		for _, o := range c.alloc.out {
			if o.Type != MsgGrant || o.Region != waiter {
				continue
			}
			for _, e := range o.Entries {
				if e.Key == k && int64(e.Count) > hk.slots[w].hist[0].count {
					*granted++
					return
				}
			}
		}
	}
	return fed, granted
}

// allocated is what region holds of k now.
func allocated(c *cluster, region string, k bucket.Key) bucket.Tokens {
	l, _ := c.holders[region].Allocation(c.now, k)
	return l.Count()
}

// TestHolderReportsStopBelowFloor: a region granted part of its floor (the
// rest lent) reports at once when its use of the key stops, since the
// coordinator lends the rest at once to a region that stopped; it does not
// report a mere halving below its floor (contested budgets in steady state
// hold such shares), nor the same stop twice, nor the stop of a key it was
// granted nothing for (its floor, which nobody else is lent).
func TestHolderReportsStopBelowFloor(t *testing.T) {
	run := func(key bucket.Key, grant []Entry, steps []reportStep) {
		t.Helper()
		h := grantedTestHolder(t, grant...) // refresh 3 s; floor 133
		checkReports(t, h, key, steps)
	}
	run(hk, []Entry{{Key: hk, Count: 100, Burst: 10}}, []reportStep{
		{3000 * time.Millisecond, 90, true},  // the periodic report
		{3500 * time.Millisecond, 40, false}, // halved, below its floor: noise the next report carries
		{3600 * time.Millisecond, 0, true},   // stopped: at once
		{3800 * time.Millisecond, 0, false},  // stopped, already told
		{4500 * time.Millisecond, 0, false},  // still
		{6600 * time.Millisecond, 0, true},   // the periodic report
		{6800 * time.Millisecond, 50, false}, // back, within its allocation
		{9600 * time.Millisecond, 50, true},  // the periodic report
		{9700 * time.Millisecond, 0, true},   // stopped again: at once
	})
	cold := bucket.Key{Rule: hk.Rule, Subject: "cold"}
	run(cold, nil, []reportStep{
		{3000 * time.Millisecond, 90, true}, // the periodic report
		{3600 * time.Millisecond, 0, false}, // stopped, on its floor: the next report carries it
		{6000 * time.Millisecond, 0, true},  // the periodic report
	})
}

// oneKeyCluster is a cluster of regions a, b and c sharing a budget of
// 3,000 a second with a burst of one second of rate (so a fill time, and
// a held floor's hold, of 1 s) and a reserve of 0.3 (floors of 700), with
// demand for one key, which it returns, of a, b and c a second.
func oneKeyCluster(t *testing.T, a, b, c bucket.Tokens) (*cluster, bucket.Key) {
	t.Helper()
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(3000), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	cl := newCluster(t, cfg)
	k := bucket.Key{Rule: "api", Subject: "t1"}
	cl.demand["a"] = map[bucket.Key]bucket.Tokens{k: a}
	cl.demand["b"] = map[bucket.Key]bucket.Tokens{k: b}
	cl.demand["c"] = map[bucket.Key]bucket.Tokens{k: c}
	return cl, k
}

// reportStep is a demand given a Holder at a time after t0, and whether a
// report goes out then.
type reportStep struct {
	at     time.Duration
	want   bucket.Tokens
	report bool
}

// checkReports gives h key's demand at each step, ticks it, and checks
// that a report, carrying that demand (at most the budget's count, which
// a want above it is sent as), goes out exactly at the steps that say so.
func checkReports(t *testing.T, h *Holder, key bucket.Key, steps []reportStep) {
	t.Helper()
	count := h.budgets[key.Rule].b.Limit.Count()
	for _, s := range steps {
		now := t0.Add(s.at)
		h.Demand(now, key, s.want)
		h.Tick(now)
		var got *Message
		for _, m := range h.Ready() {
			if m.Type == MsgReport {
				got = &m
			}
		}
		if (got != nil) != s.report {
			t.Fatalf("%s at %s with demand %d: report sent %v, want %v", key.Subject, s.at, s.want, got != nil, s.report)
		}
		if want := min(s.want, count); got != nil && (len(got.Demand) != 1 || got.Demand[0].Key != key || got.Demand[0].Want != want) {
			t.Fatalf("%s at %s: report %v, want demand %d", key.Subject, s.at, got.Demand, want)
		}
	}
}

// TestTickFeedsSmallShortfallsSparingly: ticked every 10 ms while a
// contested budget's demand wanders (b's want moves by a tenth of the
// budget every 100 ms, a wants more than the rest), the Allocator
// rebalances the keys waiting by less than a move between rounds at most
// once per Refresh/feedShare, and those waiting for 1/nearShare of the
// budget or more at most once per Refresh/nearFeed, not at the first Tick
// after each acknowledgement; and both still raise allocations.
func TestTickFeedsSmallShortfallsSparingly(t *testing.T) {
	c, k := tickedCluster(t, 6000, 900, 300)
	c.tickEvery = 10 * time.Millisecond
	type feeds struct {
		name  string
		every time.Duration
		count func(Stats) uint64
		n     uint64
		at    []time.Time
		// raised counts the feeds that raised an allocation.
		raised int
	}
	kinds := []*feeds{
		{name: "every key waiting", every: c.alloc.cfg.Refresh / feedShare, count: func(s Stats) uint64 { return s.Fed }},
		{name: "keys waiting for 1/nearShare", every: c.alloc.cfg.Refresh / nearFeed, count: func(s Stats) uint64 { return s.FedNear }},
	}
	for _, f := range kinds {
		f.n = f.count(c.alloc.Stats(c.now))
	}
	for i := range 1000 { // 10 s
		if i%10 == 0 {
			c.demand["b"][k] = []bucket.Tokens{300, 900}[i/10%2]
		}
		increases := c.alloc.Stats(c.now).Increases
		c.step(10 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
		st := c.alloc.Stats(c.now)
		for _, f := range kinds {
			if n := f.count(st); n > f.n {
				f.n = n
				if st.Increases > increases {
					f.raised++
				}
				if m := len(f.at); m > 0 && c.now.Sub(f.at[m-1]) < f.every {
					t.Fatalf("feeds of %s at +%s and +%s, less than %s apart\n%s", f.name, f.at[m-1].Sub(t0), c.now.Sub(t0), f.every, c.show())
				}
				f.at = append(f.at, c.now)
			}
		}
	}
	for _, f := range kinds {
		if len(f.at) < 5 || f.raised < 3 {
			t.Fatalf("%d feeds of %s between rounds in 10 s, %d of them raising an allocation; want at least 5 and 3\n%s", len(f.at), f.name, f.raised, c.show())
		}
		t.Logf("%d feeds of %s, %d raising an allocation", len(f.at), f.name, f.raised)
	}
}

// TestFallingReadingStartsNoHold: a region's peak holds its floor for the
// fill time from the reading that set it. A reading lower than the one
// before, once that hold has ended, starts none of its own (the demand
// moved away from a level held longer than the fill time); a rise does,
// and a fall within a hold keeps it.
func TestFallingReadingStartsNoHold(t *testing.T) {
	const hold = int64(time.Second)
	held := func(s *slot, t int64) bool { return t-s.peakAt <= hold }
	var s slot
	steps := []struct {
		at   time.Duration
		want int64
		held bool
		peak int64
		why  string
	}{
		{0, 6000, true, 6000, "the first reading"},
		{2 * time.Second, 6000, true, 6000, "the level, reported again after the hold ended: a new hold"},
		{3500 * time.Millisecond, 1054, false, 1054, "the first reading of a fall, the hold ended: none"},
		{3600 * time.Millisecond, 312, false, 312, "falling further: none"},
		{4 * time.Second, 900, true, 900, "a rise: a new hold"},
		{4100 * time.Millisecond, 100, true, 900, "a fall within that hold keeps it"},
		{5200 * time.Millisecond, 50, false, 50, "falling after it ended: none"},
	}
	for _, st := range steps {
		at := int64(st.at)
		s.setWant(at, st.want, hold, int64(time.Minute))
		if held(&s, at) != st.held || s.peak != st.peak {
			t.Fatalf("at %s, want %d (%s): held %v peak %d, want held %v peak %d", st.at, st.want, st.why, held(&s, at), s.peak, st.held, st.peak)
		}
	}
}

// TestUncontestedBudgetKeepsABurstsRaise: a region whose use of a key comes
// in bursts keeps its raise through a lull while the budget is
// uncontested and the keep leaves half the reserve free, so its next burst
// finds it; the keep ends Hold after the region last used half of it, and
// at once when another region's demand needs the capacity.
func TestUncontestedBudgetKeepsABurstsRaise(t *testing.T) {
	c, k := oneKeyCluster(t, 1200, 300, 300) // floors 700, reserve 900; Hold 14 s
	for range 50 {
		c.step(100 * time.Millisecond)
	}
	raised := allocated(c, "a", k)
	if raised < 1200 {
		t.Fatalf("a holds %d after 5 s at 1,200 a second, want at least 1,200\n%s", raised, c.show())
	}
	c.demand["a"][k] = 100 // the lull: still using the key
	for range 60 {         // 6 s: three rounds
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	if got := allocated(c, "a", k); got != raised {
		t.Fatalf("a holds %d after 6 s of a lull, want the %d it was raised to kept\n%s", got, raised, c.show())
	}
	c.demand["a"][k] = 1200 // the next burst finds its raise
	for range 5 {
		c.step(100 * time.Millisecond)
	}
	c.demand["a"][k] = 100
	for range 130 { // 13 s of lull: still within Hold of the burst
		c.step(100 * time.Millisecond)
	}
	if got := allocated(c, "a", k); got != raised {
		t.Fatalf("a holds %d 13 s after its last burst, want %d kept within Hold (14 s)\n%s", got, raised, c.show())
	}
	for range 40 { // past Hold: the keep ends at the next round
		c.step(100 * time.Millisecond)
	}
	if got := allocated(c, "a", k); got > 700 {
		t.Fatalf("a holds %d 17 s after its last burst, want its floor of 700 at most: the keep outlived Hold\n%s", got, c.show())
	}

	// c presses for 1,000: the budget is not contested (a's use, b's and
	// c's fit), but a's keep would leave less than half the reserve free,
	// so it yields at once.
	c.demand["a"][k] = 1200
	for range 30 {
		c.step(100 * time.Millisecond)
	}
	c.demand["a"][k] = 100
	for range 30 {
		c.step(100 * time.Millisecond)
	}
	if got := allocated(c, "a", k); got != raised {
		t.Fatalf("a holds %d in its second lull, want %d\n%s", got, raised, c.show())
	}
	c.demand["c"][k] = 1000
	for range 30 { // 3 s: a round and the acknowledgements
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	if got := allocated(c, "c", k); got < 1000 {
		t.Fatalf("c holds %d 3 s after pressing for 1,000, want at least 1,000\n%s", got, c.show())
	}
	if got := allocated(c, "a", k); got >= raised {
		t.Fatalf("a still holds %d after c pressed, want its keep given up\n%s", got, c.show())
	}
}

// TestKeepEndsWithTheLeadership: a new leader knows no region's top, so a
// region in a lull when the leadership changes loses its keep at the new
// leader's first rebalance of the key, as design.md says.
func TestKeepEndsWithTheLeadership(t *testing.T) {
	c, k := oneKeyCluster(t, 1200, 300, 300)
	for range 50 {
		c.step(100 * time.Millisecond)
	}
	raised := allocated(c, "a", k)
	c.demand["a"][k] = 100
	for range 30 {
		c.step(100 * time.Millisecond)
	}
	if got := allocated(c, "a", k); got != raised {
		t.Fatalf("a holds %d in its lull, want %d kept\n%s", got, raised, c.show())
	}
	c.leaderChange()
	for range 150 { // 15 s: the new leader learns (at most TTL + 2×Drift) and rebalances
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	if got := allocated(c, "a", k); got > 700 {
		t.Fatalf("a holds %d 15 s after the leader changed, want its floor of 700 at most: a top outlived the leadership\n%s", got, c.show())
	}
}

// TestRaiseWorthItsCostTakesSmallDecreases: a region whose target rises by
// more than the hysteresis gets the raise even when the regions that fund
// it each give back less than the hysteresis. The budget is contested (a
// wants 5,000 of 3,000), so each met region is given its demand less the
// headroom. b's demand rises from 500 to 600 (its target from 475 to 570,
// by 95, over the band of 90) while c's falls from 500 to 440 (its target
// by 57); what b needs comes from c (57) and a (38), each under the band.
// Before, c's decrease was skipped, the budget had nothing free, and b held
// 513 for as long as the demands held.
func TestRaiseWorthItsCostTakesSmallDecreases(t *testing.T) {
	c, k := oneKeyCluster(t, 5000, 500, 500)
	for range 300 {
		c.step(100 * time.Millisecond)
	}
	held := func(r string) bucket.Tokens {
		l, _ := c.holders[r].Allocation(c.now, k)
		return l.Count()
	}
	if b := held("b"); b != 475 {
		t.Fatalf("b holds %d, want 475 (500 less its headroom)\n%s", b, c.show())
	}
	c.demand["b"][k], c.demand["c"][k] = 600, 440
	for range 60 {
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	if b := held("b"); b != 570 {
		t.Fatalf("b holds %d three refresh intervals after its demand rose to 600, want 570: a raise over the hysteresis is worth the small decreases that fund it\n%s", b, c.show())
	}
}
