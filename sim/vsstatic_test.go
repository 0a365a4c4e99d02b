package sim

import (
	"strings"
	"testing"
)

// TestBehindStaticOf: a budget counts as behind where the static split's
// utilization is strictly greater at every seed it was measured at, and on
// the mean over those seeds; a run without the static split is left out.
func TestBehindStaticOf(t *testing.T) {
	run := func(seed uint64, allot, static map[int]float64) *Result {
		sys := func(name string, us map[int]float64) SystemResult {
			ro := RuleOutcome{Rule: "api"}
			for k, u := range us {
				ro.Budgets = append(ro.Budgets, BudgetOutcome{Key: k, Utilization: u})
			}
			return SystemResult{Name: name, Rules: []RuleOutcome{ro}}
		}
		return &Result{Scenario: "s", Seed: seed, Systems: []SystemResult{sys("allot", allot), sys("static", static)}}
	}
	results := []*Result{
		// k0: static ahead at both seeds (gap 0.10 and 0.02, mean 0.06).
		// k1: ahead at seed 1 only, and on the mean (0.20 − 0.05).
		// k2: ahead at neither (equal at seed 1).
		// k3: measured at seed 1 only, behind there by 0.10.
		// k4: measured at seed 1 only, equal there: not behind.
		run(1, map[int]float64{0: 0.80, 1: 0.70, 2: 0.90, 3: 0.50, 4: 0.75}, map[int]float64{0: 0.90, 1: 0.90, 2: 0.90, 3: 0.60, 4: 0.75}),
		run(2, map[int]float64{0: 0.88, 1: 0.95, 2: 0.95}, map[int]float64{0: 0.90, 1: 0.90, 2: 0.80}),
		// A run without the static split is skipped.
		{Scenario: "s", Seed: 3, Systems: []SystemResult{{Name: "allot", Rules: []RuleOutcome{{Rule: "api", Budgets: []BudgetOutcome{{Key: 0, Utilization: 0}}}}}}},
	}
	rows := BehindStaticOf(results)
	if len(rows) != 1 {
		t.Fatalf("rows %+v, want one", rows)
	}
	r := rows[0]
	if r.Budgets != 5 || r.Seeds != 2 || r.Every != 2 || r.OnMean != 3 || r.GapKey != 3 || r.Gap < 0.0999 || r.Gap > 0.1001 {
		t.Fatalf("row %+v, want 5 budgets over 2 seeds, 2 behind at every seed (k0, k3), 3 on the mean, largest gap 0.10 at k3", r)
	}
	if r.ClearBudgets != 0 || r.ClearEvery != 0 || r.ClearGapKey != -1 {
		t.Fatalf("row %+v: clear figures without clear windows", r)
	}
	// Clear windows: k0 behind there at both seeds (0.02, 0.04), k1 at
	// seed 1 only; k2 has clear windows at seed 1 alone, so it is not
	// counted.
	clear := func(seed uint64, allot, static map[int]float64) *Result {
		r := run(seed, allot, static)
		for si := range r.Systems {
			us := allot
			if r.Systems[si].Name == "static" {
				us = static
			}
			bs := r.Systems[si].Rules[0].Budgets
			for i := range bs {
				if u, ok := us[bs[i].Key+10]; ok {
					bs[i].ClearIdealTokens, bs[i].ClearUtilization = 100, u
				}
			}
		}
		return r
	}
	results2 := []*Result{
		clear(1, map[int]float64{0: 0.8, 1: 0.8, 2: 0.8, 10: 0.96, 11: 0.97, 12: 0.9}, map[int]float64{0: 0.9, 1: 0.9, 2: 0.9, 10: 0.98, 11: 0.98, 12: 0.95}),
		clear(2, map[int]float64{0: 0.8, 1: 0.8, 2: 0.8, 10: 0.95, 11: 0.99}, map[int]float64{0: 0.9, 1: 0.9, 2: 0.9, 10: 0.99, 11: 0.98}),
	}
	r = BehindStaticOf(results2)[0]
	if r.ClearBudgets != 2 || r.ClearEvery != 1 || r.ClearGapKey != 0 || r.ClearGap < 0.0299 || r.ClearGap > 0.0301 {
		t.Fatalf("row %+v, want 2 budgets with clear windows at every seed, 1 behind there at every seed (k0 by 0.03)", r)
	}
	var b strings.Builder
	if err := WriteBehindStatic(&b, results); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(b.String(), "0.100 (k3)") {
		t.Fatalf("table %q lacks the largest gap", b.String())
	}
	b.Reset()
	if err := WriteBehindStatic(&b, results[2:]); err != nil || b.Len() != 0 {
		t.Fatalf("without the static split: %q, %v; want nothing", b.String(), err)
	}
}
