package sim

import (
	"testing"
	"time"
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
	// converge is the most refresh intervals a demand shift may take to
	// reach 95% of the ideal (0: the scenario's convergence is not
	// checked).
	converge float64
	// miss names the design target the entry falls short of, if any.
	miss string
}

// targets are checked at targetScale, seed 1. The floors of the entries
// that miss their design target are the figures reached less 0.03, and a
// missed convergence the figure reached plus half a refresh interval; the
// figures below are this scale's (docs/design.md gives full scale's).
var targets = []target{
	// Steady demand exceeding the budget in every region for the Zipf head:
	// worst contested budget 0.936 (tight 0.876), 0.011 (0.006) below the
	// static split on the budget a static split serves best (0.016 before
	// a key over its allocation took batches of the allocation's rate).
	{file: "01-steady-skewed.yaml", contested: 0.84, all: 0.84, vsStatic: -0.04,
		miss: "≥ 0.95 of the ideal on contested budgets, never below the static split"},
	// One shift: 0.964 (tight 0.971), 0.51 above the static split;
	// converges in 0.38 (0.38) refresh intervals.
	{file: "02-demand-shift.yaml", contested: 0.91, all: 0.91, vsStatic: 0, converge: 3,
		miss: "≥ 0.95 of the ideal"},
	// One shift to a new hot key: worst 0.968 (tight 0.942), 0.005 (0.006)
	// below the static split; converges in 0.38 (0.12) refresh intervals.
	{file: "03-flash-crowd.yaml", contested: 0.91, all: 0.91, vsStatic: -0.04, converge: 3,
		miss: "≥ 0.95 of the ideal on contested budgets, never below the static split"},
	// The region holding the budget cut from the coordinator while the
	// demand stays: 0.970 (tight 0.968), 0.21 above the static split.
	{file: "04-coordinator-cut.yaml", contested: 0.91, all: 0.91, vsStatic: 0,
		miss: "≥ 0.95 of the ideal"},
	// An agent of the busy region crashes: 0.967 (tight 0.971) here, 0.27
	// above the static split; not claimed when it read 0.948 at full scale
	// (0.976 on average over seeds 1–10 now).
	{file: "14-agent-crash.yaml", contested: 0.92, all: 0.92, vsStatic: 0,
		miss: "≥ 0.95 of the ideal (at full scale)"},
	// The hot region changes every 2 refresh intervals: 0.922 (tight
	// 0.891; 0.894 and 0.883 on an earlier tree, whose moves converged
	// within 1.50 (2.38); 0.879 and 0.866 at c400c73, before a run of demand windows
	// was read from after its first; 0.868 before a falling reading stopped
	// starting a hold, 0.843 and 0.834 before tables and adoptions were
	// announced, 0.837 and 0.818 at c44c0f5), above the static split; each
	// move reaches 95% of the ideal within 2.38 (2.38; 2.50 at c400c73)
	// refresh intervals.
	{file: "26-rotating-hot.yaml", contested: 0.81, all: 0.81, vsStatic: 0, converge: 3,
		miss: "≥ 0.90 of the ideal"},
	// Every 1.5 refresh intervals, lease messages duplicated and reordered:
	// 0.809 (tight 0.759), 0.173 (0.213) above the static split (the floor
	// on utilization guards, no design target sets it); the slowest of 20
	// moves converges in 1.38 (tight 2.12) refresh intervals at this scale
	// since a run of demand windows is read from after its first (4.25 and
	// 3.75 before, when the entry allowed 4.75; 2.50 and 2.75 before a met
	// region's demand was shared less the headroom). The figure swings with
	// the seed; at full scale every move converged within 2.75 at seeds
	// 1–10.
	{file: "27-rotating-hot-dup-reorder.yaml", contested: 0.68, all: 0.68, vsStatic: 0, converge: 3},
	// Diurnal demand 8 h apart: worst 0.949 and never below the static
	// split; tight, 0.849 and 0.079 below it on one budget.
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
			if tg.converge > 0 && (al.ConvergenceRefreshes == nil || *al.ConvergenceRefreshes > tg.converge) {
				t.Errorf("%s: converges in %s, want within %.2f refresh intervals", form.Name, convCell(al), tg.converge)
			}
		}
	}
}

// TestSteadyLeaseMessages: in steady-skewed, at full scale, lease messages
// in steady state stay within the design's target of 10 per region per
// refresh interval (15 a second for three regions at refresh 2 s), and the
// worst budget whose demand exceeds it reaches the design's 0.95 of the
// ideal, in both forms (0.958 and 0.958 at seed 1; 0.948 in the normal
// form before the first leader started its reserves full, which is what
// the start of the run cost), and every region holds its fair share of
// the hottest budget from 1 s on. It runs
// at full scale because the band in which allocations stay put is a share
// of each budget: at a quarter of the load every budget is four times
// smaller against a demand noise only twice smaller, and the same run sends
// about 41 a second.
func TestSteadyLeaseMessages(t *testing.T) {
	if raceEnabled {
		t.Skip("figures, not races: TestLibraryWithinBounds races the same code paths")
	}
	sc, err := LoadScenario("scenarios/01-steady-skewed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	tight, err := sc.Tight()
	if err != nil {
		t.Fatal(err)
	}
	for _, form := range []*Scenario{sc, tight} {
		res, err := Run(form, 1, Options{Systems: []string{"allot"}})
		if err != nil {
			t.Fatal(err)
		}
		al := res.Systems[0]
		if al.SteadyMsgsPerS == nil {
			t.Fatalf("%s: no steady bins: the run measures no steady message rate", form.Name)
		}
		t.Logf("%s: steady lease messages %.1f a second", form.Name, *al.SteadyMsgsPerS)
		if *al.SteadyMsgsPerS > 15 {
			t.Errorf("%s: steady lease messages %.1f a second, want ≤ 15", form.Name, *al.SteadyMsgsPerS)
		}
		measured := 0
		for _, ro := range al.Rules {
			for _, b := range ro.Budgets {
				if !b.Contested {
					continue
				}
				measured++
				if b.Utilization < 0.95 {
					t.Errorf("%s %s key %d: utilization %.3f of the ideal, want ≥ 0.95", form.Name, ro.Rule, b.Key, b.Utilization)
				}
			}
		}
		if measured == 0 {
			t.Fatalf("%s: no contested budget measured", form.Name)
		}
		// The charted budget is the hottest, over its share in every
		// region: from 1 s on (learning ends at 0.4 s) each region holds
		// its fair share. A grant reordered behind the next one used to
		// leave ap-south on its floor (140) until 2.6 s in the tight form.
		fair := float64(form.Rules[0].Count) / float64(len(form.Regions))
		from := form.Bins * int(time.Second) / int(form.Duration)
		for r, bins := range al.Allocation[0] {
			for bin, v := range bins[from:] {
				if v < fair {
					t.Errorf("%s: %s's allocation of the hottest budget %.0f at %.2f s, want its fair share %.0f from 1 s on",
						form.Name, form.Regions[r].Name, v, form.Duration.Seconds()*float64(from+bin)/float64(form.Bins), fair)
					break
				}
			}
		}
	}
}
