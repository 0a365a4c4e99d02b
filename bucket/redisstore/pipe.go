package redisstore

import (
	"context"
	"slices"
	"sync"
	"time"
)

// pipe lets concurrent operations on one store share a round trip. An
// operation that finds fewer than max batches in flight and nobody queued
// runs at once, alone, so a lone caller pays no wait; one that finds the
// pipe busy queues. When a batch returns, the first queued operation is
// handed the lead and runs everything queued by then (up to size) as one
// batch. Batches therefore grow with concurrency and never wait on a timer.
//
// Every operation keeps its own deadline. The lead of a batch is the
// operation with the latest deadline among those the batch will carry, and
// the batch runs under that deadline: the lead never waits past its own,
// and every other operation stops waiting at its own, queued (it leaves
// without having run) or in a running batch (its answer comes too late).
// An operation that has waited out most of its time in the queue therefore
// cannot cut short the batch of those that have not. pipe is safe for
// concurrent use.
type pipe struct {
	max  int // batches in flight
	size int // operations per batch

	mu      sync.Mutex
	queue   []*op
	lead    *op // the queued operation handed the lead that has not yet taken it
	running int // batches in flight, counting one handed to lead
}

// op is one operation waiting for, or in, a batch.
type op struct {
	code     int64    // script operation code, see script.lua
	args     [7]int64 // num, den, burst, n, and for a rebase the from-limit's num, den, burst
	bk, ak   string   // bucket key; attempt key or ""
	deadline time.Time
	res      result
	err      error
	// done carries opResult once res and err are set, or opLead when the
	// operation is to run the queue; it is buffered so that no sender waits.
	done  chan uint8
	one   [1]*op      // a batch of this operation alone, without an allocation
	timer *time.Timer // its deadline while it is queued; made at its first wait
}

const (
	opResult uint8 = iota + 1
	opLead
)

var opPool = sync.Pool{New: func() any { return &op{done: make(chan uint8, 1)} }}

// do runs o, alone or in a batch, through exec, and returns when o has its
// result (in o.res or o.err: exec sets one of them on every operation it is
// given) or, with ctx's error, when ctx or o's deadline ended first. After
// an error o must be left alone, neither read nor reused: an operation
// abandoned in a running batch is still written to by that batch.
func (p *pipe) do(ctx context.Context, o *op, exec func(context.Context, []*op) error) error {
	p.mu.Lock()
	if p.running < p.max && len(p.queue) == 0 {
		p.running++
		p.mu.Unlock()
		o.one[0] = o
		p.run(o.one[:], o, exec)
		return nil
	}
	p.queue = append(p.queue, o)
	p.mu.Unlock()
	// A queued operation stops waiting at its own deadline, whatever the
	// batch it ends up in runs under. The operation's own timer measures
	// it: a context with a deadline would be two allocations and a timer
	// per queued operation.
	if o.timer == nil {
		o.timer = time.NewTimer(time.Until(o.deadline))
	} else {
		o.timer.Reset(time.Until(o.deadline))
	}
	defer o.timer.Stop()
	var err error
	select {
	case s := <-o.done:
		if s == opLead {
			p.mu.Lock()
			batch := p.take(o)
			p.mu.Unlock()
			p.run(batch, o, exec)
		}
		return nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-o.timer.C:
		err = context.DeadlineExceeded
	}
	p.mu.Lock()
	for i, q := range p.queue {
		if q == o {
			// Still queued: it leaves without having run.
			p.queue = append(p.queue[:i], p.queue[i+1:]...)
			if p.lead == o {
				p.lead = nil
				p.running--
				p.kick()
			}
			p.mu.Unlock()
			return err
		}
	}
	p.mu.Unlock()
	// Taken into a running batch: its answer comes too late.
	return err
}

// take removes up to size operations from the front of the queue for
// self, the lead that runs them, and hands the lead on if some remain and
// the pipe has room. Requires that p.mu is held.
func (p *pipe) take(self *op) []*op {
	p.lead = nil
	n := min(len(p.queue), p.size)
	batch := make([]*op, n, n+1)
	copy(batch, p.queue)
	rest := copy(p.queue, p.queue[n:])
	clear(p.queue[rest:])
	p.queue = p.queue[:rest]
	if !slices.Contains(batch, self) {
		// kick chose the lead among the first size operations, and only
		// leaving operations move it, towards the front: never reached.
		// Kept so that a lead always runs its own operation.
		p.queue = slices.DeleteFunc(p.queue, func(q *op) bool { return q == self })
		batch = append(batch, self)
	}
	p.kick()
	return batch
}

// kick hands the lead, when nobody holds it and a batch may start, to the
// operation with the latest deadline among those the next batch will take.
// Requires that p.mu is held.
func (p *pipe) kick() {
	if p.lead == nil && len(p.queue) > 0 && p.running < p.max {
		p.running++
		lead := p.queue[0]
		for _, q := range p.queue[1:min(len(p.queue), p.size)] {
			if q.deadline.After(lead.deadline) {
				lead = q
			}
		}
		p.lead = lead
		lead.done <- opLead
	}
}

// run executes one batch that self leads under self's deadline, wakes
// every other operation in it, and frees the batch's place in the pipe.
// When the call failed as a whole (exec's error: the server unreachable,
// stalled past the deadline, refusing writes), the operations that queued
// meanwhile fail with it at once instead of each waiting out a call of
// their own to a server that just failed: the callers' failure policies
// (and the agent's circuit breaker) act on it sooner. None of them ran.
func (p *pipe) run(batch []*op, self *op, exec func(context.Context, []*op) error) {
	ctx, cancel := context.WithDeadline(context.Background(), self.deadline)
	err := exec(ctx, batch)
	cancel()
	var failed []*op
	p.mu.Lock()
	p.running--
	if err != nil {
		for _, q := range p.queue {
			if q != p.lead {
				failed = append(failed, q)
			}
		}
		p.queue = p.queue[:0]
		if p.lead != nil {
			p.queue = append(p.queue, p.lead)
		}
	}
	p.kick()
	p.mu.Unlock()
	for _, o := range batch {
		if o != self {
			o.done <- opResult
		}
	}
	for _, o := range failed {
		o.err = err
		o.done <- opResult
	}
}
