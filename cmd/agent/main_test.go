package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/allot-dev/allot/internal/testenv"
)

const testRules = `version: agent-test
domain: edge
rules:
  - name: api
    match: {path: "/*"}
    limit: "10 per minute"
    scope: global
`

// agentProc is an agent run in process by launchAgent.
type agentProc struct {
	httpAddr, grpcAddr string
	rulesFile          string
	errc               chan error // what run returned
}

// launchAgent runs the agent in process on rules (written to a file) with
// args after the region, name, rules and listen addresses; it stops at
// cleanup, which fails the test if it does not stop cleanly.
func launchAgent(tb testing.TB, rules string, extra ...string) *agentProc {
	tb.Helper()
	p := &agentProc{
		httpAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)),
		grpcAddr:  fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(tb)),
		rulesFile: filepath.Join(tb.TempDir(), "rules.yaml"),
		errc:      make(chan error, 1),
	}
	if err := os.WriteFile(p.rulesFile, []byte(rules), 0o600); err != nil {
		tb.Fatal(err)
	}
	args := append([]string{"-region", "eu", "-name", "eu-1", "-rules", p.rulesFile, "-http-listen", p.httpAddr, "-grpc-listen", p.grpcAddr}, extra...)
	ctx, cancel := context.WithCancel(context.Background())
	go func() { p.errc <- run(ctx, args, func(string) string { return "" }, io.Discard) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case err := <-p.errc:
			if err != nil {
				tb.Errorf("agent stopped with %v", err)
			}
		case <-time.After(10 * time.Second):
			tb.Error("agent did not stop within 10 s")
		}
	})
	return p
}

// startAgent runs the agent in process with args and the test's rules,
// waits until it is healthy and returns its HTTP and gRPC addresses; it
// stops at cleanup.
func startAgent(t *testing.T, extra ...string) (httpAddr, grpcAddr string) {
	t.Helper()
	p := launchAgent(t, testRules, extra...)
	waitHealthy(t, p)
	return p.httpAddr, p.grpcAddr
}

// waitHealthy waits up to 10 s for p's /healthz.
func waitHealthy(t *testing.T, p *agentProc) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get("http://" + p.httpAddr + "/healthz")
		if err == nil {
			resp.Body.Close()
			return
		}
		select {
		case err := <-p.errc:
			p.errc <- err // for the cleanup
			t.Fatalf("agent exited: %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent not healthy within 10 s: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for a listener, not for time to pass
	}
}

func allow(t *testing.T, httpAddr, subject string) allowJSON {
	t.Helper()
	body := fmt.Sprintf(`{"subject": %q, "descriptor": [{"key": "path", "value": "/orders"}]}`, subject)
	resp, err := http.Post("http://"+httpAddr+"/v1/allow", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("/v1/allow: %d %s", resp.StatusCode, b)
	}
	var out allowJSON
	if err := json.Unmarshal(b, &out); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return out
}

