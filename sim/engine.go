package sim

import (
	"math/rand/v2"
	"time"
)

// Micros is virtual time: microseconds since the start of a run. The
// simulator keeps time in integers so that runs replay exactly.
type Micros = int64

// epoch is the wall-clock instant virtual time 0 maps to. It is fixed so that
// the bucket states written in a run, and so the results, do not depend on
// when the run happens.
var epoch = time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC)

// epochMicros is epoch in Unix microseconds.
var epochMicros = epoch.UnixMicro()

// wall converts a node-local reading in virtual microseconds to the
// time.Time the code under test receives.
func wall(t Micros) time.Time { return time.UnixMicro(epochMicros + t).UTC() }

func us(d time.Duration) Micros { return Micros(d / time.Microsecond) }

// eventKind says what an event does when it fires.
type eventKind uint8

// event is one scheduled happening. It is a plain value kept in the heap's
// slice, so scheduling the common events allocates nothing; p carries a
// message only for the rarer events that need one.
type event struct {
	at   Micros
	seq  uint64
	kind eventKind
	sub  uint8 // a system's own event kind
	flag int8
	i    int32 // a source, a fault or a system index
	j    int32 // usually a budget
	aux  int32 // usually a region
	agt  int32 // usually an agent
	k    int64 // usually a cost
	sent Micros
	p    any
}

// engine is the discrete-event core: events ordered by time then by the
// order they were scheduled in, which makes ties deterministic. Events sit
// in two min-heaps under one sequence: arrivals, one per traffic source and
// each moved to its source's next arrival as it fires, in arr; every other
// event in heap. The earlier of the two tops fires first. Most events are
// arrivals, and a heap of a few sources takes one or two comparisons to
// move one, where the shared heap's sift ran past every timer and message
// in flight. The heaps hold small pointer-free keys; the other events sit
// in a slab reused through a free list, so moving keys costs no write
// barriers and steady-state scheduling allocates nothing.
type engine struct {
	now  Micros
	seq  uint64
	heap []heapKey
	arr  []heapKey // slot is the traffic source
	slab []event
	free []int32
	rng  *rand.Rand
	// fired counts events handled, for the speed figures.
	fired uint64
}

// heapKey orders an event in either heap: in heap, slot is the event's
// place in the slab; in arr, an arrival needs nothing but its time and
// its source, and slot is the source.
type heapKey struct {
	at   Micros
	seq  uint64
	slot int32
}

func newEngine(seed uint64) *engine {
	return &engine{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), heap: make([]heapKey, 0, 1024)}
}

// schedule adds e to fire at e.at; an event scheduled for the past fires
// now. An arrival (kind evArrival, source e.i) keeps only its time and
// source.
func (g *engine) schedule(e event) {
	if e.at < g.now {
		e.at = g.now
	}
	g.seq++
	e.seq = g.seq
	if e.kind == evArrival {
		g.arr = append(g.arr, heapKey{at: e.at, seq: e.seq, slot: e.i})
		siftUp(g.arr, len(g.arr)-1)
		return
	}
	var slot int32
	if n := len(g.free); n > 0 {
		slot = g.free[n-1]
		g.free = g.free[:n-1]
		g.slab[slot] = e
	} else {
		slot = int32(len(g.slab)) // #nosec G115 -- an index into a slice the simulator holds; 2^31 entries would not fit in memory
		g.slab = append(g.slab, e)
	}
	g.heap = append(g.heap, heapKey{at: e.at, seq: e.seq, slot: slot})
	siftUp(g.heap, len(g.heap)-1)
}

func keyLess(x, y heapKey) bool {
	if x.at != y.at {
		return x.at < y.at
	}
	return x.seq < y.seq
}

// siftUp and siftDown keep h a 4-ary min-heap by keyLess. Both heaps use
// them: (at, seq) is a total order, so the order events fire in does not
// depend on the heaps' shape.
func siftUp(h []heapKey, i int) {
	k := h[i]
	for i > 0 {
		p := (i - 1) / 4
		if !keyLess(k, h[p]) {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = k
}

func siftDown(h []heapKey, i int) {
	n := len(h)
	k := h[i]
	for {
		c := 4*i + 1
		if c >= n {
			break
		}
		m := c
		for j := c + 1; j < c+4 && j < n; j++ {
			if keyLess(h[j], h[m]) {
				m = j
			}
		}
		if !keyLess(h[m], k) {
			break
		}
		h[i] = h[m]
		i = m
	}
	h[i] = k
}

// arrivalFirst reports whether the earliest event is an arrival; false
// also when no event is left.
func (g *engine) arrivalFirst() bool {
	if len(g.arr) == 0 {
		return false
	}
	if len(g.heap) == 0 {
		return true
	}
	return keyLess(g.arr[0], g.heap[0])
}

// topArrival returns the earliest event, an arrival (arrivalFirst), as its
// source and time, moving virtual time to it; the caller must then call
// retimeArrival or dropArrival.
func (g *engine) topArrival() (src int32, at Micros) {
	k := g.arr[0]
	g.now = k.at
	g.fired++
	return k.slot, k.at
}

// retimeArrival moves the earliest arrival to fire again at t, as if it
// had been popped and scheduled anew: it gets the next scheduling
// sequence, so the order of events is the same, and the heap does one
// sift instead of two. Events scheduled since topArrival cannot have gone
// ahead of it: they come later in the sequence, at or after now.
func (g *engine) retimeArrival(t Micros) {
	if t < g.now {
		t = g.now
	}
	g.seq++
	k := &g.arr[0]
	k.at, k.seq = t, g.seq
	siftDown(g.arr, 0)
}

// dropArrival removes the earliest arrival, after topArrival.
func (g *engine) dropArrival() {
	n := len(g.arr)
	g.arr[0] = g.arr[n-1]
	g.arr = g.arr[:n-1]
	if n > 1 {
		siftDown(g.arr, 0)
	}
}

// top returns the earliest event, when it is not an arrival, without
// removing it, moving virtual time to it; the caller must then call drop.
func (g *engine) top() *event {
	e := &g.slab[g.heap[0].slot]
	g.now = e.at
	g.fired++
	return e
}

// drop removes the earliest event, after top.
func (g *engine) drop() {
	n := len(g.heap)
	top := g.heap[0]
	g.heap[0] = g.heap[n-1]
	g.heap = g.heap[:n-1]
	if n > 1 {
		siftDown(g.heap, 0)
	}
	g.slab[top.slot].p = nil
	g.free = append(g.free, top.slot)
}

// peekAt returns the time of the earliest event, or false when none is left.
func (g *engine) peekAt() (Micros, bool) {
	switch {
	case len(g.arr) == 0 && len(g.heap) == 0:
		return 0, false
	case len(g.arr) == 0:
		return g.heap[0].at, true
	case len(g.heap) == 0:
		return g.arr[0].at, true
	}
	return min(g.arr[0].at, g.heap[0].at), true
}

// nodeClock is one node's view of time: local = t + offset + drift·t. A
// drift of 1e-4 gains 100 µs a second. The code under test only ever sees
// local readings.
type nodeClock struct {
	offset Micros
	drift  float64
}

// local returns the node's reading at virtual time t.
func (c nodeClock) local(t Micros) Micros {
	if c.drift == 0 {
		return t + c.offset
	}
	return t + c.offset + Micros(c.drift*float64(t))
}

// at returns the node's reading at t as a time.Time.
func (c nodeClock) at(t Micros) time.Time { return wall(c.local(t)) }
