package clock

import (
	"context"
	"testing"
	"time"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func received(c <-chan time.Time) (time.Time, bool) {
	select {
	case v := <-c:
		return v, true
	default:
		return time.Time{}, false
	}
}

// TestManualTimerFiresOnAdvance: a timer fires once, when the clock
// passes its deadline, with the deadline as its value; Stop and Reset
// report whether it was pending and leave nothing stale in the channel.
func TestManualTimerFiresOnAdvance(t *testing.T) {
	m := NewManual(t0)
	tm := m.NewTimer(time.Second)
	m.Advance(999 * time.Millisecond)
	if _, ok := received(tm.C()); ok {
		t.Fatal("fired before its deadline")
	}
	m.Advance(time.Millisecond)
	if v, ok := received(tm.C()); !ok || !v.Equal(t0.Add(time.Second)) {
		t.Fatalf("at the deadline: %v, %v; want %v", v, ok, t0.Add(time.Second))
	}
	m.Advance(time.Hour)
	if _, ok := received(tm.C()); ok {
		t.Fatal("a timer fired twice")
	}
	if tm.Stop() {
		t.Fatal("Stop of a fired timer reported it pending")
	}
	if tm.Reset(time.Second) {
		t.Fatal("Reset of a fired timer reported it pending")
	}
	if !tm.Stop() {
		t.Fatal("Stop of an armed timer reported it not pending")
	}
	m.Advance(2 * time.Second)
	if _, ok := received(tm.C()); ok {
		t.Fatal("a stopped timer fired")
	}
	// Fired and not received, then reset: the stale value is gone.
	tm.Reset(time.Second)
	m.Advance(time.Second)
	tm.Reset(time.Second)
	if _, ok := received(tm.C()); ok {
		t.Fatal("a value from before Reset was received after it")
	}
	if tm.Reset(0); true {
		if _, ok := received(tm.C()); !ok {
			t.Fatal("Reset(0) did not fire at once")
		}
	}
}

// TestManualTickerDropsMissedTicks: a ticker sends once per move however
// many periods it passes, then ticks on its period from its first
// deadline, like time.Ticker.
func TestManualTickerDropsMissedTicks(t *testing.T) {
	m := NewManual(t0)
	tk := m.NewTicker(100 * time.Millisecond)
	m.Advance(350 * time.Millisecond)
	if v, ok := received(tk.C()); !ok || !v.Equal(t0.Add(100*time.Millisecond)) {
		t.Fatalf("first tick %v, %v", v, ok)
	}
	if _, ok := received(tk.C()); ok {
		t.Fatal("missed ticks were queued")
	}
	if got := m.Timers(); len(got) != 1 || !got[0].Equal(t0.Add(400*time.Millisecond)) {
		t.Fatalf("next tick at %v, want t0+400ms", got)
	}
	m.Advance(50 * time.Millisecond)
	if _, ok := received(tk.C()); !ok {
		t.Fatal("no tick at t0+400ms")
	}
	tk.Reset(time.Second)
	m.Advance(999 * time.Millisecond)
	if _, ok := received(tk.C()); ok {
		t.Fatal("ticked before the new period")
	}
	tk.Stop()
	if len(m.Timers()) != 0 {
		t.Fatal("a stopped ticker is still pending")
	}
}

// TestManualFiresInDeadlineOrder: timers passed by one move fire earliest
// first, and a clock moved backwards fires nothing.
func TestManualFiresInDeadlineOrder(t *testing.T) {
	m := NewManual(t0)
	late := m.NewTimer(2 * time.Second)
	early := m.NewTimer(time.Second)
	m.Advance(-time.Hour)
	if _, ok := received(early.C()); ok {
		t.Fatal("a step backwards fired a timer")
	}
	m.Set(t0.Add(3 * time.Second))
	a, _ := received(early.C())
	b, _ := received(late.C())
	if !a.Before(b) {
		t.Fatalf("early fired at %v, late at %v", a, b)
	}
}

// TestWaitForTimers: a goroutine that re-arms its timer after each round
// is seen idle again through WaitForTimers, so a test can advance the
// clock and then wait for the round to finish without sleeping.
func TestWaitForTimers(t *testing.T) {
	m := NewManual(t0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rounds := make(chan int, 10)
	go func() {
		tm := m.NewTimer(time.Second)
		for n := 1; n <= 3; n++ {
			<-tm.C()
			rounds <- n
			tm.Reset(time.Second)
		}
	}()
	for n := 1; n <= 3; n++ {
		if err := m.WaitForTimers(ctx, 1); err != nil {
			t.Fatal(err)
		}
		m.Advance(time.Second)
		if got := <-rounds; got != n {
			t.Fatalf("round %d, want %d", got, n)
		}
	}
	short, cancelShort := context.WithTimeout(ctx, 10*time.Millisecond)
	defer cancelShort()
	if err := m.WaitForTimers(short, 5); err == nil {
		t.Fatal("WaitForTimers for 5 with none pending returned nil")
	}
}

// TestRealTimers: the real clock's timers are time's.
func TestRealTimers(t *testing.T) {
	var c Clock = Real{}
	tm := c.NewTimer(time.Millisecond)
	<-tm.C()
	tk := c.NewTicker(time.Millisecond)
	<-tk.C()
	tk.Stop()
	if tm.Stop() {
		t.Fatal("Stop of a fired real timer reported it pending")
	}
}