func TestAgentServesAllowRLSAndMetrics(t *testing.T) {
	for _, mode := range []string{"memory", "redis"} {
		t.Run(mode, func(t *testing.T) {
			var extra []string
			if mode == "redis" {
				extra = []string{"-redis", testenv.StartRedis(t).Addr}
			}
			httpAddr, grpcAddr := startAgent(t, extra...)
			// 10 per minute, this region alone (no coordinator, no
			// -regions): its floor is the whole budget, and every answer
			// says so.
			admitted := 0
			for i := 0; i < 11; i++ {
				d := allow(t, httpAddr, "alice")
				if d.Allowed {
					admitted++
				}
				if l := d.Limit; l == nil || *l != (limitJSON{Count: 10, PeriodMS: 60000, Burst: 10}) || d.Remaining != int64(max(9-i, 0)) {
					t.Fatalf("answer %d: limit %v, remaining %d; want 10 per minute, %d", i, l, d.Remaining, max(9-i, 0))
				}
			}
			if admitted != 10 {
				t.Fatalf("admitted %d of 11 on a budget of 10 owned alone", admitted)
			}
			// Envoy's RLS on the same agent and rules: bob has his own bucket.
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			c := rlsv3.NewRateLimitServiceClient(conn)
			req := &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{
				Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "subject", Value: "bob"}, {Key: "path", Value: "/x"}}}}}
			codes := map[rlsv3.RateLimitResponse_Code]int{}
			for i := 0; i < 12; i++ {
				resp, err := c.ShouldRateLimit(context.Background(), req)
				if err != nil {
					t.Fatal(err)
				}
				codes[resp.GetOverallCode()]++
				if cl := resp.GetStatuses()[0].GetCurrentLimit(); cl.GetRequestsPerUnit() != 10 || cl.GetUnit() != rlsv3.RateLimitResponse_RateLimit_MINUTE {
					t.Fatalf("RLS current_limit %v, want 10 per minute", cl)
				}
			}
			if codes[rlsv3.RateLimitResponse_OK] != 10 || codes[rlsv3.RateLimitResponse_OVER_LIMIT] != 2 {
				t.Fatalf("RLS codes %v, want 10 OK and 2 OVER_LIMIT", codes)
			}
			resp, err := http.Get("http://" + httpAddr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			for _, want := range []string{`allot_region_decisions_total{agent="eu-1",path="store",result="admitted",rule="api"} 20`,
				`allot_region_decision_seconds_bucket{agent="eu-1",path="store",le=`, "allot_region_members", "allot_region_rule_policy"} {
				if !strings.Contains(string(b), want) {
					t.Errorf("/metrics lacks %s", want)
				}
			}
		})
	}
}

// TestFloorsAloneAndShared: an agent alone (no coordinator, -regions empty
// or naming only its region) owns the whole budget; one configured with
// other regions, or with a coordinator, keeps to its floor (10 per minute
// less a reserve of ⌈10/3⌉ = 4, split among the regions), with no
// coordinator or with one it cannot reach (I5). Every answer states the
// limit in force.
func TestFloorsAloneAndShared(t *testing.T) {
	unreachable := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)) // nothing listens there
	for _, c := range []struct {
		name     string
		args     []string
		admitted int
	}{
		{"alone", nil, 10},
		{"alone, naming itself", []string{"-regions", "eu"}, 10},
		{"no coordinator, three regions", []string{"-regions", "eu,us,ap"}, 2},
		{"unreachable coordinator, three regions", []string{"-regions", "eu,us,ap", "-coordinators", unreachable, "-insecure"}, 2},
		{"unreachable coordinator, this region alone", []string{"-regions", "eu", "-coordinators", unreachable, "-insecure"}, 6},
	} {
		t.Run(c.name, func(t *testing.T) {
			httpAddr, _ := startAgent(t, c.args...)
			admitted := 0
			for i := 0; i < 11; i++ {
				d := allow(t, httpAddr, "frank")
				if d.Allowed {
					admitted++
				}
				if l := d.Limit; l == nil || l.Count != int64(c.admitted) || l.Burst != int64(c.admitted) || *d.Quota != (limitJSON{Count: 10, PeriodMS: 60000, Burst: 10}) {
					t.Fatalf("answer %d: limit %v of quota %v, want the limit in force, %d per minute, of 10", i, l, d.Quota, c.admitted)
				}
			}
			if admitted != c.admitted {
				t.Fatalf("admitted %d of 11, want %d", admitted, c.admitted)
			}
		})
	}
}

