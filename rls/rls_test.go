package rls_test

import (
	"context"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

const envoyRules = `
version: rls-test
domain: edge
default_plan: free
plans:
  free: "10 per minute"
  pro: "100 per second, burst 300"
rules:
  - name: tenant
    match: {tenant: "*"}
    subject: [tenant]
  - name: login
    match: {remote_address: "*", path: /login}
    limit: "2 per minute"
    subject: [remote_address]
  - name: export
    match: {path: /export}
    limit: "1000 per 10 minutes"
    subject: shared
`

type env struct {
	clk    *clock.Manual
	client rlsv3.RateLimitServiceClient
	health healthpb.HealthClient
}

// start serves the RLS on a loopback port through real gRPC and returns the
// generated go-control-plane client.
func start(t *testing.T) *env {
	t.Helper()
	clk := clock.NewManual(t0)
	rs, err := rules.Parse([]byte(envoyRules), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Clock: clk,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := rls.New(rls.Config{Limiter: lim, Rules: rs, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(rls.ServerOption())
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	rls.Register(g, srv, hs)
	go g.Serve(ln)
	t.Cleanup(g.Stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &env{clk: clk, client: rlsv3.NewRateLimitServiceClient(conn), health: healthpb.NewHealthClient(conn)}
}

func desc(kv ...string) *rlcommon.RateLimitDescriptor {
	d := &rlcommon.RateLimitDescriptor{}
	for i := 0; i+1 < len(kv); i += 2 {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return d
}

func hits(d *rlcommon.RateLimitDescriptor, n uint64) *rlcommon.RateLimitDescriptor {
	d.HitsAddend = wrapperspb.UInt64(n)
	return d
}

func (e *env) call(t *testing.T, req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	resp, err := e.client.ShouldRateLimit(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

func headerMap(resp *rlsv3.RateLimitResponse) map[string]string {
	m := map[string]string{}
	for _, h := range resp.GetResponseHeadersToAdd() {
		m[h.GetKey()] = h.GetValue()
	}
	return m
}

func TestShouldRateLimit(t *testing.T) {
	e := start(t)
	// Spend 8 of acme's 10 tokens, and both of the login's.
	resp := e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 8, Descriptors: []*rlcommon.RateLimitDescriptor{
		desc("tenant", "acme", "plan", "free"),
	}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].LimitRemaining != 2 {
		t.Fatalf("hits_addend 8: %v", resp)
	}
	e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{
		hits(desc("remote_address", "127.0.0.9", "path", "/login"), 2),
	}})

	// Several descriptors: an allowed one with its own hits_addend, the
	// over-limit login among them, one no rule covers, and a shared quota
	// with a multiplied unit.
	resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{
		hits(desc("tenant", "acme", "plan", "free"), 2),
		desc("remote_address", "127.0.0.9", "path", "/login"),
		desc("unrelated", "x"),
		desc("path", "/export"),
		desc("tenant", "globex", "plan", "pro"),
	}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Fatalf("overall %v, want OVER_LIMIT", resp.OverallCode)
	}
	type want struct {
		code      rlsv3.RateLimitResponse_Code
		name      string
		perUnit   uint32
		unit      rlsv3.RateLimitResponse_RateLimit_Unit
		mult      uint32
		remaining uint32
		reset     time.Duration
	}
	OK, OVER := rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT
	wants := []want{
		{OK, "free", 10, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0, 0, 60 * time.Second},
		{OVER, "login", 2, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0, 0, 60 * time.Second},
		{OK, "", 0, 0, 0, 0, 0},
		{OK, "export", 1000, rlsv3.RateLimitResponse_RateLimit_MINUTE, 10, 999, 600 * time.Millisecond},
		{OK, "pro", 100, rlsv3.RateLimitResponse_RateLimit_SECOND, 0, 299, 10 * time.Millisecond},
	}
	if len(resp.Statuses) != len(wants) {
		t.Fatalf("%d statuses, want %d", len(resp.Statuses), len(wants))
	}
	for i, w := range wants {
		st := resp.Statuses[i]
		if st.Code != w.code || st.LimitRemaining != w.remaining {
			t.Errorf("status %d: code %v remaining %d, want %v %d", i, st.Code, st.LimitRemaining, w.code, w.remaining)
		}
		if w.name == "" {
			if st.CurrentLimit != nil || st.DurationUntilReset != nil {
				t.Errorf("status %d: unlimited descriptor has %v", i, st)
			}
			continue
		}
		cl := st.CurrentLimit
		if cl.GetName() != w.name || cl.GetRequestsPerUnit() != w.perUnit || cl.GetUnit() != w.unit || cl.GetUnitMultiplier().GetValue() != w.mult {
			t.Errorf("status %d: current_limit %v", i, cl)
		}
		if got := st.DurationUntilReset.AsDuration(); got != w.reset {
			t.Errorf("status %d: duration_until_reset %s, want %s", i, got, w.reset)
		}
	}
	h := headerMap(resp)
	wantHeaders := map[string]string{
		"RateLimit-Policy":      `"free";q=10;w=60, "login";q=2;w=60, "export";q=1000;w=600, "pro";q=300;w=3`,
		"RateLimit":             `"free";r=0;t=60, "login";r=0;t=60, "export";r=999;t=1, "pro";r=299;t=1`,
		"X-RateLimit-Limit":     "2",
		"X-RateLimit-Remaining": "0",
		"X-RateLimit-Reset":     "60",
		"Retry-After":           "30",
		"Content-Type":          "application/json",
	}
	for k, v := range wantHeaders {
		if h[k] != v {
			t.Errorf("header %s = %q, want %q", k, h[k], v)
		}
	}
	if len(h) != len(wantHeaders) {
		t.Errorf("headers %v", h)
	}
	if got, want := string(resp.RawBody), `{"error":"rate limit exceeded","policy":"login","retry_after":30}`; got != want {
		t.Errorf("raw_body %s, want %s", got, want)
	}
}

func TestOverallOKHasNoRetryAfter(t *testing.T) {
	e := start(t)
	resp := e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OK || headerMap(resp)["Retry-After"] != "" || headerMap(resp)["RateLimit"] != `"free";r=9;t=6` ||
		resp.RawBody != nil || headerMap(resp)["Content-Type"] != "" {
		t.Fatalf("%v", resp)
	}
	// No descriptors at all is OK, never UNKNOWN.
	if resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "edge"}); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("empty request: %v", resp.OverallCode)
	}
	// Another domain is not ours: OK, nothing charged.
	for range 20 {
		resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "other", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
		if resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("other domain: %v", resp)
		}
	}
	// A cost that can never fit is over the limit, with no Retry-After.
	resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 11, Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "b")}})
	if resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || headerMap(resp)["Retry-After"] != "" {
		t.Fatalf("cost 11 on free: %v", resp)
	}
	// Over the limit, then refilled when the clock moves.
	e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", HitsAddend: 9, Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}})
	if resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}}); resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT ||
		headerMap(resp)["Retry-After"] != "6" {
		t.Fatalf("11th token: %v", resp)
	}
	e.clk.Advance(6 * time.Second)
	if resp = e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}}); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("after 6 s: %v", resp)
	}
}

func TestInvalidRequests(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	for _, c := range []struct {
		req  *rlsv3.RateLimitRequest
		want string
	}{
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("", "v")}}, "descriptor 0 entry 0 has an empty key"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a"), hits(desc("tenant", "b"), 1<<60)}},
			"descriptor 1 (tenant=b): hits_addend=1152921504606846976"},
		{&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: make([]*rlcommon.RateLimitDescriptor, 65)}, "descriptors has 65 entries, more than the 64 allowed"},
	} {
		_, err := e.client.ShouldRateLimit(ctx, c.req)
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want InvalidArgument with %q", err, c.want)
		}
	}
}

func TestHealth(t *testing.T) {
	e := start(t)
	resp, err := e.health.Check(context.Background(), &healthpb.HealthCheckRequest{Service: rls.ServiceName})
	if err != nil || resp.Status != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("health: %v %v", resp, err)
	}
}
