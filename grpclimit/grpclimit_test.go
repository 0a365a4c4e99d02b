package grpclimit_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const grpcRules = `
version: grpc-test
default_plan: free
plans:
  free: "10 per minute"
  pro: "100 per second, burst 300"
rules:
  - name: api
    costs:
      - {path: /grpc.health.v1.Health/Watch, cost: 5}
`

func newLimiter(t *testing.T) (*limiter.StoreLimiter, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(t0)
	rs, err := rules.Parse([]byte(grpcRules), "grpc.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Clock: clk,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return lim, clk
}

func serve(t *testing.T, g *grpc.Server) *grpc.ClientConn {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

func TestAllowServerAndRemote(t *testing.T) {
	lim, clk := newLimiter(t)
	g := grpc.NewServer()
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	srv, err := grpclimit.NewAllowServer(lim)
	if err != nil {
		t.Fatal(err)
	}
	grpclimit.RegisterAllow(g, srv, hs)
	conn := serve(t, g)
	ctx := context.Background()
	if h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: grpclimit.AllowServiceName}); err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", h, err)
	}
	remote, err := grpclimit.NewRemote(conn, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	req := limiter.Request{Subject: "alice", Plan: "free", Descriptor: rules.Descriptor{{Key: "path", Value: "/x"}}}
	for i := range 10 {
		d, err := remote.Allow(ctx, req)
		if err != nil || !d.Allowed || d.Reason != limiter.ReasonOK || d.Remaining != bucket.Tokens(9-i) ||
			d.Limit != bucket.PerMinute(10) || d.Policy != "free" || d.Rule != "api" || d.RulesVersion != "grpc-test" {
			t.Fatalf("call %d: %+v %v", i, d, err)
		}
	}
	d, err := remote.Allow(ctx, req)
	if err != nil || d.Allowed || d.Reason != limiter.ReasonOverLimit || d.RetryAfter != 6*time.Second || d.RetryAfterSeconds() != 6 || d.ResetAfter != time.Minute {
		t.Fatalf("11th call: %+v %v", d, err)
	}
	clk.Advance(6 * time.Second)
	if d, err = remote.Allow(ctx, req); err != nil || !d.Allowed {
		t.Fatalf("after 6 s: %+v %v", d, err)
	}
	if _, err = remote.Allow(ctx, limiter.Request{Subject: "a", Rule: "nope"}); !errors.Is(err, limiter.ErrInvalidRequest) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown rule through the API: %v", err)
	}
	// The raw API rejects bad fields by name.
	client := allotv1.NewAllowServiceClient(conn)
	for _, c := range []struct {
		req  *allotv1.AllowRequest
		want string
	}{
		{&allotv1.AllowRequest{Subject: "a", Cost: -2}, "cost=-2"},
		{&allotv1.AllowRequest{Subject: "a", Descriptor_: []*allotv1.Entry{{Key: "path", Value: "/"}, {Value: "v"}}}, "descriptor entry 1 has an empty key"},
		{&allotv1.AllowRequest{Subject: strings.Repeat("s", 1<<20)}, "subject has 1048576 bytes, more than the 256 allowed"},
		{&allotv1.AllowRequest{Subject: "a", Descriptor_: []*allotv1.Entry{{Key: "tenant", Value: strings.Repeat("v", 513)}}}, `descriptor[0].value (key "tenant") has 513 bytes, more than the 512 allowed`},
		{&allotv1.AllowRequest{Subject: "a", Descriptor_: make([]*allotv1.Entry, 65)}, "descriptor has 65 entries, more than the 64 allowed"},
		{&allotv1.AllowRequest{Subject: "a", AttemptId: strings.Repeat("i", 770)}, "attempt_id has 770 bytes, more than the 769 allowed"},
	} {
		if _, err := client.Allow(ctx, c.req); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Allow(%v) = %v, want InvalidArgument with %q", c.req, err, c.want)
		}
	}
	// A server that is gone is an unavailable limiter, not an admission.
	g.Stop()
	d, err = remote.Allow(ctx, req)
	if err != nil || d.Allowed || d.Reason != limiter.ReasonUnavailable {
		t.Fatalf("server gone: %+v %v", d, err)
	}
}

