package sim

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// allot is the system under test, built from the real code: per region,
// agents each running a region.Core (allocations per key, exact buckets,
// token batches, failure policies, circuit breaker, failover draining)
// against the regional Redis model, each deciding with its own
// region.TableView of the table the region's speaking agent publishes, and
// the lease protocol (leasePlane: the speaking agent's region.Speaker per
// region, lease.Allocator on the coordinator leader) moving allocations
// between regions.
type allot struct {
	si     int
	w      *world
	plane  *leasePlane
	redis  []*regionalRedis
	agents [][]*agentRT
	rr     []int           // round-robin position per region
	cfg    []region.Config // per region
	ctx    context.Context

	// lat accumulates the store round trips of the decision in progress.
	lat       Micros
	failovers []int
	// starts are what each fault of the scenario found when it began, for
	// its term of the bound (bound.go).
	starts []faultStart
	// curBudget is the budget of the decision in progress, −1 between
	// decisions: the store's calls for its key need not parse the key.
	curBudget int
	// onLevel, when a test sets it, sees every report stored for a new
	// level, round set for a level the agent's round took.
	onLevel func(r, ai int, t Micros, round bool)
}

// agentRT is one agent process of a region.
type agentRT struct {
	name  string
	alive bool
	core  *region.Core
	store *simStore
	// view is the agent's view of the region's table: the speaking agent
	// sets it as it publishes, the others load it on its notice
	// (leasePlane.notify) and at their ticks.
	view *region.TableView
	// speakAfter is when the agent may speak for the region: an agent
	// that restarts waits first, as the agent's SpeakerWait.
	speakAfter Micros
	// demand and items are the tick's buffers; items alternates between
	// two so the report stored in the shared store is never written over.
	demand []region.KeyDemand
	items  [2][]region.DemandItem
	flip   int
	// cut is what the agent last announced: its breaker not closed.
	cut bool
	// levelNext is when the agent may next store a report for a new level
	// (Core.Leveled) between rounds: half a tick after the last (0: now).
	levelNext Micros
}

// setBreaker gives cfg the scenario's breaker settings as the agent's
// flags do (cmd/agent: -redis-timeout, -breaker-failures,
// -breaker-backoff): the agents' cores and the store-backed baselines'
// agents (storeFaults) time out, open, back off and probe alike. The
// longest deadline and back-off stay the agent's unless the scenario's
// first ones are longer.
func setBreaker(cfg *region.Config, ag AgentSpec) {
	cfg.Timeout = ag.Timeout
	cfg.MaxTimeout = max(cfg.MaxTimeout, ag.Timeout)
	cfg.BreakerFailures, cfg.BreakerBackoff = ag.BreakerFailures, ag.BreakerBackoff
	cfg.BreakerMaxBackoff = max(cfg.BreakerMaxBackoff, ag.BreakerBackoff)
}

// simStore is an agent's bucket.Store: the regional Redis model reached
// over the simulated link. A call is answered at once in virtual time, at
// the primary's clock one one-way latency later, and its round trip is
// charged to the decision's latency; a call that cannot reach the primary
// (partition, loss, failover) fails with bucket.ErrUnavailable after the
// agent's timeout.
type simStore struct {
	a      *allot
	region int
	agent  int
	// slow is the redis_slow fault on the link, nil without one; outgrown
	// says the last call timed out under a deadline since raised (see
	// timed in slowredis.go).
	slow     *slowLink
	outgrown bool
}

var _ bucket.Store = (*simStore)(nil)

// allot's own events.
const (
	alTick  uint8 = iota + 16 // an agent core's periodic tick
	alPlane                   // routed to the plane
	alFailoverDetected
	alSampleHot // an agent samples its batched keys between ticks
)

// coreTick is how often an agent ticks its core (batch give-back, demand
// sampling), as the agent's driver does (agent.DefaultConfig's Tick).
const coreTick = 100_000 // µs

// hotSampleEvery is how often an agent samples its batched keys between
// ticks (Core.SampleHot), as the agent's driver does on a real clock
// (agent.hotSampleEvery).
const hotSampleEvery = 20_000 // µs

