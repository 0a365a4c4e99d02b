package sim

import (
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// The bound a run of allot is judged against is the sum, per rule, of one
// term per fault on the timeline and of the allowances the code needs
// (token batches, a Redis clock that runs fast), each from the design's
// fault table (docs/design.md, "The simulator", "Bounds"). A term counts
// only the regions and links its fault touches and is computed from
// configured quantities alone: the scenario's limits, timings and agent
// settings, and the allocation each touched region held when the fault
// began. Nothing in it is a maximum of the run being judged, so a bug
// cannot raise its own bound. A new fault kind adds a case to faultTerm.

// term is one fault's (or allowance's) part of a rule's bound.
type term struct {
	tokens    float64
	unbounded bool
	formula   string
}

func (t term) String() string {
	if t.unbounded {
		return "unbounded: " + t.formula
	}
	return fmt.Sprintf("%.3f: %s", t.tokens, t.formula)
}

func zero(why string) term { return term{formula: why} }

// ruleBound is a rule's bound: its terms, and whether the run is beyond
// the design's assumptions altogether.
type ruleBound struct {
	terms  []term
	beyond *BeyondInfo
}

func (b ruleBound) total() (tokens float64, unbounded bool) {
	for _, t := range b.terms {
		tokens += t.tokens
		unbounded = unbounded || t.unbounded
	}
	return tokens, unbounded
}

// BeyondInfo says why a run lies outside the design's assumptions, where the
// bound does not apply: a relative clock drift between the leading
// coordinator and a region beyond the margin the lease protocol is
// configured for.
type BeyondInfo struct {
	Reason string `json:"reason"`
	// RelativeDrift is the largest relative drift of a leader's clock and
	// a region's (lease.RelativeDrift); Margin what the protocol covers
	// (lease.Config.MaxRelativeDrift).
	RelativeDrift float64 `json:"relative_drift"`
	Margin        float64 `json:"margin"`
	// EstimateTokens is the design's estimate of what the excess drift is
	// worth: (ρ − margin) × TTL × R when a region's clock runs slow
	// against the leader's (its leases outlive the leader's count), (ρ −
	// margin) × Hold × R when it runs fast (its lent floors return early).
	EstimateTokens float64 `json:"estimate_tokens"`
	// ExcessTokens is what the run measured above the bound without the
	// drift (0 when it stayed within it).
	ExcessTokens float64 `json:"excess_tokens"`
}

// faultStart is what the bound keeps of a fault when it began.
type faultStart struct {
	// alloc is, per region and rule, the largest allocation (rate and
	// burst, separately) of any key of the rule that the region's live
	// agents decided with: their tables' entries, and the floor.
	alloc [][]allocation
}

// allocation is a region's allocation of a key: tokens a second, burst.
type allocation struct {
	rate  float64
	burst bucket.Tokens
}

// snapshot records the allocations every region holds at t.
func (a *allot) snapshot(w *world, t Micros) faultStart {
	fs := faultStart{alloc: make([][]allocation, len(w.regions))}
	for r := range w.regions {
		now := w.regions[r].agent.at(t)
		fs.alloc[r] = make([]allocation, len(w.rules))
		for ri, ru := range w.rules {
			rate, burst := a.plane.floors[r][ri].Rate(), a.plane.floors[r][ri].Burst()
			for _, ag := range a.agents[r] {
				tb := ag.view.Table()
				if !ag.alive || tb == nil {
					continue
				}
				for _, e := range tb.Entries {
					if e.Key.Rule != ru.spec.Name {
						continue
					}
					l, _, _ := ag.view.Allocation(now, e.Key, ru.limit)
					rate, burst = math.Max(rate, l.Rate()), max(burst, l.Burst())
				}
			}
			fs.alloc[r][ri] = allocation{rate: rate, burst: burst}
		}
	}
	return fs
}

// bound is rule ri's bound under the scenario's faults.
func (a *allot) bound(w *world, ri int) ruleBound {
	var b ruleBound
	for i := range w.sc.Faults {
		b.terms = append(b.terms, a.faultTerm(w, i, ri))
	}
	if w.sc.Loss > 0 {
		b.terms = append(b.terms, a.lossTerm(w, ri, nil, w.sc.Duration, LinksAll, "loss on every link for the whole run"))
	}
	for _, reg := range w.sc.Regions {
		if reg.RedisDrift > 0 {
			R := w.rules[ri].limit.Rate()
			b.terms = append(b.terms, term{tokens: reg.RedisDrift * R * w.sc.Duration.Seconds(),
				formula: fmt.Sprintf("redis clock in %s runs fast by %g × R %.3f/s × duration %s", reg.Name, reg.RedisDrift, R, w.sc.Duration)})
		}
	}
	b.terms = append(b.terms, a.batchTerm(w, ri))
	t, beyond := a.driftTerm(w, ri)
	b.terms = append(b.terms, t)
	b.beyond = beyond
	return b
}

// batchTerm is the allowance token batches need: they are debited from
// the regional bucket before use (I3) but spent a little later, so in a
// window the spends can exceed the debits by what agents held at its
// start: at most R × the longest hold (the batch TTL, checked at each core
// tick), and at most every agent's largest batch (batch_max_fraction × the
// largest burst a region can be allocated, the budget's).
func (a *allot) batchTerm(w *world, ri int) term {
	rule := &w.rules[ri]
	R := rule.limit.Rate()
	hold := w.sc.Agent.BatchTTL + coreTick*time.Microsecond
	batch := math.Max(1, math.Floor(float64(rule.spec.Burst)*w.sc.Agent.BatchMaxFraction))
	agents := 0
	for _, rg := range w.regions {
		agents += rg.agents
	}
	most := float64(agents) * batch
	return term{tokens: math.Min(R*hold.Seconds(), most),
		formula: fmt.Sprintf("batches spent after their debit: min(R %.3f/s × hold %s, Σ agents %d × largest batch %.0f)", R, hold, agents, batch)}
}

// faultTerm is fault i's term for rule ri.
func (a *allot) faultTerm(w *world, i, ri int) term {
	f := &w.sc.Faults[i]
	switch f.Kind {
	case FaultCoordinatorCut, FaultRegionCut, FaultCoordinatorOneway, FaultCoordinatorFlap:
		return zero(fmt.Sprintf("%s of %s: escrow (I1), leases measured from their send", f.Kind, f.Region))
	case FaultLeaderFailover:
		return zero("leader failover: the new leader learns before it grants an increase")
	case FaultAgentCrash:
		return zero("agent crash in " + f.Region + ": a crash loses batch tokens, which only under-admits")
	case FaultDuplicate, FaultReorder:
		return zero(f.Kind + " lease messages: stale grants and acks are ignored by version and term")
	case FaultCoordinatorDelay:
		return zero("lease messages delayed: escrow (I1), leases measured from their send")
	case FaultLoss:
		return a.lossTerm(w, ri, &a.starts[i], f.For, f.Links, fmt.Sprintf("loss %g on %s links at %s for %s", f.Loss, f.Links, f.At, f.For))
	case FaultRedisCut:
		r := w.sc.regionIndex(f.Region)
		cut := w.regions[r].agents
		who := "every agent"
		if f.Agent != nil {
			cut, who = 1, fmt.Sprintf("agent %d", *f.Agent)
		}
		return a.outageTerm(w, ri, i, r, cut, f.For, fmt.Sprintf("redis cut in %s (%s) for %s", f.Region, who, f.For))
	case FaultRedisSlow:
		return a.slowTerm(w, ri, i)
	case FaultRedisFailover:
		r := w.sc.regionIndex(f.Region)
		t := a.outageTerm(w, ri, i, r, w.regions[r].agents, w.sc.Redis.Failover,
			fmt.Sprintf("redis failover in %s, no primary for %s", f.Region, w.sc.Redis.Failover))
		if t.unbounded {
			return t
		}
		if w.sc.Redis.OnFailover != "keep" {
			t.formula += "; buckets started empty after it"
			return t
		}
		// The replica lacks the writes of the last lag: what the region
		// debited then, at most its allocation's burst and rate × lag.
		l := a.starts[i].alloc[r][ri]
		lost := float64(l.burst) + l.rate*w.sc.Redis.Lag.Seconds()
		t.tokens += lost
		t.formula += fmt.Sprintf("; + writes lost in the last lag: burst %d + allocation %.3f/s × lag %s", l.burst, l.rate, w.sc.Redis.Lag)
		reg := w.sc.Regions[r]
		if d := reg.ReplicaSkew - reg.RedisSkew; d > 0 {
			t.tokens += d.Seconds() * l.rate
			t.formula += fmt.Sprintf("; + replica clock ahead of the primary by %s × allocation", d)
		}
		return t
	}
	return zero("no term for " + f.Kind)
}

// outageTerm is the term of cut of region r's agents losing the regional
// Redis for outage (fault i): 0 when the rule fails closed, unbounded when
// it fails open, and under the emergency policy what the cut agents'
// emergency buckets can admit beyond the regional bucket: each holds the
// allocation ÷ live agents, started full, refilling for the outage and
// its tail (EmergencyTail).
func (a *allot) outageTerm(w *world, ri, i, r, cut int, outage time.Duration, what string) term {
	switch w.rules[ri].spec.Policy {
	case PolicyClosed:
		return zero(what + ": fails closed")
	case PolicyOpen:
		return term{unbounded: true, formula: what + ": fails open"}
	}
	l := a.starts[i].alloc[r][ri]
	live := a.minLive(w, r, w.sc.Faults[i].At, outage)
	share := math.Min(1, float64(cut)/float64(max(live, 1)))
	deadline, tail := EmergencyTail(w.sc.Agent, outage)
	d := outage + deadline + tail
	return term{tokens: share * (float64(l.burst) + l.rate*d.Seconds()),
		formula: fmt.Sprintf("%s, emergency: %d of %d live agents × (burst %d + allocation %.3f/s at the fault's start × (outage %s + longest deadline %s + breaker back-off %s))",
			what, cut, live, l.burst, l.rate, outage, deadline, tail)}
}

// EmergencyTail bounds how long after a store outage (or a loss window)
// of length d ends an agent running ag's settings still decides by the
// rule's policy: the call in flight at its end waits out its deadline, at
// most the agent's longest (region.Config.MaxTimeout), and the circuit
// breaker probes next at most the back-off its failed probes within d
// reached (breakerTail, up to BreakerMaxBackoff) after the last began.
// These are what the simulator's agents run (setBreaker) and what
// cmd/agent's flags set; the chaos harness's emergency term reads them
// too.
func EmergencyTail(ag AgentSpec, d time.Duration) (deadline, backoff time.Duration) {
	c := region.DefaultConfig()
	setBreaker(&c, ag)
	return c.MaxTimeout, breakerTail(d, c.BreakerBackoff, c.BreakerMaxBackoff)
}

// lossTerm is a loss fault's term: lease messages lost only delay acks and
// renewals (0); agents' calls to Redis lost fall to the rule's policy, in
// every region, as an outage of the loss's length. fs is the fault's start
// (nil for loss over the whole run, where the allocation is bounded by the
// budget alone).
func (a *allot) lossTerm(w *world, ri int, fs *faultStart, d time.Duration, links, what string) term {
	if links == LinksWAN {
		return zero(what + ": lease messages lost delay acknowledgements and renewals only")
	}
	switch w.rules[ri].spec.Policy {
	case PolicyClosed:
		return zero(what + ": failed store calls fail closed")
	case PolicyOpen:
		return term{unbounded: true, formula: what + ": failed store calls fail open"}
	}
	deadline, tail := EmergencyTail(w.sc.Agent, d)
	win := d + deadline + tail
	var tokens, rate float64
	var burst bucket.Tokens
	if fs == nil {
		// Allocations sum within the budget at every instant (I1).
		rate, burst = w.rules[ri].limit.Rate(), w.rules[ri].limit.Burst()
		tokens = float64(burst) + rate*win.Seconds()
	} else {
		for r := range w.regions {
			l := fs.alloc[r][ri]
			rate += l.rate
			burst += l.burst
			tokens += float64(l.burst) + l.rate*win.Seconds()
		}
	}
	return term{tokens: tokens, formula: fmt.Sprintf("%s, emergency in every region: Σ (burst + allocation at the fault's start) = %d + %.3f/s × (%s + longest deadline %s + breaker back-off %s)",
		what, burst, rate, d, deadline, tail)}
}

// breakerTail bounds how long an agent's circuit breaker stays open after
// an outage of length outage ends: it opens at the earliest at the
// outage's start, probes after backoff, and after every failed probe waits
// twice as long (up to maxBackoff); the outage ends before the next probe,
// which is at most the back-off in force after the failed probes that fit
// in the outage.
func breakerTail(outage, backoff, maxBackoff time.Duration) time.Duration {
	cur, t := backoff, backoff
	for t < outage {
		cur = min(2*cur, maxBackoff)
		t += cur
	}
	return cur
}

// minLive is the fewest live agents region r can have while [at,
// at+d] lasts: its agents, less every agent_crash of the region that
// overlaps the window.
func (a *allot) minLive(w *world, r int, at, d time.Duration) int {
	live := w.regions[r].agents
	for _, f := range w.sc.Faults {
		if f.Kind == FaultAgentCrash && w.sc.regionIndex(f.Region) == r && f.At < at+d && at < f.At+f.For {
			live--
		}
	}
	return max(live, 1)
}

// driftTerm judges the clocks: the lease protocol covers a relative drift
// between the leading coordinator's clock and each region's up to its
// margin (lease.Config.MaxRelativeDrift); within it the term is 0, beyond
// it the run is outside the design's assumptions.
func (a *allot) driftTerm(w *world, ri int) (term, *BeyondInfo) {
	cfg := a.plane.cfg
	margin := cfg.MaxRelativeDrift()
	rho, est, pair := -1.0, 0.0, ""
	R := w.rules[ri].limit.Rate()
	for _, c := range leaders(w.sc) {
		lc := w.sc.Regions[c]
		for _, reg := range w.sc.Regions {
			x := lease.RelativeDrift(lc.Drift, reg.Drift)
			if x <= rho {
				continue
			}
			rho = x
			pair = fmt.Sprintf("leader's clock in %s (drift %g) and %s's (drift %g)", lc.Name, lc.Drift, reg.Name, reg.Drift)
			// A holder slow against the leader outlives its leases; a
			// holder fast returns its lends early.
			over := cfg.TTL
			if reg.Drift > lc.Drift {
				over = cfg.Hold
			}
			est = math.Max(0, x-margin) * over.Seconds() * R
		}
	}
	if rho == 0 {
		return zero("no clock drifts against another"), nil
	}
	if rho <= margin {
		return zero(fmt.Sprintf("relative clock drift %.6f within the margin %.6f (%s)", rho, margin, pair)), nil
	}
	return zero(fmt.Sprintf("relative clock drift %.6f beyond the margin %.6f (%s)", rho, margin, pair)),
		&BeyondInfo{Reason: fmt.Sprintf("relative clock drift %.6f of the %s exceeds the margin %.6f: outside the design's assumptions", rho, pair, margin),
			RelativeDrift: round(rho, 9), Margin: round(margin, 9), EstimateTokens: round(est, 3)}
}

// leaders lists the regions whose coordinator leads during the run: the
// first, and the next one after each leader failover.
func leaders(sc *Scenario) []int {
	n := 1
	for _, f := range sc.Faults {
		if f.Kind == FaultLeaderFailover {
			n++
		}
	}
	var out []int
	seen := map[int]bool{}
	for i := range n {
		c := sc.regionIndex(sc.Coordinator.Regions[i%len(sc.Coordinator.Regions)])
		if !seen[c] {
			seen[c] = true
			out = append(out, c)
		}
	}
	return out
}
