package main

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

const benchRules = `version: bench
domain: edge
rules:
  - name: api
    match: {path: "/*"}
    limit: "100000000 per second"
    scope: global
`

// benchAgent runs the agent in process (in-process store, floors alone)
// and returns an RLS client on loopback.
func benchAgent(b *testing.B) rlsv3.RateLimitServiceClient {
	b.Helper()
	grpcAddr := launchAgent(b, benchRules, "-log-level", "error").grpcAddr
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
