package region

import (
	"context"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
)

// benchStore is a region Store whose regional store is st, with key "hot"
// holding a large leased allocation, so the benchmark measures the decision
// path and not the limit.
func benchStore(b *testing.B, st bucket.Store) (*Store, bucket.Limit) {
	b.Helper()
	cfg := DefaultConfig()
	cfg.Region = "a"
	cfg.Floors = lease.Split{Regions: []string{"a", "b", "c"}}
	view := NewTableView("a", cfg.Floors)
	now := time.Now()
	view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour), HoldUntil: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("hot"), Count: 1 << 30, Burst: 1 << 30}}})
	core, err := NewCore(cfg, st, view)
	if err != nil {
		b.Fatal(err)
	}
	return NewStore(core, clock.Real{}, nil, nil), bucket.PerSecond(3 << 30)
}

// BenchmarkAllowHotKey compares, in one run, an agent's in-process decision
// on a hot key (globally coordinated: a leased share enforced through the
// regional bucket in batches) with golang.org/x/time/rate's AllowN on a
// purely local limiter.
func BenchmarkAllowHotKey(b *testing.B) {
	ctx := context.Background()
	b.Run("region/serial", func(b *testing.B) {
		s, l := benchStore(b, bucket.NewMemory(bucket.MemoryOptions{}))
		k := key("hot")
		b.ReportAllocs()
		for b.Loop() {
			if d, err := s.Decide(ctx, k, l, 1, ""); err != nil || !d.Allowed {
				b.Fatal(d, err)
			}
		}
	})
	b.Run("x-time-rate/serial", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		b.ReportAllocs()
		for b.Loop() {
			if !lim.AllowN(time.Now(), 1) {
				b.Fatal("denied")
			}
		}
	})
	// The same with time passed in (advancing 1 µs a call), so the
	// comparison is of the decision itself, not of the clock read.
	b.Run("region/serial-time-passed", func(b *testing.B) {
		s, l := benchStore(b, bucket.NewMemory(bucket.MemoryOptions{}))
		core, k, now := s.Core(), key("hot"), time.Now()
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Microsecond)
			if r, err := core.Decide(ctx, now, k, l, 1, ""); err != nil || !r.Decision.Allowed {
				b.Fatal(r, err)
			}
		}
	})
	b.Run("x-time-rate/serial-time-passed", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		now := time.Now()
		b.ReportAllocs()
		for b.Loop() {
			now = now.Add(time.Microsecond)
			if !lim.AllowN(now, 1) {
				b.Fatal("denied")
			}
		}
	})
	b.Run("region/parallel", func(b *testing.B) {
		s, l := benchStore(b, bucket.NewMemory(bucket.MemoryOptions{}))
		k := key("hot")
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if d, err := s.Decide(ctx, k, l, 1, ""); err != nil || !d.Allowed {
					b.Error(d, err)
					return
				}
			}
		})
	})
	b.Run("x-time-rate/parallel", func(b *testing.B) {
		lim := rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		b.ReportAllocs()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !lim.AllowN(time.Now(), 1) {
					b.Error("denied")
					return
				}
			}
		})
	})
}

// BenchmarkRedisOpsPerThousand measures the regional Redis operations per
// 1,000 decisions on a hot key, with a real Redis, against the cold path
// (one script call per decision).
func BenchmarkRedisOpsPerThousand(b *testing.B) {
	c := testenv.RedisClient(b)
	rs, err := redisstore.New(c, redisstore.Options{Prefix: "bench-region:"})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.Run("hot-key-batched", func(b *testing.B) {
		cs := newCounting(rs)
		s, l := benchStore(b, cs)
		k := key("hot")
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Decide(ctx, k, l, 1, ""); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cs.total())*1000/float64(b.N), "redis-ops/1000-decisions")
	})
	b.Run("cold-key-exact", func(b *testing.B) {
		cs := newCounting(rs)
		s, l := benchStore(b, cs)
		k := key("cold")
		b.ReportAllocs()
		i := 0
		for b.Loop() {
			i++
			// A fresh subject every 50 decisions keeps the key cold.
			if i%50 == 0 {
				k = key("cold" + time.Now().String())
			}
			if _, err := s.Decide(ctx, k, l, 1, ""); err != nil {
				b.Fatal(err)
			}
		}
		b.ReportMetric(float64(cs.total())*1000/float64(b.N), "redis-ops/1000-decisions")
	})
}
