package rules

import (
	"fmt"
	"strings"
	"testing"
	"unsafe"

	"github.com/allot-dev/allot/bucket"
)

// FuzzCompiledCondition: a condition compiled when its set is parsed holds
// for exactly the descriptors the condition as written holds for.
func FuzzCompiledCondition(f *testing.F) {
	for _, c := range [][3]string{
		{"path", "/api/*", "/api/x"}, {"path", "/api/*", "/ap"}, {"path", "*", ""},
		{"path", "", "x"}, {"m", "GET", "GET"}, {"m", "GET", "get"}, {"m", "a*", "a"},
		{"m", "**", "*"}, {"m", "*x", "*x"}, {"m", "x", ""},
	} {
		f.Add(c[0], c[1], c[2], true)
		f.Add(c[0], c[1], c[2], false)
	}
	f.Fuzz(func(t *testing.T, key, pattern, value string, present bool) {
		c := Condition{Key: key, Pattern: pattern}
		d := Descriptor{{Key: "other", Value: value}}
		if present {
			d = append(d, Entry{Key: key, Value: value})
		}
		written := &Rule{Match: []Condition{c}}
		compiled := &Rule{Match: []Condition{c}}
		compiled.compile()
		if got, want := compiled.Matches(d), written.Matches(d); got != want {
			t.Fatalf("rule on %q=%q, %s: compiled %v, written %v", key, pattern, d, got, want)
		}
	})
}

// TestResolveAsTheMap: Resolve finds a plan by comparing names in turn in
// a set of few plans and by the plans' map in a set of many, and either
// way gives what the plans' map gives: the plan's limit, the default plan's
// for no plan, and the unknown-plan handling for a plan not in the set.
func TestResolveAsTheMap(t *testing.T) {
	for _, n := range []int{1, maxScannedPlans, maxScannedPlans + 1, 3 * maxScannedPlans} {
		var plans []string
		for i := range n {
			plans = append(plans, fmt.Sprintf("p%d: \"%d per second\"", i, i+1))
		}
		src := fmt.Sprintf("default_plan: p%d\nunknown_plan: deny\nplans: {%s}\nrules:\n  - {name: fixed, match: {path: /f}, limit: \"7 per minute\"}\n  - {name: api, limit: plan}\n",
			n-1, strings.Join(plans, ", "))
		s, err := Parse([]byte(src), "t.yaml")
		if err != nil {
			t.Fatal(err)
		}
		api, _ := s.Rule("api")
		for i := range n {
			name := fmt.Sprintf("p%d", i)
			want := Resolution{Limit: s.plans[name].Limit, Plan: name}
			if got := *s.Resolve(api, name); got != want {
				t.Errorf("%d plans: Resolve(%s) = %+v, want %+v", n, name, got, want)
			}
			if got := s.LimitFor(api, name); got != want {
				t.Errorf("%d plans: LimitFor(%s) = %+v, want %+v", n, name, got, want)
			}
		}
		def := fmt.Sprintf("p%d", n-1)
		if got, want := *s.Resolve(api, ""), (Resolution{Limit: bucket.PerSecond(bucket.Tokens(n)), Plan: def}); got != want {
			t.Errorf("%d plans: Resolve(\"\") = %+v, want the default plan's %+v", n, got, want)
		}
		if got, want := *s.Resolve(api, "gold"), (Resolution{Plan: "gold", Unknown: true, Action: UnknownPlanDeny}); got != want {
			t.Errorf("%d plans: Resolve(gold) = %+v, want %+v", n, got, want)
		}
		fixed, _ := s.Rule("fixed")
		for _, plan := range []string{"p0", ""} {
			if got, want := *s.Resolve(fixed, plan), (Resolution{Limit: bucket.PerMinute(7)}); got != want {
				t.Errorf("%d plans: Resolve(fixed, %q) = %+v, want %+v", n, plan, got, want)
			}
		}
	}
}

// TestParsedSubjectAsWritten: a parsed rule gives the subject a rule
// written as a literal gives, for each kind of subject: the identity,
// shared, and descriptor keys.
func TestParsedSubjectAsWritten(t *testing.T) {
	set, err := Parse([]byte(`rules:
  - {name: id, match: {path: /i}, limit: "1 per second"}
  - {name: shared, match: {path: /s}, limit: "1 per second", subject: shared}
  - {name: keys, match: {path: /k}, limit: "1 per second", subject: [tenant]}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range set.rules {
		written := &Rule{Name: r.Name, Shared: r.Shared, SubjectKeys: r.SubjectKeys}
		for _, d := range []Descriptor{nil, {{Key: "tenant", Value: "t1"}}, {{Key: "tenant", Value: ""}}} {
			for _, identity := range []string{"", "alice"} {
				got, gotOK := r.SubjectOf(d, identity)
				want, wantOK := written.SubjectOf(d, identity)
				if got != want || gotOK != wantOK {
					t.Errorf("rule %s, %s, identity %q: parsed %q %v, written %q %v", r.Name, d, identity, got, gotOK, want, wantOK)
				}
			}
		}
	}
}

// TestGetComparesAsStrings: Get finds a key as == would, whether it is the
// well-known constant, a copy of it, or another key of the same length
// that differs at its start, its middle or its end.
func TestGetComparesAsStrings(t *testing.T) {
	copyOf := func(s string) string { return string([]byte(s)) }
	d := Descriptor{{Key: "path", Value: "/a"}, {Key: "", Value: "empty"}, {Key: "pbth", Value: "b"}, {Key: copyOf(KeyPlan), Value: "pro"}}
	for _, c := range []struct {
		key, want string
		ok        bool
	}{
		{KeyPath, "/a", true}, {copyOf(KeyPath), "/a", true}, {"", "empty", true}, {KeyPlan, "pro", true},
		{"pbth", "b", true}, {"qath", "", false}, {"patg", "", false}, {"pat", "", false}, {KeyMethod, "", false},
	} {
		if v, ok := d.Get(c.key); v != c.want || ok != c.ok {
			t.Errorf("Get(%q) = %q, %v; want %q, %v", c.key, v, ok, c.want, c.ok)
		}
	}
	// A key from a file is the constant itself once compiled.
	set, err := Parse([]byte("plan_key: "+copyOf(KeyPlan)+"\nrules:\n  - name: r\n    match: {path: \"/*\"}\n    limit: \"1 per second\"\n"), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	r := set.rules[0]
	if unsafe.StringData(r.matchers[0].key) != unsafe.StringData(KeyPath) || unsafe.StringData(set.PlanKey()) != unsafe.StringData(KeyPlan) {
		t.Error("a well-known key parsed from a file is not the package's constant")
	}
}
