package lease

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestKeyStatusShowsClaims: a key's status gives, beside each region's
// allocation, what the Allocator counts it may still use. A region whose
// decrease goes unacknowledged keeps its old allocation as its claim, and
// the region waiting for that capacity can see why it waits; once the
// acknowledgement arrives the claim falls to the allocation.
func TestKeyStatusShowsClaims(t *testing.T) {
	c := newCluster(t, testConfig()) // 600 a minute over a, b and c
	k := bucket.Key{Rule: "api", Subject: "t1"}
	status := func() KeyStatus {
		t.Helper()
		for _, st := range c.alloc.Keys(0) {
			if st.Key == k {
				if !slices.Equal(st.Regions, []string{"a", "b", "c"}) || len(st.Claims) != len(st.Regions) {
					t.Fatalf("claims %v for regions %v, want one for each of a, b, c", st.Claims, st.Regions)
				}
				return st
			}
		}
		t.Fatalf("no status for %v", k)
		return KeyStatus{}
	}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 500}
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 20}
	for range 200 { // 20 s
		c.step(100 * time.Millisecond)
	}
	st := status()
	held := st.Counts[0]
	if held < 400 {
		t.Fatalf("a holds %d of 600, want most of it\n%s", held, c.show())
	}
	for i := range st.Regions {
		if st.Claims[i] < st.Counts[i] {
			t.Fatalf("%s: claim %d below its allocation %d", st.Regions[i], st.Claims[i], st.Counts[i])
		}
	}
	// The demand moves to b. From the step that lowers a, every message
	// from a is lost: its acknowledgement of the decrease too.
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 20}
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 500}
	var lowered bool
	for range 50 {
		c.step(100 * time.Millisecond)
		if st = status(); st.Counts[0] < held {
			lowered = true
			c.dropUp["a"] = 1 << 30
			break
		}
	}
	if !lowered {
		t.Fatalf("a was never lowered from %d\n%s", held, c.show())
	}
	for range 10 {
		c.step(100 * time.Millisecond)
	}
	st = status()
	if st.Claims[0] < held || st.Counts[0] >= held {
		t.Fatalf("a's decrease unacknowledged: allocation %d, claim %d; want the claim at its old %d\n%s",
			st.Counts[0], st.Claims[0], held, c.show())
	}
	// The acknowledgements get through again.
	c.dropUp["a"] = 0
	for range 50 {
		c.step(100 * time.Millisecond)
	}
	st = status()
	if st.Claims[0] >= held {
		t.Fatalf("a acknowledged: claim %d, want below its old %d\n%s", st.Claims[0], held, c.show())
	}
	if sum := sumTokens(st.Claims); sum > 600 {
		t.Fatalf("claims %v sum to %d, over the budget of 600", st.Claims, sum)
	}
}

func sumTokens(ts []bucket.Tokens) bucket.Tokens {
	var s bucket.Tokens
	for _, t := range ts {
		s += t
	}
	return s
}
