package sim

import (
	"github.com/allot-dev/allot/bucket"
)

// regionalRedis models one region's Redis: a primary that holds every
// bucket of the region and applies the bucket/ functions at its own clock,
// as the Lua script does with the server's TIME, and a replica fed
// asynchronously with a lag. A failover promotes the replica: writes not yet
// replicated are lost, and the region has no primary for a while.
type regionalRedis struct {
	states  []bucket.State
	clock   nodeClock
	replica []bucket.State // nil when no failover is scheduled
	repClk  nodeClock
	lag     Micros
	log     []repWrite // writes not yet applied to the replica, oldest first
	logHead int
	// downUntil is the end of a failover: no primary answers before it.
	downUntil Micros
	failovers uint32
	// lost counts, per budget, tokens debited in writes the failover lost.
	lost []int64
	ops  int64 // script calls, for the report
}

// repWrite is one write on its way to the replica.
type repWrite struct {
	at    Micros
	b     int32
	debit int64
	st    bucket.State
}

func newRegionalRedis(nb int, clk, repClk nodeClock, lag Micros, replicate bool) *regionalRedis {
	r := &regionalRedis{states: make([]bucket.State, nb), clock: clk, repClk: repClk, lag: lag}
	if replicate {
		r.replica = make([]bucket.State, nb)
		r.lost = make([]int64, nb)
	}
	return r
}

// up reports whether a primary answers at t.
func (r *regionalRedis) up(t Micros) bool { return t >= r.downUntil }

// rebase moves budget b's bucket from limit from to limit to at t
// (bucket.Rebase), as the region's Settler asks the moment its allocation
// changes. It reports false when no primary answers; the caller retries.
func (r *regionalRedis) rebase(b int, t Micros, from, to bucket.Limit) (bucket.Tokens, bool) {
	if !r.up(t) {
		return 0, false
	}
	r.ops++
	ns, lost, err := bucket.Rebase(r.states[b], r.clock.at(t), from, to)
	if err != nil {
		return 0, true // an invalid limit: nothing to move
	}
	r.store(b, t, ns, 0)
	return lost, true
}

// store writes budget b's new state and queues it for the replica.
func (r *regionalRedis) store(b int, t Micros, st bucket.State, debit int64) {
	r.states[b] = st
	if r.replica == nil {
		return
	}
	r.log = append(r.log, repWrite{at: t, b: int32(b), debit: debit, st: st}) // #nosec G115 -- an index into a slice the simulator holds; 2^31 entries would not fit in memory
	r.replicate(t)
}

// replicate applies to the replica every write older than the lag.
func (r *regionalRedis) replicate(t Micros) {
	for r.logHead < len(r.log) && r.log[r.logHead].at <= t-r.lag {
		w := r.log[r.logHead]
		r.replica[w.b] = w.st
		r.logHead++
	}
	if r.logHead > 4096 && r.logHead*2 > len(r.log) {
		n := copy(r.log, r.log[r.logHead:])
		r.log = r.log[:n]
		r.logHead = 0
	}
}

// decide is the script's decide: one atomic read-refill-check-debit.
func (r *regionalRedis) decide(b int, t Micros, l bucket.Limit, cost int64) bucket.Decision {
	r.ops++
	st := r.states[b]
	d, ns, err := bucket.Decide(st, r.clock.at(t), l, bucket.Tokens(cost))
	switch {
	case err != nil:
		return bucket.Decision{Limit: l}
	case !d.Allowed:
		if ns != st {
			r.store(b, t, ns, 0) // carried to l or capped: the script writes it too
		}
		return d
	}
	r.store(b, t, ns, cost)
	return d
}

// peek reports budget b's bucket at t without changing it.
func (r *regionalRedis) peek(b int, t Micros, l bucket.Limit) bucket.Decision {
	r.ops++
	d, err := bucket.Peek(r.states[b], r.clock.at(t), l)
	if err != nil {
		return bucket.Decision{Limit: l}
	}
	return d
}

// takeUpTo debits up to n tokens and returns how many.
func (r *regionalRedis) takeUpTo(b int, t Micros, l bucket.Limit, n int64) int64 {
	st := r.states[b]
	got, _, ns, err := bucket.TakeUpTo(st, r.clock.at(t), l, bucket.Tokens(n))
	if err != nil {
		return 0
	}
	if got == 0 {
		if ns != st {
			r.store(b, t, ns, 0) // carried to l or capped: the script writes it too
		}
		return 0
	}
	r.store(b, t, ns, int64(got))
	return int64(got)
}

// giveBack returns n unused tokens.
func (r *regionalRedis) giveBack(b int, t Micros, l bucket.Limit, n int64) {
	r.ops++
	st := r.states[b]
	if _, ns, err := bucket.Return(st, r.clock.at(t), l, bucket.Tokens(n)); err == nil {
		r.store(b, t, ns, -n)
	}
}

// failover kills the primary at t: the replica, with what it had received,
// becomes the primary after down.
func (r *regionalRedis) failover(t, down Micros) {
	if r.replica == nil {
		return
	}
	r.replicate(t)
	for _, w := range r.log[r.logHead:] {
		if w.debit > 0 {
			r.lost[w.b] += w.debit
		}
	}
	r.log = r.log[:0]
	r.logHead = 0
	r.states, r.replica = r.replica, r.states
	copy(r.replica, r.states) // the old primary comes back as the new replica
	r.clock, r.repClk = r.repClk, r.clock
	r.downUntil = t + down
	r.failovers++
}
