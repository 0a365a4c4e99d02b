package region

import (
	"context"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// The regional bucket of a key is enforced at the region's allocation. The
// bucket carries the tokens it holds across a change of limit (an increase
// arrives spent, a decrease clamps: bucket.Rebase), but GCRA applies a
// change lazily, at the key's next request: until then a bucket whose
// allocation shrank goes on refilling at its old rate, while the rate it
// gave up is in use elsewhere. So the speaking agent applies every change
// of a key's allocation to its regional bucket the moment it happens
// (grants, and the lease's or a hold's end), once per region, before it
// publishes the table the others decide with; acknowledgements wait for
// that table (see speaker.step). A Settler does the applying; it is
// deterministic (time is an argument) so the simulator drives the same
// code.

// Settler applies a region's allocation changes to its regional buckets.
// It remembers the allocation last applied to each key (absent: the
// budget's floor). It is not safe for concurrent use; the speaker calls it
// under its lock.
type Settler struct {
	region  string
	floors  map[string]bucket.Limit
	applied map[bucket.Key]bucket.Limit
}

// NewSettler returns a Settler for region serving budgets, with nothing
// applied beyond the floors.
func NewSettler(region string, budgets []lease.Budget) *Settler {
	return &Settler{
		region:  region,
		floors:  floorsOf(region, budgets),
		applied: map[bucket.Key]bucket.Limit{},
	}
}

// SetBudgets replaces the budgets whose floors the Settler measures from.
func (s *Settler) SetBudgets(budgets []lease.Budget) {
	s.floors = floorsOf(s.region, budgets)
}

// Resume records, for a Holder resumed from the shared table, that the
// allocations it holds at now were already applied (by the previous
// speaker), replacing whatever the Settler remembered.
func (s *Settler) Resume(now time.Time, h *lease.Holder) {
	s.applied = map[bucket.Key]bucket.Limit{}
	for _, e := range h.Table() {
		floor, ok := s.floors[e.Key.Rule]
		if !ok {
			continue
		}
		if l, ok := h.Allocation(now, e.Key); ok && l != floor {
			s.applied[e.Key] = l
		}
	}
}

// Settle applies every allocation of h that changed since the last call to
// st's buckets at now, and returns how many keys it moved. Keys whose
// store call fails keep their old applied limit and are tried again at the
// next call.
func (s *Settler) Settle(ctx context.Context, now time.Time, h *lease.Holder, st bucket.Store) (applied int) {
	if st == nil || h == nil {
		return 0
	}
	var keys []bucket.Key
	for _, e := range h.Table() {
		keys = append(keys, e.Key)
	}
	for k := range s.applied {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpKey)
	keys = slices.Compact(keys)
	for _, k := range keys {
		floor, ok := s.floors[k.Rule]
		if !ok {
			continue
		}
		l, ok := h.Allocation(now, k)
		if !ok {
			continue
		}
		prev, seen := s.applied[k]
		if !seen {
			prev = floor
		}
		if l == prev {
			continue
		}
		if !settleBucket(ctx, st, k, prev, l) {
			continue
		}
		applied++
		if l == floor {
			delete(s.applied, k)
		} else {
			s.applied[k] = l
		}
	}
	return applied
}

// Applied returns the allocation last applied to key's bucket, ok false
// when it is the floor (or the key is unknown).
func (s *Settler) Applied(k bucket.Key) (bucket.Limit, bool) {
	l, ok := s.applied[k]
	return l, ok
}

// settleBucket moves key's regional bucket from limit prev to l now. It
// reports whether the store answered.
func settleBucket(ctx context.Context, st bucket.Store, k bucket.Key, prev, l bucket.Limit) bool {
	switch {
	case l.IsZero():
		return true // admits nothing; nothing to write
	case prev.IsZero():
		// From nothing: all of the new allocation arrives spent.
		_, err := st.TakeUpTo(ctx, k, l, l.Burst())
		return err == nil
	}
	rb, ok := st.(bucket.Rebaser)
	if !ok {
		return false // NewAgent refuses such a store; the simulator's implements it
	}
	return rb.Rebase(ctx, k, prev, l) == nil
}

// floorsOf returns each budget's floor limit in region.
func floorsOf(region string, bs []lease.Budget) map[string]bucket.Limit {
	m := make(map[string]bucket.Limit, len(bs))
	for _, b := range bs {
		m[b.Rule] = b.Floor(region).Limit
	}
	return m
}
