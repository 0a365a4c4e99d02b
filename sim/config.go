package sim

import (
	"bytes"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	budgetsdoc "github.com/allot-dev/allot/budgets"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// ConfigSpec names the files a deployment runs with, so a scenario
// simulates the budgets the processes serve rather than a transcription of
// them:
//
//	config:
//	  budgets_file: deploy/budgets.yaml   # the coordinator's budgets document
//	  rules_file: deploy/rules.yaml       # the agents' rules file
//	  keys: {api/pro: 2000}               # subjects per budget, for synthetic traffic
//
// The budgets file is read by budgets.LoadDocument and resolved as the
// coordinator binary resolves it (its budgets enumerated by
// rules.Set.Budgets through region.Budgets); without one, the rules file's
// global budgets are split among the scenario's regions with the agents'
// defaults (equal weights, lease.DefaultReserve, max-min), as agents started
// with only -regions split them. The rules (the budgets file's, or the
// rules file when the budgets file has none) give each budget its failure
// policy; a budget no rule names fails closed. The document's lease timings (ttl, refresh, drift) become the
// scenario's coordinator settings unless the scenario sets them. Paths are
// taken from the scenario file's directory.
type ConfigSpec struct {
	BudgetsFile string `yaml:"budgets_file"`
	RulesFile   string `yaml:"rules_file"`
	// Keys is the number of subjects each budget has, for synthetic
	// traffic spread over keys; a replayed log adds the subjects it
	// names. Default: the subjects the replayed logs name, else 1 for a
	// shared budget and DefaultConfigKeys for the others.
	Keys map[string]int `yaml:"keys"`
}

// DefaultConfigKeys is the number of subjects a per-subject budget read
// from a rules file has when the scenario does not say.
const DefaultConfigKeys = 100

// parseScenario decodes a scenario whose relative paths are taken from dir.
func parseScenario(b []byte, dir string) (*Scenario, error) {
	dec := newDecoder(b)
	sc := &Scenario{}
	if err := dec.Decode(sc); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrScenario, err)
	}
	if err := sc.applyConfig(dir); err != nil {
		return nil, err
	}
	if err := sc.loadReplays(dir); err != nil {
		return nil, err
	}
	for i := range sc.Rules {
		if sc.Rules[i].Keys == 0 {
			sc.Rules[i].Keys = sc.Rules[i].defaultKeys
		}
	}
	sc.setDefaults()
	if err := sc.Validate(); err != nil {
		return nil, err
	}
	return sc, nil
}

// applyConfig reads the files sc.Config names and turns their budgets
// into sc.Rules and their lease timings into sc.Coordinator.
func (sc *Scenario) applyConfig(dir string) error {
	c := sc.Config
	if c == nil {
		return nil
	}
	if c.BudgetsFile == "" && c.RulesFile == "" {
		return bad("config: give budgets_file, rules_file or both")
	}
	if len(sc.Rules) > 0 {
		return bad("config: rules has %d entries; a scenario takes its rules from config or from rules, not both", len(sc.Rules))
	}
	if len(sc.Regions) == 0 {
		return bad("config: regions is empty; name the regions (and their latencies) the budgets are split among")
	}
	var names []string
	for _, r := range sc.Regions {
		names = append(names, r.Name)
	}
	var set *rules.Set
	if c.RulesFile != "" {
		s, err := rules.Load(resolvePath(dir, c.RulesFile))
		if err != nil {
			return fmt.Errorf("%w: config.rules_file=%q: %w", ErrScenario, c.RulesFile, err)
		}
		set = s
	}
	var budgets []lease.Budget
	if c.BudgetsFile != "" {
		path := resolvePath(dir, c.BudgetsFile)
		doc, err := budgetsdoc.LoadDocument(path)
		if err != nil {
			return fmt.Errorf("%w: config.budgets_file=%q: %w", ErrScenario, c.BudgetsFile, err)
		}
		if doc.Rules != "" {
			docSet, err := rules.Parse([]byte(doc.Rules), path+" (rules)")
			if err != nil {
				return fmt.Errorf("%w: config.budgets_file=%q: %w", ErrScenario, c.BudgetsFile, err)
			}
			if set != nil && set.Digest() != docSet.Digest() {
				return bad("config.rules_file=%q differs from the rules budgets_file=%q carries (digest %.12s vs %.12s): agents and coordinator would size budgets differently",
					c.RulesFile, c.BudgetsFile, set.Digest(), docSet.Digest())
			}
			set = docSet
		}
		budgets, err = doc.Resolve(budgetsOfRules)
		if err != nil {
			return fmt.Errorf("%w: config.budgets_file=%q: %w", ErrScenario, c.BudgetsFile, err)
		}
		lc := doc.LeaseConfig(lease.DefaultConfig())
		co := &sc.Coordinator
		if co.LeaseTTL == 0 {
			co.LeaseTTL = lc.TTL
		}
		if co.Refresh == 0 {
			co.Refresh = lc.Refresh
		}
		if co.Drift == 0 {
			co.Drift = rhoOf(lc.Drift, lc.TTL)
		}
	} else {
		budgets = region.Budgets(set, lease.Split{Regions: names, Reserve: lease.DefaultReserve}, lease.MaxMin)
	}
	if len(budgets) == 0 {
		return bad("config: budgets_file=%q, rules_file=%q define no global budget to simulate", c.BudgetsFile, c.RulesFile)
	}
	byName := map[string]rules.RuleBudget{}
	if set != nil {
		for _, b := range set.Budgets() {
			byName[b.Name] = b
		}
	}
	for name, k := range c.Keys {
		if !slices.ContainsFunc(budgets, func(b lease.Budget) bool { return b.Rule == name }) {
			return bad("config.keys: %q is not a budget of the config (budgets: %s)", name, budgetNames(budgets))
		}
		if k < 1 || k > 10_000_000 {
			return bad("config.keys.%s=%d must be in [1, 10000000]", name, k)
		}
	}
	for _, b := range budgets {
		rs, err := ruleSpecOf(b, byName[b.Rule], names, c.Keys)
		if err != nil {
			return err
		}
		sc.Rules = append(sc.Rules, rs)
	}
	return nil
}