// TestAllowServerBounds: bounds given to the server apply to its requests;
// a request within them is decided.
func TestAllowServerBounds(t *testing.T) {
	lim, _ := newLimiter(t)
	g := grpc.NewServer()
	srv, err := grpclimit.NewAllowServer(lim, grpclimit.WithBounds(limiter.Bounds{MaxSubject: 4, MaxValue: 8, MaxEntries: 2}))
	if err != nil {
		t.Fatal(err)
	}
	grpclimit.RegisterAllow(g, srv, nil)
	client := allotv1.NewAllowServiceClient(serve(t, g))
	ctx := context.Background()
	if _, err := client.Allow(ctx, &allotv1.AllowRequest{Subject: "abcde"}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "subject has 5 bytes, more than the 4 allowed") {
		t.Errorf("a 5-byte subject: %v", err)
	}
	if r, err := client.Allow(ctx, &allotv1.AllowRequest{Subject: "abcd", Plan: "free"}); err != nil || !r.Allowed {
		t.Errorf("a 4-byte subject: %v, %v", r, err)
	}
	if _, err := grpclimit.NewAllowServer(lim, grpclimit.WithBounds(limiter.Bounds{MaxSubject: -1, MaxValue: 1, MaxEntries: 1})); err == nil {
		t.Error("a negative bound was accepted")
	}
}

// TestInterceptor guards the health service itself, standing in for any Go
// gRPC service.
func TestInterceptor(t *testing.T) {
	lim, _ := newLimiter(t)
	cfg := grpclimit.InterceptorConfig{
		Limiter:  lim,
		Identity: grpclimit.MetadataIdentity("x-tenant", "x-plan"),
		Cost: func(ctx context.Context, _ string) bucket.Tokens {
			if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("x-cost")) > 0 && md.Get("x-cost")[0] == "50" {
				return 50
			}
			return 0
		},
		Logger: slog.New(slog.DiscardHandler),
	}
	unary, err := grpclimit.UnaryServerInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	stream, err := grpclimit.StreamServerInterceptor(cfg)
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(unary), grpc.StreamInterceptor(stream))
	healthpb.RegisterHealthServer(g, health.NewServer())
	hc := healthpb.NewHealthClient(serve(t, g))
	call := func(tenant string, kv ...string) (metadata.MD, error) {
		md := metadata.Pairs(kv...)
		if tenant != "" {
			md.Set("x-tenant", tenant)
		}
		ctx := metadata.NewOutgoingContext(context.Background(), md)
		var header metadata.MD
		_, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}, grpc.Header(&header))
		return header, err
	}
	for i := range 10 {
		h, err := call("alice")
		if err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
		if i == 0 && (strings.Join(h.Get("ratelimit"), "") != `"free";r=9;t=6` || strings.Join(h.Get("ratelimit-policy"), "") != `"free";q=10;w=60`) {
			t.Errorf("first call header metadata %v", h)
		}
	}
	h, err := call("alice")
	st := status.Convert(err)
	if st.Code() != codes.ResourceExhausted {
		t.Fatalf("11th call: %v", err)
	}
	var retry *errdetails.RetryInfo
	var quota *errdetails.QuotaFailure
	for _, det := range st.Details() {
		switch v := det.(type) {
		case *errdetails.RetryInfo:
			retry = v
		case *errdetails.QuotaFailure:
			quota = v
		}
	}
	if retry == nil || retry.RetryDelay.AsDuration() != 6*time.Second {
		t.Errorf("RetryInfo %v, want 6s", retry)
	}
	if quota == nil || quota.Violations[0].Subject != "free" || quota.Violations[0].Description != "over-limit" {
		t.Errorf("QuotaFailure %v", quota)
	}
	if strings.Join(h.Get("retry-after"), "") != "6" {
		t.Errorf("retry-after metadata %v", h)
	}
	if _, err := call(""); status.Code(err) != codes.Unauthenticated {
		t.Errorf("no identity: %v", err)
	}
	if _, err := call("bob", "x-cost", "50"); status.Code(err) != codes.PermissionDenied || !strings.Contains(err.Error(), "cost 50 exceeds the burst 10") {
		t.Errorf("cost 50 on free: %v", err)
	}
	if _, err := call("bob", "x-cost", "50", "x-plan", "pro"); err != nil {
		t.Errorf("cost 50 on pro: %v", err)
	}
	// A stream is admitted once when it opens, at the rules' cost for it.
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(context.Background(), metadata.Pairs("x-tenant", "carol")))
	defer cancel()
	for i, want := range []codes.Code{codes.OK, codes.OK, codes.ResourceExhausted} {
		w, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{})
		if err == nil {
			_, err = w.Recv()
		}
		if status.Code(err) != want {
			t.Fatalf("stream %d (cost 5 of 10): %v, want %v", i, err, want)
		}
	}
}

