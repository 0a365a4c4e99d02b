package sim

import (
	"fmt"
	"math"
	"time"
)

// Options adjusts a run.
type Options struct {
	// Systems limits the run to the named systems ("allot", "independent",
	// "static", "central", "async-global"); empty runs all of them.
	Systems []string
	// Progress, when set, is called as virtual time advances.
	Progress func(now, end time.Duration)
	// UnsafeSkipEscrow sets lease.Config.UnsafeSkipEscrow on the allot
	// system's allocators: they grant increases without waiting for the
	// escrow. For the tests and the tool's -unsafe-skip-escrow, which show
	// the simulator catching it (escrow-cut FAILs); never for figures.
	UnsafeSkipEscrow bool
	// CorruptGrants rewrites every grant on its way to a region so that it
	// hands the region the whole budget for each key it names: a fault of
	// the simulated wire, which the real Speaker and regional code then
	// act on. Tests only; it proves the simulator catches allocations that
	// add up to more than the budget.
	CorruptGrants bool
}

// Systems lists every system a run can measure, allot first.
var Systems = []string{"allot", "independent", "static", "central", "async-global"}

func (o Options) wants(name string) bool {
	if len(o.Systems) == 0 {
		return true
	}
	for _, s := range o.Systems {
		if s == name {
			return true
		}
	}
	return false
}

// Run simulates the scenario with the seed and returns its measurements.
// The same scenario, seed and options always give the same Result.
func Run(sc *Scenario, seed uint64, opts Options) (*Result, error) {
	for _, s := range opts.Systems {
		known := false
		for _, k := range Systems {
			known = known || k == s
		}
		if !known {
			return nil, fmt.Errorf("sim: unknown system %q (want one of %v)", s, Systems)
		}
	}
	w, err := newWorld(sc, seed, opts)
	if err != nil {
		return nil, err
	}
	w.idealM = newMeter(w.nb, w.newSeries())
	if opts.wants("allot") {
		if err := newAllot(w); err != nil {
			return nil, err
		}
	}
	if opts.wants("independent") {
		newLocalBuckets(w, "independent", false)
	}
	if opts.wants("static") {
		newLocalBuckets(w, "static", true)
	}
	if opts.wants("central") {
		newCentral(w)
	}
	if opts.wants("async-global") {
		newAsync(w)
	}
	if opts.Progress != nil {
		w.progress = func(now, end Micros) {
			opts.Progress(time.Duration(now)*time.Microsecond, time.Duration(end)*time.Microsecond)
		}
	}
	w.run()
	return w.result(), nil
}

// Result is one run's measurements. It holds no wall-clock figures, so two
// runs of the same scenario and seed marshal to identical bytes.
type Result struct {
	Scenario     string     `json:"scenario"`
	Description  string     `json:"description,omitempty"`
	Seed         uint64     `json:"seed"`
	DurationS    float64    `json:"duration_s"`
	Regions      []string   `json:"regions"`
	Rules        []RuleInfo `json:"rules"`
	Arrivals     int64      `json:"arrivals"`
	Decisions    int64      `json:"decisions"`
	Events       uint64     `json:"events"`
	Messages     int64      `json:"messages"`
	MessagesLost int64      `json:"messages_lost"`
	// MessagesDuplicated counts lease messages a duplicate fault delivered
	// twice.
	MessagesDuplicated int64  `json:"messages_duplicated,omitempty"`
	Verdict            string `json:"verdict"`
	// Missed lists the scenario's expectations (Scenario.Expect) allot
	// missed; each makes the run FAIL.
	Missed []string `json:"missed,omitempty"`
	// Violations lists the first protocol promises allot's speakers were
	// seen to break (settle before publishing, adopt before
	// acknowledging), of ViolationCount; any makes the run FAIL.
	Violations     []string       `json:"violations,omitempty"`
	ViolationCount int64          `json:"violation_count,omitempty"`
	Faults         []FaultRecord  `json:"faults"`
	BinS           float64        `json:"bin_s"`
	Ideal          SystemResult   `json:"ideal"`
	Systems        []SystemResult `json:"systems"`
}

