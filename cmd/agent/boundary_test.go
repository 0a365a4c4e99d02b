package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string, header ...string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest("POST", url, strings.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestAgentBounds: the agent's HTTP and gRPC edges refuse input over their
// bounds with a status naming the field, deny an unknown RLS domain when
// told, and export what they did.
func TestAgentBounds(t *testing.T) {
	httpAddr, grpcAddr := startAgent(t, "-max-body-bytes", "4096", "-http-max-header-bytes", "8192", "-rls-unknown-domain", "deny",
		"-max-subject-bytes", "64")
	u := "http://" + httpAddr + "/v1/allow"
	if code, body := post(t, u, `{"subject":"`+strings.Repeat("s", 8000)+`"}`); code != http.StatusRequestEntityTooLarge || !strings.Contains(body, "more than 4096 bytes") {
		t.Errorf("a body over the cap: %d %s; want 413", code, body)
	}
	if code, body := post(t, u, `{"subject":"`+strings.Repeat("s", 65)+`"}`); code != http.StatusBadRequest || !strings.Contains(body, "subject has 65 bytes, more than the 64 allowed") {
		t.Errorf("a subject over the bound: %d %s; want 400 naming it", code, body)
	}
	if code, _ := post(t, u, `{"subject":"ok"}`, "X-Big", strings.Repeat("h", 20000)); code != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a header over the cap: %d; want 431", code)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := allotv1.NewAllowServiceClient(conn).Allow(context.Background(), &allotv1.AllowRequest{Subject: strings.Repeat("s", 65)}); status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "subject has 65 bytes") {
		t.Errorf("gRPC allow over the bound: %v", err)
	}
	resp, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "egde",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "path", Value: "/x"}}}}})
	if err != nil || resp.GetOverallCode() != rlsv3.RateLimitResponse_OVER_LIMIT {
		t.Errorf("RLS for an unknown domain under deny: %v, %v", resp, err)
	}
	_, metrics := get(t, "http://"+httpAddr+"/metrics")
	set, _ := rules.Parse([]byte(testRules), "x")
	for _, want := range []string{`allot_rls_unmatched_domain_total{action="denied",kind="unknown"} 1`,
		`allot_rules_info{digest="sha256:` + set.Digest()[:12] + `",version="agent-test"} 1`, `allot_rules_reload_failures_total 0`,
		`allot_agent_coordinator_auth_info{mode="none"} 1`, `allot_auth_info{api="allow",mode="none"} 1`,
		`allot_http_connections{server="agent"}`, `allot_memory_store_max_keys{store="buckets"} 1e+06`} {
		if !strings.Contains(metrics, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestAgentAllowAuth: with -allow-tokens the allow API, over HTTP and gRPC,
// serves only callers with a listed token; the RLS port stays open to
// Envoy.
func TestAgentAllowAuth(t *testing.T) {
	dir := t.TempDir()
	tokens := filepath.Join(dir, "callers")
	const gw = "gateway-a-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte("gateway-a "+gw+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	httpAddr, grpcAddr := startAgent(t, "-allow-tokens", tokens)
	u := "http://" + httpAddr + "/v1/allow"
	body := `{"subject":"erin","descriptor":[{"key":"path","value":"/x"}]}`
	if code, _ := post(t, u, body); code != http.StatusUnauthorized {
		t.Errorf("no token: %d, want 401", code)
	}
	if code, _ := post(t, u, body, "Authorization", "Bearer someone-else-0123456789"); code != http.StatusUnauthorized {
		t.Errorf("a wrong token: %d, want 401", code)
	}
	if code, b := post(t, u, body, "Authorization", "Bearer "+gw); code != 200 || !strings.Contains(b, `"allowed":true`) {
		t.Errorf("the gateway's token: %d %s", code, b)
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := allotv1.NewAllowServiceClient(conn).Allow(context.Background(), &allotv1.AllowRequest{Subject: "erin"}); status.Code(err) != codes.Unauthenticated {
		t.Errorf("gRPC allow without a token: %v; want UNAUTHENTICATED", err)
	}
	withTok, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()), grpc.WithPerRPCCredentials(auth.Bearer(gw, true)))
	if err != nil {
		t.Fatal(err)
	}
	defer withTok.Close()
	if r, err := allotv1.NewAllowServiceClient(withTok).Allow(context.Background(), &allotv1.AllowRequest{Subject: "erin"}); err != nil || r.GetReason() == allotv1.Reason_REASON_UNSPECIFIED {
		t.Errorf("gRPC allow with the token: %v, %v", r, err)
	}
	if _, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: "edge"}); err != nil {
		t.Errorf("the RLS port is for Envoy and takes no token: %v", err)
	}
	_, st := get(t, "http://"+httpAddr+"/status")
	_, metrics := get(t, "http://"+httpAddr+"/metrics")
	if !strings.Contains(st, `"allow_auth": "token"`) || !strings.Contains(metrics, `allot_auth_rejected_total{api="allow",transport="http"} 2`) ||
		!strings.Contains(metrics, `allot_auth_rejected_total{api="allow",transport="grpc"} 1`) {
		t.Errorf("status or metrics do not show the allow API's auth:\n%s\n%s", st, grepLines(metrics, "allot_auth"))
	}
}

