package clock

import (
	"context"
	"errors"
	"runtime"
	"testing"
	"time"
)

// TestCoarseFollowsItsSourceEveryPeriod: a Coarse reading holds between
// refreshes, never runs ahead of its source, and Run takes the source's
// time at each tick of the period.
func TestCoarseFollowsItsSourceEveryPeriod(t *testing.T) {
	m := NewManual(t0)
	c, err := NewCoarse(m, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	if got := c.NowMicro(); got != t0.UnixMicro() {
		t.Fatalf("first reading %d, want the source's %d", got, t0.UnixMicro())
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); c.Run(ctx) }()
	if err := m.WaitForTimers(ctx, 1); err != nil {
		t.Fatal(err)
	}
	// Between ticks the reading lags the source by what has passed.
	m.Advance(400 * time.Microsecond)
	if got := c.NowMicro(); got != t0.UnixMicro() {
		t.Fatalf("reading moved between ticks: %d, want %d", got, t0.UnixMicro())
	}
	for i := 1; i <= 3; i++ {
		m.Advance(600 * time.Microsecond)
		want := m.Now().UnixMicro()
		// Run refreshes after the tick's send; wait for it, without
		// sleeping: the reading can only become the source's time.
		for c.NowMicro() != want {
			if c.NowMicro() > want {
				t.Fatalf("reading %d ahead of the source %d", c.NowMicro(), want)
			}
			select {
			case <-done:
				t.Fatal("Run returned")
			default:
				runtime.Gosched()
			}
		}
		m.Advance(400 * time.Microsecond)
		if got := c.NowMicro(); got > m.Now().UnixMicro() || got != want {
			t.Fatalf("tick %d: reading %d, want %d until the next tick", i, got, want)
		}
	}
	cancel()
	<-done
}

func TestCoarseRejectsBadConfig(t *testing.T) {
	if _, err := NewCoarse(Real{}, 0); !errors.Is(err, ErrInvalidCoarse) {
		t.Errorf("period 0: %v, want ErrInvalidCoarse", err)
	}
	if _, err := NewCoarse(nil, time.Millisecond); !errors.Is(err, ErrInvalidCoarse) {
		t.Errorf("nil source: %v, want ErrInvalidCoarse", err)
	}
}