// budgetsOfRules sizes the budgets of a rules set exactly as the
// coordinator binary and the agents do.
func budgetsOfRules(set *rules.Set, regions []string, weights []int64, reserve float64, p lease.AllocationPolicy) []lease.Budget {
	return region.Budgets(set, lease.Split{Regions: regions, Weights: weights, Reserve: reserve}, p)
}

// ruleSpecOf turns one lease budget into the scenario's rule: its limit,
// its split (weights in the scenario's region order), its allocation
// policy, and the failure policy of the rule it comes from.
func ruleSpecOf(b lease.Budget, rb rules.RuleBudget, regions []string, keys map[string]int) (RuleSpec, error) {
	if !sameSet(b.Regions, regions) {
		return RuleSpec{}, bad("config: budget %q is split among regions %v, the scenario has %v; the simulator models budgets shared by every region of the scenario",
			b.Rule, b.Regions, regions)
	}
	l := b.Limit
	if l.Count() > math.MaxInt32 || l.Period()%time.Microsecond != 0 {
		return RuleSpec{}, bad("config: budget %q limit=%s is beyond what the simulator models (count ≤ %d, period in whole microseconds)", b.Rule, l, math.MaxInt32)
	}
	rs := RuleSpec{
		Name:       b.Rule,
		Count:      int64(l.Count()),
		Period:     l.Period(),
		Burst:      int64(l.Burst()),
		Policy:     PolicyClosed,
		Reserve:    b.Reserve,
		Allocation: b.Policy.String(),
	}
	if b.Weights != nil {
		rs.Weights = make([]int64, len(regions))
		for i, r := range regions {
			rs.Weights[i] = b.Weights[slices.Index(b.Regions, r)]
		}
	}
	switch rb.Failure.Policy {
	case rules.FailOpen:
		rs.Policy = PolicyOpen
	case rules.Emergency:
		rs.Policy = PolicyEmergency
	}
	// Keys stays 0 for a replayed log to set; then the default applies.
	rs.defaultKeys = DefaultConfigKeys
	if rb.Shared {
		rs.defaultKeys = 1
	}
	if k, ok := keys[b.Rule]; ok {
		rs.Keys = k
	}
	return rs, nil
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	x, y := slices.Clone(a), slices.Clone(b)
	sort.Strings(x)
	sort.Strings(y)
	return slices.Equal(x, y)
}

func budgetNames(bs []lease.Budget) string {
	var out []string
	for _, b := range bs {
		out = append(out, b.Rule)
	}
	return strings.Join(out, ", ")
}

// resolvePath takes a relative path from dir.
func resolvePath(dir, p string) string {
	if filepath.IsAbs(p) || dir == "" {
		return p
	}
	return filepath.Join(dir, p)
}

// readFileLimited reads a file the scenario names, refusing one beyond max
// bytes.
func readFileLimited(path string, max int64) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, err
	}
	if st.Size() > max {
		return nil, fmt.Errorf("%s is %d bytes, more than the %d allowed", path, st.Size(), max)
	}
	var buf bytes.Buffer
	_, err = buf.ReadFrom(f)
	return buf.Bytes(), err
}

// MaxConfigRho is the largest drift ρ a config's margin becomes: the
// scenario's coordinator.drift must stay below 0.1.
const MaxConfigRho = 0.0999

// rhoOf is the relative drift ρ whose margin over ttl is drift: the
// inverse of lease.DriftFor (drift = ρ·ttl/(2+ρ)), so the file's margin is
// the one simulated — up to MaxConfigRho: a wider margin (the lease
// defaults' 500ms over 10s is ρ ≈ 0.105) is simulated at MaxConfigRho's
// slightly narrower one (476ms over 10s).
func rhoOf(drift, ttl time.Duration) float64 {
	if drift <= 0 || drift >= ttl {
		return 0
	}
	return min(2*float64(drift)/float64(ttl-drift), MaxConfigRho)
}

// allocation returns the rule's allocation policy; Validate checked it.
func (r RuleSpec) allocation() lease.AllocationPolicy {
	p, _ := lease.ParseAllocationPolicy(r.Allocation)
	return p
}

// validateSplit checks the rule's weights and allocation policy.
func (r RuleSpec) validateSplit(i, regions int) error {
	if r.Weights != nil && len(r.Weights) != regions {
		return bad("rules[%d].weights has %d entries for %d regions", i, len(r.Weights), regions)
	}
	for j, w := range r.Weights {
		if w < 1 || w > 1<<20 {
			return bad("rules[%d].weights[%d]=%d must be in [1, %d]", i, j, w, 1<<20)
		}
	}
	if _, err := lease.ParseAllocationPolicy(r.Allocation); err != nil {
		return bad("rules[%d].allocation=%q must be max-min, proportional or static", i, r.Allocation)
	}
	return nil
}
