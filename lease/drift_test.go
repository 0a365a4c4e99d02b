package lease

import (
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// driftConfig is a two-region budget with short timings, so a run crosses
// several leases and holds, and a hold three TTLs long, so a margin that
// does not grow with the hold shows.
func driftConfig() Config {
	cfg := DefaultConfig()
	cfg.TTL = 2 * time.Second
	cfg.Refresh = 100 * time.Millisecond
	cfg.Drift = 100 * time.Millisecond
	cfg.Hold = 6 * time.Second
	cfg.DemandTTL = 250 * time.Millisecond
	cfg.Hysteresis = 0
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(1000).WithBurst(1000), Regions: []string{"a", "b"}}}
	return cfg
}

// edgeRate is the rate, relative to the coordinator's clock, of a holder
// clock at the margin's edge: slow (fast=false) or fast, times beyond.
func edgeRate(cfg Config, fast bool, beyond float64) float64 {
	k := 1 + cfg.MaxRelativeDrift()*beyond
	if fast {
		return k
	}
	return 1 / k
}

var dk = bucket.Key{Rule: "api", Subject: "x"}

// runDrift runs one drift scenario and returns the first I1 violation on
// the holders' side (nil when there is none), checked every millisecond.
func runDrift(t *testing.T, cfg Config, rates map[string]float64, scenario func(c *cluster) error) error {
	t.Helper()
	c := newCluster(t, cfg)
	c.latency = time.Millisecond // a long latency hides a late lease end
	c.rate = rates
	// Holders started at t0 on their own clocks: restart them now that the
	// rates are set, so each measures from its own clock.
	for _, r := range c.regions {
		c.startHolder(r)
	}
	return scenario(c)
}

// until steps c by 1 ms until cond holds or d has passed, checking at
// every step I1 on the holders' side and that every claim of the
// Allocator bounds its holder (so a lease or a hold that outlives the
// coordinator's count shows at once, not only once another region uses
// the capacity).
func until(c *cluster, d time.Duration, cond func() bool) error {
	for end := c.now.Add(d); c.now.Before(end); {
		c.step(time.Millisecond)
		if err := c.checkI1(); err != nil {
			return err
		}
		if err := c.checkClaims(); err != nil {
			return err
		}
		if cond != nil && cond() {
			return nil
		}
	}
	if cond != nil {
		return fmt.Errorf("condition not reached in %s", d)
	}
	return nil
}

// leaseEdge: region a borrows the whole budget (b lends its floor), is cut
// from the coordinator just after a renewal reaches it, and b's demand
// rises. The coordinator decreases a (the decrease cannot arrive) and
// gives b its floor back once a's lease has expired on the coordinator's
// clock; a, its clock slow, spends its lease until it ends on a's clock.
func leaseEdge(c *cluster) error {
	c.demand["a"] = map[bucket.Key]bucket.Tokens{dk: 2000}
	if err := until(c, 3*time.Second, func() bool {
		l, _ := c.holders["a"].Allocation(c.hnow("a"), dk)
		return l.Count() == 1000
	}); err != nil {
		return fmt.Errorf("a never borrowed the budget: %w", err)
	}
	end := c.holders["a"].Status(c.hnow("a")).LeaseEnd
	if err := until(c, time.Second, func() bool { return c.holders["a"].Status(c.hnow("a")).LeaseEnd.After(end) }); err != nil {
		return fmt.Errorf("a's lease was not renewed: %w", err)
	}
	c.cut["a"] = true
	c.demand["b"] = map[bucket.Key]bucket.Tokens{dk: 2000}
	if err := until(c, 2*c.cfg.TTL, nil); err != nil {
		return err
	}
	if l, _ := c.holders["b"].Allocation(c.hnow("b"), dk); l.Count() < 500 {
		return fmt.Errorf("b never got its lent floor back (%d): the run shows nothing", l.Count())
	}
	return nil
}

