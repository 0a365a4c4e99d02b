package chaos

import (
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/sim"
)

// The agent binary's settings that have no flag, as cmd/agent leaves them
// (region.DefaultConfig and region.DefaultAgentConfig; a test keeps these
// equal to them).
const (
	agentBatchTTL     = 100 * time.Millisecond // token batches older than this are given back
	agentTick         = 100 * time.Millisecond // the agent's periodic work, batch returns included
	agentFailoverPoll = 500 * time.Millisecond // how often an agent looks for a Redis failover
)

// Term is one fault's term of the overshoot bound, from the design's fault
// table (docs/design.md, "Faults and their bounds"), computed from the
// configuration and the fault alone.
type Term struct {
	// Tokens is the term; +Inf for an unbounded fault (fail open).
	Tokens float64 `json:"tokens"`
	// Formula says how it was computed.
	Formula string `json:"formula"`
}

// Unbounded reports whether the term has no bound.
func (t Term) Unbounded() bool { return math.IsInf(t.Tokens, 1) }

// batchTerm is the allowance every window gets for token batches: tokens
// debited from the regional bucket before use but spent later, at most
// R × (batch TTL + tick) and at most every agent's largest batch
// (batch_max_fraction × the region's burst, itself at most B).
func batchTerm(s *sim.Scenario, rule sim.RuleSpec) Term {
	rate, burst := ruleRate(rule)
	agents := 0
	for _, r := range s.Regions {
		agents += r.Agents
	}
	byRate := rate * (agentBatchTTL + agentTick).Seconds()
	byBatch := float64(agents) * math.Floor(s.Agent.BatchMaxFraction*burst)
	return Term{Tokens: math.Min(byRate, byBatch),
		Formula: fmt.Sprintf("batches: min(R×(batch TTL+tick) = %.0f, Σagents×largest batch = %d×%.0f)",
			byRate, agents, math.Floor(s.Agent.BatchMaxFraction*burst))}
}

// faultTerm is fault f's term for rule, given the region's allocation of
// the rule's hottest key when the fault began (count per second and burst)
// and the fault's actual outage (from its start until the store answered
// again).
func faultTerm(s *sim.Scenario, f Fault, rule sim.RuleSpec, alloc, allocBurst float64, outage time.Duration) Term {
	redisFault := f.Kind == sim.FaultRedisCut || f.Kind == FaultRedisKill || f.Kind == sim.FaultRedisFailover
	if !redisFault {
		return Term{Formula: "0: " + zeroWhy[f.Kind]}
	}
	var t Term
	switch rule.Policy {
	case sim.PolicyClosed:
		t = Term{Formula: "0: fail closed"}
	case sim.PolicyOpen:
		return Term{Tokens: math.Inf(1), Formula: "unbounded: fail open"}
	case sim.PolicyEmergency:
		// The design's term (sim.EmergencyTail): after the store answers
		// again the agents decide by the policy until their breakers'
		// next probe, a call in flight at most its longest deadline.
		deadline, backoff := sim.EmergencyTail(s.Agent, outage)
		d := outage + deadline + backoff
		t = Term{Tokens: allocBurst + alloc*d.Seconds(),
			Formula: fmt.Sprintf("emergency: region burst %.0f + allocation %.0f/s × (outage %.1fs + longest deadline %s + breaker back-off %s)",
				allocBurst, alloc, outage.Seconds(), deadline, backoff)}
	}
	// A Redis that comes back without its writes (a restart, or a replica
	// promoted) also gives back what it lost.
	if f.Kind == FaultRedisKill || f.Kind == sim.FaultRedisFailover {
		if s.Redis.OnFailover == "empty" {
			x := alloc * agentFailoverPoll.Seconds()
			t.Tokens += x
			t.Formula += fmt.Sprintf(" + failover empty: debited before detection ≤ poll %s × %.0f/s = %.0f", agentFailoverPoll, alloc, x)
		} else {
			t.Tokens += allocBurst
			t.Formula += fmt.Sprintf(" + failover keep: lost writes ≤ one region burst %.0f", allocBurst)
		}
	}
	return t
}

var zeroWhy = map[string]string{
	sim.FaultCoordinatorCut: "region cut from the coordinator",
	sim.FaultRegionCut:      "region cut from the coordinator",
	sim.FaultLeaderFailover: "coordinator leader fails",
	sim.FaultAgentCrash:     "an agent crashes",
	FaultCoordinatorKill:    "coordinator leader fails",
	FaultSpeakerKill:        "speaker dies",
	FaultCoordinatorDelay:   "lease messages delayed",
	FaultCoordinatorOneway:  "lease messages lost one way",
	FaultRedisDelay:         "a slow but healthy Redis is no outage",
	sim.FaultRedisSlow:      "a slow but healthy Redis is no outage",
	FaultGossipSplit:        "a partition inside a region",
	sim.FaultRedisCut:       "",
	sim.FaultRedisFailover:  "",
	FaultRedisKill:          "",
	sim.FaultLoss:           "",
	"":                      "",
}
