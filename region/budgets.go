package region

import (
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// BudgetName names the global budget of a plan rule under one plan:
// "rule/plan". A fixed rule's budget is named after the rule alone.
func BudgetName(rule, plan string) string { return rule + "/" + plan }

// Budgets lists the global budgets of a rules set as the lease protocol
// sees them: one per fixed global rule (named after the rule) and one per
// plan of each global plan rule (named by BudgetName), split by split. Rules
// of region or local scope are never leased. Two plans with the same limit
// share the first one's budget, as they share a bucket at the edge.
func Budgets(set *rules.Set, split lease.Split, policy lease.AllocationPolicy) []lease.Budget {
	var out []lease.Budget
	add := func(name string, l bucket.Limit) {
		out = append(out, lease.Budget{Rule: name, Limit: l, Regions: append([]string(nil), split.Regions...),
			Weights: append([]int64(nil), split.Weights...), Reserve: split.Reserve, Policy: policy})
	}
	for _, r := range set.Rules() {
		if r.Scope != rules.ScopeGlobal && r.Scope != "" {
			continue
		}
		if r.Source == rules.Fixed {
			add(r.Name, r.Limit)
			continue
		}
		seen := map[bucket.Limit]bool{}
		for _, p := range set.Plans() {
			if seen[p.Limit] {
				continue
			}
			seen[p.Limit] = true
			add(BudgetName(r.Name, p.Name), p.Limit)
		}
	}
	return out
}

// Namer maps the key the edge charges (rule name, subject) and the limit it
// charges it under to the key of the global budget it belongs to: a plan
// rule's bucket is charged under its plan's budget, which the limit
// identifies. It is immutable and safe for concurrent use.
type Namer struct {
	byLimit map[ruleLimit]string
}

type ruleLimit struct {
	rule  string
	limit bucket.Limit
}

// NewNamer returns the Namer of a rules set; nil set means keys map to
// themselves.
func NewNamer(set *rules.Set) *Namer {
	n := &Namer{byLimit: map[ruleLimit]string{}}
	if set == nil {
		return n
	}
	for _, r := range set.Rules() {
		if r.Source != rules.FromPlan {
			continue
		}
		for _, p := range set.Plans() {
			k := ruleLimit{r.Name, p.Limit}
			if _, ok := n.byLimit[k]; !ok {
				n.byLimit[k] = BudgetName(r.Name, p.Name)
			}
		}
	}
	return n
}

// Budget returns the budget key of key charged under global.
func (n *Namer) Budget(key bucket.Key, global bucket.Limit) bucket.Key {
	if n == nil || len(n.byLimit) == 0 {
		return key
	}
	if name, ok := n.byLimit[ruleLimit{key.Rule, global}]; ok {
		key.Rule = name
	}
	return key
}
