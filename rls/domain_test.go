package rls_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

// records keeps the messages of every log record.
type records struct {
	mu   sync.Mutex
	msgs []string
}

func (r *records) Enabled(context.Context, slog.Level) bool { return true }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	var b strings.Builder
	b.WriteString(rec.Message)
	rec.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	r.mu.Lock()
	r.msgs = append(r.msgs, b.String())
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) count(sub string) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, m := range r.msgs {
		if strings.Contains(m, sub) {
			n++
		}
	}
	return n
}

func newServer(t *testing.T, clk *clock.Manual, logs *records, mod func(*rls.Config)) *rls.Server {
	t.Helper()
	rs, err := rules.Parse([]byte(envoyRules), "envoy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Clock: clk,
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	cfg := rls.Config{Limiter: lim, Rules: rs, Logger: slog.New(logs), Clock: clk}
	if mod != nil {
		mod(&cfg)
	}
	srv, err := rls.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return srv
}

// TestUnmatchedDomain: a request for a domain the rules do not serve is
// admitted without limits by default, logged once per domain and counted
// by kind; with DenyUnknownDomain every descriptor is OVER_LIMIT.
func TestUnmatchedDomain(t *testing.T) {
	clk := clock.NewManual(t0)
	logs := &records{}
	srv := newServer(t, clk, logs, nil)
	ctx := context.Background()
	req := func(domain string) *rlsv3.RateLimitRequest {
		return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "a")}}
	}
	for range 20 {
		resp, err := srv.ShouldRateLimit(ctx, req("egde")) // a typo
		if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OK || resp.Statuses[0].CurrentLimit != nil {
			t.Fatalf("unknown domain, allow: %v, %v; want OK without limits", resp, err)
		}
	}
	if _, err := srv.ShouldRateLimit(ctx, req("")); err != nil {
		t.Fatal(err)
	}
	if n := logs.count(`domain=egde`); n != 1 {
		t.Errorf("20 requests for one unknown domain logged %d times, want 1", n)
	}
	if n := logs.count(`request for a domain the rules do not serve domain= served=edge`); n != 1 {
		t.Errorf("the empty domain logged %d times, want 1:\n%v", n, logs.msgs)
	}
	if got := count(t, srv, "unknown", "allowed"); got != 20 {
		t.Errorf("unknown/allowed = %v, want 20", got)
	}
	if got := count(t, srv, "empty", "allowed"); got != 1 {
		t.Errorf("empty/allowed = %v, want 1", got)
	}

	// Denied: every descriptor over the limit, and no store touched.
	deny := newServer(t, clk, &records{}, func(c *rls.Config) { c.UnknownDomain = rls.DenyUnknownDomain })
	r := req("other")
	r.Descriptors = append(r.Descriptors, desc("tenant", "b"))
	resp, err := deny.ShouldRateLimit(ctx, r)
	if err != nil || resp.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT || len(resp.Statuses) != 2 ||
		resp.Statuses[1].Code != rlsv3.RateLimitResponse_OVER_LIMIT || !strings.Contains(string(resp.RawBody), "domain is not served") {
		t.Fatalf("unknown domain, deny: %v, %v", resp, err)
	}
	if resp, _ := deny.ShouldRateLimit(ctx, req("edge")); resp.OverallCode != rlsv3.RateLimitResponse_OK {
		t.Fatalf("the served domain under deny: %v", resp)
	}
	if got := count(t, deny, "unknown", "denied"); got != 1 {
		t.Errorf("unknown/denied = %v, want 1", got)
	}
	if _, err := rls.ParseDomainAction("drop"); err == nil {
		t.Error("ParseDomainAction accepted drop")
	}
}

// TestUnmatchedDomainLogIsBounded: requests naming ever new domains log
// the first 64 one by one, then a summary at most once a minute; the label
// set stays {empty, unknown} × {allowed, denied}.
func TestUnmatchedDomainLogIsBounded(t *testing.T) {
	clk := clock.NewManual(t0)
	logs := &records{}
	srv := newServer(t, clk, logs, nil)
	for i := range 1000 {
		clk.Advance(10 * time.Millisecond)
		if _, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: fmt.Sprint("d", i)}); err != nil {
			t.Fatal(err)
		}
	}
	if n := logs.count("request for a domain"); n != 64 {
		t.Errorf("%d domains logged one by one, want 64", n)
	}
	if n := logs.count("requests for more domains"); n != 1 {
		t.Errorf("%d summaries in 10 s, want 1", n)
	}
	clk.Advance(time.Minute)
	if _, err := srv.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "late"}); err != nil {
		t.Fatal(err)
	}
	if n := logs.count("requests=936"); n != 1 {
		t.Errorf("the summary a minute later should fold 936 requests:\n%s", strings.Join(logs.msgs[64:], "\n"))
	}
	if n := len(series(t, srv)); n != 4 {
		t.Errorf("%d series, want 4", n)
	}
}

// series gathers srv's unmatched-domain counter: "kind/action" → value.
func series(t *testing.T, srv *rls.Server) map[string]float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(srv)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			out[l["kind"]+"/"+l["action"]] = m.GetCounter().GetValue()
		}
	}
	return out
}

// count is one series of srv's unmatched-domain counter.
func count(t *testing.T, srv *rls.Server, kind, action string) float64 {
	t.Helper()
	return series(t, srv)[kind+"/"+action]
}

// TestBounds: a descriptor value over the bound, too many entries, or a
// subject over its bound is INVALID_ARGUMENT naming the descriptor and the
// field, over real gRPC; values at the bound are decided.
func TestBounds(t *testing.T) {
	e := start(t)
	ctx := context.Background()
	long := strings.Repeat("x", 1<<20)
	many := desc()
	for i := range 65 {
		many.Entries = append(many.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: fmt.Sprint("k", i), Value: "v"})
	}
	for _, c := range []struct {
		d    *rlcommon.RateLimitDescriptor
		want string
	}{
		{desc("tenant", long), `rls: descriptor 1: descriptor[0].value (key "tenant") has 1048576 bytes, more than the 512 allowed`},
		{desc("tenant", "a", "subject", strings.Repeat("s", 257)), "rls: descriptor 1: subject has 257 bytes, more than the 256 allowed"},
		{many, "rls: descriptor 1: descriptor has 65 entries, more than the 64 allowed"},
		{desc(strings.Repeat("k", 513), "v"), "descriptor[0].key has 513 bytes"},
	} {
		_, err := e.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", "ok"), c.d}})
		if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), c.want) {
			t.Errorf("error %v, want InvalidArgument with %q", err, c.want)
		}
	}
	at := e.call(t, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{desc("tenant", strings.Repeat("t", 256))}})
	if at.OverallCode != rlsv3.RateLimitResponse_OK || at.Statuses[0].CurrentLimit == nil {
		t.Fatalf("a 256-byte tenant: %v", at)
	}
}
