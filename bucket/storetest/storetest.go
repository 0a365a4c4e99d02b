// Package storetest is the conformance suite every bucket.Store runs: the
// same table of steps at fixed instants, and a property test that compares
// the store with the pure functions of package bucket over random operation
// sequences. The memory store and the Redis store both run it, which is how
// the Lua script is shown to agree with the Go math.
package storetest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
)

// Factory returns a store whose notion of now is clk. Each call may return a
// store that shares data with earlier ones; the suite uses fresh rule names.
type Factory func(t *testing.T, clk clock.Clock) bucket.Store

// T0 is the suite's fixed start instant.
var T0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

// step is one operation at a fixed offset from T0 and what it must return.
type step struct {
	at     time.Duration
	op     string // decide, take, return, peek, rebase
	limit  bucket.Limit
	from   bucket.Limit // for rebase
	n      bucket.Tokens
	id     string // attempt id for decide
	want   bucket.Decision
	got    bucket.Tokens // for take; for rebase, the tokens it took away
	errIs  error
	noWant bool // only check the error / the granted count
}

var (
	seedLimit = bucket.Per(10, time.Second).WithBurst(100) // the seeds' example
	tenMin    = bucket.PerMinute(10)
)

func allow(rem bucket.Tokens, reset time.Duration, l bucket.Limit) bucket.Decision {
	return bucket.Decision{Allowed: true, Remaining: rem, ResetAfter: reset, Limit: l}
}

func deny(rem bucket.Tokens, retry, reset time.Duration, l bucket.Limit) bucket.Decision {
	return bucket.Decision{Remaining: rem, RetryAfter: retry, ResetAfter: reset, Limit: l}
}

var twelveMin = bucket.PerMinute(12).WithBurst(1)

