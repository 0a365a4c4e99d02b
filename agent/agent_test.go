package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// testLeaseConfig is a fast lease protocol.
func testLeaseConfig(budgets []lease.Budget) lease.Config {
	c := lease.DefaultConfig()
	c.TTL, c.Refresh, c.Drift = 2*time.Second, 400*time.Millisecond, 100*time.Millisecond
	c.Hold = 3 * time.Second
	c.DemandTTL = time.Second
	c.Budgets = budgets
	return c
}

// tick is the agents' and the lease clients' tick in the tests below, and
// the step the manual clock moves by.
const tick = 50 * time.Millisecond

type testRegion struct {
	name   string
	redis  *testenv.RedisServer
	agents []*Agent
	gossip []*Gossip
	cancel []context.CancelFunc
	done   []chan struct{}
	// clients are the agents' Redis clients, in the agents' order.
	clients []redis.UniversalClient
}

// startRegion starts n agents of region name on clk, on a fresh
// redis-server, joined by memberlist, speaking to coord.
func startRegion(t *testing.T, clk clock.Clock, name string, n int, spec lease.Split, budgets []lease.Budget, coord *LocalCoordinator, policy rules.FailurePolicy) *testRegion {
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
		tr.clients = append(tr.clients, c)
		// The buckets' arithmetic runs at the test's clock too.
		rs, err := redisstore.New(c, redisstore.Options{Timeout: 50 * time.Millisecond, Now: clk.Now})
		if err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig()
		cfg.Name = agentName
		cfg.Core.Region = name
		cfg.Core.Floors = spec
		cfg.Core.DefaultRule = region.RuleConfig{OnUnavailable: policy}
		cfg.Core.BreakerFailures, cfg.Core.BreakerBackoff = 3, 300*time.Millisecond
		cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = 400*time.Millisecond, 100*time.Millisecond, tick
		cfg.Speaker.Budgets = budgets
		cfg.Tick = tick
		cfg.FailoverPoll = 100 * time.Millisecond
		// The shared state's calls get seconds: they are off the decision
		// path, and a deadline of a few round trips fails them on a loaded
		// machine while Redis is up, which the tests would take for an
		// outage. A Redis that is down refuses at once all the same.
		a, err := New(cfg, Deps{Store: rs, Redis: c, Shared: NewRedisShared(c, "allot:", name, 5*time.Second, time.Minute),
			Membership: g, Transport: coord.Transport(name), Clock: clk, Logger: logger, Seed: uint64(i + 1)})
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

// reconnected waits, on the real clock, until every agent's Redis client
// reaches the region's Redis again after a restart. A client whose dials
// kept failing during the outage stops dialing and probes the server in
// the background once a second of real time, whatever the agents' clock
// says; steps of the manual clock alone can run through a whole step
// budget before the probe has seen the server back.
func (tr *testRegion) reconnected(t *testing.T) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i, c := range tr.clients {
		for {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			err := c.Ping(ctx).Err()
			cancel()
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("agent %d's Redis client does not reach the restarted %s: %v", i, tr.redis.Addr, err)
			}
			time.Sleep(20 * time.Millisecond) // waiting for the client's background probe, not for time to pass
		}
	}
}

// crash stops agent i without a goodbye: gossip stops answering, batches
// are not returned.
func (tr *testRegion) crash(i int) {
	tr.gossip[i].Shutdown()
	tr.cancel[i]()
	<-tr.done[i]
}

// stepper moves a manual clock for agents that run on it: each step
// advances it by tick and waits until at least timers of the drivers'
// timers are pending again, that is until their rounds are done. Lease
// time passes only in steps; memberlist and Redis, real, run on the real
// clock meanwhile.
type stepper struct {
	t      *testing.T
	clk    *clock.Manual
	timers int
}

func (s stepper) step() {
	s.t.Helper()
	s.clk.Advance(tick)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.clk.WaitForTimers(ctx, s.timers); err != nil {
		s.t.Fatalf("the agents did not finish their rounds: %v (pending %v)", err, s.clk.Timers())
	}
}

