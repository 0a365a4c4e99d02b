package sim

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	budgetsdoc "github.com/allot-dev/allot/budgets"
	"github.com/allot-dev/allot/lease"
)

// TestConfigReadsProductionFiles checks that a scenario naming a budgets
// file simulates exactly the budgets the coordinator resolves from it: the
// same names, limits, weights, reserve and policy, the rules' failure
// policies, and the document's lease timings.
func TestConfigReadsProductionFiles(t *testing.T) {
	sc, err := LoadScenario("testdata/ops/scenario.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc, err := budgetsdoc.LoadDocument("testdata/ops/budgets.yaml")
	if err != nil {
		t.Fatal(err)
	}
	want, err := doc.Resolve(budgetsOfRules)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Rules) != len(want) {
		t.Fatalf("scenario has %d rules, the coordinator resolves %d budgets", len(sc.Rules), len(want))
	}
	policies := map[string]string{"api/free": PolicyEmergency, "api/pro": PolicyEmergency, "search": PolicyClosed}
	keys := map[string]int{"api/free": 50, "api/pro": 10, "search": 1}
	for i, b := range want {
		r := sc.Rules[i]
		if r.Name != b.Rule || r.Count != int64(b.Limit.Count()) || r.Period != b.Limit.Period() || r.Burst != int64(b.Limit.Burst()) {
			t.Errorf("rule %d = %s %d per %s burst %d, want %s %s", i, r.Name, r.Count, r.Period, r.Burst, b.Rule, b.Limit)
		}
		if r.Reserve != 0.25 || r.Allocation != lease.MaxMin.String() {
			t.Errorf("%s: reserve=%v allocation=%q, want 0.25 and max-min", r.Name, r.Reserve, r.Allocation)
		}
		if got := r.Weights; len(got) != 3 || got[0] != 2 || got[1] != 1 || got[2] != 1 {
			t.Errorf("%s: weights=%v, want [2 1 1] in the scenario's region order", r.Name, got)
		}
		if r.Policy != policies[r.Name] {
			t.Errorf("%s: policy=%q, want %q from the rules file", r.Name, r.Policy, policies[r.Name])
		}
		if r.Keys != keys[r.Name] {
			t.Errorf("%s: keys=%d, want %d", r.Name, r.Keys, keys[r.Name])
		}
	}
	c := sc.Coordinator
	if c.LeaseTTL != 8*time.Second || c.Refresh != 2*time.Second {
		t.Errorf("coordinator ttl=%s refresh=%s, want 8s and 2s from the budgets file", c.LeaseTTL, c.Refresh)
	}
	// The simulated protocol's margin is the file's 200ms.
	if d := lease.DriftFor(c.LeaseTTL, c.Drift); d < 200*time.Millisecond || d > 200*time.Millisecond+time.Microsecond {
		t.Errorf("drift ρ=%v gives a margin of %s over 8s, want the file's 200ms", c.Drift, d)
	}
	// The floors the simulated regions start from are the coordinator's.
	res, err := Run(sc, 1, Options{Systems: []string{"allot"}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Verdict != Pass {
		t.Fatalf("verdict %s", res.Verdict)
	}
	if u := res.Systems[0].Utilization; u < 0.5 {
		t.Errorf("allot utilization %.3f, want ≥ 0.5 on this light load", u)
	}
}

// TestConfigScenarioOverridesLease: timings a scenario sets win over the
// budgets file's, so a sweep can vary them.
func TestConfigScenarioOverridesLease(t *testing.T) {
	sc := configScenario(t, "coordinator: {lease_ttl: 20s}\n")
	if sc.Coordinator.LeaseTTL != 20*time.Second || sc.Coordinator.Refresh != 2*time.Second {
		t.Fatalf("ttl=%s refresh=%s, want 20s from the scenario and 2s from the file", sc.Coordinator.LeaseTTL, sc.Coordinator.Refresh)
	}
}

// configScenario writes a scenario beside the example files and loads it.
func configScenario(t *testing.T, extra string) *Scenario {
	t.Helper()
	sc, err := loadConfigScenario(t, "config: {budgets_file: budgets.yaml}\n"+extra)
	if err != nil {
		t.Fatal(err)
	}
	return sc
}

func loadConfigScenario(t *testing.T, body string) (*Scenario, error) {
	t.Helper()
	dir := t.TempDir()
	for _, f := range []string{"budgets.yaml", "rules.yaml"} {
		b, err := os.ReadFile(filepath.Join("testdata/ops", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	head := "name: c\nduration: 2s\nregions: [{name: us}, {name: eu}, {name: ap}]\n" +
		"latency: {us: {eu: 40ms, ap: 90ms}, eu: {ap: 70ms}}\n"
	p := filepath.Join(dir, "s.yaml")
	if err := os.WriteFile(p, []byte(head+body), 0o644); err != nil {
		t.Fatal(err)
	}
	return LoadScenario(p)
}

// TestConfigErrors checks that every bad config is refused with the field
// and the value named.
func TestConfigErrors(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		want       []string
	}{
		{"no file", "config: {keys: {a: 1}}\n", []string{"config: give budgets_file"}},
		{"missing budgets file", "config: {budgets_file: nope.yaml}\n", []string{`config.budgets_file="nope.yaml"`, "no such file"}},
		{"missing rules file", "config: {rules_file: nope.yaml}\n", []string{`config.rules_file="nope.yaml"`, "no such file"}},
		{"rules and config", "config: {budgets_file: budgets.yaml}\nrules: [{name: x, count: 1, period: 1s}]\n", []string{"config: rules has 1 entries"}},
		{"unknown keys budget", "config: {budgets_file: budgets.yaml, keys: {api/gold: 5}}\n", []string{`config.keys: "api/gold" is not a budget`, "api/free, api/pro, search"}},
		{"bad keys", "config: {budgets_file: budgets.yaml, keys: {api/pro: 0}}\n", []string{"config.keys.api/pro=0"}},
		{"traffic on a rule name", "config: {budgets_file: budgets.yaml}\ntraffic: [{region: us, rule: api, rate: 5}]\n", []string{`traffic[0].rule="api" is not a rule`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := loadConfigScenario(t, tc.body)
			if !errors.Is(err, ErrScenario) {
				t.Fatalf("err = %v, want ErrScenario", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("err = %v, want it to name %q", err, w)
				}
			}
		})
	}
}

// TestConfigRegionsMustMatch: a budget split among regions the scenario
// does not simulate is refused, naming both lists.
func TestConfigRegionsMustMatch(t *testing.T) {
	dir := t.TempDir()
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	rb, err := os.ReadFile("testdata/ops/rules.yaml")
	must(err)
	must(os.WriteFile(filepath.Join(dir, "rules.yaml"), rb, 0o644))
	must(os.WriteFile(filepath.Join(dir, "budgets.yaml"), []byte("regions: [us, eu]\nrules_file: rules.yaml\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "other.yaml"), []byte("version: other\nrules: [{name: x, limit: \"5 per second\", subject: shared}]\n"), 0o644))
	head := "name: c\nregions: [{name: us}, {name: eu}, {name: ap}]\nlatency: {us: {eu: 40ms, ap: 90ms}, eu: {ap: 70ms}}\n"
	for _, tc := range []struct{ body, want string }{
		{"config: {budgets_file: budgets.yaml}\n", `budget "api/free" is split among regions [us eu], the scenario has [us eu ap]`},
		{"config: {budgets_file: budgets.yaml, rules_file: other.yaml}\n", `config.rules_file="other.yaml" differs from the rules budgets_file="budgets.yaml" carries`},
	} {
		p := filepath.Join(dir, "s.yaml")
		must(os.WriteFile(p, []byte(head+tc.body), 0o644))
		_, err := LoadScenario(p)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err = %v, want %q", err, tc.want)
		}
	}
}

// TestConfigRulesFileAlone: a scenario naming only the agents' rules file
// splits its global budgets among the scenario's regions as agents started
// with -regions alone do (equal weights, the default reserve, max-min);
// a rule of region or local scope is not leased, so not simulated.
func TestConfigRulesFileAlone(t *testing.T) {
	dir := t.TempDir()
	rb, err := os.ReadFile("testdata/ops/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rb = append(rb, []byte("  - {name: login, match: {endpoint: login}, limit: \"5 per minute\", scope: region}\n")...)
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), rb, 0o644); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "s.yaml")
	body := "name: c\nregions: [{name: us}, {name: eu}]\nlatency: {us: {eu: 40ms}}\nconfig: {rules_file: rules.yaml}\n"
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	sc, err := LoadScenario(p)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, r := range sc.Rules {
		names = append(names, r.Name)
		if r.Reserve != lease.DefaultReserve || r.Weights != nil || r.Allocation != "max-min" {
			t.Errorf("%s: reserve %v weights %v allocation %q, want the agents' defaults", r.Name, r.Reserve, r.Weights, r.Allocation)
		}
	}
	if strings.Join(names, ",") != "api/free,api/pro,search" {
		t.Errorf("rules %v, want the global budgets api/free, api/pro, search", names)
	}
	if sc.Coordinator.LeaseTTL != 10*time.Second {
		t.Errorf("ttl %s, want the simulator's default without a budgets file", sc.Coordinator.LeaseTTL)
	}
}

// TestConfigExplicitBudgetsTakePoliciesFromRules: a budgets document with
// explicit budgets and no rules is what the coordinator serves; the rules
// file gives the budgets it names their failure policy, and one it does
// not name fails closed.
func TestConfigExplicitBudgetsTakePoliciesFromRules(t *testing.T) {
	dir := t.TempDir()
	rb, err := os.ReadFile("testdata/ops/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(filepath.Join(dir, "rules.yaml"), rb, 0o644))
	must(os.WriteFile(filepath.Join(dir, "budgets.yaml"), []byte(`regions: [us, eu]
budgets:
  - {rule: api/pro, limit: "200 per second, burst 400", policy: proportional}
  - {rule: other, limit: "50 per second"}
`), 0o644))
	p := filepath.Join(dir, "s.yaml")
	must(os.WriteFile(p, []byte("name: c\nregions: [{name: eu}, {name: us}]\nlatency: {us: {eu: 40ms}}\nconfig: {budgets_file: budgets.yaml, rules_file: rules.yaml}\n"), 0o644))
	sc, err := LoadScenario(p)
	must(err)
	if len(sc.Rules) != 2 {
		t.Fatalf("rules %+v, want the document's two budgets only", sc.Rules)
	}
	if r := sc.Rules[0]; r.Name != "api/pro" || r.Policy != PolicyEmergency || r.Allocation != "proportional" || r.Keys != DefaultConfigKeys {
		t.Errorf("api/pro: %+v, want emergency from the rules, proportional from the document, %d keys", r, DefaultConfigKeys)
	}
	if r := sc.Rules[1]; r.Name != "other" || r.Policy != PolicyClosed || r.Count != 50 {
		t.Errorf("other: %+v, want 50/s failing closed", r)
	}
}
