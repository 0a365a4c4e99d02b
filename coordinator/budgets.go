package coordinator

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// Document is the coordinator's budgets document, in a file (standalone)
// or under an etcd key (HA):
//
//	regions: [us, eu, ap]          # who shares every budget
//	weights: [2, 1, 1]             # floor weights (default equal)
//	reserve: 0.333                 # kept out of floors (default 1/3)
//	policy: max-min                # or proportional, static
//	budgets:                       # explicit budgets
//	  - rule: api
//	    limit: "6000 per minute, burst 100"
//	    regions: [us, eu]          # optional; so are weights, reserve, policy
//	rules: |                       # and/or a rules file inline, whose global
//	  plans: {free: "10 per minute"} #   rules become budgets
//	  rules: [{name: api, limit: plan, scope: global}]
//	lease: {ttl: 10s, refresh: 3s, drift: 500ms, hold: 20s}
//
// Regions take their floors from the same budgets, so the document is the
// one source both sides read.
type Document struct {
	Regions []string         `yaml:"regions"`
	Weights []int64          `yaml:"weights"`
	Reserve *float64         `yaml:"reserve"`
	Policy  string           `yaml:"policy"`
	Budgets []BudgetDocument `yaml:"budgets"`
	Rules   string           `yaml:"rules"`
	// RulesFile names a rules file instead of Rules (files only).
	RulesFile string        `yaml:"rules_file"`
	Lease     LeaseDocument `yaml:"lease"`
}

// BudgetDocument is one explicit budget.
type BudgetDocument struct {
	Rule    string   `yaml:"rule"`
	Limit   string   `yaml:"limit"`
	Regions []string `yaml:"regions"`
	Weights []int64  `yaml:"weights"`
	Reserve *float64 `yaml:"reserve"`
	Policy  string   `yaml:"policy"`
}

// LeaseDocument overrides lease timings; zero fields keep the defaults.
type LeaseDocument struct {
	TTL        time.Duration `yaml:"ttl"`
	Refresh    time.Duration `yaml:"refresh"`
	Drift      time.Duration `yaml:"drift"`
	Hold       time.Duration `yaml:"hold"`
	DemandTTL  time.Duration `yaml:"demand_ttl"`
	Headroom   *float64      `yaml:"headroom"`
	Hysteresis *float64      `yaml:"hysteresis"`
}

// RulesBudgets turns a rules set into budgets split among regions the way
// regions split them (the agent's region.Budgets); the coordinator binary
// supplies it so both sides name and size budgets identically.
type RulesBudgets func(set *rules.Set, regions []string, weights []int64, reserve float64, policy lease.AllocationPolicy) []lease.Budget

// ErrInvalidDocument: a budgets document cannot be served.
var ErrInvalidDocument = errors.New("coordinator: invalid budgets document")

// ParseDocument parses a budgets document; name is used in errors.
func ParseDocument(data []byte, name string) (*Document, error) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	var d Document
	if err := dec.Decode(&d); err != nil {
		return nil, fmt.Errorf("%w: %s: %w", ErrInvalidDocument, name, err)
	}
	return &d, nil
}

// LoadDocument reads and parses a budgets file.
func LoadDocument(path string) (*Document, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidDocument, err)
	}
	d, err := ParseDocument(data, path)
	if err != nil {
		return nil, err
	}
	if d.RulesFile != "" {
		rb, err := os.ReadFile(d.RulesFile)
		if err != nil {
			return nil, fmt.Errorf("%w: %s: rules_file: %w", ErrInvalidDocument, path, err)
		}
		d.Rules, d.RulesFile = string(rb), ""
	}
	return d, nil
}

// LeaseConfig applies the document's lease timings to base.
func (d *Document) LeaseConfig(base lease.Config) lease.Config {
	l := d.Lease
	set := func(dst *time.Duration, v time.Duration) {
		if v != 0 {
			*dst = v
		}
	}
	set(&base.TTL, l.TTL)
	set(&base.Refresh, l.Refresh)
	set(&base.Drift, l.Drift)
	set(&base.Hold, l.Hold)
	set(&base.DemandTTL, l.DemandTTL)
	if l.Headroom != nil {
		base.Headroom = *l.Headroom
	}
	if l.Hysteresis != nil {
		base.Hysteresis = *l.Hysteresis
	}
	return base
}

// Resolve returns the document's budgets, validated: the explicit ones and
// those of its rules (through fromRules, which may be nil when the document
// has no rules). Errors name the budget and field.
func (d *Document) Resolve(fromRules RulesBudgets) ([]lease.Budget, error) {
	reserve := lease.DefaultReserve
	if d.Reserve != nil {
		reserve = *d.Reserve
	}
	policy, err := lease.ParseAllocationPolicy(d.Policy)
	if err != nil {
		return nil, fmt.Errorf("%w: policy: %w", ErrInvalidDocument, err)
	}
	var out []lease.Budget
	for i, bd := range d.Budgets {
		l, err := rules.ParseQuota(bd.Limit)
		if err != nil {
			return nil, fmt.Errorf("%w: budgets[%d] (rule %q): limit: %w", ErrInvalidDocument, i, bd.Rule, err)
		}
		b := lease.Budget{Rule: bd.Rule, Limit: l, Regions: d.Regions, Weights: d.Weights, Reserve: reserve, Policy: policy}
		if bd.Regions != nil {
			b.Regions, b.Weights = bd.Regions, nil
		}
		if bd.Weights != nil {
			b.Weights = bd.Weights
		}
		if bd.Reserve != nil {
			b.Reserve = *bd.Reserve
		}
		if bd.Policy != "" {
			if b.Policy, err = lease.ParseAllocationPolicy(bd.Policy); err != nil {
				return nil, fmt.Errorf("%w: budgets[%d] (rule %q): %w", ErrInvalidDocument, i, bd.Rule, err)
			}
		}
		out = append(out, b)
	}
	if d.Rules != "" {
		if fromRules == nil {
			return nil, fmt.Errorf("%w: rules given but this coordinator cannot read rules", ErrInvalidDocument)
		}
		set, err := rules.Parse([]byte(d.Rules), "rules")
		if err != nil {
			return nil, fmt.Errorf("%w: rules: %w", ErrInvalidDocument, err)
		}
		out = append(out, fromRules(set, d.Regions, d.Weights, reserve, policy)...)
	}
	for i, b := range out {
		if err := b.Validate(); err != nil {
			return nil, fmt.Errorf("%w: budgets[%d]: %w", ErrInvalidDocument, i, err)
		}
	}
	seen := map[string]bool{}
	for _, b := range out {
		if seen[b.Rule] {
			return nil, fmt.Errorf("%w: budget %q defined twice", ErrInvalidDocument, b.Rule)
		}
		seen[b.Rule] = true
	}
	return out, nil
}