// until steps until cond holds, for at most max steps.
func (s stepper) until(max int, what string, cond func() bool) {
	s.t.Helper()
	for range max {
		if cond() {
			return
		}
		s.step()
	}
	s.t.Fatalf("%s: not within %d steps of %s", what, max, tick)
}

// localBudget is one budget, "api" at 600 a second over regions with
// reserve kept by the coordinator, and an in-process coordinator serving
// it on a manual clock at t0, ticking every tick until the test ends.
func localBudget(t *testing.T, regions []string, reserve float64) (global bucket.Limit, spec lease.Split, budgets []lease.Budget, clk *clock.Manual, coord *LocalCoordinator) {
	t.Helper()
	global = bucket.PerSecond(600)
	spec = lease.Split{Regions: regions, Reserve: reserve}
	budgets = []lease.Budget{{Rule: "api", Limit: global, Regions: regions, Reserve: reserve}}
	clk = clock.NewManual(t0)
	coord, err := NewLocalCoordinator(testLeaseConfig(budgets), clk)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); coord.Run(ctx, tick) }()
	t.Cleanup(func() { cancel(); <-done })
	return global, spec, budgets, clk, coord
}

func TestRegionsShareABudgetThroughTheCoordinator(t *testing.T) {
	regions := []string{"r1", "r2", "r3"}
	global, spec, budgets, clk, coord := localBudget(t, regions, 1.0/3)
	ctx := context.Background()

	var trs []*testRegion
	for _, r := range regions {
		trs = append(trs, startRegion(t, clk, r, 2, spec, budgets, coord, rules.Emergency))
	}
	// Six agents and the coordinator tick on the clock (the lease clients
	// come and go).
	st := stepper{t: t, clk: clk, timers: 7}
	r1 := trs[0]
	st.until(400, "every region has one speaker and two members", func() bool {
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
	// Traffic on r1 only, 800/s spread over its two agents (20 requests
	// each per step of 50 ms): r1 presses on its floor and the coordinator
	// moves the budget to it.
	admitted := 0
	traffic := func(as ...*Agent) {
		for range 20 {
			for _, a := range as {
				if d, err := a.Store().Decide(ctx, k, global, 1, ""); err == nil && d.Allowed {
					admitted++
				}
			}
		}
	}
	start := clk.Now()
	st.until(120, "r1's allocation for the hot key rises above twice its floor", func() bool {
		traffic(r1.agents...)
		for _, a := range r1.agents {
			l, hot, _ := a.View().Allocation(clk.Now(), k, global)
			if !hot || l.Count() <= 2*floor.Count() {
				return false
			}
		}
		return true
	})
	t.Logf("r1 holds more than twice its floor %s after its traffic started", clk.Now().Sub(start))

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
	st.timers = 6 // one agent fewer
	// memberlist, real, notices the crash on the real clock (about two
	// seconds); lease time stands still meanwhile, as a lease of the
	// default TTL (10 s) outlasts that detection.
	waitFor(t, 10*time.Second, "memberlist declares the crashed speaker dead", func() bool {
		return len(r1.gossip[1-spk].Members()) == 1
	})
	st.until(40, "the other agent takes over", func() bool {
		traffic(other)
		if !other.Status().LeaseLive {
			t.Fatal("the lease lapsed during the takeover")
		}
		return other.Status().Speaking
	})
	st.until(60, "the new speaker renews the lease", func() bool {
		traffic(other)
		hs, ok := other.HolderStatus()
		return ok && hs.Live && hs.LeaseEnd.After(clk.Now().Add(time.Second))
	})
	st.until(60, "r1 holds a hot allocation under the new speaker", func() bool {
		traffic(other)
		_, hot, _ := other.View().Allocation(clk.Now(), k, global)
		return hot
	})

	// The coordinator is cut off: the region runs to its lease's end, then
	// on floors.
	tb := other.View().Table()
	coord.SetDown(true)
	cut := clk.Now()
	st.until(100, "r1 falls back to floors after its lease expires", func() bool {
		l, hot, _ := other.View().Allocation(clk.Now(), k, global)
		return !hot && l == floor
	})
	if held := clk.Now().Sub(cut); held < tb.LeaseEnd.Sub(cut) {
		t.Fatalf("fell back to floors %s after the cut, before the lease ended %s after it", held, tb.LeaseEnd.Sub(cut))
	}
	t.Logf("admitted %d", admitted)

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
			clk := clock.NewManual(t0)
			coord, err := NewLocalCoordinator(testLeaseConfig(budgets), clk)
			if err != nil {
				t.Fatal(err)
			}
			tr := startRegion(t, clk, "solo", 2, spec, budgets, coord, policy)
			st := stepper{t: t, clk: clk, timers: 2}
			st.until(400, "two members", func() bool { return len(tr.agents[0].Members()) == 2 })
			a := tr.agents[0]
			// A restart is told by a run id that differs from the one seen
			// before: the agent must have read it before Redis goes down.
			st.until(200, "the agent knows Redis's run id", func() bool {
				a.mu.Lock()
				defer a.mu.Unlock()
				return a.runID != ""
			})
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
			// The breaker opens after 3 timeouts of 50 ms: the rest answer
			// without waiting on Redis.
			if took := time.Since(start); took > 2*time.Second {
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
				// The emergency bucket starts empty when the breaker
				// opens, and no time passed on the clock.
				if admitted != 0 {
					t.Fatalf("emergency admitted %d at the opening, want 0", admitted)
				}
				opened := clk.Now()
				st.until(40, "a second passes", func() bool { return clk.Now().Sub(opened) >= time.Second })
				for i := 0; i < 300; i++ {
					if d, err := a.Store().Decide(ctx, k, global, 1, ""); err == nil && d.Allowed {
						admitted++
					}
				}
				// The allocation (100/s, burst 100) divided by 2 live
				// agents: a burst of 50, refilled in a second.
				if admitted != 50 {
					t.Fatalf("emergency admitted %d a second in, want the burst of 50", admitted)
				}
			}
			if st := a.Core().Stats(); st.BreakerOpened < 1 {
				t.Fatal("breaker never opened")
			}
			// Redis comes back (empty, a new run id): the breaker closes
			// after a probe and the restart is detected.
			tr.redis.Restart(t)
			tr.reconnected(t)
			st.until(200, "decisions go to Redis again", func() bool {
				r, err := a.Core().Decide(ctx, clk.Now(), k, global, 1, "")
				return err == nil && r.Path == region.PathStore
			})
			st.until(200, "the restart is detected", func() bool { return a.Core().Stats().Failovers >= 1 })
		})
	}
}