// TestAgentCoordinatorAuth: an agent with coordinators must prove its
// region or be told -insecure; with its token over TLS it holds a lease
// from a coordinator that requires tokens; with another region's token it
// is refused and never holds one.
func TestAgentCoordinatorAuth(t *testing.T) {
	none := func(string) string { return "" }
	base := []string{"-region", "eu", "-rules", "r", "-coordinators", "127.0.0.1:1", "-regions", "eu,us"}
	if _, err := parse(base, none, io.Discard); err == nil || !strings.Contains(err.Error(), "-insecure") {
		t.Errorf("coordinators without proof: %v", err)
	}
	if _, err := parse(append(base, "-insecure"), none, io.Discard); err != nil {
		t.Errorf("coordinators with -insecure: %v", err)
	}

	dir := t.TempDir()
	ca := testenv.NewCA(t)
	caFile, _, _ := ca.WriteFiles(t, dir, "unused")
	const euTok, usTok = "eu-token-0123456789abcdef", "us-token-0123456789abcdef"
	tk, _ := auth.ParseTokens([]byte("eu "+euTok+"\nus "+usTok+"\n"), "tokens")
	set, err := rules.Parse([]byte(testRules), "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.DefaultConfig()
	cfg.Lease.Budgets = region.Budgets(set, lease.Split{Regions: []string{"eu", "us"}, Reserve: lease.DefaultReserve}, lease.MaxMin)
	// Short leases: the leader learns for TTL + 2×drift while us never
	// connects, and only then renews eu's lease.
	cfg.Lease.TTL, cfg.Lease.Refresh, cfg.Lease.Drift, cfg.Lease.Hold, cfg.Lease.DemandTTL = 2*time.Second, 500*time.Millisecond, 100*time.Millisecond, 3500*time.Millisecond, 1200*time.Millisecond
	cfg.RegionTokens, cfg.Logger = tk, slog.New(slog.DiscardHandler)
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	g := grpc.NewServer(append(coordinator.ServerOptions(), grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "coordinator", x509.ExtKeyUsageServerAuth)}, MinVersion: tls.VersionTLS12})))...)
	s.Register(g)
	go g.Serve(lis)
	defer g.Stop()

	agentWith := func(token string) *agentProc {
		f := filepath.Join(t.TempDir(), "token")
		os.WriteFile(f, []byte(token+"\n"), 0o600)
		p := launchAgent(t, testRules, "-coordinators", lis.Addr().String(), "-regions", "eu,us", "-coordinator-tls", "-tls-ca", caFile,
			"-coordinator-token-file", f, "-lease-refresh", "200ms")
		waitHealthy(t, p)
		return p
	}
	statusOf := func(p *agentProc) map[string]any {
		_, b := get(t, "http://"+p.httpAddr+"/status")
		var st map[string]any
		if err := json.Unmarshal([]byte(b), &st); err != nil {
			t.Fatalf("status %s: %v", b, err)
		}
		return st
	}
	good := agentWith(euTok)
	deadline := time.Now().Add(20 * time.Second)
	for statusOf(good)["lease_live"] != true {
		if time.Now().After(deadline) {
			t.Fatalf("the agent with its region's token holds no lease: %v", statusOf(good))
		}
		time.Sleep(50 * time.Millisecond) // the agent settles, speaks and is granted
	}
	if st := statusOf(good); st["coordinator_auth"] != "token" {
		t.Errorf("status coordinator_auth = %v, want token", st["coordinator_auth"])
	}
	// Another agent naming eu with us's token is refused by the coordinator.
	refused := func() bool {
		rec := httptest.NewRecorder()
		s.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
		return !strings.Contains(rec.Body.String(), `allot_coordinator_stream_refusals_total{reason="unauthenticated"} 0`)
	}
	bad := agentWith(usTok)
	for deadline := time.Now().Add(20 * time.Second); !refused(); {
		if time.Now().After(deadline) {
			t.Fatal("the coordinator never refused the agent with us's token")
		}
		time.Sleep(50 * time.Millisecond) // the agent settles and speaks
	}
	if st := statusOf(bad); st["lease_live"] == true {
		t.Errorf("an agent with another region's token holds a lease: %v", st)
	}
	for _, v := range s.Status(0).Regions {
		if v.Region == "eu" && (!v.Connected || !v.Authenticated) {
			t.Errorf("eu's stream after the impostor: %+v", v)
		}
	}
	_, metrics := get(t, "http://"+good.httpAddr+"/metrics")
	if !strings.Contains(metrics, `allot_agent_coordinator_auth_info{mode="token"} 1`) {
		t.Errorf("/metrics lacks the coordinator auth mode:\n%s", grepLines(metrics, "auth"))
	}
}

