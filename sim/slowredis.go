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
// Delay longer each way, plus up to Jitter more (uniformly, drawn each
// way), and Loss of the calls fail (an error answer, after the round
// trip). Redis itself stays up and answers the rest. With Loss 0 it is
// the chaos harness's redis_delay, which its proxies inject.
const FaultRedisSlow = "redis_slow"

// slowLink is a redis_slow fault in force on one agent's link to Redis.
type slowLink struct {
	delay  Micros  // added each way
	jitter Micros  // the most added on top of delay, each way
	loss   float64 // fraction of calls that fail
}

// newSlowLink is the link fault f puts on an agent's link.
func newSlowLink(f *FaultSpec) *slowLink {
	return &slowLink{delay: us(f.Delay), jitter: us(f.Jitter), loss: f.Loss}
}

// extra draws the delay the link adds one way (no draw without jitter).
func (s *slowLink) extra(rng *rand.Rand) Micros {
	if s.jitter > 0 {
		return s.delay + Micros(rng.Float64()*float64(s.jitter))
	}
	return s.delay
}

// slowFault starts or ends a redis_slow fault in region r.
func (a *allot) slowFault(r int, f *FaultSpec, start bool) {
	for ai, ag := range a.agents[r] {
		if f.Agent != nil && *f.Agent != ai {
			continue
		}
		ag.store.slow = nil
		if start {
			ag.store.slow = newSlowLink(f)
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
//
// The instant leaves out the delay the slow link adds on the way out, as
// if it were all on the way back: the simulator makes the call when the
// agent does, before the calls other agents make while it would travel,
// and at an instant later than theirs the primary's clock would run
// backwards between calls, which a real primary's never does. A bucket
// whose debt reads beyond its burst at the earlier instant is capped there
// (bucket.Decide, as for a clock stepped back), and the debt the cap drops
// is tokens no real store gives: chaos's redis-slow in the simulator
// (every agent 45–75 ms late each way) overshot by 1,086 tokens, where the
// real processes' excess was 0. The answer still takes the whole round
// trip, so the breaker and the decision's latency see the slow link.
func (s *simStore) timed(rng *rand.Rand, t, out, back Micros) (Micros, bool) {
	a, w := s.a, s.a.w
	b := a.agents[s.region][s.agent].core.Breaker()
	took, _, ok, outgrown := timedCall(b, w.regions[s.region].agent, rng, t, out, back, s.slow)
	a.lat += took
	s.outgrown = outgrown
	if !ok {
		return 0, false
	}
	return t + out, true
}

// timedCall is one store call begun at t under b's deadline, on a link
// whose one-way delays are out and back plus slow's each way (slow nil:
// none): one that outlives the deadline times out (b.TimedOut; outgrown
// when the breaker says it does not count), slow fails its share of the
// others after their round trip, and an answer's latency is observed. It
// returns how long the call took, the delay slow added on the way out,
// and whether it was answered; failures are the caller's to count, as a
// store's caller does.
func timedCall(b *breaker.Breaker, clk nodeClock, rng *rand.Rand, t, out, back Micros, slow *slowLink) (took, extra Micros, ok, outgrown bool) {
	var extraBack Micros
	var loss float64
	if slow != nil {
		extra, extraBack, loss = slow.extra(rng), slow.extra(rng), slow.loss
	}
	rtt := out + back + extra + extraBack
	if d := b.Deadline(); rtt > us(d) {
		return us(d), extra, false, !b.TimedOut(clk.at(t+us(d)), d)
	}
	if loss > 0 && rng.Float64() < loss {
		return rtt, extra, false, false
	}
	b.Observe(clk.at(t+rtt), time.Duration(rtt)*time.Microsecond)
	return rtt, extra, true, false
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
