package httplimit_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/bucket/storetest"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.DiscardHandler)

// gatewayRules are the example gateway's plans and routes: /items costs 1,
// /report 5 and /export 50.
const gatewayRules = `
version: http-test
default_plan: free
no_identity: {action: deny, status: 401}
unknown_plan: deny
plans:
  free: "10 per minute"
  pro: "100 per second, burst 300"
rules:
  - name: shadow
    match: {path: /beta}
    limit: "1 per minute"
    shadow: true
  - name: open
    match: {path: /open}
    limit: "1 per minute"
    on_unavailable: fail_open
  - name: api
    match: {path: "/*"}
    costs:
      - {path: /report, cost: 5}
      - {path: /export, cost: 50}
`

type fixture struct {
	clk   *clock.Manual
	store *storetest.Counting
	lim   *limiter.StoreLimiter
	srv   *httptest.Server
}

func newFixture(t testing.TB, src string, store bucket.Store, mod func(*httplimit.Config)) *fixture {
	t.Helper()
	f := &fixture{clk: clock.NewManual(t0)}
	if store == nil {
		store = bucket.NewMemory(bucket.MemoryOptions{Clock: f.clk})
	}
	f.store = &storetest.Counting{Store: store}
	rs, err := rules.Parse([]byte(src), "http.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f.lim, err = limiter.New(limiter.Config{Rules: rs, Store: f.store, Clock: f.clk, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	cfg := httplimit.Config{
		Limiter:  f.lim,
		Identity: httplimit.TrustedHeader("X-Tenant", "X-Plan"),
		Logger:   quiet,
	}
	if mod != nil {
		mod(&cfg)
	}
	mw, err := httplimit.Middleware(cfg)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok "+r.URL.Path) })
	f.srv = httptest.NewServer(mw(mux))
	t.Cleanup(f.srv.Close)
	return f
}

type response struct {
	status int
	header http.Header
	body   string
}

func (f *fixture) get(t *testing.T, path, tenant, plan string, extra ...string) response {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, f.srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if tenant != "" {
		req.Header.Set("X-Tenant", tenant)
	}
	if plan != "" {
		req.Header.Set("X-Plan", plan)
	}
	for i := 0; i+1 < len(extra); i += 2 {
		req.Header.Set(extra[i], extra[i+1])
	}
	resp, err := f.srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return response{resp.StatusCode, resp.Header, string(b)}
}

// expect checks the status and, exactly, every header named in want; a
// header wanted as "" must be absent.
func expect(t *testing.T, step string, got response, status int, want map[string]string, body string) {
	t.Helper()
	if got.status != status {
		t.Errorf("%s: status %d, want %d (body %s)", step, got.status, status, got.body)
	}
	for k, v := range want {
		if vals := got.header.Values(k); v == "" && len(vals) > 0 {
			t.Errorf("%s: %s = %q, want absent", step, k, vals)
		} else if v != "" && (len(vals) != 1 || vals[0] != v) {
			t.Errorf("%s: %s = %q, want %q", step, k, vals, v)
		}
	}
	if body != "" && strings.TrimSpace(got.body) != body {
		t.Errorf("%s: body %s, want %s", step, strings.TrimSpace(got.body), body)
	}
}

func quota(r, t string) map[string]string {
	return map[string]string{
		"RateLimit-Policy":      `"free";q=10;w=60`,
		"RateLimit":             `"free";r=` + r + ";t=" + t,
		"X-RateLimit-Limit":     "10",
		"X-RateLimit-Remaining": r,
		"X-RateLimit-Reset":     t,
	}
}

// byValue hides a *limiter.StoreLimiter behind the Limiter interface alone,
// so that the middleware decides through Allow.
type byValue struct{ limiter.Limiter }

