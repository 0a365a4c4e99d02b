package lease

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// smallBurst is a budget whose burst is smaller than its regions: 600 a
// minute with burst 1 over five regions, floors of 96 (burst 0 each). Only
// an allocation of the whole count carries burst 1, so only a region
// holding all of it admits anything.
func smallBurst() Config {
	cfg := DefaultConfig()
	cfg.Budgets = []Budget{{Rule: "report", Limit: bucket.PerMinute(600).WithBurst(1),
		Regions: []string{"a", "b", "c", "d", "e"}, Reserve: 0.2}}
	return cfg
}

// holding returns the regions of c whose allocation of k admits anything
// (burst ≥ 1), after checking the escrow invariant.
func holding(t *testing.T, c *cluster, k bucket.Key) []string {
	t.Helper()
	if err := c.checkI1(); err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, r := range c.regions {
		if l, _ := c.holders[r].Allocation(c.now, k); l.Burst() >= 1 {
			out = append(out, r)
		}
	}
	return out
}

// TestSmallBurstGoesWhole: two regions want a budget whose burst cannot be
// split. A split by demand (max-min: 300 each) would give both burst 0 and
// the budget would admit nothing anywhere; the Allocator gives the whole
// count to the region that wants more, keeps it there while the other's
// demand stays within twice its own, and moves it when the other wants
// more than that. The floors are at burst 0, so a key wanted within its
// floor is still hot.
func TestSmallBurstGoesWhole(t *testing.T) {
	cfg := smallBurst()
	if f := cfg.Budgets[0].Floor("a"); f.Count != 96 || f.Burst != 0 {
		t.Fatalf("floor %+v, want count 96 with burst 0", f)
	}
	c := newCluster(t, cfg)
	k := bucket.Key{Rule: "report", Subject: "t1"}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 50}
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 40}
	settle := func(phase string, want string) {
		t.Helper()
		for range 200 { // 20 s, ten refresh intervals
			c.step(100 * time.Millisecond)
			if h := holding(t, c, k); len(h) > 1 {
				t.Fatalf("%s: %v admit at once, but the budget's burst is 1\n%s", phase, h, c.show())
			}
		}
		h := holding(t, c, k)
		if len(h) != 1 || h[0] != want {
			t.Fatalf("%s: %v admit, want %s alone\n%s", phase, h, want, c.show())
		}
		if l, _ := c.holders[want].Allocation(c.now, k); l.Count() != 600 {
			t.Fatalf("%s: %s holds %v, want the whole 600", phase, want, l)
		}
	}
	settle("a wants more", "a")
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 100}
	settle("b wants twice a's demand", "a")
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 110}
	settle("b wants more than twice a's", "b")
	delete(c.demand, "b")
	settle("b stopped", "a")
}

// TestSmallBurstSplitsInUnits: three regions want a budget of burst 2 (a
// unit of 300, half the count). Two of them get a unit each; a split of
// 200 each would carry burst 0 everywhere.
func TestSmallBurstSplitsInUnits(t *testing.T) {
	cfg := smallBurst()
	cfg.Budgets[0].Limit = bucket.PerMinute(600).WithBurst(2)
	c := newCluster(t, cfg)
	k := bucket.Key{Rule: "report", Subject: "t1"}
	for _, r := range []string{"a", "b", "c"} {
		c.demand[r] = map[bucket.Key]bucket.Tokens{k: 1000}
	}
	c.demand["c"][k] = 900
	for range 200 {
		c.step(100 * time.Millisecond)
		holding(t, c, k)
	}
	for r, want := range map[string]int64{"a": 300, "b": 300, "c": 0} {
		if l, _ := c.holders[r].Allocation(c.now, k); int64(l.Count()) != want || int64(l.Burst()) != want/300 {
			t.Errorf("%s holds %v, want %d with burst %d\n%s", r, l, want, want/300, c.show())
		}
	}
}
