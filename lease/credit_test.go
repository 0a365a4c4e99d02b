package lease

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestHolderTakesEachCreditOnce: the stored reserve tokens a grant carries
// are taken once, when the Holder adopts it; a duplicate, a full table
// resent without them and a learning leader's grant add none.
func TestHolderTakesEachCreditOnce(t *testing.T) {
	h := newTestHolder(t)
	hello := h.Ready()[0]
	g1 := grantMsg(1, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 300, Burst: 30, Credit: 17})
	_ = h.Step(t0, g1)
	_ = h.Step(t0, g1) // a duplicate
	if got := h.TakeCredits()[hk]; got != 17 {
		t.Fatalf("after a grant and its duplicate: credit %d, want 17", got)
	}
	if got := h.TakeCredits(); len(got) != 0 {
		t.Fatalf("taken twice: %v", got)
	}
	for _, e := range h.Table() {
		if e.Credit != 0 {
			t.Fatalf("the table keeps a credit: %+v", e)
		}
	}
	learning := grantMsg(2, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 200, Burst: 20, Credit: 9})
	learning.Learning = true
	_ = h.Step(t0, learning)
	if got := h.TakeCredits(); len(got) != 0 {
		t.Fatalf("a learning leader's grant carried %v, want nothing", got)
	}
}

// TestReserveTokensGoWithTheRaise: a key hot after the reserve has been
// unclaimed for its fill time carries the reserve's stored tokens (the
// burst no floor holds, 600 − 3×140) with the raise that claims it, and no
// more: the floors lent next were claimed all along, so they carry
// nothing, and while the claims fill the budget the reserve stores
// nothing. Once every region is back at its floor the key is kept until
// the reserve has refilled, so the next raise again carries all of it,
// and not before the fill time.
func TestReserveTokensGoWithTheRaise(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	c := newCluster(t, cfg)
	k := bucket.Key{Rule: "api", Subject: "t1"}
	taken := map[string]bucket.Tokens{}
	step := func(n int) {
		t.Helper()
		for range n {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
			for r, h := range c.holders {
				taken[r] += h.TakeCredits()[k]
			}
		}
	}
	step(30) // learning ends; the reserve fills
	if c.alloc.Learning(c.now) {
		t.Fatal("still learning after 3 s")
	}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
	step(30)
	if l, _ := c.holders["a"].Allocation(c.now, k); l.Count() < 500 {
		t.Fatalf("a holds %d, want most of the budget once b and c lend", l.Count())
	}
	if taken["a"] != 180 || taken["b"]+taken["c"] != 0 {
		t.Fatalf("carried %v, want 180 to a (the reserve's burst) and nothing else", taken)
	}
	step(50)
	if taken["a"] != 180 {
		t.Fatalf("carried %d to a while the claims filled the budget, want still 180", taken["a"])
	}
	c.demand["a"] = nil
	var back int // steps until the key is forgotten
	var stored float64
	for back = 0; back < 300; back++ {
		j, ok := c.alloc.keyIdx[k]
		if !ok {
			break
		}
		stored = c.alloc.keys[j].res
		step(1)
	}
	if back == 300 {
		t.Fatal("the key is still known 30 s after its demand stopped")
	}
	// Forgotten only once the reserve is full again (within the 18 tokens
	// the last step refills): a key made known again counts it full.
	if stored < 180-18 {
		t.Fatalf("the key was forgotten with %.1f stored in its reserve, want it full (180)", stored)
	}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
	step(30)
	if taken["a"] != 360 {
		t.Fatalf("carried %d to a in all, want 360: the refilled reserve again", taken["a"])
	}
}

// TestFirstLeaderStartsWithTheReserveFull: under the first leader that
// ever serves the regions (NewFirstAllocator), a key hot from the start
// carries the reserve's whole burst (600 − 3×140 = 180) with its first
// raise, where a later leader's reserve counts from the end of its
// learning and carries a fraction of it. A region whose hello holds more
// than its floor (so an earlier leader did exist) still empties the key's
// stored reserve, and the escrow holds throughout.
// newFirstCluster is newCluster with its Allocator the regions' first
// leader's (NewFirstAllocator) when first is set.
func newFirstCluster(t *testing.T, cfg Config, first bool) *cluster {
	t.Helper()
	c := newCluster(t, cfg)
	if first {
		a, err := NewFirstAllocator(cfg, c.term, c.now)
		if err != nil {
			t.Fatal(err)
		}
		c.alloc = a
	}
	if c.alloc.First() != first {
		t.Fatalf("the Allocator says first is %v, want %v", c.alloc.First(), first)
	}
	return c
}

