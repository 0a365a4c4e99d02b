// Package clock gives the rest of allot its notion of time as an input.
//
// The deterministic cores (bucket, lease, the decision core of region) take a
// time.Time argument and never read the wall clock. Drivers that need "now",
// or need to wait, hold a Clock: Real in production, Manual in tests, so a
// test moves time forward with Advance instead of sleeping, and waits with
// WaitForTimers until the drivers' loops are idle again.
package clock

import (
	"context"
	"slices"
	"sync"
	"time"
)

// Clock reports the current time and makes timers and tickers on it.
type Clock interface {
	Now() time.Time
	// NewTimer returns a Timer that sends the time on its channel once,
	// d after now.
	NewTimer(d time.Duration) Timer
	// NewTicker returns a Ticker that sends the time on its channel every
	// d, dropping ticks a slow reader misses. d must be > 0.
	NewTicker(d time.Duration) Ticker
}

// Timer is a time.Timer on a Clock.
type Timer interface {
	// C is the channel the timer fires on.
	C() <-chan time.Time
	// Stop prevents the timer from firing; it reports whether the timer
	// was pending.
	Stop() bool
	// Reset makes the timer fire d from now; it reports whether the timer
	// was pending.
	Reset(d time.Duration) bool
}

// Ticker is a time.Ticker on a Clock.
type Ticker interface {
	// C is the channel the ticker sends on.
	C() <-chan time.Time
	// Stop turns the ticker off.
	Stop()
	// Reset makes the ticker tick every d from now.
	Reset(d time.Duration)
}

// Real is the system clock. Its zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

// NewTimer returns a time.Timer.
func (Real) NewTimer(d time.Duration) Timer { return realTimer{time.NewTimer(d)} }

// NewTicker returns a time.Ticker.
func (Real) NewTicker(d time.Duration) Ticker { return realTicker{time.NewTicker(d)} }

type realTimer struct{ t *time.Timer }

func (r realTimer) C() <-chan time.Time        { return r.t.C }
func (r realTimer) Stop() bool                 { return r.t.Stop() }
func (r realTimer) Reset(d time.Duration) bool { return r.t.Reset(d) }

type realTicker struct{ t *time.Ticker }

func (r realTicker) C() <-chan time.Time   { return r.t.C }
func (r realTicker) Stop()                 { r.t.Stop() }
func (r realTicker) Reset(d time.Duration) { r.t.Reset(d) }

var (
	_ Clock = Real{}
	_ Clock = (*Manual)(nil)
)

// Manual is a clock that moves only when told to. Its timers and tickers
// fire as Advance or Set moves it past their deadlines, in deadline order,
// each sending at most once per move (a ticker, like time.Ticker, drops
// ticks its reader missed). Timers lists the deadlines pending, and
// WaitForTimers blocks until a number of them are: a driver that re-arms
// its timer after each round is idle again once its timer is pending.
// Manual is safe for concurrent use. The zero value starts at the zero
// time; use NewManual for a fixed start.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	pending []*manualTimer // armed timers and tickers
	changed *sync.Cond     // signalled when pending changes; uses mu
}

// manualTimer is a Manual's timer or, with a period, ticker.
type manualTimer struct {
	m      *Manual
	ch     chan time.Time
	when   time.Time
	period time.Duration // 0 for a timer
}

// NewManual returns a Manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's current reading.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d, firing the timers it passes. A
// negative d moves it backwards, which tests use to check that a clock
// stepping back grants nothing; no timer fires then.
func (m *Manual) Advance(d time.Duration) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.moveLocked(m.now.Add(d))
	return m.now
}

// Set moves the clock to t, forwards or backwards, firing the timers it
// passes.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.moveLocked(t)
}

// moveLocked sets now to t and fires every timer due by then, earliest
// first. Requires m.mu.
func (m *Manual) moveLocked(t time.Time) {
	m.now = t
	slices.SortStableFunc(m.pending, func(a, b *manualTimer) int { return a.when.Compare(b.when) })
	var keep []*manualTimer
	for _, mt := range m.pending {
		if mt.when.After(t) {
			keep = append(keep, mt)
			continue
		}
		select {
		case mt.ch <- mt.when:
		default: // the reader has not taken the last one: dropped
		}
		if mt.period > 0 {
			for !mt.when.After(t) {
				mt.when = mt.when.Add(mt.period)
			}
			keep = append(keep, mt)
		}
	}
	m.pending = keep
	m.signalLocked()
}

