package chaos

import (
	"fmt"
	"math"
	"sort"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/sim"
)

// Verdicts.
const (
	Pass      = "PASS"
	Fail      = "FAIL"
	Unbounded = "UNBOUNDED"
)

// Result is one run's judgement.
type Result struct {
	Scenario    string   `json:"scenario"`
	Path        string   `json:"path,omitempty"`
	Description string   `json:"description,omitempty"`
	Expect      string   `json:"expect"`
	Reason      string   `json:"reason,omitempty"`
	Verdict     string   `json:"verdict"`
	Outcome     string   `json:"outcome"`
	Failures    []string `json:"failures,omitempty"`
	Seed        uint64   `json:"seed"`
	DurationS   float64  `json:"duration_s"`
	// Coordinators is 1 (standalone) or 3 (HA on etcd).
	Coordinators int              `json:"coordinators"`
	LoadAvg      LoadAvg          `json:"load_average"`
	CPU          CPU              `json:"cpu_cores"`
	Requests     map[string]int64 `json:"requests"`
	Budgets      []BudgetResult   `json:"budgets"`
	Faults       []FaultResult    `json:"faults"`
	Checks       []CheckResult    `json:"checks"`
	Shifts       []ShiftResult    `json:"shifts,omitempty"`
	// HarnessOnly names the faults the simulator does not run.
	HarnessOnly []string `json:"harness_only_faults,omitempty"`
	Sim         *SimSide `json:"sim,omitempty"`
	Dir         string   `json:"dir,omitempty"`
}

// LoadAvg is the host's one-minute load average during the run.
type LoadAvg struct {
	Start float64 `json:"start"`
	End   float64 `json:"end"`
	Max   float64 `json:"max"`
	Mean  float64 `json:"mean"`
}

// CPU is the cores used during the run by the harness itself (load
// generator, proxies, probe) and by the processes it started (those
// running at the end).
type CPU struct {
	Harness   float64 `json:"harness"`
	Processes float64 `json:"processes"`
}

// BudgetResult is one budget (a rule's key) over the whole run.
type BudgetResult struct {
	Rule  string  `json:"rule"`
	Key   string  `json:"key"`
	Rate  float64 `json:"rate_per_s"`
	Burst float64 `json:"burst"`
	// Offered, Admitted and Ideal are tokens: sent (or skipped), certainly
	// admitted, and what one exact global bucket admits of the same
	// arrivals.
	Offered  float64 `json:"offered_tokens"`
	Admitted float64 `json:"admitted_tokens"`
	Ideal    float64 `json:"ideal_tokens"`
	// Utilization is Admitted ÷ min(Offered, B + R·T); VsIdeal is
	// Admitted ÷ Ideal (the simulator's measure).
	Utilization float64 `json:"utilization"`
	VsIdeal     float64 `json:"vs_ideal"`
	// Excess is the largest excess over every window; Bound the batch
	// term plus every fault's term.
	Excess    float64 `json:"excess_tokens"`
	FromS     float64 `json:"excess_from_s"`
	ToS       float64 `json:"excess_to_s"`
	Bound     float64 `json:"bound_tokens"`
	Unbounded bool    `json:"unbounded,omitempty"`
	Verdict   string  `json:"verdict"`
}

// FaultResult is one fault's row: the excess in windows meeting the
// fault's influence against the bound for it (and for any fault whose
// influence overlaps it). A row with Fault "none" covers the windows that
// meet no fault.
type FaultResult struct {
	Fault   string  `json:"fault"`
	Sim     bool    `json:"sim"`
	Rule    string  `json:"rule"`
	Key     string  `json:"key,omitempty"`
	AtS     float64 `json:"at_s"`
	ForS    float64 `json:"for_s"`
	StartS  float64 `json:"start_s"`
	EndS    float64 `json:"end_s,omitempty"`
	HealedS float64 `json:"healed_s,omitempty"`
	Detail  string  `json:"detail,omitempty"`
	Err     string  `json:"error,omitempty"`
	// Alloc is the region's allocation of the key when the fault began
	// (tokens per second), the input of an emergency term.
	Alloc     float64 `json:"alloc_per_s,omitempty"`
	Term      Term    `json:"term"`
	Bound     float64 `json:"bound_tokens"`
	Unbounded bool    `json:"unbounded,omitempty"`
	Excess    float64 `json:"excess_tokens"`
	FromS     float64 `json:"excess_from_s"`
	ToS       float64 `json:"excess_to_s"`
	Verdict   string  `json:"verdict"`
}

