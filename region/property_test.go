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

// TestPartialCutTakesItsShareFromTheRegion: two agents of a region, an
// emergency rule, heavy demand at both; one agent is cut from the regional
// store for two seconds while the other still reaches it. The cut agent
// admits from its emergency bucket (the allocation ÷ 2, empty at the
// breaker's opening); the other, told of the cut one tick later (as gossip
// would carry it), decides in the regional bucket at the allocation × 1/2.
// Over every window the region stays within burst + rate × t, plus the
// batch term, plus the cut agent's share over the tick the other took to
// learn. Without the announcement the same run goes about half the
// allocation × the outage over: the check is shown to catch it.
func TestPartialCutTakesItsShareFromTheRegion(t *testing.T) {
	for _, announce := range []bool{true, false} {
		t.Run(fmt.Sprint("announce=", announce), func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, 11))
			clk := clock.NewManual(t0)
			mem := bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
			view := NewTableView("a", lease.Split{Regions: []string{"a", "b"}})
			var cores []*Core
			var stores []*countingStore
			for i := 0; i < 2; i++ {
				cfg := DefaultConfig()
				cfg.Region = "a"
				cfg.Floors = lease.Split{Regions: []string{"a", "b"}}
				cfg.DefaultRule = RuleConfig{OnUnavailable: rules.Emergency}
				st := newCounting(mem)
				c, err := NewCore(cfg, st, view)
				if err != nil {
					t.Fatal(err)
				}
				c.SetLive(2)
				cores, stores = append(cores, c), append(stores, st)
			}
			global := bucket.PerSecond(20_000)
			k := key("k")
			const rate = 4_000.0 // the region's allocation: 4000/s, burst 4000
			view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: t0.Add(time.Hour), HoldUntil: t0.Add(time.Hour),
				Entries: []lease.Entry{{Key: k, Count: rate, Burst: rate}}})
			const slotUS, tickMS = 1000, 20
			var admitted []float64
			ctx := context.Background()
			for step := 0; step < 4000; step++ { // 4 s of 1 ms steps
				stores[1].setDown(step >= 1000 && step < 3000)
				var got float64
				for i := 0; i < 12; i++ { // 12 tokens a ms offered: 3× the allocation
					res, err := cores[rng.IntN(2)].Decide(ctx, clk.Now(), k, global, 1, "")
					if err != nil {
						t.Fatal(err)
					}
					if res.Decision.Allowed {
						got++
					}
				}
				admitted = append(admitted, got)
				clk.Advance(slotUS * time.Microsecond)
				if step%tickMS == 0 {
					for _, c := range cores {
						c.Tick(ctx, clk.Now())
					}
					// What gossip carries by the next tick: whether agent
					// 1 decides by its emergency bucket.
					cut := 0
					if announce && cores[1].Breaker().State(clk.Now()) != BreakerClosed {
						cut = 1
					}
					cores[0].SetPeersCut(cut)
				}
			}
			if cores[1].Stats().BreakerOpened == 0 {
				t.Fatal("the cut agent's breaker never opened")
			}
			var emergency int64
			for _, rs := range cores[1].Stats().Rules {
				emergency += rs.Admitted[PathEmergency]
			}
			if emergency == 0 {
				t.Fatal("the cut agent admitted nothing in emergency")
			}
			batches := 2 * math.Floor(rate*DefaultConfig().BatchMaxFraction)
			learn := rate / 2 * 2 * tickMS / 1e3 // the cut agent's share while the other learns (up to two ticks)
			var cum, minPrefix float64
			worst := math.Inf(-1)
			for s, v := range admitted {
				cum += v
				x := cum - rate*float64(s+1)*slotUS/1e6
				worst = math.Max(worst, x-minPrefix-rate-rate*slotUS/1e6)
				minPrefix = math.Min(minPrefix, x)
			}
			t.Logf("largest excess over burst + rate×t: %.0f tokens (batch term %.0f, learning term %.0f); emergency admissions %d",
				worst, batches, learn, emergency)
			bound := batches + learn
			if announce && worst > bound {
				t.Fatalf("admitted %.0f over burst + rate×t, above the bound %.0f", worst, bound)
			}
			if !announce && worst <= bound {
				t.Fatalf("without the announcement the excess %.0f is within the bound %.0f: the check catches nothing", worst, bound)
			}
		})
	}
}
