package region

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

var settleKey = bucket.Key{Rule: "api", Subject: "t"}

// settlerFixture is a Holder of region "a" for one budget of 300/s over
// three regions (no reserve: floor 100/s), a Memory store at a manual
// clock, and a Settler.
func settlerFixture(t *testing.T) (*lease.Holder, *clock.Manual, *bucket.Memory, *Settler, []lease.Budget) {
	t.Helper()
	t0 := time.Unix(1_700_000_000, 0)
	budgets := []lease.Budget{{Rule: "api", Limit: bucket.PerSecond(300), Regions: []string{"a", "b", "c"}, Policy: lease.MaxMin}}
	hc := lease.DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 7, budgets
	h, err := lease.NewHolder(hc, t0)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	return h, clk, bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), NewSettler("a", budgets), budgets
}

// settlerGrant is the leader's grant number ver (answering request seq),
// delta over base unless full.
func settlerGrant(ver, base, seq uint64, full bool, es ...lease.Entry) lease.Message {
	d := lease.DefaultConfig()
	return lease.Message{Type: lease.MsgGrant, Region: "a", Session: 7, Term: 1, Seq: seq, Grant: ver, Version: ver, Base: base,
		Full: full, Renew: true, TTL: d.TTL, Hold: d.Hold, Refresh: d.Refresh, Drift: d.Drift, Entries: es}
}

// settle applies every change s lists to st, as the Speaker's driver
// does, and returns how many it applied.
func settle(ctx context.Context, s *Settler, now time.Time, h *lease.Holder, st bucket.Store) int {
	n := 0
	for _, c := range s.Changes(now, h) {
		if _, err := c.Apply(ctx, st); err != nil {
			s.Unsettle(c)
			continue
		}
		n++
	}
	return n
}

// TestSettlerIncreaseArrivesSpent: a bucket never touched holds its floor's
// burst (100); settled to an allocation of 200 it holds 100, not 200.
func TestSettlerIncreaseArrivesSpent(t *testing.T) {
	h, clk, st, s, budgets := settlerFixture(t)
	ctx := context.Background()
	hello := h.Ready()[0]
	if err := h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200})); err != nil {
		t.Fatal(err)
	}
	if n := settle(ctx, s, clk.Now(), h, st); n != 1 {
		t.Fatalf("settled %d keys, want 1", n)
	}
	big := budgets[0].LimitOf(200)
	if l, ok := s.Applied(settleKey); !ok || l != big {
		t.Fatalf("applied %v, %v; want %v", l, ok, big)
	}
	d, err := st.Peek(ctx, settleKey, big)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 100 {
		t.Fatalf("after the increase the bucket holds %d, want the floor's 100", d.Remaining)
	}
	if n := settle(ctx, s, clk.Now(), h, st); n != 0 {
		t.Fatalf("settled %d keys again with nothing changed", n)
	}
}

// TestSettlerDecreaseRefillsAtTheNewRate: a bucket emptied at 200/s and
// settled to 50/s refills 25 tokens in half a second; left lazy it would
// refill 100 at the old rate. When the lease ends it goes back to the floor.
func TestSettlerDecreaseRefillsAtTheNewRate(t *testing.T) {
	h, clk, st, s, budgets := settlerFixture(t)
	ctx := context.Background()
	hello := h.Ready()[0]
	if err := h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200})); err != nil {
		t.Fatal(err)
	}
	settle(ctx, s, clk.Now(), h, st)
	big, small := budgets[0].LimitOf(200), budgets[0].LimitOf(50)
	if _, err := st.TakeUpTo(ctx, settleKey, big, 200); err != nil {
		t.Fatal(err)
	}
	if err := h.Step(clk.Now(), settlerGrant(2, 1, hello.Seq, false, lease.Entry{Key: settleKey, Count: 50, Burst: 50})); err != nil {
		t.Fatal(err)
	}
	if l, _ := h.Allocation(clk.Now(), settleKey); l != small {
		t.Fatalf("holder allocation %v, want %v", l, small)
	}
	if n := settle(ctx, s, clk.Now(), h, st); n != 1 {
		t.Fatalf("settled %d keys, want 1", n)
	}
	clk.Advance(500 * time.Millisecond)
	d, err := st.Peek(ctx, settleKey, small)
	if err != nil {
		t.Fatal(err)
	}
	if d.Remaining != 25 {
		t.Fatalf("0.5 s after the decrease the bucket holds %d, want 25", d.Remaining)
	}
	// The lease ends, and with it the hold of the lent floor (50 is below
	// the floor of 100): the floor is applied and forgotten.
	hs := h.Status(clk.Now())
	if hs.LeaseEnd.IsZero() {
		t.Fatal("no lease end")
	}
	end := hs.LeaseEnd
	if hs.HoldUntil.After(end) {
		end = hs.HoldUntil
	}
	clk.Set(end.Add(time.Millisecond))
	if l, _ := h.Allocation(clk.Now(), settleKey); l != budgets[0].LimitOf(100) {
		t.Fatalf("after the lease: allocation %v, want the floor", l)
	}
	if n := settle(ctx, s, clk.Now(), h, st); n != 1 {
		t.Fatalf("at the lease's end settled %d keys, want 1", n)
	}
	if l, ok := s.Applied(settleKey); ok {
		t.Fatalf("back on the floor, applied still %v", l)
	}
}

