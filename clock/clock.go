// Package clock gives the rest of allot its notion of time as an input.
//
// The deterministic cores (bucket, lease, the decision core of region) take a
// time.Time argument and never read the wall clock. Drivers that need "now"
// hold a Clock: Real in production, Manual in tests and in the simulator, so a
// test moves time forward with Advance instead of sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock reports the current time.
type Clock interface {
	Now() time.Time
}

// Real is the system clock. Its zero value is ready to use.
type Real struct{}

// Now returns time.Now().
func (Real) Now() time.Time { return time.Now() }

var (
	_ Clock = Real{}
	_ Clock = (*Manual)(nil)
)

// Manual is a clock that moves only when told to. It is safe for concurrent
// use. The zero value starts at the zero time; use NewManual for a fixed start.
type Manual struct {
	mu  sync.Mutex
	now time.Time
}

// NewManual returns a Manual clock reading start.
func NewManual(start time.Time) *Manual { return &Manual{now: start} }

// Now returns the clock's current reading.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// Advance moves the clock forward by d. A negative d moves it backwards,
// which tests use to check that a clock stepping back grants nothing.
func (m *Manual) Advance(d time.Duration) time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	return m.now
}

// Set moves the clock to t, forwards or backwards.
func (m *Manual) Set(t time.Time) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = t
}