func TestParseFlagsAndEnvironment(t *testing.T) {
	env := map[string]string{"ALLOT_REGION": "us", "ALLOT_RULES": "r.yaml", "ALLOT_REDIS": "127.0.0.1:1", "ALLOT_RESERVE": "0.5"}
	o, err := parse([]string{"-region", "eu"}, func(k string) string { return env[k] }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.region != "eu" || o.rulesPath != "r.yaml" || o.redisAddrs != "127.0.0.1:1" || o.reserve != 0.5 {
		t.Fatalf("flags over environment: %+v", o)
	}
	if _, err := parse(nil, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "-region") {
		t.Fatalf("missing region: %v", err)
	}
	if _, err := parse([]string{"-region", "eu", "-rules", "r", "-coordinators", "c:1"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "-regions") {
		t.Fatalf("coordinators without regions: %v", err)
	}
	if _, err := parse([]string{"-region", "eu", "-rules", "r", "-heap-floor-mib", "-1"}, func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), "-heap-floor-mib=-1") {
		t.Fatalf("negative heap floor: %v", err)
	}
	// Flags an agent alone ignores are checked too, and contradictions
	// are refused rather than resolved one way.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-reserve", "1.5"}, "floors reserve=1.5 must be in [0, 1)"},
		{[]string{"-reserve", "NaN"}, "floors reserve=NaN must be in [0, 1)"},
		{[]string{"-weights", "1,2"}, "floors has 2 weights for 1 regions"},
		{[]string{"-weights", "0"}, `floors weight=0 for region "eu" must be in [1, 2^20]`},
		{[]string{"-redis-timeout", "200ms", "-redis-max-timeout", "100ms"}, "-redis-max-timeout=100ms must be ≥ -redis-timeout=200ms"},
		{[]string{"-memory-max-keys", "0"}, "-memory-max-keys=0"},
	} {
		if _, err := parse(append([]string{"-region", "eu", "-rules", "r"}, c.args...), func(string) string { return "" }, io.Discard); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("parse(%q) = %v, want an error saying %q", c.args, err, c.want)
		}
	}
	// A minimum above the default maximum raises the maximum, as before;
	// only a maximum given below it is a contradiction (also from the
	// environment).
	if o, err := parse([]string{"-region", "eu", "-rules", "r", "-redis-timeout", "1s"}, func(string) string { return "" }, io.Discard); err != nil || o.redisTimeout != time.Second {
		t.Errorf("-redis-timeout 1s alone: %v", err)
	}
	if _, err := parse([]string{"-region", "eu", "-rules", "r", "-redis-timeout", "1s"}, func(k string) string { return map[string]string{"ALLOT_REDIS_MAX_TIMEOUT": "500ms"}[k] }, io.Discard); err == nil || !strings.Contains(err.Error(), "-redis-max-timeout=500ms") {
		t.Errorf("ALLOT_REDIS_MAX_TIMEOUT below -redis-timeout: %v", err)
	}
	env["ALLOT_RESERVE"] = "lots"
	if _, err := parse(nil, func(k string) string { return env[k] }, io.Discard); err == nil || !strings.Contains(err.Error(), "ALLOT_RESERVE") {
		t.Fatalf("bad environment value: %v", err)
	}
}

// TestAgentRefusesNegativeDriftAtStart: the speaker's drift margin is
// checked at start (agent.Config.Validate), also for an agent alone, which
// never speaks, so that the mistake shows before the region is joined.
func TestAgentRefusesNegativeDriftAtStart(t *testing.T) {
	rulesFile := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(testRules), 0o600); err != nil {
		t.Fatal(err)
	}
	// An agent that started anyway serves until this ends, and returns nil.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := run(ctx, []string{"-region", "eu", "-name", "eu-1", "-rules", rulesFile, "-http-listen", "127.0.0.1:0", "-grpc-listen", "127.0.0.1:0",
		"-lease-drift", "-1s"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "speaker drift=-1s must be ≥ 0") {
		t.Fatalf("run = %v, want -lease-drift -1s refused", err)
	}
}

