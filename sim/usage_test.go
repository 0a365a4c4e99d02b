package sim

import (
	"testing"
	"time"
)

// TestUtilizationCappedPerWindow runs the independent baseline, which
// admits the full limit in every region, beside the ideal bucket: it
// admits more than the ideal, and none of the excess counts as use.
func TestUtilizationCappedPerWindow(t *testing.T) {
	sc, err := LoadScenario("scenarios/01-steady-skewed.yaml")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(testScenario(t, sc), 1, Options{Systems: []string{"independent", "static"}})
	if err != nil {
		t.Fatal(err)
	}
	ind, st := res.Systems[0], res.Systems[1]
	if ind.AdmittedRatio <= 1.05 {
		t.Fatalf("independent admitted %.3f of the ideal's tokens; the test needs it to overshoot", ind.AdmittedRatio)
	}
	if ind.Utilization > 1 || ind.Rules[0].Utilization > 1 {
		t.Errorf("independent utilization %.3f (rule %.3f), want ≤ 1: overshoot counted as use", ind.Utilization, ind.Rules[0].Utilization)
	}
	if ind.Rules[0].Utilization < 0.99 {
		t.Errorf("independent utilization %.3f, want ≈ 1: it admits everything the ideal does", ind.Rules[0].Utilization)
	}
	ro := st.Rules[0]
	if len(ro.Budgets) == 0 {
		t.Fatal("no measured budget")
	}
	lo := 2.0
	var sum float64
	for _, b := range ro.Budgets {
		if b.Utilization > 1 {
			t.Errorf("static key %d utilization %.3f > 1", b.Key, b.Utilization)
		}
		lo = min(lo, b.Utilization)
		sum += b.Utilization
	}
	if ro.WorstUtilization != lo {
		t.Errorf("static worst utilization %.6f, want the smallest budget's %.6f", ro.WorstUtilization, lo)
	}
	if mean := round(sum/float64(len(ro.Budgets)), 6); ro.MeanUtilization != mean {
		t.Errorf("static mean utilization %.6f, want %.6f", ro.MeanUtilization, mean)
	}
	// A static split under skew loses most on its worst budget: the pooled
	// figure hides it.
	if ro.WorstUtilization >= ro.Utilization {
		t.Errorf("static worst budget %.3f not below the rule's %.3f under skew", ro.WorstUtilization, ro.Utilization)
	}
	if ro.WorstFalseRejectPct <= ro.FalseRejectPct {
		t.Errorf("static worst budget's false rejects %.2f%% not above the rule's %.2f%%", ro.WorstFalseRejectPct, ro.FalseRejectPct)
	}
}

// TestCloseWindowCapsAtTheIdeal checks one window's arithmetic: a system
// that admits more than the ideal in a window is credited the ideal's
// tokens, one that admits less its own.
func TestCloseWindowCapsAtTheIdeal(t *testing.T) {
	w := &world{nb: 2, idealM: newMeter(2, nil)}
	over, under := newMeter(2, nil), newMeter(2, nil)
	w.meters = []*meter{over, under}
	w.idealM.use(0, 10)
	w.idealM.use(1, 4)
	over.use(0, 15)
	over.use(1, 4)
	under.use(0, 7)
	w.closeWindow()
	// Second window: the ideal admits nothing for budget 1, so what the
	// over-admitting system takes for it is overshoot.
	w.idealM.use(0, 5)
	over.use(1, 3)
	under.use(0, 5)
	w.closeWindow()
	for _, c := range []struct {
		name string
		m    *meter
		want [2]int64
	}{
		{"ideal", w.idealM, [2]int64{15, 4}},
		{"over", over, [2]int64{10, 4}},
		{"under", under, [2]int64{12, 0}},
	} {
		if got := [2]int64{c.m.cold[0].capped, c.m.cold[1].capped}; got != c.want {
			t.Errorf("%s: capped use %v, want %v", c.name, got, c.want)
		}
	}
	if w.winEnd != 2*utilWindow {
		t.Errorf("window end %d after two windows, want %d", w.winEnd, 2*utilWindow)
	}
}

