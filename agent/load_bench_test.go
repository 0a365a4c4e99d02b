package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// loadRate is ten times the load at which the chaos harness first saw a
// healthy Redis trip the agents' breakers: about 3.4k requests a second
// in all.
const loadRate = 34_000

// BenchmarkSlowRedisUnderLoad is one agent, as cmd/agent wires it (its
// Redis calls under the core's breaker, breaker.Timed), on a real
// redis-server that stalls for 150 ms every 500 ms (DEBUG SLEEP on
// another connection): a slow but healthy Redis. The load is loadRate
// decisions a second, open loop (a paced producer; what 512 workers cannot
// take at once is counted as skipped, not queued): 90% on one hot key
// decided from batches, 10% over 5,000 cold keys decided one Redis call
// each. b.N is the number of decisions (-benchtime 170000x is 5 s); Tick
// runs every 100 ms as the driver's does.
//
// adaptive is the agent's default breaker. fixed-100ms is the same
// breaker with the deadline pinned at 100 ms (MaxTimeout = Timeout), the
// baseline the latency-following deadline replaced. Reported: breaker
// openings, decisions the store could not make (unavailable), skipped,
// and the decisions made per second.
func BenchmarkSlowRedisUnderLoad(b *testing.B) {
	for _, mode := range []string{"adaptive", "fixed-100ms"} {
		b.Run(mode, func(b *testing.B) {
			srv := testenv.StartRedis(b, "--enable-debug-command", "yes")
			c := redisstore.NewUniversalClient([]string{srv.Addr}, "", "")
			b.Cleanup(func() { c.Close() })
			cfg := DefaultConfig()
			cfg.Name, cfg.Core.Region = "eu-0", "eu"
			cfg.Core.Floors = lease.Split{Regions: []string{"eu"}}
			cfg.Core.DefaultRule = region.RuleConfig{OnUnavailable: rules.FailClosed}
			if mode == "fixed-100ms" {
				cfg.Core.MaxTimeout = cfg.Core.Timeout
			}
			rs, err := redisstore.New(c, redisstore.Options{Prefix: "allot-bench:", Timeout: cfg.Core.MaxTimeout})
			if err != nil {
				b.Fatal(err)
			}
			a, err := New(cfg, Deps{Store: rs, Redis: c, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
			if err != nil {
				b.Fatal(err)
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var bg sync.WaitGroup
			bg.Add(2)
			go func() { // the stalls
				defer bg.Done()
				sc := srv.Client(b)
				tk := time.NewTicker(500 * time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tk.C:
						_ = sc.Do(ctx, "DEBUG", "SLEEP", "0.15").Err()
					}
				}
			}()
			go func() { // the driver's tick
				defer bg.Done()
				tk := time.NewTicker(100 * time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-ctx.Done():
						return
					case now := <-tk.C:
						a.Core().Tick(ctx, now)
					}
				}
			}()
			hot, cold := bucket.PerSecond(100_000), bucket.PerSecond(10)
			var decided, unavailable, skipped atomic.Int64
			work := make(chan int, 512)
			var wg sync.WaitGroup
			for range 512 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for i := range work {
						k, l := bucket.Key{Rule: "api", Subject: "hot"}, hot
						if i%10 == 0 {
							k, l = bucket.Key{Rule: "api", Subject: fmt.Sprint(i % 5000)}, cold
						}
						_, err := a.Store().Decide(ctx, k, l, 1, "")
						switch {
						case err == nil:
							decided.Add(1)
						case errors.Is(err, bucket.ErrUnavailable):
							unavailable.Add(1)
						default:
							b.Error(err)
						}
					}
				}()
			}
			interval := time.Second / loadRate
			b.ResetTimer()
			start := time.Now()
			for i := range b.N {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d) // pacing the open-loop schedule
				}
				select {
				case work <- i:
				default:
					skipped.Add(1)
				}
			}
			close(work)
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			cancel()
			bg.Wait()
			st := a.Core().Stats()
			b.ReportMetric(float64(st.BreakerOpened), "openings")
			b.ReportMetric(float64(unavailable.Load()), "unavailable")
			b.ReportMetric(float64(skipped.Load()), "skipped")
			b.ReportMetric(float64(decided.Load())/elapsed.Seconds(), "decided/s")
			b.ReportMetric(float64(st.StoreOps)/elapsed.Seconds(), "redis-ops/s")
		})
	}
}