func TestAgentReloadsRules(t *testing.T) {
	p := launchAgent(t, testRules)
	waitHealthy(t, p)
	httpAddr, rf := p.httpAddr, p.rulesFile
	for i := 0; i < 10; i++ {
		if !allow(t, httpAddr, "carol").Allowed {
			t.Fatalf("request %d denied within the budget", i)
		}
	}
	if allow(t, httpAddr, "carol").Allowed {
		t.Fatal("11th request admitted on a budget of 10")
	}
	// A larger quota: the file is reloaded within a poll interval and the
	// same bucket has room again.
	if err := os.WriteFile(rf, []byte(strings.Replace(testRules, "10 per minute", "1000 per minute", 1)), 0o600); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := allow(t, httpAddr, "carol")
		if d.Allowed {
			if d.Limit.Count != 1000 {
				t.Fatalf("admitted under limit %v, want 1000 per minute", d.Limit)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the new rules did not apply within 5 s")
		}
		time.Sleep(100 * time.Millisecond) // the watcher polls the file every second
	}
}

// TestAgentOverTLS runs the agent with its servers on TLS and its Redis
// reached over TLS (a redis-server with a TLS port, requiring client
// certificates).
func TestAgentOverTLS(t *testing.T) {
	dir := t.TempDir()
	caFile, certFile, keyFile := testenv.NewCA(t).WriteFiles(t, dir, "eu")
	tlsPort := testenv.FreePort(t)
	testenv.StartRedis(t, "--tls-port", fmt.Sprint(tlsPort), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-ca-cert-file", caFile, "--tls-auth-clients", "yes")
	// The first decision dials Redis and makes a TLS handshake within
	// the call's deadline. The default deadline (100 ms, a hundred round
	// trips) is for a store that answers in a millisecond; on a loaded
	// machine the handshake alone can take longer, and the decision then
	// falls to the rule's policy. What is tested is that the decision
	// goes through Redis over TLS, not how fast: the deadline is seconds.
	httpAddr := launchAgent(t, testRules, "-redis", fmt.Sprintf("127.0.0.1:%d", tlsPort), "-redis-tls",
		"-redis-timeout", "10s", "-tls-cert", certFile, "-tls-key", keyFile, "-tls-ca", caFile).httpAddr
	pool := x509.NewCertPool()
	caPEM, _ := os.ReadFile(caFile)
	pool.AppendCertsFromPEM(caPEM)
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	// The client waits as long as the decision may take: a request given
	// up on would be retried below and counted twice.
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	body := `{"subject": "dave", "descriptor": [{"key": "path", "value": "/orders"}]}`
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := hc.Post("https://"+httpAddr+"/v1/allow", "application/json", strings.NewReader(body))
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			var out allowJSON
			if err := json.Unmarshal(b, &out); err != nil || !out.Allowed || out.Reason != "ok" {
				t.Fatalf("allow over TLS with Redis over TLS: %s %v", b, err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("agent over TLS not answering: %v", err)
		}
		time.Sleep(20 * time.Millisecond) // waiting for a listener
	}
	// The decision went to Redis: the store was not unavailable.
	resp, err := hc.Get("https://" + httpAddr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(b), `allot_region_decisions_total{agent="eu-1",path="store",result="admitted",rule="api"} 1`) ||
		strings.Contains(string(b), "allot_region_store_errors_total{agent=\"eu-1\"} 1") {
		t.Fatalf("the decision did not go through Redis over TLS:\n%s", grepLines(string(b), "allot_region_store"))
	}
}

func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestAllowAndStatusJSON: the HTTP allow API and /status read like a JSON
// API: snake_case keys, every field present (false, zero and null too),
// numbers as numbers, objects rather than bare arrays of counts.
func TestAllowAndStatusJSON(t *testing.T) {
	httpAddr, _ := startAgent(t, "-regions", "eu,us,ap") // floors: 2 per minute of 10
	decode := func(b []byte) map[string]any {
		t.Helper()
		dec := json.NewDecoder(strings.NewReader(string(b)))
		dec.UseNumber()
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("decode %s: %v", b, err)
		}
		return m
	}
	post := func(body string) map[string]any {
		t.Helper()
		resp, err := http.Post("http://"+httpAddr+"/v1/allow", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 || resp.Header.Get("Content-Type") != "application/json" {
			t.Fatalf("/v1/allow: %d %s %s", resp.StatusCode, resp.Header.Get("Content-Type"), b)
		}
		return decode(b)
	}
	allowKeys := []string{"allowed", "reason", "remaining", "retry_after_ms", "retry_after_seconds", "reset_after_ms", "limit", "quota",
		"policy", "rule", "plan", "cost", "shadow", "fallback", "http_status", "rules_version"}
	body := `{"subject":"gina","descriptor":[{"key":"path","value":"/orders"}],"attempt_id":""}`
	var last map[string]any
	for i := 0; i < 3; i++ {
		last = post(body)
		if got := slices.Sorted(maps.Keys(last)); !slices.Equal(got, slices.Sorted(slices.Values(allowKeys))) {
			t.Fatalf("allow keys %v, want %v", got, allowKeys)
		}
	}
	want := map[string]any{"allowed": false, "reason": "over_limit", "remaining": json.Number("0"), "retry_after_ms": json.Number("30000"),
		"retry_after_seconds": json.Number("30"), "reset_after_ms": json.Number("60000"), "policy": "api", "rule": "api", "plan": "",
		"cost": json.Number("1"), "shadow": false, "fallback": "", "http_status": json.Number("0"), "rules_version": "agent-test",
		"limit": map[string]any{"count": json.Number("2"), "period_ms": json.Number("60000"), "burst": json.Number("2")},
		"quota": map[string]any{"count": json.Number("10"), "period_ms": json.Number("60000"), "burst": json.Number("10")}}
	for k, v := range want {
		got := last[k]
		if n, ok := v.(json.Number); ok && (k == "retry_after_ms" || k == "reset_after_ms") {
			// Real time passed since the denial: within a second of it.
			g, _ := got.(json.Number).Int64()
			w, _ := n.Int64()
			if g > w || g < w-1000 {
				t.Errorf("third answer %s = %v, want about %v", k, got, v)
			}
			continue
		}
		if fmt.Sprint(got) != fmt.Sprint(v) {
			t.Errorf("third answer %s = %#v, want %#v", k, got, v)
		}
	}
	// No rule: no quota applied, and the fields say so rather than vanish.
	if m := post(`{"subject":"gina","descriptor":[{"key":"endpoint","value":"none"}]}`); m["allowed"] != true || m["reason"] != "no_rule" || m["limit"] != nil || m["quota"] != nil {
		t.Errorf("no rule: %v", m)
	}
	_, st := get(t, "http://"+httpAddr+"/status")
	m := decode([]byte(st))
	statusKeys := []string{"region", "agent", "members", "speaking", "lease_live", "coordinator_auth", "allow_auth", "breaker",
		"rules_version", "lease_end", "table", "last_error", "stats"}
	if got := slices.Sorted(maps.Keys(m)); !slices.Equal(got, slices.Sorted(slices.Values(statusKeys))) {
		t.Fatalf("status keys %v, want %v", got, statusKeys)
	}
	var walk func(path string, v any)
	key := regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	walk = func(path string, v any) {
		switch v := v.(type) {
		case map[string]any:
			for k, e := range v {
				if !key.MatchString(k) {
					t.Errorf("status key %s.%s is not snake_case", path, k)
				}
				walk(path+"."+k, e)
			}
		case []any:
			for i, e := range v {
				if _, ok := e.(json.Number); ok {
					t.Errorf("status %s[%d] is a bare number in an array", path, i)
				}
				walk(fmt.Sprintf("%s[%d]", path, i), e)
			}
		}
	}
	walk("", m)
	rules := m["stats"].(map[string]any)["rules"].([]any)
	api := rules[0].(map[string]any)
	if api["rule"] != "api" || api["failure_policy"] != "fail_closed" || fmt.Sprint(api["admitted"].(map[string]any)["store"]) != "2" ||
		fmt.Sprint(api["denied"].(map[string]any)["store"]) != "1" {
		t.Errorf("status stats for api: %v", api)
	}
}
