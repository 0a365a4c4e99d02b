package breaker

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
)

// Errors callers branch on.
var (
	// ErrOpen wraps bucket.ErrUnavailable: the breaker is open and the
	// store was not called.
	ErrOpen = fmt.Errorf("breaker: open: %w", bucket.ErrUnavailable)
	// ErrTimeout: a call got no answer within the deadline the breaker
	// gave it. Store wraps it with bucket.ErrUnavailable.
	ErrTimeout = errors.New("breaker: no answer within the deadline")
	// ErrOutgrown wraps ErrTimeout: a call timed out under a deadline the
	// breaker had already raised past. It does not count against the
	// store (see Breaker.TimedOut).
	ErrOutgrown = fmt.Errorf("%w (a deadline since raised)", ErrTimeout)
)

// Store is a bucket.Store whose calls run under a Breaker's deadline and
// feed it their latency: every call gets Deadline (a probe, Ping,
// MaxTimeout), an answer is observed, a call that outlives its deadline
// is reported as timed out and returns an error wrapping ErrTimeout and
// bucket.ErrUnavailable.
//
// Made with Timed, it leaves the breaker's state to its caller (region's
// Core reports every decision's outcome itself and decides by its rules'
// policies when the breaker is open; it reports no failure for a call
// that returns ErrOutgrown). Made with Guard, it also keeps the
// state: an open breaker fails a call at once with ErrOpen, and every
// call's outcome is reported; the gateway's limiter then applies the
// rule's failure policy to ErrUnavailable as it does to any outage.
//
// Rebase and Ping are passed on when the inner store has them (see
// bucket.Rebaser and bucket.Pinger); otherwise they return an error. Store
// is safe for concurrent use.
type Store struct {
	inner  bucket.Store
	b      *Breaker
	clk    clock.Clock
	guard  bool
	keeper bool // inner is a DeadlineKeeper
}

// DeadlineKeeper is a bucket.Store that ends every call at its context's
// Deadline on timers of its own, whether or not the context's Done channel
// closes then, and reports the overrun as an error wrapping
// context.DeadlineExceeded or os.ErrDeadlineExceeded. Store hands such a
// store its deadline in a context that only carries it: a
// context.WithTimeout per call (a timer armed and stopped, a child
// registered with the caller's context and removed, their allocations)
// took about 4% of the agent's CPU on the Redis path in a profile under
// 32 callers. redisstore.Store is one.
type DeadlineKeeper interface {
	bucket.Store
	// KeepsDeadlines marks the store; it does nothing.
	KeepsDeadlines()
}

// deadlineCtx is ctx with an earlier deadline that nothing enforces but
// the store it is given to (a DeadlineKeeper): Done and Err stay ctx's, so
// the context's own contract holds, and Deadline reports the earlier of
// the two.
type deadlineCtx struct {
	context.Context
	deadline time.Time
}

// Deadline is the earlier of the caller's deadline and the breaker's.
func (c *deadlineCtx) Deadline() (time.Time, bool) {
	if d, ok := c.Context.Deadline(); ok && d.Before(c.deadline) {
		return d, true
	}
	return c.deadline, true
}

var (
	_ bucket.Store   = (*Store)(nil)
	_ bucket.Rebaser = (*Store)(nil)
	_ bucket.Pinger  = (*Store)(nil)
)

// Timed returns inner with b's deadlines; the caller reports outcomes to
// b. A nil clk means clock.Real{}.
func Timed(inner bucket.Store, b *Breaker, clk clock.Clock) *Store {
	if clk == nil {
		clk = clock.Real{}
	}
	_, keeper := inner.(DeadlineKeeper)
	return &Store{inner: inner, b: b, clk: clk, keeper: keeper}
}

// Guard returns inner with b's deadlines and state: calls fail at once
// while b is open. A nil clk means clock.Real{}.
func Guard(inner bucket.Store, b *Breaker, clk clock.Clock) *Store {
	s := Timed(inner, b, clk)
	s.guard = true
	return s
}

// Breaker returns the store's breaker.
func (s *Store) Breaker() *Breaker { return s.b }

// Inner returns the wrapped store.
func (s *Store) Inner() bucket.Store { return s.inner }