func newAllot(w *world) error {
	a := &allot{w: w, ctx: context.Background()}
	n := len(w.regions)
	replicate := false
	for _, f := range w.sc.Faults {
		replicate = replicate || f.Kind == FaultRedisFailover
	}
	var names []string
	for _, rg := range w.regions {
		names = append(names, rg.name)
	}
	for r := range w.regions {
		rg := w.regions[r]
		a.redis = append(a.redis, newRegionalRedis(w.nb, rg.redis, rg.replica, us(w.sc.Redis.Lag), replicate))
	}
	a.curBudget = -1
	a.rr = make([]int, n)
	a.failovers = make([]int, n)
	a.starts = make([]faultStart, len(w.sc.Faults))
	a.si = w.addSystem(a)
	for r := range w.regions {
		cfg := region.DefaultConfig()
		cfg.Region = w.regions[r].name
		var reserve float64
		var weights []int64
		if len(w.rules) > 0 {
			reserve, weights = w.rules[0].spec.Reserve, w.rules[0].spec.Weights
		}
		cfg.Floors = lease.Split{Regions: names, Weights: weights, Reserve: reserve}
		cfg.Rules = map[string]region.RuleConfig{}
		for _, ru := range w.rules {
			cfg.Rules[ru.spec.Name] = region.RuleConfig{Scope: rules.ScopeGlobal, OnUnavailable: policyOf(ru.spec.Policy),
				EmptyOnFailover: w.sc.Redis.OnFailover == "empty"}
		}
		ag := w.sc.Agent
		cfg.BatchWindow, cfg.BatchMaxFraction, cfg.BatchTTL = ag.BatchWindow, ag.BatchMaxFraction, ag.BatchTTL
		setBreaker(&cfg, ag)
		cfg.Shards = 1 // one goroutine drives it
		a.cfg = append(a.cfg, cfg)
		var ags []*agentRT
		for i := 0; i < w.regions[r].agents; i++ {
			rt := &agentRT{name: fmt.Sprintf("%s-%03d", cfg.Region, i), alive: true, store: &simStore{a: a, region: r, agent: i}}
			if err := a.startCore(r, rt); err != nil {
				return err
			}
			ags = append(ags, rt)
			first := Micros(r*7919+i*1013+coreTick/3)%coreTick + 1
			w.at(first, a.si, event{sub: alTick, aux: int32(r), agt: int32(i)})
			w.at(first%hotSampleEvery+1, a.si, event{sub: alSampleHot, aux: int32(r), agt: int32(i)})
		}
		a.agents = append(a.agents, ags)
	}
	for r := range w.regions {
		a.setLive(r)
	}
	p, err := newPlane(w, a)
	if err != nil {
		return err
	}
	a.plane = p
	p.start(w, 0)
	return nil
}

// rule policies map onto the rules package's names.
func policyOf(p string) rules.FailurePolicy {
	switch p {
	case PolicyOpen:
		return rules.FailOpen
	case PolicyEmergency:
		return rules.Emergency
	}
	return rules.FailClosed
}

// startCore starts agent rt of region r afresh: a new core, and a view
// with no table until it loads the shared one.
func (a *allot) startCore(r int, rt *agentRT) error {
	rt.view = region.NewTableView(a.cfg[r].Region, a.cfg[r].Floors)
	c, err := region.NewCore(a.cfg[r], rt.store, rt.view)
	if err != nil {
		return fmt.Errorf("sim: region core for %s: %w", a.cfg[r].Region, err)
	}
	rt.core = c
	return nil
}

// setLive tells every live agent of region r how many live agents it has,
// as membership would.
func (a *allot) setLive(r int) {
	live := 0
	for _, ag := range a.agents[r] {
		if ag.alive {
			live++
		}
	}
	for _, ag := range a.agents[r] {
		if ag.alive {
			ag.core.SetLive(live)
		}
	}
}

func (a *allot) name() string { return "allot" }

