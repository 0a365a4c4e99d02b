package sim

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// WriteJSON writes the results as one indented JSON array.
func WriteJSON(w io.Writer, results []*Result) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(results); err != nil {
		return fmt.Errorf("sim: write json: %w", err)
	}
	return nil
}

// WriteTable prints one line per scenario, seed, system and rule, then the
// faults each baseline suffers only in part (its name marked *).
func WriteTable(w io.Writer, results []*Result) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	// As with the Fprintf calls below, a writer that fails here fails again at
	// Flush, whose error is returned.
	_, _ = io.WriteString(tw, "scenario\tseed\tsystem\trule\tutil\tworst util\tmean util\tvs static\tovershoot\tof B %\tbound\tverdict\tfalse rej %\tworst fr %\tredis ops/dec\tp99 ms\tcoord msg/s\tsteady msg/s\tconverge s (×refresh)\t\n")
	var notes []string
	for _, r := range results {
		for _, s := range r.Systems {
			name := s.Name
			if len(s.Unmodeled) > 0 {
				name += "*"
				for _, u := range s.Unmodeled {
					notes = append(notes, fmt.Sprintf("* %s seed %d, %s: %s", r.Scenario, r.Seed, s.Name, u))
				}
			}
			for _, ro := range s.Rules {
				bound, verdict := "-", "-"
				if ro.Bound != nil {
					bound = fmt.Sprintf("%.1f", *ro.Bound)
				}
				if ro.Unbounded {
					bound = "∞"
				}
				if ro.Verdict != "" {
					verdict = ro.Verdict
				}
				conv := convCell(s)
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%.3f\t%s\t%.3f\t%s\t%.1f\t%.1f\t%s\t%s\t%.2f\t%.2f\t%.3f\t%.2f\t%.1f\t%s\t%s\t\n",
					r.Scenario, r.Seed, name, ro.Rule, ro.Utilization, worstUtil(ro), ro.MeanUtilization, vsStaticCell(ro),
					ro.PeakTokens, ro.PeakPctOfBurst, bound, verdict, ro.FalseRejectPct, ro.WorstFalseRejectPct,
					s.RedisOpsPerDecision, p99(s)/1000, s.CoordinatorMsgsPerS, optF(s.SteadyMsgsPerS, "%.1f"), conv)
			}
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range notes {
		if _, err := fmt.Fprintln(w, n); err != nil {
			return err
		}
	}
	return nil
}

// worstUtil is a rule's worst budget's utilization with its key.
func worstUtil(ro RuleOutcome) string {
	if ro.WorstUtilKey < 0 {
		return "-"
	}
	return fmt.Sprintf("%.3f (k%d)", ro.WorstUtilization, ro.WorstUtilKey)
}

// vsStaticCell is a rule's VsStatic with its key, or "-".
func vsStaticCell(ro RuleOutcome) string {
	if ro.VsStatic == nil {
		return "-"
	}
	return fmt.Sprintf("%+.3f (k%d)", *ro.VsStatic, ro.VsStaticKey)
}

// convCell is a system's convergence time in seconds and refresh
// intervals, "never" when it never converges, "-" without a shift.
func convCell(s SystemResult) string {
	switch {
	case s.ConvergenceS == nil:
		return "-"
	case s.ConvergenceRefreshes == nil:
		return "never"
	}
	return fmt.Sprintf("%.2f (%.2f×)", *s.ConvergenceS, *s.ConvergenceRefreshes)
}

func optF(v *float64, f string) string {
	if v == nil {
		return "-"
	}
	return fmt.Sprintf(f, *v)
}

// p99 is the largest p99 latency over a system's paths.
func p99(s SystemResult) float64 {
	var v float64
	for _, l := range s.Latency {
		v = math.Max(v, l.P99Us)
	}
	return v
}

var palette = []string{"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"}

type line struct {
	name   string
	color  string
	values []float64
	dashed bool
}

