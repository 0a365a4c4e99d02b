package chaos

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/allot-dev/allot/sim"
)

// SimSide is the simulator's result on the same scenario file, for the
// side-by-side table: allot alone (and the ideal bucket), at the real
// run's seed, the faults the simulator expresses.
type SimSide struct {
	Seed    uint64    `json:"seed"`
	Verdict string    `json:"verdict"`
	Rules   []SimRule `json:"rules"`
	// Utilization is allot's tokens admitted ÷ the ideal bucket's.
	Utilization  float64  `json:"utilization"`
	ConvergenceS *float64 `json:"convergence_s,omitempty"`
	// NotRun names the harness-only faults the simulator did not run.
	NotRun []string `json:"not_run,omitempty"`
	Err    string   `json:"error,omitempty"`
}

// SimRule is one rule's overshoot in the simulator.
type SimRule struct {
	Rule    string   `json:"rule"`
	Peak    float64  `json:"peak_tokens"`
	Bound   *float64 `json:"bound_tokens,omitempty"`
	Verdict string   `json:"verdict"`
}

// RunSim runs the simulator on the scenario at seed, the seed of the real
// run's arrivals (0: the scenario's first seed). The simulator ignores the
// chaos block and so every harness-only fault.
func RunSim(sc *Scenario, seed uint64) *SimSide {
	out := &SimSide{Seed: sc.seed(seed)}
	for _, f := range sc.HarnessOnly() {
		out.NotRun = append(out.NotRun, f.Name())
	}
	res, err := sim.Run(sc.Sim, out.Seed, sim.Options{Systems: []string{"allot"}})
	if err != nil {
		out.Err = err.Error()
		return out
	}
	out.Verdict = res.Verdict
	for _, s := range res.Systems {
		if s.Name != "allot" {
			continue
		}
		out.Utilization = s.Utilization
		out.ConvergenceS = s.ConvergenceS
		for _, r := range s.Rules {
			out.Rules = append(out.Rules, SimRule{Rule: r.Rule, Peak: r.PeakTokens, Bound: r.Bound, Verdict: r.Verdict})
		}
	}
	return out
}

// WriteJSON writes results as indented JSON to path.
func WriteJSON(path string, results []*Result) error {
	b, err := json.MarshalIndent(results, "", "  ")
	if err != nil {
		return fmt.Errorf("chaos: results: %w", err)
	}
	if err := os.WriteFile(path, append(b, '\n'), 0o600); err != nil {
		return fmt.Errorf("chaos: results: %w", err)
	}
	return nil
}

func f1(x float64) string {
	switch {
	case math.IsInf(x, 1):
		return "∞"
	case math.IsInf(x, -1):
		return "-"
	}
	return fmt.Sprintf("%.1f", x)
}

func optS(p *float64) string {
	if p == nil {
		return "-"
	}
	if *p < 0 {
		return "never"
	}
	return fmt.Sprintf("%.2f", *p)
}

// worstBudget is the budget with the least room under its bound.
func (r *Result) worstBudget() *BudgetResult {
	var w *BudgetResult
	for i := range r.Budgets {
		b := &r.Budgets[i]
		if w == nil || b.Excess-b.Bound > w.Excess-w.Bound {
			w = b
		}
	}
	return w
}

// utilization is the mean over budgets of Utilization and VsIdeal,
// weighted by offered tokens, and the worst budget's Utilization.
func (r *Result) utilization() (mean, vsIdeal, worst float64) {
	var off, adm, ideal float64
	worst = math.Inf(1)
	var denom float64
	for _, b := range r.Budgets {
		off += b.Offered
		adm += b.Admitted
		ideal += b.Ideal
		denom += b.Admitted / math.Max(b.Utilization, 1e-12)
		worst = math.Min(worst, b.Utilization)
	}
	if denom > 0 {
		mean = adm / denom
	}
	if ideal > 0 {
		vsIdeal = adm / ideal
	}
	if math.IsInf(worst, 1) {
		worst = 0
	}
	return mean, vsIdeal, worst
}

