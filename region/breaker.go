package region

import (
	"sync"
	"sync/atomic"
	"time"
)

// BreakerState is a circuit breaker's state.
type BreakerState uint8

// Breaker states.
const (
	// BreakerClosed: calls go to the store.
	BreakerClosed BreakerState = iota
	// BreakerOpen: calls are decided by the failure policy at once, without
	// waiting on the store.
	BreakerOpen
	// BreakerHalfOpen: the back-off has passed; one probe call goes to the
	// store, the others are decided by the policy until it answers.
	BreakerHalfOpen
)

// String returns the state's name.
func (s BreakerState) String() string {
	switch s {
	case BreakerClosed:
		return "closed"
	case BreakerOpen:
		return "open"
	}
	return "half-open"
}

// Breaker is a circuit breaker on the regional store: after Failures
// consecutive failures it opens for Backoff, during which Allow says no at
// once; then one probe is let through. A successful probe closes it; a
// failed one opens it again for twice the back-off, up to MaxBackoff. Time
// is an argument. Breaker is safe for concurrent use; Allow and Success on
// a closed breaker are one atomic load each.
type Breaker struct {
	failures   int
	backoff    time.Duration
	maxBackoff time.Duration

	// openUntil is 0 when closed, else the µs time the back-off ends.
	openUntil atomic.Int64
	// bad is set while consecutive failures are being counted.
	bad atomic.Bool

	mu      sync.Mutex
	count   int           // consecutive failures while closed
	current time.Duration // current back-off
	probing bool
	opened  atomic.Int64 // times the breaker opened
}

// NewBreaker returns a closed breaker.
func NewBreaker(failures int, backoff, maxBackoff time.Duration) *Breaker {
	return &Breaker{failures: max(failures, 1), backoff: backoff, maxBackoff: max(maxBackoff, backoff), current: backoff}
}

// Allow reports whether a call may go to the store at now. A true answer
// while half-open makes the caller the probe: it must report Success or
// Failure.
func (b *Breaker) Allow(now time.Time) bool {
	u := b.openUntil.Load()
	if u == 0 {
		return true
	}
	if now.UnixMicro() < u {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.Load() == 0 {
		return true
	}
	if b.probing || now.UnixMicro() < b.openUntil.Load() {
		return false
	}
	b.probing = true
	return true
}

// Success records a call the store answered: the breaker closes.
func (b *Breaker) Success(time.Time) {
	if b.openUntil.Load() == 0 && !b.bad.Load() {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.count, b.probing, b.current = 0, false, b.backoff
	b.bad.Store(false)
	b.openUntil.Store(0)
}

// Failure records a call the store could not answer; it reports whether
// this failure opened the breaker.
func (b *Breaker) Failure(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.Load() != 0 {
		if !b.probing {
			return false // a call that started before the breaker opened
		}
		b.probing = false
		b.current = min(2*b.current, b.maxBackoff)
		b.openUntil.Store(now.Add(b.current).UnixMicro())
		b.opened.Add(1)
		return true
	}
	b.bad.Store(true)
	b.count++
	if b.count < b.failures {
		return false
	}
	b.count = 0
	b.openUntil.Store(now.Add(b.current).UnixMicro())
	b.opened.Add(1)
	return true
}

// State reports the breaker's state at now.
func (b *Breaker) State(now time.Time) BreakerState {
	u := b.openUntil.Load()
	switch {
	case u == 0:
		return BreakerClosed
	case now.UnixMicro() < u:
		return BreakerOpen
	}
	return BreakerHalfOpen
}

// Opened is how many times the breaker has opened.
func (b *Breaker) Opened() int64 { return b.opened.Load() }
