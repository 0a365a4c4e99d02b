package sim

import (
	"github.com/allot-dev/allot/bucket"
)

// storeFaults is what a baseline that decides in a Redis suffers of the
// scenario's faults, handled as allot's agents handle them: requests go to
// the region's agents in turn (a crashed agent takes none), a request or
// answer lost or cut away, or a store without a primary during a failover,
// is decided by the rule's failure policy. "closed" rejects; "open"
// admits; "emergency" decides in an in-process bucket per agent holding
// the region's share of the rule divided among its live agents, as
// region.emergencyLimit divides a region's allocation.
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
	f.emerg = make([]map[int32]bucket.State, f.regions*f.maxAg)
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

// fault applies the faults a store-backed baseline suffers: agent crashes
// and Redis failovers. Cuts and loss act through the network.
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
		l := share(rule.limit, f.num, f.den)
		live := int64(max(f.live[r], 1))
		c, burst := int64(l.Count())/live, int64(l.Burst())/live
		if c > 0 && burst > 0 && cost <= burst {
			el := bucket.Per(bucket.Tokens(c), l.Period()).WithBurst(bucket.Tokens(burst))
			m := f.emerg[r*f.maxAg+ag]
			if m == nil {
				m = map[int32]bucket.State{}
				f.emerg[r*f.maxAg+ag] = m
			}
			key := int32(b) // #nosec G115 -- a budget index; 2^31 budgets would not fit in memory
			d, ns, err := bucket.Decide(m[key], w.regions[r].agent.at(t), el, bucket.Tokens(cost))
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
