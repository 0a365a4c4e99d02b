package sim

import (
	"math/rand/v2"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/region"
)

// storeFaults is what a baseline that decides in a Redis suffers of the
// scenario's faults, handled as allot's agents handle them: requests go to
// the region's agents in turn (a crashed agent takes none); each agent
// calls the store behind a circuit breaker with the agents' settings
// (setBreaker); a request or answer lost or cut away, a store without a
// primary during a failover, or a call failed or timed out on a slow link
// (redis_slow) counts against the breaker and is decided by the rule's
// failure policy, as is every request while the breaker is open.
// "closed" rejects; "open" admits; "emergency" decides, while the breaker
// is open, in an in-process bucket per agent holding the region's share of
// the rule divided among its live agents, empty at the instant the breaker
// opened, as region's fallback does (a failure while it is closed is
// denied), and the region's other agents take a cut agent's share out of
// the store's bucket (cutShare), as region.Core.SetPeersCut does.
type storeFaults struct {
	regions int
	// share is the region's share of every rule, num/den: a static split
	// holds 1/N of it, the independent baseline all of it.
	num, den int64
	alive    [][]bool                 // [region][agent]
	live     []int                    // [region] live agents
	rr       []int                    // [region] the last agent picked
	down     []Micros                 // [region] no primary answers before
	emerg    []map[int32]bucket.State // [region*maxAgents+agent] budget → emergency bucket
	from     []int64                  // [region*maxAgents+agent] the opening (µs) emerg is empty at
	brk      []*breaker.Breaker       // [region*maxAgents+agent]
	slow     []*slowLink              // [region*maxAgents+agent] a redis_slow fault on the agent's link
	maxAg    int
}

func newStoreFaults(w *world, num, den int64) *storeFaults {
	f := &storeFaults{regions: len(w.regions), num: num, den: den}
	for _, r := range w.regions {
		f.maxAg = max(f.maxAg, r.agents)
	}
	for _, r := range w.regions {
		al := make([]bool, r.agents)
		for i := range al {
			al[i] = true
		}
		f.alive = append(f.alive, al)
		f.live = append(f.live, r.agents)
	}
	f.rr = make([]int, f.regions)
	f.down = make([]Micros, f.regions)
	n := f.regions * f.maxAg
	f.emerg = make([]map[int32]bucket.State, n)
	f.from = make([]int64, n)
	f.slow = make([]*slowLink, n)
	cfg := region.DefaultConfig()
	setBreaker(&cfg, w.sc.Agent)
	for i := 0; i < n; i++ {
		b, err := breaker.New(cfg.BreakerConfig())
		if err != nil {
			panic(err) // the scenario's agent settings were validated
		}
		f.brk = append(f.brk, b)
	}
	return f
}

// pick returns the agent that takes the next request in region r, in
// turn among the live ones, or −1 when none lives.
func (f *storeFaults) pick(r int) int {
	n := len(f.alive[r])
	for i := 0; i < n; i++ {
		f.rr[r] = (f.rr[r] + 1) % n
		if f.alive[r][f.rr[r]] {
			return f.rr[r]
		}
	}
	return -1
}

// up reports whether region r's store has a primary at t.
func (f *storeFaults) up(r int, t Micros) bool { return t >= f.down[r] }

// breaker returns agent ag of region r's breaker.
func (f *storeFaults) breaker(r, ag int) *breaker.Breaker { return f.brk[r*f.maxAg+ag] }

// call is the timed part of agent ag of region r's store call begun at t,
// whose request took out and whose answer takes back, as simStore.timed
// makes allot's (timedCall): while a redis_slow fault is on the agent's
// link, or its breaker's deadline is still raised after one, the call gets
// the deadline, a slow link adds its delay each way and fails its share,
// and the breaker hears of it. It reports the delay added each way and
// whether the call failed. Other calls report only their end (answered).
func (f *storeFaults) call(w *world, rng *rand.Rand, t Micros, r, ag int, out, back Micros) (extra Micros, failed bool) {
	s, b := f.slow[r*f.maxAg+ag], f.breaker(r, ag)
	if s == nil && b.Deadline() <= b.Config().Timeout {
		return 0, false
	}
	clk := w.regions[r].agent
	_, extra, ok, outgrown := timedCall(b, clk, rng, t, out, back, s)
	switch {
	case outgrown:
		b.Cancel() // a deadline since raised: not counted (breaker.ErrOutgrown)
	case !ok:
		b.Failure(clk.at(t))
	}
	return extra, !ok
}

// delay is the delay a redis_slow fault adds to agent ag of region r's
// answer on the way back (0 when none is on its link), drawn afresh: call
// judged the call against its deadline with draws of its own.
func (f *storeFaults) delay(rng *rand.Rand, r, ag int) Micros {
	if s := f.slow[r*f.maxAg+ag]; s != nil {
		return s.extra(rng)
	}
	return 0
}

