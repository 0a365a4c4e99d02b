package sim

import (
	"fmt"
	"math"

	"github.com/allot-dev/allot/bucket"
)

// allot is the system under test: per region, agents deciding from the
// region's allocation of each budget, enforced exactly by the regional Redis
// bucket (bucket/ functions at the primary's clock), token batches for hot
// keys, the rule's failure policy when Redis is unreachable, and a control
// plane (the lease protocol) that moves allocations between regions.
type allot struct {
	si     int
	w      *world
	plane  plane
	redis  []*regionalRedis
	agents [][]*agent
	rr     []int // round-robin position per region
	policy []string
	// cut[r][a] marks an agent cut off from its Redis by a fault, for the
	// bound; outage[r][rule] accumulates the cut time per policy.
	outage    [][]Micros
	cutStart  [][]Micros
	failovers []int
	batched   []bool // per rule: some agent took a batch
}

// agent is one agent process of a region.
type agent struct {
	alive        bool
	batches      map[int32]*batch
	emergency    map[int32]bucket.State
	failures     int
	breakerUntil Micros
	inflight     map[int32]bool // a batch refill is on its way
}

// batch is the tokens an agent holds for one hot budget, taken from the
// regional bucket before they are spent (invariant I3).
type batch struct {
	tokens  int64
	takenAt Micros
	// demand is an exponentially weighted estimate of the agent's local
	// demand for the budget, tokens per µs, sizing the next batch.
	demand float64
	lastT  Micros
}

// plane is the control plane as the agents see it: the region's current
// allocation of a budget, and the demand the region observes.
type plane interface {
	// limit returns region r's allocation of budget b now, and whether the
	// budget is hot there (served from a coordinator allocation, batched).
	limit(r, b int) (bucket.Limit, bool)
	// observe tells the plane about one request in region r.
	observe(w *world, r, b int, cost int64, admitted bool, t Micros)
	handle(w *world, e *event)
	fault(w *world, f *FaultSpec, start bool)
	// boundTerms adds the plane's own overshoot allowance for a rule.
	boundTerms(w *world, rule int) (float64, []string)
	messages() int64
	allocation(w *world) [][][]float64
}

// allot's own events.
const (
	alRedisOp uint8 = iota + 16
	alTimeout
	alReply
	alPlane // routed to the plane
)

func newAllot(w *world) error {
	a := &allot{w: w}
	n := len(w.regions)
	replicate := false
	for _, f := range w.sc.Faults {
		replicate = replicate || f.Kind == FaultRedisFailover
	}
	for r := range w.regions {
		rg := w.regions[r]
		a.redis = append(a.redis, newRegionalRedis(w.nb, rg.redis, rg.replica, us(w.sc.Redis.Lag),
			replicate, w.sc.Redis.OnFailover == "empty"))
		var ags []*agent
		for i := 0; i < rg.agents; i++ {
			ags = append(ags, &agent{alive: true, batches: map[int32]*batch{}, emergency: map[int32]bucket.State{}, inflight: map[int32]bool{}})
		}
		a.agents = append(a.agents, ags)
		a.outage = append(a.outage, make([]Micros, 1))
		a.cutStart = append(a.cutStart, make([]Micros, rg.agents+1))
	}
	a.rr = make([]int, n)
	a.failovers = make([]int, n)
	for _, r := range w.rules {
		a.policy = append(a.policy, r.spec.Policy)
	}
	a.batched = make([]bool, len(w.rules))
	a.si = w.addSystem(a)
	p, err := newPlane(w, a)
	if err != nil {
		return err
	}
	a.plane = p
	if !w.opts.LeakyLimitChanges {
		for r, rd := range a.redis {
			rd.last = make([]bucket.Limit, w.nb)
			rd.seen = make([]bool, w.nb)
			rd.debt = make([]int64, w.nb)
			rd.rule = w.ruleIdx
			rd.floors = p.floors[r]
		}
	}
	return nil
}

func (a *allot) name() string { return "allot" }

// pick returns the next live agent of region r, or −1.
func (a *allot) pick(r int) int {
	ags := a.agents[r]
	for i := 0; i < len(ags); i++ {
		a.rr[r] = (a.rr[r] + 1) % len(ags)
		if ags[a.rr[r]].alive {
			return a.rr[r]
		}
	}
	return -1
}

const (
	flagIdeal = 1 << iota
	flagRefill
)

