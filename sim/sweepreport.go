package sim

import (
	"encoding/json"
	"fmt"
	"html"
	"io"
	"strings"
	"text/tabwriter"
)

// WriteSweepTable prints one line per point: its settings, allot's worst
// overshoot against its bound, the utilizations, lease messages and
// convergence, and a mark: "best" for the best point, "breaks" for a point
// that exceeds a bound (or has none), "skipped" with the reason.
func WriteSweepTable(w io.Writer, r *SweepResult) error {
	fmt.Fprintf(w, "sweep of %s over %s, seeds %v; systems allot, static split, central Redis\n", r.Scenario, axesText(r.Axes), r.Seeds)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = io.WriteString(tw, "#\tlease_ttl\trefresh\treserve\tbatch_window\tpolicy\tdrift\tverdict\tworst rule\tovershoot\tbound\tutil\tstatic\tcentral\tlease msg/s\tconverge s\t\t\n")
	for i, p := range r.Points {
		s := p.Settings
		fmt.Fprintf(tw, "%d\t%s\t%s\t%s\t%s\t%s\t%.4g\t", i, s.LeaseTTL, s.Refresh, s.reserve(), s.BatchWindow, s.Policy, s.Drift)
		if p.Skipped != "" {
			fmt.Fprintf(tw, "-\t-\t-\t-\t-\t-\t-\t-\t-\tskipped: %s\t\n", p.Skipped)
			continue
		}
		bound, conv := p.cells()
		mark := ""
		switch {
		case p.Best:
			mark = "best"
		case !p.Keeps:
			mark = "breaks"
		}
		fmt.Fprintf(tw, "%s\t%s\t%.1f\t%s\t%.3f\t%.3f\t%.3f\t%.1f\t%s\t%s\t\n", p.Verdict, p.WorstRule, p.WorstOvershoot, bound,
			p.Utilization, p.Static, p.Central, p.LeaseMsgsPerS, conv, mark)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if r.Best >= 0 {
		fmt.Fprintf(w, "best: #%d %s (utilization %.3f, every bound kept on every seed)\n", r.Best, r.Points[r.Best].Settings, r.Points[r.Best].Utilization)
	} else {
		fmt.Fprintln(w, "best: none; no point keeps every bound")
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	return nil
}

func axesText(axes []string) string {
	if len(axes) == 0 {
		return "no axis (the scenario's own settings)"
	}
	return strings.Join(axes, " × ")
}

// WriteSweepJSON writes the sweep as indented JSON.
func WriteSweepJSON(w io.Writer, r *SweepResult) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(r); err != nil {
		return fmt.Errorf("sim: write sweep json: %w", err)
	}
	return nil
}

// pointLabel names a point by the values of the axes the sweep varies.
func pointLabel(r *SweepResult, p SweepPoint) string {
	var parts []string
	s := p.Settings
	for _, a := range r.Axes {
		switch a {
		case "lease_ttl":
			parts = append(parts, "ttl "+s.LeaseTTL.String())
		case "refresh":
			parts = append(parts, "ref "+s.Refresh.String())
		case "reserve":
			parts = append(parts, "res "+s.reserve())
		case "batch_window":
			parts = append(parts, "bw "+s.BatchWindow.String())
		case "policy":
			parts = append(parts, s.Policy)
		case "drift":
			parts = append(parts, fmt.Sprintf("ρ %.4g", s.Drift))
		}
	}
	return strings.Join(parts, ", ")
}

// svgSweep draws the sweep chart: per point, allot's utilization as a bar
// (green when every bound held, red when one broke, grey when skipped)
// with the static split's and the central Redis's as ticks, and below it
// the worst overshoot as a share of its bound.
func svgSweep(r *SweepResult) string {
	n := len(r.Points)
	const L, R, T = 64.0, 200.0, 28.0
	slot := min(60, max(16, 720/float64(max(n, 1))))
	pw := slot * float64(n)
	W := L + pw + R
	const uh, oh, gap = 180.0, 80.0, 24.0 // utilization and overshoot panels
	// The labels run down at 60°: room for the longest, at ~6 px a
	// character.
	longest := 0
	for _, p := range r.Points {
		longest = max(longest, len([]rune(fmt.Sprintf("#%d %s", len(r.Points), pointLabel(r, p)))))
	}
	lh := 24 + 6*0.87*float64(longest)
	H := T + uh + gap + oh + lh
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%.0f" height="%.0f" viewBox="0 0 %.0f %.0f" font-family="sans-serif" font-size="11">`, W, H, W, H)
	fmt.Fprintf(&b, `<text x="%.0f" y="16" font-size="13" font-weight="bold">Sweep: utilization and worst overshoot per setting</text>`, L)
	// Utilization panel, 0 to the largest value (at least 1).
	ymax := 1.0
	for _, p := range r.Points {
		ymax = max(ymax, p.Utilization, p.Static, p.Central)
	}
	y := func(v float64) float64 { return T + uh - uh*v/ymax }
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#ccc"/>`, L, T, pw, uh)
	for i := 0; i <= 4; i++ {
		v := ymax * float64(i) / 4
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#eee"/><text x="%.0f" y="%.1f" text-anchor="end">%.2f</text>`, L, L+pw, y(v), y(v), L-4, y(v)+4, v)
	}
	fmt.Fprintf(&b, `<text x="12" y="%.0f" transform="rotate(-90 12 %.0f)" text-anchor="middle">utilization</text>`, T+uh/2, T+uh/2)
	for i, p := range r.Points {
		x := L + slot*float64(i)
		color := "#2ca02c"
		switch {
		case p.Skipped != "":
			color = "#bbb"
		case !p.Keeps:
			color = "#d62728"
		}
		if p.Skipped == "" {
			fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title></rect>`,
				x+3, y(p.Utilization), slot-6, T+uh-y(p.Utilization), color, html.EscapeString(fmt.Sprintf("#%d %s: allot %.3f, static %.3f, central %.3f, %s", i, p.Settings, p.Utilization, p.Static, p.Central, p.Verdict)))
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#1f77b4" stroke-width="2"/>`, x+1, x+slot-1, y(p.Static), y(p.Static))
			fmt.Fprintf(&b, `<line x1="%.1f" x2="%.1f" y1="%.1f" y2="%.1f" stroke="#9467bd" stroke-width="2" stroke-dasharray="3,2"/>`, x+1, x+slot-1, y(p.Central), y(p.Central))
		} else {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" fill="#999">–</text>`, x+slot/2, T+uh-4)
		}
		if p.Best {
			fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" text-anchor="middle" font-size="14" fill="#b8860b">★</text>`, x+slot/2, y(p.Utilization)-4)
		}
	}
	legend := []struct{ color, name, dash string }{{"#2ca02c", "allot, bounds kept", ""}, {"#d62728", "allot, a bound broken", ""}, {"#1f77b4", "static split", ""}, {"#9467bd", "central Redis", "3,2"}, {"#b8860b", "★ best", ""}}
	for i, l := range legend {
		ly := T + 12 + float64(i)*14
		fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.0f" y2="%.0f" stroke="%s" stroke-width="3" stroke-dasharray="%s"/><text x="%.0f" y="%.0f">%s</text>`,
			L+pw+8, L+pw+24, ly-4, ly-4, l.color, l.dash, L+pw+28, ly, html.EscapeString(l.name))
	}
	// Overshoot panel: the worst rule's overshoot over its bound, capped at
	// 2× (a zero bound with any overshoot, or no bound, shows as the cap).
	ot := T + uh + gap
	fmt.Fprintf(&b, `<rect x="%.0f" y="%.0f" width="%.0f" height="%.0f" fill="none" stroke="#ccc"/>`, L, ot, pw, oh)
	fmt.Fprintf(&b, `<line x1="%.0f" x2="%.0f" y1="%.1f" y2="%.1f" stroke="#555" stroke-dasharray="4,3"/><text x="%.0f" y="%.1f" text-anchor="end">bound</text>`, L, L+pw, ot+oh/2, ot+oh/2, L-4, ot+oh/2+4)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.1f" text-anchor="end">0</text>`, L-4, ot+oh)
	fmt.Fprintf(&b, `<text x="%.0f" y="%.1f">worst overshoot ÷ its bound</text><text x="%.0f" y="%.1f">(capped at 2; no bound: 2)</text>`, L+pw+8, ot+oh/2-2, L+pw+8, ot+oh/2+12)
	for i, p := range r.Points {
		if p.Skipped != "" {
			continue
		}
		ratio := 0.0
		switch {
		case p.WorstBound == nil:
			ratio = 2
		case *p.WorstBound > 0:
			ratio = min(p.WorstOvershoot / *p.WorstBound, 2)
		case p.WorstOvershoot > 0:
			ratio = 2
		}
		color := "#2ca02c"
		if !p.Keeps {
			color = "#d62728"
		}
		h := oh * ratio / 2
		x := L + slot*float64(i)
		fmt.Fprintf(&b, `<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s" opacity="0.8"/>`, x+3, ot+oh-h, slot-6, max(h, 1), color)
	}
	// Labels under the panels, rotated.
	for i, p := range r.Points {
		x := L + slot*float64(i) + slot/2
		ly := ot + oh + 8
		fmt.Fprintf(&b, `<text x="%.1f" y="%.1f" transform="rotate(60 %.1f %.1f)">#%d %s</text>`, x, ly, x, ly, i, html.EscapeString(pointLabel(r, p)))
	}
	b.WriteString(`</svg>`)
	return b.String()
}

