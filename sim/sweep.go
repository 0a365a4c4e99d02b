package sim

import (
	"fmt"
	"math"
	"strings"
	"time"
)

// Grid is the settings a sweep varies. Every combination of the values
// given is one point; an axis left empty keeps the scenario's value.
type Grid struct {
	LeaseTTL []time.Duration
	Refresh  []time.Duration
	// Reserve and Policy apply to every rule of the scenario.
	Reserve     []float64
	BatchWindow []time.Duration
	Policy      []string
	// Drift is the drift margin ρ the lease protocol assumes.
	Drift []float64
}

// Settings is one point of a grid: the values a run used.
type Settings struct {
	LeaseTTL    time.Duration `json:"lease_ttl"`
	Refresh     time.Duration `json:"refresh"`
	Reserve     float64       `json:"reserve"` // −1: the rules' own, which differ
	BatchWindow time.Duration `json:"batch_window"`
	Policy      string        `json:"policy"`
	Drift       float64       `json:"drift"`
}

// String renders the settings as the scenario's fields.
func (s Settings) String() string {
	return fmt.Sprintf("lease_ttl=%s refresh=%s reserve=%s batch_window=%s policy=%s drift=%.4g",
		s.LeaseTTL, s.Refresh, s.reserve(), s.BatchWindow, s.Policy, s.Drift)
}

func (s Settings) reserve() string {
	if s.Reserve < 0 {
		return "mixed"
	}
	return fmt.Sprintf("%g", s.Reserve)
}

// SweepPoint is one point's figures over every seed.
type SweepPoint struct {
	Settings Settings `json:"settings"`
	// Skipped says why the point was not run (settings the scenario or
	// the lease protocol refuse); the figures are then zero.
	Skipped string `json:"skipped,omitempty"`
	// Verdict is allot's worst over seeds and rules: FAIL, then UNBOUNDED,
	// then PASS.
	Verdict string `json:"verdict,omitempty"`
	// WorstRule is the rule whose overshoot came closest to (or furthest
	// above) its bound, as a share of the bound (the larger overshoot among
	// equals), with that overshoot and bound in tokens; Bound is absent
	// when the rule is unbounded (fail open under a fault).
	WorstRule      string   `json:"worst_rule,omitempty"`
	WorstOvershoot float64  `json:"worst_overshoot_tokens"`
	WorstBound     *float64 `json:"worst_bound_tokens,omitempty"`
	// Utilization is allot's tokens admitted over the ideal global
	// bucket's, averaged over the seeds; Static and Central are the static
	// split's and the central Redis's on the same arrivals.
	Utilization float64 `json:"utilization"`
	Static      float64 `json:"static_utilization"`
	Central     float64 `json:"central_utilization"`
	// LeaseMsgsPerS is lease protocol messages a second, both ways,
	// averaged over the seeds.
	LeaseMsgsPerS float64 `json:"lease_msgs_per_s"`
	// ConvergenceS is the worst over seeds of the time to admit 95% of the
	// ideal after a demand shift, −1 when a run never did; absent when the
	// scenario marks no stream as a shift.
	ConvergenceS *float64 `json:"convergence_s,omitempty"`
	// Keeps is set when every seed kept every rule within its bound.
	Keeps bool `json:"keeps_bounds"`
	// Best marks the point that keeps every bound with the highest
	// utilization (the fewest lease messages among equals).
	Best bool `json:"best"`
}

// SweepResult is a sweep's points, in grid order (the last axis fastest).
type SweepResult struct {
	Scenario    string       `json:"scenario"`
	Description string       `json:"description,omitempty"`
	Seeds       []uint64     `json:"seeds"`
	Axes        []string     `json:"axes"`
	Points      []SweepPoint `json:"points"`
	// Best is the index of the best point, −1 when no point keeps every
	// bound.
	Best int `json:"best"`
	// Notes say what a figure does not measure in this scenario.
	Notes []string `json:"notes,omitempty"`
	// BestRuns are the best point's runs, for the report's detail.
	BestRuns []*Result `json:"-"`
}

