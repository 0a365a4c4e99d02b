package region

import (
	"cmp"
	"slices"
	"sync/atomic"

	"github.com/allot-dev/allot/rules"
)

// coreStats are the Core's counters, atomics the hot path moves without a
// lock; Stats reads them.
type coreStats struct {
	storeOps, storeErrors, refills, returns, returned, drains, drained, failovers, keys, probes atomic.Int64
}

// Stats counts what a Core has done.
type Stats struct {
	// StoreOps is every call to the store; StoreErrors those that failed.
	StoreOps, StoreErrors int64
	// Refills is batches taken; Returns and Returned the give-backs and the
	// tokens they returned.
	Refills, Returns, Returned int64
	// Drains and Drained are buckets emptied after failovers and the tokens
	// taken; Failovers the failovers recorded.
	Drains, Drained, Failovers int64
	// BreakerOpened is how many times the breaker opened; Probes the
	// pings (or peeks) Tick sent while it was not closed.
	BreakerOpened, Probes int64
	// Keys is the keys with local state.
	Keys int64
	// Rules holds per-rule counts by path, sorted by rule.
	Rules []RuleStats
}

// RuleStats counts one rule's decisions by path.
type RuleStats struct {
	Rule     string
	Policy   rules.FailurePolicy
	Admitted [numPaths]int64
	Denied   [numPaths]int64
}

// Stats returns the counters. Decisions from batches reach the per-rule
// counts at each key's next sample (Tick samples every key).
func (c *Core) Stats() Stats {
	s := &c.stats
	st := Stats{
		StoreOps: s.storeOps.Load(), StoreErrors: s.storeErrors.Load(), Refills: s.refills.Load(),
		Returns: s.returns.Load(), Returned: s.returned.Load(), Drains: s.drains.Load(), Drained: s.drained.Load(),
		Failovers: s.failovers.Load(), BreakerOpened: c.breaker.Opened(), Probes: s.probes.Load(), Keys: s.keys.Load(),
	}
	for name, rs := range *c.rules.Load() {
		r := RuleStats{Rule: name, Policy: rs.cfg.OnUnavailable}
		for i := range rs.admitted {
			r.Admitted[i] = rs.admitted[i].Load()
			r.Denied[i] = rs.denied[i].Load()
		}
		st.Rules = append(st.Rules, r)
	}
	slices.SortFunc(st.Rules, func(a, b RuleStats) int { return cmp.Compare(a.Rule, b.Rule) })
	return st
}

// Total sums a RuleStats over paths.
func (r RuleStats) Total() (admitted, denied int64) {
	for i := range r.Admitted {
		admitted += r.Admitted[i]
		denied += r.Denied[i]
	}
	return admitted, denied
}
