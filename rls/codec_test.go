package rls_test

import (
	"context"
	"log/slog"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

// marshal encodes m with c into one byte slice.
func marshal(t testing.TB, c encoding.CodecV2, m any) []byte {
	t.Helper()
	data, err := c.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	defer data.Free()
	return data.Materialize()
}

// randomResponse is a response with every field the server sets, in
// random combinations and with values at the edges of their types.
func randomResponse(rng *rand.Rand) *rlsv3.RateLimitResponse {
	u32 := func() uint32 {
		return []uint32{0, 1, 127, 128, 16383, 16384, math.MaxUint32, rng.Uint32()}[rng.IntN(8)]
	}
	str := func() string {
		return []string{"", "api", `"pro";q=300;w=3`, strings.Repeat("x", 200), "ümlaut"}[rng.IntN(5)]
	}
	m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_Code(rng.IntN(3))}
	for range rng.IntN(4) {
		st := &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_Code(rng.IntN(3)), LimitRemaining: u32()}
		if rng.IntN(3) > 0 {
			st.CurrentLimit = &rlsv3.RateLimitResponse_RateLimit{Name: str(), RequestsPerUnit: u32(),
				Unit: rlsv3.RateLimitResponse_RateLimit_Unit(rng.IntN(8))}
			if rng.IntN(2) == 0 {
				st.CurrentLimit.UnitMultiplier = wrapperspb.UInt32(u32())
			}
		}
		if rng.IntN(3) > 0 {
			st.DurationUntilReset = durationpb.New([]time.Duration{0, time.Microsecond, 90 * time.Second,
				time.Duration(rng.Int64()), -time.Duration(rng.Int64N(1e12)), -1500 * time.Millisecond}[rng.IntN(6)])
		}
		m.Statuses = append(m.Statuses, st)
	}
	for _, hs := range []*[]*corev3.HeaderValue{&m.ResponseHeadersToAdd, &m.RequestHeadersToAdd} {
		for range rng.IntN(4) {
			h := &corev3.HeaderValue{Key: str(), Value: str()}
			if rng.IntN(4) == 0 {
				h.RawValue = []byte(str())
			}
			*hs = append(*hs, h)
		}
	}
	if rng.IntN(2) == 0 {
		m.RawBody = []byte(str())
	}
	return m
}

// The codec writes a response byte for byte as the proto package does,
// for random responses and for the server's own answers.
func TestCodecMatchesProto(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	pc := encoding.GetCodecV2(grpcproto.Name)
	check := func(m *rlsv3.RateLimitResponse) {
		t.Helper()
		want, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		if got := marshal(t, rls.Codec{}, m); string(got) != string(want) {
			t.Fatalf("codec wrote %x\nproto writes %x\nfor %v", got, want, m)
		}
		if got := marshal(t, pc, m); string(got) != string(want) {
			t.Fatalf("the proto codec itself differs from proto.Marshal for %v", m)
		}
	}
	for range 5000 {
		check(randomResponse(rng))
	}
	// A large response goes through the buffer pool.
	big := randomResponse(rng)
	big.RawBody = []byte(strings.Repeat("b", 64<<10))
	check(big)

	srv := newCodecServer(t)
	for _, req := range codecRequests() {
		resp, err := srv.ShouldRateLimit(context.Background(), req)
		if err != nil {
			t.Fatal(err)
		}
		check(resp)
	}
}

// A response with a field the codec does not write by hand goes to the
// proto codec, whole.
func TestCodecHandsOtherMessagesToProto(t *testing.T) {
	m := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"a": structpb.NewStringValue("b")}}}
	var back rlsv3.RateLimitResponse
	if err := proto.Unmarshal(marshal(t, rls.Codec{}, m), &back); err != nil || !proto.Equal(&back, m) {
		t.Fatalf("dynamic metadata: got %v, %v; want %v", &back, err, m)
	}
	other := &typev3.TokenBucket{MaxTokens: 7}
	var tb typev3.TokenBucket
	var c rls.Codec
	if err := c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(marshal(t, c, other))}, &tb); err != nil || tb.MaxTokens != 7 {
		t.Fatalf("another message: got %v, %v", &tb, err)
	}
}