// System returns the named system's figures, or nil when it did not run.
func (r *Result) System(name string) *SystemResult {
	for i := range r.Systems {
		if r.Systems[i].Name == name {
			return &r.Systems[i]
		}
	}
	return nil
}

// RuleInfo describes one rule.
type RuleInfo struct {
	Name  string  `json:"name"`
	Limit string  `json:"limit"`
	Rate  float64 `json:"rate_per_s"`
	Burst int64   `json:"burst"`
	Keys  int     `json:"keys"`
}

// SystemResult is one system's figures.
type SystemResult struct {
	Name           string  `json:"name"`
	Requests       int64   `json:"requests"`
	Rejected       int64   `json:"rejected"`
	Unavailable    int64   `json:"unavailable"`
	FalseRejects   int64   `json:"false_rejects"`
	FalseRejectPct float64 `json:"false_reject_pct"`
	Admitted       int64   `json:"admitted_tokens"`
	// Utilization is tokens used over what the ideal global bucket
	// admitted on the same arrivals, where a budget's use in each
	// one-second window is capped at the ideal's admissions in it, so
	// overshoot never counts as use. AdmittedRatio is the uncapped ratio
	// of tokens admitted.
	Utilization   float64 `json:"utilization"`
	AdmittedRatio float64 `json:"admitted_ratio"`
	// RedisOpsPerDecision counts Redis script calls per request decided.
	RedisOpsPerDecision float64 `json:"redis_ops_per_decision"`
	// CoordinatorMsgsPerS counts lease protocol messages both ways.
	CoordinatorMsgsPerS float64 `json:"coordinator_msgs_per_s"`
	// SteadyMsgsPerS is the lease message rate over the run's steady
	// bins (see steadyBins); absent when the run has none.
	SteadyMsgsPerS *float64 `json:"steady_msgs_per_s,omitempty"`
	// Unmodeled names the scenario's faults this system suffers only in
	// part, or not at all though a real deployment of it would.
	Unmodeled []string `json:"unmodeled,omitempty"`
	// ConvergenceS is the longest time, over the scenario's demand shifts,
	// until the system admits ≥ 95% of what the ideal bucket admits; −1
	// when it never does, absent when there is no shift.
	ConvergenceS *float64       `json:"convergence_s,omitempty"`
	Latency      []LatencyStats `json:"latency"`
	Rules        []RuleOutcome  `json:"rules"`
	// Series are per time bin: admitted tokens per second by rule and
	// region, and the largest excess over any budget in the bin.
	AdmittedRate [][][]float64 `json:"admitted_rate"`
	Overshoot    []float64     `json:"overshoot"`
	// Allocation is, for allot, the rate allocated to each region for each
	// rule's hottest budget, per bin.
	Allocation [][][]float64  `json:"allocation,omitempty"`
	Extra      map[string]any `json:"extra,omitempty"`

	// ConvergenceRefreshes is ConvergenceS in the scenario's refresh
	// intervals (target ≤ 3); absent when it never converges.
	ConvergenceRefreshes *float64 `json:"convergence_refreshes,omitempty"`
}

// LatencyStats is the decision latency on one path.
type LatencyStats struct {
	Path   string  `json:"path"`
	Count  int64   `json:"count"`
	MeanUs float64 `json:"mean_us"`
	P50Us  float64 `json:"p50_us"`
	P99Us  float64 `json:"p99_us"`
	MaxUs  float64 `json:"max_us"`
}

