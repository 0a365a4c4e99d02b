package chaos

import (
	"strings"
	"testing"
)

// TestSummaryCountsMoves: the summary ends with the moves that came within
// their convergence limit out of all the runs' shifts, naming the others
// (with the run's seed when a scenario ran at several), and says nothing
// of moves when no run had one.
func TestSummaryCountsMoves(t *testing.T) {
	conv := func(subject, value string, pass bool) CheckResult {
		return CheckResult{Name: CheckConvergence, Subject: subject, Value: value, Limit: "1.5s", Pass: pass}
	}
	results := []*Result{
		{Scenario: "healthy", Checks: []CheckResult{
			{Name: "one speaker", Subject: "us", Pass: true},
			conv("eu api/k0 at 15s", "0.40s", true),
			conv("ap api/k0 at 30s", "0.60s", true),
		}},
		{Scenario: "coordinator-cut", Checks: []CheckResult{
			conv("eu api/k0 at 15s", "0.80s", true),
			conv("ap api/k0 at 30s", "6.00s", false),
			{Name: "no false outage", Pass: false},
		}},
		{Scenario: "redis-slow", Checks: []CheckResult{
			conv("us api/k0 at 45s", "never (at most 0.90 of the fair 750/s)", false),
		}},
	}
	var b strings.Builder
	PrintSummary(&b, results)
	want := "moves within their convergence limit: 3 of 5; slower: coordinator-cut ap api/k0 at 30s: 6.00s, " +
		"redis-slow us api/k0 at 45s: never (at most 0.90 of the fair 750/s)\n"
	if !strings.HasSuffix(b.String(), want) {
		t.Fatalf("summary ends\n%q\nwant\n%q", b.String()[strings.LastIndex(strings.TrimSuffix(b.String(), "\n"), "\n")+1:], want)
	}

	// One scenario at two seeds (chaos -seeds): every run is named with
	// its seed, in the table and among the slower moves.
	b.Reset()
	PrintSummary(&b, []*Result{
		{Scenario: "coordinator-slow", Seed: 1, Checks: []CheckResult{conv("ap api/k0 at 30s", "1.503s", false)}},
		{Scenario: "coordinator-slow", Seed: 2, Checks: []CheckResult{conv("ap api/k0 at 30s", "1.402s", true)}},
	})
	want = "moves within their convergence limit: 1 of 2; slower: coordinator-slow seed 1 ap api/k0 at 30s: 1.503s\n"
	if !strings.HasSuffix(b.String(), want) || !strings.Contains(b.String(), "\ncoordinator-slow seed 2 ") {
		t.Fatalf("summary at two seeds:\n%s\nwant each run named with its seed, ending %q", b.String(), want)
	}

	b.Reset()
	PrintSummary(&b, []*Result{{Scenario: "redis-cut", Checks: []CheckResult{{Name: "one speaker", Pass: true}}}})
	if strings.Contains(b.String(), "moves") {
		t.Fatalf("a summary without shifts speaks of moves:\n%s", b.String())
	}
}
