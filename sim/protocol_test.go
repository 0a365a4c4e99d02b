package sim

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// TestTableKeys checks that tableKeys lists the keys of two tables sorted
// and once each, as sorting both lists together would: for tables whose
// entries are sorted (merged in one pass), overlapping, disjoint, empty or
// missing, and for tables whose entries are not (sorted as they come),
// appending to a reused slice.
func TestTableKeys(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	var all []bucket.Key
	for _, rule := range []string{"a", "b", "tenant"} {
		for k := 0; k < 40; k++ {
			all = append(all, bucket.Key{Rule: rule, Subject: fmt.Sprintf("s%d", k)})
		}
	}
	slices.SortFunc(all, compareKeys) // "s10" before "s2"
	table := func(sorted bool) *region.Table {
		if rng.IntN(8) == 0 {
			return nil
		}
		tb := &region.Table{}
		for _, k := range all {
			if rng.IntN(3) == 0 {
				tb.Entries = append(tb.Entries, lease.Entry{Key: k})
			}
		}
		if !sorted {
			rng.Shuffle(len(tb.Entries), func(i, j int) { tb.Entries[i], tb.Entries[j] = tb.Entries[j], tb.Entries[i] })
		}
		return tb
	}
	var buf []bucket.Key
	merged := 0
	for i := 0; i < 500; i++ {
		sorted := i%4 != 0
		a, b := table(sorted), table(sorted)
		var want []bucket.Key
		for _, tb := range []*region.Table{a, b} {
			if tb != nil {
				for _, e := range tb.Entries {
					want = append(want, e.Key)
				}
			}
		}
		slices.SortFunc(want, compareKeys)
		want = slices.Compact(want)
		buf = tableKeys(buf[:0], a, b)
		if !slices.Equal(buf, want) {
			t.Fatalf("case %d (sorted %v): tableKeys gave %v, want %v", i, sorted, buf, want)
		}
		byKey := func(x, y lease.Entry) int { return compareKeys(x.Key, y.Key) }
		if a != nil && b != nil && len(a.Entries) > 1 && slices.IsSortedFunc(a.Entries, byKey) && slices.IsSortedFunc(b.Entries, byKey) {
			merged++
		}
	}
	if merged == 0 {
		t.Fatal("no case merged two sorted tables")
	}
}