// TestSettlerResume: a Settler resuming a Holder records what it holds as
// applied, so a new speaker does not apply it a second time.
func TestSettlerResume(t *testing.T) {
	h, clk, st, s, budgets := settlerFixture(t)
	hello := h.Ready()[0]
	if err := h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200})); err != nil {
		t.Fatal(err)
	}
	s.Resume(clk.Now(), h)
	if l, ok := s.Applied(settleKey); !ok || l != budgets[0].LimitOf(200) {
		t.Fatalf("resumed: applied %v, %v", l, ok)
	}
	if n := settle(context.Background(), s, clk.Now(), h, st); n != 0 {
		t.Fatalf("resumed: settled %d keys, want 0", n)
	}
}

// TestSettlerRetriesWhatFailed: a change the store did not take keeps the
// old limit applied and is listed again, with the same From, until it is
// taken.
func TestSettlerRetriesWhatFailed(t *testing.T) {
	h, clk, st, s, budgets := settlerFixture(t)
	hello := h.Ready()[0]
	if err := h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200})); err != nil {
		t.Fatal(err)
	}
	cs := s.Changes(clk.Now(), h)
	floor, big := budgets[0].LimitOf(100), budgets[0].LimitOf(200)
	if len(cs) != 1 || cs[0] != (Change{Key: settleKey, From: floor, To: big}) {
		t.Fatalf("changes %+v, want the one from the floor to 200", cs)
	}
	s.Unsettle(cs[0])
	if _, ok := s.Applied(settleKey); ok {
		t.Fatal("an unsettled change counts as applied")
	}
	again := s.Changes(clk.Now(), h)
	want := cs[0]
	want.Again = true // listed again: what its rebase reports taken away is not trusted
	if len(again) != 1 || again[0] != want {
		t.Fatalf("after a failure: changes %+v, want %+v", again, want)
	}
	if _, err := again[0].Apply(context.Background(), st); err != nil {
		t.Fatal(err)
	}
	if n := len(s.Changes(clk.Now(), h)); n != 0 {
		t.Fatalf("%d changes after the retry was taken, want 0", n)
	}
}