func (a *allot) arrive(w *world, t Micros, r, b int, cost int64, idealOK bool) {
	ai := a.pick(r)
	if ai < 0 {
		w.reject(a.si, idealOK, pathClosed, 0, true)
		a.plane.observe(w, r, b, cost, false, t)
		return
	}
	ag := a.agents[r][ai]
	l, hot := a.plane.limit(r, b)
	var flag int8
	if idealOK {
		flag |= flagIdeal
	}
	if t < ag.breakerUntil {
		a.policyDecide(w, t, r, ai, b, cost, flag, 0)
		return
	}
	var want int64
	if hot {
		bt := ag.batches[int32(b)]
		if bt == nil {
			bt = &batch{}
			ag.batches[int32(b)] = bt
		}
		bt.observe(t, cost)
		if bt.tokens > 0 && t-bt.takenAt > us(w.sc.Agent.BatchTTL) {
			// Stale tokens go back: a batch is a few tens of ms of demand,
			// never a reserve kept for later.
			a.giveBack(w, t, r, ai, b, l, bt.tokens)
			bt.tokens = 0
		}
		if bt.tokens >= cost {
			bt.tokens -= cost
			w.decisions++
			w.admit(a.si, r, b, cost, t, pathLocal, 0)
			a.plane.observe(w, r, b, cost, true, t)
			return
		}
		if !ag.inflight[int32(b)] {
			want = bt.size(w, l, cost)
			ag.inflight[int32(b)] = true
			flag |= flagRefill
			a.batched[w.ruleIdx[b]] = true
		}
	}
	at, ok := w.net.send(w.sysRng[a.si], node{kind: kindAgent, region: r, idx: ai}, node{kind: kindRedis, region: r}, t)
	if !ok {
		w.at(t+us(w.sc.Agent.Timeout), a.si, event{sub: alTimeout, aux: int32(r), agt: int32(ai), j: int32(b), k: cost, sent: t, flag: flag})
		return
	}
	w.at(at, a.si, event{sub: alRedisOp, aux: int32(r), agt: int32(ai), j: int32(b), k: cost | want<<32, sent: t, flag: flag})
}

// observe updates the agent's estimate of its demand for a hot budget.
func (bt *batch) observe(t Micros, cost int64) {
	const halfLife = 200_000.0 // µs: follow demand within a few refreshes
	dt := float64(t - bt.lastT)
	if bt.lastT == 0 || dt > 5*halfLife {
		bt.demand = 0
	} else if dt > 0 {
		decay := 1 / (1 + dt/halfLife)
		bt.demand *= decay
	}
	bt.demand += float64(cost) / halfLife
	bt.lastT = t
}

// size is the next batch: the agent's demand over the batch window, at
// least one request's cost, at most a fraction of the region's burst.
func (bt *batch) size(w *world, l bucket.Limit, cost int64) int64 {
	n := int64(bt.demand * float64(us(w.sc.Agent.BatchWindow)))
	hi := int64(float64(l.Burst()) * w.sc.Agent.BatchMaxFraction)
	n = min(n, hi)
	return max(n, cost, 1)
}

func (a *allot) handle(w *world, e *event) {
	switch e.sub {
	case alRedisOp:
		a.redisOp(w, e)
	case alTimeout:
		a.timeout(w, e)
	case alReply:
		r, ai, b := int(e.aux), int(e.agt), int32(e.j)
		ag := a.agents[r][ai]
		delete(ag.inflight, b)
		if !ag.alive {
			return // a crashed agent's tokens are lost: under-admission only
		}
		if e.k > 0 {
			bt := ag.batches[b]
			if bt == nil {
				bt = &batch{}
				ag.batches[b] = bt
			}
			// The batch ages from its debit at Redis; tokens still held from
			// an older batch keep their older age, so no token is ever kept
			// longer than the batch TTL.
			if bt.tokens == 0 {
				bt.takenAt = e.sent
			}
			bt.tokens += e.k
		}
	case alPlane:
		a.plane.handle(w, e)
	}
}

// redisOp runs one script call at the regional primary: decide the request,
// and take a batch when the agent asked for one. The request counts as
// admitted at the instant Redis debits it, if the answer reaches the agent.
func (a *allot) redisOp(w *world, e *event) {
	r, ai, b := int(e.aux), int(e.agt), int(e.j)
	cost, want := e.k&(1<<32-1), e.k>>32
	rd := a.redis[r]
	ag := a.agents[r][ai]
	if !rd.up(e.at) {
		w.at(e.sent+us(w.sc.Agent.Timeout), a.si, event{sub: alTimeout, aux: e.aux, agt: e.agt, j: e.j, k: cost, sent: e.sent, flag: e.flag})
		return
	}
	l, _ := a.plane.limit(r, b)
	w.decisions++
	w.meters[a.si].redisOps++
	ok := rd.decide(b, e.at, l, cost)
	var got int64
	if want > 0 {
		got = rd.takeUpTo(b, e.at, l, want)
	}
	back, delivered := w.net.send(w.sysRng[a.si], node{kind: kindRedis, region: r}, node{kind: kindAgent, region: r, idx: ai}, e.at)
	if e.flag&flagRefill != 0 {
		if delivered {
			w.at(back, a.si, event{sub: alReply, aux: e.aux, agt: e.agt, j: e.j, k: got, sent: e.at})
		} else {
			delete(ag.inflight, int32(b))
		}
	}
	if !delivered {
		w.at(e.sent+us(w.sc.Agent.Timeout), a.si, event{sub: alTimeout, aux: e.aux, agt: e.agt, j: e.j, k: cost, sent: e.sent, flag: e.flag &^ flagRefill})
		return
	}
	ag.failures = 0
	if ok {
		w.admit(a.si, r, b, cost, e.at, pathRedis, back-e.sent)
	} else {
		w.reject(a.si, e.flag&flagIdeal != 0, pathRedis, back-e.sent, false)
	}
	a.plane.observe(w, r, b, cost, ok, e.at)
}

