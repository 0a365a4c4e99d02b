package sim

import (
	"context"
	"fmt"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// regionStore is one region's Redis model seen as a bucket.Store and a
// bucket.Rebaser by the speaking agent, at the virtual instant t the lease
// plane sets before each call: the store its Speaker's changes are settled
// in (region.Change.Apply). Its keys are the plane's budget keys. A call
// the speaking agent cannot get through (a partition, loss, a failover's
// downtime) fails with bucket.ErrUnavailable; the Speaker lists the change
// again at its next Ready.
type regionStore struct {
	p    *leasePlane
	rd   *regionalRedis
	r    int    // the region
	from int    // the speaking agent
	t    Micros // the virtual instant of the calls
}

var (
	_ bucket.Store   = (*regionStore)(nil)
	_ bucket.Rebaser = (*regionStore)(nil)
)

// budget returns key's budget index, or an error when the key is unknown
// or the speaking agent does not reach a primary at s.t.
func (s *regionStore) budget(key bucket.Key) (int, error) {
	w := s.p.a.w
	b, ok := s.p.budgetOf(w, key)
	if !ok {
		return 0, fmt.Errorf("sim: regional store: unknown key %s/%s", key.Rule, key.Subject)
	}
	if !s.p.reachShared(w, s.r, s.from, s.t) {
		return 0, fmt.Errorf("sim: regional store of %s unreachable from agent %d at %d µs: %w", w.regions[s.r].name, s.from, s.t, bucket.ErrUnavailable)
	}
	return b, nil
}

// Decide implements bucket.Store.
func (s *regionStore) Decide(_ context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, _ string) (bucket.Decision, error) {
	b, err := s.budget(key)
	if err != nil {
		return bucket.Decision{}, err
	}
	return s.rd.decide(b, s.t, l, int64(cost)), nil
}

// TakeUpTo implements bucket.Store.
func (s *regionStore) TakeUpTo(_ context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	b, err := s.budget(key)
	if err != nil {
		return 0, err
	}
	s.rd.ops++
	return bucket.Tokens(s.rd.takeUpTo(b, s.t, l, int64(n))), nil
}

// Return implements bucket.Store.
func (s *regionStore) Return(_ context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	b, err := s.budget(key)
	if err != nil {
		return err
	}
	s.rd.giveBack(b, s.t, l, int64(n))
	return nil
}

// Peek implements bucket.Store.
func (s *regionStore) Peek(_ context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	b, err := s.budget(key)
	if err != nil {
		return bucket.Decision{}, err
	}
	return s.rd.peek(b, s.t, l), nil
}

// Rebase implements bucket.Rebaser: the rebase and the credit's return in
// one call, as the Redis store makes them.
func (s *regionStore) Rebase(_ context.Context, key bucket.Key, from, to bucket.Limit, credit bucket.Tokens) (bucket.Tokens, error) {
	b, err := s.budget(key)
	if err != nil {
		return 0, err
	}
	// Refused as the Redis store refuses it, not taken as done.
	if _, _, err := bucket.Rebase(bucket.State{}, time.Time{}, from, to); err != nil {
		return 0, err
	}
	lost, ok := s.rd.rebase(b, s.t, from, to)
	if !ok {
		return 0, fmt.Errorf("sim: regional store of %s has no primary at %d µs: %w", s.p.a.w.regions[s.r].name, s.t, bucket.ErrUnavailable)
	}
	if credit > 0 {
		s.rd.giveBack(b, s.t, to, int64(credit))
	}
	return lost, nil
}
