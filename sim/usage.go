package sim

import (
	"math"
	"sort"
)

// utilWindow is the window over which a system's use of a budget is capped
// at the ideal bucket's: within one window, tokens admitted beyond what the
// ideal admitted are overshoot, not use. One second is long enough that a
// decision made a WAN round trip after the arrival still falls in the same
// window as the ideal's, and short enough that a burst admitted too early
// is not offset by a lull admitted too late.
const utilWindow Micros = 1_000_000

// measuredShare is the smallest share of a rule's ideal tokens a budget
// must carry to be measured on its own: a Zipf tail of keys that each see a
// handful of requests says nothing about how a budget is shared.
const measuredShare = 0.01

// contestedShare is the share of a budget's requests the ideal bucket must
// reject for its demand to count as exceeding the budget.
const contestedShare = 0.01

// usage is one system's per-budget figures: its use capped per window at
// the ideal bucket's admissions, its requests and its false rejects (for
// the ideal bucket itself, its rejects).
type usage struct {
	b       []budgetUse // per budget
	touched []int32     // budgets with win > 0, so a window closes in time proportional to its traffic
}

// budgetUse is one budget's figures in a usage, together so that a
// decision touches one cache line of them, not one in each of four slices.
type budgetUse struct {
	win      int64 // tokens admitted in the current window
	capped   int64 // Σ over closed windows of min(win, the ideal's win)
	requests int64
	rej      int64
}

func newUsage(nb int) *usage {
	return &usage{b: make([]budgetUse, nb)}
}

// add records cost tokens admitted for budget b in the current window.
func (u *usage) add(b int, cost int64) {
	bu := &u.b[b]
	if bu.win == 0 {
		u.touched = append(u.touched, int32(b)) // #nosec G115 -- a budget index; 2^31 budgets would not fit in memory
	}
	bu.win += cost
}

// closeWindow ends the current utilization window at every meter: each
// system's use of each budget in it counts up to what the ideal admitted.
func (w *world) closeWindow() {
	iu := w.idealM.u
	for _, m := range w.meters {
		u := m.u
		for _, b := range u.touched {
			bu := &u.b[b]
			bu.capped += min(bu.win, iu.b[b].win)
			bu.win = 0
		}
		u.touched = u.touched[:0]
	}
	for _, b := range iu.touched {
		bu := &iu.b[b]
		bu.capped += bu.win
		bu.win = 0
	}
	iu.touched = iu.touched[:0]
	w.winEnd += utilWindow
}

// BudgetOutcome is one measured budget's figures for one system.
type BudgetOutcome struct {
	Key int `json:"key"`
	// IdealTokens is what the ideal bucket admitted for the budget;
	// Contested marks a budget whose demand exceeded it (the ideal rejected
	// at least 1% of its requests).
	IdealTokens int64 `json:"ideal_tokens"`
	Contested   bool  `json:"contested,omitempty"`
	// Utilization is the system's use, capped per window at the ideal's,
	// over the ideal's tokens.
	Utilization float64 `json:"utilization"`
	// FalseRejectPct is the share of the budget's requests the system
	// rejected that the ideal admitted.
	FalseRejectPct float64 `json:"false_reject_pct"`
}

// ruleUsage fills ro's utilization and false-reject figures from u: the
// rule's use, and per measured budget (those carrying at least 1% of the
// rule's ideal tokens) the worst and the mean.
func (w *world) ruleUsage(ro *RuleOutcome, r *ruleRT, u *usage) {
	iu := w.idealM.u
	var ideal, used, req, fr int64
	for k := 0; k < r.keys; k++ {
		b := r.base + k
		ideal += iu.b[b].capped
		used += u.b[b].capped
		req += u.b[b].requests
		fr += u.b[b].rej
	}
	if ideal > 0 {
		ro.Utilization = round(float64(used)/float64(ideal), 6)
	}
	if req > 0 {
		ro.FalseRejectPct = round(100*float64(fr)/float64(req), 4)
	}
	ro.WorstUtilKey, ro.WorstFalseRejectKey = -1, -1
	var sumU, sumF float64
	for k := 0; k < r.keys; k++ {
		b := r.base + k
		bu, ibu := &u.b[b], &iu.b[b]
		it := ibu.capped
		if it == 0 || float64(it) < measuredShare*float64(ideal) {
			continue
		}
		bo := BudgetOutcome{Key: k, IdealTokens: it, Utilization: round(float64(bu.capped)/float64(it), 6),
			Contested: float64(ibu.rej) >= contestedShare*float64(ibu.requests)}
		if bu.requests > 0 {
			bo.FalseRejectPct = round(100*float64(bu.rej)/float64(bu.requests), 4)
		}
		ro.Budgets = append(ro.Budgets, bo)
		sumU += bo.Utilization
		sumF += bo.FalseRejectPct
		if ro.WorstUtilKey < 0 || bo.Utilization < ro.WorstUtilization {
			ro.WorstUtilization, ro.WorstUtilKey = bo.Utilization, k
		}
		if ro.WorstFalseRejectKey < 0 || bo.FalseRejectPct > ro.WorstFalseRejectPct {
			ro.WorstFalseRejectPct, ro.WorstFalseRejectKey = bo.FalseRejectPct, k
		}
	}
	if n := float64(len(ro.Budgets)); n > 0 {
		ro.MeanUtilization = round(sumU/n, 6)
		ro.MeanFalseRejectPct = round(sumF/n, 4)
	}
	sort.Slice(ro.Budgets, func(i, j int) bool { return ro.Budgets[i].IdealTokens > ro.Budgets[j].IdealTokens })
}

// vsStatic sets, for every system but the static split, the smallest
// difference over measured budgets between its utilization and the static
// split's on the same budget: negative where it used a budget less well.
func vsStatic(res *Result) {
	var st *SystemResult
	for i := range res.Systems {
		if res.Systems[i].Name == "static" {
			st = &res.Systems[i]
		}
	}
	if st == nil {
		return
	}
	for i := range res.Systems {
		s := &res.Systems[i]
		if s == st {
			continue
		}
		for j := range s.Rules {
			ro := &s.Rules[j]
			byKey := map[int]float64{}
			for _, b := range st.Rules[j].Budgets {
				byKey[b.Key] = b.Utilization
			}
			d := math.Inf(1)
			for _, b := range ro.Budgets {
				if v := b.Utilization - byKey[b.Key]; v < d {
					d, ro.VsStaticKey = v, b.Key
				}
			}
			if !math.IsInf(d, 1) {
				v := round(d, 6)
				ro.VsStatic = &v
			}
		}
	}
}