// TestLastAgentReleasesTheLease stops a region's only agent cleanly: it
// gives its allocations back to the coordinator at once. Everything runs
// in process, in a synctest bubble, on its fake clock.
func TestLastAgentReleasesTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		global := bucket.PerSecond(100)
		spec := lease.Split{Regions: []string{"solo", "other"}}
		budgets := []lease.Budget{{Rule: "api", Limit: global, Regions: spec.Regions}}
		coord, err := NewLocalCoordinator(testLeaseConfig(budgets), nil)
		if err != nil {
			t.Fatal(err)
		}
		cctx, ccancel := context.WithCancel(t.Context())
		defer ccancel()
		go coord.Run(cctx, 20*time.Millisecond)
		cfg := DefaultConfig()
		cfg.Name, cfg.Core.Region, cfg.Core.Floors = "solo-0", "solo", spec
		cfg.Speaker.Budgets, cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = budgets, 400*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond
		cfg.Tick = 20 * time.Millisecond
		_, stop := runOnMemory(t, cfg, Deps{Transport: coord.Transport("solo")})
		status := func() lease.RegionStatus {
			for _, r := range coord.Regions() {
				if r.Region == "solo" {
					return r
				}
			}
			return lease.RegionStatus{}
		}
		time.Sleep(3 * time.Second) // the fake clock: SpeakerWait, then a hello and a grant
		if !status().Known {
			t.Fatal("the coordinator does not know the region")
		}
		if status().Released {
			t.Fatal("released before the agent stopped")
		}
		stop()
		synctest.Wait()
		if !status().Released {
			t.Fatal("the region's release did not reach the coordinator")
		}
	})
}