var cases = []struct {
	name  string
	steps []step
}{
	{"ten per minute", []step{
		{at: 0, op: "decide", limit: tenMin, n: 1, want: allow(9, 6*time.Second, tenMin)},
		{at: 0, op: "decide", limit: tenMin, n: 8, want: allow(1, 54*time.Second, tenMin)},
		{at: 0, op: "decide", limit: tenMin, n: 1, want: allow(0, 60*time.Second, tenMin)},
		// The 11th is denied for exactly one interval and debits nothing.
		{at: 0, op: "decide", limit: tenMin, n: 1, want: deny(0, 6*time.Second, 60*time.Second, tenMin)},
		{at: time.Second, op: "decide", limit: tenMin, n: 1, want: deny(0, 5*time.Second, 59*time.Second, tenMin)},
		{at: 6 * time.Second, op: "decide", limit: tenMin, n: 1, want: allow(0, 60*time.Second, tenMin)},
		{at: 6 * time.Second, op: "peek", limit: tenMin, want: deny(0, 6*time.Second, 60*time.Second, tenMin)},
	}},
	{"cost five", []step{
		{at: 0, op: "decide", limit: tenMin, n: 5, want: allow(5, 30*time.Second, tenMin)},
		{at: 0, op: "decide", limit: tenMin, n: 1, want: allow(4, 36*time.Second, tenMin)},
		// Denied: needs 5, has 4; waits one interval.
		{at: 0, op: "decide", limit: tenMin, n: 5, want: deny(4, 6*time.Second, 36*time.Second, tenMin)},
		{at: 0, op: "decide", limit: tenMin, n: 4, want: allow(0, 60*time.Second, tenMin)},
	}},
	{"never fits touches nothing", []step{
		{at: 0, op: "decide", limit: tenMin, n: 11, errIs: bucket.ErrNeverFits},
		{at: 0, op: "peek", limit: tenMin, want: allow(10, 0, tenMin)},
	}},
	{"invalid input", []step{
		{at: 0, op: "decide", limit: tenMin, n: 0, errIs: bucket.ErrInvalidCost},
		{at: 0, op: "decide", limit: tenMin, n: -3, errIs: bucket.ErrInvalidCost},
		{at: 0, op: "decide", limit: bucket.PerMinute(0), n: 1, errIs: bucket.ErrInvalidLimit},
		{at: 0, op: "take", limit: tenMin, n: 0, errIs: bucket.ErrInvalidCost},
		{at: 0, op: "return", limit: bucket.Limit{}, n: 1, errIs: bucket.ErrInvalidLimit},
	}},
	{"three per second keeps its burst", []step{
		{at: 0, op: "decide", limit: bucket.PerSecond(3), n: 1, want: allow(2, 333334*time.Microsecond, bucket.PerSecond(3))},
		{at: 0, op: "decide", limit: bucket.PerSecond(3), n: 1, want: allow(1, 666667*time.Microsecond, bucket.PerSecond(3))},
		{at: 0, op: "decide", limit: bucket.PerSecond(3), n: 1, want: allow(0, time.Second, bucket.PerSecond(3))},
		{at: 0, op: "decide", limit: bucket.PerSecond(3), n: 1, want: deny(0, 333334*time.Microsecond, time.Second, bucket.PerSecond(3))},
		{at: time.Second, op: "decide", limit: bucket.PerSecond(3), n: 3, want: allow(0, time.Second, bucket.PerSecond(3))},
	}},
	{"clock backwards grants nothing and does not lock out", []step{
		{at: 0, op: "decide", limit: tenMin, n: 10, want: allow(0, time.Minute, tenMin)},
		// An hour back: the stored TAT is far beyond now+τ; it is capped to an
		// empty bucket, so the caller waits one interval, not an hour.
		{at: -time.Hour, op: "decide", limit: tenMin, n: 1, want: deny(0, 6*time.Second, time.Minute, tenMin)},
		{at: -time.Hour + 6*time.Second, op: "decide", limit: tenMin, n: 1, want: allow(0, time.Minute, tenMin)},
	}},
	{"small step back grants nothing", []step{
		{at: 10 * time.Second, op: "decide", limit: tenMin, n: 5, want: allow(5, 30*time.Second, tenMin)},
		{at: 4 * time.Second, op: "peek", limit: tenMin, want: allow(4, 36*time.Second, tenMin)},
		{at: 10 * time.Second, op: "peek", limit: tenMin, want: allow(5, 30*time.Second, tenMin)},
	}},
	{"limit change never refills", []step{
		{at: 0, op: "decide", limit: bucket.PerSecond(10), n: 5, want: allow(5, 500*time.Millisecond, bucket.PerSecond(10))},
		// Grows to 20/s burst 20: the 5 tokens held carry across, the added
		// burst arrives spent (15 tokens to refill at 20/s).
		{at: 0, op: "peek", limit: bucket.PerSecond(20), want: allow(5, 750*time.Millisecond, bucket.PerSecond(20))},
		// Shrinks to burst 3: the tokens held are clamped to the new burst.
		{at: 0, op: "decide", limit: bucket.PerSecond(3), n: 1, want: allow(2, 333334*time.Microsecond, bucket.PerSecond(3))},
		{at: 0, op: "peek", limit: bucket.PerSecond(10), want: allow(2, 800*time.Millisecond, bucket.PerSecond(10))},
	}},
	{"rebase carries tokens and refills at the new rate", []step{
		// A bucket never seen holds its old limit's whole burst: 10, not 20.
		{at: 0, op: "rebase", from: bucket.PerSecond(10), limit: bucket.PerSecond(20), noWant: true},
		{at: 0, op: "peek", limit: bucket.PerSecond(20), want: allow(10, 500*time.Millisecond, bucket.PerSecond(20))},
		{at: 0, op: "decide", limit: bucket.PerSecond(20), n: 10, want: allow(0, time.Second, bucket.PerSecond(20))},
		// 100 ms at 20/s refilled 2; moved to 5/s the bucket holds 2 of 5.
		{at: 100 * time.Millisecond, op: "rebase", from: bucket.PerSecond(20), limit: bucket.PerSecond(5), noWant: true},
		{at: 100 * time.Millisecond, op: "peek", limit: bucket.PerSecond(5), want: allow(2, 600*time.Millisecond, bucket.PerSecond(5))},
		// From now on it refills at 5/s: one more token in 200 ms, not four.
		{at: 300 * time.Millisecond, op: "peek", limit: bucket.PerSecond(5), want: allow(3, 400*time.Millisecond, bucket.PerSecond(5))},
		// A full bucket moved to a smaller burst is full, and deleted; the
		// three tokens beyond the new burst are reported taken away.
		{at: time.Minute, op: "rebase", from: bucket.PerSecond(5), limit: bucket.PerSecond(2), got: 3, noWant: true},
		{at: time.Minute, op: "peek", limit: bucket.PerSecond(2), want: allow(2, 0, bucket.PerSecond(2))},
		{at: time.Minute, op: "rebase", from: bucket.PerSecond(2), limit: bucket.Limit{}, errIs: bucket.ErrInvalidLimit},
	}},
	{"rebase from an allocation that admits nothing leaves the bucket empty", []step{
		// 12 a minute, burst 1: a token every 5 s. Spent at 0; 4 s later
		// the state has refilled 0.8 of a token under it. Moved there from
		// an allocation of 12 a minute with burst 0 (which admits nothing),
		// the bucket holds nothing: a whole interval to wait, not 1 s.
		{at: 0, op: "decide", limit: twelveMin, n: 1, want: allow(0, 5*time.Second, twelveMin)},
		{at: 4 * time.Second, op: "rebase", from: twelveMin.WithBurst(0), limit: twelveMin, noWant: true},
		{at: 4 * time.Second, op: "peek", limit: twelveMin, want: deny(0, 5*time.Second, 5*time.Second, twelveMin)},
		// From no allocation at all, a bucket full (or never seen) is
		// emptied too: its burst was never this region's.
		{at: time.Minute, op: "peek", limit: twelveMin, want: allow(1, 0, twelveMin)},
		{at: time.Minute, op: "rebase", from: bucket.Limit{}, limit: twelveMin, noWant: true},
		{at: time.Minute, op: "peek", limit: twelveMin, want: deny(0, 5*time.Second, 5*time.Second, twelveMin)},
		// A bucket cannot be moved to an allocation that admits nothing.
		{at: time.Minute, op: "rebase", from: twelveMin, limit: twelveMin.WithBurst(0), errIs: bucket.ErrInvalidLimit},
	}},
	{"rebase reports the whole tokens it took away", []step{
		// 100 a second, burst 100: spent 40 at 0, it holds 60 plus 0.25
		// refilled by 2.5 ms. Moved to 20 a second (burst 20) it keeps 20:
		// 40.25 taken away, reported as 40.
		{at: 0, op: "decide", limit: bucket.PerSecond(100), n: 40, want: allow(60, 400*time.Millisecond, bucket.PerSecond(100))},
		{at: 2500 * time.Microsecond, op: "rebase", from: bucket.PerSecond(100), limit: bucket.PerSecond(20), got: 40, noWant: true},
		{at: 2500 * time.Microsecond, op: "peek", limit: bucket.PerSecond(20), want: allow(20, 0, bucket.PerSecond(20))},
		// Moved up, or down within what it holds, nothing is taken away.
		{at: 2500 * time.Microsecond, op: "decide", limit: bucket.PerSecond(20), n: 15, want: allow(5, 750*time.Millisecond, bucket.PerSecond(20))},
		{at: 2500 * time.Microsecond, op: "rebase", from: bucket.PerSecond(20), limit: bucket.PerSecond(50), got: 0, noWant: true},
		{at: 2500 * time.Microsecond, op: "rebase", from: bucket.PerSecond(50), limit: bucket.PerSecond(10), got: 0, noWant: true},
		{at: 2500 * time.Microsecond, op: "peek", limit: bucket.PerSecond(10), want: allow(5, 500*time.Millisecond, bucket.PerSecond(10))},
	}},
	{"take up to and return", []step{
		{at: 0, op: "take", limit: tenMin, n: 4, got: 4, noWant: true},
		{at: 0, op: "take", limit: tenMin, n: 100, got: 6, noWant: true},
		{at: 0, op: "take", limit: tenMin, n: 1, got: 0, noWant: true},
		{at: 0, op: "return", limit: tenMin, n: 3, noWant: true},
		{at: 0, op: "peek", limit: tenMin, want: allow(3, 42*time.Second, tenMin)},
		// Returning more than was taken never fills past the burst.
		{at: 0, op: "return", limit: tenMin, n: 1000, noWant: true},
		{at: 0, op: "peek", limit: tenMin, want: allow(10, 0, tenMin)},
	}},
	{"attempt id is charged once", []step{
		{at: 0, op: "decide", limit: tenMin, n: 4, id: "req-1", want: allow(6, 24*time.Second, tenMin)},
		{at: time.Second, op: "decide", limit: tenMin, n: 4, id: "req-1", want: allow(6, 24*time.Second, tenMin)},
		{at: time.Second, op: "peek", limit: tenMin, want: allow(6, 23*time.Second, tenMin)},
		{at: time.Second, op: "decide", limit: tenMin, n: 4, id: "req-2", want: allow(2, 47*time.Second, tenMin)},
	}},
}

