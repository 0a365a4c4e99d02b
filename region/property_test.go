package region

import (
	"context"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// TestRegionNeverExceedsItsLargestAllocation drives three agents of one
// region, sharing one regional store, through random arrivals, costs,
// allocation changes, store outages and ticks, and checks over every
// window that the region admitted no more than its largest allocation
// allows (burst + rate × t), plus what batches may spend after their debit
// (every agent's largest batch). It checks I2 and I3 under all the paths
// at once: batches, exact decisions, deny cache, returns and the failure
// policy (fail closed here, so outages admit nothing).
func TestRegionNeverExceedsItsLargestAllocation(t *testing.T) {
	for seed := uint64(1); seed <= 8; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(seed, 99))
			clk := clock.NewManual(t0)
			store := newCounting(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}))
			view := NewTableView("a", lease.Split{Regions: []string{"a", "b"}})
			var cores []*Core
			for i := 0; i < 3; i++ {
				cfg := DefaultConfig()
				cfg.Region = "a"
				cfg.Floors = lease.Split{Regions: []string{"a", "b"}}
				cfg.DefaultRule = RuleConfig{OnUnavailable: rules.FailClosed}
				cfg.BreakerFailures, cfg.BreakerBackoff = 2, 50*time.Millisecond
				c, err := NewCore(cfg, store, view)
				if err != nil {
					t.Fatal(err)
				}
				cores = append(cores, c)
			}
			global := bucket.PerSecond(20_000)
			k := key("k")
			// Allocations the coordinator may hand out; the floor is 10000/s.
			counts := []bucket.Tokens{2_000, 5_000, 10_000, 15_000}
			maxRate, maxBurst := 15_000.0, 15_000.0
			pub := uint64(0)
			setAlloc := func(c bucket.Tokens) {
				pub++
				now := clk.Now()
				view.Set(&Table{Region: "a", Pub: pub, Term: 1, Version: pub, LeaseEnd: now.Add(time.Hour), HoldUntil: now.Add(time.Hour),
					Entries: []lease.Entry{{Key: k, Count: c, Burst: c}}})
			}
			setAlloc(counts[2])
			const slotUS = 1000
			var admitted []float64 // per 1 ms slot
			ctx := context.Background()
			for step := 0; step < 3000; step++ { // 3 s of 1 ms steps
				switch r := rng.IntN(100); {
				case r < 2:
					setAlloc(counts[rng.IntN(len(counts))])
				case r < 3:
					store.setDown(!store.down)
				}
				n := rng.IntN(40)
				var got float64
				for i := 0; i < n; i++ {
					cost := bucket.Tokens(1 + rng.IntN(3))
					res, err := cores[rng.IntN(len(cores))].Decide(ctx, clk.Now(), k, global, cost, "")
					if err != nil && res.Path != PathFailClosed {
						t.Fatal(err)
					}
					if res.Decision.Allowed {
						got += float64(cost)
					}
				}
				admitted = append(admitted, got)
				clk.Advance(slotUS * time.Microsecond)
				if step%20 == 0 {
					for _, c := range cores {
						c.Tick(ctx, clk.Now())
					}
				}
			}
			// Every agent's largest batch: BatchMaxFraction of the largest
			// burst.
			slack := float64(len(cores)) * math.Floor(maxBurst*DefaultConfig().BatchMaxFraction)
			var cum, minPrefix float64
			worst := math.Inf(-1)
			for s, v := range admitted {
				cum += v
				x := cum - maxRate*float64(s+1)*slotUS/1e6
				// A slot's admissions all count at its start: allow one
				// slot of refill for that rounding.
				worst = math.Max(worst, x-minPrefix-maxBurst-maxRate*slotUS/1e6)
				minPrefix = math.Min(minPrefix, x)
			}
			if worst > slack {
				t.Fatalf("admitted %.0f tokens over burst + rate×t in some window (batch slack %.0f)", worst, slack)
			}
		})
	}
}
