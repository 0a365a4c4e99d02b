package region

import (
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// TestBudgetsFollowTheRulesEnumeration: the lease budgets are the set's
// global budgets under their names, plans of equal limits share one, and
// the edge's keys are named into the same budgets.
func TestBudgetsFollowTheRulesEnumeration(t *testing.T) {
	set, err := rules.Parse([]byte(`
default_plan: free
plans: {free: "10 per minute", trial: "10 per minute", pro: "100 per second"}
rules:
  - {name: api, match: {path: "/api/*"}, limit: plan}
  - {name: login, match: {path: /login}, limit: "5 per minute", scope: region}
  - {name: search, match: {path: /search}, limit: "1000 per second", on_unavailable: fail_open}
`), "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	split := lease.Split{Regions: []string{"a", "b"}, Reserve: 0.2}
	bs := Budgets(set, split, lease.Proportional)
	var names []string
	for _, b := range bs {
		names = append(names, b.Rule)
		if b.Policy != lease.Proportional || b.Split().Reserve != 0.2 || len(b.Regions) != 2 {
			t.Errorf("budget %s: policy %s, split %+v", b.Rule, b.Policy, b.Split())
		}
	}
	if got, want := names, []string{"api/free", "api/pro", "search"}; !slices.Equal(got, want) {
		t.Fatalf("budgets %q, want %q (login is regional, trial shares free's)", got, want)
	}
	n := NewNamer(set)
	for _, c := range []struct {
		limit bucket.Limit
		want  string
	}{{bucket.PerMinute(10), "api/free"}, {bucket.PerSecond(100), "api/pro"}, {bucket.PerSecond(7), "api"}} {
		if got := n.Budget(bucket.Key{Rule: "api", Subject: "t"}, c.limit).Rule; got != c.want {
			t.Errorf("Namer: api at %s is charged to %q, want %q", c.limit, got, c.want)
		}
	}
	rcs := RuleConfigs(set, []string{"search"})
	for _, name := range []string{"api", "api/free", "api/pro", "login", "search"} {
		if _, ok := rcs[name]; !ok {
			t.Errorf("RuleConfigs has no entry for %q", name)
		}
	}
	if rc := rcs["search"]; rc.OnUnavailable != rules.FailOpen || !rc.EmptyOnFailover {
		t.Errorf("search: %+v", rc)
	}
	if rc := rcs["login"]; rc.Scope != rules.ScopeRegion {
		t.Errorf("login: %+v", rc)
	}
}

// TestNamerFindsEveryRule: a Namer finds a rule's budgets by comparing
// names in turn for a few plan rules and by its map for many, and either
// way charges a key to the budget the set's enumeration gives its rule and
// limit (the rule itself for a limit of none of its plans), whether the
// key's rule name is the set's own string or an equal copy.
func TestNamerFindsEveryRule(t *testing.T) {
	for _, n := range []int{1, maxScannedRules, maxScannedRules + 1, 3 * maxScannedRules} {
		var src strings.Builder
		src.WriteString("default_plan: free\nplans: {free: \"10 per minute\", trial: \"10 per minute\", pro: \"100 per second\"}\nrules:\n")
		for i := range n {
			fmt.Fprintf(&src, "  - {name: r%d, match: {path: /r%d}, limit: plan}\n", i, i)
		}
		src.WriteString("  - {name: fixed, limit: \"5 per second\"}\n")
		set, err := rules.Parse([]byte(src.String()), "rules.yaml")
		if err != nil {
			t.Fatal(err)
		}
		namer := NewNamer(set)
		if (namer.few != nil) != (n <= maxScannedRules) {
			t.Fatalf("%d plan rules: scanned list %v", n, namer.few != nil)
		}
		for _, r := range set.Rules() {
			for _, c := range []struct {
				limit bucket.Limit
				want  string
			}{{bucket.PerMinute(10), r.Name + "/free"}, {bucket.PerSecond(100), r.Name + "/pro"}, {bucket.PerSecond(7), r.Name}} {
				if r.Name == "fixed" {
					c.want = "fixed"
				}
				for _, name := range []string{r.Name, strings.Clone(r.Name)} {
					if got := namer.Budget(bucket.Key{Rule: name, Subject: "t"}, c.limit).Rule; got != c.want {
						t.Errorf("%d plan rules: %s at %s is charged to %q, want %q", n, name, c.limit, got, c.want)
					}
				}
			}
		}
		if got := namer.Budget(bucket.Key{Rule: "nope", Subject: "t"}, bucket.PerMinute(10)).Rule; got != "nope" {
			t.Errorf("%d plan rules: a rule not in the set is charged to %q", n, got)
		}
	}
}