func (m *Manual) signalLocked() {
	if m.changed != nil {
		m.changed.Broadcast()
	}
}

// NewTimer implements Clock. A d ≤ 0 fires at once.
func (m *Manual) NewTimer(d time.Duration) Timer {
	mt := &manualTimer{m: m, ch: make(chan time.Time, 1)}
	mt.Reset(d)
	return manualTimerHandle{mt}
}

// NewTicker implements Clock.
func (m *Manual) NewTicker(d time.Duration) Ticker {
	if d <= 0 {
		panic("clock: non-positive interval for NewTicker")
	}
	mt := &manualTimer{m: m, ch: make(chan time.Time, 1), period: d}
	mt.resetTicker(d)
	return manualTickerHandle{mt}
}

// Timers returns the deadlines of the pending timers and tickers, sorted.
func (m *Manual) Timers() []time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]time.Time, len(m.pending))
	for i, mt := range m.pending {
		out[i] = mt.when
	}
	slices.SortFunc(out, time.Time.Compare)
	return out
}

// WaitForTimers blocks until at least n timers or tickers are pending, or
// ctx ends (its error is returned).
func (m *Manual) WaitForTimers(ctx context.Context, n int) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.changed == nil {
		m.changed = sync.NewCond(&m.mu)
	}
	stop := context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.changed.Broadcast()
	})
	defer stop()
	for len(m.pending) < n {
		if err := ctx.Err(); err != nil {
			return err
		}
		m.changed.Wait()
	}
	return nil
}

// removeLocked takes mt off the pending list, reporting whether it was
// there. Requires m.mu.
func (m *Manual) removeLocked(mt *manualTimer) bool {
	i := slices.Index(m.pending, mt)
	if i < 0 {
		return false
	}
	m.pending = slices.Delete(m.pending, i, i+1)
	m.signalLocked()
	return true
}

// Reset re-arms a timer d from now; a d ≤ 0 fires it at once. As with
// time.Timer since Go 1.23, no value sent before the call is received
// after it.
func (mt *manualTimer) Reset(d time.Duration) bool {
	m := mt.m
	m.mu.Lock()
	defer m.mu.Unlock()
	was := m.removeLocked(mt)
	mt.drain()
	mt.when = m.now.Add(d)
	if !mt.when.After(m.now) {
		mt.ch <- mt.when
		return was
	}
	m.pending = append(m.pending, mt)
	m.signalLocked()
	return was
}

// drain drops a value sent and not received.
func (mt *manualTimer) drain() {
	select {
	case <-mt.ch:
	default:
	}
}

// resetTicker re-arms a ticker to tick every d from now.
func (mt *manualTimer) resetTicker(d time.Duration) {
	if d <= 0 {
		panic("clock: non-positive interval for Ticker.Reset")
	}
	m := mt.m
	m.mu.Lock()
	defer m.mu.Unlock()
	m.removeLocked(mt)
	mt.drain()
	mt.period = d
	mt.when = m.now.Add(d)
	m.pending = append(m.pending, mt)
	m.signalLocked()
}

func (mt *manualTimer) stop() bool {
	mt.m.mu.Lock()
	defer mt.m.mu.Unlock()
	mt.drain()
	return mt.m.removeLocked(mt)
}

type manualTimerHandle struct{ mt *manualTimer }

func (h manualTimerHandle) C() <-chan time.Time        { return h.mt.ch }
func (h manualTimerHandle) Stop() bool                 { return h.mt.stop() }
func (h manualTimerHandle) Reset(d time.Duration) bool { return h.mt.Reset(d) }

type manualTickerHandle struct{ mt *manualTimer }

func (h manualTickerHandle) C() <-chan time.Time   { return h.mt.ch }
func (h manualTickerHandle) Stop()                 { h.mt.stop() }
func (h manualTickerHandle) Reset(d time.Duration) { h.mt.resetTicker(d) }
