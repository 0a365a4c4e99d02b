// Package heapfloor keeps a small Go heap from being collected over and
// over. The garbage collector starts a cycle when the heap has grown by
// GOGC percent over the live heap (4 MiB at least), so a server whose live
// heap is a few MiB and which allocates a few KiB per request runs many
// cycles a second, each paying fixed costs: every goroutine's stack
// scanned (and shrunk, to be grown again by the next call), the background
// workers started and stopped. Start sets the percent again after every
// cycle so that the next one starts when the heap has grown by at least a
// floor of bytes over the live heap, or by the process's own GOGC percent
// when that is more: a small heap may grow by the floor, a large one grows
// as it would have.
package heapfloor

import (
	"math"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// MaxPercent caps the percent Start sets, so a live heap read as almost
// nothing (just after start) does not disable collection in effect.
const MaxPercent = 100_000

// Percent is the GOGC percent under which the heap goal, live bytes plus
// that percent of them, is at least live + floor and at least what base
// (the process's own GOGC) gives.
func Percent(live, floor uint64, base int) int {
	if live == 0 {
		live = 1
	}
	p := math.Ceil(float64(floor) * 100 / float64(live))
	if p > MaxPercent {
		p = MaxPercent
	}
	return max(base, int(p))
}

// Start keeps the heap goal at least floor bytes above the live heap
// until the returned function is called, which puts the process's own
// percent back. It does nothing (and returns a no-op) when floor is 0 or
// collection is off (GOGC=off). The percent is set again after every
// cycle, from the live heap that cycle measured (runtime/metrics'
// /gc/heap/live:bytes), by a finalizer that the cycle runs; nothing else
// runs in between. A memory limit (GOMEMLIMIT) still applies above it.
func Start(floor uint64) (stop func()) {
	base := debug.SetGCPercent(100)
	debug.SetGCPercent(base)
	if floor == 0 || base < 0 {
		return func() {}
	}
	t := &tuner{floor: floor, base: base, sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
	t.arm()
	return func() {
		t.mu.Lock()
		defer t.mu.Unlock()
		t.stopped = true
		debug.SetGCPercent(base)
	}
}

type tuner struct {
	floor  uint64
	base   int
	sample []metrics.Sample // used by the finalizer goroutine only

	mu      sync.Mutex
	stopped bool // once set, no cycle sets the percent
}

// sentinel is garbage whose finalizer runs once per collection cycle.
type sentinel struct{ t *tuner }

// arm allocates a sentinel the next cycle finds unreachable: its
// finalizer sets the percent and arms the next one.
func (t *tuner) arm() {
	s := &sentinel{t: t}
	runtime.SetFinalizer(s, func(s *sentinel) {
		if s.t.tune() {
			s.t.arm()
		}
	})
}

// tune sets the percent from the live heap the last cycle measured, and
// reports whether the tuner is still running.
func (t *tuner) tune() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() == metrics.KindUint64 {
		debug.SetGCPercent(Percent(t.sample[0].Value.Uint64(), t.floor, t.base))
	}
	return true
}
