package sim

import (
	"context"
	"fmt"

	"github.com/allot-dev/allot/bucket"
)

// regionStore is one region's Redis model seen as a bucket.Store and a
// bucket.Rebaser, at the virtual instant t the lease plane sets before
// each call: the store region.Settler applies allocation changes to. Its
// keys are the plane's budget keys. A call while no primary answers fails
// with bucket.ErrUnavailable and sets down, so the plane settles again
// when one does.
type regionStore struct {
	p    *leasePlane
	rd   *regionalRedis
	t    Micros
	down bool
}

var (
	_ bucket.Store   = (*regionStore)(nil)
	_ bucket.Rebaser = (*regionStore)(nil)
)

// budget returns key's budget index, or an error when the key is unknown
// or no primary answers at s.t.
func (s *regionStore) budget(key bucket.Key) (int, error) {
	b, ok := s.p.budgetOf(s.p.a.w, key)
	if !ok {
		return 0, fmt.Errorf("sim: regional store: unknown key %s/%s", key.Rule, key.Subject)
	}
	if !s.rd.up(s.t) {
		s.down = true
		return 0, fmt.Errorf("sim: regional store: failover until %d µs: %w", s.rd.downUntil, bucket.ErrUnavailable)
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

// Rebase implements bucket.Rebaser.
func (s *regionStore) Rebase(_ context.Context, key bucket.Key, from, to bucket.Limit) error {
	b, err := s.budget(key)
	if err != nil {
		return err
	}
	s.rd.rebase(b, s.t, from, to)
	return nil
}
