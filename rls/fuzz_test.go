package rls_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

// FuzzDescriptors sends arbitrary descriptor entries and hits through the
// server: no panic, overall_code is never UNKNOWN, a status per descriptor,
// and every rejection is InvalidArgument naming the descriptor.
func FuzzDescriptors(f *testing.F) {
	rs, err := rules.Parse([]byte(envoyRules), "envoy.yaml")
	if err != nil {
		f.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clock.NewManual(t0)}),
		Clock: clock.NewManual(t0), Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	srv, err := rls.New(rls.Config{Limiter: lim, Rules: rs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		f.Fatal(err)
	}
	f.Add("edge", "tenant", "acme", "plan", "pro", uint32(1), uint64(0), false)
	f.Add("edge", "remote_address", "1.2.3.4", "path", "/login", uint32(0), uint64(3), false)
	f.Add("edge", "", "x", "path", "/export", uint32(0), uint64(1)<<63, true)
	f.Add("other", "tenant", "", "plan", "gold", uint32(1<<31), uint64(0), false)
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2 string, reqHits uint32, descHits uint64, setDescHits bool) {
		d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: k1, Value: v1}, {Key: k2, Value: v2}}}
		if setDescHits {
			d.HitsAddend = wrapperspb.UInt64(descHits)
		}
		req := &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: reqHits, Descriptors: []*rlcommon.RateLimitDescriptor{d, {}}}
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "descriptor 0") {
				t.Fatalf("error %v does not name the descriptor", err)
			}
			return
		}
		if resp.OverallCode == rlsv3.RateLimitResponse_UNKNOWN || len(resp.Statuses) != 2 {
			t.Fatalf("response %v", resp)
		}
		for _, st := range resp.Statuses {
			if st.Code == rlsv3.RateLimitResponse_UNKNOWN {
				t.Fatalf("status UNKNOWN in %v", resp)
			}
		}
	})
}