// CheckResult is one check of the failure handling's promises. Enforced
// checks decide the verdict; the others are reported figures.
type CheckResult struct {
	Name     string `json:"name"`
	Subject  string `json:"subject"`
	Value    string `json:"value"`
	Limit    string `json:"limit"`
	Pass     bool   `json:"pass"`
	Enforced bool   `json:"enforced"`
}

// ShiftResult is the convergence after one demand shift: by allocation
// (the region's allocation within 5% of its max-min fair share of the
// budget, from the agents' /status) and by admission (the simulator's
// measure: a bin in which the system admits ≥ 95% of what the ideal
// bucket admits).
type ShiftResult struct {
	Region string  `json:"region"`
	Rule   string  `json:"rule"`
	Key    string  `json:"key"`
	AtS    float64 `json:"at_s"`
	Fair   float64 `json:"fair_share_per_s"`
	// Peak is the largest allocation ÷ fair share until it converged (or
	// the next shift).
	Peak   float64  `json:"peak_ratio"`
	AllocS *float64 `json:"by_allocation_s"`
	AdmitS *float64 `json:"by_admission_s"`
}

type budgetKey struct {
	rule int
	key  int32
}

// analysis holds what the checks share.
type analysis struct {
	sc     *Scenario
	hist   []Decision
	rounds []Round
	recs   []FaultRecord
	period time.Duration
	ttl    time.Duration
	end    time.Duration
}

