package region

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
)

// Store is a Core behind the bucket.Store interface, so the edge (package
// limiter) uses a regional agent as it would any store. The limit a caller
// passes is the rule's global limit; the Store charges the key's budget
// (Namer) at the region's allocation for it.
//
// A store outage surfaces as the edge expects: a rule that fails closed or
// fails open gets an error wrapping bucket.ErrUnavailable (ErrFailClosed,
// ErrFailOpen), so the edge applies and counts the same policy; a rule with
// an emergency limit is decided here, by the region's allocation divided
// among its live agents, and returns a normal decision. Store is safe for
// concurrent use.
type Store struct {
	core    *Core
	clock   clock.Clock
	real    bool // clock is clock.Real: read time.Now directly, no interface call
	namer   atomic.Pointer[Namer]
	observe func(Result, time.Duration)
	// coarse, when set, is read instead of clock for decisions from a
	// batch (Core.fromBatch, with coarseSlack); every other decision reads
	// clock.
	coarse atomic.Pointer[clock.Coarse]
}

// coarseSlack is how long past a coarse reading a key's allocation must
// hold for a decision from its batch on that reading: a reading staler
// than this, which takes a refresher starved of the CPU for a second,
// could use a lease past its end. Leases are renewed every refresh and
// last several, so a live lease is nearly always seconds from its end, and
// a floor has no end.
const coarseSlack = time.Second

var (
	_ bucket.Store    = (*Store)(nil)
	_ bucket.Admitter = (*Store)(nil)
)

// NewStore returns the bucket.Store of core on clk; namer may be nil.
// observe, when set, receives every Decide's result and how long it took
// (for metrics); it must be quick and safe for concurrent use.
func NewStore(core *Core, clk clock.Clock, namer *Namer, observe func(Result, time.Duration)) *Store {
	if clk == nil {
		clk = clock.Real{}
	}
	_, real := clk.(clock.Real)
	s := &Store{core: core, clock: clk, real: real, observe: observe}
	s.namer.Store(namer)
	return s
}

// UseCoarse makes decisions from a batch read c (nil: clock again): one
// atomic load instead of a clock read, with the same answers as long as c
// lags the clock by less than a second. The driver runs c.
func (s *Store) UseCoarse(c *clock.Coarse) { s.coarse.Store(c) }

// SetNamer replaces the key namer (after a rules change).
func (s *Store) SetNamer(n *Namer) { s.namer.Store(n) }

// Core returns the decision core.
func (s *Store) Core() *Core { return s.core }

// Decide implements bucket.Store: Admit, and Declined when Admit did not
// decide. A request with an attempt id is never decided from a batch.
func (s *Store) Decide(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	if attemptID == "" {
		if left, lim := s.Admit(key, l, cost); lim != nil {
			// Built in the result, not in a variable whose address the
			// slow path takes: that one is zeroed and copied out.
			return bucket.Decision{Allowed: true, Remaining: left, Limit: *lim}, nil
		}
		return s.Declined(ctx, key, l, cost)
	}
	s.namer.Load().rename(&key, &l)
	return s.decide(ctx, &key, &l, cost, attemptID)
}

// Declined implements bucket.Admitter: Decide without the decision from a
// batch on the coarse clock, which Admit has just tried.
func (s *Store) Declined(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens) (bucket.Decision, error) {
	s.namer.Load().rename(&key, &l)
	return s.decide(ctx, &key, &l, cost, "")
}

// decide is Decide on the budget's key bk past the decision from a batch
// on the coarse clock: Core.decide on a true reading.
func (s *Store) decide(ctx context.Context, bk *bucket.Key, l *bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	var d bucket.Decision
	var now time.Time
	if s.real {
		now = time.Now()
	} else {
		now = s.clock.Now()
	}
	if s.observe == nil {
		path, _, err := s.core.decide(ctx, now, *bk, l, cost, attemptID, &d, nil)
		if err == nil && path == PathFailOpen {
			err = ErrFailOpen
		}
		return d, err
	}
	var alloc bucket.Limit
	path, ac, err := s.core.decide(ctx, now, *bk, l, cost, attemptID, &d, &alloc)
	s.observe(Result{Decision: d, Path: path, Hot: ac != nil && ac.hot, Alloc: alloc}, s.clock.Now().Sub(now))
	if err == nil && path == PathFailOpen {
		err = ErrFailOpen
	}
	return d, err
}

// Admit implements bucket.Admitter: Decide's decision from a batch, on
// the coarse clock (Core.fromBatch), returned in registers, when the store
// uses a coarse clock. The limit is the key's cached allocation's, which
// never changes once published.
func (s *Store) Admit(key bucket.Key, l bucket.Limit, cost bucket.Tokens) (bucket.Tokens, *bucket.Limit) {
	co := s.coarse.Load()
	if co == nil {
		return 0, nil
	}
	s.namer.Load().rename(&key, &l)
	left, ac := s.core.fromBatch(co.NowMicro(), coarseSlack.Microseconds(), &key, &l, cost)
	if ac == nil {
		return 0, nil
	}
	if s.observe != nil {
		s.observeBatch(left, ac)
	}
	return bucket.Tokens(left), &ac.limit
}

// observeBatch reports a decision from a batch to observe, out of line:
// the result it builds would otherwise enlarge Admit's frame.
func (s *Store) observeBatch(left int64, ac *allocCache) {
	// Timed by no clock: a decision from a batch takes tens of
	// nanoseconds, within the latency histogram's first bucket.
	s.observe(Result{Decision: bucket.Decision{Allowed: true, Remaining: bucket.Tokens(left), Limit: ac.limit},
		Path: PathBatch, Hot: ac.hot, Alloc: ac.full}, 0)
}

// TakeUpTo implements bucket.Store on the key's regional bucket, at the
// region's allocation.
func (s *Store) TakeUpTo(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	bk, lim, err := s.resolve(key, l)
	if err != nil {
		return 0, err
	}
	return s.core.store.TakeUpTo(ctx, bk, lim, n)
}

// Return implements bucket.Store on the key's regional bucket.
func (s *Store) Return(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	bk, lim, err := s.resolve(key, l)
	if err != nil {
		return err
	}
	return s.core.store.Return(ctx, bk, lim, n)
}

// Peek implements bucket.Store on the key's regional bucket.
func (s *Store) Peek(ctx context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	bk, lim, err := s.resolve(key, l)
	if err != nil {
		return bucket.Decision{Limit: l}, err
	}
	return s.core.store.Peek(ctx, bk, lim)
}

func (s *Store) resolve(key bucket.Key, l bucket.Limit) (bucket.Key, bucket.Limit, error) {
	if err := bucket.Check(l, 1); err != nil {
		return key, l, err
	}
	bk := s.namer.Load().Budget(key, l)
	lim, _ := s.core.Allocation(s.clock.Now(), bk, l)
	if lim.IsZero() {
		return bk, lim, bucket.Check(lim, 1)
	}
	return bk, lim, nil
}
