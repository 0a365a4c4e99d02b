package region

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// largestTake records the largest batch asked of the store.
type largestTake struct {
	*countingStore
	mu  sync.Mutex
	max bucket.Tokens
}

func (s *largestTake) TakeUpTo(ctx context.Context, k bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	s.mu.Lock()
	s.max = max(s.max, n)
	s.mu.Unlock()
	return s.countingStore.TakeUpTo(ctx, k, l, n)
}

// A busy key of a region-scoped rule takes token batches as a hot key of a
// global budget does: few store operations per thousand decisions, no
// batch above BatchMaxFraction of the rule's burst (the region enforces
// the rule's limit whole), every admitted token debited first (I3), and
// nothing admitted beyond the limit.
func TestRegionScopedKeyTakesBatches(t *testing.T) {
	for _, tc := range []struct {
		name     string
		perMS    int          // requests per millisecond
		limit    bucket.Limit // the rule's, enforced whole in the region
		admitAll bool
	}{
		{"below its limit", 100, bucket.PerSecond(200_000), true},
		{"over its limit", 100, bucket.PerSecond(20_000), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t, func(c *Config) {
				c.Rules = map[string]RuleConfig{"perip": {Scope: rules.ScopeRegion, OnUnavailable: rules.FailClosed}}
			})
			st := &largestTake{countingStore: f.store}
			core, err := NewCore(f.core.cfg, st, f.view)
			if err != nil {
				t.Fatal(err)
			}
			k := bucket.Key{Rule: "perip", Subject: "10.0.0.1"}
			ctx := context.Background()
			admitted, decisions := 0, 0
			for ms := 0; ms < 2000; ms++ {
				for range tc.perMS {
					r, err := core.Decide(ctx, f.clk.Now(), k, tc.limit, 1, "")
					if err != nil {
						t.Fatal(err)
					}
					decisions++
					if r.Decision.Allowed {
						admitted++
					}
				}
				f.clk.Advance(time.Millisecond)
				if ms%50 == 0 {
					core.Tick(ctx, f.clk.Now())
				}
			}
			perThousand := float64(st.total()) * 1000 / float64(decisions)
			t.Logf("%d decisions, %d admitted, %d store operations (%.2f per 1000), largest batch %d",
				decisions, admitted, st.total(), perThousand, st.max)
			if st.count("take") == 0 {
				t.Fatal("the key never took a batch")
			}
			if perThousand > 10 {
				t.Fatalf("store operations per 1000 decisions = %.2f, want ≤ 10", perThousand)
			}
			if bound := bucket.Tokens(float64(tc.limit.Burst()) * f.core.cfg.BatchMaxFraction); st.max > bound {
				t.Fatalf("largest batch %d, above BatchMaxFraction × burst = %d", st.max, bound)
			}
			if tc.admitAll && admitted != decisions {
				t.Fatalf("admitted %d of %d below the limit", admitted, decisions)
			}
			// Within burst + rate × 2 s, and I3.
			if bound := int(tc.limit.Burst()) + int(tc.limit.Rate())*2; admitted > bound {
				t.Fatalf("admitted %d, above burst + rate×t = %d", admitted, bound)
			}
			st.mu.Lock()
			debited := f.store.taken - f.store.back
			st.mu.Unlock()
			if bucket.Tokens(admitted) > debited {
				t.Fatalf("admitted %d tokens but only %d were debited", admitted, debited)
			}
		})
	}
}
