package sim

import (
	"testing"
)

// target is what allot must reach on every measured budget of a scenario,
// in its normal and tight forms, against the ideal bucket (util) and the
// static split on the same budget (vsStatic: allot's utilization less the
// static split's). Where the design's target is not reached, the entry
// holds the figure reached, below the target, and says so: the test then
// guards against losing more, and docs/design.md ("Utilization where
// demand moves") gives the gap.
type target struct {
	file string
	// contested is the least utilization of a budget whose demand exceeds
	// it; all, of every measured budget.
	contested, all float64
	// vsStatic is the least difference to the static split on one budget.
	vsStatic float64
	// miss names the design target the entry falls short of, if any.
	miss string
}

// targets are checked at targetScale, seed 1; the floors of the entries
// that miss their design target are the figures reached less 0.03.
var targets = []target{
	// Steady demand exceeding the budget in every region for the Zipf head:
	// worst contested budget 0.870 (tight 0.842), 0.026 below the static
	// split on the budget a static split serves best.
	{file: "01-steady-skewed.yaml", contested: 0.81, all: 0.81, vsStatic: -0.06,
		miss: "≥ 0.95 of the ideal on contested budgets, never below the static split"},
	// One shift: 0.918 (tight 0.929), 0.46 above the static split.
	{file: "02-demand-shift.yaml", contested: 0.88, all: 0.88, vsStatic: 0,
		miss: "≥ 0.95 of the ideal"},
	// One shift to a new hot key: worst 0.902 (tight 0.893), 0.014 (0.023)
	// below the static split.
	{file: "03-flash-crowd.yaml", contested: 0.86, all: 0.86, vsStatic: -0.06,
		miss: "≥ 0.95 of the ideal on contested budgets, never below the static split"},
	// The hot region changes every 2 refresh intervals: 0.659 (tight
	// 0.642), above the static split.
	{file: "26-rotating-hot.yaml", contested: 0.61, all: 0.61, vsStatic: 0,
		miss: "≥ 0.90 of the ideal"},
	// Every 1.5 refresh intervals, lease messages duplicated and reordered:
	// 0.542 (tight 0.516), 0.094 (0.030) below the static split.
	{file: "27-rotating-hot-dup-reorder.yaml", contested: 0.48, all: 0.48, vsStatic: -0.13,
		miss: "never below the static split"},
	// Diurnal demand 8 h apart: worst 0.906 and never below the static
	// split; tight, 0.835 and 0.106 below it on one budget.
	{file: "28-follow-the-sun.yaml", contested: 0.80, all: 0.80, vsStatic: -0.14,
		miss: "never below the static split in the tight form"},
}

// targetScale is the load the targets are checked at: a quarter of the
// library's, enough that a tight form's bursts (a tenth of a second of
// rate) still hold tens of tokens; the library's test scale (a twentieth)
// leaves them a few tokens, which no split can share.
const targetScale = 0.25

// TestUtilizationTargets runs the scenarios whose demand moves, normal and
// tight, and checks every measured budget against its target.
func TestUtilizationTargets(t *testing.T) {
	if raceEnabled {
		t.Skip("figures, not races: TestLibraryWithinBounds races the same code paths")
	}
	for _, tg := range targets {
		sc, err := LoadScenario("scenarios/" + tg.file)
		if err != nil {
			t.Fatal(err)
		}
		tight, err := sc.Tight()
		if err != nil {
			t.Fatal(err)
		}
		for _, form := range []*Scenario{sc, tight} {
			small, err := form.Scaled(targetScale)
			if err != nil {
				t.Fatal(err)
			}
			res, err := Run(small, 1, Options{Systems: []string{"allot", "static"}})
			if err != nil {
				t.Fatal(err)
			}
			al := res.Systems[0]
			if tg.miss != "" {
				t.Logf("%s: short of the design target: %s", form.Name, tg.miss)
			}
			for _, ro := range al.Rules {
				var vs float64
				if ro.VsStatic != nil {
					vs = *ro.VsStatic
				}
				t.Logf("%s %s: util %.3f, worst %.3f (k%d), mean %.3f, vs static %+.3f (k%d), converge %v",
					form.Name, ro.Rule, ro.Utilization, ro.WorstUtilization, ro.WorstUtilKey, ro.MeanUtilization, vs, ro.VsStaticKey, convCell(al))
				for _, b := range ro.Budgets {
					min := tg.all
					if b.Contested {
						min = tg.contested
					}
					if b.Utilization < min {
						t.Errorf("%s %s key %d (contested %v): utilization %.3f, want ≥ %.2f", form.Name, ro.Rule, b.Key, b.Contested, b.Utilization, min)
					}
				}
				if ro.VsStatic != nil && *ro.VsStatic < tg.vsStatic {
					t.Errorf("%s %s key %d: %.3f below the static split, want at most %.2f", form.Name, ro.Rule, ro.VsStaticKey, -*ro.VsStatic, -tg.vsStatic)
				}
			}
		}
	}
}