// svgChart draws lines over time (bins of binS seconds) as an inline SVG.
func svgChart(title, unit string, binS float64, lines []line) string {
	const W, H, L, R, T, B = 720.0, 240.0, 64.0, 150.0, 28.0, 32.0
	pw, ph := W-L-R, H-T-B
	var ymax float64
	n := 0
	for _, l := range lines {
		n = max(n, len(l.values))
		for _, v := range l.values {
			ymax = math.Max(ymax, v)
		}
	}
	if ymax <= 0 {
		ymax = 1
	}
	ymax *= 1.08
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`, W, H, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13" font-weight="bold">%s</text>`, L, html.EscapeString(title))
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#ccc"/>`, L, T, pw, ph)
	for i := 0; i <= 4; i++ {
		y := T + ph - ph*float64(i)/4
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%s</text>`,
			L, L+pw, y, y, L-4, y+4, short(ymax*float64(i)/4))
	}
	total := binS * float64(n)
	for i := 0; i <= 6; i++ {
		x := L + pw*float64(i)/6
		fmt.Fprintf(&b, `<text x="%.1f" y="%.0f" text-anchor="middle">%.0fs</text>`, x, T+ph+16, total*float64(i)/6)
	}
	fmt.Fprintf(&b, `<text x="12" y="%.0f" transform="rotate(-90 12 %.0f)" text-anchor="middle">%s</text>`, T+ph/2, T+ph/2, html.EscapeString(unit))
	for i, l := range lines {
		if len(l.values) == 0 {
			continue
		}
		var pts strings.Builder
		for j, v := range l.values {
			x := L + pw*(float64(j)+0.5)/float64(n)
			y := T + ph - ph*v/ymax
			fmt.Fprintf(&pts, "%.1f,%.1f ", x, y)
		}
		dash := ""
		if l.dashed {
			dash = ` stroke-dasharray="5,3"`
		}
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="1.5"%s points="%s"/>`, l.color, dash, pts.String())
		ly := T + 12 + float64(i)*14
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="2"%s/><text x="%.0f" y="%.0f">%s</text>`,
			L+pw+8, L+pw+24, ly-4, ly-4, l.color, dash, L+pw+28, ly, html.EscapeString(l.name))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// svgTimeline draws the faults as bars over the run.
func svgTimeline(r *Result) string {
	const W, L, R = 720.0, 64.0, 150.0
	pw := W - L - R
	h := 40 + 18*len(r.Faults)
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%d" font-family="sans-serif" font-size="11">`, W, h)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13" font-weight="bold">Fault timeline</text>`, L)
	if len(r.Faults) == 0 {
		fmt.Fprintf(&b, `<text x="%.0f" y="32">no faults</text>`, L)
	}
	for i, f := range r.Faults {
		y := 26 + 18*i
		x0 := L + pw*f.Start/r.DurationS
		x1 := L + pw*math.Min(f.End, r.DurationS)/r.DurationS
		if x1-x0 < 2 {
			x1 = x0 + 2
		}
		label := f.Kind
		if f.Region != "" {
			label += " " + f.Region
		}
		if f.Agent != nil {
			label += fmt.Sprintf(" agent %d", *f.Agent)
		}
		fmt.Fprintf(&b, `<rect x="%.1f" y="%d" width="%.1f" height="12" fill="%s" opacity="0.7"/><text x="%.0f" y="%d">%s</text>`,
			x0, y, x1-x0, palette[(i+3)%len(palette)], L+pw+8, y+10, html.EscapeString(label))
	}
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%d" y2="%d" stroke="#999"/>`, L, L+pw, h-6, h-6)
	b.WriteString(`</svg>`)
	return b.String()
}