// pick returns the next live agent of region r, or −1: the region's load
// balancer spreads requests over its live agents.
func (a *allot) pick(r int) int {
	ags := a.agents[r]
	rr := a.rr[r]
	for range ags {
		// rr wraps by a compare, not a modulo: the division was a
		// measurable part of every arrival.
		if rr++; rr == len(ags) {
			rr = 0
		}
		if ags[rr].alive {
			a.rr[r] = rr
			return rr
		}
	}
	a.rr[r] = rr
	return -1
}

func (a *allot) arrive(w *world, t Micros, r, b int, cost int64, idealOK bool) {
	ai := a.pick(r)
	if ai < 0 {
		w.reject(a.si, b, idealOK, pathClosed, 0, true)
		return
	}
	ag := a.agents[r][ai]
	rule := w.ruleOf(b)
	a.lat = 0
	w.decisions++
	a.curBudget = b
	var res region.Result
	err := ag.core.DecideInto(a.ctx, w.regions[r].agent.at(t), &a.plane.keys[b], &rule.limit, bucket.Tokens(cost), "", &res)
	a.curBudget = -1
	a.leveled(w, r, ai, t, false)
	p := pathOf(res.Path)
	if err != nil && !errors.Is(err, region.ErrFailClosed) {
		w.reject(a.si, b, idealOK, p, a.lat, true)
		return
	}
	if res.Decision.Allowed {
		w.admit(a.si, r, b, cost, t, p, a.lat)
		return
	}
	w.reject(a.si, b, idealOK, p, a.lat, res.Path == region.PathFailClosed)
}

func pathOf(p region.Path) path {
	switch p {
	case region.PathStore:
		return pathRedis
	case region.PathEmergency, region.PathFailOpen:
		return pathEmergency
	case region.PathFailClosed:
		return pathClosed
	}
	return pathLocal // batch, deny cache, no allocation: decided in process
}

// reach is one store call from agent ai of region r at now: it returns the
// virtual instant the call executes at the primary, or false when it cannot
// reach one (and charges the timeout).
func (s *simStore) reach() (Micros, bool) {
	a, w := s.a, s.a.w
	t := w.eng.now
	w.meters[a.si].redisOps++
	rng := w.sysRng[a.si]
	s.outgrown = false
	if w.redisCut(s.region, s.agent) {
		a.lat += us(w.sc.Agent.Timeout)
		return 0, false
	}
	if p := w.net.loss + w.net.extraRedis; p > 0 && rng.Float64() < p {
		a.lat += us(w.sc.Agent.Timeout)
		return 0, false
	}
	out := w.net.delay(rng, s.region, s.region)
	at := t + out
	if !a.redis[s.region].up(at) {
		a.lat += us(w.sc.Agent.Timeout)
		return 0, false
	}
	back := w.net.delay(rng, s.region, s.region)
	if s.slow != nil || a.deadlineRaised(s.region, s.agent) {
		return s.timed(rng, t, out, back)
	}
	a.lat += out + back
	return at, true
}

func (s *simStore) unavailable(op string, key bucket.Key) error {
	if s.outgrown {
		return fmt.Errorf("%w: %w: sim: %s %s/%s", bucket.ErrUnavailable, breaker.ErrOutgrown, op, key.Rule, key.Subject)
	}
	return fmt.Errorf("%w: sim: %s %s/%s: regional redis of %s unreachable", bucket.ErrUnavailable, op, key.Rule, key.Subject, s.a.w.regions[s.region].name)
}

func (s *simStore) budget(key bucket.Key) int {
	if b := s.a.curBudget; b >= 0 && s.a.plane.keys[b] == key {
		return b
	}
	b, _ := s.a.plane.budgetOf(s.a.w, key)
	return b
}

// Decide implements bucket.Store.
func (s *simStore) Decide(_ context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, _ string) (bucket.Decision, error) {
	if !l.Fits(cost) {
		return bucket.Decision{Limit: l}, bucket.Check(l, cost)
	}
	at, ok := s.reach()
	if !ok {
		return bucket.Decision{Limit: l}, s.unavailable("decide", key)
	}
	return s.a.redis[s.region].decide(s.budget(key), at, l, int64(cost)), nil
}

