package lease

import (
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// fairShares returns the max-min fair split of budget among wants.
func fairShares(budget int64, wants []int64) []int64 {
	out := make([]int64, len(wants))
	left, open := budget, 0
	for _, w := range wants {
		if w > 0 {
			open++
		}
	}
	for open > 0 {
		level := left / int64(open)
		done := false
		for i, w := range wants {
			if w > 0 && out[i] == 0 && w <= level {
				out[i] = w
				left -= w
				open--
				done = true
			}
		}
		if !done {
			for i, w := range wants {
				if w > 0 && out[i] == 0 {
					out[i] = level
				}
			}
			break
		}
	}
	return out
}

func measureConfig(regions []string) Config {
	cfg := DefaultConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerMinute(60000).WithBurst(6000), Regions: regions, Reserve: DefaultReserve}}
	return cfg
}

// convergeTime shifts demand from wantsBefore to wantsAfter and returns how
// long until every region with demand holds at least 95% of its max-min
// fair share of the true demand.
func convergeTime(t *testing.T, regions []string, before, after []int64, loss float64) time.Duration {
	cfg := measureConfig(regions)
	c := newCluster(t, cfg)
	if loss > 0 {
		c.rng, c.loss = rand.New(rand.NewPCG(1, 2)), loss
	}
	k := bucket.Key{Rule: "api", Subject: "hot"}
	setDemand := func(ws []int64) {
		for i, r := range regions {
			c.demand[r] = map[bucket.Key]bucket.Tokens{}
			if ws[i] > 0 {
				c.demand[r][k] = bucket.Tokens(ws[i])
			}
		}
	}
	setDemand(before)
	for range 300 { // 30 s: past learning, at rest
		c.step(100 * time.Millisecond)
	}
	setDemand(after)
	fair := fairShares(int64(cfg.Budgets[0].Limit.Count()), after)
	start := c.now
	for range 600 {
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
		ok := true
		for i, r := range regions {
			l, _ := c.holders[r].Allocation(c.now, k)
			if after[i] > 0 && int64(l.Count()) < fair[i]*95/100 {
				ok = false
			}
		}
		if ok {
			return c.now.Sub(start)
		}
	}
	t.Fatalf("no convergence within 60 s\n%s", c.show())
	return 0
}

// TestConvergence measures, in refresh intervals, how long allocations
// take to reach 95% of the fair share after a demand shift. Target: ≤ 3.
func TestConvergence(t *testing.T) {
	r3 := []string{"a", "b", "c"}
	r10 := []string{"r0", "r1", "r2", "r3", "r4", "r5", "r6", "r7", "r8", "r9"}
	cases := []struct {
		name          string
		regions       []string
		before, after []int64
		loss          float64
	}{
		{"3 regions, hot moves a→b", r3, []int64{50000, 5000, 0}, []int64{5000, 50000, 0}, 0},
		{"3 regions, new hot region", r3, []int64{30000, 0, 0}, []int64{30000, 0, 30000}, 0},
		{"3 regions, contention appears", r3, []int64{20000, 0, 0}, []int64{40000, 40000, 40000}, 0},
		{"10 regions, hot moves r0→r9", r10, []int64{50000, 0, 0, 0, 0, 0, 0, 0, 0, 0}, []int64{0, 0, 0, 0, 0, 0, 0, 0, 0, 50000}, 0},
		{"3 regions, hot moves a→b, 10% of messages lost", r3, []int64{50000, 5000, 0}, []int64{5000, 50000, 0}, 0.1},
	}
	refresh := DefaultConfig().Refresh
	for _, tc := range cases {
		d := convergeTime(t, tc.regions, tc.before, tc.after, tc.loss)
		n := float64(d) / float64(refresh)
		t.Logf("%s: converged to within 5%% of fair share in %s = %.2f refresh intervals", tc.name, d, n)
		if n > 3 {
			t.Errorf("%s: %.2f refresh intervals > 3", tc.name, n)
		}
	}
}

// TestUtilization measures the share of the budget regions may use when
// total demand exceeds it, averaged over a minute of steady state. Target:
// ≥ 98%.
func TestUtilization(t *testing.T) {
	for _, tc := range []struct {
		name  string
		wants []int64
	}{
		{"skewed 50k/30k/20k", []int64{50000, 30000, 20000}},
		{"one region 120k", []int64{120000, 0, 0}},
		{"even 25k×3", []int64{25000, 25000, 25000}},
	} {
		regions := []string{"a", "b", "c"}
		cfg := measureConfig(regions)
		c := newCluster(t, cfg)
		k := bucket.Key{Rule: "api", Subject: "hot"}
		for i, r := range regions {
			if tc.wants[i] > 0 {
				c.demand[r] = map[bucket.Key]bucket.Tokens{k: bucket.Tokens(tc.wants[i])}
			}
		}
		for range 300 {
			c.step(100 * time.Millisecond)
		}
		var granted, used, peak float64
		steps := 600
		C := float64(cfg.Budgets[0].Limit.Count())
		for range steps {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
			var g, u float64
			for i, r := range regions {
				l, _ := c.holders[r].Allocation(c.now, k)
				g += float64(l.Count())
				u += float64(min(int64(l.Count()), tc.wants[i]))
			}
			granted += g / C
			used += u / C
			peak = max(peak, g/C)
		}
		granted /= float64(steps)
		used /= float64(steps)
		t.Logf("%s: granted %.2f%% of the budget, usable by demand %.2f%%, peak %.2f%%", tc.name, 100*granted, 100*used, 100*peak)
		if used < 0.98 {
			t.Errorf("%s: %.2f%% < 98%%\n%s", tc.name, 100*used, c.show())
		}
		if peak > 1 {
			t.Errorf("%s: peak %.2f%% > 100%%", tc.name, 100*peak)
		}
	}
}
