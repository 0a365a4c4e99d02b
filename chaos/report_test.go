package chaos

import (
	"strings"
	"testing"
)

// TestSummaryCountsMoves: the summary ends with the moves that came within
// their convergence limit out of all the runs' shifts, naming the others,
// and says nothing of moves when no run had one.
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

	b.Reset()
	PrintSummary(&b, []*Result{{Scenario: "redis-cut", Checks: []CheckResult{{Name: "one speaker", Pass: true}}}})
	if strings.Contains(b.String(), "moves") {
		t.Fatalf("a summary without shifts speaks of moves:\n%s", b.String())
	}
}
