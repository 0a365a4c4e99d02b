package sim

import (
	"fmt"
	"math"
	"strings"
	"testing"
)

// TestEmergencyTermRunsTheAgentsBreaker: a Redis cut's emergency term
// lets the cut agents' buckets refill for the outage, the longest
// deadline and the back-off the agents' breaker reaches — the agent's
// (500 ms each) when the scenario sets none, the scenario's first ones
// when longer — not a back-off the agents never run.
func TestEmergencyTermRunsTheAgentsBreaker(t *testing.T) {
	for _, c := range []struct {
		agent              string
		deadline, back, in string
		extra              float64 // seconds after the 10 s outage
	}{
		{"", "500ms", "500ms", "agent's", 1.0},
		{"agent: {timeout: 800ms, breaker_backoff: 2s}\n", "800ms", "2s", "scenario's", 2.8},
	} {
		s := termOf(t, "regions: [{name: a, agents: 2}]\n"+c.agent+
			"faults: [{kind: redis_cut, region: a, at: 2s, for: 10s}]\n", "redis cut in")
		want := fmt.Sprintf("(outage 10s + longest deadline %s + breaker back-off %s)", c.deadline, c.back)
		if !strings.Contains(s, want) {
			t.Errorf("the %s breaker: term %q, want its window %s", c.in, s, want)
		}
		var tokens, rate float64
		var cut, live, burst int
		i := strings.Index(s, " emergency: ")
		if _, err := fmt.Sscanf(s[:strings.Index(s, ":")], "%g", &tokens); err != nil || i < 0 {
			t.Fatalf("term %q: %v", s, err)
		}
		if _, err := fmt.Sscanf(s[i:], " emergency: %d of %d live agents × (burst %d + allocation %g/s", &cut, &live, &burst, &rate); err != nil {
			t.Fatalf("term %q: %v", s, err)
		}
		if want := float64(cut) / float64(live) * (float64(burst) + rate*(10+c.extra)); rate <= 0 || math.Abs(tokens-want) > 0.01 {
			t.Errorf("the %s breaker: term %.3f tokens, want %d/%d × (%d + %.3f × %.1f s) = %.3f", c.in, tokens, cut, live, burst, rate, 10+c.extra, want)
		}
	}
}

// TestLossTermRunsTheAgentsBreaker: a loss on the Redis links is an
// outage everywhere for the emergency policy, with the same tail as a
// cut: the agents' longest deadline and the back-off their breaker
// reaches.
func TestLossTermRunsTheAgentsBreaker(t *testing.T) {
	s := termOf(t, "regions: [{name: a}]\nfaults: [{kind: loss, at: 2s, for: 10s, loss: 0.5, links: redis}]\n", "loss 0.5 on redis links")
	if !strings.Contains(s, "× (10s + longest deadline 500ms + breaker back-off 500ms)") {
		t.Fatalf("loss term %q, want the window 10 s + 500 ms + 500 ms", s)
	}
}

// termOf runs allot on a 14 s scenario of one emergency rule (100/s,
// burst 100, 200/s offered in region a) with the regions, agent and
// faults in spec, and returns its bound's term that contains what.
func termOf(t *testing.T, spec, what string) string {
	t.Helper()
	sc, err := ParseScenario([]byte("name: b\nduration: 14s\n" + spec +
		"rules: [{name: r, count: 100, period: 1s, burst: 100, policy: emergency}]\n" +
		"traffic: [{region: a, rule: r, rate: 200}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(sc, 1, Options{Systems: []string{"allot"}})
	if err != nil {
		t.Fatal(err)
	}
	terms := res.Systems[0].Rules[0].BoundTerms
	for _, s := range terms {
		if strings.Contains(s, what) {
			return s
		}
	}
	t.Fatalf("no term with %q among %q", what, terms)
	return ""
}