// Analyze judges a run from its history, its sampling rounds and the
// faults as injected.
func Analyze(sc *Scenario, hist []Decision, rounds []Round, recs []FaultRecord, period time.Duration) *Result {
	s := sc.Sim
	ttl, refresh, _, _, _ := leaseTimings(s)
	a := &analysis{sc: sc, hist: hist, rounds: rounds, recs: recs, period: period, ttl: ttl + refresh, end: s.Duration}
	res := &Result{Scenario: s.Name, Path: sc.Path, Description: s.Description, Expect: sc.Block.Expect,
		Reason: sc.Block.Reason, DurationS: s.Duration.Seconds(), Coordinators: sc.Block.Coordinators,
		Requests: map[string]int64{}}
	for _, f := range sc.HarnessOnly() {
		res.HarnessOnly = append(res.HarnessOnly, f.Name())
	}
	spans := map[budgetKey][]Span{}
	arrivals := map[budgetKey][]Arrival{}
	for _, d := range hist {
		res.Requests[d.Outcome.String()]++
		k := budgetKey{int(d.Rule), d.Key}
		arrivals[k] = append(arrivals[k], Arrival{At: d.Send, Tokens: float64(d.Cost)})
		if d.Outcome == Admitted {
			spans[k] = append(spans[k], Span{Send: d.Send, Answer: d.Answer, Tokens: float64(d.Cost)})
		}
	}
	keys := make([]budgetKey, 0, len(arrivals))
	for k := range arrivals {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		if keys[i].rule != keys[j].rule {
			return keys[i].rule < keys[j].rule
		}
		return keys[i].key < keys[j].key
	})

	// Faults' terms per key, and their influence: from the start until a
	// lease TTL (plus a refresh) after the end, when every allocation
	// granted before the end has expired.
	type infl struct{ from, to time.Duration }
	influence := make([]infl, len(recs))
	for i, r := range recs {
		influence[i] = infl{r.Start, max(r.Start, r.End, healed(r)) + a.ttl}
	}
	overlaps := func(i, j int) bool {
		return influence[i].from <= influence[j].to && influence[j].from <= influence[i].to
	}
	terms := map[budgetKey][]Term{}
	allocs := map[budgetKey][]float64{}
	for _, k := range keys {
		rule := s.Rules[k.rule]
		for _, r := range recs {
			alloc, burst := 0.0, 0.0
			if r.Region != "" {
				alloc, burst = a.allocBefore(r.Region, k, r.Start)
			}
			outage := a.outage(r)
			terms[k] = append(terms[k], faultTerm(s, r.Fault, rule, alloc, burst, outage))
			allocs[k] = append(allocs[k], alloc)
		}
	}

	// Budgets over the whole run.
	for _, k := range keys {
		rule := s.Rules[k.rule]
		rate, burst := ruleRate(rule)
		br := BudgetResult{Rule: rule.Name, Key: keyName(int(k.key)), Rate: rate, Burst: burst}
		ideal := IdealAdmits(arrivals[k], rate, burst)
		for i, x := range arrivals[k] {
			br.Offered += x.Tokens
			if ideal[i] {
				br.Ideal += x.Tokens
			}
		}
		for _, sp := range spans[k] {
			br.Admitted += sp.Tokens
		}
		br.Utilization = br.Admitted / math.Min(br.Offered, burst+rate*s.Duration.Seconds())
		if br.Ideal > 0 {
			br.VsIdeal = br.Admitted / br.Ideal
		}
		ex := MaxExcess(spans[k], rate, burst, All)
		br.Excess, br.FromS, br.ToS = ex.Tokens, ex.From.Seconds(), ex.To.Seconds()
		bt := batchTerm(s, rule)
		br.Bound = bt.Tokens
		for _, t := range terms[k] {
			br.Bound += t.Tokens
		}
		br.Unbounded = math.IsInf(br.Bound, 1)
		br.Verdict = verdict(br.Excess, br.Bound)
		res.Budgets = append(res.Budgets, br)
	}

	// One row per fault and rule (the rule's worst key), and one for the
	// windows that meet no fault.
	for i, r := range recs {
		for ri, rule := range s.Rules {
			rate, burst := ruleRate(rule)
			bt := batchTerm(s, rule)
			var row *FaultResult
			for _, k := range keys {
				if k.rule != ri {
					continue
				}
				bound := bt.Tokens
				for j := range recs {
					if j == i || overlaps(i, j) {
						bound += terms[k][j].Tokens
					}
				}
				ex := MaxExcess(spans[k], rate, burst, Meeting(influence[i].from, influence[i].to))
				fr := FaultResult{Fault: r.Name(), Sim: r.Sim, Rule: rule.Name, Key: keyName(int(k.key)),
					AtS: r.At.Seconds(), ForS: r.For.Seconds(), StartS: r.Start.Seconds(), EndS: r.End.Seconds(),
					HealedS: healed(r).Seconds(), Detail: r.Detail, Err: r.Err, Alloc: allocs[k][i], Term: terms[k][i],
					Bound: bound, Unbounded: math.IsInf(bound, 1), Excess: ex.Tokens, FromS: ex.From.Seconds(), ToS: ex.To.Seconds()}
				fr.Verdict = verdict(fr.Excess, fr.Bound)
				if row == nil || fr.Excess-fr.Bound > row.Excess-row.Bound {
					row = &fr
				}
			}
			if row != nil {
				res.Faults = append(res.Faults, *row)
			}
		}
	}
	// The windows that meet no fault: inside the gaps between influences.
	cover := append([]infl(nil), influence...)
	sort.Slice(cover, func(i, j int) bool { return cover[i].from < cover[j].from })
	var gaps []infl
	at := time.Duration(math.MinInt64)
	for _, x := range cover {
		if x.from > at {
			gaps = append(gaps, infl{at, x.from})
		}
		at = max(at, x.to)
	}
	gaps = append(gaps, infl{at, math.MaxInt64})
	for ri, rule := range s.Rules {
		rate, burst := ruleRate(rule)
		bt := batchTerm(s, rule)
		var row *FaultResult
		for _, k := range keys {
			if k.rule != ri {
				continue
			}
			best := Excess{Tokens: math.Inf(-1)}
			for _, g := range gaps {
				if ex := MaxExcess(spans[k], rate, burst, Inside(g.from, g.to)); ex.Found && ex.Tokens > best.Tokens {
					best = ex
				}
			}
			if !best.Found {
				continue
			}
			fr := FaultResult{Fault: "none", Rule: rule.Name, Key: keyName(int(k.key)), Term: Term{Formula: "0: no fault"},
				Bound: bt.Tokens, Excess: best.Tokens, FromS: best.From.Seconds(), ToS: best.To.Seconds()}
			fr.Verdict = verdict(fr.Excess, fr.Bound)
			if row == nil || fr.Excess > row.Excess {
				row = &fr
			}
		}
		if row != nil {
			res.Faults = append(res.Faults, *row)
		}
	}

	res.Checks = append(res.Checks, a.speakers()...)
	res.Checks = append(res.Checks, a.recovery()...)
	res.Checks = append(res.Checks, a.emergencyStops()...)
	res.Checks = append(res.Checks, a.falseOutages())
	res.Shifts = a.shifts(arrivals)
	for _, sh := range res.Shifts {
		c := CheckResult{Name: CheckConvergence, Subject: fmt.Sprintf("%s %s/%s at %.0fs", sh.Region, sh.Rule, sh.Key, sh.AtS),
			Limit: sc.Block.ConvergeWithin.String(), Enforced: sc.Has(CheckConvergence)}
		if sh.AllocS != nil {
			// To the millisecond: a round lands a few ms after its tick,
			// and a move read at 1.503 s is slower than 1.5 s.
			c.Value = fmt.Sprintf("%.3fs", *sh.AllocS)
			c.Pass = *sh.AllocS <= sc.Block.ConvergeWithin.Seconds()
		} else {
			c.Value = fmt.Sprintf("never (at most %.2f of the fair %.0f/s)", sh.Peak, sh.Fair)
		}
		res.Checks = append(res.Checks, c)
	}

	// The verdict.
	for _, f := range res.Faults {
		if f.Verdict == Fail {
			res.Failures = append(res.Failures, fmt.Sprintf("excess %.1f > bound %.1f (%s, %s/%s, window %.2f–%.2fs)",
				f.Excess, f.Bound, f.Fault, f.Rule, f.Key, f.FromS, f.ToS))
		}
	}
	for _, b := range res.Budgets {
		if b.Verdict == Fail {
			res.Failures = append(res.Failures, fmt.Sprintf("excess %.1f > bound %.1f over the run (%s/%s)", b.Excess, b.Bound, b.Rule, b.Key))
		}
	}
	for _, c := range res.Checks {
		if c.Enforced && !c.Pass {
			res.Failures = append(res.Failures, fmt.Sprintf("%s: %s: %s (limit %s)", c.Name, c.Subject, c.Value, c.Limit))
		}
	}
	for _, r := range recs {
		if r.Err != "" {
			res.Failures = append(res.Failures, fmt.Sprintf("fault %s could not be injected as asked: %s", r.Name(), r.Err))
		}
	}
	res.Verdict = Pass
	if len(res.Failures) > 0 {
		res.Verdict = Fail
	}
	res.Outcome = "as expected"
	if (res.Verdict == Fail) != (res.Expect == ExpectFail) {
		res.Outcome = "UNEXPECTED"
	}
	return res
}

