package heapfloor

import (
	"runtime"
	"runtime/debug"
	"testing"
)

func TestPercent(t *testing.T) {
	const mib = 1 << 20
	for _, c := range []struct {
		live, floor uint64
		base, want  int
	}{
		{live: 4 * mib, floor: 64 * mib, base: 100, want: 1600},   // a small heap grows by the floor
		{live: 3 * mib, floor: 64 * mib, base: 100, want: 2134},   // rounded up: the goal is never below live + floor
		{live: 64 * mib, floor: 64 * mib, base: 100, want: 100},   // where the floor and GOGC meet
		{live: 1024 * mib, floor: 64 * mib, base: 100, want: 100}, // a large heap grows as it would have
		{live: 1024 * mib, floor: 64 * mib, base: 200, want: 200}, // the process's own GOGC is kept
		{live: 0, floor: 64 * mib, base: 100, want: MaxPercent},   // nothing live yet: capped
		{live: 100, floor: 64 * mib, base: 100, want: MaxPercent}, // capped
		{live: 4 * mib, floor: 0, base: 100, want: 100},           // no floor
	} {
		if got := Percent(c.live, c.floor, c.base); got != c.want {
			t.Errorf("Percent(live=%d, floor=%d, base=%d) = %d, want %d", c.live, c.floor, c.base, got, c.want)
		}
		if c.live > 0 && c.floor > 0 {
			p := Percent(c.live, c.floor, c.base)
			if goal := c.live + c.live*uint64(p)/100; p < MaxPercent && goal < c.live+c.floor {
				t.Errorf("Percent(live=%d, floor=%d) = %d: goal %d below live + floor", c.live, c.floor, p, goal)
			}
		}
	}
}

// TestStartRaisesThePercentForASmallHeap: after collections, the percent
// in force is far above GOGC for this test's small heap and a 256 MiB
// floor; stop puts GOGC back.
func TestStartRaisesThePercentForASmallHeap(t *testing.T) {
	base := debug.SetGCPercent(100)
	defer debug.SetGCPercent(base)
	const floor = 256 << 20
	stop := Start(floor)
	t.Cleanup(func() { stop() })
	// The finalizer that sets the percent runs on the finalizer goroutine
	// after a cycle: the loop collects and yields until it has run.
	for i := 0; i < 1000 && currentPercent() == 100; i++ {
		runtime.GC()
		runtime.Gosched()
	}
	p := currentPercent()
	if p <= 100 {
		t.Fatalf("percent %d after collections with a %d-byte floor over a test's heap, want far above 100", p, floor)
	}
	stop()
	runtime.GC()
	runtime.GC()
	if p := currentPercent(); p != 100 {
		t.Fatalf("percent %d after stop, want GOGC's 100 back", p)
	}
}

func TestStartOffWithoutAFloor(t *testing.T) {
	base := debug.SetGCPercent(100)
	defer debug.SetGCPercent(base)
	stop := Start(0)
	runtime.GC()
	runtime.GC()
	if p := currentPercent(); p != 100 {
		t.Fatalf("percent %d with no floor, want 100", p)
	}
	stop()
}

// currentPercent reads the percent in force.
func currentPercent() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}
