package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/allot-dev/allot/coordinator"
)

// TestCheck: `rules check` prints every region's floor as a quota (count
// per period, burst), rules included, notes a budget whose burst is too
// small for its floors, and rejects a document naming the bad field.
func TestCheck(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	_ = os.WriteFile(good, []byte(`
regions: [us, eu, ap]
weights: [2, 1, 1]
budgets:
  - rule: api
    limit: "6000 per minute, burst 100"
rules: |
  plans: {free: "10 per minute"}
  default_plan: free
  rules:
    - {name: search, match: {path: "/*"}, limit: plan, scope: global}
`), 0o644)
	// checked runs check on path and returns its output, which must hold
	// every one of wants.
	checked := func(path string, wants ...string) string {
		t.Helper()
		var out bytes.Buffer
		if err := check(path, &out); err != nil {
			t.Fatal(err)
		}
		for _, want := range wants {
			if !strings.Contains(out.String(), want) {
				t.Errorf("check output lacks %q:\n%s", want, out.String())
			}
		}
		return out.String()
	}
	out := checked(good,
		"2 budgets",
		"api: 6000 per minute, burst 100 (max-min); reserve 2000 per minute\n"+
			"  floors, what each region may use without a lease:\n"+
			"    us  2000 per minute, burst 33\n"+
			"    eu  1000 per minute, burst 16\n"+
			"    ap  1000 per minute, burst 16\n"+
			"    Σ   4000 per minute of the budget's 6000 per minute\n",
		"search/free: 10 per minute (max-min); reserve 4 per minute\n")
	if strings.Contains(out, "note:") {
		t.Errorf("a note for budgets whose floors carry a burst:\n%s", out)
	}
	// A burst smaller than the regions: every floor carries burst 0, and
	// check says what that means.
	small := filepath.Join(dir, "small.yaml")
	_ = os.WriteFile(small, []byte("regions: [us, eu, ap, sa, af]\nbudgets: [{rule: report, limit: \"600 per minute, burst 2\", reserve: 0.2}]\n"), 0o644)
	checked(small,
		"    us  96 per minute, burst 0\n",
		"  note: a share below 300 per minute carries burst 0 and admits nothing. Floors below it admit\n"+
			"  nothing without a lease; the coordinator leases the budget in shares of at least 300 per minute,\n"+
			"  to at most 2 region(s) at once\n")
	bad := filepath.Join(dir, "bad.yaml")
	_ = os.WriteFile(bad, []byte("regions: [us]\nbudgets: [{rule: x, limit: \"0 per second\"}]\n"), 0o644)
	err := check(bad, io.Discard)
	if !errors.Is(err, coordinator.ErrInvalidDocument) || !strings.Contains(err.Error(), bad+`:2: budgets[0].limit: quota "0 per second"`) {
		t.Fatalf("bad document: %v", err)
	}
}