// TestLastErrorEndsWithTheOutage: the status shows the shared state's last
// error while it is current, when it happened, and, once the regional
// Redis is back and a round reaches it, that it is no longer current.
func TestLastErrorEndsWithTheOutage(t *testing.T) {
	global := bucket.PerSecond(100)
	spec := lease.Split{Regions: []string{"solo"}}
	budgets := []lease.Budget{{Rule: "api", Limit: global, Regions: spec.Regions}}
	clk := clock.NewManual(t0)
	coord, err := NewLocalCoordinator(testLeaseConfig(budgets), clk)
	if err != nil {
		t.Fatal(err)
	}
	tr := startRegion(t, clk, "solo", 1, spec, budgets, coord, rules.FailClosed)
	a := tr.agents[0]
	st := stepper{t: t, clk: clk, timers: 1}
	st.until(100, "a round without error", func() bool { return a.Status().LastError == nil && a.View().Table() != nil })
	tr.redis.Kill()
	killed := clk.Now()
	st.until(100, "the outage is seen", func() bool { return a.Status().LastErrorCurrent })
	s := a.Status()
	if s.LastError == nil || s.LastErrorAt.Before(killed) || s.LastErrorAt.After(clk.Now()) {
		t.Fatalf("during the outage: last error %v at %s (killed at %s, now %s)", s.LastError, s.LastErrorAt, killed, clk.Now())
	}
	tr.redis.Restart(t)
	tr.reconnected(t)
	st.until(200, "the outage is over", func() bool { return !a.Status().LastErrorCurrent })
	if s2 := a.Status(); s2.LastError == nil || s2.LastErrorAt.Before(s.LastErrorAt) {
		t.Fatalf("after the outage the last error is forgotten or moved back: %v at %s", s2.LastError, s2.LastErrorAt)
	}
}

// TestConfigRefusesNegativeSpeakerDrift: the agent's Validate sees the
// speaker's drift margin at start, not at the speaker's first turn.
func TestConfigRefusesNegativeSpeakerDrift(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region = "a-0", "a"
	cfg.Speaker.Drift = -time.Second
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "speaker drift=-1s must be ≥ 0") {
		t.Fatalf("Validate() = %v, want the speaker's drift refused", err)
	}
}

// TestBreakerProbesBetweenRounds: an agent whose rounds are far apart (a
// dead store makes each of a round's calls wait out its deadline) still
// probes its store as the breaker's back-off ends, so the breaker closes
// within the back-off and a probe period of the store answering, not at
// the next round. In a synctest bubble, on its fake clock.
func TestBreakerProbesBetweenRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := slowRounds()
		a, stop := runOnMemory(t, cfg, Deps{})
		defer stop()
		time.Sleep(time.Second) // the fake clock: the first round is over
		br := a.Core().Breaker()
		opened := openBreaker(br)
		probes := a.Core().Stats().Probes
		for br.State(time.Now()) != region.BreakerClosed {
			if time.Since(opened) > 5*time.Second {
				t.Fatalf("the breaker still %s %s after it opened, the store answering", br.State(time.Now()), time.Since(opened))
			}
			time.Sleep(5 * time.Millisecond)
		}
		took := time.Since(opened)
		if limit := cfg.Core.BreakerBackoff + probeEvery; took > limit {
			t.Fatalf("closed %s after it opened, want within the back-off and a probe period, %s", took, limit)
		}
		if a.Core().Stats().Probes != probes+1 {
			t.Fatalf("%d probes, want one", a.Core().Stats().Probes-probes)
		}
	})
}

