package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// syncBuffer is a log sink tests can read while the gateway writes.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// start runs the gateway in this process on free loopback ports.
func start(t *testing.T, args ...string) Ready {
	t.Helper()
	return startLogging(t, io.Discard, args...)
}

func startLogging(t *testing.T, log io.Writer, args ...string) Ready {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Ready, 1)
	done := make(chan error, 1)
	args = append([]string{"-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-log-level", "error"}, args...)
	go func() { done <- run(ctx, args, io.Discard, log, ready) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("run: %v", err)
			}
		case <-time.After(10 * time.Second):
			t.Error("gateway did not stop within 10 s")
		}
	})
	select {
	case r := <-ready:
		return r
	case err := <-done:
		t.Fatalf("gateway did not start: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("gateway did not start within 30 s")
	}
	return Ready{}
}

type resp struct {
	status int
	h      http.Header
	body   string
}

func get(t *testing.T, r Ready, path string, headers ...string) resp {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, "http://"+r.HTTP+path, nil)
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return resp{res.StatusCode, res.Header, strings.TrimSpace(string(b))}
}

func check(t *testing.T, what string, got resp, status int, headers map[string]string, body string) {
	t.Helper()
	if got.status != status {
		t.Errorf("%s: status %d, want %d (%s)", what, got.status, status, got.body)
	}
	for k, v := range headers {
		if g := got.h.Get(k); g != v {
			t.Errorf("%s: %s = %q, want %q", what, k, g, v)
		}
	}
	if body != "" && got.body != body {
		t.Errorf("%s: body %s, want %s", what, got.body, body)
	}
}

// TestREADMEExample runs the README's curl lines against the gateway: 200
// with quota headers, remaining after costs 1 and 5, 429 with Retry-After,
// 403 for a cost that can never fit, 401 without identity.
func TestREADMEExample(t *testing.T) {
	r := start(t)
	free := []string{"X-Tenant", "acme", "X-Plan", "free"}
	check(t, "items", get(t, r, "/items", free...), 200, map[string]string{
		"RateLimit-Policy": `"free";q=10;w=60`, "RateLimit": `"free";r=9;t=6`,
		"X-RateLimit-Limit": "10", "X-RateLimit-Remaining": "9", "X-RateLimit-Reset": "6",
	}, `{"route":"/items"}`)
	check(t, "report", get(t, r, "/report", free...), 200, map[string]string{
		"RateLimit": `"free";r=4;t=36`, "X-RateLimit-Remaining": "4",
	}, `{"route":"/report"}`)
	for range 4 {
		get(t, r, "/items", free...)
	}
	check(t, "over the limit", get(t, r, "/items", free...), 429, map[string]string{
		"Retry-After": "6", "RateLimit": `"free";r=0;t=60`, "X-RateLimit-Remaining": "0",
	}, `{"error":"rate limit exceeded","policy":"free","retry_after":6}`)
	check(t, "export on free", get(t, r, "/export", "X-Tenant", "initech", "X-Plan", "free"), 403,
		map[string]string{"Retry-After": ""}, "")
	check(t, "export on pro", get(t, r, "/export", "X-Tenant", "globex", "X-Plan", "pro"), 200,
		map[string]string{"RateLimit": `"pro";r=250;t=1`}, `{"route":"/export"}`)
	check(t, "no identity", get(t, r, "/items"), 401, map[string]string{"WWW-Authenticate": `Bearer realm="api"`},
		`{"error":"request has no identity","retry_after":0}`)
	check(t, "health is not limited", get(t, r, "/healthz"), 200, nil, "ok")
	m := get(t, r, "/metrics")
	digest := sha256.Sum256(exampleRules)
	for _, want := range []string{
		`allot_rules_info{digest="sha256:` + hex.EncodeToString(digest[:])[:12] + `",version="example-1"} 1`,
		`allot_decisions_total{reason="over-limit",result="denied",rule="api"} 1`,
		`allot_decisions_total{reason="can-never-fit",result="denied",rule="api"} 1`,
	} {
		if !strings.Contains(m.body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// The same limiter answers Envoy over gRPC, with health.
	conn, err := grpc.NewClient(r.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	rl, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{
		Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{
			{Key: "subject", Value: "acme"}, {Key: "plan", Value: "free"}, {Key: "path", Value: "/items"},
		}}},
	})
	if err != nil || rl.OverallCode != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("RLS for acme, out of tokens: %v %v", rl, err)
	}
	for _, svc := range []string{"", "envoy.service.ratelimit.v3.RateLimitService", "allot.allot.v1.AllowService"} {
		h, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: svc})
		if err != nil || h.Status != healthpb.HealthCheckResponse_SERVING {
			t.Errorf("health %q: %v %v", svc, h, err)
		}
	}
}

