package region

import (
	"context"
	"errors"
	"fmt"
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
// gave up is in use elsewhere. So the speaking agent settles every change
// of a key's allocation, applying it to its regional bucket the moment it
// happens (grants, and the lease's or a hold's end), once per region,
// before it publishes the table the others decide with; acknowledgements
// wait for that table (see Speaker). "Settle" means this and nothing else
// in allot.

// Change is one key's allocation change to settle: its regional bucket
// moves from limit From to limit To, and then takes Credit tokens of the
// budget's reserve that the grant carried (lease.Entry.Credit), once.
type Change struct {
	Key      bucket.Key
	From, To bucket.Limit
	Credit   bucket.Tokens
	// Again marks a change listed again (it failed, or the agents may have
	// decided past the table's end): the bucket may not be at From, so
	// what its rebase reports taken away is not trusted (Speaker.Advance).
	Again bool
}

// ErrNotRebaser is returned by Change.Apply on a store that cannot rebase a
// bucket (both bucket stores can).
var ErrNotRebaser = errors.New("region: store does not implement bucket.Rebaser")

// Apply settles c in st: it rebases the bucket (bucket.Rebaser), so the
// tokens it holds carry across and an increase arrives spent; from an
// allocation that admits nothing (none, or a burst of 0: below the
// budget's unit) the bucket is left empty, since what it refilled to
// meanwhile was another region's; a change to one that admits nothing
// writes nothing. The credit goes in with the rebase, in the same call, as
// a return of that many tokens, at most to the new burst: as two calls,
// under a slow store the settlement of a raise that carried credit took
// two round trips before its table could go out. lost is the whole tokens
// the rebase took away
// (what the bucket held beyond To's burst), which the caller reports in
// its Outcome. The error is the store's; the caller reports
// the change back as unsettled, and the Settler lists it again without its
// credit, which a call that failed may or may not have put in (tokens
// lost, never added twice). An allocation from nothing used to take the
// new burst's whole tokens out and left the fraction the bucket had
// refilled: raised from nothing to 12 a minute with burst 1, a region
// held 0.81 of a token it had not been allocated, and admitted again 3.3 s
// after the region that held the budget meanwhile (0.335 tokens over a
// budget whose bound was 0.04; everything-tight at the race tests' scale).
func (c Change) Apply(ctx context.Context, st bucket.Store) (lost bucket.Tokens, err error) {
	if c.To.AdmitsNothing() {
		return 0, nil // nothing to write
	}
	rb, ok := st.(bucket.Rebaser)
	if !ok {
		return 0, fmt.Errorf("%w: %T", ErrNotRebaser, st)
	}
	return rb.Rebase(ctx, c.Key, c.From, c.To, c.Credit)
}

// Loss is what the rebase of a change took away from its bucket.
type Loss struct {
	Change Change
	Tokens bucket.Tokens
}

// Settle applies every change in st (Change.Apply) and returns the
// outcome: those the store did not take, and what those it took took away.
func Settle(ctx context.Context, st bucket.Store, changes []Change) Outcome {
	var o Outcome
	for _, c := range changes {
		lost, err := c.Apply(ctx, st)
		o.Add(c, lost, err)
	}
	return o
}

// Add records how the store took c: not at all (err), or taking lost
// tokens away.
func (o *Outcome) Add(c Change, lost bucket.Tokens, err error) {
	if err != nil {
		o.Unsettled = append(o.Unsettled, c)
		return
	}
	if lost > 0 {
		o.Lost = append(o.Lost, Loss{Change: c, Tokens: lost})
	}
}

// Settler works out which allocation changes of a region's lease.Holder
// are still to be applied to the regional buckets. It remembers the
// allocation applied to each key (absent: the budget's floor). It does no
// I/O: its caller applies the changes (Change.Apply) and reports those that
// failed (Unsettle), which are listed again at the next call. It is not
// safe for concurrent use; the Speaker holds it.
type Settler struct {
	region  string
	floors  map[string]bucket.Limit
	applied map[bucket.Key]bucket.Limit
	// again holds keys whose bucket may not be at the applied limit any
	// more (Lapsed, Unsettle): Changes lists them even when the allocation
	// equals the applied one.
	again map[bucket.Key]struct{}
	keys  []bucket.Key // Changes' buffer
}

// NewSettler returns a Settler for region serving budgets, with nothing
// applied beyond the floors.
func NewSettler(region string, budgets []lease.Budget) *Settler {
	return &Settler{
		region:  region,
		floors:  floorsOf(region, budgets),
		applied: map[bucket.Key]bucket.Limit{},
		again:   map[bucket.Key]struct{}{},
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
	clear(s.again)
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

// Changes returns, in key order, every allocation of h at now that differs
// from the one applied, and records each as applied: the caller applies
// them at once and reports any that failed with Unsettle.
func (s *Settler) Changes(now time.Time, h *lease.Holder) []Change {
	credits := h.TakeCredits()
	keys := s.keys[:0]
	for _, e := range h.Table() {
		keys = append(keys, e.Key)
	}
	for k := range credits {
		keys = append(keys, k)
	}
	for k := range s.applied {
		keys = append(keys, k)
	}
	for k := range s.again {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, cmpKey)
	keys = slices.Compact(keys)
	var out []Change
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
		_, unsure := s.again[k]
		if l == prev && !unsure && credits[k] == 0 {
			continue
		}
		out = append(out, Change{Key: k, From: prev, To: l, Credit: credits[k], Again: unsure})
		s.record(k, l, floor)
	}
	clear(s.again)
	s.keys = keys[:0]
	return out
}

// Lapsed tells the Settler that the region's agents may have decided with
// table t past the end of its lease or of its hold since the last Changes:
// an agent deciding under t then moved a key's bucket to what t gives
// after that end (GCRA carries a bucket to the limit of each call), and a
// grant taken since may give back the allocation applied before, which
// Changes would skip as unchanged while the bucket refills at the other
// limit. So the next Changes lists every key of t (a rebase re-expresses a
// bucket from whatever limit it was written under).
func (s *Settler) Lapsed(t *Table) {
	for _, e := range t.Entries {
		s.again[e.Key] = struct{}{}
	}
}

// Unsettle reports that c could not be applied: its bucket still has the
// limit c.From, and the change is listed again by the next Changes.
func (s *Settler) Unsettle(c Change) {
	floor, ok := s.floors[c.Key.Rule]
	if !ok {
		return
	}
	s.record(c.Key, c.From, floor)
	s.again[c.Key] = struct{}{}
}

func (s *Settler) record(k bucket.Key, l, floor bucket.Limit) {
	if l == floor {
		delete(s.applied, k)
	} else {
		s.applied[k] = l
	}
}

// Applied returns the allocation last applied to key's bucket, ok false
// when it is the floor (or the key is unknown).
func (s *Settler) Applied(k bucket.Key) (bucket.Limit, bool) {
	l, ok := s.applied[k]
	return l, ok
}

// floorsOf returns each budget's floor limit in region.
func floorsOf(region string, bs []lease.Budget) map[string]bucket.Limit {
	m := make(map[string]bucket.Limit, len(bs))
	for _, b := range bs {
		m[b.Rule] = b.Floor(region).Limit
	}
	return m
}
