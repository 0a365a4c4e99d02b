package sim

import (
	"fmt"
	"io"
	"sort"
	"text/tabwriter"
)

// BehindStatic counts, for one scenario (form) and rule, the measured
// budgets on which allot used less of the ideal than the static split did
// over the seeds run: at every seed (Every), and on the mean over them
// (OnMean), with the largest gap on the mean and its key.
type BehindStatic struct {
	Scenario string
	Rule     string
	Budgets  int // budgets measured at some seed
	Seeds    int // the most seeds any budget was measured at
	Every    int // budgets where the static split is ahead at every seed it was measured at
	OnMean   int // budgets where it is ahead on the mean over those seeds
	Gap      float64
	GapKey   int
	// Over the clear windows alone (clearWindow: after the first second,
	// meeting no fault's influence), among the budgets with clear windows
	// at every seed they were measured at (ClearBudgets): those where the
	// static split is ahead at every seed, and the largest of their gaps
	// on the mean, with its key.
	ClearBudgets int
	ClearEvery   int
	ClearGap     float64
	ClearGapKey  int
}

// BehindStaticOf compares allot with the static split budget by budget, per
// scenario (each form its own) and rule, over every result that ran both.
// Within a run both systems measure the same budgets (those carrying at
// least 1% of the rule's ideal tokens, "What it measures"); a budget is
// counted at each seed at which it was measured. Ahead means strictly
// greater utilization. The rows are sorted by the largest gap.
func BehindStaticOf(results []*Result) []BehindStatic {
	type budgetKey struct {
		sc, rule string
		key      int
	}
	type tally struct{ all, clear behind }
	tallies := map[budgetKey]*tally{}
	for _, r := range results {
		al, st := r.System("allot"), r.System("static")
		if al == nil || st == nil {
			continue
		}
		for j, ro := range al.Rules {
			static := map[int]BudgetOutcome{}
			for _, b := range st.Rules[j].Budgets {
				static[b.Key] = b
			}
			for _, b := range ro.Budgets {
				k := budgetKey{r.Scenario, ro.Rule, b.Key}
				t := tallies[k]
				if t == nil {
					t = &tally{}
					tallies[k] = t
				}
				sb := static[b.Key]
				t.all.add(b.Utilization, sb.Utilization)
				if b.ClearIdealTokens > 0 {
					t.clear.add(b.ClearUtilization, sb.ClearUtilization)
				}
			}
		}
	}
	type ruleKey struct{ sc, rule string }
	rows := map[ruleKey]*BehindStatic{}
	for k, t := range tallies {
		row := rows[ruleKey{k.sc, k.rule}]
		if row == nil {
			row = &BehindStatic{Scenario: k.sc, Rule: k.rule, GapKey: -1, ClearGapKey: -1}
			rows[ruleKey{k.sc, k.rule}] = row
		}
		row.Budgets++
		row.Seeds = max(row.Seeds, t.all.n)
		if t.all.every() {
			row.Every++
		}
		if gap := t.all.mean(); gap > 0 {
			row.OnMean++
			widest(&row.Gap, &row.GapKey, gap, k.key)
		}
		if t.clear.n == t.all.n {
			row.ClearBudgets++
			if t.clear.every() {
				row.ClearEvery++
				widest(&row.ClearGap, &row.ClearGapKey, t.clear.mean(), k.key)
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

// behind tallies one budget against the static split: the seeds it was
// measured at, those at which the static split was ahead, and the sum of
// the static split's leads.
type behind struct {
	n, ahead int
	gap      float64
}

func (b *behind) add(allot, static float64) {
	b.n++
	if static > allot {
		b.ahead++
	}
	b.gap += static - allot
}

// every says the static split was ahead at every seed measured.
func (b *behind) every() bool { return b.ahead == b.n }

// mean is the static split's lead on the mean over the seeds.
func (b *behind) mean() float64 { return b.gap / float64(b.n) }

// widest keeps in (gap, key) the larger gap, the lower key on a tie; key
// −1 is none yet.
func widest(gap *float64, key *int, g float64, k int) {
	if g > *gap || g == *gap && (*key < 0 || k < *key) {
		*gap, *key = g, k
	}
}

// WriteBehindStatic prints BehindStaticOf(results) with a total line, or
// nothing when no result ran both allot and the static split.
func WriteBehindStatic(w io.Writer, results []*Result) error {
	rows := BehindStaticOf(results)
	if len(rows) == 0 {
		return nil
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	_, _ = io.WriteString(tw, "budgets behind the static split\trule\tbudgets\tseeds\tahead at every seed\tahead on the mean\tlargest gap (key)\tclear windows: budgets\tahead at every seed\tlargest gap there (key)\t\n")
	var tot BehindStatic
	for _, r := range rows {
		gap, gapC := "-", "-"
		if r.GapKey >= 0 {
			gap = fmt.Sprintf("%.3f (k%d)", r.Gap, r.GapKey)
		}
		if r.ClearGapKey >= 0 {
			gapC = fmt.Sprintf("%.4f (k%d)", r.ClearGap, r.ClearGapKey)
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%d\t%d\t%s\t%d\t%d\t%s\t\n", r.Scenario, r.Rule, r.Budgets, r.Seeds, r.Every, r.OnMean, gap, r.ClearBudgets, r.ClearEvery, gapC)
		tot.Budgets += r.Budgets
		tot.Every += r.Every
		tot.OnMean += r.OnMean
		tot.ClearBudgets += r.ClearBudgets
		tot.ClearEvery += r.ClearEvery
	}
	fmt.Fprintf(tw, "all\t\t%d\t\t%d\t%d\t\t%d\t%d\t\t\n", tot.Budgets, tot.Every, tot.OnMean, tot.ClearBudgets, tot.ClearEvery)
	return tw.Flush()
}