// TestClearWindowsLeaveOutTheStartAndFaults: a window is clear from the
// second second on, except where it meets a fault or the lease TTL plus a
// refresh after it; a clear window's capped use counts apart as well.
func TestClearWindowsLeaveOutTheStartAndFaults(t *testing.T) {
	sc := &Scenario{
		Coordinator: CoordinatorSpec{LeaseTTL: 4 * time.Second, Refresh: time.Second},
		Faults:      []FaultSpec{{Kind: FaultCoordinatorCut, At: 3 * time.Second, For: 2 * time.Second}},
	}
	w := &world{nb: 1, sc: sc, idealM: newMeter(1, nil)}
	sys := newMeter(1, nil)
	w.meters = []*meter{sys}
	// The fault's influence: [3 s, 5 s + 4 s + 1 s) = [3 s, 10 s).
	want := []bool{false, true, true, false, false, false, false, false, false, false, true, true}
	var wantClear, wantSys int64
	for i, c := range want {
		w.winEnd = Micros(i+1) * utilWindow
		if got := w.clearWindow(w.winEnd-utilWindow, w.winEnd); got != c {
			t.Errorf("window [%d s, %d s) clear %v, want %v", i, i+1, got, c)
		}
		// The ideal admits 10 in each window, the system 7 in the
		// even ones and 12 (capped at 10) in the odd.
		w.idealM.use(0, 10)
		u := int64(7)
		if i%2 == 1 {
			u = 12
		}
		sys.use(0, u)
		if c {
			wantClear += 10
			wantSys += min(u, 10)
		}
		w.closeWindow()
	}
	if got := w.idealM.cold[0].clear; got != wantClear {
		t.Errorf("ideal's clear tokens %d, want %d", got, wantClear)
	}
	if got := sys.cold[0].clear; got != wantSys {
		t.Errorf("system's clear use %d, want %d", got, wantSys)
	}
	if got, all := sys.cold[0].capped, int64(len(want)/2)*(7+10); got != all {
		t.Errorf("system's capped use %d over every window, want %d", got, all)
	}
}

// TestBaselinesSufferStoreFaults cuts the regional Redis of the region
// carrying most traffic: the static split and the central Redis apply
// the rule's failure policy as allot's agents do, so under "closed" they
// fail requests, and under "open" they admit them.
func TestBaselinesSufferStoreFaults(t *testing.T) {
	for _, c := range []struct {
		file string
		path string
	}{
		{"08-redis-cut-closed.yaml", "closed"},
		{"09-redis-cut-emergency.yaml", "emergency"},
		{"10-redis-cut-open.yaml", "emergency"}, // fail-open decisions take the emergency path
	} {
		sc, err := LoadScenario("scenarios/" + c.file)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(testScenario(t, sc), 1, Options{Systems: []string{"static", "central"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Systems {
			var n int64
			for _, l := range s.Latency {
				if l.Path == c.path {
					n = l.Count
				}
			}
			if s.Name == "central" && sc.Baselines.Central != sc.Faults[0].Region {
				continue // its store is in another region, which the cut spares
			}
			if n == 0 {
				t.Errorf("%s: %s decided nothing on the %s path during the Redis cut", sc.Name, s.Name, c.path)
			}
		}
	}
}

// TestSteadyBins checks which bins count as steady: none during a fault
// or within the settling time after it, or after a stream starts.
func TestSteadyBins(t *testing.T) {
	sc, err := LoadScenario("scenarios/04-coordinator-cut.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorld(sc, 1, Options{})
	if err != nil {
		t.Fatal(err)
	}
	w.idealM = newMeter(w.nb, w.newSeries())
	steady := w.steadyBins()
	settle := Micros(steadySettle) * us(sc.Coordinator.Refresh)
	width := w.idealM.bins.width
	n := 0
	for i, ok := range steady {
		from, to := Micros(i)*width, Micros(i+1)*width
		if ok {
			n++
		}
		inFault := false
		for _, f := range sc.Faults {
			if us(f.At) < to && from < us(f.At+f.For)+settle {
				inFault = true
			}
		}
		if ok && (inFault || from < settle) {
			t.Errorf("bin %d [%d,%d) µs counted steady, within a fault or its settling time", i, from, to)
		}
	}
	if n == 0 {
		t.Error("no steady bin in a run with long fault-free stretches")
	}
	rate := w.steadyRate(make([]int64, len(steady)))
	if rate == nil || *rate != 0 {
		t.Errorf("steady rate of nothing sent = %v, want 0", rate)
	}
}