// do runs f under the breaker's deadline (MaxTimeout for a probe).
func (s *Store) do(ctx context.Context, probe bool, f func(context.Context) error) error {
	start := s.clk.Now()
	if s.guard && !s.b.Allow(start) {
		return ErrOpen
	}
	d := s.b.Deadline()
	if probe {
		d = s.b.cfg.MaxTimeout
	}
	var err error
	var timedOut bool
	if s.keeper && !probe {
		// The inner store ends the call at the deadline by itself, so the
		// context only carries it: no timer armed and stopped, no child
		// registered with the caller's context, on every decision.
		dl := deadlineCtx{Context: ctx, deadline: time.Now().Add(d)}
		err = f(&dl)
		timedOut = err != nil && ctx.Err() == nil && (!time.Now().Before(dl.deadline) ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded))
	} else {
		cctx, cancel := context.WithTimeout(ctx, d)
		err = f(cctx)
		// A call ran out of its deadline if ours expired, or if the inner
		// store says a deadline passed: a store that waits under a context
		// derived from cctx (a queue, a batch) can see that context's timer
		// fire before cctx's own, so cctx.Err() may still be nil, and a
		// connection's read deadline ends in an i/o timeout, not a context
		// error. Counted as plain failures, such timeouts bypassed the rule
		// that a deadline already raised past does not count.
		timedOut = ctx.Err() == nil && (errors.Is(cctx.Err(), context.DeadlineExceeded) ||
			errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded))
		cancel()
	}
	end := s.clk.Now()
	switch {
	case err == nil:
		s.b.Observe(end, end.Sub(start))
		if s.guard {
			s.b.Success(start)
		}
		return nil
	case inputErr(err) || ctx.Err() != nil:
		// About the request, or the caller gave up: no verdict on the
		// store.
		if s.guard {
			s.b.Cancel()
		}
		return err
	case timedOut:
		// It lasted d at least, whatever a manual clock says.
		if !s.b.TimedOut(maxTime(end, start.Add(d)), d) {
			if s.guard {
				s.b.Cancel()
			}
			return fmt.Errorf("%w: %w after %s: %w", bucket.ErrUnavailable, ErrOutgrown, d, err)
		}
		if s.guard {
			s.b.Failure(start)
		}
		return fmt.Errorf("%w: %w after %s: %w", bucket.ErrUnavailable, ErrTimeout, d, err)
	}
	if s.guard {
		s.b.Failure(start)
	}
	if !errors.Is(err, bucket.ErrUnavailable) {
		err = fmt.Errorf("%w: %w", bucket.ErrUnavailable, err)
	}
	return err
}

func inputErr(err error) bool {
	return errors.Is(err, bucket.ErrInvalidLimit) || errors.Is(err, bucket.ErrInvalidCost) || errors.Is(err, bucket.ErrNeverFits)
}

// Decide implements bucket.Store.
func (s *Store) Decide(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	var d bucket.Decision
	err := s.do(ctx, false, func(ctx context.Context) (err error) {
		d, err = s.inner.Decide(ctx, key, l, cost, attemptID)
		return err
	})
	return d, err
}

// TakeUpTo implements bucket.Store.
func (s *Store) TakeUpTo(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	var got bucket.Tokens
	err := s.do(ctx, false, func(ctx context.Context) (err error) {
		got, err = s.inner.TakeUpTo(ctx, key, l, n)
		return err
	})
	return got, err
}

// Return implements bucket.Store.
func (s *Store) Return(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	return s.do(ctx, false, func(ctx context.Context) error { return s.inner.Return(ctx, key, l, n) })
}

// Peek implements bucket.Store.
func (s *Store) Peek(ctx context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	var d bucket.Decision
	err := s.do(ctx, false, func(ctx context.Context) (err error) {
		d, err = s.inner.Peek(ctx, key, l)
		return err
	})
	return d, err
}

// Rebase implements bucket.Rebaser when the inner store does.
func (s *Store) Rebase(ctx context.Context, key bucket.Key, from, to bucket.Limit, credit bucket.Tokens) (bucket.Tokens, error) {
	rb, ok := s.inner.(bucket.Rebaser)
	if !ok {
		return 0, fmt.Errorf("breaker: %T cannot rebase", s.inner)
	}
	var lost bucket.Tokens
	err := s.do(ctx, false, func(ctx context.Context) error {
		var err error
		lost, err = rb.Rebase(ctx, key, from, to, credit)
		return err
	})
	if err != nil {
		return 0, err
	}
	return lost, nil
}

// Ping implements bucket.Pinger: the inner store's ping under MaxTimeout,
// the probe that measures a slow store as well as a returning one.
func (s *Store) Ping(ctx context.Context) error {
	p, ok := s.inner.(bucket.Pinger)
	if !ok {
		return fmt.Errorf("breaker: %T cannot ping", s.inner)
	}
	return s.do(ctx, true, p.Ping)
}

// CanRebase reports whether the inner store implements bucket.Rebaser.
func (s *Store) CanRebase() bool { _, ok := s.inner.(bucket.Rebaser); return ok }

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
