package limiter_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
)

// admitStore is a store that holds a batch for subject "batched": Decide
// admits it with 5 tokens left at batchLimit, and so does Admit, which
// declines every other subject. Other requests go to an in-process store.
type admitStore struct {
	bucket.Store
	admits, declines atomic.Int64
}

var batchLimit = bucket.PerSecond(7)

func (s *admitStore) Decide(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	if key.Subject == "batched" && attemptID == "" {
		return bucket.Decision{Allowed: true, Remaining: 5, Limit: batchLimit}, nil
	}
	return s.Store.Decide(ctx, key, l, cost, attemptID)
}

func (s *admitStore) Admit(key bucket.Key, _ bucket.Limit, _ bucket.Tokens) (bucket.Tokens, *bucket.Limit) {
	if key.Subject == "batched" {
		s.admits.Add(1)
		return 5, &batchLimit
	}
	return 0, nil
}

func (s *admitStore) Declined(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens) (bucket.Decision, error) {
	s.declines.Add(1)
	return s.Decide(ctx, key, l, cost, "")
}

// TestAdmitterDecidesAsDecide: a limiter on a bucket.Admitter, which asks
// Admit first, decides as one on the same store seen as a plain
// bucket.Store, which asks Decide: the same decisions and counts, for
// requests Admit admits, declines, and never sees (attempt ids, local
// rules).
func TestAdmitterDecidesAsDecide(t *testing.T) {
	ctx := context.Background()
	set := parse(t, testRules)
	clk := clock.NewManual(t0)
	as := &admitStore{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk})}
	lim, err := limiter.New(limiter.Config{Rules: set, Store: as, Clock: clk, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	plain := &admitStore{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk})}
	twin, err := limiter.New(limiter.Config{Rules: set, Store: struct{ bucket.Store }{plain}, Clock: clk, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 40; i++ {
		for _, req := range []limiter.Request{
			{Subject: "batched", Plan: "pro", Descriptor: path("/items")},
			{Subject: "other", Plan: "pro", Descriptor: path("/items")},
			{Subject: "batched", Plan: "free", Descriptor: path("/report")},
			{Subject: "batched", Plan: "pro", Descriptor: path("/items"), AttemptID: "a" + string(rune('0'+i%10))},
			{Subject: "batched", Rule: "login", Descriptor: append(path("/login"), struct{ Key, Value string }{"client_ip", "10.0.0.1"})},
		} {
			clk.Advance(time.Millisecond)
			var d limiter.Decision
			err := lim.AllowInto(ctx, &req, &d)
			want, werr := twin.Allow(ctx, req)
			if d != want || (err == nil) != (werr == nil) {
				t.Fatalf("%+v: on the Admitter %+v (%v), on Decide %+v (%v)", req, d, err, want, werr)
			}
		}
	}
	if a, b := lim.Stats(), twin.Stats(); a != b {
		t.Errorf("counts: on the Admitter %+v, on Decide %+v", a, b)
	}
	if as.admits.Load() == 0 || as.declines.Load() == 0 || plain.admits.Load()+plain.declines.Load() != 0 {
		t.Errorf("Admit admitted %d and declined %d, the plain store's %d and %d; want some of each, and none",
			as.admits.Load(), as.declines.Load(), plain.admits.Load(), plain.declines.Load())
	}
}