// Run runs the conformance suite against the stores newStore returns.
func Run(t *testing.T, newStore Factory) {
	ctx := context.Background()
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			clk := clock.NewManual(T0)
			s := newStore(t, clk)
			key := bucket.Key{Rule: fmt.Sprintf("conf-%d-%d", i, rand.Int64()), Subject: "tenant-a"}
			for j, st := range tc.steps {
				clk.Set(T0.Add(st.at))
				var (
					d   bucket.Decision
					got bucket.Tokens
					err error
				)
				switch st.op {
				case "decide":
					d, err = s.Decide(ctx, key, st.limit, st.n, st.id)
				case "take":
					got, err = s.TakeUpTo(ctx, key, st.limit, st.n)
				case "return":
					err = s.Return(ctx, key, st.limit, st.n)
				case "peek":
					d, err = s.Peek(ctx, key, st.limit)
				case "rebase":
					got, err = rebaser(t, s).Rebase(ctx, key, st.from, st.limit, 0)
				}
				if st.errIs != nil {
					if !errors.Is(err, st.errIs) {
						t.Fatalf("step %d (%s n=%d at %s): err=%v, want %v", j, st.op, st.n, st.at, err, st.errIs)
					}
					continue
				}
				if err != nil {
					t.Fatalf("step %d (%s n=%d at %s): %v", j, st.op, st.n, st.at, err)
				}
				if (st.op == "take" || st.op == "rebase") && got != st.got {
					t.Fatalf("step %d %s(%d) at %s = %d, want %d", j, st.op, st.n, st.at, got, st.got)
				}
				if !st.noWant && d != st.want {
					t.Fatalf("step %d (%s n=%d at %s):\n got %+v\nwant %+v", j, st.op, st.n, st.at, d, st.want)
				}
			}
		})
	}
	t.Run("seeds example", func(t *testing.T) { seedsExample(t, newStore) })
	t.Run("matches pure functions", func(t *testing.T) { matchesModel(t, newStore) })
	t.Run("matches pure functions concurrently", func(t *testing.T) { matchesModelConcurrently(t, newStore) })
}

