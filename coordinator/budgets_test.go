package coordinator

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

func TestDocument(t *testing.T) {
	d, err := ParseDocument([]byte(`
regions: [us, eu, ap]
reserve: 0.25
budgets:
  - rule: api
    limit: "6000 per minute, burst 100"
  - rule: search
    limit: "100 per second"
    regions: [us, eu]
    weights: [3, 1]
    policy: proportional
lease: {ttl: 4s, refresh: 1s}
`), "doc")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := d.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].Limit != bucket.PerMinute(6000).WithBurst(100) || bs[0].Reserve != 0.25 ||
		len(bs[0].Regions) != 3 || bs[1].Policy != lease.Proportional || bs[1].Weights[0] != 3 {
		t.Fatalf("budgets = %+v", bs)
	}
	if c := d.LeaseConfig(lease.DefaultConfig()); c.TTL != 4*time.Second || c.Refresh != time.Second || c.Drift != lease.DefaultConfig().Drift {
		t.Fatalf("lease config = %+v", c)
	}
}

func TestDocumentErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"regions: [a]\nbudgets: [{rule: x, limit: \"lots\"}]", `doc:2: budgets[0].limit: quota "lots"`},
		{"regions: [a]\nbudgets: [{rule: x, limit: \"1 per second\", policy: fair}]", `doc:2: budgets[0].policy: unknown policy "fair"`},
		{"budgets: [{rule: x, limit: \"1 per second\"}]", "doc:1: budgets[0].regions: missing, and no regions at the top level"},
		{"regions: [a]\nbogus: 1", `doc:2: bogus: unknown key "bogus" (known: regions, weights, reserve, policy, budgets, rules, rules_file, lease)`},
		{"regions: [a, a]\nbudgets: [{rule: x, limit: \"1 per second\"}]", `doc:1: regions[1]: region "a" listed twice (first as regions[0])`},
		{"regions: [a]\nlease: {ttl: 2s, refresh: 3s}", "doc:2: lease.refresh: refresh=3s must be in (0, ttl=2s)"},
		{"regions: [a]\nlease: {ttl: -1s}", "doc:2: lease.ttl: -1s must be > 0"},
		{"regions: [a]\nrules: |\n  plans: {free: \"10 per minute\"}\n  rules:\n    - {name: api, limit: pln}\n", "doc:5: rules: rules[0].limit: quota \"pln\""},
		{"regions: [a]\nbudgets:\n  - {rule: x, limit: \"1 per second\"}\n  - {rule: x, limit: \"2 per second\"}\n", `doc:4: budgets[1].rule: budget "x" defined twice (first in budgets[0])`},
		{"regions: [a]\nbudgets: [{rule: x, limit: \"1 per second\"}", "doc:1: not valid YAML: line 1"},
	} {
		d, err := ParseDocument([]byte(tc.doc), "doc")
		if err == nil {
			_, err = d.Resolve(nil)
		}
		if !errors.Is(err, ErrInvalidDocument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
	// Rules need a coordinator that can size their budgets.
	d, err := ParseDocument([]byte("regions: [a]\nrules: |\n  plans: {free: \"10 per minute\"}\n  default_plan: free\n  rules: [{name: api, limit: plan}]\n"), "doc")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := d.Resolve(nil); !errors.Is(err, ErrInvalidDocument) || !strings.Contains(err.Error(), "doc:2: rules: given, but this coordinator cannot read rules") {
		t.Errorf("rules without fromRules: %v", err)
	}
}

// TestDocumentErrorsLikeTheRulesFile: each mistake a newcomer makes in a
// budgets file is reported the way the rules file reports it: file:line,
// the field, the value, and for a typo the keys that exist.
func TestDocumentErrorsLikeTheRulesFile(t *testing.T) {
	dir := t.TempDir()
	write := func(name, doc string) string {
		t.Helper()
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	for _, tc := range []struct {
		name, doc string
		want      []string // every line of the error after the first
	}{
		{"typo.yaml", "regions: [us, eu]\nbudgets:\n  - rule: api\n    limt: \"6000 per minute\"\n", []string{
			"typo.yaml:3: budgets[0].limit: missing",
			`typo.yaml:4: budgets[0].limt: unknown key "limt" (known: rule, limit, regions, weights, reserve, policy)`,
		}},
		{"negative.yaml", "regions: [us, eu]\nbudgets:\n  - rule: api\n    limit: \"-5 per minute\"\n", []string{
			`negative.yaml:4: budgets[0].limit: quota "-5 per minute": want "<count> per <unit>[, burst <n>]", e.g. "10 per minute"`,
		}},
		{"reserve.yaml", "regions: [us, eu]\nreserve: -0.5\nbudgets:\n  - rule: api\n    limit: \"6000 per minute\"\n", []string{
			"reserve.yaml:2: reserve: -0.5 out of range [0, 1)",
		}},
		{"weights.yaml", "regions: [us, eu]\nweights: [2, 1, 1]\nbudgets:\n  - rule: api\n    limit: \"6000 per minute\"\n    reserve: 1.5\n", []string{
			"weights.yaml:2: weights: 3 weights for 2 regions",
			"weights.yaml:6: budgets[0].reserve: 1.5 out of range [0, 1)",
		}},
	} {
		path := write(tc.name, tc.doc)
		d, err := LoadDocument(path)
		if err == nil {
			_, err = d.Resolve(nil)
		}
		var de *DocumentError
		if !errors.As(err, &de) || !errors.Is(err, ErrInvalidDocument) {
			t.Errorf("%s: error %v, want a *DocumentError", tc.name, err)
			continue
		}
		lines := strings.Split(err.Error(), "\n")
		if want := fmt.Sprintf("coordinator: invalid budgets document: %s: %d problem(s):", path, len(tc.want)); lines[0] != want {
			t.Errorf("%s: first line %q, want %q", tc.name, lines[0], want)
		}
		for i, w := range tc.want {
			if i+1 >= len(lines) || lines[i+1] != "  "+filepath.Join(dir, w) {
				t.Errorf("%s: error\n%v\nwant line %d %q", tc.name, err, i+1, w)
			}
		}
		if len(lines) != len(tc.want)+1 {
			t.Errorf("%s: %d problems, want %d:\n%v", tc.name, len(lines)-1, len(tc.want), err)
		}
	}

	// A missing file is not there, not invalid.
	missing := filepath.Join(dir, "absent.yaml")
	_, err := LoadDocument(missing)
	if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalidDocument) || strings.Contains(err.Error(), "invalid") ||
		strings.Count(err.Error(), missing) != 1 {
		t.Errorf("missing file: %v, want a not-found error naming the path once", err)
	}
	// So is a rules file it names; a relative one is found beside it.
	path := write("with-rules.yaml", "regions: [us]\nrules_file: rules.yaml\n")
	if _, err := LoadDocument(path); !errors.Is(err, fs.ErrNotExist) || errors.Is(err, ErrInvalidDocument) ||
		!strings.Contains(err.Error(), path+":2: rules_file: open "+filepath.Join(dir, "rules.yaml")) {
		t.Errorf("missing rules file: %v", err)
	}
	write("rules.yaml", "plans: {free: \"10 per minute\"}\ndefault_plan: free\nrules:\n  - {name: api, limit: plan, scope: global}\n")
	d, err := LoadDocument(path)
	if err != nil || d.Rules == "" {
		t.Fatalf("rules file beside the document: %v", err)
	}
	write("rules.yaml", "plans: {free: \"10 per minute\"}\ndefault_plan: free\nrules:\n  - {name: api, limit: plan, scoop: global}\n")
	if _, err := LoadDocument(path); !errors.Is(err, ErrInvalidDocument) || !strings.Contains(err.Error(), filepath.Join(dir, "rules.yaml")+`:4: rules[0].scoop: unknown key "scoop"`) {
		t.Errorf("invalid rules file: %v", err)
	}
}

// TestResolveHandBuilt: a Document built in code, with no lines, gets the
// same checks, each named by its field: a bad top-level default is not
// blamed on the first budget.
func TestResolveHandBuilt(t *testing.T) {
	bad := -0.5
	d := &Document{Regions: []string{"us"}, Reserve: &bad, Budgets: []BudgetDocument{{Rule: "api", Limit: "1 per second"}}}
	_, err := d.Resolve(nil)
	if !errors.Is(err, ErrInvalidDocument) || !strings.Contains(err.Error(), ": reserve: -0.5 out of range [0, 1)") || strings.Contains(err.Error(), "budgets[0]") {
		t.Errorf("Resolve = %v", err)
	}
}

func TestDocumentRules(t *testing.T) {
	d, err := ParseDocument([]byte(`
regions: [us, eu]
rules: |
  plans: {free: "10 per minute"}
  default_plan: free
  rules:
    - {name: api, match: {path: "/*"}, limit: "600 per minute", scope: global}
`), "doc")
	if err != nil {
		t.Fatal(err)
	}
	var got *rules.Set
	bs, err := d.Resolve(func(set *rules.Set, regions []string, weights []int64, reserve float64, p lease.AllocationPolicy) []lease.Budget {
		got = set
		return []lease.Budget{{Rule: "api", Limit: bucket.PerMinute(600), Regions: regions, Reserve: reserve, Policy: p}}
	})
	if err != nil || got == nil || len(bs) != 1 {
		t.Fatalf("Resolve = %v, %v (rules parsed: %v)", bs, err, got != nil)
	}
}

// TestConvertRoundTrip: every field survives the wire.
func TestConvertRoundTrip(t *testing.T) {
	m := lease.Message{Type: lease.MsgGrant, Region: "eu", Session: 3, Term: 9, Seq: 4, Grant: 5, Version: 6, Base: 5,
		Full: true, Renew: true, Learning: true, TTL: 10 * time.Second, Hold: 20 * time.Second, Refresh: 3 * time.Second,
		Drift: 500 * time.Millisecond, Leader: "x:1",
		Entries: []lease.Entry{{Key: bucket.Key{Rule: "api", Subject: "t"}, Count: 10, Burst: 2}, {Key: bucket.Key{Rule: "api", Subject: "u"}, Drop: true}},
		Demand:  []lease.Demand{{Key: bucket.Key{Rule: "api", Subject: "t"}, Want: 99}},
		Budgets: []lease.Budget{{Rule: "api", Limit: bucket.PerMinute(600).WithBurst(60), Regions: []string{"eu", "us"},
			Weights: []int64{2, 1}, Reserve: 0.25, Policy: lease.Static}},
	}
	got := FromProto(ToProto(m))
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
}