// TestRoundThatFindsTheStoreBackProbesAtOnce: with the breaker open (its
// back-off 30 s), a round whose report the store does not take, then one
// whose report it takes: the breaker probes at that round, not at the end
// of its back-off, and the round stores its report again once it is
// closed (the first carried no demand for the rules that fail closed).
// Without the failed report first, it waits out the back-off. In a
// synctest bubble, on its fake clock; rounds 10 s apart.
func TestRoundThatFindsTheStoreBackProbesAtOnce(t *testing.T) {
	for _, failFirst := range []bool{true, false} {
		t.Run(fmt.Sprintf("failFirst=%v", failFirst), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				cfg := slowRounds()
				cfg.Core.BreakerBackoff, cfg.Core.BreakerMaxBackoff = 30*time.Second, 30*time.Second
				log := &reportLog{MemShared: NewMemShared()}
				a, stop := runOnMemory(t, cfg, Deps{Shared: log})
				defer stop()
				br := a.Core().Breaker()
				log.mu.Lock()
				log.br, log.fail = br, failFirst
				log.mu.Unlock()
				time.Sleep(cfg.Tick - 100*time.Millisecond) // the next round in 100 ms
				openBreaker(br)
				time.Sleep(time.Second) // the round at 10 s
				log.mu.Lock()
				log.fail = false
				log.mu.Unlock()
				before := log.count()
				time.Sleep(cfg.Tick) // the round at 20 s
				closed := br.State(time.Now()) == region.BreakerClosed
				states := log.since(before)
				if !failFirst {
					if closed {
						t.Fatal("the breaker closed at a round whose report the store took, with no report it did not take before: no return seen")
					}
					return
				}
				if !closed {
					t.Fatalf("the breaker still %s after the round that found the store back", br.State(time.Now()))
				}
				if len(states) != 2 || states[0] == region.BreakerClosed || states[1] != region.BreakerClosed {
					t.Fatalf("the round stored reports with the breaker %v, want one open, then one closed", states)
				}
			})
		})
	}
}

// reportLog is a MemShared that records the state of br (the agent's
// breaker) as each report is stored, and fails to store reports while
// fail is set.
type reportLog struct {
	*MemShared
	mu     sync.Mutex
	br     *region.Breaker
	fail   bool
	states []region.BreakerState
}

var errNotTaken = errors.New("test: the store did not take the report")

func (l *reportLog) note() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.fail {
		return errNotTaken
	}
	if l.br != nil {
		l.states = append(l.states, l.br.State(time.Now()))
	}
	return nil
}

func (l *reportLog) Adopt(ctx context.Context, r region.DemandReport) error {
	if err := l.note(); err != nil {
		return err
	}
	return l.MemShared.Adopt(ctx, r)
}

func (l *reportLog) PutDemand(ctx context.Context, r region.DemandReport) error {
	if err := l.note(); err != nil {
		return err
	}
	return l.MemShared.PutDemand(ctx, r)
}

func (l *reportLog) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.states)
}

func (l *reportLog) since(i int) []region.BreakerState {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.states[i:])
}

// slowRounds is an agent's configuration whose rounds come 10 s apart, as
// a dead store's deadlines stretch them, the first at the start.
func slowRounds() Config {
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region = "solo-0", "solo"
	cfg.Core.Floors = lease.Split{Regions: []string{"solo"}}
	cfg.Tick, cfg.SpeakerLease = 10*time.Second, 30*time.Second
	return cfg
}

// openBreaker opens br with failures (calls the store did not answer) at
// the clock's now, and returns when.
func openBreaker(br *region.Breaker) time.Time {
	for br.State(time.Now()) == region.BreakerClosed {
		br.Failure(time.Now())
	}
	return time.Now()
}

// cutLog is a StaticMembership that records when this agent's announced
// cut changed.
type cutLog struct {
	*StaticMembership
	mu      sync.Mutex
	cut     bool
	changes []time.Time
}

