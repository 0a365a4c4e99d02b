package lease

import (
	"math/rand/v2"
	"slices"
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

// TestMaxMinFillsTheBudgetFromLowerBounds: max-min water-fills the budget
// with each region's lower bound as a minimum. Three regions press far
// beyond a budget of 600; c's lower bound is its floor (133: its lend
// commitment ends within the window, so its floor comes back to it), a's
// and b's are 0. Each gets 200: c's bound is below the level. Filling
// only what lies above the bounds gave c 133 plus an equal part of the
// other 467 (289) and a and b 155 each. A bound above the level is kept,
// and the others share the rest.
func TestMaxMinFillsTheBudgetFromLowerBounds(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerMinute(600).WithBurst(60), Regions: []string{"a", "b", "c"}}}
	a, err := NewAllocator(cfg, 1, time.Unix(0, 0))
	if err != nil {
		t.Fatal(err)
	}
	k := &hotKey{bud: a.budgets["api"]}
	for _, c := range []struct {
		lb, want, tgt []int64
	}{
		{lb: []int64{0, 0, 133}, want: []int64{1000, 1000, 1000}, tgt: []int64{200, 200, 200}},
		{lb: []int64{0, 0, 300}, want: []int64{1000, 1000, 1000}, tgt: []int64{150, 150, 300}},
		// a's demand less the headroom (95) is met; b and c share the
		// rest, the odd token to the lower index.
		{lb: []int64{0, 0, 133}, want: []int64{100, 1000, 1000}, tgt: []int64{95, 253, 252}},
		{lb: []int64{0, 0, 0}, want: []int64{1000, 1000, 1000}, tgt: []int64{200, 200, 200}},
	} {
		tgt := []int64{-1, -1, -1}
		bare := slices.Clone(c.want)
		a.share(k, 600, tgt, c.lb, slices.Clone(c.want), bare, make([]int64, 3))
		if !slices.Equal(tgt, c.tgt) {
			t.Errorf("lower bounds %v, wants %v: targets %v, want %v", c.lb, c.want, tgt, c.tgt)
		}
	}
}

// TestContestedBudgetIsGrantedToTheToken: a budget of 500 a second over
// three regions that all want more than it. Shares rounded down gave 166
// each, and 2 tokens a second went unused that a static split's
// fractional shares (166⅔ each) admit; by largest remainder the regions
// hold 167, 167 and 166, every policy alike, and the escrow holds. The
// last token of each share is an increase below the hysteresis: it is
// granted because the region presses on its allocation and free capacity
// covers it whole.
func TestContestedBudgetIsGrantedToTheToken(t *testing.T) {
	for _, p := range []AllocationPolicy{MaxMin, Proportional, Static} {
		cfg := scenarioConfig()
		cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(500), Regions: []string{"a", "b", "c"}, Reserve: 0.3, Policy: p}}
		c := newCluster(t, cfg)
		k := bucket.Key{Rule: "api", Subject: "t1"}
		for _, r := range c.regions {
			c.demand[r] = map[bucket.Key]bucket.Tokens{k: 2000}
		}
		for range 100 {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
		}
		var got []bucket.Tokens
		for _, r := range c.regions {
			l, _ := c.holders[r].Allocation(c.now, k)
			got = append(got, l.Count())
		}
		if want := []bucket.Tokens{167, 167, 166}; !slices.Equal(got, want) {
			t.Errorf("policy %v: allocations %v, want %v", p, got, want)
		}
	}
}

// TestApportionAddsUpToTheToken: random parts of random amounts sum to the
// amount exactly, each within a token of its exact share, rounded up only
// where rounding down leaves a remainder, the larger remainders first.
func TestApportionAddsUpToTheToken(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 13))
	for range 2000 {
		n := 1 + rng.IntN(10)
		w := make([]int64, n)
		var total int64
		for i := range w {
			if rng.IntN(5) > 0 {
				w[i] = rng.Int64N(1_000_000)
			}
			total += w[i]
		}
		if total == 0 {
			continue
		}
		left := rng.Int64N(total + 1)
		idx := rng.Perm(n)
		tgt, rem := make([]int64, n), make([]int64, n)
		apportion(idx, left, total, w, tgt, rem)
		var sum int64
		up := make([]bool, n)
		for i := range n {
			sum += tgt[i]
			lo := mulDiv(left, w[i], total)
			exact := left*w[i]%total == 0 // left×w[i] < 10¹²: no overflow
			switch {
			case tgt[i] == lo:
			case tgt[i] == lo+1 && !exact:
				up[i] = true
			default:
				t.Fatalf("w=%v left=%d total=%d: part %d is %d, exact share ⌊%d⌋", w, left, total, i, tgt[i], lo)
			}
		}
		if sum != left {
			t.Fatalf("w=%v left=%d total=%d: parts %v sum to %d", w, left, total, tgt, sum)
		}
		for i := range n {
			for j := range n {
				ri, rj := left*w[i]%total, left*w[j]%total
				if up[j] && !up[i] && (ri > rj || ri == rj && ri > 0 && i < j) {
					t.Fatalf("w=%v left=%d: part %d rounded up before %d (remainders %d, %d)", w, left, j, i, rj, ri)
				}
			}
		}
	}
}