// TestStatusesAndHeaders runs through the middleware deciding in place
// (StoreLimiter.AllowInto) and through Allow, with the same answers.
func TestStatusesAndHeaders(t *testing.T) {
	t.Run("in-place", func(t *testing.T) { statusesAndHeaders(t, nil) })
	t.Run("by-value", func(t *testing.T) {
		statusesAndHeaders(t, func(c *httplimit.Config) { c.Limiter = byValue{c.Limiter} })
	})
}

func statusesAndHeaders(t *testing.T, mod func(*httplimit.Config)) {
	f := newFixture(t, gatewayRules, nil, mod)

	h := quota("9", "6")
	h["Retry-After"] = ""
	expect(t, "first /items", f.get(t, "/items", "alice", "free"), 200, h, "ok /items")
	expect(t, "/report costs 5", f.get(t, "/report", "alice", "free"), 200, quota("4", "36"), "ok /report")
	for i, want := range []string{"3", "2", "1", "0"} {
		expect(t, "/items "+string(rune('a'+i)), f.get(t, "/items", "alice", "free"), 200, quota(want, []string{"42", "48", "54", "60"}[i]), "")
	}
	h = quota("0", "60")
	h["Retry-After"] = "6"
	h["Content-Type"] = "application/json"
	expect(t, "over the limit", f.get(t, "/items", "alice", "free"), 429, h,
		`{"error":"rate limit exceeded","policy":"free","retry_after":6}`)
	h["Retry-After"] = "30"
	expect(t, "/report over the limit", f.get(t, "/report", "alice", "free"), 429, h,
		`{"error":"rate limit exceeded","policy":"free","retry_after":30}`)

	// Half a second before the next token: Retry-After rounds up to 1, never 0.
	f.clk.Advance(5500 * time.Millisecond)
	h = quota("0", "55")
	h["Retry-After"] = "1"
	expect(t, "0.5 s early", f.get(t, "/items", "alice", "free"), 429, h,
		`{"error":"rate limit exceeded","policy":"free","retry_after":1}`)
	f.clk.Advance(500 * time.Millisecond)
	expect(t, "token refilled", f.get(t, "/items", "alice", "free"), 200, quota("0", "60"), "ok /items")

	// Cost 50 can never fit free's burst of 10: 403, no Retry-After, and the
	// store is not asked.
	calls := f.store.Calls.Load()
	expect(t, "/export on free", f.get(t, "/export", "bob", "free"), 403, map[string]string{
		"Retry-After": "", "RateLimit": "", "RateLimit-Policy": `"free";q=10;w=60`, "Content-Type": "application/json",
	}, `{"error":"request cost 50 exceeds the quota's burst 10 and can never be admitted","policy":"free","retry_after":0}`)
	if f.store.Calls.Load() != calls {
		t.Error("a request that can never fit touched the store")
	}
	expect(t, "/export on pro", f.get(t, "/export", "bob", "pro"), 200, map[string]string{
		"RateLimit-Policy": `"pro";q=300;w=3`, "RateLimit": `"pro";r=250;t=1`,
		"X-RateLimit-Limit": "300", "X-RateLimit-Remaining": "250", "X-RateLimit-Reset": "1",
	}, "ok /export")

	expect(t, "no identity", f.get(t, "/items", "", ""), 401, map[string]string{
		"WWW-Authenticate": `Bearer realm="api"`, "RateLimit": "", "Retry-After": "",
	}, `{"error":"request has no identity","retry_after":0}`)
	expect(t, "unknown plan", f.get(t, "/items", "carol", "gold"), 403, map[string]string{"RateLimit": ""},
		`{"error":"plan \"gold\" is not known","retry_after":0}`)

	// A shadow rule admits and shows nothing, though it counts.
	for i := range 3 {
		expect(t, "shadow", f.get(t, "/beta", "alice", "free"), 200, map[string]string{"RateLimit": "", "Retry-After": ""}, "ok /beta")
		_ = i
	}
	if got := f.lim.Stats().ShadowDenied; got != 2 {
		t.Errorf("shadow denials counted %d, want 2", got)
	}
}

