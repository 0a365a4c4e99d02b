package region

import (
	"slices"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// Budgets lists the budgets of a rules set that the lease protocol splits
// across regions: the set's global budgets (rules.Set.Budgets, the one
// enumeration), each named by its Name and split by split. Rules of region
// or local scope are never leased. The coordinator builds its budgets with
// the same function, so both sides name and size them alike.
func Budgets(set *rules.Set, split lease.Split, policy lease.AllocationPolicy) []lease.Budget {
	var out []lease.Budget
	for _, b := range set.Budgets() {
		if !b.Global() {
			continue
		}
		out = append(out, lease.Budget{Rule: b.Name, Limit: b.Limit, Regions: append([]string(nil), split.Regions...),
			Weights: append([]int64(nil), split.Weights...), Reserve: split.Reserve, Policy: policy})
	}
	return out
}

// Namer maps the key the edge charges (rule name, subject) and the limit it
// charges it under to the key of the budget it belongs to: a plan rule's
// bucket is charged under its plan's budget, which the limit identifies. It
// is immutable and safe for concurrent use.
type Namer struct {
	// byRule lists, per rule, the limits of its plans' budgets with their
	// names: a rule has a few plans, and a scan comparing limits costs less
	// than hashing a limit.
	byRule map[string][]namedLimit
	// few is byRule as a list when it has at most maxScannedRules rules:
	// the edge names a rule by the rules set's own string, so comparing a
	// few names (lengths first, then pointers) costs less than hashing one.
	few []ruleLimits
}

type ruleLimits struct {
	rule   string
	limits []namedLimit
}

// maxScannedRules is the most plan rules Budget finds by comparing names
// in turn rather than by the map.
const maxScannedRules = 8

type namedLimit struct {
	limit bucket.Limit
	name  string
}

// NewNamer returns the Namer of a rules set; nil set means keys map to
// themselves.
func NewNamer(set *rules.Set) *Namer {
	n := &Namer{byRule: map[string][]namedLimit{}}
	if set == nil {
		return n
	}
	for _, b := range set.Budgets() {
		if len(b.Plans) == 0 {
			continue
		}
		nls := n.byRule[b.Rule]
		if i := slices.IndexFunc(nls, func(nl namedLimit) bool { return nl.limit == b.Limit }); i >= 0 {
			nls[i].name = b.Name // as the map this replaces kept the last
		} else {
			n.byRule[b.Rule] = append(nls, namedLimit{b.Limit, b.Name})
		}
	}
	if len(n.byRule) <= maxScannedRules {
		for _, b := range set.Budgets() {
			if nls, ok := n.byRule[b.Rule]; ok && !slices.ContainsFunc(n.few, func(rl ruleLimits) bool { return rl.rule == b.Rule }) {
				n.few = append(n.few, ruleLimits{b.Rule, nls})
			}
		}
	}
	return n
}

// Budget returns the budget key of key charged under global.
func (n *Namer) Budget(key bucket.Key, global bucket.Limit) bucket.Key {
	n.rename(&key, &global)
	return key
}

// rename is Budget on key in place, which the decision path uses to copy
// neither the key nor the limit.
func (n *Namer) rename(key *bucket.Key, global *bucket.Limit) {
	if n == nil {
		return
	}
	var nls []namedLimit
	if n.few != nil {
		for i := range n.few {
			// The rules set's own string, usually at the same address.
			if rules.SameString(n.few[i].rule, key.Rule) {
				nls = n.few[i].limits
				break
			}
		}
	} else if len(n.byRule) > 0 {
		nls = n.byRule[key.Rule]
	}
	for i := range nls {
		if nls[i].limit.Same(global) {
			key.Rule = nls[i].name
			return
		}
	}
}
