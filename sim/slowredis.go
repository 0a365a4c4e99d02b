package sim

import (
	"fmt"
	"math"
	"math/rand/v2"
	"time"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/region"
)

// FaultRedisSlow: the regional Redis is slow and partly failing for one
// agent (Agent) or for every agent of the region: each store call takes
// Delay longer each way, and Loss of the calls fail (an error answer,
// after the round trip). Redis itself stays up and answers the rest.
const FaultRedisSlow = "redis_slow"

// slowLink is a redis_slow fault in force on one agent's link to Redis.
type slowLink struct {
	delay Micros  // added each way
	loss  float64 // fraction of calls that fail
}

// slowFault starts or ends a redis_slow fault in region r.
func (a *allot) slowFault(r int, f *FaultSpec, start bool) {
	for ai, ag := range a.agents[r] {
		if f.Agent != nil && *f.Agent != ai {
			continue
		}
		ag.store.slow = nil
		if start {
			ag.store.slow = &slowLink{delay: us(f.Delay), loss: f.Loss}
		}
	}
}

// timed is one store call that reaches the primary, made as the agent's
// driver makes it (breaker.Timed): the call gets the core's breaker's
// deadline, an answer's latency is observed, a call that outlives its
// deadline is reported as timed out (and, when the breaker says it does
// not count, fails as breaker.ErrOutgrown). It runs while a redis_slow
// fault is on the link, and after it until the deadline is back at its
// floor. t is the call's start, out and back the link's one-way delays. It
// returns the call's instant at the primary, or false when it failed.
func (s *simStore) timed(rng *rand.Rand, t, out, back Micros) (Micros, bool) {
	a, w := s.a, s.a.w
	b := a.agents[s.region][s.agent].core.Breaker()
	took, ok, outgrown := timedCall(b, w.regions[s.region].agent, rng, t, out, back, s.slow)
	a.lat += took
	s.outgrown = outgrown
	if !ok {
		return 0, false
	}
	var extra Micros
	if s.slow != nil {
		extra = s.slow.delay
	}
	return t + out + extra, true
}

// timedCall is one store call begun at t under b's deadline, on a link
// whose one-way delays are out and back plus slow's delay (slow nil: none):
// one that outlives the deadline times out (b.TimedOut; outgrown when the
// breaker says it does not count), slow fails its share of the others
// after their round trip, and an answer's latency is observed. It returns
// how long the call took and whether it was answered; failures are the
// caller's to count, as a store's caller does.
func timedCall(b *breaker.Breaker, clk nodeClock, rng *rand.Rand, t, out, back Micros, slow *slowLink) (took Micros, ok, outgrown bool) {
	var extra Micros
	var loss float64
	if slow != nil {
		extra, loss = slow.delay, slow.loss
	}
	rtt := out + back + 2*extra
	if d := b.Deadline(); rtt > us(d) {
		return us(d), false, !b.TimedOut(clk.at(t+us(d)), d)
	}
	if loss > 0 && rng.Float64() < loss {
		return rtt, false, false
	}
	b.Observe(clk.at(t+rtt), time.Duration(rtt)*time.Microsecond)
	return rtt, true, false
}

// deadlineRaised reports whether agent ai of region r's breaker gives calls
// more than its floor: its store calls are then timed (see timed).
func (a *allot) deadlineRaised(r, ai int) bool {
	b := a.agents[r][ai].core.Breaker()
	return b.Deadline() > b.Config().Timeout
}

// announce is what an agent's driver does at each tick with memberlist:
// it says whether its breaker is closed, and tells its core how many of
// the region's other live agents say theirs is not (region.Core's
// SetPeersCut), whose emergency share the core then takes out of the
// regional bucket. A peer's word is read as it was at that peer's last
// tick: within a tick of the change, about what gossip takes.
func (a *allot) announce(r, ai int, now time.Time) {
	ag := a.agents[r][ai]
	ag.cut = ag.core.Breaker().State(now) != region.BreakerClosed
	n := 0
	for j, p := range a.agents[r] {
		if j != ai && p.alive && p.cut {
			n++
		}
	}
	ag.core.SetPeersCut(n)
}

// slowTerm is a redis_slow fault's term (fault i) for rule ri: 0 when the
// rule fails closed, unbounded when it fails open, and under the
// emergency policy what the affected agents' emergency buckets can admit
// beyond what their peers leave them: each affected agent's share (the
// allocation at the fault's start ÷ live agents), from a bucket empty at
// each opening of its breaker, for the fault and one longest deadline.
func (a *allot) slowTerm(w *world, ri, i int) term {
	f := &w.sc.Faults[i]
	r := w.sc.regionIndex(f.Region)
	n, who := w.regions[r].agents, "every agent"
	if f.Agent != nil {
		n, who = 1, fmt.Sprintf("agent %d", *f.Agent)
	}
	what := fmt.Sprintf("redis slow (+%s each way, %g failing) in %s (%s) for %s", f.Delay, f.Loss, f.Region, who, f.For)
	switch w.rules[ri].spec.Policy {
	case PolicyClosed:
		return zero(what + ": fails closed")
	case PolicyOpen:
		return term{unbounded: true, formula: what + ": fails open"}
	}
	l := a.starts[i].alloc[r][ri]
	live := a.minLive(w, r, f.At, f.For)
	share := math.Min(1, float64(n)/float64(max(live, 1)))
	d := f.For + a.cfg[r].MaxTimeout
	return term{tokens: share * l.rate * d.Seconds(),
		formula: fmt.Sprintf("%s, emergency: %d of %d live agents × allocation %.3f/s at the fault's start × (fault %s + max timeout %s), buckets empty at each opening",
			what, n, live, l.rate, f.For, a.cfg[r].MaxTimeout)}
}
