package bucket_test

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"golang.org/x/time/rate"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
)

// The benchmarks compare, in one run: the pure decision and the in-process
// store against golang.org/x/time/rate's AllowN (serial and parallel), and
// the Redis store against the naive read-modify-write script the common
// articles show. Run them with `make bench` (BENCH=Decide etc. to narrow).

var benchLimit = bucket.PerSecond(1_000_000_000) // high enough that decisions allow

// fakeNow is a clock that advances one µs per reading without locks, so the
// stores pay for a time read as they would with the real clock, and the
// benchmark is not measuring time.Now's vDSO. Its timers are the real
// clock's; the stores never make any.
type fakeNow struct {
	clock.Real
	us atomic.Int64
}

func (f *fakeNow) Now() time.Time { return time.UnixMicro(f.us.Add(1)) }

func BenchmarkDecide(b *testing.B) {
	b.Run("pure", func(b *testing.B) {
		b.ReportAllocs()
		var s bucket.State
		now := time.UnixMicro(1_700_000_000_000_000)
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			_, s, _ = bucket.Decide(s, now, benchLimit, 1)
		}
	})
	b.Run("x-time-rate", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000)
		now := time.UnixMicro(1_700_000_000_000_000)
		for i := 0; i < b.N; i++ {
			now = now.Add(time.Microsecond)
			lim.AllowN(now, 1)
		}
	})
}

func BenchmarkMemory(b *testing.B) {
	ctx := context.Background()
	key := bucket.Key{Rule: "bench", Subject: "tenant"}
	b.Run("serial", func(b *testing.B) {
		b.ReportAllocs()
		m := bucket.NewMemory(bucket.MemoryOptions{Clock: &fakeNow{}})
		for i := 0; i < b.N; i++ {
			_, _ = m.Decide(ctx, key, benchLimit, 1, "")
		}
	})
	b.Run("x-time-rate-serial", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000)
		clk := &fakeNow{}
		for i := 0; i < b.N; i++ {
			lim.AllowN(clk.Now(), 1)
		}
	})
	// The keyed baseline is what a caller writes to get per-key limits from
	// x/time/rate: a map of limiters, looked up on every decision.
	b.Run("x-time-rate-keyed-serial", func(b *testing.B) {
		b.ReportAllocs()
		var limiters sync.Map
		limiters.Store(key, rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000))
		clk := &fakeNow{}
		for i := 0; i < b.N; i++ {
			v, _ := limiters.Load(key)
			v.(*rate.Limiter).AllowN(clk.Now(), 1)
		}
	})
	b.Run("parallel-one-key", func(b *testing.B) {
		b.ReportAllocs()
		m := bucket.NewMemory(bucket.MemoryOptions{Clock: &fakeNow{}})
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				_, _ = m.Decide(ctx, key, benchLimit, 1, "")
			}
		})
	})
	b.Run("x-time-rate-parallel-one-key", func(b *testing.B) {
		b.ReportAllocs()
		lim := rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000)
		clk := &fakeNow{}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				lim.AllowN(clk.Now(), 1)
			}
		})
	})
	b.Run("x-time-rate-keyed-parallel-one-key", func(b *testing.B) {
		b.ReportAllocs()
		var limiters sync.Map
		limiters.Store(key, rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000))
		clk := &fakeNow{}
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				v, _ := limiters.Load(key)
				v.(*rate.Limiter).AllowN(clk.Now(), 1)
			}
		})
	})
	b.Run("parallel-many-keys", func(b *testing.B) {
		b.ReportAllocs()
		m := bucket.NewMemory(bucket.MemoryOptions{Clock: &fakeNow{}})
		keys := make([]bucket.Key, 1024)
		for i := range keys {
			keys[i] = bucket.Key{Rule: "bench", Subject: "tenant-" + strconv.Itoa(i)}
		}
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1)) * 7919
			for pb.Next() {
				i++
				_, _ = m.Decide(ctx, keys[i&1023], benchLimit, 1, "")
			}
		})
	})
	b.Run("x-time-rate-keyed-parallel-many-keys", func(b *testing.B) {
		b.ReportAllocs()
		var limiters sync.Map
		keys := make([]bucket.Key, 1024)
		for i := range keys {
			keys[i] = bucket.Key{Rule: "bench", Subject: "tenant-" + strconv.Itoa(i)}
			limiters.Store(keys[i], rate.NewLimiter(rate.Limit(1_000_000_000), 1_000_000_000))
		}
		clk := &fakeNow{}
		var seq atomic.Int64
		b.RunParallel(func(pb *testing.PB) {
			i := int(seq.Add(1)) * 7919
			for pb.Next() {
				i++
				v, _ := limiters.Load(keys[i&1023])
				v.(*rate.Limiter).AllowN(clk.Now(), 1)
			}
		})
	})
}

var _ clock.Clock = (*fakeNow)(nil)
