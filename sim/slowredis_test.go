package sim

import (
	"testing"
	"time"
)

// TestSlowRedis runs redis-slow-partial: one agent of three finds its
// Redis slow and failing half its calls. The fault must reach the code
// (emergency decisions, breaker openings on that agent), and the overshoot
// must stay within the bound the fault table states for it. The same file
// with the failures taken out and a 300 ms round trip (slow alone) opens
// no breaker: the deadline follows the latency.
func TestSlowRedis(t *testing.T) {
	sc, err := LoadScenario("scenarios/29-redis-slow-partial.yaml")
	if err != nil {
		t.Fatal(err)
	}
	run := func(t *testing.T, sc *Scenario) (*Result, int64, int64) {
		t.Helper()
		res, err := Run(testScenario(t, sc), 1, Options{Systems: []string{"allot"}})
		if err != nil {
			t.Fatal(err)
		}
		var emergency int64
		for _, l := range res.Systems[0].Latency {
			if l.Path == "emergency" {
				emergency = l.Count
			}
		}
		opened, _ := res.Systems[0].Extra["breaker_opened"].(int64)
		return res, emergency, opened
	}
	t.Run("slow and failing", func(t *testing.T) {
		res, emergency, opened := run(t, sc)
		if emergency == 0 || opened == 0 {
			t.Fatalf("%d emergency decisions, %d breaker openings: the fault never opened the breaker", emergency, opened)
		}
		for _, ro := range res.Systems[0].Rules {
			if ro.Bound == nil {
				t.Fatalf("%s: no bound", ro.Rule)
			}
			t.Logf("%s: overshoot %.1f tokens, bound %.1f (%v); %d emergency decisions, %d breaker openings", ro.Rule, ro.PeakTokens, *ro.Bound, ro.BoundTerms, emergency, opened)
			if ro.Verdict != Pass || ro.PeakTokens > *ro.Bound {
				t.Fatalf("%s: overshoot %.1f over the bound %.1f", ro.Rule, ro.PeakTokens, *ro.Bound)
			}
		}
	})
	t.Run("slow alone", func(t *testing.T) {
		slow := *sc
		slow.Faults = append([]FaultSpec(nil), sc.Faults...)
		slow.Faults[0].Loss = 0
		slow.Faults[0].Delay = 150 * time.Millisecond // a 300 ms round trip, three times the deadline's floor
		_, emergency, opened := run(t, &slow)
		t.Logf("%d decisions timed out before the deadline followed the latency", emergency)
		if opened != 0 {
			t.Fatalf("%d breaker openings on a slow Redis that answers every call, want 0", opened)
		}
	})
}
