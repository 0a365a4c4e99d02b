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

// engine is the discrete-event core: a min-heap of events ordered by time
// then by the order they were scheduled in, which makes ties deterministic.
type engine struct {
	now  Micros
	seq  uint64
	heap []event
	rng  *rand.Rand
	// fired counts events handled, for the speed figures.
	fired uint64
}

func newEngine(seed uint64) *engine {
	return &engine{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15)), heap: make([]event, 0, 1024)}
}

// schedule adds e to fire at e.at, which must not be in the past; an event
// scheduled for the past fires now.
func (g *engine) schedule(e event) {
	if e.at < g.now {
		e.at = g.now
	}
	g.seq++
	e.seq = g.seq
	g.heap = append(g.heap, e)
	g.up(len(g.heap) - 1)
}

func (g *engine) less(a, b int) bool {
	x, y := &g.heap[a], &g.heap[b]
	if x.at != y.at {
		return x.at < y.at
	}
	return x.seq < y.seq
}

func (g *engine) up(i int) {
	for i > 0 {
		p := (i - 1) / 2
		if !g.less(i, p) {
			return
		}
		g.heap[i], g.heap[p] = g.heap[p], g.heap[i]
		i = p
	}
}

func (g *engine) down(i int) {
	n := len(g.heap)
	for {
		l := 2*i + 1
		if l >= n {
			return
		}
		m := l
		if r := l + 1; r < n && g.less(r, l) {
			m = r
		}
		if !g.less(m, i) {
			return
		}
		g.heap[i], g.heap[m] = g.heap[m], g.heap[i]
		i = m
	}
}

// pop removes and returns the earliest event and moves virtual time to it.
func (g *engine) pop() (event, bool) {
	n := len(g.heap)
	if n == 0 {
		return event{}, false
	}
	e := g.heap[0]
	g.heap[0] = g.heap[n-1]
	g.heap[n-1] = event{}
	g.heap = g.heap[:n-1]
	if n > 1 {
		g.down(0)
	}
	g.now = e.at
	g.fired++
	return e, true
}

// peekAt returns the time of the earliest event, or false when none is left.
func (g *engine) peekAt() (Micros, bool) {
	if len(g.heap) == 0 {
		return 0, false
	}
	return g.heap[0].at, true
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

// virtual returns the virtual time at which the node's clock reads l, the
// inverse of local, used to turn a node's own timers into events.
func (c nodeClock) virtual(l Micros) Micros {
	if c.drift == 0 {
		return l - c.offset
	}
	return Micros(float64(l-c.offset) / (1 + c.drift))
}