// timeout is an agent giving up on Redis: it counts the failure (opening
// the breaker after enough of them) and applies the rule's policy.
func (a *allot) timeout(w *world, e *event) {
	r, ai := int(e.aux), int(e.agt)
	ag := a.agents[r][ai]
	if e.flag&flagRefill != 0 {
		delete(ag.inflight, e.j)
	}
	ag.failures++
	if ag.failures >= w.sc.Agent.BreakerFailures && e.at >= ag.breakerUntil {
		ag.breakerUntil = e.at + us(w.sc.Agent.BreakerBackoff)
		ag.failures = 0
	}
	a.policyDecide(w, e.at, r, ai, int(e.j), e.k, e.flag, e.at-e.sent)
}

// policyDecide decides a request without Redis under the rule's failure
// policy: closed rejects, open admits, emergency admits from a local bucket
// holding the region's allocation divided by its live agents.
func (a *allot) policyDecide(w *world, t Micros, r, ai, b int, cost int64, flag int8, lat Micros) {
	idealOK := flag&flagIdeal != 0
	switch a.policy[w.ruleIdx[b]] {
	case PolicyClosed:
		w.reject(a.si, idealOK, pathClosed, lat, true)
		a.plane.observe(w, r, b, cost, false, t)
	case PolicyOpen:
		w.admit(a.si, r, b, cost, t, pathEmergency, lat)
	case PolicyEmergency:
		ag := a.agents[r][ai]
		l, _ := a.plane.limit(r, b)
		live := 0
		for _, x := range a.agents[r] {
			if x.alive {
				live++
			}
		}
		el := share(l, 1, int64(max(live, 1)))
		w.decisions++
		d, ns, err := bucket.Decide(ag.emergency[int32(b)], w.regions[r].agent.at(t), el, bucket.Tokens(cost))
		if err != nil || !d.Allowed {
			w.reject(a.si, idealOK, pathEmergency, lat, false)
			return
		}
		ag.emergency[int32(b)] = ns
		w.admit(a.si, r, b, cost, t, pathEmergency, lat)
	}
}

// giveBack sends unused batch tokens back to the regional bucket.
func (a *allot) giveBack(w *world, t Micros, r, ai, b int, l bucket.Limit, n int64) {
	if n <= 0 {
		return
	}
	if _, ok := w.net.send(w.sysRng[a.si], node{kind: kindAgent, region: r, idx: ai}, node{kind: kindRedis, region: r}, t); !ok || !a.redis[r].up(t) {
		return // lost tokens only ever under-admit
	}
	w.meters[a.si].redisOps++
	a.redis[r].giveBack(b, t, l, n)
}

// returnBatches gives back every batch of region r's agents for budget b,
// when its allocation shrinks.
func (a *allot) returnBatches(w *world, t Micros, r, b int, l bucket.Limit) {
	for ai, ag := range a.agents[r] {
		if bt := ag.batches[int32(b)]; bt != nil && bt.tokens > 0 {
			a.giveBack(w, t, r, ai, b, l, bt.tokens)
			bt.tokens = 0
		}
	}
}

func (a *allot) fault(w *world, f *FaultSpec, start bool) {
	r := w.sc.regionIndex(f.Region)
	switch f.Kind {
	case FaultRedisFailover:
		if start {
			a.redis[r].failover(us(f.At), us(w.sc.Redis.Failover))
			a.failovers[r]++
		}
	case FaultAgentCrash:
		ai := 0
		if f.Agent != nil {
			ai = *f.Agent
		}
		ag := a.agents[r][ai]
		if start {
			ag.alive = false
			ag.batches = map[int32]*batch{}
			ag.emergency = map[int32]bucket.State{}
		} else {
			ag.alive = true
			ag.failures = 0
			ag.breakerUntil = 0
		}
	}
	a.plane.fault(w, f, start)
}