func verdict(excess, bound float64) string {
	switch {
	case math.IsInf(bound, 1):
		return Unbounded
	case excess <= bound+1e-6:
		return Pass
	}
	return Fail
}

// healed is when a Redis fault's outage ended (0 when it did not, or the
// fault is not one).
func healed(r FaultRecord) time.Duration {
	switch r.Kind {
	case sim.FaultRedisCut:
		return r.End
	case FaultRedisKill, sim.FaultRedisFailover:
		return r.Healed
	}
	return 0
}

// outage is how long a Redis fault left the store unanswering: until it
// healed, or until the end of the run.
func (a *analysis) outage(r FaultRecord) time.Duration {
	if h := healed(r); h > 0 {
		return h - r.Start
	}
	return a.end - r.Start
}

func (a *analysis) budget(rule sim.RuleSpec) lease.Budget {
	var regions []string
	for _, r := range a.sc.Sim.Regions {
		regions = append(regions, r.Name)
	}
	return lease.Budget{Rule: rule.Name, Limit: bucket.Per(bucket.Tokens(rule.Count), rule.Period).WithBurst(bucket.Tokens(rule.Burst)),
		Regions: regions, Reserve: rule.Reserve}
}

// allocation is region ri's allocation of key k at round rd, per second,
// and its burst, as its up agents see it: the coordinator's entry while the
// lease lives, else the floor. The largest view among the agents counts.
// ok is false when no agent of the region answered.
func (a *analysis) allocation(rd Round, ri int, k budgetKey) (rate, burst float64, ok bool) {
	rate, burst, _, ok = a.allocationSince(rd, ri, k)
	return rate, burst, ok
}