func short(v float64) string {
	switch {
	case v >= 1e6:
		return fmt.Sprintf("%.1fM", v/1e6)
	case v >= 1e4:
		return fmt.Sprintf("%.0fk", v/1e3)
	case v >= 100:
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.2g", v)
}

// WriteHTML writes a self-contained report: a summary table, and per
// scenario its charts (admitted rate per region against the global limit,
// allocations per region, overshoot over time, the fault timeline) as
// inline SVG. It needs no network to view.
func WriteHTML(w io.Writer, results []*Result) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>allot simulation report</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;font-size:12px}
th{background:#f4f4f4}td.l,th.l{text-align:left}.PASS{color:#080;font-weight:bold}.FAIL{color:#c00;font-weight:bold}.UNBOUNDED{color:#b60;font-weight:bold}
section{border-top:2px solid #eee;margin-top:24px;padding-top:8px}small{color:#666}
</style></head><body><h1>allot simulation report</h1>
<p>Overshoot is the largest amount by which the tokens admitted for one budget in any window [s,e] exceed B + R·(e−s), over every window and every budget of the rule. Utilization is tokens used over what one ideal global bucket admits on the same arrivals, a budget's use in each one-second window capped at the ideal's, so overshoot never counts as use; worst and mean are over the rule's measured budgets (each carrying at least 1% of its ideal tokens), vs static the smallest difference to the static split on one budget. The bound is the design's bound for the scenario's faults; PASS means measured ≤ bound. Steady msg/s is the lease message rate over the bins with no fault, no demand change and no diurnal or bursty stream in the 3 refresh intervals before. A system marked * suffers some of the scenario's faults only in part (named under its scenario).</p>
<h2>Summary</h2><table><tr><th class="l">scenario</th><th>seed</th><th class="l">rule</th><th>allot overshoot</th><th>bound</th><th>verdict</th><th>allot util</th><th>allot worst util</th><th>vs static</th><th>static util</th><th>static worst util</th><th>central util</th><th>steady msg/s</th><th>independent overshoot</th><th>central p99 ms</th><th>async overshoot</th></tr>`)
	for _, r := range results {
		for ri := range r.Rules {
			al, ind, st, ce, as := r.System("allot"), r.System("independent"), r.System("static"), r.System("central"), r.System("async-global")
			cell := func(s *SystemResult, f func(*SystemResult) string) string {
				if s == nil {
					return "-"
				}
				return f(s)
			}
			over := func(s *SystemResult) string { return fmt.Sprintf("%.1f", s.Rules[ri].PeakTokens) }
			util := func(s *SystemResult) string { return fmt.Sprintf("%.3f", s.Rules[ri].Utilization) }
			worst := func(s *SystemResult) string { return worstUtil(s.Rules[ri]) }
			bound, verdict := "-", "-"
			if al != nil {
				ro := al.Rules[ri]
				verdict = ro.Verdict
				if ro.Bound != nil {
					bound = fmt.Sprintf("%.1f", *ro.Bound)
				} else if ro.Unbounded {
					bound = "∞"
				}
			}
			fmt.Fprintf(&b, `<tr><td class="l"><a href="#%s-%d">%s</a></td><td>%d</td><td class="l">%s</td><td>%s</td><td>%s</td><td class="%s">%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>`,
				html.EscapeString(r.Scenario), r.Seed, html.EscapeString(r.Scenario), r.Seed, html.EscapeString(r.Rules[ri].Name),
				cell(al, over), bound, verdict, verdict, cell(al, util), cell(al, worst),
				cell(al, func(s *SystemResult) string { return vsStaticCell(s.Rules[ri]) }),
				cell(st, util), cell(st, worst), cell(ce, util),
				cell(al, func(s *SystemResult) string { return optF(s.SteadyMsgsPerS, "%.1f") }),
				cell(ind, over), cell(ce, func(s *SystemResult) string { return fmt.Sprintf("%.1f", p99(*s)/1000) }), cell(as, over))
		}
	}
	b.WriteString(`</table>`)
	for _, r := range results {
		writeScenarioHTML(&b, r)
	}
	b.WriteString(`</body></html>`)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("sim: write html: %w", err)
	}
	return nil
}

func writeScenarioHTML(b *strings.Builder, r *Result) {
	fmt.Fprintf(b, `<section id="%s-%d"><h2>%s <small>seed %d, verdict <span class="%s">%s</span></small></h2><p>%s</p>`,
		html.EscapeString(r.Scenario), r.Seed, html.EscapeString(r.Scenario), r.Seed, r.Verdict, r.Verdict, html.EscapeString(r.Description))
	fmt.Fprintf(b, `<p><small>%.0f s simulated, %d arrivals, %d decisions, %d events, %d messages (%d lost)</small></p>`,
		r.DurationS, r.Arrivals, r.Decisions, r.Events, r.Messages, r.MessagesLost)
	b.WriteString(`<table><tr><th class="l">system</th><th class="l">rule</th><th>admitted</th><th>util</th><th>worst util</th><th>mean util</th><th>vs static</th><th>overshoot</th><th>% of B</th><th>time-weighted</th><th>bound</th><th>verdict</th><th>false rej %</th><th>worst fr %</th><th>mean fr %</th><th>unavailable</th><th>redis ops/dec</th><th>coord msg/s</th><th>steady msg/s</th><th>converge s (×refresh)</th><th class="l">latency p50/p99 ms by path</th></tr>`)
	for _, s := range r.Systems {
		for _, ro := range s.Rules {
			bound := "-"
			if ro.Bound != nil {
				bound = fmt.Sprintf("%.1f", *ro.Bound)
			} else if ro.Unbounded {
				bound = "∞"
			}
			conv := convCell(s)
			var lat []string
			for _, l := range s.Latency {
				lat = append(lat, fmt.Sprintf("%s %.2f/%.2f", l.Path, l.P50Us/1000, l.P99Us/1000))
			}
			name := s.Name
			if len(s.Unmodeled) > 0 {
				name += "*"
			}
			fmt.Fprintf(b, `<tr><td class="l">%s</td><td class="l">%s</td><td>%d</td><td>%.3f</td><td>%s</td><td>%.3f</td><td>%s</td><td>%.1f</td><td>%.1f</td><td>%.2f</td><td>%s</td><td class="%s">%s</td><td>%.2f</td><td>%.2f</td><td>%.2f</td><td>%d</td><td>%.3f</td><td>%.1f</td><td>%s</td><td>%s</td><td class="l">%s</td></tr>`,
				name, html.EscapeString(ro.Rule), s.Admitted, ro.Utilization, worstUtil(ro), ro.MeanUtilization, vsStaticCell(ro),
				ro.PeakTokens, ro.PeakPctOfBurst, ro.TimeWeighted, bound, ro.Verdict, ro.Verdict, ro.FalseRejectPct,
				ro.WorstFalseRejectPct, ro.MeanFalseRejectPct, s.Unavailable, s.RedisOpsPerDecision, s.CoordinatorMsgsPerS,
				optF(s.SteadyMsgsPerS, "%.1f"), conv, strings.Join(lat, ", "))
		}
	}
	b.WriteString(`</table>`)
	for _, s := range r.Systems {
		for _, u := range s.Unmodeled {
			fmt.Fprintf(b, `<p><small>* %s: %s</small></p>`, html.EscapeString(s.Name), html.EscapeString(u))
		}
	}
	for _, s := range r.Systems {
		if s.Name != "allot" {
			continue
		}
		for ri, ro := range s.Rules {
			if len(ro.BoundTerms) > 0 {
				fmt.Fprintf(b, `<p><small>bound for %s: %s</small></p>`, html.EscapeString(ro.Rule), html.EscapeString(strings.Join(ro.BoundTerms, "; ")))
			}
			var lines []line
			for g, name := range r.Regions {
				lines = append(lines, line{name: name, color: palette[g%len(palette)], values: s.AdmittedRate[ri][g]})
			}
			ideal := make([]float64, len(r.Ideal.AdmittedRate[ri][0]))
			for g := range r.Regions {
				for i, v := range r.Ideal.AdmittedRate[ri][g] {
					ideal[i] += v
				}
			}
			limitName := "ideal global bucket"
			if r.Rules[ri].Keys == 1 {
				flat := make([]float64, len(ideal))
				for i := range flat {
					flat[i] = r.Rules[ri].Rate
				}
				lines = append(lines, line{name: "global limit R", color: "#000", values: flat, dashed: true})
			}
			lines = append(lines, line{name: limitName, color: "#888", values: ideal, dashed: true})
			b.WriteString(svgChart(fmt.Sprintf("allot: admitted rate per region, rule %s", ro.Rule), "tokens/s", r.BinS, lines))
			b.WriteString("<br>")
			if len(s.Allocation) > ri {
				var al []line
				for g, name := range r.Regions {
					al = append(al, line{name: name, color: palette[g%len(palette)], values: s.Allocation[ri][g]})
				}
				b.WriteString(svgChart(fmt.Sprintf("allot: allocation per region of the hottest %s budget", ro.Rule), "tokens/s", r.BinS, al))
				b.WriteString("<br>")
			}
		}
	}
	var ov []line
	for i, s := range r.Systems {
		ov = append(ov, line{name: s.Name, color: palette[i%len(palette)], values: s.Overshoot})
	}
	b.WriteString(svgChart("overshoot over time (largest excess over B + R·t, any budget)", "tokens", r.BinS, ov))
	b.WriteString("<br>")
	b.WriteString(svgTimeline(r))
	b.WriteString(`</section>`)
}