func (a *allot) finish(w *world) map[string]any {
	var lost int64
	for _, rd := range a.redis {
		for _, v := range rd.lost {
			lost += v
		}
	}
	return map[string]any{"redis_lost_tokens": lost}
}

func (a *allot) coordinatorMessages() int64        { return a.plane.messages() }
func (a *allot) allocation(w *world) [][][]float64 { return a.plane.allocation(w) }

// bound is the overshoot the design allows for rule ri under the
// scenario's faults: the sum of one term per fault, each from the table in
// the design, plus the plane's own terms (lease drift, batches).
func (a *allot) bound(w *world, ri int) (float64, []string, bool) {
	rule := &w.rules[ri]
	R := rule.limit.Rate() // tokens per second
	var total float64
	var terms []string
	add := func(v float64, format string, args ...any) {
		total += v
		terms = append(terms, fmt.Sprintf("%.3f: ", v)+fmt.Sprintf(format, args...))
	}
	unbounded := false
	policy := rule.spec.Policy
	outages := map[string]float64{} // region → seconds without Redis for this rule
	for _, f := range w.sc.Faults {
		switch f.Kind {
		case FaultRedisCut:
			outages[f.Region] += (f.For + w.sc.Agent.Timeout).Seconds()
		case FaultRedisFailover:
			ri2 := w.sc.regionIndex(f.Region)
			rd := a.redis[ri2]
			outages[f.Region] += (w.sc.Redis.Failover + w.sc.Agent.Timeout).Seconds()
			if w.sc.Redis.OnFailover == "keep" {
				var worst int64
				for k := 0; k < rule.keys; k++ {
					worst = max(worst, rd.lost[rule.base+k])
				}
				add(float64(worst), "redis failover in %s lost %d debited tokens (writes in the last lag=%s)", f.Region, worst, w.sc.Redis.Lag)
				reg := w.sc.Regions[ri2]
				if d := reg.ReplicaSkew - reg.RedisSkew; d > 0 {
					add(d.Seconds()*R, "replica clock ahead of the primary by %s × R", d)
				}
			} else {
				terms = append(terms, "0: redis failover in "+f.Region+" with buckets started empty")
			}
		}
	}
	for _, reg := range sortedKeys(outages) {
		sec := outages[reg]
		switch policy {
		case PolicyClosed:
			terms = append(terms, "0: "+reg+" without Redis fails closed")
		case PolicyOpen:
			unbounded = true
			terms = append(terms, "unbounded: "+reg+" without Redis fails open")
		case PolicyEmergency:
			l := a.maxLimit(w, w.sc.regionIndex(reg), ri)
			add(float64(l.Burst())+l.Rate()*sec, "emergency in %s: region burst %d + allocation %.3f/s × outage %.3fs",
				reg, l.Burst(), l.Rate(), sec)
		}
	}
	for _, reg := range w.sc.Regions {
		if reg.RedisDrift > 0 {
			add(reg.RedisDrift*R*w.sc.Duration.Seconds(), "redis clock in %s runs fast by %g × R × duration", reg.Name, reg.RedisDrift)
		}
	}
	if a.batched[ri] {
		// I3 holds for debits: batch tokens are taken from the regional
		// bucket before use. They are spent a little later, though, so in a
		// window the spends can exceed the debits by what agents held:
		// at most R × the batch TTL, and at most every agent's largest batch.
		held := R * w.sc.Agent.BatchTTL.Seconds()
		var most float64
		for r := range w.regions {
			l := a.maxLimit(w, r, ri)
			most += float64(w.regions[r].agents) * math.Max(1, math.Floor(float64(l.Burst())*w.sc.Agent.BatchMaxFraction))
		}
		add(math.Min(held, most), "batches spent after their debit: min(R × batch_ttl %s, Σ agents × largest batch %.0f)",
			w.sc.Agent.BatchTTL, most)
	}
	v, t := a.plane.boundTerms(w, ri)
	if v > 0 || len(t) > 0 {
		total += v
		terms = append(terms, t...)
	}
	if len(terms) == 0 {
		terms = []string{"0: escrow (I1), exact regional buckets (I2)"}
	}
	return total, terms, unbounded
}

// maxLimit is the largest allocation region r held for any budget of rule ri.
func (a *allot) maxLimit(w *world, r, ri int) bucket.Limit {
	if m, ok := a.plane.(interface {
		maxLimit(r, ri int) bucket.Limit
	}); ok {
		return m.maxLimit(r, ri)
	}
	l, _ := a.plane.limit(r, w.rules[ri].base)
	return l
}
