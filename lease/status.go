package lease

import (
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// RegionStatus describes one region as the Allocator sees it.
type RegionStatus struct {
	Region   string
	Known    bool // said hello in this term
	Released bool
	Blocked  bool // renewal withheld at the last round
	Version  uint64
	Acked    uint64
	// LeaseEnd is when the region's lease ends at the latest
	// (Allocator's clock); zero if it never had one.
	LeaseEnd time.Time
	// CommitEnd is until when its lent floors stay lent.
	CommitEnd time.Time
	// Heard is when it was last heard from.
	Heard time.Time
}

// Regions reports every region, sorted by name.
func (a *Allocator) Regions() []RegionStatus {
	out := make([]RegionStatus, 0, len(a.regions))
	for _, r := range a.regions {
		out = append(out, RegionStatus{
			Region: r.name, Known: r.known, Released: r.released, Blocked: r.blocked,
			Version: r.version, Acked: r.acked, LeaseEnd: r.leaseEnd, CommitEnd: r.commitEnd, Heard: r.heard,
		})
	}
	return out
}

// KeyStatus is one hot key's allocation per region.
type KeyStatus struct {
	Key     bucket.Key
	Budget  Budget
	Regions []string        // the budget's regions
	Counts  []bucket.Tokens // each region's allocation (count per period)
	Floors  []bucket.Tokens
	Wants   []bucket.Tokens // each region's latest reported demand
	// Claims are what the last allocation counted each region may use
	// within its lease window: its allocation, or more while a decrease
	// is unacknowledged or a lent floor may return before the window ends.
	// Capacity another region waits for is held by them.
	Claims []bucket.Tokens
	// Escrow is the sum of what regions may still use at the last
	// allocation; Budget.Limit.Count() minus it is the headroom.
	Escrow bucket.Tokens
}

// Keys reports up to limit hot keys (all when limit ≤ 0), sorted by key.
func (a *Allocator) Keys(limit int) []KeyStatus {
	ks := slices.Clone(a.keys)
	slices.SortFunc(ks, func(x, y *hotKey) int { return cmpKey(x.key, y.key) })
	if limit > 0 && len(ks) > limit {
		ks = ks[:limit]
	}
	out := make([]KeyStatus, 0, len(ks))
	for _, k := range ks {
		st := KeyStatus{Key: k.key, Budget: k.bud.b, Regions: k.bud.b.Regions, Escrow: bucket.Tokens(k.sum)}
		for i := range k.slots {
			st.Counts = append(st.Counts, bucket.Tokens(k.slots[i].cur))
			st.Floors = append(st.Floors, bucket.Tokens(k.bud.floors[i]))
			st.Wants = append(st.Wants, bucket.Tokens(k.slots[i].want))
			st.Claims = append(st.Claims, bucket.Tokens(k.slots[i].claim))
		}
		out = append(out, st)
	}
	return out
}

// BudgetTotals sums, per budget and region, the allocations of hot keys
// (what a metric of allocation per region and budget reports), and the
// smallest escrow headroom among the budget's hot keys.
type BudgetTotals struct {
	Rule     string
	Regions  []string
	Counts   []int64 // Σ over hot keys of each region's allocation
	HotKeys  int
	Headroom int64 // min over hot keys of Count − escrow; Count when none
}

// Totals reports BudgetTotals for every budget, sorted by rule.
func (a *Allocator) Totals() []BudgetTotals {
	byRule := map[string]*BudgetTotals{}
	var out []BudgetTotals
	for _, b := range a.cfg.Budgets {
		byRule[b.Rule] = &BudgetTotals{Rule: b.Rule, Regions: b.Regions, Counts: make([]int64, len(b.Regions)), Headroom: int64(b.Limit.Count())}
	}
	for _, k := range a.keys {
		t := byRule[k.key.Rule]
		if t == nil {
			continue
		}
		t.HotKeys++
		for i := range k.slots {
			t.Counts[i] += k.slots[i].cur
		}
		t.Headroom = min(t.Headroom, k.bud.count-k.sum)
	}
	for _, t := range byRule {
		out = append(out, *t)
	}
	slices.SortFunc(out, func(x, y BudgetTotals) int {
		if x.Rule < y.Rule {
			return -1
		}
		if x.Rule > y.Rule {
			return 1
		}
		return 0
	})
	return out
}