// WriteSweepHTML writes a self-contained sweep report: the sweep chart,
// the table of points, and the best point's runs in the detail of the
// simulation report (WriteHTML's sections).
func WriteSweepHTML(w io.Writer, r *SweepResult) error {
	var b strings.Builder
	b.WriteString(`<!doctype html><html><head><meta charset="utf-8"><title>allot sweep report</title><style>
body{font-family:sans-serif;margin:24px;color:#222;max-width:1100px}
table{border-collapse:collapse;margin:8px 0 16px}td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;font-size:12px}
th{background:#f4f4f4}td.l,th.l{text-align:left}.PASS{color:#080;font-weight:bold}.FAIL{color:#c00;font-weight:bold}.UNBOUNDED{color:#b60;font-weight:bold}
tr.best{background:#fff8dc}section{border-top:2px solid #eee;margin-top:24px;padding-top:8px}small{color:#666}
</style></head><body>`)
	fmt.Fprintf(&b, `<h1>allot sweep: %s</h1><p>%s</p>`, html.EscapeString(r.Scenario), html.EscapeString(r.Description))
	fmt.Fprintf(&b, `<p>One scenario over %s, seeds %v. Per point: allot's worst overshoot against its bound over every rule and seed (PASS when every one is within), utilization (tokens admitted over what one ideal global bucket admits on the same arrivals) beside the static split's and the central Redis's, lease messages per second, and the time to converge after a demand shift. ★ marks the point that keeps every bound with the best utilization.</p>`,
		html.EscapeString(axesText(r.Axes)), r.Seeds)
	b.WriteString(svgSweep(r))
	b.WriteString(`<table><tr><th>#</th><th>lease_ttl</th><th>refresh</th><th>reserve</th><th>batch_window</th><th class="l">policy</th><th>drift</th><th>verdict</th><th class="l">worst rule</th><th>overshoot</th><th>bound</th><th>util</th><th>static</th><th>central</th><th>lease msg/s</th><th>converge s</th></tr>`)
	for i, p := range r.Points {
		s := p.Settings
		cls := ""
		if p.Best {
			cls = ` class="best"`
		}
		fmt.Fprintf(&b, `<tr%s><td>%d%s</td><td>%s</td><td>%s</td><td>%s</td><td>%s</td><td class="l">%s</td><td>%.4g</td>`, cls, i, map[bool]string{true: " ★"}[p.Best],
			s.LeaseTTL, s.Refresh, s.reserve(), s.BatchWindow, html.EscapeString(s.Policy), s.Drift)
		if p.Skipped != "" {
			fmt.Fprintf(&b, `<td class="l" colspan="9">skipped: %s</td></tr>`, html.EscapeString(p.Skipped))
			continue
		}
		bound, conv := p.cells()
		fmt.Fprintf(&b, `<td class="%s">%s</td><td class="l">%s</td><td>%.1f</td><td>%s</td><td>%.3f</td><td>%.3f</td><td>%.3f</td><td>%.1f</td><td>%s</td></tr>`,
			p.Verdict, p.Verdict, html.EscapeString(p.WorstRule), p.WorstOvershoot, bound, p.Utilization, p.Static, p.Central, p.LeaseMsgsPerS, conv)
	}
	b.WriteString(`</table>`)
	for _, n := range r.Notes {
		fmt.Fprintf(&b, `<p><small>note: %s</small></p>`, html.EscapeString(n))
	}
	if r.Best >= 0 {
		fmt.Fprintf(&b, `<h2>The best point: #%d <small>%s</small></h2>`, r.Best, html.EscapeString(r.Points[r.Best].Settings.String()))
		for _, run := range r.BestRuns {
			writeScenarioHTML(&b, run)
		}
	} else {
		b.WriteString(`<h2>No point keeps every bound</h2>`)
	}
	b.WriteString(`</body></html>`)
	if _, err := io.WriteString(w, b.String()); err != nil {
		return fmt.Errorf("sim: write sweep html: %w", err)
	}
	return nil
}

// cells returns a point's worst bound and convergence as both reports
// print them: ∞ for no bound (fail open), n/a when no shift was measured,
// never when a shift did not converge.
func (p *SweepPoint) cells() (bound, conv string) {
	bound, conv = "∞", "n/a"
	if p.WorstBound != nil {
		bound = fmt.Sprintf("%.1f", *p.WorstBound)
	}
	if c := p.ConvergenceS; c != nil {
		conv = fmt.Sprintf("%.2f", *c)
		if *c < 0 {
			conv = "never"
		}
	}
	return bound, conv
}