// holdEdge: region a lends its floor to b and is cut from the coordinator;
// b is cut too, just after the last renewal that could carry the lend. The
// coordinator relies on a's lend until its commitment ends, then counts
// a's floor again and lets b's lease run out; a, its clock fast, takes its
// floor back when its hold ends on a's clock. b's clock runs slow, so its
// lease ends on the coordinator's count.
func holdEdge(c *cluster) error {
	c.demand["b"] = map[bucket.Key]bucket.Tokens{dk: 2000}
	if err := until(c, 3*time.Second, func() bool {
		l, _ := c.holders["b"].Allocation(c.hnow("b"), dk)
		return l.Count() == 1000 && c.alloc.byName["a"].commitEnd.After(c.now)
	}); err != nil {
		return fmt.Errorf("a never lent its floor: %w", err)
	}
	c.cut["a"] = true
	a, last := c.alloc.byName["a"], c.alloc.lastRound
	if err := until(c, 2*c.cfg.Hold, func() bool {
		if c.alloc.lastRound.Equal(last) {
			return false
		}
		last = c.alloc.lastRound
		// This round renewed b with a's lend; the next one cannot.
		return !a.commitEnd.After(last.Add(c.cfg.Refresh + c.cfg.TTL + c.cfg.Drift))
	}); err != nil {
		return fmt.Errorf("no last renewal found: %w", err)
	}
	if err := until(c, c.latency+time.Millisecond, nil); err != nil {
		return err
	}
	c.cut["b"] = true
	if err := until(c, c.cfg.Hold, nil); err != nil {
		return err
	}
	if l, _ := c.holders["a"].Allocation(c.hnow("a"), dk); l.Count() != 500 {
		return fmt.Errorf("a is at %d, not back at its floor: the run shows nothing", l.Count())
	}
	return nil
}

// TestDriftAtTheMarginsEdge runs the two intervals a holder and the
// coordinator measure on their own clocks at the edge of the relative
// drift the margin covers (Config.MaxRelativeDrift), each way: the lease
// with the holder's clock slow against the coordinator's (the coordinator
// fast), and a lent floor's hold with the holder's clock fast (the
// coordinator slow). I1 and the Allocator's claims hold at the edge, and
// break a little beyond it, so the edge is where the margin says. (Before
// a hold's margin grew with the hold, the hold broke at half the margin.)
func TestDriftAtTheMarginsEdge(t *testing.T) {
	cfg := driftConfig()
	if got, want := cfg.MaxRelativeDrift(), 2*0.1/1.9; math.Abs(got-want) > 1e-12 {
		t.Fatalf("MaxRelativeDrift = %v, want %v", got, want)
	}
	cases := []struct {
		name     string
		scenario func(*cluster) error
		rates    func(beyond float64) map[string]float64
	}{
		{"lease, holder slow", leaseEdge, func(x float64) map[string]float64 {
			return map[string]float64{"a": edgeRate(cfg, false, x)}
		}},
		{"hold, holder fast", holdEdge, func(x float64) map[string]float64 {
			return map[string]float64{"a": edgeRate(cfg, true, x), "b": edgeRate(cfg, false, 1)}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			for _, x := range []float64{0, 0.5, 1} {
				if err := runDrift(t, cfg, tc.rates(x), tc.scenario); err != nil {
					t.Errorf("relative drift %.4f (%.0f%% of the margin's %.4f): %v", x*cfg.MaxRelativeDrift(), 100*x, cfg.MaxRelativeDrift(), err)
				}
			}
			err := runDrift(t, cfg, tc.rates(1.3), tc.scenario)
			if !violated(err) {
				t.Errorf("relative drift 1.3× the margin: %v, want a violation (else the test cannot see the edge)", err)
			}
		})
	}
}

// violated reports whether err is a broken invariant (I1, or a claim below
// what its holder uses), not a scenario that went elsewhere.
func violated(err error) bool {
	return err != nil && (strings.HasPrefix(err.Error(), "I1 broken ") || strings.HasPrefix(err.Error(), "claim for "))
}

// TestDriftHelpers pins the margin's arithmetic: DriftFor inverts
// MaxRelativeDrift, margins round up, RelativeDrift is symmetric.
func TestDriftHelpers(t *testing.T) {
	for _, rho := range []float64{1e-3, 0.01, 0.05, 0.1} {
		d := DriftFor(10*time.Second, rho)
		cfg := DefaultConfig()
		cfg.Drift = d
		if got := cfg.MaxRelativeDrift(); got < rho || got > rho*1.000001 {
			t.Errorf("DriftFor(10s, %v) = %s covers %v", rho, d, got)
		}
	}
	if got := marginOver(100*time.Millisecond, 3*time.Second, time.Second); got != 33333334 {
		t.Errorf("marginOver rounds %d, want up to 33333334", got)
	}
	if got := marginOver(time.Second, 10*time.Second, 20*time.Second); got != 2*time.Second {
		t.Errorf("marginOver exact = %s, want 2s", got)
	}
	if a, b := RelativeDrift(0.04, -0.04), RelativeDrift(-0.04, 0.04); a != b || math.Abs(a-(1.04/0.96-1)) > 1e-12 {
		t.Errorf("RelativeDrift(±0.04) = %v, %v, want %v both ways", a, b, 1.04/0.96-1)
	}
	if got := DefaultConfig().HoldMargin(); got != time.Second {
		t.Errorf("default hold margin %s, want 1s (0.5 s per 10 s TTL over 20 s)", got)
	}
}
