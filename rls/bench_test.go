package rls_test

import (
	"context"
	"log/slog"
	"strconv"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/internal/benchcpu"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

const benchRules = `
version: bench
domain: edge
rules:
  - name: api
    match: {path: "/*"}
    limit: "1000000000 per second"
`

// BenchmarkServe is the server's whole work for one call short of gRPC's
// transport: read the request's bytes, decide it (an in-process store, a
// limit nobody reaches, 1,024 subjects), write the answer's bytes; with
// the proto codec and with Codec, in one run.
func BenchmarkServe(b *testing.B) {
	rs, err := rules.Parse([]byte(benchRules), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{}), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := rls.New(rls.Config{Limiter: lim, Rules: rs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		b.Fatal(err)
	}
	wires := make([][]byte, 1024)
	pc := encoding.GetCodecV2(grpcproto.Name)
	for i := range wires {
		wires[i] = marshal(b, pc, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
			desc("subject", "tenant-"+strconv.Itoa(i), "path", "/orders")}})
	}
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"proto", pc}, {"rls", rls.Codec{}}} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			ctx := context.Background()
			defer benchcpu.Start(b)()
			for i := 0; b.Loop(); i++ {
				var req rlsv3.RateLimitRequest
				if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(wires[i&1023])}, &req); err != nil {
					b.Fatal(err)
				}
				resp, err := srv.ShouldRateLimit(ctx, &req)
				if err != nil {
					b.Fatal(err)
				}
				out, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				out.Free()
			}
		})
	}
}