// worstShift is the slowest convergence by allocation and by admission
// (nil when there is no shift; −1 when one never converged).
func (r *Result) worstShift() (alloc, admit *float64) {
	for _, sh := range r.Shifts {
		for _, p := range []struct {
			in  *float64
			out **float64
		}{{sh.AllocS, &alloc}, {sh.AdmitS, &admit}} {
			v := -1.0
			if p.in != nil {
				v = *p.in
			}
			if *p.out == nil || (**p.out >= 0 && (v < 0 || v > **p.out)) {
				x := v
				*p.out = &x
			}
		}
	}
	return alloc, admit
}

// PrintSummary writes one line per run.
func PrintSummary(w io.Writer, results []*Result) {
	label := labels(results)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\texpect\tverdict\toutcome\tworst excess / bound\tutil (worst)\tvs ideal\tconverge s (alloc/admit)\tload avg\twhy")
	for _, r := range results {
		wb := r.worstBudget()
		ex, bd := "-", "-"
		if wb != nil {
			ex, bd = f1(math.Max(wb.Excess, 0)), f1(wb.Bound)
		}
		u, vi, uw := r.utilization()
		ca, cd := r.worstShift()
		why := ""
		if len(r.Failures) > 0 {
			why = r.Failures[0]
			if len(r.Failures) > 1 {
				why += fmt.Sprintf(" (+%d more)", len(r.Failures)-1)
			}
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s / %s\t%.2f (%.2f)\t%.2f\t%s / %s\t%.1f–%.1f\t%s\n", label(r), r.Expect, r.Verdict, r.Outcome,
			ex, bd, u, uw, vi, optS(ca), optS(cd), r.LoadAvg.Start, r.LoadAvg.Max, why)
	}
	_ = tw.Flush() // a table for the terminal; a failed write there has no one to tell
	if line := movesWithin(results, label); line != "" {
		fmt.Fprintln(w, line)
	}
}

// labels names each run in the tables: its scenario, and its seed too
// when some scenario ran at more than one (chaos -seeds).
func labels(results []*Result) func(*Result) string {
	seeds := map[string]map[uint64]bool{}
	multi := false
	for _, r := range results {
		if seeds[r.Scenario] == nil {
			seeds[r.Scenario] = map[uint64]bool{}
		}
		seeds[r.Scenario][r.Seed] = true
		multi = multi || len(seeds[r.Scenario]) > 1
	}
	return func(r *Result) string {
		if multi {
			return fmt.Sprintf("%s seed %d", r.Scenario, r.Seed)
		}
		return r.Scenario
	}
}

// movesWithin tallies the runs' demand shifts whose region came within 5%
// of its fair share by allocation inside the scenario's convergence limit
// (its convergence checks, enforced or not), and names the others: the
// harness's figure for the three-refresh target, counted the same way in
// every run, each run named by label. Empty when no run had a shift.
func movesWithin(results []*Result, label func(*Result) string) string {
	n, ok := 0, 0
	var miss []string
	for _, r := range results {
		for _, c := range r.Checks {
			if c.Name != CheckConvergence {
				continue
			}
			n++
			if c.Pass {
				ok++
				continue
			}
			miss = append(miss, fmt.Sprintf("%s %s: %s", label(r), c.Subject, c.Value))
		}
	}
	if n == 0 {
		return ""
	}
	line := fmt.Sprintf("moves within their convergence limit: %d of %d", ok, n)
	if len(miss) > 0 {
		line += "; slower: " + strings.Join(miss, ", ")
	}
	return line
}