// newCodecServer is an RLS server over the rules of the RLS tests.
func newCodecServer(t testing.TB) *rls.Server {
	rs, err := rules.Parse([]byte(envoyRules), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Clock: clk,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rls.New(rls.Config{Limiter: lim, Rules: rs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// codecRequests are requests that reach every part of an answer: allowed,
// denied, several descriptors, hits, a shared quota, no rule, another
// domain.
func codecRequests() []*rlsv3.RateLimitRequest {
	var out []*rlsv3.RateLimitRequest
	for i := range 14 {
		out = append(out, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: uint32(i % 3), Descriptors: []*rlcommon.RateLimitDescriptor{
			desc("tenant", "acme", "plan", []string{"free", "pro"}[i%2]),
			hits(desc("remote_address", "10.0.0.1", "path", "/login"), 1),
			desc("path", "/export"),
			desc("path", "/nothing"),
		}})
	}
	return append(out, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "x")}})
}

// The codec reads what proto.Unmarshal reads (unknown fields aside) and
// fails where it fails.
func FuzzUnmarshalRequest(f *testing.F) {
	for _, req := range codecRequests() {
		b, _ := proto.Marshal(req)
		f.Add(b)
	}
	full := &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 9, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries:        []*rlcommon.RateLimitDescriptor_Entry{{Key: "k", Value: "v"}, {}},
		Limit:          &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 5, Unit: typev3.RateLimitUnit_MINUTE, UnitMultiplier: wrapperspb.UInt32(3)},
		HitsAddend:     wrapperspb.UInt64(math.MaxUint64),
		IsNegativeHits: true,
	}, {}}}
	b, _ := proto.Marshal(full)
	f.Add(b)
	// Unknown fields of every wire type, a group, a known field with the
	// wrong wire type, invalid UTF-8, a repeated singular message.
	u := protowire.AppendTag(nil, 99, protowire.VarintType)
	u = protowire.AppendVarint(u, 5)
	u = protowire.AppendTag(u, 98, protowire.Fixed32Type)
	u = protowire.AppendFixed32(u, 5)
	u = protowire.AppendTag(u, 97, protowire.StartGroupType)
	u = protowire.AppendTag(u, 97, protowire.EndGroupType)
	u = protowire.AppendTag(u, 1, protowire.VarintType)
	u = protowire.AppendVarint(u, 1)
	f.Add(append(b, u...))
	f.Add(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "\xff"))
	hits := protowire.AppendTag(nil, 3, protowire.BytesType)
	hits = protowire.AppendBytes(hits, protowire.AppendVarint(protowire.AppendTag(nil, 1, protowire.VarintType), 4))
	d := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), append(hits, hits...))
	f.Add(d)
	f.Add([]byte{0x12, 0x05, 0x0a})
	f.Fuzz(func(t *testing.T, b []byte) {
		var want, got rlsv3.RateLimitRequest
		werr := proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, &want)
		gerr := rls.UnmarshalRequest(b, &got)
		if (werr == nil) != (gerr == nil) {
			t.Fatalf("proto: %v; codec: %v", werr, gerr)
		}
		if werr == nil && !proto.Equal(&got, &want) {
			t.Fatalf("codec read %v\nproto reads %v", &got, &want)
		}
	})
}

// BenchmarkCodec compares, in one run, the proto codec and Codec on a
// typical request (one descriptor of two entries) and the answer to it
// (one status, the quota headers).
func BenchmarkCodec(b *testing.B) {
	srv := newCodecServer(b)
	req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "tenant-123", "plan", "pro")}}
	resp, err := srv.ShouldRateLimit(context.Background(), req)
	if err != nil {
		b.Fatal(err)
	}
	wire := marshal(b, encoding.GetCodecV2(grpcproto.Name), req)
	for _, c := range []struct {
		name  string
		codec encoding.CodecV2
	}{{"proto", encoding.GetCodecV2(grpcproto.Name)}, {"rls", rls.Codec{}}} {
		b.Run("unmarshal-request/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			data := mem.BufferSlice{mem.SliceBuffer(wire)}
			for b.Loop() {
				var r rlsv3.RateLimitRequest
				if err := c.codec.Unmarshal(data, &r); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run("marshal-response/"+c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				data, err := c.codec.Marshal(resp)
				if err != nil {
					b.Fatal(err)
				}
				data.Free()
			}
		})
	}
}