// allocationSince is allocation, and when the first of the agents that
// hold it from an entry adopted the table it is in, by their /status (0
// when none says, or it is the floor): the allocation was in force by
// then, perhaps earlier (an older table may have held the same entry).
func (a *analysis) allocationSince(rd Round, ri int, k budgetKey) (rate, burst float64, adopted time.Duration, ok bool) {
	rule := a.sc.Sim.Rules[k.rule]
	b := a.budget(rule)
	name := rule.Name + "/" + keyName(int(k.key))
	region := a.sc.Sim.Regions[ri].Name
	best := -1.0
	for _, s := range rd.Agents[ri] {
		if !s.Up {
			continue
		}
		f := b.Floor(region)
		count, bu := float64(f.Count), float64(f.Burst)
		var at time.Duration
		if e, has := s.Entries[name]; has && s.LeaseLive {
			count, bu, at = float64(e[0]), float64(e[1]), s.Adopted
		}
		switch {
		case count > best:
			best, burst, adopted = count, bu, at
		case count == best && at > 0 && (adopted == 0 || at < adopted):
			adopted = at
		}
	}
	if best < 0 {
		return 0, 0, 0, false
	}
	return best / rule.Period.Seconds(), burst, adopted, true
}

// allocBefore is the region's allocation at the last round before t.
func (a *analysis) allocBefore(region string, k budgetKey, t time.Duration) (rate, burst float64) {
	ri := indexOfRegion(a.sc.Sim, region)
	for i := len(a.rounds) - 1; i >= 0; i-- {
		if a.rounds[i].T <= t {
			if r, b, ok := a.allocation(a.rounds[i], ri, k); ok {
				return r, b
			}
		}
	}
	return 0, 0
}

// keyShare is the share of a stream's arrivals that go to key.
func keyShare(t sim.TrafficSpec, keys int, key int) float64 {
	switch {
	case t.Key != nil:
		if *t.Key == key {
			return 1
		}
		return 0
	case keys <= 1:
		return 1
	case t.Zipf > 1:
		// math/rand/v2's Zipf with v = 1: P(k) ∝ (1+k)^−s on [0, keys−1].
		var sum float64
		for i := range keys {
			sum += math.Pow(float64(1+i), -t.Zipf)
		}
		return math.Pow(float64(1+key), -t.Zipf) / sum
	}
	return 1 / float64(keys)
}

func meanCost(t sim.TrafficSpec) float64 {
	var w, v float64
	for _, c := range t.Cost {
		w += c.Weight
		v += c.Weight * float64(c.Value)
	}
	if w == 0 {
		return 1
	}
	return v / w
}

// demand is region ri's offered tokens per second for key k at t.
func (a *analysis) demand(ri int, k budgetKey, t time.Duration) float64 {
	s := a.sc.Sim
	var d float64
	for _, tr := range s.Traffic {
		if tr.Region != s.Regions[ri].Name || indexOfRule(s, tr.Rule) != k.rule || t < tr.Start || t >= tr.Stop {
			continue
		}
		d += tr.Rate * keyShare(tr, s.Rules[k.rule].Keys, int(k.key)) * meanCost(tr)
	}
	return d
}

// fairShare is region ri's max-min fair share of key k's budget at t.
func (a *analysis) fairShare(ri int, k budgetKey, t time.Duration) float64 {
	s := a.sc.Sim
	rate, _ := ruleRate(s.Rules[k.rule])
	ds := make([]float64, len(s.Regions))
	for i := range s.Regions {
		ds[i] = a.demand(i, k, t)
	}
	return FairShares(rate, ds)[ri]
}

// sustain is how long a region must hold its share to count as having
// reached it: a table caught between two publications (the floor for a
// moment, say) is not a recovery.
const sustain = time.Second

