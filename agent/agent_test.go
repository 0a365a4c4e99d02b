package agent

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testLeaseConfig is a fast lease protocol for tests on the real clock.
func testLeaseConfig(budgets []lease.Budget) lease.Config {
	c := lease.DefaultConfig()
	c.TTL, c.Refresh, c.Drift = 2*time.Second, 400*time.Millisecond, 100*time.Millisecond
	c.Hold = 3 * time.Second
	c.DemandTTL = time.Second
	c.Budgets = budgets
	return c
}

type testRegion struct {
	name   string
	redis  *testenv.RedisServer
	agents []*Agent
	gossip []*Gossip
	cancel []context.CancelFunc
	done   []chan struct{}
}

// startRegion starts n agents of region name on a fresh redis-server,
// joined by memberlist, speaking to coord.
func startRegion(t *testing.T, name string, n int, spec lease.Split, budgets []lease.Budget, coord *LocalCoordinator, policy rules.FailurePolicy) *testRegion {
	t.Helper()
	tr := &testRegion{name: name, redis: testenv.StartRedis(t)}
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	for i := 0; i < n; i++ {
		agentName := fmt.Sprintf("%s-%d", name, i)
		var join []string
		if i > 0 {
			join = []string{tr.gossip[0].Addr()}
		}
		g, err := StartGossip(fastGossip(agentName, name, join))
		if err != nil {
			t.Fatal(err)
		}
		c := redisstore.NewUniversalClient([]string{tr.redis.Addr}, "", "")
		t.Cleanup(func() { c.Close() })
		rs, err := redisstore.New(c, redisstore.Options{Timeout: 50 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Name = agentName
		cfg.Core.Region = name
		cfg.Core.Floors = spec
		cfg.Core.DefaultRule = region.RuleConfig{OnUnavailable: policy}
		cfg.Core.BreakerFailures, cfg.Core.BreakerBackoff = 3, 300*time.Millisecond
		cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = 400*time.Millisecond, 100*time.Millisecond, 50*time.Millisecond
		cfg.Speaker.Budgets = budgets
		cfg.Tick = 50 * time.Millisecond
		cfg.FailoverPoll = 100 * time.Millisecond
		a, err := New(cfg, Deps{Store: rs, Redis: c, Shared: NewRedisShared(c, "allot:", name, 100*time.Millisecond, time.Minute),
			Membership: g, Transport: coord.Transport(name), Logger: logger, Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { defer close(done); a.Run(ctx) }()
		tr.agents, tr.gossip, tr.cancel, tr.done = append(tr.agents, a), append(tr.gossip, g), append(tr.cancel, cancel), append(tr.done, done)
		t.Cleanup(func() { cancel(); <-done; g.Shutdown() })
	}
	return tr
}

// crash stops agent i without a goodbye: gossip stops answering, batches
// are not returned.
func (tr *testRegion) crash(i int) {
	tr.gossip[i].Shutdown()
	tr.cancel[i]()
	<-tr.done[i]
}

func TestRegionsShareABudgetThroughTheCoordinator(t *testing.T) {
	global := bucket.PerSecond(600)
	regions := []string{"r1", "r2", "r3"}
	spec := lease.Split{Regions: regions, Reserve: 1.0 / 3}
	budgets := []lease.Budget{{Rule: "api", Limit: global, Regions: regions, Reserve: spec.Reserve}}
	coord, err := NewLocalCoordinator(testLeaseConfig(budgets), nil)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go coord.Run(ctx, 50*time.Millisecond)

	var trs []*testRegion
	for _, r := range regions {
		trs = append(trs, startRegion(t, r, 2, spec, budgets, coord, rules.Emergency))
	}
	r1 := trs[0]
	waitFor(t, 5*time.Second, "every region has one speaker and two members", func() bool {
		for _, tr := range trs {
			speakers := 0
			for _, a := range tr.agents {
				st := a.Status()
				if len(st.Members) != 2 {
					return false
				}
				if st.Speaking {
					speakers++
				}
			}
			if speakers != 1 {
				return false
			}
		}
		return true
	})
	k := bucket.Key{Rule: "api", Subject: "tenant-1"}
	floor := region.NewTableView("r1", spec).Floor(global)
	if floor.Count() != 133 {
		t.Fatalf("floor %v, want 133 per second", floor)
	}
	// Traffic on r1 only, 800/s spread over its two agents: r1 presses on
	// its floor and the coordinator moves the budget to it.
	var admitted atomic.Int64
	var wg sync.WaitGroup
	traffic := func(ctx context.Context, a *Agent, perSec int) {
		defer wg.Done()
		tk := time.NewTicker(time.Second / time.Duration(perSec))
		defer tk.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tk.C:
				if d, err := a.Store().Decide(ctx, k, global, 1, ""); err == nil && d.Allowed {
					admitted.Add(1)
				}
			}
		}
	}
	tctx, tcancel := context.WithCancel(ctx)
	defer tcancel()
	for _, a := range r1.agents {
		wg.Add(1)
		go traffic(tctx, a, 400)
	}
	start := time.Now()
	waitFor(t, 6*time.Second, "r1's allocation for the hot key rises above its floor", func() bool {
		for _, a := range r1.agents {
			l, hot, _ := a.View().Allocation(time.Now(), k, global)
			if !hot || l.Count() <= 2*floor.Count() {
				return false
			}
		}
		return true
	})
	t.Logf("r1 holds more than twice its floor after %s", time.Since(start).Round(10*time.Millisecond))

	// The speaker crashes: the other agent takes over and the lease never
	// lapses.
	var spk int
	for i, a := range r1.agents {
		if a.Status().Speaking {
			spk = i
		}
	}
	other := r1.agents[1-spk]
	r1.crash(spk)
	deadline := time.Now().Add(5 * time.Second)
	for !other.Status().Speaking {
		if time.Now().After(deadline) {
			t.Fatal("no takeover within 5 s")
		}
		if !other.Status().LeaseLive {
			t.Fatal("the lease lapsed during the takeover")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, 3*time.Second, "the new speaker renews the lease", func() bool {
		hs, ok := other.HolderStatus()
		return ok && hs.Live && hs.LeaseEnd.After(time.Now().Add(time.Second))
	})
	if !other.Status().LeaseLive {
		t.Fatal("lease not live after takeover")
	}

	// The coordinator is cut off: the region runs to its lease's end, then
	// on floors.
	waitFor(t, 3*time.Second, "r1 holds a hot allocation under the new speaker", func() bool {
		_, hot, _ := other.View().Allocation(time.Now(), k, global)
		return hot
	})
	{
		l, hot, _ := other.View().Allocation(time.Now(), k, global)
		tb := other.View().Table()
		t.Logf("before the cut: allocation %v hot %v, table pub %d ver %d lease ends in %s, entries %v", l, hot, tb.Pub, tb.Version, time.Until(tb.LeaseEnd), tb.Entries)
	}
	coord.SetDown(true)
	cut := time.Now()
	waitFor(t, 4*time.Second, "r1 falls back to floors after its lease expires", func() bool {
		l, hot, _ := other.View().Allocation(time.Now(), k, global)
		return !hot && l == floor
	})
	if held := time.Since(cut); held < time.Second {
		t.Fatalf("fell back to floors %s after the cut, before the lease could have expired", held)
	}
	tcancel()
	wg.Wait()
	t.Logf("admitted %d", admitted.Load())

	// Metrics name the agent, the rule and the paths.
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	m.attach(other)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, mf := range mfs {
		found[mf.GetName()] = len(mf.GetMetric()) > 0
	}
	for _, name := range []string{"allot_region_decisions_total", "allot_region_lease_live", "allot_region_members", "allot_region_store_operations_total"} {
		if !found[name] {
			t.Errorf("metric %s missing", name)
		}
	}
}

func TestRedisOutagePolicies(t *testing.T) {
	for _, policy := range []rules.FailurePolicy{rules.FailClosed, rules.FailOpen, rules.Emergency} {
		t.Run(string(policy), func(t *testing.T) {
			global := bucket.PerSecond(100)
			spec := lease.Split{Regions: []string{"solo"}}
			budgets := []lease.Budget{{Rule: "api", Limit: global, Regions: spec.Regions}}
			coord, err := NewLocalCoordinator(testLeaseConfig(budgets), nil)
			if err != nil {
				t.Fatal(err)
			}
			tr := startRegion(t, "solo", 2, spec, budgets, coord, policy)
			waitFor(t, 5*time.Second, "two members", func() bool { return len(tr.agents[0].Members()) == 2 })
			a := tr.agents[0]
			k := bucket.Key{Rule: "api", Subject: "s"}
			ctx := context.Background()
			if d, err := a.Store().Decide(ctx, k, global, 1, ""); err != nil || !d.Allowed {
				t.Fatalf("before the outage: %+v %v", d, err)
			}
			tr.redis.Kill()
			admitted, closed, open := 0, 0, 0
			start := time.Now()
			for i := 0; i < 300; i++ {
				d, err := a.Store().Decide(ctx, k, global, 1, "")
				switch {
				case err == region.ErrFailClosed:
					closed++
				case err == region.ErrFailOpen:
					open++
				case err != nil:
					t.Fatalf("decision %d: %v", i, err)
				case d.Allowed:
					admitted++
				}
			}
			took := time.Since(start)
			// The breaker opens after 3 timeouts of 50 ms: the rest answer
			// without waiting on Redis.
			if took > 2*time.Second {
				t.Fatalf("300 decisions took %s during the outage", took)
			}
			switch policy {
			case rules.FailClosed:
				if closed != 300 {
					t.Fatalf("fail closed: %d of 300 closed", closed)
				}
			case rules.FailOpen:
				if open != 300 {
					t.Fatalf("fail open: %d of 300 open", open)
				}
			case rules.Emergency:
				// The allocation (100/s, burst 100) divided by 2 live agents.
				if admitted < 40 || admitted > 50+int(took.Seconds()*50)+1 {
					t.Fatalf("emergency admitted %d in %s, bound 50 + 50/s", admitted, took)
				}
			}
			st := a.Core().Stats()
			if st.BreakerOpened < 1 {
				t.Fatal("breaker never opened")
			}
			// Redis comes back (empty, a new run id): the breaker closes
			// after a probe and the restart is detected.
			tr.redis.Restart(t)
			waitFor(t, 5*time.Second, "decisions go to Redis again", func() bool {
				r, err := a.Core().Decide(ctx, time.Now(), k, global, 1, "")
				return err == nil && r.Path == region.PathStore
			})
			waitFor(t, 3*time.Second, "the restart is detected", func() bool { return a.Core().Stats().Failovers >= 1 })
		})
	}
}

// TestLastAgentReleasesTheLease stops a region's only agent cleanly: it
// gives its allocations back to the coordinator at once.
func TestLastAgentReleasesTheLease(t *testing.T) {
	global := bucket.PerSecond(100)
	spec := lease.Split{Regions: []string{"solo", "other"}}
	budgets := []lease.Budget{{Rule: "api", Limit: global, Regions: spec.Regions}}
	coord, err := NewLocalCoordinator(testLeaseConfig(budgets), nil)
	if err != nil {
		t.Fatal(err)
	}
	cctx, ccancel := context.WithCancel(context.Background())
	defer ccancel()
	go coord.Run(cctx, 20*time.Millisecond)
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region, cfg.Core.Floors = "solo-0", "solo", spec
	cfg.Speaker.Budgets, cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = budgets, 400*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond
	cfg.Tick = 20 * time.Millisecond
	a, err := New(cfg, Deps{Store: bucket.NewMemory(bucket.MemoryOptions{}), Transport: coord.Transport("solo"),
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Seed: 1})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	status := func() lease.RegionStatus {
		for _, r := range coord.Regions() {
			if r.Region == "solo" {
				return r
			}
		}
		return lease.RegionStatus{}
	}
	waitFor(t, 3*time.Second, "the coordinator knows the region", func() bool { return status().Known })
	cancel()
	<-done
	waitFor(t, 2*time.Second, "the region's release reaches the coordinator", func() bool { return status().Released })
}