func rebaser(t *testing.T, s bucket.Store) bucket.Rebaser {
	r, ok := s.(bucket.Rebaser)
	if !ok {
		t.Fatalf("%T does not implement bucket.Rebaser", s)
	}
	return r
}

// seedsExample: capacity 100 refilled at 10 per second admits a burst of 100
// cost-1 requests, then 10 per second.
func seedsExample(t *testing.T, newStore Factory) {
	ctx := context.Background()
	clk := clock.NewManual(T0)
	s := newStore(t, clk)
	key := bucket.Key{Rule: fmt.Sprintf("seeds-%d", rand.Int64()), Subject: "client"}
	admitted := 0
	for range 150 {
		d, err := s.Decide(ctx, key, seedLimit, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			admitted++
		}
	}
	if admitted != 100 {
		t.Fatalf("burst admitted %d of 150, want 100", admitted)
	}
	for sec := 1; sec <= 3; sec++ {
		clk.Set(T0.Add(time.Duration(sec) * time.Second))
		admitted = 0
		for range 30 {
			d, err := s.Decide(ctx, key, seedLimit, 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed {
				admitted++
			}
		}
		if admitted != 10 {
			t.Fatalf("second %d admitted %d of 30, want 10", sec, admitted)
		}
	}
}

// matchesModel drives the store and the pure functions with the same random
// operations, instants (including steps backwards) and limit changes, and
// requires identical answers at every step.
func matchesModel(t *testing.T, newStore Factory) {
	ctx := context.Background()
	limits := []bucket.Limit{
		bucket.PerSecond(3), bucket.PerMinute(10), bucket.Per(7, 3*time.Second).WithBurst(20),
		bucket.PerSecond(1000).WithBurst(50), bucket.PerHour(3600).WithBurst(5),
	}
	seeds := 8
	steps := 300
	if testing.Short() {
		seeds, steps = 2, 100
	}
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 42))
		clk := clock.NewManual(T0)
		s := newStore(t, clk)
		key := bucket.Key{Rule: fmt.Sprintf("model-%d-%d", seed, rand.Int64()), Subject: "s"}
		var st bucket.State
		now := T0
		l := limits[0]
		for i := range steps {
			switch r := rng.IntN(100); {
			case r < 50:
				now = now.Add(time.Duration(rng.Int64N(int64(400 * time.Millisecond))))
			case r < 53:
				now = now.Add(-time.Duration(rng.Int64N(int64(5 * time.Second))))
			case r < 56:
				now = now.Add(time.Duration(rng.Int64N(int64(2 * time.Minute))))
			}
			now = now.Truncate(time.Microsecond)
			if rng.IntN(20) == 0 {
				next := limits[rng.IntN(len(limits))]
				if rng.IntN(2) == 0 { // settled at once, or left to the next call
					var (
						err  error
						lost bucket.Tokens
					)
					if st, lost, err = bucket.Rebase(st, now, l, next); err != nil {
						t.Fatal(err)
					}
					clk.Set(now)
					// Half the rebases carry a credit: in the same call,
					// as Rebase and then Return would leave the bucket.
					var credit bucket.Tokens
					if rng.IntN(2) == 0 {
						credit = bucket.Tokens(1 + rng.IntN(int(next.Burst())))
						if _, st, err = bucket.Return(st, now, next, credit); err != nil {
							t.Fatal(err)
						}
					}
					got, err := rebaser(t, s).Rebase(ctx, key, l, next, credit)
					if err != nil {
						t.Fatalf("seed %d step %d: rebase %s -> %s: %v", seed, i, l, next, err)
					}
					if got != lost {
						t.Fatalf("seed %d step %d: rebase %s -> %s took away %d, want %d", seed, i, l, next, got, lost)
					}
				}
				l = next
			}
			clk.Set(now)
			n := bucket.Tokens(1 + rng.IntN(int(min(l.Burst(), 8))))
			where := fmt.Sprintf("seed %d step %d at %s limit %s n=%d", seed, i, now.Sub(T0), l, n)
			switch rng.IntN(4) {
			case 0, 1:
				want, ns, _ := bucket.Decide(st, now, l, n)
				got, err := s.Decide(ctx, key, l, n, "")
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if got != want {
					t.Fatalf("%s: decide\n got %+v\nwant %+v", where, got, want)
				}
				st = ns
			case 2:
				want, _, ns, _ := bucket.TakeUpTo(st, now, l, n)
				got, err := s.TakeUpTo(ctx, key, l, n)
				if err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				if got != want {
					t.Fatalf("%s: take got %d want %d", where, got, want)
				}
				st = ns
			case 3:
				_, ns, _ := bucket.Return(st, now, l, n)
				if err := s.Return(ctx, key, l, n); err != nil {
					t.Fatalf("%s: %v", where, err)
				}
				st = ns
			}
			want, _ := bucket.Peek(st, now, l)
			got, err := s.Peek(ctx, key, l)
			if err != nil {
				t.Fatalf("%s: %v", where, err)
			}
			if got != want {
				t.Fatalf("%s: peek\n got %+v\nwant %+v", where, got, want)
			}
		}
	}
}