// TakeUpTo implements bucket.Store.
func (s *simStore) TakeUpTo(_ context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	if err := bucket.Check(l, 1); err != nil {
		return 0, err
	}
	at, ok := s.reach()
	if !ok {
		return 0, s.unavailable("take", key)
	}
	return bucket.Tokens(s.a.redis[s.region].takeUpTo(s.budget(key), at, l, int64(n))), nil
}

// Return implements bucket.Store.
func (s *simStore) Return(_ context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	if err := bucket.Check(l, 1); err != nil {
		return err
	}
	at, ok := s.reach()
	if !ok {
		return s.unavailable("return", key)
	}
	s.a.redis[s.region].giveBack(s.budget(key), at, l, int64(n))
	return nil
}

// Peek implements bucket.Store.
func (s *simStore) Peek(_ context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := bucket.Check(l, 1); err != nil {
		return bucket.Decision{Limit: l}, err
	}
	at, ok := s.reach()
	if !ok {
		return bucket.Decision{Limit: l}, s.unavailable("peek", key)
	}
	return s.a.redis[s.region].peek(s.budget(key), at, l), nil
}

// tick is agent ai of region r's periodic work at t, as the agent's
// driver does it: tick the core; unless it speaks, load the shared table;
// write its demand report, with the publication it decides with.
func (a *allot) tick(w *world, r, ai int, t Micros) {
	ag := a.agents[r][ai]
	now := w.regions[r].agent.at(t)
	cut := ag.core.Breaker().State(now) != region.BreakerClosed
	ag.core.Tick(a.ctx, now)
	a.announce(r, ai, now)
	rp := a.plane.regions[r]
	if rp.speaker != ai {
		if tb, ok := rp.shared.loadTable(w, a.plane, r, ai, t); ok && tb != nil {
			ag.view.Set(tb)
		}
	}
	// The report's fate while the breaker is open tells the core
	// (Core.Elsewhere): taken after one that was not, the store is back,
	// the agent probes at once and, closed, stores its report again, with
	// the demand the first left out.
	if stored := a.report(w, r, ai, t, now, false); cut && ag.core.Elsewhere(a.ctx, now, stored) && stored {
		a.announce(r, ai, now)
		a.report(w, r, ai, t, now, false)
	}
	// A level the round's sampling took is stored again, marked, as the
	// agent's reportLevels does just after its round (unless it stored one
	// within half a tick). Drained here, as it was, it reached the Speaker
	// at its next tick.
	a.leveled(w, r, ai, t, true)
}

// leveled stores agent ai of region r's report at t when its core says a
// key's demand took a new level since (Core.Leveled), as the agent's driver
// does between rounds and just after each (agent.reportLevels), round set
// for the latter: at most one every half tick, a level within half a tick
// of the last one so reported being left to the round.
func (a *allot) leveled(w *world, r, ai int, t Micros, round bool) {
	ag := a.agents[r][ai]
	select {
	case <-ag.core.Leveled():
	default:
		return
	}
	if t < ag.levelNext {
		return
	}
	ag.levelNext = t + coreTick/2
	if a.report(w, r, ai, t, w.regions[r].agent.at(t), true) && a.onLevel != nil {
		a.onLevel(r, ai, t, round)
	}
}

// report stores agent ai of region r's demand report at t, with the
// publication it decides with, marked a new level when level is set, and
// reports whether the store took it.
func (a *allot) report(w *world, r, ai int, t Micros, now time.Time, level bool) bool {
	ag := a.agents[r][ai]
	ag.demand = ag.core.AppendDemand(ag.demand[:0], now)
	ag.flip ^= 1
	rep := region.AppendReport(ag.items[ag.flip], ag.name, now, ag.demand)
	rep.Level = level
	ag.items[ag.flip] = rep.Keys
	if tb := ag.view.Table(); tb != nil {
		rep.Pub, rep.Speaker = tb.Pub, tb.Speaker
	}
	if !a.plane.regions[r].shared.putDemand(w, a.plane, r, ai, t, rep) {
		ag.flip ^= 1 // not stored: the stored report keeps its buffer
		return false
	}
	a.plane.announce(w, r, ai, t, rep)
	return true
}

