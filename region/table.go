package region

import (
	"cmp"
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// Allocations answers what the region may use of a key. Implementations
// are safe for concurrent use and allocation-free.
type Allocations interface {
	// Allocation returns the region's limit for key, whose global budget is
	// global, at now. hot is set when the limit is a coordinator entry
	// (not the floor). The answer holds until validUntil unless Epoch
	// changes first. A zero Limit means the region may admit nothing.
	Allocation(now time.Time, key bucket.Key, global bucket.Limit) (l bucket.Limit, hot bool, validUntil time.Time)
	// Epoch changes whenever an answer may have changed before its
	// validUntil (a new table that gives some key another answer).
	Epoch() uint64
}

// farFuture is the validUntil of answers that only a new table changes.
var farFuture = time.Unix(1<<40, 0)

// Table is a region's allocation table: the lease.Holder's state as every
// agent of the region uses it. The speaking agent writes it to the regional
// Redis after every change; the others read it from there.
type Table struct {
	Region  string
	Speaker string
	// Pub numbers the speaker's publications. A new speaking agent goes on
	// from the stored table's Pub, so a higher Pub is always the newer
	// table, even when an expiry shortened the lease.
	Pub uint64
	// Term, Version, LeaseEnd, HoldUntil and Released are the Holder's, as
	// in lease.HolderState.
	Term      uint64
	Version   uint64
	LeaseEnd  time.Time
	HoldUntil time.Time
	Released  bool
	// Entries are the hot keys' allocations, sorted by key.
	Entries []lease.Entry
	// Written is when the speaker wrote the table (its clock).
	Written time.Time
	// Floors are the region's floors as the speaker's Holder counts them
	// (the coordinator's, once a full grant brought its budgets): an agent
	// decides a key at its floor, the smaller of its own and this one.
	Floors []lease.BudgetFloor

	index    map[bucket.Key]int
	floorIdx map[string]int
	// lapsed is set once a reader has found the lease over (Released, or
	// read at or after LeaseEnd) for a key with an entry: its answer then
	// came from the hold or the floor, which a renewal changes, so the
	// TableView moves its epoch when this table is replaced. build
	// allocates it; a copy of a built table shares it, which only ever
	// moves the epoch more often.
	lapsed *atomic.Bool
}

// TableOf returns the table of a Holder snapshot, publication pub.
func TableOf(region, speaker string, pub uint64, st lease.HolderState, now time.Time) *Table {
	t := &Table{Region: region, Speaker: speaker, Pub: pub, Term: st.Term, Version: st.Version,
		LeaseEnd: st.LeaseEnd, HoldUntil: st.HoldUntil, Released: st.Released,
		Entries: slices.Clone(st.Entries), Written: now, Floors: slices.Clone(st.Floors)}
	t.build()
	return t
}

// tableJSON is a Table as the agents store it in the regional Redis.
type tableJSON struct {
	Region    string              `json:"region"`
	Speaker   string              `json:"speaker"`
	Pub       uint64              `json:"pub"`
	Term      uint64              `json:"term"`
	Version   uint64              `json:"version"`
	LeaseEnd  time.Time           `json:"lease_end"`
	HoldUntil time.Time           `json:"hold_until"`
	Released  bool                `json:"released"`
	Written   time.Time           `json:"written"`
	Entries   []lease.Entry       `json:"entries"`
	Floors    []lease.BudgetFloor `json:"floors,omitempty"`
}

// MarshalJSON encodes t as the agents store it.
func (t *Table) MarshalJSON() ([]byte, error) {
	return json.Marshal(tableJSON{Region: t.Region, Speaker: t.Speaker, Pub: t.Pub, Term: t.Term, Version: t.Version,
		LeaseEnd: t.LeaseEnd, HoldUntil: t.HoldUntil, Released: t.Released, Written: t.Written, Entries: t.Entries,
		Floors: t.Floors})
}

// UnmarshalJSON decodes a table MarshalJSON wrote.
func (t *Table) UnmarshalJSON(b []byte) error {
	var j tableJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return fmt.Errorf("region: decode table: %w", err)
	}
	*t = Table{Region: j.Region, Speaker: j.Speaker, Pub: j.Pub, Term: j.Term, Version: j.Version,
		LeaseEnd: j.LeaseEnd, HoldUntil: j.HoldUntil, Released: j.Released, Written: j.Written, Entries: j.Entries,
		Floors: j.Floors}
	t.build()
	return nil
}

// HolderState returns the table as a lease.HolderState for session, so a
// new speaking agent can resume the region's lease (lease.RestoreHolder).
func (t *Table) HolderState(session uint64) lease.HolderState {
	return lease.HolderState{Session: session, Term: t.Term, Version: t.Version, LeaseEnd: t.LeaseEnd,
		HoldUntil: t.HoldUntil, Released: t.Released, Entries: slices.Clone(t.Entries), Floors: slices.Clone(t.Floors)}
}