// matchesModelConcurrently is matchesModel for many keys at once: in each
// round every worker applies one random operation to its own key, all at
// the same instant and at the same time, and each answer must be the pure
// functions' for that worker's own sequence. A store that groups
// concurrent operations (the Redis store sends them as one script call)
// must hand every caller its own answer.
func matchesModelConcurrently(t *testing.T, newStore Factory) {
	ctx := context.Background()
	limits := []bucket.Limit{
		bucket.PerSecond(3), bucket.PerMinute(10), bucket.Per(7, 3*time.Second).WithBurst(20),
		bucket.PerSecond(1000).WithBurst(50),
	}
	workers, rounds := 24, 60
	if testing.Short() {
		workers, rounds = 8, 20
	}
	clk := clock.NewManual(T0)
	s := newStore(t, clk)
	rule := fmt.Sprintf("concurrent-%d", rand.Int64())
	now := T0
	type worker struct {
		rng *rand.Rand
		st  bucket.State
		l   bucket.Limit
		key bucket.Key
	}
	ws := make([]*worker, workers)
	for i := range ws {
		// Two workers share each key's subject under different rules'
		// names, so keys differ only in their hash tags' content.
		ws[i] = &worker{rng: rand.New(rand.NewPCG(uint64(i), 7)), l: limits[i%len(limits)],
			key: bucket.Key{Rule: fmt.Sprintf("%s-%d", rule, i), Subject: fmt.Sprint("s", i/2)}}
	}
	for round := range rounds {
		now = now.Add(time.Duration(rand.Int64N(int64(300 * time.Millisecond)))).Truncate(time.Microsecond)
		clk.Set(now)
		errs := make(chan error, workers)
		var wg sync.WaitGroup
		for i, w := range ws {
			wg.Add(1)
			go func() {
				defer wg.Done()
				n := bucket.Tokens(1 + w.rng.IntN(int(min(w.l.Burst(), 6))))
				where := fmt.Sprintf("round %d worker %d at %s limit %s n=%d", round, i, now.Sub(T0), w.l, n)
				switch w.rng.IntN(5) {
				case 0, 1:
					want, ns, _ := bucket.Decide(w.st, now, w.l, n)
					got, err := s.Decide(ctx, w.key, w.l, n, "")
					if err != nil || got != want {
						errs <- fmt.Errorf("%s: decide\n got %+v, %v\nwant %+v", where, got, err, want)
						return
					}
					w.st = ns
				case 2:
					want, _, ns, _ := bucket.TakeUpTo(w.st, now, w.l, n)
					got, err := s.TakeUpTo(ctx, w.key, w.l, n)
					if err != nil || got != want {
						errs <- fmt.Errorf("%s: take got %d, %v want %d", where, got, err, want)
						return
					}
					w.st = ns
				case 3:
					_, ns, _ := bucket.Return(w.st, now, w.l, n)
					if err := s.Return(ctx, w.key, w.l, n); err != nil {
						errs <- fmt.Errorf("%s: return: %v", where, err)
						return
					}
					w.st = ns
				case 4:
					want, _ := bucket.Peek(w.st, now, w.l)
					got, err := s.Peek(ctx, w.key, w.l)
					if err != nil || got != want {
						errs <- fmt.Errorf("%s: peek\n got %+v, %v\nwant %+v", where, got, err, want)
					}
				}
			}()
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
}
