package sim

import (
	"github.com/allot-dev/allot/bucket"
)

// localBuckets is a baseline that decides every request in its own region
// only, against the regional Redis (evaluated at its primary's clock):
// "independent" gives each region the full global limit (N× overshoot with
// N regions), "static" gives each region a fixed 1/N of it (no overshoot,
// poor utilization under skew). Both decide at the arrival instant, the
// request and its answer crossing the region's link to its Redis (so
// cuts and loss there act on them), and suffer the store's faults as
// allot's agents do (storeFaults).
type localBuckets struct {
	label  string
	si     int
	states [][]bucket.State // [region][budget]
	limits []bucket.Limit   // per rule
	faults *storeFaults
}

func newLocalBuckets(w *world, label string, split bool) *localBuckets {
	s := &localBuckets{label: label, states: make([][]bucket.State, len(w.regions))}
	for r := range s.states {
		s.states[r] = make([]bucket.State, w.nb)
	}
	for _, r := range w.rules {
		l := r.limit
		if split {
			l = share(l, 1, int64(len(w.regions)))
		}
		s.limits = append(s.limits, l)
	}
	s.faults = newStoreFaults(w, 1, 1)
	if split {
		s.faults = newStoreFaults(w, 1, int64(len(w.regions)))
	}
	s.si = w.addSystem(s)
	return s
}

func (s *localBuckets) name() string { return s.label }

func (s *localBuckets) arrive(w *world, t Micros, region, b int, cost int64, idealOK bool) {
	ag := s.faults.pick(region)
	if ag < 0 {
		w.reject(s.si, b, idealOK, pathClosed, 0, true)
		return
	}
	rng := w.sysRng[s.si]
	an, rd := node{kind: kindAgent, region: region, idx: ag}, node{kind: kindRedis, region: region}
	timeout := us(w.sc.Agent.Timeout)
	w.decisions++
	if !s.faults.breaker(region, ag).Allow(w.regions[region].agent.at(t)) {
		s.faults.fallback(w, s.si, t, region, ag, b, cost, idealOK, 0) // decided at once
		return
	}
	at, ok := w.net.send(rng, an, rd, t)
	if !ok || !s.faults.up(region, at) {
		s.faults.failed(w, region, ag, t)
		s.faults.fallback(w, s.si, t, region, ag, b, cost, idealOK, timeout)
		return
	}
	extra, failed := s.faults.call(w, rng, t, region, ag, at-t, w.net.lat[region][region])
	if failed {
		s.faults.fallback(w, s.si, t, region, ag, b, cost, idealOK, timeout)
		return
	}
	at += extra
	st := &s.states[region][b]
	l := s.limits[w.ruleIdx[b]]
	if w.ruleOf(b).spec.Policy == PolicyEmergency {
		if num, den := s.faults.cutShare(w, region, at); num < den {
			l = share(l, num, den)
		}
	}
	w.meters[s.si].redisOps++
	// Decided at the call's start, as allot's slow calls are (simStore.timed):
	// at t+extra the regional bucket's clock would run backwards between
	// agents' calls.
	d, ns, err := bucket.Decide(*st, w.regions[region].redis.at(t), l, bucket.Tokens(cost))
	allowed := err == nil && d.Allowed
	if allowed {
		*st = ns
	}
	back, ok := w.net.send(rng, rd, an, at)
	if !ok {
		// The answer was lost: the store took the tokens, the agent
		// decides by the policy.
		s.faults.failed(w, region, ag, t)
		s.faults.fallback(w, s.si, t, region, ag, b, cost, idealOK, timeout)
		return
	}
	back += extra
	s.faults.answered(w, region, ag, t)
	if !allowed {
		w.reject(s.si, b, idealOK, pathRedis, back-t, false)
		return
	}
	w.admit(s.si, region, b, cost, t, pathRedis, back-t)
}

func (s *localBuckets) handle(*world, *event) {}
func (s *localBuckets) fault(w *world, f *FaultSpec, start bool) {
	s.faults.fault(w, f, start)
}
func (s *localBuckets) finish(*world) map[string]any { return nil }

// central is the exact, slow baseline: one Redis in one region decides every
// request, so requests from other regions cross the WAN both ways. A request
// that cannot reach it, whose answer is lost, or that finds it without a
// primary is decided by the rule's failure policy after the agent's
// timeout, with emergency buckets holding a static split's share
// (storeFaults).
type central struct {
	si     int
	home   int
	states []bucket.State
	faults *storeFaults
}