// reachShare returns when, at or after from (and before until), region
// ri's allocation of k came to stay at least 95% of its fair share (or its
// fair share less the fraction margin and then slack, or capAt, when
// lower) for sustain (or until until) — with every answering agent's
// breaker closed too when closed is set, since a region whose breaker is
// open admits nothing of its share — and the largest ratio of allocation
// to fair share seen. The time is the first round that finds it so, or,
// when the agents say when they adopted the table that brought it and
// that was after the round before (whose breakers, when closed is set,
// were closed already), that adoption: a round finds a move done up to a
// sampling period after it was.
func (a *analysis) reachShare(ri int, k budgetKey, from, until time.Duration, closed bool, capAt, slack, margin float64) (time.Duration, float64, bool) {
	enough := func(alloc, fair float64) bool {
		return alloc >= math.Min(math.Min(0.95*fair, fair*(1-margin)-slack), capAt)
	}
	peak := 0.0
	start, in := time.Duration(0), false
	for i, rd := range a.rounds {
		if rd.T < from || rd.T > until {
			continue
		}
		alloc, _, adopted, ok := a.allocationSince(rd, ri, k)
		fair := a.fairShare(ri, k, rd.T)
		if !ok || fair <= 0 {
			continue
		}
		peak = math.Max(peak, alloc/fair)
		switch {
		case !enough(alloc, fair) || (closed && !breakersClosed(rd, ri)):
			in = false
		case !in:
			start, in = rd.T, true
			// The adoption times the move when it explains it: after the
			// round before (whose breakers were closed already, when they
			// count), and enough against the fair share then (a stream
			// that starts or stops between the rounds moves it).
			if i > 0 {
				prev, at := a.rounds[i-1], max(adopted, from)
				if adopted > prev.T && adopted <= rd.T && (!closed || breakersClosed(prev, ri)) && enough(alloc, a.fairShare(ri, k, at)) {
					start = at
				}
			}
		}
		if in && rd.T-start >= sustain {
			return start, peak, true
		}
	}
	if in {
		return start, peak, true // held until the end of the phase
	}
	return 0, peak, false
}

// breakersClosed reports whether every answering agent of region ri had
// its breaker closed at rd.
func breakersClosed(rd Round, ri int) bool {
	for _, s := range rd.Agents[ri] {
		if s.Up && s.Breaker != "closed" {
			return false
		}
	}
	return true
}

// hottest is the key of rule with the largest demand in region ri at t.
func (a *analysis) hottest(ri, rule int, t time.Duration) (budgetKey, float64) {
	best, bd := budgetKey{rule: rule}, -1.0
	for key := range a.sc.Sim.Rules[rule].Keys {
		k := budgetKey{rule, int32(key)}
		if d := a.demand(ri, k, t); d > bd {
			best, bd = k, d
		}
	}
	return best, bd
}

func redisOutage(kind string) bool {
	return kind == sim.FaultRedisCut || kind == FaultRedisKill || kind == sim.FaultRedisFailover
}

// speakerOverlap is how long a region may be seen with two speaking
// agents: a handover caught mid-way, for up to one sampling period of
// 200 ms (the harness sampled at that period when the check was set as
// "never two rounds running").
const speakerOverlap = 200 * time.Millisecond

// speakers checks that no region is seen with two speaking agents for
// longer than speakerOverlap: a run of n rounds counts n sampling periods.
func (a *analysis) speakers() []CheckResult {
	var out []CheckResult
	for ri, reg := range a.sc.Sim.Regions {
		run, longest, total := 0, 0, 0
		for _, rd := range a.rounds {
			n := 0
			for _, s := range rd.Agents[ri] {
				if s.Up && s.Speaking {
					n++
				}
			}
			if n >= 2 {
				run++
				total++
				longest = max(longest, run)
			} else {
				run = 0
			}
		}
		seen := time.Duration(longest) * a.period
		out = append(out, CheckResult{Name: "one speaker", Subject: reg.Name,
			Value: fmt.Sprintf("two speakers in %d rounds (longest %s)", total, seen),
			Limit: "never seen for more than " + speakerOverlap.String(), Pass: seen <= speakerOverlap, Enforced: true})
	}
	return out
}

