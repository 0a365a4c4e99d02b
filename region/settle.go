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
// that table (see speaker.step).

// settleLocked applies every changed allocation to the regional buckets at
// now. Keys whose store call fails keep their old applied limit and are
// tried again at the next step. Requires s.mu.
func (s *speaker) settleLocked(ctx context.Context, now time.Time) {
	if s.store == nil {
		return
	}
	if s.applied == nil {
		s.applied = map[bucket.Key]bucket.Limit{}
	}
	var keys []bucket.Key
	for _, e := range s.holder.Table() {
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
		l, ok := s.holder.Allocation(now, k)
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
		if !settleBucket(ctx, s.store, k, prev, l) {
			continue
		}
		if l == floor {
			delete(s.applied, k)
		} else {
			s.applied[k] = l
		}
	}
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
	if rb, ok := st.(bucket.Rebaser); ok {
		return rb.Rebase(ctx, k, prev, l) == nil
	}
	// A store without Rebase: a full (or never seen) bucket holds prev's
	// burst, no more; any other is rewritten now under l by giving one
	// token back and taking it again (nothing changes hands).
	d, err := st.Peek(ctx, k, l)
	if err != nil {
		return false
	}
	if d.Remaining >= l.Burst() {
		if up := l.Burst() - prev.Burst(); up > 0 {
			_, err := st.TakeUpTo(ctx, k, l, up)
			return err == nil
		}
		return true
	}
	if err := st.Return(ctx, k, l, 1); err != nil {
		return false
	}
	_, err = st.TakeUpTo(ctx, k, l, 1)
	return err == nil
}

// floorsOf returns each budget's floor limit in region.
func floorsOf(region string, bs []lease.Budget) map[string]bucket.Limit {
	m := make(map[string]bucket.Limit, len(bs))
	for _, b := range bs {
		m[b.Rule] = b.LimitOf(b.FloorCount(region))
	}
	return m
}

// initApplied records, for a Holder resumed from the shared table, the
// allocations the previous speaker applied. Requires s.mu.
func (s *speaker) initAppliedLocked(now time.Time) {
	s.applied = map[bucket.Key]bucket.Limit{}
	for _, e := range s.holder.Table() {
		floor, ok := s.floors[e.Key.Rule]
		if !ok {
			continue
		}
		if l, ok := s.holder.Allocation(now, e.Key); ok && l != floor {
			s.applied[e.Key] = l
		}
	}
}