func newCentral(w *world) *central {
	c := &central{home: w.sc.regionIndex(w.sc.Baselines.Central), states: make([]bucket.State, w.nb)}
	c.faults = newStoreFaults(w, 1, int64(len(w.regions)))
	c.si = w.addSystem(c)
	return c
}

func (c *central) name() string { return "central" }

func (c *central) arrive(w *world, t Micros, region, b int, cost int64, idealOK bool) {
	ag := c.faults.pick(region)
	if ag < 0 {
		w.reject(c.si, b, idealOK, pathClosed, 0, true)
		return
	}
	if !c.faults.breaker(region, ag).Allow(w.regions[region].agent.at(t)) {
		w.decisions++
		c.faults.fallback(w, c.si, t, region, ag, b, cost, idealOK, 0) // decided at once
		return
	}
	rng := w.sysRng[c.si]
	at, ok := w.net.send(rng, node{kind: kindAgent, region: region, idx: ag}, node{kind: kindRedis, region: c.home}, t)
	if !ok || !c.faults.up(c.home, at) {
		c.faults.failed(w, region, ag, t)
		c.faults.fallback(w, c.si, t, region, ag, b, cost, idealOK, us(w.sc.Agent.Timeout))
		return
	}
	extra, failed := c.faults.call(w, rng, t, region, ag, at-t, w.net.lat[c.home][region])
	if failed {
		c.faults.fallback(w, c.si, t, region, ag, b, cost, idealOK, us(w.sc.Agent.Timeout))
		return
	}
	var ok8 int64
	if idealOK {
		ok8 = 1
	}
	w.at(at+extra, c.si, event{j: int32(b), k: cost, aux: int32(region), agt: int32(ag), sent: t, flag: int8(ok8)}) // #nosec G115 -- an index into a slice the simulator holds; 2^31 entries would not fit in memory
}

func (c *central) handle(w *world, e *event) {
	region, b, cost, t0, idealOK, ag := int(e.aux), int(e.j), e.k, e.sent, e.flag == 1, int(e.agt)
	w.decisions++
	w.meters[c.si].redisOps++
	r := w.ruleOf(b)
	l := r.limit
	if r.spec.Policy == PolicyEmergency {
		l = c.peersLimit(w, l, e.at)
	}
	d, ns, err := bucket.Decide(c.states[b], w.regions[c.home].redis.at(e.at), l, bucket.Tokens(cost))
	if err == nil && d.Allowed {
		c.states[b] = ns
	}
	back, ok := w.net.send(w.sysRng[c.si], node{kind: kindRedis, region: c.home}, node{kind: kindAgent, region: region, idx: ag}, e.at)
	if !ok {
		// The answer was lost: the store took the tokens, the agent
		// decides by the policy.
		c.faults.failed(w, region, ag, t0)
		c.faults.fallback(w, c.si, e.at, region, ag, b, cost, idealOK, us(w.sc.Agent.Timeout))
		return
	}
	back += c.faults.delay(w.sysRng[c.si], region, ag) // a slow link's delay, on the way back too
	c.faults.answered(w, region, ag, t0)
	if err != nil || !d.Allowed {
		w.reject(c.si, b, idealOK, pathWAN, back-t0, false)
		return
	}
	w.admit(c.si, region, b, cost, e.at, pathWAN, back-t0)
}

// peersLimit is the central bucket's limit l less the emergency shares of
// the agents whose breaker is not closed (a static split's share of the
// rule ÷ the region's live agents each), which they decide on their own.
func (c *central) peersLimit(w *world, l bucket.Limit, t Micros) bucket.Limit {
	count, burst := int64(l.Count()), int64(l.Burst())
	n := int64(len(w.regions))
	for r := range w.regions {
		num, den := c.faults.cutShare(w, r, t)
		if cut := den - num; cut > 0 {
			count -= (int64(l.Count())*cut + n*den - 1) / (n * den)
			burst -= (int64(l.Burst())*cut + n*den - 1) / (n * den)
		}
	}
	if count <= 0 || burst <= 0 {
		return bucket.Limit{}
	}
	if count == int64(l.Count()) && burst == int64(l.Burst()) {
		return l
	}
	return bucket.Per(bucket.Tokens(count), l.Period()).WithBurst(bucket.Tokens(burst))
}

func (c *central) fault(w *world, f *FaultSpec, start bool) {
	c.faults.fault(w, f, start)
}
func (c *central) finish(*world) map[string]any { return nil }