// PrintDetail writes a run's fault rows and checks.
func PrintDetail(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n== %s: %s (%s, expected %s)", r.Scenario, r.Verdict, r.Outcome, r.Expect)
	if r.Reason != "" {
		fmt.Fprintf(w, " — %s", r.Reason)
	}
	fmt.Fprintf(w, "\n   %s; seed %d; load average %.1f–%.1f (mean %.1f); cores used: harness %.2f, processes %.2f; requests %v\n",
		r.Description, r.Seed, r.LoadAvg.Start, r.LoadAvg.Max, r.LoadAvg.Mean, r.CPU.Harness, r.CPU.Processes, r.Requests)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   fault\trule/key\tinjected s\tterm\tbound\texcess\twindow s\tverdict\tdetail")
	for _, f := range r.Faults {
		when := "-"
		if f.Fault != "none" {
			when = fmt.Sprintf("%.1f–%s", f.StartS, endS(f))
		}
		detail := f.Detail
		if f.Err != "" {
			detail += " ERROR " + f.Err
		}
		fmt.Fprintf(tw, "   %s\t%s/%s\t%s\t%s\t%s\t%s\t%.2f–%.2f\t%s\t%s\n", f.Fault, f.Rule, f.Key, when, f.Term.Formula,
			f1(f.Bound), f1(math.Max(f.Excess, 0)), f.FromS, f.ToS, f.Verdict, detail)
	}
	_ = tw.Flush() // a table for the terminal; a failed write there has no one to tell
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "   check\tsubject\tvalue\tlimit\tresult")
	for _, c := range r.Checks {
		res := "ok"
		if !c.Pass {
			res = "FAIL"
			if !c.Enforced {
				res = "missed (figure only)"
			}
		}
		fmt.Fprintf(tw, "   %s\t%s\t%s\t%s\t%s\n", c.Name, c.Subject, c.Value, c.Limit, res)
	}
	_ = tw.Flush() // a table for the terminal; a failed write there has no one to tell
	for _, b := range r.Budgets {
		fmt.Fprintf(w, "   budget %s/%s: offered %.0f, admitted %.0f, ideal %.0f; utilization %.3f of min(offered, B+R·T), %.3f of ideal; excess %s (bound %s) %s\n",
			b.Rule, b.Key, b.Offered, b.Admitted, b.Ideal, b.Utilization, b.VsIdeal, f1(math.Max(b.Excess, 0)), f1(b.Bound), b.Verdict)
	}
	if r.Dir != "" {
		fmt.Fprintf(w, "   logs: %s\n", r.Dir)
	}
}

func endS(f FaultResult) string {
	if f.EndS == 0 {
		return "…"
	}
	s := fmt.Sprintf("%.1f", f.EndS)
	if f.HealedS > 0 && math.Abs(f.HealedS-f.EndS) > 0.05 {
		s += fmt.Sprintf(" (store back %.1f)", f.HealedS)
	}
	return s
}

// PrintSideBySide writes the real run beside the simulator's, per
// scenario.
func PrintSideBySide(w io.Writer, results []*Result) {
	label := labels(results)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "scenario\treal excess / bound\treal verdict\tsim overshoot / bound\tsim verdict\treal util vs ideal\tsim util\treal converge s (admit)\tsim converge s\tsim did not run")
	for _, r := range results {
		if r.Sim == nil {
			continue
		}
		wb := r.worstBudget()
		rex := "-"
		if wb != nil {
			rex = f1(math.Max(wb.Excess, 0)) + " / " + f1(wb.Bound)
		}
		sex, sv := "-", r.Sim.Verdict
		if r.Sim.Err != "" {
			sv = "error: " + r.Sim.Err
		}
		var parts []string
		for _, sr := range r.Sim.Rules {
			b := "∞"
			if sr.Bound != nil {
				b = f1(*sr.Bound)
			}
			parts = append(parts, f1(sr.Peak)+" / "+b)
		}
		if len(parts) > 0 {
			sex = strings.Join(parts, ", ")
		}
		_, vi, _ := r.utilization()
		_, cd := r.worstShift()
		notRun := "-"
		if len(r.Sim.NotRun) > 0 {
			notRun = strings.Join(r.Sim.NotRun, ", ")
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%.3f\t%.3f\t%s\t%s\t%s\n", label(r), rex, r.Verdict, sex, sv, vi,
			r.Sim.Utilization, optS(cd), optS(r.Sim.ConvergenceS), notRun)
	}
	_ = tw.Flush() // a table for the terminal; a failed write there has no one to tell
}