func TestAPIKeys(t *testing.T) {
	r := start(t, "-identity", "apikey")
	check(t, "free key", get(t, r, "/items", "Authorization", "Bearer key-free"), 200, map[string]string{"RateLimit": `"free";r=9;t=6`}, "")
	check(t, "pro key", get(t, r, "/export", "Authorization", "Bearer key-pro"), 200, map[string]string{"RateLimit": `"pro";r=250;t=1`}, "")
	check(t, "wrong key", get(t, r, "/items", "Authorization", "Bearer nope"), 401, nil, "")
}

// TestRulesFileReload edits the rules file under a running gateway: a good
// edit takes effect, a bad one is refused and the last good rules stay.
func TestRulesFileReload(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, exampleRules, 0o600); err != nil {
		t.Fatal(err)
	}
	log := &syncBuffer{}
	r := startLogging(t, log, "-rules", path)
	check(t, "before", get(t, r, "/items", "X-Tenant", "a"), 200, map[string]string{"X-RateLimit-Limit": "10"}, "")
	waitFor := func(what string, ok func() bool) {
		t.Helper()
		deadline := time.Now().Add(15 * time.Second)
		for !ok() {
			if time.Now().After(deadline) {
				t.Fatalf("%s: not within 15 s", what)
			}
			time.Sleep(50 * time.Millisecond) // polling for the watcher's reload, an event, not for time to pass
		}
	}
	edited := strings.Replace(strings.Replace(string(exampleRules), `free: "10 per minute"`, `free: "20 per minute"`, 1), "example-1", "example-2", 1)
	if err := os.WriteFile(path, []byte(edited), 0o600); err != nil {
		t.Fatal(err)
	}
	digest := sha256.Sum256([]byte(edited))
	info := `allot_rules_info{digest="sha256:` + hex.EncodeToString(digest[:])[:12] + `",version="example-2"} 1`
	waitFor("good edit", func() bool { return strings.Contains(get(t, r, "/metrics").body, info) })
	check(t, "after a good edit", get(t, r, "/items", "X-Tenant", "b"), 200, map[string]string{"X-RateLimit-Limit": "20"}, "")
	if err := os.WriteFile(path, []byte(strings.Replace(edited, `"20 per minute"`, `"0 per minute"`, 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	waitFor("bad edit refused", func() bool { return strings.Contains(log.String(), "rules rejected") })
	check(t, "after a bad edit", get(t, r, "/items", "X-Tenant", "c"), 200, map[string]string{"X-RateLimit-Limit": "20"}, "")
	m := get(t, r, "/metrics").body
	if !strings.Contains(m, info) {
		t.Error("the rules version moved on a refused edit")
	}
	if strings.Contains(m, "allot_rules_reload_failures_total 0") || !strings.Contains(m, "allot_rules_reload_failures_total") {
		t.Errorf("the refused edit is not counted:\n%s", m)
	}
	// The broken file is polled every second but logged once (then once a
	// minute): wait for three more polls to have failed.
	waitFor("three more failed polls", func() bool {
		for _, l := range strings.Split(get(t, r, "/metrics").body, "\n") {
			var n int
			if _, err := fmt.Sscanf(l, "allot_rules_reload_failures_total %d", &n); err == nil && n >= 4 {
				return true
			}
		}
		return false
	})
	if n := strings.Count(log.String(), "rules rejected"); n != 1 {
		t.Errorf("a file failing the same way on every poll was logged %d times, want once", n)
	}
}

// TestBounds: the gateway answers a subject over its bound and a header
// over the header cap with 431, and a request at the bound as usual; the
// 1 MB X-Tenant that used to be kept as a bucket key is never decided.
func TestBounds(t *testing.T) {
	r := start(t, "-max-subject-bytes", "64")
	check(t, "a 64-byte tenant", get(t, r, "/items", "X-Tenant", strings.Repeat("t", 64)), 200, nil, "")
	check(t, "a 65-byte tenant", get(t, r, "/items", "X-Tenant", strings.Repeat("t", 65)), 431, nil,
		`{"error":"httplimit: subject has 65 bytes, more than the 64 allowed","retry_after":0}`)
	got := get(t, r, "/items", "X-Tenant", strings.Repeat("t", 1<<20))
	if got.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 1 MB X-Tenant: %d, want 431", got.status)
	}
	m := get(t, r, "/metrics").body
	for _, want := range []string{`allot_memory_store_keys{store="buckets"} 1`, `allot_http_connections{server="gateway"}`,
		`allot_rls_unmatched_domain_total{action="allowed",kind="unknown"} 0`} {
		if !strings.Contains(m, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestRedisStore runs two gateways on one Redis: the tenant's quota is
// shared between them.
func TestRedisStore(t *testing.T) {
	addr := testenv.RedisAddr(t)
	a := start(t, "-redis", addr, "-grpc", "")
	b := start(t, "-redis", addr, "-grpc", "")
	tenant := "redis-" + time.Now().Format("150405.000000000")
	allowed := 0
	for i := range 11 {
		g := a
		if i%2 == 1 {
			g = b
		}
		if get(t, g, "/items", "X-Tenant", tenant).status == 200 {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("%d of 11 allowed across two gateways, want 10", allowed)
	}
}

func TestBadFlags(t *testing.T) {
	for _, args := range [][]string{
		{"-identity", "cookie"},
		{"-identity", "apikey", "-keys", "nokey"},
		{"-log-level", "loud"},
		{"-rules", "/nonexistent/rules.yaml"},
		{"extra"},
	} {
		err := run(context.Background(), append([]string{"-http", "127.0.0.1:0", "-grpc", ""}, args...), io.Discard, io.Discard, nil)
		if err == nil {
			t.Errorf("run(%q) succeeded", args)
		}
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-redis-timeout", "200ms", "-redis-max-timeout", "100ms"}, "-redis-max-timeout=100ms must be ≥ -redis-timeout=200ms"},
		{[]string{"-memory-max-keys", "0"}, "-memory-max-keys=0"},
	} {
		err := run(context.Background(), append([]string{"-http", "127.0.0.1:0", "-grpc", ""}, c.args...), io.Discard, io.Discard, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("run(%q) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
}

// TestMissingRulesFile: a rules file that is not there is named once, as
// not there, whether the gateway serves or checks it.
func TestMissingRulesFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "absent.yaml")
	for _, args := range [][]string{{"-rules", path}, {"-check", "-rules", path}} {
		err := run(context.Background(), append([]string{"-http", "127.0.0.1:0", "-grpc", ""}, args...), io.Discard, io.Discard, nil)
		if !errors.Is(err, fs.ErrNotExist) || strings.Count(err.Error(), path) != 1 || errors.Is(err, rules.ErrInvalid) {
			t.Errorf("run(%q) = %v, want one naming %s once, not found and not invalid", args, err, path)
		}
	}
}

func TestCheck(t *testing.T) {
	var out strings.Builder
	if err := run(context.Background(), []string{"-check"}, &out, io.Discard, nil); err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"embedded rules.yaml: ok, version example-1, 2 plans, 1 rules",
		"api                  free       10 per minute                    global  emergency    false",
		"api                  pro        100 per second, burst 300        global  emergency    false",
		"note: rule api: cost 50 (/export) exceeds plan free's burst 10: refused with 403 on free",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("-check output lacks %q:\n%s", want, out.String())
		}
	}
	path := filepath.Join(t.TempDir(), "bad.yaml")
	if err := os.WriteFile(path, []byte("rules:\n  - name: a\n    limit: \"0/s\"\n    colour: red\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"-check", "-rules", path}, io.Discard, io.Discard, nil)
	if err == nil || !strings.Contains(err.Error(), path+":3: rules[0].limit") || !strings.Contains(err.Error(), path+":4: rules[0].colour") {
		t.Errorf("-check of a bad file: %v", err)
	}
}

// TestAgentOverTLS: with -agent-ca the gateway speaks TLS to the allow API
// and verifies the server against that CA; without it, or with another CA,
// it cannot reach a TLS server and answers 503, never admitting.
func TestAgentOverTLS(t *testing.T) {
	ca := testenv.NewCA(t)
	caFile, certFile, keyFile := ca.WriteFiles(t, t.TempDir(), "eu")
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	set, err := rules.Parse(exampleRules, "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: set, Store: bucket.NewMemory(bucket.MemoryOptions{})})
	if err != nil {
		t.Fatal(err)
	}
	as, err := grpclimit.NewAllowServer(lim)
	if err != nil {
		t.Fatal(err)
	}
	gs := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})))
	grpclimit.RegisterAllow(gs, as, health.NewServer())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go gs.Serve(l)
	t.Cleanup(gs.Stop)

	free := []string{"X-Tenant", "acme", "X-Plan", "free"}
	// The first call connects and makes a TLS handshake within the call's
	// deadline; the default 100 ms is a loaded machine's handshake under
	// -race, and the request is then 503. What is tested is that TLS to
	// the agent works, not how fast: the deadline is seconds.
	tlsGW := start(t, "-agent", l.Addr().String(), "-agent-ca", caFile, "-agent-timeout", "10s", "-grpc", "")
	check(t, "TLS to the agent", get(t, tlsGW, "/items", free...), 200, map[string]string{"RateLimit": `"free";r=9;t=6`}, "")
	// The refusals get the same deadline, so their 503 is the handshake
	// failing, not the deadline passing.
	plain := start(t, "-agent", l.Addr().String(), "-agent-timeout", "10s", "-grpc", "")
	check(t, "plaintext to a TLS agent", get(t, plain, "/items", free...), 503, nil, "")
	otherCA, _, _ := testenv.NewCA(t).WriteFiles(t, t.TempDir(), "eu")
	other := start(t, "-agent", l.Addr().String(), "-agent-ca", otherCA, "-agent-timeout", "10s", "-grpc", "")
	check(t, "TLS with another CA", get(t, other, "/items", free...), 503, nil, "")

	for _, args := range [][]string{{"-agent-ca", caFile}, {"-agent", "127.0.0.1:1", "-agent-ca", filepath.Join(t.TempDir(), "absent.pem")}, {"-agent", "127.0.0.1:1", "-agent-timeout", "0s"}} {
		if err := run(context.Background(), append([]string{"-http", "127.0.0.1:0", "-grpc", ""}, args...), io.Discard, io.Discard, nil); err == nil || !strings.Contains(err.Error(), "-agent") {
			t.Errorf("run(%q) = %v, want an error naming the flag", args, err)
		}
	}
}

// TestAgentMode puts a second gateway on the first one's allow API: the
// second decides nothing itself, so both share the first one's buckets,
// and when the first is gone the second answers 503, never admitting.
func TestAgentMode(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan Ready, 1)
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"-http", "127.0.0.1:0", "-grpc", "127.0.0.1:0", "-log-level", "error"}, io.Discard, io.Discard, ready)
	}()
	a := <-ready
	// A generous deadline: the first call connects, which a loaded host
	// may not do within the default 100 ms.
	b := start(t, "-agent", a.GRPC, "-agent-timeout", "10s", "-grpc", "")
	free := []string{"X-Tenant", "acme", "X-Plan", "free"}
	check(t, "via agent", get(t, b, "/items", free...), 200, map[string]string{"RateLimit": `"free";r=9;t=6`}, "")
	check(t, "direct", get(t, a, "/report", free...), 200, map[string]string{"RateLimit": `"free";r=4;t=36`}, "")
	check(t, "via agent, cost 50", get(t, b, "/export", free...), 403, nil, "")
	check(t, "via agent, no identity", get(t, b, "/items"), 401, nil, "")
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	check(t, "agent gone", get(t, b, "/items", free...), 503, map[string]string{"Retry-After": "1"},
		`{"error":"rate limiter unavailable","retry_after":1}`)
}

