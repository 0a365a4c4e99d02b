package sim

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// BehindStatic counts, for one scenario (form) and rule, the measured
// budgets on which allot used less of the ideal than the static split did
// over a set of seeds: at every seed both systems measured the budget
// (Every), and on the mean over those seeds (OnMean), with the largest gap
// on the mean and its key.
type BehindStatic struct {
	Scenario string
	Rule     string
	Budgets  int // budgets both systems measured at some seed
	Seeds    int // the most seeds any budget was measured at
	Every    int // budgets where the static split is ahead at every seed it was measured at
	OnMean   int // budgets where it is ahead on the mean over those seeds
	Gap      float64
	GapKey   int
}

// BehindStaticOf compares allot with the static split budget by budget, per
// scenario (each form its own) and rule, over every seed in results. A
// budget counts where both systems measured it at the same seed ("What it
// measures": a budget carrying at least 1% of the rule's ideal tokens);
// ahead means strictly greater utilization. Results without both systems
// are skipped; the rows are sorted by the largest gap.
func BehindStaticOf(results []*Result) []BehindStatic {
	type bk struct {
		sc, rule string
		key      int
	}
	type pair struct{ allot, static map[uint64]float64 }
	per := map[bk]*pair{}
	for _, r := range results {
		for _, s := range r.Systems {
			if s.Name != "allot" && s.Name != "static" {
				continue
			}
			for _, ro := range s.Rules {
				for _, b := range ro.Budgets {
					k := bk{r.Scenario, ro.Rule, b.Key}
					p := per[k]
					if p == nil {
						p = &pair{map[uint64]float64{}, map[uint64]float64{}}
						per[k] = p
					}
					if s.Name == "allot" {
						p.allot[r.Seed] = b.Utilization
					} else {
						p.static[r.Seed] = b.Utilization
					}
				}
			}
		}
	}
	type rk struct{ sc, rule string }
	rows := map[rk]*BehindStatic{}
	for k, p := range per {
		n, ahead := 0, 0
		var gap float64
		for seed, a := range p.allot {
			st, ok := p.static[seed]
			if !ok {
				continue
			}
			n++
			if st > a {
				ahead++
			}
			gap += st - a
		}
		if n == 0 {
			continue
		}
		row := rows[rk{k.sc, k.rule}]
		if row == nil {
			row = &BehindStatic{Scenario: k.sc, Rule: k.rule, GapKey: -1}
			rows[rk{k.sc, k.rule}] = row
		}
		row.Budgets++
		row.Seeds = max(row.Seeds, n)
		if ahead == n {
			row.Every++
		}
		if gap /= float64(n); gap > 0 {
			row.OnMean++
			if gap > row.Gap || gap == row.Gap && (row.GapKey < 0 || k.key < row.GapKey) {
				row.Gap, row.GapKey = gap, k.key
			}
		}
	}
	out := make([]BehindStatic, 0, len(rows))
	for _, r := range rows {
		out = append(out, *r)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Gap != out[j].Gap {
			return out[i].Gap > out[j].Gap
		}
		if out[i].Scenario != out[j].Scenario {
			return out[i].Scenario < out[j].Scenario
		}
		return out[i].Rule < out[j].Rule
	})
	return out
}

// WriteBehindStatic prints BehindStaticOf(results) with a total line, or
// nothing when no result ran both allot and the static split.
func WriteBehindStatic(w io.Writer, results []*Result) error {
	rows := BehindStaticOf(results)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = io.WriteString(tw, "budgets behind the static split\trule\tbudgets\tseeds\tahead at every seed\tahead on the mean\tlargest gap (key)\t\n")
	var tot BehindStatic
	for _, r := range rows {
		gap := "-"
		if r.GapKey >= 0 {
			gap = fmt.Sprintf("%.3f (k%d)", r.Gap, r.GapKey)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t\n", r.Scenario, r.Rule, r.Budgets, r.Seeds, r.Every, r.OnMean, gap)
		tot.Budgets += r.Budgets
		tot.Every += r.Every
		tot.OnMean += r.OnMean
	}
	fmt.Fprintf(tw, "all\t\t%d\t\t%d\t%d\t\t\n", tot.Budgets, tot.Every, tot.OnMean)
	return tw.Flush()
}
