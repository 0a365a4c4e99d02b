package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/benchcpu"
	"github.com/allot-dev/allot/internal/testenv"
)

const benchRules = `version: bench
domain: edge
rules:
  - name: api
    match: {path: "/*"}
    limit: "100000000 per second"
    scope: global
`

// benchRegionRules decide every cold key in the regional store: a Redis
// script call per decision, concurrent ones sharing calls.
const benchRegionRules = `version: bench
domain: edge
rules:
  - name: api
    match: {path: "/*"}
    limit: "1000000 per second"
    scope: region
`

// benchAgent runs the agent in process (in-process store, floors alone)
// and returns an RLS client on loopback.
func benchAgent(b *testing.B) rlsv3.RateLimitServiceClient {
	b.Helper()
	return benchAgentWith(b, benchRules)
}

// benchAgentWith runs the agent in process with rules and extra flags and
// returns an RLS client on loopback.
func benchAgentWith(b *testing.B, rules string, extra ...string) rlsv3.RateLimitServiceClient {
	b.Helper()
	grpcAddr := launchAgent(b, rules, append([]string{"-log-level", "error"}, extra...)...).grpcAddr
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { conn.Close() })
	c := rlsv3.NewRateLimitServiceClient(conn)
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := c.ShouldRateLimit(context.Background(), rlsRequest("warm")); err == nil {
			return c
		}
		if time.Now().After(deadline) {
			b.Fatal("agent did not answer within 10 s")
		}
		time.Sleep(20 * time.Millisecond) // waiting for a listener
	}
}

func rlsRequest(subject string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "subject", Value: subject}, {Key: "path", Value: "/orders"}}}}}
}

// BenchmarkRLSFixedLoad offers b.N ShouldRateLimit calls at a fixed rate
// (open loop: each call starts on schedule whether or not earlier ones have
// answered) to the sidecar over loopback gRPC, on one hot key, and reports
// the latency percentiles and the throughput achieved.
func BenchmarkRLSFixedLoad(b *testing.B) {
	for _, rate := range []int{1000, 2000} {
		b.Run(fmt.Sprintf("offered=%d/s", rate), func(b *testing.B) {
			c := benchAgent(b)
			req := rlsRequest("tenant-1")
			lat := make([]time.Duration, b.N)
			interval := time.Second / time.Duration(rate)
			var wg sync.WaitGroup
			b.ResetTimer()
			start := time.Now()
			for i := 0; i < b.N; i++ {
				if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
					time.Sleep(d) // pacing the offered load, not waiting for time to pass
				}
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					t := time.Now()
					resp, err := c.ShouldRateLimit(context.Background(), req)
					lat[i] = time.Since(t)
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						b.Error(resp, err)
					}
				}(i)
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
			b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "req/s")
		})
	}
}

// BenchmarkRLSThroughput is the closed-loop throughput of the sidecar's
// RLS over loopback gRPC, 32 callers on one hot key.
func BenchmarkRLSThroughput(b *testing.B) {
	c := benchAgent(b)
	req := rlsRequest("tenant-1")
	b.SetParallelism(16)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := c.ShouldRateLimit(context.Background(), req); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkRLSRedisColdKeys is the agent's Redis path as make bench-peers
// drives it: 32 closed-loop callers over loopback gRPC on 1,000 keys of a
// `scope: region` rule, every decision a script call on the agent's own
// redis-server (concurrent ones sharing calls). It reports the process's
// CPU per decision (client and agent: the callers are in this process too),
// the Redis server's, and the allocations per decision (client and agent),
// which the machine's load does not move. It runs with the agent's heap
// floor (-heap-floor-mib, which holds for the whole process, callers
// included) and without it, GOGC alone.
func BenchmarkRLSRedisColdKeys(b *testing.B) {
	for _, floor := range []int{defaultHeapFloorMiB, 0} {
		b.Run(fmt.Sprintf("heap-floor-mib=%d", floor), func(b *testing.B) {
			srv := testenv.StartRedis(b)
			c := benchAgentWith(b, benchRegionRules, "-redis", srv.Addr, "-redis-timeout", "5s", "-heap-floor-mib", strconv.Itoa(floor))
			rc := srv.Client(b)
			var seq atomic.Int64
			b.SetParallelism(16) // 32 callers on two cores
			b.ReportAllocs()
			red0 := redisCPU(b, rc)
			stop := benchcpu.Start(b)
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					resp, err := c.ShouldRateLimit(context.Background(), rlsRequest("cold-"+strconv.FormatInt(seq.Add(1)%1000, 10)))
					if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OK {
						b.Error(resp, err)
						return
					}
				}
			})
			b.StopTimer()
			stop()
			b.ReportMetric(float64(redisCPU(b, rc)-red0)/float64(b.N), "redis-cpu-ns/op")
		})
	}
}

// redisCPU is a Redis server's CPU time so far (user + system), from INFO
// cpu.
func redisCPU(b *testing.B, c interface {
	Info(context.Context, ...string) *redis.StringCmd
}) time.Duration {
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		for _, f := range []string{"used_cpu_sys:", "used_cpu_user:"} {
			if v, ok := strings.CutPrefix(line, f); ok {
				x, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
				if err != nil {
					b.Fatalf("INFO cpu %q: %v", line, err)
				}
				total += x
			}
		}
	}
	return time.Duration(total * float64(time.Second))
}