func (t *Table) build() {
	slices.SortFunc(t.Entries, func(a, b lease.Entry) int {
		if c := cmp.Compare(a.Key.Rule, b.Key.Rule); c != 0 {
			return c
		}
		return cmp.Compare(a.Key.Subject, b.Key.Subject)
	})
	t.index = make(map[bucket.Key]int, len(t.Entries))
	for i, e := range t.Entries {
		t.index[e.Key] = i
	}
	slices.SortFunc(t.Floors, func(a, b lease.BudgetFloor) int { return cmp.Compare(a.Rule, b.Rule) })
	t.floorIdx = make(map[string]int, len(t.Floors))
	for i, f := range t.Floors {
		t.floorIdx[f.Rule] = i
	}
	if t.lapsed == nil {
		t.lapsed = new(atomic.Bool)
	}
}

// Newer reports whether t supersedes u: a later publication.
func (t *Table) Newer(u *Table) bool { return u == nil || t.Pub > u.Pub }

// Same reports whether t and u give the same allocations: same lease,
// hold and entries (Pub, Speaker and Written aside).
func (t *Table) Same(u *Table) bool {
	return u != nil && t.Term == u.Term && t.Version == u.Version && t.LeaseEnd.Equal(u.LeaseEnd) &&
		t.HoldUntil.Equal(u.HoldUntil) && t.Released == u.Released && slices.Equal(t.Entries, u.Entries) &&
		slices.Equal(t.Floors, u.Floors)
}

// floorOf returns the region's floor of global for rule: fl, the agents'
// own, unless the table's Holder counts a smaller one for the same global
// limit. The coordinator counts the region at its own floors, which the
// Holder adopts with a full grant; an agent configured with another split
// (a -reserve below a budget's) must not use more than that. A table with
// no floor for rule, or one for another global limit (rules changing),
// leaves fl.
func (t *Table) floorOf(rule string, global bucket.Limit, fl lease.Floor) lease.Floor {
	i, ok := t.floorIdx[rule]
	if !ok {
		return fl
	}
	f := &t.Floors[i]
	if f.Count != global.Count() || f.Period != global.Period() || f.GlobalBurst != global.Burst() ||
		f.Floor >= fl.Count && f.Burst >= fl.Burst {
		return fl
	}
	c, b := min(f.Floor, fl.Count), min(f.Burst, fl.Burst)
	return lease.Floor{Count: c, Burst: b, Limit: entryLimit(global, c, b)}
}

// Live reports whether the table's lease lives at now.
func (t *Table) Live(now time.Time) bool { return t != nil && !t.Released && now.Before(t.LeaseEnd) }

// floors computes a region's floor of a global budget from the split
// (lease.Split.Floor), caching the last answers.
type floors struct {
	region string
	split  lease.Split
	// last is the floor computed last and cache every floor computed, an
	// immutable map replaced on each addition: both are read without a
	// lock, and limits come from rules, so additions are rare.
	last  atomic.Pointer[floorOf]
	cache atomic.Pointer[map[bucket.Limit]lease.Floor]
	mu    sync.Mutex // serializes additions
}

type floorOf struct {
	global bucket.Limit
	floor  lease.Floor
}

func newFloors(region string, split lease.Split) *floors {
	if split.Regions == nil {
		split.Regions = []string{region}
	}
	return &floors{region: region, split: split}
}

// of returns the region's floor of global.
func (f *floors) of(global bucket.Limit) lease.Floor {
	if l := f.last.Load(); l != nil && l.global == global {
		return l.floor
	}
	if m := f.cache.Load(); m != nil {
		if fl, ok := (*m)[global]; ok {
			return fl
		}
	}
	fl := f.split.Floor(f.region, global)
	f.mu.Lock()
	defer f.mu.Unlock()
	var m map[bucket.Limit]lease.Floor
	if old := f.cache.Load(); old != nil && len(*old) < 4096 { // never grow without bound
		m = maps.Clone(*old)
	} else {
		m = map[bucket.Limit]lease.Floor{}
	}
	m[global] = fl
	f.cache.Store(&m)
	f.last.Store(&floorOf{global: global, floor: fl})
	return fl
}

// TableView is the Allocations of a region: the current Table (nil: no
// lease ever seen, every key at its floor) and the region's floors. Set
// swaps tables atomically; readers never lock. It is safe for concurrent
// use.
type TableView struct {
	floors *floors
	cur    atomic.Pointer[Table]
	epoch  atomic.Uint64
	// installed is when the current table was installed, when its
	// installer said (SetAt); stored after the swap, so a reader between
	// the two finds it naming the old table and reads no time.
	installed atomic.Pointer[installedAt]
}