// SweepOptions adjusts a sweep.
type SweepOptions struct {
	// Progress, when set, is called before each point.
	Progress func(point, points int, s Settings)
}

// SweepSystems are the systems a sweep runs: allot and the two baselines
// it is compared against.
var SweepSystems = []string{"allot", "static", "central"}

// Sweep runs sc at every point of g on every seed.
func Sweep(sc *Scenario, g Grid, seeds []uint64, opts SweepOptions) (*SweepResult, error) {
	if len(seeds) == 0 {
		return nil, bad("sweep: no seeds")
	}
	base := Settings{
		LeaseTTL: sc.Coordinator.LeaseTTL, Refresh: sc.Coordinator.Refresh, BatchWindow: sc.Agent.BatchWindow,
		Drift: sc.Coordinator.Drift, Reserve: -1, Policy: "",
	}
	// Reserve and policy are per rule; a sweep that does not vary them
	// shows the first rule's ("mixed", −1 for the reserve, when rules
	// differ).
	if len(sc.Rules) > 0 {
		base.Reserve, base.Policy = sc.Rules[0].Reserve, sc.Rules[0].Policy
		for _, r := range sc.Rules[1:] {
			if r.Policy != base.Policy {
				base.Policy = "mixed"
			}
			if r.Reserve != base.Reserve {
				base.Reserve = -1
			}
		}
	}
	for i, p := range g.Policy {
		if p != PolicyClosed && p != PolicyOpen && p != PolicyEmergency {
			return nil, bad("sweep: policy[%d]=%q must be closed, open or emergency", i, p)
		}
	}
	points := []Settings{base}
	var axes []string
	expand := func(name string, n int, set func(s *Settings, i int)) {
		if n == 0 {
			return
		}
		axes = append(axes, name)
		var next []Settings
		for _, p := range points {
			for i := 0; i < n; i++ {
				q := p
				set(&q, i)
				next = append(next, q)
			}
		}
		points = next
	}
	expand("lease_ttl", len(g.LeaseTTL), func(s *Settings, i int) { s.LeaseTTL = g.LeaseTTL[i] })
	expand("refresh", len(g.Refresh), func(s *Settings, i int) { s.Refresh = g.Refresh[i] })
	expand("reserve", len(g.Reserve), func(s *Settings, i int) { s.Reserve = g.Reserve[i] })
	expand("batch_window", len(g.BatchWindow), func(s *Settings, i int) { s.BatchWindow = g.BatchWindow[i] })
	expand("policy", len(g.Policy), func(s *Settings, i int) { s.Policy = g.Policy[i] })
	expand("drift", len(g.Drift), func(s *Settings, i int) { s.Drift = g.Drift[i] })
	if len(points) > 10000 {
		return nil, bad("sweep: the grid has %d points, at most 10000", len(points))
	}
	res := &SweepResult{Scenario: sc.Name, Description: sc.Description, Seeds: seeds, Axes: axes, Best: -1}
	if res.Axes == nil {
		res.Axes = []string{}
	}
	shifts := false
	for _, t := range sc.Traffic {
		shifts = shifts || t.Shift
	}
	if !shifts {
		res.Notes = append(res.Notes, "convergence: not measured; no traffic stream is marked shift: true (a replayed log has no marks)")
	}
	bestRuns := map[int][]*Result{}
	for i, s := range points {
		if opts.Progress != nil {
			opts.Progress(i, len(points), s)
		}
		pt, runs, err := sweepPoint(sc, s, g, seeds)
		if err != nil {
			return nil, err
		}
		res.Points = append(res.Points, pt)
		if pt.Keeps && (res.Best < 0 || better(pt, res.Points[res.Best])) {
			delete(bestRuns, res.Best)
			res.Best = i
			bestRuns[i] = runs
		}
	}
	if res.Best >= 0 {
		res.Points[res.Best].Best = true
		res.BestRuns = bestRuns[res.Best]
	}
	return res, nil
}

// better reports whether a beats b: higher utilization, then fewer lease
// messages.
func better(a, b SweepPoint) bool {
	if a.Utilization != b.Utilization {
		return a.Utilization > b.Utilization
	}
	return a.LeaseMsgsPerS < b.LeaseMsgsPerS
}