func (a *allot) handle(w *world, e *event) {
	switch e.sub {
	case alTick:
		r, ai := int(e.aux), int(e.agt)
		if ag := a.agents[r][ai]; ag.alive {
			a.tick(w, r, ai, e.at)
		}
		w.at(e.at+coreTick, a.si, event{sub: alTick, aux: e.aux, agt: e.agt})
	case alSampleHot:
		r, ai := int(e.aux), int(e.agt)
		if ag := a.agents[r][ai]; ag.alive {
			ag.core.SampleHot(w.regions[r].agent.at(e.at))
			a.leveled(w, r, ai, e.at, false)
		}
		w.at(e.at+hotSampleEvery, a.si, event{sub: alSampleHot, aux: e.aux, agt: e.agt})
	case alFailoverDetected:
		// The agents see the Redis role or run id change and tell their
		// cores, which drain buckets of rules that start empty.
		r := int(e.aux)
		for _, ag := range a.agents[r] {
			if ag.alive {
				ag.core.Failover(w.regions[r].agent.at(e.at))
			}
		}
	case alPlane:
		a.plane.handle(w, e)
	}
}

func (a *allot) fault(w *world, f *FaultSpec, start bool) {
	r := w.sc.regionIndex(f.Region)
	if start {
		a.starts[w.faultIndex(f)] = a.snapshot(w, w.eng.now)
	}
	switch f.Kind {
	case FaultRedisSlow:
		a.slowFault(r, f, start)
	case FaultRedisFailover:
		if start {
			t := us(f.At)
			down := us(w.sc.Redis.Failover)
			a.redis[r].failover(t, down)
			a.plane.regions[r].shared.failover(t, us(w.sc.Redis.Lag))
			a.failovers[r]++
			w.at(t+down, a.si, event{sub: alFailoverDetected, aux: int32(r)}) // #nosec G115 -- a region index; Validate allows at most 255
		}
	case FaultAgentCrash:
		ai := 0
		if f.Agent != nil {
			ai = *f.Agent
		}
		ag := a.agents[r][ai]
		if start {
			// A crash loses the core's state, batch tokens included: that
			// only ever under-admits.
			ag.alive = false
		} else {
			ag.alive = true
			ag.speakAfter = w.eng.now + speakerWait
			ag.levelNext = 0 // a new process
			if err := a.startCore(r, ag); err != nil {
				panic(err) // the config was validated at start
			}
		}
		a.setLive(r)
	}
	a.plane.fault(w, f, start)
}

func (a *allot) finish(w *world) map[string]any {
	var lost, scripts int64
	for _, rd := range a.redis {
		for _, v := range rd.lost {
			lost += v
		}
		scripts += rd.ops
	}
	var st region.Stats
	out := map[string]any{"redis_lost_tokens": lost, "lease_step_errors": a.plane.stepErrors,
		"redis_scripts": scripts}
	var refills, returns, drains, storeErrors, opened int64
	for _, ags := range a.agents {
		for _, ag := range ags {
			st = ag.core.Stats()
			opened += st.BreakerOpened
			refills += st.Refills
			returns += st.Returns
			drains += st.Drains
			storeErrors += st.StoreErrors
		}
	}
	out["batch_refills"], out["batch_returns"], out["failover_drains"], out["store_errors"] = refills, returns, drains, storeErrors
	out["breaker_opened"] = opened
	return out
}

func (a *allot) coordinatorMessages() int64        { return a.plane.messages() }
func (a *allot) messageBins() []int64              { return a.plane.messageBins() }
func (a *allot) allocation(w *world) [][][]float64 { return a.plane.allocation(w) }

// subjectIndex parses the subject "s<k>" the simulator gives key k.
func subjectIndex(s string) (int, bool) {
	if len(s) < 2 || s[0] != 's' {
		return 0, false
	}
	n, err := strconv.Atoi(s[1:])
	return n, err == nil
}
