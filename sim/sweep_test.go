package sim

import (
	"bytes"
	"encoding/xml"
	"math"
	"strings"
	"testing"
	"time"
)

// sweepScenario is small enough to sweep under the race detector: one
// budget, two regions, a Redis cut in one of them, a demand shift.
const sweepScenario = `name: sweep-test
duration: 12s
regions: [{name: us}, {name: eu}]
latency: {us: {us: 500us, eu: 40ms}, eu: {eu: 500us}}
coordinator: {lease_ttl: 4s, refresh: 1s}
rules: [{name: api, count: 200, period: 1s, keys: 4, reserve: 0.3}]
traffic:
  - {region: us, rule: api, rate: 250, stop: 6s}
  - {region: eu, rule: api, rate: 250, start: 6s, shift: true}
faults:
  - {kind: redis_cut, region: us, at: 2s, for: 3s}
`

func TestSweepGridAndBest(t *testing.T) {
	sc, err := ParseScenario([]byte(sweepScenario))
	if err != nil {
		t.Fatal(err)
	}
	g := Grid{
		LeaseTTL: []time.Duration{time.Second, 4 * time.Second}, // 1s is not above the refresh: skipped
		Policy:   []string{PolicyClosed, PolicyEmergency, PolicyOpen},
	}
	var seen []Settings
	res, err := Sweep(sc, g, []uint64{1}, SweepOptions{Progress: func(i, n int, s Settings) {
		if n != 6 || i != len(seen) {
			t.Errorf("progress %d of %d", i, n)
		}
		seen = append(seen, s)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 6 || strings.Join(res.Axes, ",") != "lease_ttl,policy" {
		t.Fatalf("%d points over %v, want 6 over lease_ttl,policy", len(res.Points), res.Axes)
	}
	for i, p := range res.Points {
		wantTTL := []time.Duration{time.Second, 4 * time.Second}[i/3]
		wantPolicy := g.Policy[i%3]
		if p.Settings.LeaseTTL != wantTTL || p.Settings.Policy != wantPolicy || p.Settings.Refresh != time.Second {
			t.Errorf("point %d settings %s, want ttl %s policy %s, the scenario's refresh", i, p.Settings, wantTTL, wantPolicy)
		}
		if i < 3 {
			if !strings.Contains(p.Skipped, "coordinator.refresh=1s must be > 0 and below lease_ttl=1s") {
				t.Errorf("point %d skipped %q, want the refresh named", i, p.Skipped)
			}
			continue
		}
		if p.Skipped != "" {
			t.Fatalf("point %d skipped: %s", i, p.Skipped)
		}
		// Each point is the run of the scenario with its settings.
		c := *sc
		c.Coordinator.LeaseTTL = p.Settings.LeaseTTL
		c.Rules = []RuleSpec{sc.Rules[0]}
		c.Rules[0].Policy = p.Settings.Policy
		r, err := Run(&c, 1, Options{Systems: SweepSystems})
		if err != nil {
			t.Fatal(err)
		}
		if r.Systems[0].Utilization != p.Utilization || r.Systems[1].Utilization != p.Static || r.Systems[2].Utilization != p.Central {
			t.Errorf("point %d utilization %v/%v/%v, the run gives %v/%v/%v", i, p.Utilization, p.Static, p.Central,
				r.Systems[0].Utilization, r.Systems[1].Utilization, r.Systems[2].Utilization)
		}
		if p.ConvergenceS == nil {
			t.Errorf("point %d has no convergence with a shift in the traffic", i)
		}
		switch p.Settings.Policy {
		case PolicyOpen:
			if p.Keeps || p.Verdict != Unbounded || p.WorstBound != nil {
				t.Errorf("fail open under a Redis cut: %+v, want UNBOUNDED and not kept", p)
			}
		default:
			if !p.Keeps || p.Verdict != Pass || p.WorstBound == nil {
				t.Errorf("%s: %+v, want PASS with a bound", p.Settings.Policy, p)
			}
		}
	}
	// The best point keeps every bound and no kept point does better.
	if res.Best < 0 || !res.Points[res.Best].Best || !res.Points[res.Best].Keeps {
		t.Fatalf("best %d", res.Best)
	}
	for i, p := range res.Points {
		if p.Keeps && p.Utilization > res.Points[res.Best].Utilization {
			t.Errorf("point %d keeps the bounds with utilization %v above the best's %v", i, p.Utilization, res.Points[res.Best].Utilization)
		}
		if p.Best != (i == res.Best) {
			t.Errorf("point %d best=%v", i, p.Best)
		}
	}
	if len(res.BestRuns) != 1 {
		t.Errorf("%d runs kept for the best point, want its one seed", len(res.BestRuns))
	}
	if res.Notes != nil {
		t.Errorf("notes %v on a scenario that measures convergence", res.Notes)
	}

	var table, page bytes.Buffer
	if err := WriteSweepTable(&table, res); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"skipped: coordinator.refresh=1s", "UNBOUNDED", "breaks", "best: #"} {
		if !strings.Contains(table.String(), want) {
			t.Errorf("table lacks %q:\n%s", want, table.String())
		}
	}
	if err := WriteSweepHTML(&page, res); err != nil {
		t.Fatal(err)
	}
	html := page.String()
	start, end := strings.Index(html, "<svg"), strings.Index(html, "</svg>")
	if start < 0 || end < 0 {
		t.Fatal("sweep report has no chart")
	}
	if err := xml.Unmarshal([]byte(html[start:end+len("</svg>")]), new(struct{})); err != nil {
		t.Errorf("sweep chart is not well-formed: %v", err)
	}
	for _, want := range []string{"★", "Sweep: utilization and worst overshoot", "The best point", "Fault timeline"} {
		if !strings.Contains(html, want) {
			t.Errorf("sweep report lacks %q", want)
		}
	}
}

// TestSweepNotesMissingMeasures: a scenario without a demand shift says
// convergence is not measured instead of reporting a figure.
func TestSweepNotesMissingMeasures(t *testing.T) {
	sc, err := ParseScenario([]byte(strings.Replace(sweepScenario, ", shift: true", "", 1)))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Sweep(sc, Grid{}, []uint64{1}, SweepOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Points) != 1 || res.Points[0].ConvergenceS != nil {
		t.Fatalf("points %+v, want one without convergence", res.Points)
	}
	if len(res.Notes) != 1 || !strings.Contains(res.Notes[0], "convergence: not measured") {
		t.Errorf("notes %v", res.Notes)
	}
	if _, err := Sweep(sc, Grid{Policy: []string{"sometimes"}}, []uint64{1}, SweepOptions{}); err == nil || !strings.Contains(err.Error(), `policy[0]="sometimes"`) {
		t.Errorf("bad policy: %v", err)
	}
}

// TestOvershootScore orders rules by how close their overshoot came to
// their bound: no bound, or any overshoot over a bound of 0, is worst.
func TestOvershootScore(t *testing.T) {
	f := func(v float64) *float64 { return &v }
	order := []RuleOutcome{
		{PeakTokens: 0, Bound: f(0)},
		{PeakTokens: 0, Bound: f(100)},
		{PeakTokens: 31.7, Bound: f(1638)},
		{PeakTokens: 50, Bound: f(100)},
		{PeakTokens: 120, Bound: f(100)},
	}
	for i := 1; i < len(order); i++ {
		a, b := overshootScore(order[i-1]), overshootScore(order[i])
		if a > b || (i > 1 && a == b) {
			t.Errorf("score of %+v = %v, not below %+v's %v", order[i-1], a, order[i], b)
		}
	}
	for _, ro := range []RuleOutcome{{PeakTokens: 0.5, Bound: f(0)}, {Unbounded: true}} {
		if s := overshootScore(ro); s != math.Inf(1) {
			t.Errorf("score of %+v = %v, want +Inf", ro, s)
		}
	}
}

// TestSweepSkipsWhatTheProtocolRefuses: a drift margin the lease TTL
// cannot hold passes the scenario's checks but not lease.Config's; the
// point is listed as skipped with the reason.
func TestSweepSkipsWhatTheProtocolRefuses(t *testing.T) {
	sc, err := ParseScenario([]byte(sweepScenario))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Sweep(sc, Grid{LeaseTTL: []time.Duration{1020 * time.Millisecond}, Drift: []float64{0.001, 0.05}}, []uint64{1}, SweepOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if p := res.Points[0]; p.Skipped != "" || p.Verdict == "" {
		t.Errorf("drift 0.001: %+v, want a run", p)
	}
	if p := res.Points[1]; !strings.Contains(p.Skipped, "must be in [0, ttl−refresh=20ms)") || p.Keeps || p.Best {
		t.Errorf("drift 0.05: %+v, want skipped naming the drift", p)
	}
}
