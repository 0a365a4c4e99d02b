package limiter_test

import (
	"context"
	"strconv"
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// BenchmarkAllow compares a bare in-process store decision with the same
// decision through the limiter (rule match, plan, cost, subject), to show
// what resolving the rules adds per request.
func BenchmarkAllow(b *testing.B) {
	ctx := context.Background()
	subjects := make([]string, 1024)
	for i := range subjects {
		subjects[i] = "tenant-" + strconv.Itoa(i)
	}
	newStore := func() *bucket.Memory { return bucket.NewMemory(bucket.MemoryOptions{Clock: clock.Real{}}) }
	limit := bucket.PerSecond(1 << 30)
	b.Run("store-only", func(b *testing.B) {
		s := newStore()
		for i := 0; b.Loop(); i++ {
			_, _ = s.Decide(ctx, bucket.Key{Rule: "api", Subject: subjects[i&1023]}, limit, 1, "")
		}
	})
	src := `
default_plan: free
plans: {free: "1073741824 per second"}
rules:
  - name: login
    match: {endpoint: login}
    limit: "5 per minute"
  - name: api
    match: {path: "/*"}
    costs:
      - {path: /report, cost: 5}
      - {path: /export, cost: 50}
`
	rs, err := rules.Parse([]byte(src), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	newLimiter := func() *limiter.StoreLimiter {
		l, err := limiter.New(limiter.Config{Rules: rs, Store: newStore(), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		return l
	}
	desc := rules.Descriptor{{Key: rules.KeyPath, Value: "/items"}, {Key: rules.KeyMethod, Value: "GET"}}
	b.Run("limiter", func(b *testing.B) {
		l := newLimiter()
		for i := 0; b.Loop(); i++ {
			_, _ = l.Allow(ctx, limiter.Request{Subject: subjects[i&1023], Descriptor: desc})
		}
	})
	b.Run("limiter-parallel", func(b *testing.B) {
		l := newLimiter()
		b.RunParallel(func(pb *testing.PB) {
			i := 0
			for pb.Next() {
				_, _ = l.Allow(ctx, limiter.Request{Subject: subjects[i&1023], Descriptor: desc})
				i++
			}
		})
	})
}
