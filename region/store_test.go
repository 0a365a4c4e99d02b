package region

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

const storeTestRules = `version: store-test
rules:
  - name: closed
    match: {path: "/closed"}
    limit: "300 per second"
    on_unavailable: fail_closed
  - name: open
    match: {path: "/open"}
    limit: "300 per second"
    on_unavailable: fail_open
  - name: emergency
    match: {path: "/emergency"}
    limit: "300 per second"
    on_unavailable: {policy: emergency}
`

// TestLimiterOnTheRegionStore plugs the agent's Store into the edge's
// limiter unchanged and checks what the edge reports for each policy when
// the regional store is down, and that the bucket.Store methods act on the
// region's allocation.
func TestLimiterOnTheRegionStore(t *testing.T) {
	set, err := rules.Parse([]byte(storeTestRules), "store-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Rules = RuleConfigs(set, nil); c.BreakerFailures = 100 })
	f.core.SetLive(2)
	st := NewStore(f.core, f.clk, NewNamer(set), nil)
	lim, err := limiter.New(limiter.Config{Rules: set, Store: st, Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := func(path string) limiter.Decision {
		d, err := lim.Allow(ctx, limiter.Request{Subject: "s", Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: path}}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Up: the floor (a third of 300/s) is what the region enforces.
	if d := req("/closed"); !d.Allowed || d.Remaining != 99 {
		t.Fatalf("store up: %+v, want admitted with 99 of the floor's 100 left", d)
	}
	k := bucket.Key{Rule: "closed", Subject: "s"}
	if p, err := st.Peek(ctx, k, bucket.PerSecond(300)); err != nil || p.Remaining != 99 || p.Limit != bucket.PerSecond(100) {
		t.Fatalf("Peek: %+v %v, want the region's bucket at its floor", p, err)
	}
	if n, err := st.TakeUpTo(ctx, k, bucket.PerSecond(300), 1000); err != nil || n != 99 {
		t.Fatalf("TakeUpTo: %d %v, want the 99 the region's bucket holds", n, err)
	}
	if err := st.Return(ctx, k, bucket.PerSecond(300), 1000); err != nil {
		t.Fatal(err)
	}
	if p, _ := st.Peek(ctx, k, bucket.PerSecond(300)); p.Remaining != 100 {
		t.Fatalf("after Return: %d, want the floor's burst 100 (never more)", p.Remaining)
	}

	f.store.setDown(true)
	if d := req("/closed"); d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailClosed {
		t.Fatalf("fail closed at the edge: %+v", d)
	}
	if d := req("/open"); !d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailOpen {
		t.Fatalf("fail open at the edge: %+v", d)
	}
	if lim.Stats().FailOpen != 1 {
		t.Fatalf("edge fail-open count %d, want 1", lim.Stats().FailOpen)
	}
	// Emergency is decided by the agent: the floor halved between 2 agents.
	admitted := 0
	for i := 0; i < 100; i++ {
		if d := req("/emergency"); d.Allowed {
			admitted++
		}
	}
	if admitted != 50 {
		t.Fatalf("emergency admitted %d, want 50 (floor burst 100 ÷ 2 live agents)", admitted)
	}
}

// TestRepeated429sCarryTheReset: through the edge (limiter and HTTP
// middleware on the region's Store), every 429 for a key states the
// bucket's reset and the wait, whether the store denied it or the deny
// cache did, at fixed instants on a manual clock.
func TestRepeated429sCarryTheReset(t *testing.T) {
	set, err := rules.Parse([]byte(`version: reset-test
rules:
  - {name: api, match: {path: "/*"}, limit: "30 per minute", scope: global}
`), "reset-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Rules = RuleConfigs(set, nil) }) // a floor of 10 per minute
	lim, err := limiter.New(limiter.Config{Rules: set, Store: NewStore(f.core, f.clk, NewNamer(set), nil), Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", "")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	get := func() *httptest.ResponseRecorder {
		r := httptest.NewRequest(http.MethodGet, "/items", nil)
		r.Header.Set("X-Tenant", "acme")
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		return w
	}
	for i := 0; i < 10; i++ {
		if w := get(); w.Code != http.StatusOK {
			t.Fatalf("request %d: %d within the floor's burst", i, w.Code)
		}
	}
	for _, s := range []struct {
		at           time.Duration
		retry, reset string // Retry-After, X-RateLimit-Reset (whole seconds, rounded up)
	}{
		{time.Second, "5", "59"},             // the store's denial
		{2 * time.Second, "4", "58"},         // the deny cache's, and after
		{2500 * time.Millisecond, "4", "58"}, // 3.5 s and 57.5 s, rounded up
		{5 * time.Second, "1", "55"},
	} {
		f.clk.Set(t0.Add(s.at))
		w := get()
		if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") != s.retry || w.Header().Get("X-Ratelimit-Reset") != s.reset ||
			!strings.HasSuffix(w.Header().Get("Ratelimit"), ";r=0;t="+s.reset) {
			t.Fatalf("at t0+%s: %d Retry-After %q X-RateLimit-Reset %q RateLimit %q; want 429, %s, %s",
				s.at, w.Code, w.Header().Get("Retry-After"), w.Header().Get("X-Ratelimit-Reset"), w.Header().Get("Ratelimit"), s.retry, s.reset)
		}
	}
}

// TestEdgeStatesTheLimitInForce: every answer through the region's Store
// states the limit the decision was made against — the region's floor,
// then a coordinator entry, then an entry of nothing — not the rules'
// global quota, which RateLimit-Policy names beside it: the HTTP quota
// headers, and Envoy RLS's current_limit and headers.
func TestEdgeStatesTheLimitInForce(t *testing.T) {
	set, err := rules.Parse([]byte(`version: in-force-test
rules:
  - {name: api, match: {path: "/*"}, limit: "30 per minute", scope: global}
`), "in-force-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) { c.Rules = RuleConfigs(set, nil) }) // a floor of 10 per minute of 30
	lim, err := limiter.New(limiter.Config{Rules: set, Store: NewStore(f.core, f.clk, NewNamer(set), nil), Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", "")})
	if err != nil {
		t.Fatal(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {}))
	rs, err := rls.New(rls.Config{Limiter: lim, Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	check := func(tenant string, code int, limit, remaining, policy string, perUnit uint32) {
		t.Helper()
		r := httptest.NewRequest(http.MethodGet, "/items", nil)
		r.Header.Set("X-Tenant", tenant)
		w := httptest.NewRecorder()
		h.ServeHTTP(w, r)
		if w.Code != code || w.Header().Get("X-Ratelimit-Limit") != limit || w.Header().Get("X-Ratelimit-Remaining") != remaining ||
			w.Header().Get("Ratelimit-Policy") != policy {
			t.Errorf("%s over HTTP: %d X-RateLimit-Limit %q Remaining %q RateLimit-Policy %q; want %d, %s, %s, %s", tenant, w.Code,
				w.Header().Get("X-Ratelimit-Limit"), w.Header().Get("X-Ratelimit-Remaining"), w.Header().Get("Ratelimit-Policy"), code, limit, remaining, policy)
		}
		resp, err := rs.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Descriptors: []*rlcommon.RateLimitDescriptor{{
			Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "subject", Value: tenant}, {Key: "path", Value: "/items"}}}}})
		if err != nil {
			t.Fatal(err)
		}
		st := resp.GetStatuses()[0]
		var rp string
		for _, hv := range resp.GetResponseHeadersToAdd() {
			if hv.GetKey() == "RateLimit-Policy" {
				rp = hv.GetValue()
			}
		}
		if cl := st.GetCurrentLimit(); cl.GetRequestsPerUnit() != perUnit || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE || rp != policy {
			t.Errorf("%s over RLS: current_limit %v, RateLimit-Policy %q; want %d per minute, %s", tenant, cl, rp, perUnit, policy)
		}
	}
	// On the floor: 10 per minute of the global 30.
	check("floor", 200, "10", "9", `"api";q=10;w=60;allot-global-q=30;allot-global-w=60`, 10)
	// A coordinator entry of 20 per minute while the lease lives, and one
	// of nothing.
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: t0.Add(time.Hour), Entries: []lease.Entry{
		{Key: bucket.Key{Rule: "api", Subject: "hot"}, Count: 20, Burst: 20},
		{Key: bucket.Key{Rule: "api", Subject: "lent"}, Count: 0, Burst: 0},
	}})
	check("hot", 200, "20", "19", `"api";q=20;w=60;allot-global-q=30;allot-global-w=60`, 20)
	check("lent", 429, "0", "0", `"api";q=0;w=60;allot-global-q=30;allot-global-w=60`, 0)
}