// RuleOutcome is the overshoot of one rule's worst budget.
type RuleOutcome struct {
	Rule string `json:"rule"`
	// PeakTokens is the largest excess over B + R·(e−s) over every window
	// and every budget of the rule; PeakPctOfBurst is it as a share of B.
	PeakTokens     float64 `json:"peak_tokens"`
	PeakPctOfBurst float64 `json:"peak_pct_of_burst"`
	PeakAtS        float64 `json:"peak_at_s"`
	WorstKey       int     `json:"worst_key"`
	// TimeWeighted is the worst budget's excess averaged over the run.
	TimeWeighted float64 `json:"time_weighted_tokens"`
	// Utilization and FalseRejectPct are the rule's, every key pooled.
	// The worst and mean are over its measured budgets (Budgets: those
	// carrying at least 1% of the rule's ideal tokens), each budget
	// counted once.
	Utilization         float64 `json:"utilization"`
	FalseRejectPct      float64 `json:"false_reject_pct"`
	WorstUtilization    float64 `json:"worst_utilization"`
	WorstUtilKey        int     `json:"worst_util_key"`
	MeanUtilization     float64 `json:"mean_utilization"`
	WorstFalseRejectPct float64 `json:"worst_false_reject_pct"`
	WorstFalseRejectKey int     `json:"worst_false_reject_key"`
	MeanFalseRejectPct  float64 `json:"mean_false_reject_pct"`
	// VsStatic is the smallest difference, over measured budgets, of this
	// system's utilization less the static split's on the same budget, at
	// key VsStaticKey.
	VsStatic    *float64        `json:"vs_static,omitempty"`
	VsStaticKey int             `json:"vs_static_key,omitempty"`
	Budgets     []BudgetOutcome `json:"budgets,omitempty"`
	// Bound is the overshoot the design allows under the scenario's faults,
	// with the terms it adds up; Unbounded marks a fail-open outage.
	Bound      *float64 `json:"bound_tokens,omitempty"`
	BoundTerms []string `json:"bound_terms,omitempty"`
	Unbounded  bool     `json:"unbounded,omitempty"`
	// Beyond is set when the run lies outside the design's assumptions.
	Beyond  *BeyondInfo `json:"beyond,omitempty"`
	Verdict string      `json:"verdict,omitempty"`
}

// Verdicts. PASS: every window within the bound. FAIL: some window above
// it, a bug in allot or in the bound. UNBOUNDED: a fail-open outage, which
// has no bound. BEYOND: the scenario lies outside the design's
// assumptions (clocks drifting apart by more than the lease protocol's
// margin), so the bound does not apply; the run reports what it measured
// above it and the design's estimate.
const (
	Pass      = "PASS"
	Fail      = "FAIL"
	Unbounded = "UNBOUNDED"
	Beyond    = "BEYOND"
)

func round(x float64, digits int) float64 {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return 0
	}
	p := math.Pow(10, float64(digits))
	return math.Round(x*p) / p
}