// failed counts a call of agent ag of region r begun at t that got no
// answer (cut, lost, no primary) against its breaker.
func (f *storeFaults) failed(w *world, r, ag int, t Micros) {
	f.breaker(r, ag).Failure(w.regions[r].agent.at(t))
}

// answered tells agent ag of region r's breaker that its call begun at t
// was answered.
func (f *storeFaults) answered(w *world, r, ag int, t Micros) {
	f.breaker(r, ag).Success(w.regions[r].agent.at(t))
}

// cutShare is the fraction num/den of its share a region's store bucket
// holds for the agents whose breaker is closed, for a rule with the
// emergency policy: each agent whose breaker is not closed decides its
// part (1/live) in its emergency bucket, so the others take it out.
func (f *storeFaults) cutShare(w *world, r int, t Micros) (num, den int64) {
	live := int64(max(f.live[r], 1))
	now := w.regions[r].agent.at(t)
	cut := int64(0)
	for ag, ok := range f.alive[r] {
		if ok && f.breaker(r, ag).State(now) != breaker.Closed {
			cut++
		}
	}
	return live - min(cut, live), live
}

// fault applies the faults a store-backed baseline suffers: agent crashes,
// Redis failovers and slow links. Cuts and loss act through the network.
func (f *storeFaults) fault(w *world, fs *FaultSpec, start bool) {
	r := w.sc.regionIndex(fs.Region)
	switch fs.Kind {
	case FaultAgentCrash:
		ai := 0
		if fs.Agent != nil {
			ai = *fs.Agent
		}
		if ai >= len(f.alive[r]) || f.alive[r][ai] == !start {
			return
		}
		f.alive[r][ai] = !start
		if start {
			f.live[r]--
		} else {
			f.live[r]++
		}
	case FaultRedisFailover:
		if start {
			f.down[r] = max(f.down[r], us(fs.At+w.sc.Redis.Failover))
		}
	case FaultRedisSlow:
		for ai := range f.alive[r] {
			if fs.Agent != nil && *fs.Agent != ai {
				continue
			}
			f.slow[r*f.maxAg+ai] = nil
			if start {
				f.slow[r*f.maxAg+ai] = newSlowLink(fs)
			}
		}
	}
}

// fallback decides, by the rule's failure policy, a request for budget b
// that agent ag of region r could not decide in the store, after lat.
func (f *storeFaults) fallback(w *world, si int, t Micros, r, ag, b int, cost int64, idealOK bool, lat Micros) {
	rule := w.ruleOf(b)
	switch rule.spec.Policy {
	case PolicyOpen:
		w.admit(si, r, b, cost, t, pathEmergency, lat)
		return
	case PolicyEmergency:
		el := region.EmergencyLimit(share(rule.limit, f.num, f.den), &region.RuleConfig{}, f.live[r])
		since, open := f.breaker(r, ag).OpenSince()
		if open && !el.IsZero() && cost <= int64(el.Burst()) {
			i := r*f.maxAg + ag
			m := f.emerg[i]
			if m == nil || f.from[i] != since.UnixMicro() {
				// A new outage: every bucket empty at its start.
				m = map[int32]bucket.State{}
				f.emerg[i], f.from[i] = m, since.UnixMicro()
			}
			key := int32(b) // #nosec G115 -- a budget index; 2^31 budgets would not fit in memory
			st, seen := m[key]
			if !seen {
				st = bucket.Empty(since, el)
			}
			d, ns, err := bucket.Decide(st, w.regions[r].agent.at(t), el, bucket.Tokens(cost))
			if err == nil && d.Allowed {
				m[key] = ns
				w.admit(si, r, b, cost, t, pathEmergency, lat)
				return
			}
		}
		w.reject(si, b, idealOK, pathEmergency, lat, false)
		return
	}
	w.reject(si, b, idealOK, pathClosed, lat, true)
}

// unmodeler is a system that suffers some of a scenario's faults only in
// part; the report names them.
type unmodeler interface {
	unmodeled(w *world) []string
}

// hasFault reports whether the scenario has a fault of kind.
func (w *world) hasFault(kind string) bool {
	for _, f := range w.sc.Faults {
		if f.Kind == kind {
			return true
		}
	}
	return false
}

func (s *localBuckets) unmodeled(w *world) []string { return failoverUnmodeled(w) }
func (c *central) unmodeled(w *world) []string      { return failoverUnmodeled(w) }

func failoverUnmodeled(w *world) []string {
	if w.hasFault(FaultRedisFailover) {
		return []string{FaultRedisFailover + ": the store is down for the failover, but writes its old primary had not replicated are kept, not lost"}
	}
	return nil
}

func (a *async) unmodeled(w *world) []string {
	if w.hasFault(FaultAgentCrash) {
		return []string{FaultAgentCrash + ": a crashed agent's copy of the budgets and its unsent hits survive the crash"}
	}
	return nil
}
