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

// use records cost tokens admitted for budget b in the current window.
func (m *meter) use(b int, cost int64) {
	bm := &m.b[b]
	if bm.win == 0 {
		m.touched = append(m.touched, int32(b)) // #nosec G115 -- a budget index; 2^31 budgets would not fit in memory
	}
	bm.win += cost
}

// closeWindow ends the current utilization window at every meter: each
// system's use of each budget in it counts up to what the ideal admitted,
// and, in a clear window (clearWindow), counts again apart.
func (w *world) closeWindow() {
	im := w.idealM
	clear := w.clearWindow(w.winEnd-utilWindow, w.winEnd)
	for _, m := range w.meters {
		for _, b := range m.touched {
			bm := &m.b[b]
			u := min(bm.win, im.b[b].win)
			m.cold[b].capped += u
			if clear {
				m.cold[b].clear += u
			}
			bm.win = 0
		}
		m.touched = m.touched[:0]
	}
	for _, b := range im.touched {
		bm := &im.b[b]
		im.cold[b].capped += bm.win
		if clear {
			im.cold[b].clear += bm.win
		}
		bm.win = 0
	}
	im.touched = im.touched[:0]
	w.winEnd += utilWindow
}

// clearWindow says whether the utilization window [from, to) is clear:
// it begins after the run's first window, which holds the start (every
// region on its floor until its first grant), and meets no fault's
// influence, from the fault's start until a lease TTL plus a refresh after
// its end (as the chaos harness's checker counts it). A clear window is
// where allot and the static split stand on the same ground: no region
// held to its floor by the start or by a fault the static split has no
// part in, and no recovery still under way.
func (w *world) clearWindow(from, to Micros) bool {
	if from < utilWindow || w.sc == nil {
		return false
	}
	after := us(w.sc.Coordinator.LeaseTTL + w.sc.Coordinator.Refresh)
	for _, f := range w.sc.Faults {
		if us(f.At) < to && from < us(f.At+f.For)+after {
			return false
		}
	}
	return true
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
	// ClearIdealTokens is what the ideal admitted in the run's clear
	// windows (clearWindow), ClearUtilization the system's use over it,
	// capped per window as Utilization is; both 0 when the run has no
	// clear window or the ideal admitted nothing in them.
	ClearIdealTokens int64   `json:"clear_ideal_tokens,omitempty"`
	ClearUtilization float64 `json:"clear_utilization,omitempty"`
}

// ruleUsage fills ro's utilization and false-reject figures from m: the
// rule's use, and per measured budget (those carrying at least 1% of the
// rule's ideal tokens) the worst and the mean.
func (w *world) ruleUsage(ro *RuleOutcome, r *ruleRT, m *meter) {
	im := w.idealM
	var ideal, used, req, fr int64
	for k := 0; k < r.keys; k++ {
		b := r.base + k
		ideal += im.cold[b].capped
		used += m.cold[b].capped
		req += m.b[b].requests
		fr += m.b[b].rej
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
		bu, ibu := &m.b[b], &im.b[b]
		it := im.cold[b].capped
		if it == 0 || float64(it) < measuredShare*float64(ideal) {
			continue
		}
		bo := BudgetOutcome{Key: k, IdealTokens: it, Utilization: round(float64(m.cold[b].capped)/float64(it), 6),
			Contested: float64(ibu.rej) >= contestedShare*float64(ibu.requests)}
		if ct := im.cold[b].clear; ct > 0 {
			bo.ClearIdealTokens, bo.ClearUtilization = ct, round(float64(m.cold[b].clear)/float64(ct), 6)
		}
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
	st := res.System("static")
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