func TestFirstLeaderStartsWithTheReserveFull(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	k := bucket.Key{Rule: "api", Subject: "t1"}
	run := func(first bool) (carried bucket.Tokens, c *cluster) {
		t.Helper()
		c = newFirstCluster(t, cfg, first)
		c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
		for range 30 {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
			carried += c.holders["a"].TakeCredits()[k]
		}
		return carried, c
	}
	later, _ := run(false)
	first, c := run(true)
	if first != 180 {
		t.Fatalf("the first leader's raise carried %d, want the reserve's burst, 180", first)
	}
	if later >= 180/2 {
		t.Fatalf("a later leader's raises carried %d, want under half the reserve's burst: it counts from the end of learning", later)
	}
	if l, _ := c.holders["a"].Allocation(c.now, k); l.Count() < 500 {
		t.Fatalf("a holds %d, want most of the budget once b and c lend", l.Count())
	}

	// A budget change ends it: the changed budget's keys are dropped while
	// regions may have spent this leader's raises of them, so a key made
	// known again must not start full.
	changed := slices.Clone(cfg.Budgets)
	changed[0].Limit = bucket.PerSecond(900)
	if err := c.alloc.SetBudgets(c.now, changed); err != nil {
		t.Fatal(err)
	}
	if c.alloc.First() {
		t.Fatal("still the first leader after a budget change")
	}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 3000}
	after := bucket.Tokens(0)
	for range 10 {
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
		after += c.holders["a"].TakeCredits()[k]
	}
	stored := -1.0
	if j, ok := c.alloc.keyIdx[k]; ok {
		stored = c.alloc.keys[j].res
	}
	if stored < 0 || stored >= 270/2 || after >= 270/2 {
		t.Fatalf("after a budget change the key carried %d and stores %.1f (-1: unknown), want it known and under half the new reserve's burst (270) in each", after, stored)
	}

	// A hello holding more than the floor under a first leader: the key's
	// stored reserve is emptied, as under any leader.
	a, err := NewFirstAllocator(cfg, 2, t0)
	if err != nil {
		t.Fatal(err)
	}
	_ = a.Step(t0, Message{Type: MsgHello, Region: "a", Session: 1, Seq: 1, Term: 1,
		Entries: []Entry{{Key: k, Count: 400}}})
	j, ok := a.keyIdx[k]
	if !ok {
		t.Fatal("a hello holding 400 of the key did not make it known")
	}
	if got := a.keys[j].res; got != 0 {
		t.Fatalf("after a hello holding more than the floor, the stored reserve is %.1f, want 0", got)
	}
}

// TestFirstLeaderRaisesWhileLearning: the first leader has no earlier
// leader's grants to learn, so it raises while it learns, up to each
// region's share of a static split (a region it has not heard from may
// want its share), and renews what it raises: the holders use it at once.
// A later leader raises nothing until learning ends.
func TestFirstLeaderRaisesWhileLearning(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	k := bucket.Key{Rule: "api", Subject: "t1"}
	early := map[string]bucket.Tokens{}
	run := func(first bool) (most map[string]bucket.Tokens, c *cluster) {
		t.Helper()
		c = newFirstCluster(t, cfg, first)
		// The coordinator's first round runs before any hello arrives, as
		// at a coordinator's start, so the next one is a refresh interval
		// away; c never says hello: learning runs its full TTL+2×Drift.
		c.alloc.Tick(c.now)
		c.cut["c"] = true
		c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
		c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 2000}
		most = map[string]bucket.Tokens{}
		for i := range 50 {
			c.step(100 * time.Millisecond)
			if i == 9 {
				// One second in, before the second round.
				for _, r := range []string{"a", "b"} {
					l, _ := c.holders[r].Allocation(c.hnow(r), k)
					early[r] = l.Count()
				}
			}
			if !c.alloc.Learning(c.now) {
				t.Fatalf("learning ended at %v with c silent", c.now.Sub(t0))
			}
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
			for _, r := range []string{"a", "b"} {
				l, _ := c.holders[r].Allocation(c.hnow(r), k)
				most[r] = max(most[r], l.Count())
			}
		}
		return most, c
	}
	most, c := run(true)
	for _, r := range []string{"a", "b"} {
		if l, _ := c.holders[r].Allocation(c.hnow(r), k); most[r] != 200 || l.Count() != 200 || early[r] != 200 {
			t.Fatalf("under the first leader, while learning, %s used at most %d, %d after 1 s and %d now, want its share of the static split, 200, from the grant that raised it", r, most[r], early[r], l.Count())
		}
	}
	most, _ = run(false)
	for _, r := range []string{"a", "b"} {
		if most[r] != 140 {
			t.Fatalf("under a later leader, while learning, %s used at most %d, want its floor, 140", r, most[r])
		}
	}
}