func (m *cutLog) SetCut(cut bool) {
	m.mu.Lock()
	if cut != m.cut {
		m.cut = cut
		m.changes = append(m.changes, time.Now())
	}
	m.mu.Unlock()
	m.StaticMembership.SetCut(cut)
}

func (m *cutLog) last() (bool, []time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cut, slices.Clone(m.changes)
}

// TestCutAnnouncedBetweenRounds: an agent whose breaker opens between two
// rounds far apart (a dead store makes each of a round's calls wait out
// its deadline) announces its cut within a probe period, not at the next
// round, so the other agents stop spending its share; and announces that
// it is back as its probe closes the breaker. In a synctest bubble, on its
// fake clock.
func TestCutAnnouncedBetweenRounds(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := slowRounds()
		ms := &cutLog{StaticMembership: NewStaticMembership("solo-0", "solo-1")}
		a, stop := runOnMemory(t, cfg, Deps{Membership: ms})
		defer stop()
		time.Sleep(time.Second) // the fake clock: the first round is over
		opened := openBreaker(a.Core().Breaker())
		time.Sleep(2 * cfg.Core.BreakerBackoff) // the probe closes it again
		cut, changes := ms.last()
		if cut || len(changes) != 2 {
			t.Fatalf("announced cut=%v, changes at %v, want a cut and its end", cut, changes)
		}
		if d := changes[0].Sub(opened); d > probeEvery {
			t.Fatalf("the cut announced %s after the breaker opened, want within %s", d, probeEvery)
		}
		if d := changes[1].Sub(opened); d > cfg.Core.BreakerBackoff+probeEvery {
			t.Fatalf("the cut's end announced %s after the breaker opened, want within its back-off and %s", d, probeEvery)
		}
	})
}

// TestStatusSaysWhenTheTableWasAdopted: an agent that does not speak says
// when it began deciding with its table — one its round read, and one a
// notice brought between rounds — by its clock.
func TestStatusSaysWhenTheTableWasAdopted(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := NewMemShared()
		publish := func(pub uint64) {
			t.Helper()
			tb := &region.Table{Region: "solo", Speaker: "solo-1", Pub: pub, LeaseEnd: time.Now().Add(time.Hour),
				Entries: []lease.Entry{{Key: bucket.Key{Rule: "api", Subject: "t"}, Count: 100 * bucket.Tokens(pub), Burst: 10}}}
			if ok, err := sh.PublishTable(t.Context(), tb, Fence{}); !ok || err != nil {
				t.Fatalf("publish %d: %v %v", pub, ok, err)
			}
		}
		publish(1)
		start := time.Now()
		a, stop := runOnMemory(t, slowRounds(), Deps{Shared: sh, Membership: NewStaticMembership("solo-0", "solo-1")})
		defer stop()
		synctest.Wait()
		if st := a.Status(); st.Table == nil || st.Table.Pub != 1 || !st.Adopted.Equal(start) {
			t.Fatalf("after the first round: table %+v adopted at %v, want pub 1 at the start", st.Table, st.Adopted.Sub(start))
		}
		time.Sleep(3 * time.Second) // rounds are 10 s apart
		publish(2)
		synctest.Wait()
		if st := a.Status(); st.Table == nil || st.Table.Pub != 2 || !st.Adopted.Equal(start.Add(3*time.Second)) {
			t.Fatalf("after a notice: table %+v adopted at %v, want pub 2 at 3s", st.Table, st.Adopted.Sub(start))
		}
	})
}

// runOnMemory makes an agent of cfg with deps on an in-memory store (and
// a silent logger, seed 1), and runs it until stop returns.
func runOnMemory(t *testing.T, cfg Config, deps Deps) (a *Agent, stop func()) {
	t.Helper()
	deps.Store, deps.Logger, deps.Seed = bucket.NewMemory(bucket.MemoryOptions{}), slog.New(slog.NewTextHandler(io.Discard, nil)), 1
	a, err := New(cfg, deps)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	return a, func() { cancel(); <-done }
}