// apply returns a copy of sc with the settings the grid varies.
func (s Settings) apply(sc *Scenario, g Grid) *Scenario {
	c := *sc
	c.Rules = append([]RuleSpec(nil), sc.Rules...)
	c.Coordinator.LeaseTTL, c.Coordinator.Refresh, c.Coordinator.Drift = s.LeaseTTL, s.Refresh, s.Drift
	c.Agent.BatchWindow = s.BatchWindow
	for i := range c.Rules {
		if len(g.Reserve) > 0 {
			c.Rules[i].Reserve = s.Reserve
		}
		if len(g.Policy) > 0 {
			c.Rules[i].Policy = s.Policy
		}
	}
	return &c
}

// sweepPoint runs one point on every seed.
func sweepPoint(sc *Scenario, s Settings, g Grid, seeds []uint64) (SweepPoint, []*Result, error) {
	pt := SweepPoint{Settings: s}
	c := s.apply(sc, g)
	if err := c.Validate(); err != nil {
		pt.Skipped = strings.TrimPrefix(err.Error(), ErrScenario.Error()+": ")
		return pt, nil, nil
	}
	pt.Verdict, pt.Keeps = Pass, true
	worstScore, worstPeak := math.Inf(-1), math.Inf(-1)
	var runs []*Result
	for _, seed := range seeds {
		r, err := Run(c, seed, Options{Systems: SweepSystems})
		if err != nil {
			// The lease protocol refuses some timings the scenario's own
			// checks let through (drift against ttl − refresh, say).
			if len(runs) == 0 && strings.Contains(err.Error(), "coordinator:") {
				pt = SweepPoint{Settings: s, Skipped: err.Error()}
				return pt, nil, nil
			}
			return pt, nil, fmt.Errorf("sim: sweep %s seed %d: %w", s, seed, err)
		}
		runs = append(runs, r)
		for _, sys := range r.Systems {
			switch sys.Name {
			case "allot":
				pt.Utilization += sys.Utilization / float64(len(seeds))
				pt.LeaseMsgsPerS += sys.CoordinatorMsgsPerS / float64(len(seeds))
				if cv := sys.ConvergenceS; cv != nil {
					switch {
					case pt.ConvergenceS == nil:
						v := *cv
						pt.ConvergenceS = &v
					case *cv < 0 || *pt.ConvergenceS < 0:
						*pt.ConvergenceS = -1
					default:
						*pt.ConvergenceS = math.Max(*pt.ConvergenceS, *cv)
					}
				}
				for _, ro := range sys.Rules {
					score := overshootScore(ro)
					if score > worstScore || (score == worstScore && ro.PeakTokens > worstPeak) {
						worstScore, worstPeak = score, ro.PeakTokens
						pt.WorstRule, pt.WorstOvershoot, pt.WorstBound = ro.Rule, ro.PeakTokens, ro.Bound
					}
					switch ro.Verdict {
					case Fail:
						pt.Verdict, pt.Keeps = Fail, false
					case Unbounded:
						if pt.Verdict == Pass {
							pt.Verdict = Unbounded
						}
						pt.Keeps = false
					}
				}
			case "static":
				pt.Static += sys.Utilization / float64(len(seeds))
			case "central":
				pt.Central += sys.Utilization / float64(len(seeds))
			}
		}
	}
	pt.Utilization = round(pt.Utilization, 6)
	pt.Static = round(pt.Static, 6)
	pt.Central = round(pt.Central, 6)
	pt.LeaseMsgsPerS = round(pt.LeaseMsgsPerS, 4)
	return pt, runs, nil
}

// overshootScore is a rule's overshoot as a share of its bound: +Inf
// without a bound, and for any overshoot over a bound of 0.
func overshootScore(ro RuleOutcome) float64 {
	switch {
	case ro.Bound == nil:
		return math.Inf(1)
	case *ro.Bound > 0:
		return ro.PeakTokens / *ro.Bound
	case ro.PeakTokens > 1e-9:
		return math.Inf(1)
	}
	return 0
}
