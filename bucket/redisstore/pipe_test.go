package redisstore

import (
	"context"
	"errors"
	"slices"
	"testing"
	"testing/synctest"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// The pipe's rules with an exec that answers when the test lets it: a lone
// operation goes at once; operations arriving while a call is in flight go
// together in the next one, which runs under the latest of their deadlines
// and is led by its owner; an operation whose context ends while queued
// leaves without having run; a call that fails fails those queued behind it.
func TestPipeBatchesAndDeadlines(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		p := &pipe{max: 1, size: 128}
		type call struct {
			ops      []*op
			deadline time.Time
			release  chan struct{}
			err      error // the call's failure, set before release
		}
		calls := make(chan *call, 8)
		exec := func(ctx context.Context, batch []*op) error {
			d, _ := ctx.Deadline()
			c := &call{ops: slices.Clone(batch), deadline: d, release: make(chan struct{})}
			calls <- c
			<-c.release
			for _, o := range batch {
				o.res.granted = bucket.Tokens(o.args[3])
				o.err = c.err
			}
			return c.err
		}
		start := time.Now()
		newOp := func(n int64, timeout time.Duration) *op {
			return &op{args: [7]int64{0, 0, 0, n}, deadline: start.Add(timeout), done: make(chan uint8, 1)}
		}
		type answer struct {
			n   int64
			err error
		}
		answers := make(chan answer, 8)
		submit := func(ctx context.Context, o *op) {
			n := o.args[3]
			go func() {
				if err := p.do(ctx, o, exec); err != nil {
					answers <- answer{n, err}
					return
				}
				answers <- answer{o.args[3], o.err}
			}()
		}

		// A lone operation is a call of its own, under its own deadline.
		a := newOp(1, 5*time.Second)
		submit(context.Background(), a)
		first := <-calls
		if len(first.ops) != 1 || first.ops[0] != a || !first.deadline.Equal(a.deadline) {
			t.Fatalf("first call = %d ops, deadline %s; want op 1 alone under its deadline", len(first.ops), first.deadline.Sub(start))
		}

		// While it is in flight, three queue; one of them gives up.
		b, c, d := newOp(2, 2*time.Second), newOp(3, 9*time.Second), newOp(4, 4*time.Second)
		gone, cancel := context.WithCancel(context.Background())
		e := newOp(5, 9*time.Second)
		for _, o := range []*op{b, c, d, e} {
			ctx := context.Background()
			if o == e {
				ctx = gone
			}
			submit(ctx, o)
			synctest.Wait() // queued, in this order
		}
		cancel()
		if got := <-answers; got.n != 5 || !errors.Is(got.err, context.Canceled) {
			t.Fatalf("canceled queued op answered %+v, want op 5 with context.Canceled", got)
		}
		close(first.release)
		if got := <-answers; got.n != 1 || got.err != nil {
			t.Fatalf("first answer %+v, want op 1 without error", got)
		}

		second := <-calls
		if !slices.Equal(second.ops, []*op{b, c, d}) {
			t.Fatalf("second call carries %d ops, want ops 2, 3, 4 in order (op 5 left)", len(second.ops))
		}
		if !second.deadline.Equal(c.deadline) {
			t.Fatalf("second call's deadline %s, want the latest of its ops' (9s)", second.deadline.Sub(start))
		}
		// Op 2's own deadline passes while the call runs: it stops waiting
		// at it, and the call goes on for the others.
		time.Sleep(3 * time.Second) // fake time in the bubble
		if got := <-answers; got.n != 2 || !errors.Is(got.err, context.DeadlineExceeded) {
			t.Fatalf("op past its deadline answered %+v, want op 2 with DeadlineExceeded", got)
		}
		close(second.release)
		for range 2 {
			if got := <-answers; got.err != nil || (got.n != 3 && got.n != 4) {
				t.Fatalf("answer %+v, want ops 3 and 4 without error", got)
			}
		}
		// A call that fails as a whole fails the operations queued behind
		// it at once, with its error, without a call of their own.
		f := newOp(6, 20*time.Second)
		submit(context.Background(), f)
		failing := <-calls
		g, h := newOp(7, 20*time.Second), newOp(8, 20*time.Second)
		for _, o := range []*op{g, h} {
			submit(context.Background(), o)
			synctest.Wait()
		}
		down := errors.New("connection refused")
		failing.err = down
		close(failing.release)
		for range 3 {
			if got := <-answers; !errors.Is(got.err, down) || got.n < 6 {
				t.Fatalf("answer %+v, want ops 6, 7 and 8 failing with the call's error", got)
			}
		}
		select {
		case extra := <-calls:
			t.Fatalf("another call with %d ops, want none", len(extra.ops))
		default:
		}
	})
}
