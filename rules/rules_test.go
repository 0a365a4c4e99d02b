package rules

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

var quiet = slog.New(slog.DiscardHandler)

func mustLoad(t *testing.T, path string) *Set {
	t.Helper()
	s, err := Load(path)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestParseExample(t *testing.T) {
	s := mustLoad(t, "testdata/example.yaml")
	if got := s.Version(); got != "example-1" {
		t.Errorf("Version() = %q, want example-1", got)
	}
	if s.Domain() != "edge" || s.DefaultPlan().Name != "free" || s.PlanKey() != KeyPlan {
		t.Errorf("domain %q default plan %q plan key %q", s.Domain(), s.DefaultPlan().Name, s.PlanKey())
	}
	if ni := s.NoIdentity(); ni.Action != DenyNoIdentity || ni.Status != 401 {
		t.Errorf("NoIdentity() = %+v", ni)
	}
	free, _ := s.Plan("free")
	if free.Limit != bucket.PerMinute(10) {
		t.Errorf("free = %v, want 10 per minute", free.Limit)
	}
	pro, _ := s.Plan("pro")
	if pro.Limit != bucket.PerSecond(100).WithBurst(300) {
		t.Errorf("pro = %v", pro.Limit)
	}
	api, ok := s.Rule("api")
	if !ok {
		t.Fatal("no rule api")
	}
	if api.Source != FromPlan || api.Scope != ScopeGlobal || api.Failure.Policy != Emergency ||
		api.Failure.Limit != bucket.PerSecond(5).WithBurst(60) || api.Shadow {
		t.Errorf("api = %+v", api)
	}
	login, _ := s.Rule("login")
	if login.Source != Fixed || login.Limit != bucket.PerMinute(5) || login.Scope != ScopeRegion ||
		login.Failure.Policy != FailOpen || !login.Shadow || len(login.SubjectKeys) != 1 {
		t.Errorf("login = %+v", login)
	}
	total, _ := s.Rule("search-total")
	if !total.Shared || total.Scope != ScopeLocal || total.Failure.Policy != FailClosed {
		t.Errorf("search-total = %+v", total)
	}
}

func TestMatchAndCost(t *testing.T) {
	s := mustLoad(t, "testdata/example.yaml")
	d := func(kv ...string) Descriptor {
		var out Descriptor
		for i := 0; i+1 < len(kv); i += 2 {
			out = append(out, Entry{kv[i], kv[i+1]})
		}
		return out
	}
	cases := []struct {
		d    Descriptor
		rule string
		cost bucket.Tokens
	}{
		{d("path", "/items", "method", "GET"), "api", 1},
		{d("path", "/report", "method", "GET"), "api", 5},
		{d("path", "/items/7", "method", "delete"), "api", 2},
		{d("path", "/items/7", "method", "GET"), "api", 1},
		{d("path", "/export", "method", "POST"), "export", 50},
		{d("endpoint", "login", "client_ip", "127.0.0.1"), "login", 1},
		{d("endpoint", "search"), "search-total", 1},
		{d("endpoint", "other"), "", 0},
	}
	for _, c := range cases {
		r, ok := s.Match(c.d)
		if c.rule == "" {
			if ok {
				t.Errorf("Match(%s) = %s, want none", c.d, r.Name)
			}
			continue
		}
		if !ok || r.Name != c.rule {
			t.Errorf("Match(%s) = %v, want %s", c.d, r, c.rule)
			continue
		}
		if got := r.CostOf(c.d); got != c.cost {
			t.Errorf("CostOf(%s) = %d, want %d", c.d, got, c.cost)
		}
	}
}

func TestSubjectOf(t *testing.T) {
	r := &Rule{SubjectKeys: []string{"tenant", "path"}}
	got, ok := r.SubjectOf(Descriptor{{"path", "/a&b=c"}, {"tenant", "t1"}}, "ignored")
	if !ok || got != "tenant=t1&path=/a%26b%3Dc" {
		t.Errorf("SubjectOf = %q %v", got, ok)
	}
	if _, ok := r.SubjectOf(Descriptor{{"tenant", "t1"}}, "x"); ok {
		t.Error("a missing subject key must mean no identity")
	}
	if _, ok := r.SubjectOf(Descriptor{{"tenant", ""}, {"path", "/"}}, "x"); ok {
		t.Error("an empty subject value must mean no identity")
	}
	id := &Rule{}
	if got, ok := id.SubjectOf(nil, "alice"); !ok || got != "alice" {
		t.Errorf("identity subject = %q %v", got, ok)
	}
	if _, ok := id.SubjectOf(nil, ""); ok {
		t.Error("empty identity must mean no identity")
	}
	shared := &Rule{Shared: true}
	if got, ok := shared.SubjectOf(nil, ""); !ok || got != SharedSubject {
		t.Errorf("shared subject = %q %v", got, ok)
	}
}

func TestLimitForUnknownPlan(t *testing.T) {
	base := `
default_plan: free
plans: {free: "10 per minute", pro: "100 per second"}
rules:
  - name: api
`
	for _, c := range []struct {
		action string
		want   UnknownPlanAction
		limit  bucket.Limit
	}{
		{"", UnknownPlanDefault, bucket.PerMinute(10)},
		{"unknown_plan: default_plan\n", UnknownPlanDefault, bucket.PerMinute(10)},
		{"unknown_plan: deny\n", UnknownPlanDeny, bucket.Limit{}},
		{"unknown_plan: allow\n", UnknownPlanAllow, bucket.Limit{}},
	} {
		s, err := Parse([]byte(c.action+base), "t.yaml")
		if err != nil {
			t.Fatal(err)
		}
		r, _ := s.Rule("api")
		res := s.LimitFor(r, "gold")
		if !res.Unknown || res.Action != c.want || res.Limit != c.limit || res.Plan != "gold" {
			t.Errorf("%q: LimitFor(gold) = %+v", c.action, res)
		}
		if res := s.LimitFor(r, ""); res.Unknown || res.Plan != "free" || res.Limit != bucket.PerMinute(10) {
			t.Errorf("LimitFor(\"\") = %+v, want the default plan", res)
		}
		if res := s.LimitFor(r, "pro"); res.Unknown || res.Limit != bucket.PerSecond(100) {
			t.Errorf("LimitFor(pro) = %+v", res)
		}
	}
}

func TestBudgets(t *testing.T) {
	s := mustLoad(t, "testdata/example.yaml")
	var got []string
	for _, b := range s.Budgets() {
		got = append(got, fmt.Sprintf("%s %s %v %s %s %v", b.Name, b.Rule, b.Plans, FormatQuota(b.Limit), b.Scope, b.Global()))
	}
	want := []string{
		"export/free export [free] 10 per minute global true",
		"export/pro export [pro] 100 per second, burst 300 global true",
		"api/free api [free] 10 per minute global true",
		"api/pro api [pro] 100 per second, burst 300 global true",
		"login login [] 5 per minute region false",
		"search-total search-total [] 1000 per second local false",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("Budgets():\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestBudgetsSharePlansWithEqualLimits: the edge charges a plan rule's key
// at its plan's limit, so plans with equal limits are one budget, named
// after the first of them.
func TestBudgetsSharePlansWithEqualLimits(t *testing.T) {
	s, err := Parse([]byte(`
default_plan: free
plans: {free: "10 per minute", trial: "10 per minute", pro: "100 per second"}
rules: [{name: api, limit: plan}]
`), "plans.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, b := range s.Budgets() {
		got = append(got, fmt.Sprintf("%s %v %s", b.Name, b.Plans, FormatQuota(b.Limit)))
	}
	want := "api/free [free trial] 10 per minute\napi/pro [pro] 100 per second"
	if strings.Join(got, "\n") != want {
		t.Errorf("Budgets():\n%s\nwant:\n%s", strings.Join(got, "\n"), want)
	}
}

func TestParseQuota(t *testing.T) {
	ok := map[string]bucket.Limit{
		"10 per minute":             bucket.PerMinute(10),
		"100 per second, burst 300": bucket.PerSecond(100).WithBurst(300),
		"5/s":                       bucket.PerSecond(5),
		"1000 per 10 minutes":       bucket.Per(1000, 10*time.Minute),
		"1 per day":                 bucket.Per(1, 24*time.Hour),
		"  7 PER Hour ":             bucket.PerHour(7),
		"3 per 250 ms":              bucket.Per(3, 250*time.Millisecond),
	}
	for in, want := range ok {
		got, err := ParseQuota(in)
		if err != nil || got != want {
			t.Errorf("ParseQuota(%q) = %v, %v; want %v", in, got, err, want)
		}
		if back, err := ParseQuota(FormatQuota(got)); err != nil || back != got {
			t.Errorf("FormatQuota(%v) = %q does not parse back: %v %v", got, FormatQuota(got), back, err)
		}
	}
	bad := map[string]string{
		"0 per minute":           "rate count=0",
		"10 per minute, burst 0": "burst=0",
		"10 per 0 seconds":       "period=0",
		"10 per fortnight":       `unknown unit "fortnight"`,
		"ten per minute":         "want",
		"-1 per second":          "want",
		"99999999999999 per s":   "out of range",
		"1 per 400 days":         "longer than a year",
	}
	for in, want := range bad {
		_, err := ParseQuota(in)
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), in) {
			t.Errorf("ParseQuota(%q) error = %v, want it to name the input and say %q", in, err, want)
		}
	}
}

// TestValidationListsEveryProblem checks that one bad file reports all its
// problems at once, each with its line and field.
func TestValidationListsEveryProblem(t *testing.T) {
	src := `version: bad-1
default_plan: gold
colour: blue
plans:
  free: "0 per minute"
  pro: "10 per second, burst 4"
rules:
  - name: api
    match: {path: /api/*}
    cost: 5
    limit: plan
    scope: planet
  - name: api
    limit: "3 per minute"
  - name: catchall
    limit: "3 per minute"
    costs:
      - {path: /big, cost: 9}
  - name: after-catchall
    match: {path: /x}
    limit: "9 per minute"
    on_unavailable: {policy: fail_open, limit: "1 per second"}
  - name: emergency-small
    match: {tenant: t}
    limit: "9 per minute"
    cost: 3
    on_unavailable: {policy: emergency, limit: "1 per second, burst 2"}
    shadow: maybe
`
	_, err := Parse([]byte(src), "bad.yaml")
	var ve *ValidationError
	if !errors.As(err, &ve) || !errors.Is(err, ErrInvalid) {
		t.Fatalf("Parse error = %v, want a *ValidationError wrapping ErrInvalid", err)
	}
	want := []string{
		`bad.yaml:2: default_plan: plan "gold" is not defined under plans (defined: pro)`,
		`bad.yaml:3: colour: unknown key "colour"`,
		`bad.yaml:5: plans.free: quota "0 per minute": rate count=0 must be > 0`,
		`bad.yaml:10: rules[0].cost: cost 5 exceeds the burst of every plan (pro 4)`,
		`bad.yaml:12: rules[0].scope: unknown scope "planet"`,
		`bad.yaml:13: rules[1].name: duplicate rule name "api" (first at line 8)`,
		`bad.yaml:18: rules[2].costs[0].cost: cost 9 exceeds the burst 3 of the rule's limit "3 per minute"`,
		`bad.yaml:19: rules[3].match: rule "after-catchall" is unreachable: rule "catchall" (line 15)`,
		`bad.yaml:22: rules[3].on_unavailable.limit: a limit applies only to policy emergency, not fail_open`,
		`bad.yaml:23: rules[4].match: rule "emergency-small" is unreachable: rule "catchall" (line 15)`,
		`bad.yaml:27: rules[4].on_unavailable.limit: cost 3 exceeds the emergency burst 2`,
		`bad.yaml:28: rules[4].shadow: want true or false, got "maybe"`,
	}
	got := make([]string, len(ve.Problems))
	for i, p := range ve.Problems {
		got[i] = p.String()
	}
	if len(got) != len(want) {
		t.Errorf("got %d problems, want %d:\n%s", len(got), len(want), strings.Join(got, "\n"))
	}
	for i := range min(len(got), len(want)) {
		if !strings.HasPrefix(got[i], want[i]) {
			t.Errorf("problem %d:\n got %s\nwant %s…", i, got[i], want[i])
		}
	}
}

func TestValidationSmallCases(t *testing.T) {
	cases := map[string]string{
		``:                        "file is empty",
		`rules: [`:                "not valid YAML",
		`plans: {}`:               "rules: missing",
		`rules: []`:               "rules: empty",
		`rules: {a: 1}`:           "rules: want a list",
		"rules:\n  - limit: plan": "rules[0].name: missing",
		"rules:\n  - name: a\n    limit: \"1 per second\"\n    costs: [{cost: 1}]":  "rules[0].costs[0]: needs a method or a path",
		"rules:\n  - name: a\n    limit: \"1 per second\"\n    costs: [{path: /x}]": "rules[0].costs[0].cost: missing",
		"rules:\n  - name: a\n    limit: plan":                                      "default_plan: missing",
		"rules:\n  - name: a\n    limit: \"2 per second\"\n    cost: 1.5":           `rules[0].cost: want a whole number, got "1.5"`,
		"rules:\n  - name: a\n    limit: \"2 per second\"\n    cost: 0":             "rules[0].cost: 0 out of range",
		"rules:\n  - name: 'a b'\n    limit: \"2 per second\"":                      `rule name "a b"`,
		"x: &a 1\nrules:\n  - name: a\n    limit: *a":                               "aliases are not supported",
		"no_identity: {status: 200}\nrules:\n  - name: a\n    limit: \"1/s\"":       "no_identity.status: 200 out of range [400, 599]",
		"unknown_plan: unlimited\nrules:\n  - name: a\n    limit: \"1/s\"":          `unknown action "unlimited"`,
		"rules:\n  - name: a\n    limit: \"1/s\"\n    subject: everyone":            `unknown subject "everyone"`,
		"rules:\n  - name: a\n    limit: \"1/s\"\n    match: {path: [1]}":           "rules[0].match.path: want a string",
		"rules:\n  - name: a\n    limit: \"1/s\"\n    limit: \"2/s\"":               "rules[0].limit: duplicate key (first at line 3)",
	}
	for src, want := range cases {
		_, err := Parse([]byte(src), "c.yaml")
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "c.yaml") {
			t.Errorf("Parse(%q) = %v, want an error naming c.yaml with %q", src, err, want)
		}
	}
}

func TestVersionDefaultsToDigest(t *testing.T) {
	src := []byte("rules:\n  - name: a\n    limit: \"1/s\"\n")
	s, err := Parse(src, "v.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if v := s.Version(); !strings.HasPrefix(v, "sha256:") || len(v) != len("sha256:")+12 || !strings.HasPrefix(s.Digest(), v[7:]) {
		t.Errorf("Version() = %q, Digest() = %q", v, s.Digest())
	}
}

func TestReloaderKeepsLastGoodRules(t *testing.T) {
	good := []byte("version: v1\nrules:\n  - name: a\n    limit: \"1/s\"\n")
	s, err := Parse(good, "mem")
	if err != nil {
		t.Fatal(err)
	}
	var updates []Update
	h := NewReloader(s, quiet, func(u Update) { updates = append(updates, u) })
	if u := h.Apply(good, "mem"); u.Changed || u.Err != nil {
		t.Errorf("identical bytes: %+v", u)
	}
	u := h.Apply([]byte("version: v2\nrules:\n  - name: a\n    limit: \"0/s\"\n"), "mem")
	if u.Changed || u.Err == nil || h.Current() != s {
		t.Errorf("bad update: changed=%v err=%v current=%s", u.Changed, u.Err, h.Current().Version())
	}
	u = h.Apply([]byte("version: v3\nrules:\n  - name: b\n    limit: \"2/s\"\n"), "mem")
	if !u.Changed || u.Err != nil || h.Current().Version() != "v3" || u.Old != s {
		t.Errorf("good update: %+v", u)
	}
	if len(updates) != 3 {
		t.Errorf("notify called %d times, want 3", len(updates))
	}
}

func TestFileWatcherReload(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rules.yaml")
	write := func(s string) {
		t.Helper()
		// Write a new file and rename it over the old one, as editors do.
		tmp := path + ".tmp"
		if err := os.WriteFile(tmp, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, path); err != nil {
			t.Fatal(err)
		}
	}
	write("version: one\nrules:\n  - name: a\n    limit: \"1/s\"\n")
	cfg := DefaultWatchConfig()
	cfg.Logger = quiet
	w, err := WatchFile(path, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if w.Current().Version() != "one" {
		t.Fatalf("version %q", w.Current().Version())
	}
	write("version: two\nrules:\n  - name: a\n    limit: \"0/s\"\n")
	if u := w.Reload(); u.Err == nil || !strings.Contains(u.Err.Error(), path+":4: rules[0].limit") || w.Current().Version() != "one" {
		t.Errorf("bad file: err=%v version=%s", u.Err, w.Current().Version())
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if u := w.Reload(); u.Err == nil || w.Current().Version() != "one" {
		t.Errorf("missing file: err=%v version=%s", u.Err, w.Current().Version())
	}
	write("version: three\nrules:\n  - name: a\n    limit: \"2/s\"\n")
	if u := w.Reload(); !u.Changed || w.Current().Version() != "three" {
		t.Errorf("good file: %+v version=%s", u, w.Current().Version())
	}
	if _, err := WatchFile(filepath.Join(dir, "none.yaml"), DefaultWatchConfig()); err == nil || !strings.Contains(err.Error(), "none.yaml") {
		t.Errorf("WatchFile of a missing file: %v", err)
	}
	if _, err := WatchFile(path, WatchConfig{}); err == nil || !strings.Contains(err.Error(), "interval=0s") {
		t.Errorf("WatchFile with interval 0: %v", err)
	}
}

// TestLargeFiles checks the bounds: the most rules allowed parse quickly
// (the unreachable-rule check is quadratic), one more is refused.
func TestLargeFiles(t *testing.T) {
	gen := func(n int) []byte {
		var b strings.Builder
		b.WriteString("rules:\n")
		for i := range n {
			fmt.Fprintf(&b, "  - {name: r%d, match: {path: /p%d, method: GET}, limit: \"1/s\"}\n", i, i)
		}
		return []byte(b.String())
	}
	start := time.Now()
	s, err := Parse(gen(MaxRules), "big.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(s.Rules()) != MaxRules {
		t.Fatalf("%d rules", len(s.Rules()))
	}
	t.Logf("%d rules parsed and validated in %s", MaxRules, time.Since(start))
	if _, err := Parse(gen(MaxRules+1), "big.yaml"); err == nil || !strings.Contains(err.Error(), "rules: 4097 rules, more than the 4096 allowed") {
		t.Errorf("too many rules: %v", err)
	}
}