// recovery checks that after each Redis outage the region is back within
// RecoverWithin: its allocation of its busiest key at what it held before
// the outage (or 95% of its fair share now, or its fair share less the
// headroom and then the Allocator's hysteresis band, when lower) and its
// agents' breakers closed, held for a second.
func (a *analysis) recovery() []CheckResult {
	var out []CheckResult
	lim := a.sc.Block.RecoverWithin
	for _, r := range a.recs {
		if !redisOutage(r.Kind) {
			continue
		}
		ri := indexOfRegion(a.sc.Sim, r.Region)
		h := healed(r)
		for rule := range a.sc.Sim.Rules {
			c := CheckResult{Name: "recovery", Subject: fmt.Sprintf("%s %s after %s", r.Region, a.sc.Sim.Rules[rule].Name, r.Name()),
				Limit: lim.String(), Enforced: true}
			if h == 0 {
				c.Value, c.Pass = "the store never came back", true
				out = append(out, c)
				continue
			}
			k, d := a.hottest(ri, rule, h)
			if d <= 0 {
				continue
			}
			// Back means the allocation it held before the outage, or 95%
			// of its fair share now when that is lower (its demand may
			// have fallen).
			before, _ := a.allocBefore(r.Region, k, r.Start)
			if before <= 0 {
				before = math.Inf(1)
			}
			// A region whose demand is met holds its demand as its agents
			// estimate it, less the margin (Headroom) where the budget is
			// contested, within the Allocator's hysteresis band: a move
			// smaller than Hysteresis × Count is not made. For a light
			// region that band is wider than 5% of its share (30 of a
			// budget of 1,000 against a demand of 150), so back within it
			// is back.
			rate, _ := ruleRate(a.sc.Sim.Rules[rule])
			lc := a.sc.Sim.LeaseConfig()
			t, peak, ok := a.reachShare(ri, k, h, a.end, true, before, lc.Hysteresis*rate, lc.Headroom)
			switch {
			case ok:
				c.Value = fmt.Sprintf("%.2fs", (t - h).Seconds())
				c.Pass = t-h <= lim
			case a.end-h < lim+a.period:
				c.Value, c.Pass = "not measured: the run ended first", true
			default:
				alloc, _, _ := a.allocation(a.rounds[len(a.rounds)-1], ri, k)
				last := a.rounds[len(a.rounds)-1]
				var br []string
				for _, s := range last.Agents[ri] {
					br = append(br, s.Breaker)
				}
				c.Value = fmt.Sprintf("never (at the end %.0f/s of a fair %.0f/s, breakers %v; at most %.2f of the share)",
					alloc, a.fairShare(ri, k, a.end-1), br, peak)
			}
			out = append(out, c)
		}
	}
	return out
}

// emergencyStops checks that after each Redis outage in a region with an
// emergency rule, its agents admit on the emergency path for at most
// EmergencyStopWithin more. A counter that rose by round k shows an
// admission after round k−1 began, which is the instant counted.
func (a *analysis) emergencyStops() []CheckResult {
	var out []CheckResult
	hasEmergency := false
	for _, r := range a.sc.Sim.Rules {
		hasEmergency = hasEmergency || r.Policy == sim.PolicyEmergency
	}
	if !hasEmergency {
		return nil
	}
	lim := a.sc.Block.EmergencyStopWithin
	for _, r := range a.recs {
		if !redisOutage(r.Kind) {
			continue
		}
		h := healed(r)
		c := CheckResult{Name: "emergency stops", Subject: fmt.Sprintf("%s after %s", r.Region, r.Name()),
			Limit: lim.String(), Enforced: true}
		if h == 0 {
			c.Value, c.Pass = "the store never came back", true
			out = append(out, c)
			continue
		}
		ri := indexOfRegion(a.sc.Sim, r.Region)
		last := time.Duration(-1)
		prev := make([]int64, a.sc.Sim.Regions[ri].Agents)
		for k, rd := range a.rounds {
			rose := false
			for ai, s := range rd.Agents[ri] {
				if !s.Up {
					continue
				}
				if s.Emergency > prev[ai] || (s.Emergency < prev[ai] && s.Emergency > 0) {
					rose = true
				}
				prev[ai] = s.Emergency
			}
			if rose && k > 0 && a.rounds[k-1].T >= h {
				last = a.rounds[k-1].T
			}
		}
		switch {
		case last < 0:
			c.Value, c.Pass = "none after the store came back", true
		default:
			c.Value = fmt.Sprintf("until %.2fs after", (last - h).Seconds())
			c.Pass = last-h <= lim
		}
		if !c.Pass || a.end-h >= lim+2*a.period {
			out = append(out, c)
		}
	}
	return out
}

