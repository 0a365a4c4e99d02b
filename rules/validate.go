package rules

import (
	"fmt"
	"strings"
)

// validate checks what needs the whole file: references between sections,
// costs against bursts, and rules that can never match.
func (p *parser) validate(s *Set) {
	if p.rulesLine == 0 {
		p.add(0, "rules", "missing: a rules file needs at least one rule")
	} else if len(s.rules) == 0 && len(p.problems) == 0 {
		p.add(p.rulesLine, "rules", "empty: a rules file needs at least one rule")
	}
	usesPlans := false
	for _, r := range s.rules {
		if r.Source == FromPlan {
			usesPlans = true
		}
	}
	if s.noIdentity.Action == DefaultPlanNoIdentity {
		usesPlans = true
	}
	switch {
	case s.defaultPlan != "":
		if _, ok := s.plans[s.defaultPlan]; !ok {
			p.add(p.defaultPlanLine, "default_plan", "plan %q is not defined under plans (defined: %s)",
				s.defaultPlan, strings.Join(sortedKeys(s.plans), ", "))
		}
	case usesPlans:
		line := p.defaultPlanLine
		if line == 0 {
			line = p.noIdentityLine
		}
		p.add(line, "default_plan", "missing: rules with \"limit: plan\" and no_identity default_plan need a default plan")
	}
	for _, r := range s.rules {
		p.checkCosts(s, r)
	}
	for j, rj := range s.rules {
		for _, ri := range s.rules[:j] {
			if coversAll(ri.Match, rj.Match) {
				p.add(rj.Line, p.ruleField[rj]+".match",
					"rule %q is unreachable: rule %q (line %d) comes first and matches every request it matches",
					rj.Name, ri.Name, ri.Line)
				break
			}
		}
	}
}

// checkCosts rejects a rule whose largest cost exceeds the burst of every
// limit it can be charged under: such requests could never be admitted.
func (p *parser) checkCosts(s *Set, r *Rule) {
	maxCost := r.MaxCost()
	field, line := p.ruleField[r]+".cost", r.Line
	if l, ok := p.costKeyLines[r]; ok {
		line = l
	}
	for i, c := range r.Costs {
		if c.Cost == maxCost && c.Cost > r.DefaultCost {
			field = fmt.Sprintf("%s.costs[%d].cost", p.ruleField[r], i)
			if i < len(p.costLines[r]) {
				line = p.costLines[r][i]
			}
			break
		}
	}
	switch r.Source {
	case Fixed:
		if !r.Limit.IsZero() && r.Limit.Burst() < maxCost {
			p.add(line, field, "cost %d exceeds the burst %d of the rule's limit %q: it could never be admitted",
				maxCost, r.Limit.Burst(), FormatQuota(r.Limit))
		}
	case FromPlan:
		if len(s.plans) == 0 {
			break
		}
		fits := false
		var bursts []string
		for _, pl := range s.planOrder {
			if pl.Limit.Burst() >= maxCost {
				fits = true
			}
			bursts = append(bursts, fmt.Sprintf("%s %d", pl.Name, pl.Limit.Burst()))
		}
		if !fits {
			p.add(line, field, "cost %d exceeds the burst of every plan (%s): it could never be admitted",
				maxCost, strings.Join(bursts, ", "))
		}
	}
	if !r.Failure.Limit.IsZero() && r.Failure.Limit.Burst() < maxCost {
		p.add(p.emergencyLines[r], p.ruleField[r]+".on_unavailable.limit",
			"cost %d exceeds the emergency burst %d: it could never be admitted during an outage",
			maxCost, r.Failure.Limit.Burst())
	}
}

// coversAll reports whether conditions a match every descriptor that
// conditions b match: each condition of a is implied by one of b.
func coversAll(a, b []Condition) bool {
	for _, ca := range a {
		implied := false
		for _, cb := range b {
			if ca.Key == cb.Key && covers(ca.Pattern, cb.Pattern) {
				implied = true
				break
			}
		}
		if !implied {
			return false
		}
	}
	return true
}