func (w *world) result() *Result {
	res := &Result{
		Scenario:           w.sc.Name,
		Description:        w.sc.Description,
		Seed:               w.seed,
		DurationS:          w.sc.Duration.Seconds(),
		Arrivals:           w.arrivals,
		Decisions:          w.decisions,
		Events:             w.eng.fired,
		Messages:           w.net.sent,
		MessagesLost:       w.net.lost,
		MessagesDuplicated: w.net.dups,
		Faults:             w.faults,
		BinS:               round(float64(w.idealM.bins.width)/1e6, 6),
		Verdict:            Pass,
	}
	if res.Faults == nil {
		res.Faults = []FaultRecord{}
	}
	for _, r := range w.regions {
		res.Regions = append(res.Regions, r.name)
	}
	for _, r := range w.rules {
		res.Rules = append(res.Rules, RuleInfo{Name: r.spec.Name, Limit: r.limit.String(),
			Rate: round(r.limit.Rate(), 6), Burst: r.spec.Burst, Keys: r.keys})
	}
	res.Ideal = w.systemResult("ideal", w.idealM, nil)
	for i, s := range w.systems {
		sr := w.systemResult(s.name(), w.meters[i], s)
		if b, ok := s.(bounder); ok {
			for j := range sr.Rules {
				ro := &sr.Rules[j]
				rb := b.bound(w, j)
				bound, unb := rb.total()
				for _, t := range rb.terms {
					ro.BoundTerms = append(ro.BoundTerms, t.String())
				}
				switch {
				case rb.beyond != nil:
					ro.Beyond = rb.beyond
					if !unb {
						ro.Bound = &bound
						ro.Beyond.ExcessTokens = round(math.Max(0, ro.PeakTokens-bound), 6)
					}
					ro.Verdict = Beyond
				case unb:
					ro.Unbounded = true
					ro.Verdict = Unbounded
				case ro.PeakTokens <= bound+1e-9:
					ro.Bound = &bound
					ro.Verdict = Pass
				default:
					ro.Bound = &bound
					ro.Verdict = Fail
				}
				if verdictRank[ro.Verdict] > verdictRank[res.Verdict] {
					res.Verdict = ro.Verdict
				}
			}
		}
		if al, ok := s.(*allot); ok && al.plane != nil && al.plane.violations > 0 {
			res.Violations = append(res.Violations, al.plane.violationList...)
			res.ViolationCount += al.plane.violations
			res.Verdict = Fail
		}
		if _, ok := s.(bounder); ok {
			for _, e := range w.sc.Expect.Shares {
				if miss := w.missed(e, w.meters[i]); miss != "" {
					res.Missed = append(res.Missed, sr.Name+": "+miss)
					res.Verdict = Fail
				}
			}
		}
		res.Systems = append(res.Systems, sr)
	}
	vsStatic(res)
	return res
}

// verdictRank orders verdicts for a run's own: the worst of its rules'.
var verdictRank = map[string]int{Pass: 0, Unbounded: 1, Beyond: 2, Fail: 3}

// bounder is a system with a stated overshoot bound per rule.
type bounder interface {
	bound(w *world, rule int) ruleBound
}

// reporter is a system with extra series or figures for the report.
type reporter interface {
	allocation(w *world) [][][]float64
	coordinatorMessages() int64
	messageBins() []int64
}

func (w *world) systemResult(name string, m *meter, s system) SystemResult {
	sr := SystemResult{
		Name:         name,
		Requests:     m.requests,
		Rejected:     m.rejected,
		Unavailable:  m.unavail,
		FalseRejects: m.falseRej,
		Admitted:     m.tokens,
	}
	if m.requests > 0 {
		sr.FalseRejectPct = round(100*float64(m.falseRej)/float64(m.requests), 4)
		sr.RedisOpsPerDecision = round(float64(m.redisOps)/float64(m.requests), 6)
	}
	if w.idealM.tokens > 0 {
		var used int64
		for i := range m.cold {
			used += m.cold[i].capped
		}
		sr.Utilization = round(float64(used)/float64(w.idealM.tokens), 6)
		sr.AdmittedRatio = round(float64(m.tokens)/float64(w.idealM.tokens), 6)
	}
	for p := path(0); p < numPaths; p++ {
		h := &m.lat[p]
		if h.n == 0 {
			continue
		}
		sr.Latency = append(sr.Latency, LatencyStats{Path: pathNames[p], Count: h.n,
			MeanUs: round(h.sum/float64(h.n), 2), P50Us: h.quantile(0.5), P99Us: h.quantile(0.99), MaxUs: float64(h.max)})
	}
	if sr.Latency == nil {
		sr.Latency = []LatencyStats{}
	}
	dur := float64(w.end)
	for _, r := range w.rules {
		ro := RuleOutcome{Rule: r.spec.Name, WorstKey: -1}
		var worst int64
		var tw float64
		for k := 0; k < r.keys; k++ {
			b := r.base + k
			bm := &m.b[b]
			if bm.peak > worst {
				worst = bm.peak
				ro.WorstKey = k
				ro.PeakAtS = round(float64(m.cold[b].peakAt)/1e6, 6)
			}
			if a := m.cold[b].area / dur / float64(r.p); a > tw {
				tw = a
			}
		}
		ro.PeakTokens = round(float64(worst)/float64(r.p), 6)
		ro.PeakPctOfBurst = round(100*ro.PeakTokens/float64(r.spec.Burst), 4)
		ro.TimeWeighted = round(tw, 6)
		w.ruleUsage(&ro, &r, m)
		sr.Rules = append(sr.Rules, ro)
	}
	bs := m.bins
	binS := float64(bs.width) / 1e6
	sr.AdmittedRate = make([][][]float64, bs.nrules)
	for ri := 0; ri < bs.nrules; ri++ {
		sr.AdmittedRate[ri] = make([][]float64, bs.nreg)
		for g := 0; g < bs.nreg; g++ {
			row := make([]float64, bs.nbins)
			for i := 0; i < bs.nbins; i++ {
				row[i] = round(float64(bs.byReg[(i*bs.nrules+ri)*bs.nreg+g])/binS, 3)
			}
			sr.AdmittedRate[ri][g] = row
		}
	}
	sr.Overshoot = make([]float64, bs.nbins)
	for i, v := range bs.overMax {
		sr.Overshoot[i] = round(v, 6)
	}
	if s != nil {
		if rp, ok := s.(reporter); ok {
			sr.Allocation = rp.allocation(w)
			sr.CoordinatorMsgsPerS = round(float64(rp.coordinatorMessages())/w.sc.Duration.Seconds(), 4)
			sr.SteadyMsgsPerS = w.steadyRate(rp.messageBins())
		}
		if u, ok := s.(unmodeler); ok {
			sr.Unmodeled = u.unmodeled(w)
		}
		sr.Extra = s.finish(w)
		sr.ConvergenceS = w.convergence(m)
		if c := sr.ConvergenceS; c != nil && *c >= 0 {
			v := round(*c/w.sc.Coordinator.Refresh.Seconds(), 3)
			sr.ConvergenceRefreshes = &v
		}
	}
	return sr
}