// falseOutages counts breaker openings outside every Redis outage of the
// agent's region (a slow Redis is not an outage).
func (a *analysis) falseOutages() CheckResult {
	n := 0
	var where []string
	for ri, reg := range a.sc.Sim.Regions {
		var outages [][2]time.Duration
		for _, r := range a.recs {
			if redisOutage(r.Kind) && r.Region == reg.Name {
				end := healed(r)
				if end == 0 {
					end = a.end
				}
				outages = append(outages, [2]time.Duration{r.Start, end + time.Second})
			}
		}
		for ai := range reg.Agents {
			var prev int64
			for k, rd := range a.rounds {
				if ai >= len(rd.Agents[ri]) || !rd.Agents[ri][ai].Up {
					continue
				}
				v := rd.Agents[ri][ai].BreakerOpened
				inc := v - prev
				if v < prev {
					inc = v // a restarted agent counts from zero
				}
				prev = v
				if inc <= 0 || k == 0 {
					continue
				}
				from, to := a.rounds[k-1].T, rd.T
				during := false
				for _, o := range outages {
					if from <= o[1] && o[0] <= to {
						during = true
					}
				}
				if !during {
					n += int(inc)
					where = append(where, fmt.Sprintf("%s-%d at %.1fs", reg.Name, ai, to.Seconds()))
				}
			}
		}
	}
	v := fmt.Sprintf("%d", n)
	if len(where) > 0 {
		if len(where) > 6 {
			where = append(where[:6], "…")
		}
		v += fmt.Sprintf(" (%v)", where)
	}
	return CheckResult{Name: "no false outage", Subject: "breaker openings outside Redis outages", Value: v, Limit: "0",
		Pass: n == 0, Enforced: a.sc.Has(CheckNoFalseOutage)}
}

// shifts measures convergence after every stream marked shift.
func (a *analysis) shifts(arrivals map[budgetKey][]Arrival) []ShiftResult {
	s := a.sc.Sim
	var out []ShiftResult
	bins := s.Bins
	width := s.Duration / time.Duration(bins)
	for _, t := range s.Traffic {
		if !t.Shift {
			continue
		}
		ri, rule := indexOfRegion(s, t.Region), indexOfRule(s, t.Rule)
		key := 0
		if t.Key != nil {
			key = *t.Key
		}
		k := budgetKey{rule, int32(key)}
		until := a.end
		for _, u := range s.Traffic {
			if u.Shift && u.Rule == t.Rule && u.Start > t.Start && u.Start < until {
				until = u.Start
			}
		}
		sh := ShiftResult{Region: t.Region, Rule: t.Rule, Key: keyName(key), AtS: t.Start.Seconds(),
			Fair: a.fairShare(ri, k, t.Start)}
		at, peak, ok := a.reachShare(ri, k, t.Start, until, false, math.Inf(1), 0, 0)
		sh.Peak = peak
		if ok {
			v := (at - t.Start).Seconds()
			sh.AllocS = &v
		}
		// The simulator's measure: real admissions of the rule per bin
		// (by send) against the ideal bucket's on the same arrivals.
		real, ideal := make([]float64, bins), make([]float64, bins)
		for bk, arr := range arrivals {
			if bk.rule != rule {
				continue
			}
			rate, burst := ruleRate(s.Rules[rule])
			ok := IdealAdmits(arr, rate, burst)
			for i, x := range arr {
				if b := int(x.At / width); ok[i] && b >= 0 && b < bins {
					ideal[b] += x.Tokens
				}
			}
		}
		for _, d := range a.hist {
			if int(d.Rule) == rule && d.Outcome == Admitted {
				if b := int(d.Send / width); b >= 0 && b < bins {
					real[b] += float64(d.Cost)
				}
			}
		}
		for b := int(t.Start / width); b < bins; b++ {
			if ideal[b] == 0 {
				continue
			}
			if real[b] >= 0.95*ideal[b] {
				v := (time.Duration(b+1)*width - t.Start).Seconds()
				sh.AdmitS = &v
				break
			}
		}
		out = append(out, sh)
	}
	return out
}