func TestNoIdentityStatusFromRules(t *testing.T) {
	f := newFixture(t, strings.Replace(gatewayRules, "status: 401", "status: 429", 1), nil, nil)
	expect(t, "no identity", f.get(t, "/items", "", ""), 429, map[string]string{"WWW-Authenticate": ""}, "")
	f = newFixture(t, strings.Replace(gatewayRules, "no_identity: {action: deny, status: 401}", "no_identity: default_plan", 1), nil, nil)
	expect(t, "no identity on the default plan", f.get(t, "/items", "", ""), 200, quota("9", "6"), "")
}

func TestAPIKeyIdentity(t *testing.T) {
	var lookupFails atomic.Bool
	keys := httplimit.StaticKeys(map[string]httplimit.Identity{"k-free": {Subject: "t1", Plan: "free"}, "k-pro": {Subject: "t2", Plan: "pro"}})
	lookup := func(ctx context.Context, key string) (httplimit.Identity, bool, error) {
		if lookupFails.Load() {
			return httplimit.Identity{}, false, errors.New("key service down")
		}
		return keys(ctx, key)
	}
	f := newFixture(t, gatewayRules, nil, func(c *httplimit.Config) { c.Identity = httplimit.APIKey("Authorization", lookup) })
	expect(t, "free key", f.get(t, "/items", "", "", "Authorization", "Bearer k-free"), 200, quota("9", "6"), "")
	expect(t, "pro key", f.get(t, "/report", "", "", "Authorization", "bearer k-pro"), 200,
		map[string]string{"RateLimit": `"pro";r=295;t=1`}, "")
	expect(t, "unknown key", f.get(t, "/items", "", "", "Authorization", "Bearer nope"), 401, nil, "")
	expect(t, "basic auth is not a key", f.get(t, "/items", "", "", "Authorization", "Basic k-free"), 401, nil, "")
	lookupFails.Store(true)
	expect(t, "lookup down", f.get(t, "/items", "", "", "Authorization", "Bearer k-free"), 503,
		map[string]string{"Retry-After": "1"}, `{"error":"identity lookup unavailable","retry_after":1}`)
}

func TestCostFuncAndAttemptHeader(t *testing.T) {
	f := newFixture(t, gatewayRules, nil, func(c *httplimit.Config) {
		c.Cost = httplimit.HeaderCost("X-Cost")
		c.AttemptHeader = "Idempotency-Key"
	})
	expect(t, "cost 3", f.get(t, "/items", "a", "", "X-Cost", "3"), 200, quota("7", "18"), "")
	expect(t, "no header: rules' cost", f.get(t, "/report", "a", ""), 200, quota("2", "48"), "")
	expect(t, "bad cost", f.get(t, "/items", "a", "", "X-Cost", "1.5"), 400, nil,
		`{"error":"httplimit: X-Cost=\"1.5\": bucket: invalid cost: cost=1.5 must be a whole number of tokens","retry_after":0}`)
	expect(t, "first try", f.get(t, "/items", "b", "", "Idempotency-Key", "k1"), 200, quota("9", "6"), "")
	expect(t, "retry costs nothing", f.get(t, "/items", "b", "", "Idempotency-Key", "k1"), 200, quota("9", "6"), "")
	expect(t, "new attempt", f.get(t, "/items", "b", "", "Idempotency-Key", "k2"), 200, quota("8", "12"), "")
}

// TestUnavailable kills the Redis the limiter stands on: a rule that fails
// closed answers 503 with Retry-After, one that fails open admits without
// quota headers and the limiter counts it.
func TestUnavailable(t *testing.T) {
	srv := testenv.StartRedis(t)
	rs, err := redisstore.New(srv.Client(t), redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, gatewayRules, rs, nil)
	expect(t, "redis up", f.get(t, "/items", "alice", "free"), 200, quota("9", "6"), "")
	srv.Kill()
	expect(t, "fail closed", f.get(t, "/items", "alice", "free"), 503, map[string]string{"Retry-After": "1", "RateLimit": ""},
		`{"error":"rate limiter unavailable","policy":"free","retry_after":1}`)
	for range 2 {
		expect(t, "fail open", f.get(t, "/open", "alice", "free"), 200, map[string]string{"RateLimit": "", "Retry-After": ""}, "ok /open")
	}
	if got := f.lim.Stats().FailOpen; got != 2 {
		t.Errorf("fail-open admissions counted %d, want 2", got)
	}
}