func TestDecisionRoundTrip(t *testing.T) {
	d := limiter.Decision{
		Allowed: true, Reason: limiter.ReasonUnavailable, Remaining: 3, RetryAfter: 0, ResetAfter: 1500 * time.Millisecond,
		Limit: bucket.PerSecond(100).WithBurst(300), Quota: bucket.PerSecond(100).WithBurst(300), Policy: "pro", Rule: "api", Plan: "pro", Cost: 5,
		Shadow: true, Fallback: rules.FailOpen, Status: 0, RulesVersion: "v9",
	}
	got, err := grpclimit.DecisionFromProto(grpclimit.DecisionToProto(d))
	if err != nil || got != d {
		t.Fatalf("round trip:\n got %+v %v\nwant %+v", got, err, d)
	}
	// The response carries the limit in force (a region's share of the
	// quota); the caller takes it for the quota too.
	d.Limit, d.Quota = bucket.PerMinute(6), bucket.PerMinute(10)
	p := grpclimit.DecisionToProto(d)
	if l := p.GetLimit(); l.GetCount() != 6 || l.GetBurst() != 6 || l.GetPeriod().AsDuration() != time.Minute {
		t.Fatalf("limit sent %v, want the limit in force, 6 per minute", l)
	}
	if got, err := grpclimit.DecisionFromProto(p); err != nil || got.Limit != bucket.PerMinute(6) || got.Quota != bucket.PerMinute(6) {
		t.Fatalf("share read back as %+v %v", got, err)
	}
	// A region that may admit nothing now: 0 over the quota's period.
	d.Limit = bucket.Limit{}
	p = grpclimit.DecisionToProto(d)
	if l := p.GetLimit(); l == nil || l.GetCount() != 0 || l.GetBurst() != 0 || l.GetPeriod().AsDuration() != time.Minute {
		t.Fatalf("zero limit sent as %v, want 0 per minute", l)
	}
	if got, err := grpclimit.DecisionFromProto(p); err != nil || !got.Limit.IsZero() || got.Limited() {
		t.Fatalf("zero limit read back as %+v %v", got, err)
	}
	if _, err := grpclimit.DecisionFromProto(&allotv1.AllowResponse{}); err == nil || !strings.Contains(err.Error(), "REASON_UNSPECIFIED") {
		t.Errorf("unspecified reason: %v", err)
	}
}

func TestInterceptorIdentityErrorAndConfig(t *testing.T) {
	lim, _ := newLimiter(t)
	if _, err := grpclimit.UnaryServerInterceptor(grpclimit.InterceptorConfig{}); err == nil || !strings.Contains(err.Error(), "Limiter is nil") {
		t.Errorf("no limiter: %v", err)
	}
	if _, err := grpclimit.NewRemote(nil, 0); err == nil || !strings.Contains(err.Error(), "timeout=0s") {
		t.Errorf("zero timeout: %v", err)
	}
	unary, err := grpclimit.UnaryServerInterceptor(grpclimit.InterceptorConfig{
		Limiter: lim,
		Identity: func(context.Context, string) (grpclimit.Identity, error) {
			return grpclimit.Identity{}, errors.New("directory down")
		},
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(grpc.UnaryInterceptor(unary))
	healthpb.RegisterHealthServer(g, health.NewServer())
	_, err = healthpb.NewHealthClient(serve(t, g)).Check(context.Background(), &healthpb.HealthCheckRequest{})
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "directory down") {
		t.Errorf("identity error: %v", err)
	}
}
