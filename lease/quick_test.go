package lease

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// testConfig serves one budget whose burst is a tenth of its count. Its
// tests' figures are the 5% headroom's: the noise headroom
// (testdata/noise_headroom.txt) is off.
func testConfig() Config {
	cfg := DefaultConfig()
	cfg.NoiseHeadroom = 0
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerMinute(600).WithBurst(60), Regions: []string{"a", "b", "c"}, Reserve: DefaultReserve}}
	return cfg
}

// TestHotRegionGetsBudget: one region wanting most of a budget receives it
// once the learning period is over, from the reserve and the idle regions'
// floors, and the Holders never together hold more than the budget.
func TestHotRegionGetsBudget(t *testing.T) {
	c := newCluster(t, testConfig())
	k := bucket.Key{Rule: "api", Subject: "t1"}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 500}
	for range 200 {
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	l, _ := c.holders["a"].Allocation(c.now, k)
	if l.Count() != 525 || l.Burst() != 52 {
		t.Fatalf("a holds %v, want 525 per minute (demand 500 + 5%% headroom), burst 52\n%s", l, c.show())
	}
	if !c.holders["b"].Status(c.now).Live {
		t.Fatalf("b's lease is not live\n%s", c.show())
	}
}