// TestAgentModeWithToken: a gateway whose allow API takes only listed
// callers refuses a gateway without a token (its requests are 503: the
// limiter is unavailable to it, never an admission) and serves one with
// its token.
func TestAgentModeWithToken(t *testing.T) {
	dir := t.TempDir()
	const tok = "gateway-b-0123456789abcdef"
	callers, tokFile := filepath.Join(dir, "callers"), filepath.Join(dir, "token")
	if err := os.WriteFile(callers, []byte("gateway-b "+tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(tokFile, []byte(tok+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	a := start(t, "-allow-tokens", callers)
	free := []string{"X-Tenant", "acme", "X-Plan", "free"}
	without := start(t, "-agent", a.GRPC, "-agent-timeout", "10s", "-grpc", "")
	check(t, "without a token", get(t, without, "/items", free...), 503, nil, "")
	with := start(t, "-agent", a.GRPC, "-agent-timeout", "10s", "-grpc", "", "-agent-token-file", tokFile)
	check(t, "with the token", get(t, with, "/items", free...), 200, map[string]string{"RateLimit": `"free";r=9;t=6`}, "")
	if m := get(t, a, "/metrics").body; !strings.Contains(m, `allot_auth_rejected_total{api="allow",transport="grpc"} 1`) ||
		!strings.Contains(m, `allot_auth_info{api="allow",mode="token"} 1`) {
		t.Errorf("/metrics lacks the refusal or the mode:\n%s", m)
	}
}

// TestRedisBlackholed: the gateway's Redis path has the agent's circuit
// breaker. With Redis blackholed (its process stopped), the first calls
// wait out their deadlines; then the breaker opens, /metrics says so, and
// requests are decided at once by the rule's failure policy (the example
// rule's emergency limit, in process) without another call to Redis.
func TestRedisBlackholed(t *testing.T) {
	srv := testenv.StartRedis(t)
	g := start(t, "-redis", srv.Addr, "-grpc", "")
	tenant := "blackholed-" + time.Now().Format("150405.000000000")
	if r := get(t, g, "/items", "X-Tenant", tenant, "X-Plan", "pro"); r.status != 200 {
		t.Fatalf("Redis up: status %d", r.status)
	}
	metric := func(name string) string {
		body := get(t, g, "/metrics").body
		for _, l := range strings.Split(body, "\n") {
			if v, ok := strings.CutPrefix(l, name+" "); ok {
				return v
			}
		}
		return ""
	}
	if v := metric("allot_store_breaker_state"); v != "0" {
		t.Fatalf("breaker state %q with Redis up, want 0", v)
	}
	srv.Pause(t)
	waited := 0
	for metric("allot_store_breaker_state") != "1" {
		if waited == 8 {
			t.Fatalf("breaker not open after %d requests to a blackholed Redis", waited)
		}
		get(t, g, "/items", "X-Tenant", tenant, "X-Plan", "pro")
		waited++
	}
	opened, _ := strconv.Atoi(metric("allot_store_breaker_opened_total"))
	admitted := 0
	began := time.Now()
	for range 50 {
		r := get(t, g, "/items", "X-Tenant", tenant, "X-Plan", "pro")
		if r.status != 200 && r.status != 429 {
			t.Fatalf("breaker open: status %d (%s), want the emergency limit's 200 or 429", r.status, r.body)
		}
		if r.status == 200 {
			admitted++
		}
	}
	if admitted == 0 {
		t.Fatal("the emergency limit admitted nothing")
	}
	// While open, only a probe after each back-off reaches Redis (and,
	// failing, opens the breaker again).
	probes := int(time.Since(began)/breaker.DefaultConfig().Backoff) + 1
	if v, _ := strconv.Atoi(metric("allot_store_breaker_opened_total")); v-opened > probes {
		t.Fatalf("breaker openings %d → %d while open, want at most one a back-off (%d): requests reached Redis", opened, v, probes)
	}
	t.Logf("%d requests waited on Redis before the breaker opened; then 50 decided at once, %d admitted", waited, admitted)
}