// convergence returns, over every stream marked as a demand shift, the
// longest time from its start until the system's admitted tokens for the
// rule reach 95% of the ideal bucket's in a bin, or nil without shifts.
func (w *world) convergence(m *meter) *float64 {
	bs, ib := m.bins, w.idealM.bins
	var worst float64
	any := false
	for _, s := range w.sources {
		if !s.shift {
			continue
		}
		any = true
		found := -1.0
		for i := bs.bin(s.start); i < bs.nbins; i++ {
			ideal := ib.byRule[i*bs.nrules+s.rule]
			if ideal == 0 {
				continue
			}
			if float64(bs.byRule[i*bs.nrules+s.rule]) >= 0.95*float64(ideal) {
				found = float64(Micros(i+1)*bs.width-s.start) / 1e6
				break
			}
		}
		if found < 0 {
			worst = -1
			break
		}
		worst = math.Max(worst, found)
	}
	if !any {
		return nil
	}
	v := round(worst, 6)
	return &v
}

// missed checks expectation e against a system's meter: the first bin
// from e.After in which e.Region admitted at least e.AtLeast of the rule's
// rate must start within e.Within. It says how it was missed, or "".
func (w *world) missed(e ShareExpect, m *meter) string {
	ri := 0
	if e.Rule != "" {
		ri = w.sc.ruleIndex(e.Rule)
	}
	g := w.sc.regionIndex(e.Region)
	bs := m.bins
	binS := float64(bs.width) / 1e6
	want := e.AtLeast * w.rules[ri].limit.Rate()
	from, until := us(e.After), us(e.After+e.Within)
	for i := bs.bin(from); i < bs.nbins; i++ {
		start := Micros(i) * bs.width
		if start > until {
			break
		}
		if float64(bs.byReg[(i*bs.nrules+ri)*bs.nreg+g])/binS >= want {
			return ""
		}
	}
	return fmt.Sprintf("%s admitted less than %.0f%% of %s's rate (%.0f/s) in every bin from %s to %s",
		e.Region, 100*e.AtLeast, w.rules[ri].spec.Name, want, e.After, e.After+e.Within)
}