func TestConfigValidate(t *testing.T) {
	if _, err := httplimit.Middleware(httplimit.Config{}); err == nil || !strings.Contains(err.Error(), "Config.Limiter") {
		t.Errorf("no limiter: %v", err)
	}
	lim := newFixture(t, gatewayRules, nil, nil).lim
	if _, err := httplimit.Middleware(httplimit.Config{Limiter: lim, NoIdentityStatus: 200}); err == nil || !strings.Contains(err.Error(), "NoIdentityStatus=200") {
		t.Errorf("status 200: %v", err)
	}
}

func TestWindow(t *testing.T) {
	for _, c := range []struct {
		l    bucket.Limit
		want int64
	}{
		{bucket.PerMinute(10), 60},
		{bucket.PerSecond(100).WithBurst(300), 3},
		{bucket.PerSecond(1000), 1},
		{bucket.PerHour(7), 3600},
		{bucket.Per(3, time.Second).WithBurst(1), 1},
		{bucket.Per(3, 10*time.Second).WithBurst(1), 4},
	} {
		if got := httplimit.Window(c.l); got != c.want {
			t.Errorf("Window(%v) = %d, want %d", c.l, got, c.want)
		}
	}
}

func TestBodyIsJSON(t *testing.T) {
	f := newFixture(t, gatewayRules, nil, nil)
	for range 10 {
		f.get(t, "/items", "z", "")
	}
	r := f.get(t, "/items", "z", "")
	var b struct {
		Error      string `json:"error"`
		Policy     string `json:"policy"`
		RetryAfter int64  `json:"retry_after"`
	}
	if err := json.Unmarshal([]byte(r.body), &b); err != nil || b.Error == "" || b.Policy != "free" || b.RetryAfter != 6 {
		t.Errorf("body %q: %+v %v", r.body, b, err)
	}
}

// TestHeadersAndDescriptor derives descriptor entries from request headers
// (a login limit per client address) and from a custom descriptor builder.
func TestHeadersAndDescriptor(t *testing.T) {
	src := `
default_plan: free
plans: {free: "10 per minute"}
rules:
  - name: login
    match: {path: /login, client: "*"}
    limit: "2 per minute"
    subject: [client]
  - name: api
    match: {path: "/*"}
`
	f := newFixture(t, src, nil, func(c *httplimit.Config) { c.Headers = map[string]string{"client": "X-Client-Addr"} })
	for i, want := range []int{200, 200, 429} {
		r := f.get(t, "/login", "", "", "X-Client-Addr", "192.0.2.7")
		expect(t, "login "+string(rune('0'+i)), r, want, map[string]string{"RateLimit-Policy": `"login";q=2;w=60`}, "")
	}
	expect(t, "another client", f.get(t, "/login", "", "", "X-Client-Addr", "192.0.2.8"), 200, nil, "")
	// Without the header the login rule does not match; the api rule needs
	// an identity.
	expect(t, "no client header", f.get(t, "/login", "", ""), 401, nil, "")

	f = newFixture(t, src, nil, func(c *httplimit.Config) {
		c.Descriptor = func(r *http.Request, id httplimit.Identity) rules.Descriptor {
			return rules.Descriptor{{Key: "path", Value: "/login"}, {Key: "client", Value: r.URL.Query().Get("c")}}
		}
	})
	expect(t, "custom descriptor", f.get(t, "/anything?c=x", "", ""), 200, map[string]string{"RateLimit": `"login";r=1;t=30`}, "")
}
