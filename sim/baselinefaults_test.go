package sim

import (
	"testing"
	"time"
)

// TestBaselineEmergencyStartsEmptyAtTheOpening: a static split whose store
// is out decides by the same emergency policy as allot's agents. While
// the agent's breaker is closed a request its store did not answer is
// denied; once it opens, the agent's emergency bucket (the region's
// share ÷ its live agents: 400/s ÷ 3 regions ÷ 2 agents, burst 66) starts
// empty at the opening and refills at its rate, never a full burst at once.
func TestBaselineEmergencyStartsEmptyAtTheOpening(t *testing.T) {
	sc, err := LoadScenario("scenarios/09-redis-cut-emergency.yaml")
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorld(sc, 1, Options{Systems: []string{"static"}})
	if err != nil {
		t.Fatal(err)
	}
	s := newLocalBuckets(w, "static", true)
	f := s.faults
	m := w.meters[s.si]
	t0 := us(15 * time.Second)
	decide := func(at Micros, n int) int64 {
		before := m.tokens
		for range n {
			f.fallback(w, s.si, at, 0, 0, 0, 1, true, 0)
		}
		return m.tokens - before
	}
	if got := decide(t0, 10); got != 0 {
		t.Fatalf("breaker closed: %d admitted, want 0 (a failure on a closed breaker is denied)", got)
	}
	br := f.breaker(0, 0)
	for range w.sc.Agent.BreakerFailures {
		f.failed(w, 0, 0, t0)
	}
	if _, open := br.OpenSince(); !open {
		t.Fatal("the breaker did not open")
	}
	if got := decide(t0, 10); got != 0 {
		t.Fatalf("at the opening: %d admitted, want 0 (the bucket starts empty)", got)
	}
	if got := decide(t0+us(500*time.Millisecond), 100); got != 33 {
		t.Fatalf("half a second in: %d admitted, want 33 (66.7/s from empty)", got)
	}
	if got := decide(t0+us(10*time.Second), 100); got != 66 {
		t.Fatalf("ten seconds in: %d admitted, want the burst of 66", got)
	}
	if f.answered(w, 0, 0, t0+us(11*time.Second)); br.Opened() != 1 {
		t.Fatalf("opened %d times, want 1", br.Opened())
	}
	if got := decide(t0+us(20*time.Second), 10); got != 0 {
		t.Fatalf("breaker closed again: %d admitted, want 0", got)
	}
}

// TestBaselinesSufferASlowStore: redis-slow-partial slows and fails half
// the calls of us-east's agent 0 from 15 s for 15 s; the static split's
// agent 0 counts them against its breaker, which opens, and its other
// agent's does not. (The baselines used to ignore the fault.)
func TestBaselinesSufferASlowStore(t *testing.T) {
	sc, err := LoadScenario("scenarios/29-redis-slow-partial.yaml")
	if err != nil {
		t.Fatal(err)
	}
	small, err := sc.Scaled(0.05)
	if err != nil {
		t.Fatal(err)
	}
	small.Duration = 20 * time.Second
	w, err := newWorld(small, 1, Options{Systems: []string{"static"}})
	if err != nil {
		t.Fatal(err)
	}
	s := newLocalBuckets(w, "static", true)
	w.idealM = newMeter(w.nb, w.newSeries())
	w.run()
	if n := s.faults.breaker(0, 0).Opened(); n == 0 {
		t.Fatal("agent 0's breaker never opened during the slow fault")
	}
	for ag := 1; ag < len(s.faults.alive[0]); ag++ {
		if n := s.faults.breaker(0, ag).Opened(); n != 0 {
			t.Fatalf("agent %d's breaker opened %d times; its link is healthy", ag, n)
		}
	}
}