type installedAt struct {
	t  *Table
	at time.Time
}

var _ Allocations = (*TableView)(nil)

// NewTableView returns a view with no table: every key at its floor.
func NewTableView(region string, split lease.Split) *TableView {
	return &TableView{floors: newFloors(region, split)}
}

// Set installs t if it supersedes the current table and reports whether it
// did. The epoch moves unless t only renews old (extends): a renewal, the
// common case, then leaves every cached allocation in place.
func (v *TableView) Set(t *Table) bool { return v.SetAt(t, time.Time{}) }

// SetAt is Set, and records now (the installer's clock) as when t was
// installed, which Installed reports: when this view began deciding with
// it.
func (v *TableView) SetAt(t *Table, now time.Time) bool {
	for {
		old := v.cur.Load()
		if old != nil && !t.Newer(old) {
			return false
		}
		if t.index == nil {
			t.build()
		}
		if v.cur.CompareAndSwap(old, t) {
			// The swap comes before the read of old.lapsed: a reader that
			// sets lapsed after this read finds t installed when it looks
			// again (Allocation), so no answer from old's lapse outlives old.
			if !t.extends(old) {
				v.epoch.Add(1)
			}
			if !now.IsZero() {
				v.installed.Store(&installedAt{t: t, at: now})
			}
			return true
		}
	}
}

// extends reports whether every answer old gave, at any instant before its
// validUntil, is also t's answer at that instant: the same entries, neither
// released, a lease that ends no earlier, and no reader of old having found
// its lease over (those answers, from the hold or the floor, a renewal
// changes). Keys without an entry get their floor from either; a key with
// an entry got it until old's LeaseEnd, and t gives it at least as long.
func (t *Table) extends(old *Table) bool {
	return old != nil && !old.Released && !t.Released && !t.LeaseEnd.Before(old.LeaseEnd) &&
		!old.lapsed.Load() && slices.Equal(t.Entries, old.Entries) && slices.Equal(t.Floors, old.Floors)
}

// Table returns the current table, nil if none.
func (v *TableView) Table() *Table { return v.cur.Load() }

// Installed returns the current table and when it was installed, as SetAt
// was told; the time is zero when the table came by Set, or when it is read
// between the swap and the record.
func (v *TableView) Installed() (*Table, time.Time) {
	t := v.cur.Load()
	if in := v.installed.Load(); in != nil && in.t == t {
		return t, in.at
	}
	return t, time.Time{}
}

// Speaker is the agent that published the current table, empty when there
// is none: what SpeakerOf keeps speaking while it lives.
func (v *TableView) Speaker() string {
	if t := v.cur.Load(); t != nil {
		return t.Speaker
	}
	return ""
}

// Epoch implements Allocations.
func (v *TableView) Epoch() uint64 { return v.epoch.Load() }

// Floor returns the region's floor of global.
func (v *TableView) Floor(global bucket.Limit) bucket.Limit { return v.floors.of(global).Limit }

// Allocation implements Allocations with the Holder's rule: a key's entry
// while the lease lives; after it, an entry below the floor (a lent floor)
// until the hold ends; the floor otherwise. The floor is the view's own,
// or the table's where that is smaller (Table.floorOf).
func (v *TableView) Allocation(now time.Time, key bucket.Key, global bucket.Limit) (bucket.Limit, bool, time.Time) {
	own := v.floors.of(global)
	for {
		t := v.cur.Load()
		if t == nil {
			return own.Limit, false, farFuture
		}
		fl := t.floorOf(key.Rule, global, own)
		i, ok := t.index[key]
		if !ok {
			return fl.Limit, false, farFuture
		}
		e := t.Entries[i]
		if !t.Released && now.Before(t.LeaseEnd) {
			return entryLimit(global, e.Count, e.Burst), true, t.LeaseEnd
		}
		// The lease is over for this reader: mark t lapsed, so that Set
		// moves the epoch when a renewal replaces it, and look again in
		// case one already has (Set reads lapsed after its swap).
		if !t.lapsed.Load() {
			t.lapsed.Store(true)
		}
		if v.cur.Load() != t {
			continue
		}
		if e.Count < fl.Count && now.Before(t.HoldUntil) {
			return entryLimit(global, e.Count, min(e.Burst, fl.Burst)), true, t.HoldUntil
		}
		return fl.Limit, false, farFuture
	}
}

func entryLimit(global bucket.Limit, count, burst bucket.Tokens) bucket.Limit {
	if count <= 0 || burst <= 0 {
		return bucket.Limit{}
	}
	return bucket.Per(count, global.Period()).WithBurst(burst)
}
