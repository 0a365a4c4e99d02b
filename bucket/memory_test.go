package bucket_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/storetest"
	"github.com/allot-dev/allot/clock"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clk clock.Clock) bucket.Store {
		return bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
	})
}

// Idle buckets are dropped once full, by the sweep each shard runs every few
// thousand operations and by Sweep; a bucket still in debt is kept.
func TestMemoryExpiresIdleBuckets(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(storetest.T0)
	m := bucket.NewMemory(bucket.MemoryOptions{Clock: clk, Shards: 1})
	l := bucket.PerMinute(10)
	for i := range 1000 {
		if _, err := m.Decide(ctx, bucket.Key{Rule: "r", Subject: fmt.Sprint(i)}, l, 1, fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	if b, a := m.Len(); b != 1000 || a != 1000 {
		t.Fatalf("Len = %d buckets, %d attempts; want 1000, 1000", b, a)
	}
	// One key spends more and stays in debt for 60 s.
	if _, err := m.Decide(ctx, bucket.Key{Rule: "r", Subject: "busy"}, l, 10, ""); err != nil {
		t.Fatal(err)
	}
	clk.Advance(30 * time.Second) // past the others' 6 s debt and the 10 s attempt window
	for i := 0; i < 4096; i++ {   // enough operations to trigger the shard's sweep
		if _, err := m.Peek(ctx, bucket.Key{Rule: "r", Subject: "busy"}, l); err != nil {
			t.Fatal(err)
		}
		if _, err := m.Decide(ctx, bucket.Key{Rule: "other", Subject: "x"}, bucket.PerSecond(1_000_000), 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if b, a := m.Len(); b > 2 || a != 0 {
		t.Fatalf("after the sweep Len = %d buckets, %d attempts; want ≤ 2 (busy, other) and 0", b, a)
	}
	clk.Advance(time.Minute)
	m.Sweep()
	if b, _ := m.Len(); b != 0 {
		t.Fatalf("after Sweep with every bucket full, Len = %d, want 0", b)
	}
}

// TestMemoryMaxKeys: at MaxKeys a new key is refused with ErrFull (which is
// ErrUnavailable, so the rule's failure policy applies) while every bucket
// held is in debt; no bucket in debt is evicted, so none is charged anew.
// Once buckets are full again a sweep at the bound frees their room, at most
// once a second.
func TestMemoryMaxKeys(t *testing.T) {
	ctx := context.Background()
	clk := clock.NewManual(storetest.T0)
	m := bucket.NewMemory(bucket.MemoryOptions{Clock: clk, MaxKeys: 100, MaxAttempts: 10})
	l := bucket.PerMinute(10) // one token refills in 6 s
	key := func(i int) bucket.Key { return bucket.Key{Rule: "r", Subject: fmt.Sprint(i)} }
	for i := range 100 {
		if _, err := m.Decide(ctx, key(i), l, 10, ""); err != nil { // every bucket empty
			t.Fatal(err)
		}
	}
	if _, err := m.Decide(ctx, key(100), l, 1, ""); !errors.Is(err, bucket.ErrFull) || !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("key 101 of 100 with every bucket in debt: err = %v, want ErrFull wrapping ErrUnavailable", err)
	}
	if _, err := m.TakeUpTo(ctx, key(101), l, 5); !errors.Is(err, bucket.ErrFull) {
		t.Fatalf("TakeUpTo of a new key at the bound: err = %v, want ErrFull", err)
	}
	// Every key held is still charged: none was evicted.
	for i := range 100 {
		if d, err := m.Decide(ctx, key(i), l, 1, ""); err != nil || d.Allowed {
			t.Fatalf("key %d after refusals: %+v, %v; want still empty", i, d, err)
		}
	}
	// Return and Rebase are never refused: a limit change must be applied.
	if _, err := m.Rebase(ctx, key(102), l, bucket.PerMinute(20), 0); err != nil {
		t.Fatalf("Rebase at the bound: %v", err)
	}
	// Keys 0–9 spend again at 30 s and stay in debt; keys 10–99 are full
	// again at 60 s. The sweep at the bound frees their room (and the
	// rebased bucket's), and no other sweep runs within a second of it.
	clk.Advance(30 * time.Second)
	for i := range 10 {
		if d, err := m.Decide(ctx, key(i), l, 5, ""); err != nil || !d.Allowed {
			t.Fatalf("key %d at 30 s: %+v, %v", i, d, err)
		}
	}
	clk.Advance(31 * time.Second)
	for i := 200; i < 290; i++ {
		if _, err := m.Decide(ctx, key(i), l, 1, ""); err != nil {
			t.Fatalf("new key %d after the others refilled: %v", i, err)
		}
	}
	if _, err := m.Decide(ctx, key(290), l, 1, ""); !errors.Is(err, bucket.ErrFull) {
		t.Fatalf("key 101 of 100 right after a sweep: err = %v, want ErrFull", err)
	}
	for i := range 10 {
		// 5 tokens refilled in 31 s; an evicted bucket would have had 10.
		if d, err := m.Decide(ctx, key(i), l, 1, ""); err != nil || d.Remaining != 4 {
			t.Fatalf("key %d in debt after the sweep: %+v, %v; want 4 remaining (its debt kept)", i, d, err)
		}
	}
	st := m.Stats()
	if st.Refused != 3 || st.CapSweeps != 2 || st.Keys != 100 || st.MaxKeys != 100 {
		t.Fatalf("stats %+v; want 3 refused, 2 sweeps at the bound (one found nothing), 100 keys", st)
	}
	// Attempt records beyond MaxAttempts are not kept: a retry is charged
	// again (it can only deny more).
	for i := range 12 {
		if _, err := m.Decide(ctx, key(200+i), bucket.PerSecond(1000), 1, fmt.Sprint("a", i)); err != nil {
			t.Fatal(err)
		}
	}
	if st := m.Stats(); st.Attempts != 10 || st.Unrecorded != 2 {
		t.Fatalf("stats %+v; want 10 attempt records and 2 unrecorded", st)
	}
}
