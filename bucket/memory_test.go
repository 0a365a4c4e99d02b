package bucket_test

import (
	"context"
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