// async is the asynchronous global counter, after Gubernator's GLOBAL
// behaviour: every region decides locally against its copy of the budget,
// queues the hits, and forwards them to the budget's owner every sync
// interval; the owner applies them to the authoritative bucket and
// broadcasts the result, which overwrites the regions' copies.
type async struct {
	si      int
	owner   int
	local   [][]bucket.State // [region][budget]: the owner's region holds the authority
	pending [][]int64        // [region][budget] hits not yet forwarded
	touched [][]int32        // [region] budgets with pending hits
	msgs    int64
}

type asyncHit struct {
	b    int32
	hits int64
}

type asyncState struct {
	b  int32
	st bucket.State
}

const (
	asyncTick uint8 = iota
	asyncHits
	asyncBroadcast
)

func newAsync(w *world) *async {
	a := &async{owner: w.sc.regionIndex(w.sc.Baselines.AsyncOwner)}
	n := len(w.regions)
	a.local = make([][]bucket.State, n)
	a.pending = make([][]int64, n)
	a.touched = make([][]int32, n)
	for r := 0; r < n; r++ {
		a.local[r] = make([]bucket.State, w.nb)
		a.pending[r] = make([]int64, w.nb)
	}
	a.si = w.addSystem(a)
	w.at(us(w.sc.Baselines.AsyncSync), a.si, event{sub: asyncTick})
	return a
}

func (a *async) name() string { return "async-global" }

func (a *async) arrive(w *world, t Micros, region, b int, cost int64, idealOK bool) {
	r := w.ruleOf(b)
	w.decisions++
	d, ns, err := bucket.Decide(a.local[region][b], w.regions[region].agent.at(t), r.limit, bucket.Tokens(cost))
	if err != nil || !d.Allowed {
		w.reject(a.si, b, idealOK, pathLocal, 0, false)
		return
	}
	a.local[region][b] = ns
	if region != a.owner {
		if a.pending[region][b] == 0 {
			a.touched[region] = append(a.touched[region], int32(b)) // #nosec G115 -- an index into a slice the simulator holds; 2^31 entries would not fit in memory
		}
		a.pending[region][b] += cost
	}
	w.admit(a.si, region, b, cost, t, pathLocal, 0)
}

func (a *async) handle(w *world, e *event) {
	rng := w.sysRng[a.si]
	switch e.sub {
	case asyncTick:
		for r := range a.touched {
			if len(a.touched[r]) == 0 {
				continue
			}
			batch := make([]asyncHit, 0, len(a.touched[r]))
			for _, b := range a.touched[r] {
				batch = append(batch, asyncHit{b: b, hits: a.pending[r][b]})
				a.pending[r][b] = 0
			}
			a.touched[r] = a.touched[r][:0]
			a.msgs++
			if at, ok := w.net.send(rng, node{kind: kindAgent, region: r}, node{kind: kindAgent, region: a.owner}, e.at); ok {
				w.at(at, a.si, event{sub: asyncHits, p: batch})
			}
		}
		w.at(e.at+us(w.sc.Baselines.AsyncSync), a.si, event{sub: asyncTick})
	case asyncHits:
		batch := e.p.([]asyncHit)
		now := w.regions[a.owner].agent.at(e.at)
		out := make([]asyncState, 0, len(batch))
		for _, h := range batch {
			r := w.ruleOf(int(h.b))
			st := a.local[a.owner][h.b]
			n := bucket.Tokens(h.hits)
			// The owner takes the hits it can; hits beyond what the bucket
			// holds were already admitted and are simply lost to the count.
			n = min(n, r.limit.Burst())
			if _, _, ns, err := bucket.TakeUpTo(st, now, r.limit, n); err == nil {
				st = ns
			}
			a.local[a.owner][h.b] = st
			out = append(out, asyncState{b: h.b, st: st})
			w.decisions++
		}
		for r := range w.regions {
			if r == a.owner {
				continue
			}
			a.msgs++
			if at, ok := w.net.send(rng, node{kind: kindAgent, region: a.owner}, node{kind: kindAgent, region: r}, e.at); ok {
				w.at(at, a.si, event{sub: asyncBroadcast, aux: int32(r), p: out})
			}
		}
	case asyncBroadcast:
		r := int(e.aux)
		for _, s := range e.p.([]asyncState) {
			a.local[r][s.b] = s.st
		}
	}
}

func (a *async) fault(*world, *FaultSpec, bool) {}
func (a *async) finish(w *world) map[string]any {
	return map[string]any{"sync_messages": a.msgs}
}