// TestSettlerPutsTheCreditInOnce: a grant that raises the allocation to
// 200 and carries 60 of the reserve's stored tokens leaves the bucket with
// its floor's 100 plus the 60; the credit is settled once, and a change
// that failed is listed again without it (tokens lost, never added twice).
func TestSettlerPutsTheCreditInOnce(t *testing.T) {
	ctx := context.Background()
	h, clk, st, s, budgets := settlerFixture(t)
	hello := h.Ready()[0]
	if err := h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200, Credit: 60})); err != nil {
		t.Fatal(err)
	}
	big := budgets[0].LimitOf(200)
	if n := settle(ctx, s, clk.Now(), h, st); n != 1 {
		t.Fatalf("settled %d keys, want 1", n)
	}
	if d, err := st.Peek(ctx, settleKey, big); err != nil || d.Remaining != 160 {
		t.Fatalf("after the increase and its credit the bucket holds %d (%v), want 100 + 60", d.Remaining, err)
	}
	_ = h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200, Credit: 60})) // a duplicate
	if n := settle(ctx, s, clk.Now(), h, st); n != 0 {
		t.Fatalf("settled %d keys after a duplicate, want 0", n)
	}

	h, clk, _, s, _ = settlerFixture(t)
	hello = h.Ready()[0]
	_ = h.Step(clk.Now(), settlerGrant(1, 0, hello.Seq, true, lease.Entry{Key: settleKey, Count: 200, Burst: 200, Credit: 60}))
	cs := s.Changes(clk.Now(), h)
	if len(cs) != 1 || cs[0].Credit != 60 {
		t.Fatalf("changes %+v, want one carrying 60", cs)
	}
	s.Unsettle(cs[0])
	if again := s.Changes(clk.Now(), h); len(again) != 1 || again[0].Credit != 0 || again[0].To != big {
		t.Fatalf("after a failure: changes %+v, want the raise to 200 again without its credit", again)
	}
}

// TestApplyFromNothingLeavesTheBucketEmpty: a region's allocation of a key
// goes from 12 a minute (burst 1) to 4 a minute (burst 0: it admits
// nothing) and back. Meanwhile its bucket's state refills under the old
// limit, but that refill was the region holding the budget's to use: the
// raise leaves the bucket empty, a whole interval (5 s) to the next token.
// Before, the move to burst 0 was refused as an invalid limit, and a raise
// from nothing kept the fraction of a token the state had refilled (0.9
// here): the region admitted again half a second later.
func TestApplyFromNothingLeavesTheBucketEmpty(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	st := bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
	k := bucket.Key{Rule: "report", Subject: "t1"}
	one, none := bucket.PerMinute(12).WithBurst(1), bucket.PerMinute(4).WithBurst(0)
	steps := []struct {
		after    time.Duration
		from, to bucket.Limit
	}{
		{0, bucket.Limit{}, one},
		{time.Second, one, none},
		{3500 * time.Millisecond, none, one},
	}
	for i, s := range steps {
		clk.Advance(s.after)
		if _, err := (Change{Key: k, From: s.from, To: s.to}).Apply(ctx, st); err != nil {
			t.Fatalf("change %d (%v → %v): %v", i, s.from, s.to, err)
		}
		if s.to.AdmitsNothing() {
			continue
		}
		d, err := st.Peek(ctx, k, s.to)
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed || d.RetryAfter != 5*time.Second {
			t.Fatalf("after change %d (%v → %v) the bucket holds %d, next token in %s; want empty, 5s",
				i, s.from, s.to, d.Remaining, d.RetryAfter)
		}
	}
}

// callCounting is an in-process store that counts its settlement calls.
type callCounting struct {
	*bucket.Memory
	rebases, returns int
}

func (c *callCounting) Rebase(ctx context.Context, k bucket.Key, from, to bucket.Limit, credit bucket.Tokens) (bucket.Tokens, error) {
	c.rebases++
	return c.Memory.Rebase(ctx, k, from, to, credit)
}

func (c *callCounting) Return(ctx context.Context, k bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	c.returns++
	return c.Memory.Return(ctx, k, l, n)
}

// TestApplyWithCreditIsOneCall: a raise that carries credit is settled
// with one call to the store, the rebase carrying the credit (one round
// trip to Redis), and puts the credit in.
func TestApplyWithCreditIsOneCall(t *testing.T) {
	ctx := context.Background()
	st := &callCounting{Memory: bucket.NewMemory(bucket.MemoryOptions{})}
	k := bucket.Key{Rule: "api", Subject: "t1"}
	from, to := bucket.PerSecond(100), bucket.PerSecond(200)
	if _, err := (Change{Key: k, From: from, To: to, Credit: 60}).Apply(ctx, st); err != nil {
		t.Fatal(err)
	}
	if st.rebases != 1 || st.returns != 0 {
		t.Fatalf("with credit: %d rebases, %d returns; want one rebase", st.rebases, st.returns)
	}
	if d, err := st.Peek(ctx, k, to); err != nil || d.Remaining != 160 {
		t.Fatalf("the bucket holds %d (%v), want 100 + 60", d.Remaining, err)
	}
}
