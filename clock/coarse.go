package clock

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"
)

// ErrInvalidCoarse: a Coarse clock's refresh period is not > 0.
var ErrInvalidCoarse = errors.New("clock: invalid coarse clock")

// Coarse is a reading of a source Clock that a driver refreshes every
// period (Run), so that a reader pays one atomic load instead of a clock
// read: on a virtual machine time.Now can cost more than an in-process
// decision. A reading is never ahead of the source, and lags it by about
// the period while Run keeps up; nothing bounds the lag when Run is not
// scheduled, so a caller that must not act on a stale reading keeps a
// margin of its own (region.Store's batch path needs the key's allocation
// to hold a second past the reading). Coarse is safe for concurrent use.
type Coarse struct {
	src   Clock
	every time.Duration
	us    atomic.Int64 // the last reading, µs since the Unix epoch
}

// NewCoarse returns a Coarse reading of src refreshed every period, read
// once now.
func NewCoarse(src Clock, every time.Duration) (*Coarse, error) {
	if src == nil {
		return nil, fmt.Errorf("%w: source clock is nil", ErrInvalidCoarse)
	}
	if every <= 0 {
		return nil, fmt.Errorf("%w: period=%s must be > 0", ErrInvalidCoarse, every)
	}
	c := &Coarse{src: src, every: every}
	c.Refresh()
	return c, nil
}

// Every returns the refresh period.
func (c *Coarse) Every() time.Duration { return c.every }

// NowMicro returns the last reading in microseconds since the Unix epoch.
func (c *Coarse) NowMicro() int64 { return c.us.Load() }

// Refresh reads the source. A reading earlier than the one held (a wall
// clock stepped back) is taken as it is, as the source would give it.
func (c *Coarse) Refresh() { c.us.Store(c.src.Now().UnixMicro()) }

// Run refreshes the reading every period until ctx is done.
func (c *Coarse) Run(ctx context.Context) {
	Every(ctx, c.src, c.every, func(now time.Time) { c.us.Store(now.UnixMicro()) })
}

// Every calls f with c's time every period of c until ctx is done.
func Every(ctx context.Context, c Clock, every time.Duration, f func(now time.Time)) {
	t := c.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			f(c.Now())
		}
	}
}
