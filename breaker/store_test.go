package breaker

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestGuardOnABlackholedRedis is the gateway's Redis path with Redis
// blackholed (its process stopped: connections accepted, nothing
// answered). The breaker's state moves on a manual clock; the calls' waits
// are real. Calls wait out their deadlines, doubling from 100 ms to the
// 500 ms cap, five in a row; then the breaker opens and every call fails
// at once with ErrOpen, the store not called. Redis answers again: after
// the back-off one call probes, and its answer closes the breaker.
func TestGuardOnABlackholedRedis(t *testing.T) {
	srv, b, rs := redisUnderBreaker(t, DefaultConfig().MaxTimeout)
	clk := clock.NewManual(t0)
	s := Guard(rs, b, clk)
	ctx := context.Background()
	k, lim := bucket.Key{Rule: "r", Subject: "s"}, bucket.PerSecond(1000)
	for range 20 {
		if _, err := s.Decide(ctx, k, lim, 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	srv.Pause(t)
	clk.Advance(time.Millisecond)
	var waited []time.Duration
	for b.State(clk.Now()) == Closed {
		if len(waited) > 10 {
			t.Fatalf("breaker still closed after %d calls timed out", len(waited))
		}
		d := b.Deadline()
		_, err := s.Decide(ctx, k, lim, 1, "")
		clk.Advance(d) // the call waited d
		if !errors.Is(err, ErrTimeout) || !errors.Is(err, bucket.ErrUnavailable) {
			t.Fatalf("call %d on a blackholed Redis: %v, want a timeout", len(waited)+1, err)
		}
		waited = append(waited, d)
	}
	want := []time.Duration{100, 200, 400, 500, 500}
	if len(waited) != len(want) {
		t.Fatalf("deadlines %v before the breaker opened, want %v ms", waited, want)
	}
	for i := range want {
		if waited[i] != want[i]*time.Millisecond {
			t.Fatalf("deadlines %v before the breaker opened, want %v ms", waited, want)
		}
	}
	for range 100 {
		if _, err := s.Decide(ctx, k, lim, 1, ""); !errors.Is(err, ErrOpen) {
			t.Fatalf("breaker open: %v, want ErrOpen at once", err)
		}
	}
	srv.Resume(t)
	clk.Advance(b.Config().Backoff)
	if _, err := s.Decide(ctx, k, lim, 1, ""); err != nil {
		t.Fatalf("probe after Redis came back: %v", err)
	}
	if st := b.State(clk.Now()); st != Closed {
		t.Fatalf("breaker %s after a good probe, want closed", st)
	}
	if d := b.Deadline(); d != b.Config().Timeout {
		t.Fatalf("deadline %s after Redis answered at once, want back at %s", d, b.Config().Timeout)
	}
}

// TestTimedOnAStalledRedis: before every call Redis is stalled for 150 ms
// (CLIENT PAUSE ALL on another connection; the server checks the pause's
// end 100 times a second), so every call waits 150 ms at least, above
// the 100 ms floor; under Timed the deadlines follow, and after the first
// timeouts the calls are answered. With the deadline fixed at 100 ms
// (Timeout = MaxTimeout), the baseline, calls keep timing out. The pause
// is issued before each call, not looped beside them: a stall looped on
// another connection left gaps a call could slip through, and on a loaded
// host it timed nothing out.
func TestTimedOnAStalledRedis(t *testing.T) {
	run := func(t *testing.T, cfg Config) (timeouts, answered int, b *Breaker) {
		srv := testenv.StartRedis(t, "--hz", "100")
		c := redisstore.NewUniversalClient([]string{srv.Addr}, "", "")
		t.Cleanup(func() { c.Close() })
		b, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		rs, err := redisstore.New(c, redisstore.Options{Prefix: "allot-test:", Timeout: cfg.MaxTimeout})
		if err != nil {
			t.Fatal(err)
		}
		s := Timed(rs, b, nil)
		ctx := context.Background()
		sc := srv.Client(t)
		k, lim := bucket.Key{Rule: "r", Subject: "s"}, bucket.PerSecond(1000)
		for i := 0; i < 30; i++ {
			// The pausing connection is paused too: this waits out the
			// last pause before starting the next.
			if err := sc.Do(ctx, "CLIENT", "PAUSE", "150", "ALL").Err(); err != nil {
				t.Fatalf("CLIENT PAUSE: %v", err)
			}
			_, err := s.Decide(ctx, k, lim, 1, "")
			switch {
			case err == nil:
				if i >= 15 {
					answered++
				}
			case errors.Is(err, ErrTimeout):
				if i >= 15 {
					timeouts++
				}
			default:
				t.Fatalf("call %d: %v", i, err)
			}
		}
		return timeouts, answered, b
	}
	timeouts, answered, b := run(t, DefaultConfig())
	t.Logf("adaptive: %d timeouts and %d answers in the last 15 calls; deadline %s", timeouts, answered, b.Deadline())
	fixed := DefaultConfig()
	fixed.MaxTimeout = fixed.Timeout
	bt, _, _ := run(t, fixed)
	t.Logf("fixed 100 ms: %d timeouts in the last 15 calls", bt)
	if bt < 10 {
		t.Fatalf("the fixed deadline timed out %d of the last 15 calls: the stall does not make calls slower than 100 ms", bt)
	}
	// Side by side rather than against a figure: a loaded host can stall
	// a call past any deadline now and then.
	if timeouts*3 > bt {
		t.Fatalf("%d of the last 15 calls timed out under the adaptive deadline, against %d at a fixed 100 ms: want at most a third as many", timeouts, bt)
	}
}

// lateStore fails every call as a store that waits under a context derived
// from the caller's does when that context's timer fires first: with
// context.DeadlineExceeded, while the caller's own context may not have
// noticed yet.
type lateStore struct{ bucket.Store }

func (lateStore) Decide(context.Context, bucket.Key, bucket.Limit, bucket.Tokens, string) (bucket.Decision, error) {
	return bucket.Decision{}, fmt.Errorf("%w: late: %w", bucket.ErrUnavailable, context.DeadlineExceeded)
}

// TestInnerDeadlineIsATimeout: a call whose inner store reports a passed
// deadline is a timeout, whether or not the wrapper's context has noticed:
// it doubles the deadline and comes back as ErrTimeout, so the caller can
// tell a timeout under a deadline since raised (ErrOutgrown) from one that
// counts. Counted as plain failures, a burst of them opened the breaker
// on a slow but healthy Redis under concurrency (the chaos harness's
// redis-slow).
func TestInnerDeadlineIsATimeout(t *testing.T) {
	clk := clock.NewManual(t0)
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	s := Timed(lateStore{}, b, clk)
	k, lim := bucket.Key{Rule: "r", Subject: "s"}, bucket.PerSecond(10)
	_, err = s.Decide(context.Background(), k, lim, 1, "")
	if !errors.Is(err, ErrTimeout) || errors.Is(err, ErrOutgrown) || !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("first late call: %v, want a counted timeout", err)
	}
	if d := b.Deadline(); d != 200*time.Millisecond {
		t.Fatalf("deadline %s after a timeout at 100 ms, want 200ms", d)
	}
}

// The Redis store ends its calls at their deadlines itself, so the breaker
// hands it the deadline without a timer.
var _ DeadlineKeeper = (*redisstore.Store)(nil)

// TestKeeperEndsCallsAtTheBreakersDeadline: over a DeadlineKeeper (the
// Redis store, whose own bound here is 5 s) on a blackholed Redis, 16
// concurrent calls — one sent, the others queued behind it — each end at
// the breaker's 100 ms deadline as a timeout (counted or, once the first
// has raised the deadline, outgrown), not at the store's bound: the
// deadline the context carries is the one the store keeps.
func TestKeeperEndsCallsAtTheBreakersDeadline(t *testing.T) {
	srv, b, rs := redisUnderBreaker(t, 5*time.Second)
	s := Timed(rs, b, nil)
	if !s.keeper {
		t.Fatal("the Redis store is not taken as a DeadlineKeeper")
	}
	lim := bucket.PerSecond(1000)
	if _, err := s.Decide(context.Background(), bucket.Key{Rule: "r", Subject: "warm"}, lim, 1, ""); err != nil {
		t.Fatal(err)
	}
	d := b.Deadline()
	srv.Pause(t)
	defer srv.Resume(t)
	type out struct {
		err  error
		took time.Duration
	}
	outs := make(chan out, 16)
	// One start for all: a call queued behind one already sent ends with
	// it, at the deadline of the call sent, so measured from its own
	// start (later, on a loaded host) it can end a little before its own
	// deadline; no call can end before the deadline from the first send.
	start := time.Now()
	for i := range 16 {
		go func() {
			_, err := s.Decide(context.Background(), bucket.Key{Rule: "r", Subject: fmt.Sprint(i)}, lim, 1, "")
			outs <- out{err, time.Since(start)}
		}()
	}
	for range 16 {
		o := <-outs
		if !errors.Is(o.err, ErrTimeout) || !errors.Is(o.err, bucket.ErrUnavailable) {
			t.Fatalf("call on a blackholed Redis: %v, want a timeout", o.err)
		}
		// At the deadline, not before it; well before the store's 5 s
		// (a loaded host may add some scheduling delay to the calls
		// started last).
		if o.took < d || o.took > 2*time.Second {
			t.Fatalf("call ended after %s, want at the breaker's deadline %s", o.took, d)
		}
	}
}

func TestDeadlineCtxReportsTheEarlierDeadline(t *testing.T) {
	soon, later := t0.Add(time.Second), t0.Add(time.Minute)
	parent, cancel := context.WithDeadline(context.Background(), soon)
	defer cancel()
	if d, ok := (&deadlineCtx{Context: parent, deadline: later}).Deadline(); !ok || !d.Equal(soon) {
		t.Fatalf("Deadline() = %s, %t under a parent ending sooner, want the parent's %s", d, ok, soon)
	}
	if d, ok := (&deadlineCtx{Context: context.Background(), deadline: later}).Deadline(); !ok || !d.Equal(later) {
		t.Fatalf("Deadline() = %s, %t under a parent without one, want its own %s", d, ok, later)
	}
	if (&deadlineCtx{Context: parent, deadline: t0}).Done() != parent.Done() {
		t.Fatal("Done is not the parent's: the context's own contract (Err non-nil once Done closes) would break")
	}
}

// redisUnderBreaker starts a redis-server and returns it, a breaker of
// the default config and a Redis store on it whose own bound on a call is
// storeTimeout.
func redisUnderBreaker(t *testing.T, storeTimeout time.Duration) (*testenv.RedisServer, *Breaker, *redisstore.Store) {
	t.Helper()
	srv := testenv.StartRedis(t)
	c := redisstore.NewUniversalClient([]string{srv.Addr}, "", "")
	t.Cleanup(func() { c.Close() })
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	rs, err := redisstore.New(c, redisstore.Options{Prefix: "allot-test-" + t.Name() + ":", Timeout: storeTimeout})
	if err != nil {
		t.Fatal(err)
	}
	return srv, b, rs
}

// TestRebasePassesTheCredit: through the breaker, a rebase's credit
// reaches the store underneath, in the same call.
func TestRebasePassesTheCredit(t *testing.T) {
	ctx := context.Background()
	b, err := New(DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	s := Timed(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), b, clk)
	k, from, to := bucket.Key{Rule: "r", Subject: "s"}, bucket.PerSecond(100), bucket.PerSecond(200)
	if _, err := s.TakeUpTo(ctx, k, from, 70); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Rebase(ctx, k, from, to, 60); err != nil {
		t.Fatal(err)
	}
	// 30 of 100 left, spent under 200, and the credit of 60 back.
	if d, err := s.Peek(ctx, k, to); err != nil || d.Remaining != 90 {
		t.Fatalf("after the rebase with credit the bucket holds %d (%v), want 90", d.Remaining, err)
	}
}