// TestAgentCoordinatorCA: -coordinator-ca trusts a CA for the coordinator
// link alone. An agent with its region's certificate and -coordinator-ca
// holds a lease over mutual TLS while its own HTTPS server still serves a
// client without a certificate (a kubelet probe, Prometheus); with -tls-ca
// instead, as before, it holds a lease too but its server requires a
// client certificate.
func TestAgentCoordinatorCA(t *testing.T) {
	none := func(string) string { return "" }
	if _, err := parse([]string{"-region", "eu", "-rules", "r", "-coordinator-ca", "ca.pem"}, none, io.Discard); err == nil ||
		!strings.Contains(err.Error(), `-coordinator-ca="ca.pem" needs -coordinator-tls`) {
		t.Errorf("-coordinator-ca without -coordinator-tls: %v", err)
	}

	ca := testenv.NewCA(t)
	caFile, euCert, euKey := ca.WriteFiles(t, t.TempDir(), "eu")
	_, usCert, usKey := ca.WriteFiles(t, t.TempDir(), "us")
	set, err := rules.Parse([]byte(testRules), "rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	cfg := coordinator.DefaultConfig()
	cfg.Lease.Budgets = region.Budgets(set, lease.Split{Regions: []string{"eu", "us"}, Reserve: lease.DefaultReserve}, lease.MaxMin)
	cfg.Lease.TTL, cfg.Lease.Refresh, cfg.Lease.Drift, cfg.Lease.Hold, cfg.Lease.DemandTTL = 2*time.Second, 500*time.Millisecond, 100*time.Millisecond, 3500*time.Millisecond, 1200*time.Millisecond
	cfg.RequireClientCert, cfg.Logger = true, slog.New(slog.DiscardHandler)
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.Run(ctx)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	g := grpc.NewServer(append(coordinator.ServerOptions(), grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "coordinator", x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12})))...)
	s.Register(g)
	go g.Serve(lis)
	defer g.Stop()

	// A client that trusts the CA and presents no certificate.
	probe := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}}}
	status := func(p *agentProc) (map[string]any, error) {
		res, err := probe.Get("https://" + p.httpAddr + "/status")
		if err != nil {
			return nil, err
		}
		defer res.Body.Close()
		var st map[string]any
		return st, json.NewDecoder(res.Body).Decode(&st)
	}
	common := []string{"-coordinators", lis.Addr().String(), "-regions", "eu,us", "-coordinator-tls", "-lease-refresh", "200ms"}
	eu := launchAgent(t, testRules, append(common, "-tls-cert", euCert, "-tls-key", euKey, "-coordinator-ca", caFile)...)
	us := launchAgent(t, testRules, append(common, "-region", "us", "-name", "us-1", "-tls-cert", usCert, "-tls-key", usKey, "-tls-ca", caFile)...)

	var st map[string]any
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) { // the agent settles, speaks and is granted
		if st, err = status(eu); err == nil && st["lease_live"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent with -coordinator-ca: no lease, or its server refuses a client without a certificate: %v %v", st, err)
		}
	}
	if st["coordinator_auth"] != "mtls" {
		t.Errorf("status coordinator_auth = %v, want mtls", st["coordinator_auth"])
	}
	if _, err := status(us); err == nil {
		t.Error("the agent with -tls-ca served a client without a certificate")
	}
	usClient := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool,
		Certificates: []tls.Certificate{ca.Issue(t, "prometheus", x509.ExtKeyUsageClientAuth)}, MinVersion: tls.VersionTLS12}}}
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		st = nil
		res, err := usClient.Get("https://" + us.httpAddr + "/status")
		if err == nil {
			err = json.NewDecoder(res.Body).Decode(&st)
			res.Body.Close()
		}
		if err == nil && st["lease_live"] == true {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the agent with -tls-ca holds no lease: %v %v", st, err)
		}
	}
	for _, v := range s.Status(0).Regions {
		if !v.Connected || !v.Authenticated {
			t.Errorf("region %s's stream: %+v; want connected and authenticated", v.Region, v)
		}
	}
}
