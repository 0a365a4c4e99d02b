package auth_test

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/internal/testenv"
)

const (
	tokUS    = "us-0123456789abcdef"
	tokUSNew = "us-fedcba9876543210"
	tokEU    = "eu-0123456789abcdef"
)

func digest(s string) string {
	d := sha256.Sum256([]byte(s))
	return "sha256:" + hex.EncodeToString(d[:])
}

func TestTokens(t *testing.T) {
	file := "# regions\nus " + tokUS + "\n\nus " + digest(tokUSNew) + "   \neu " + tokEU + "\n"
	tk, err := auth.ParseTokens([]byte(file), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name, token string
		want        bool
	}{
		{"us", tokUS, true}, {"us", tokUSNew, true}, // old and new while rotating
		{"eu", tokEU, true},
		{"us", tokEU, false}, {"eu", tokUS, false}, // another region's token
		{"us", tokUS + "x", false}, {"us", "", false}, {"ap", tokUS, false},
	} {
		if got := tk.Verify(c.name, c.token); got != c.want {
			t.Errorf("Verify(%q, %q) = %v, want %v", c.name, c.token, got, c.want)
		}
	}
	if name, ok := tk.Lookup(tokUSNew); !ok || name != "us" {
		t.Errorf("Lookup(new us token) = %q, %v", name, ok)
	}
	if got := strings.Join(tk.Names(), ","); got != "eu,us" {
		t.Errorf("Names = %s", got)
	}
	_, err = auth.ParseTokens([]byte("us short\neu\nap sha256:abcd\n"), "bad")
	for _, want := range []string{"bad:1: name \"us\": token has 5 bytes, fewer than the 16 required", "bad:2: want", "bad:3: name \"ap\": sha256: wants 64 hex digits"} {
		if !errors.Is(err, auth.ErrInvalidTokens) || !strings.Contains(err.Error(), want) {
			t.Errorf("bad file: %v; want %q", err, want)
		}
	}
	if _, err := auth.ParseTokens([]byte("# nothing\n"), "empty"); err == nil {
		t.Error("a file without tokens was accepted")
	}
	dir := t.TempDir()
	p := filepath.Join(dir, "token")
	os.WriteFile(p, []byte(tokUS+"\n"), 0o600)
	if tok, err := auth.ReadToken(p); err != nil || tok != tokUS {
		t.Errorf("ReadToken = %q, %v", tok, err)
	}
	os.WriteFile(p, []byte("two words-of-token-text\n"), 0o600)
	if _, err := auth.ReadToken(p); err == nil {
		t.Error("ReadToken accepted a file with a space")
	}
}

// TestCallersOverGRPC: the allow API's guard over real gRPC on loopback
// with TLS: a listed token or an allowed certificate is served; no token,
// a wrong token, or a certificate from the same CA with another name is
// UNAUTHENTICATED; a service not named passes untouched.
func TestCallersOverGRPC(t *testing.T) {
	ca := testenv.NewCA(t)
	tk, _ := auth.ParseTokens([]byte("gw-a "+tokUS+"\n"), "callers")
	callers := auth.NewCallers("allow", tk, []string{"gw-b"})
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "agent", x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12,
	})), grpc.UnaryInterceptor(callers.UnaryServerInterceptor("grpc.health.v1.Health")))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	go g.Serve(lis)
	defer g.Stop()

	call := func(cert string, creds credentials.PerRPCCredentials) error {
		tc := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
		if cert != "" {
			tc.Certificates = []tls.Certificate{ca.Issue(t, cert, x509.ExtKeyUsageClientAuth)}
		}
		opts := []grpc.DialOption{grpc.WithTransportCredentials(credentials.NewTLS(tc))}
		if creds != nil {
			opts = append(opts, grpc.WithPerRPCCredentials(creds))
		}
		conn, err := grpc.NewClient(lis.Addr().String(), opts...)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		_, err = healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{})
		return err
	}
	for _, c := range []struct {
		name  string
		cert  string
		creds credentials.PerRPCCredentials
		ok    bool
	}{
		{"listed token", "", auth.Bearer(tokUS, false), true},
		{"allowed certificate", "gw-b", nil, true},
		{"no credentials", "", nil, false},
		{"wrong token", "", auth.Bearer(tokEU, false), false},
		{"certificate with another name", "envoy", nil, false},
	} {
		err := call(c.cert, c.creds)
		if c.ok && err != nil || !c.ok && status.Code(err) != codes.Unauthenticated {
			t.Errorf("%s: %v", c.name, err)
		}
	}
	// The interceptor guards only the services named.
	g2 := grpc.NewServer(grpc.UnaryInterceptor(callers.UnaryServerInterceptor("allot.allot.v1.AllowService")))
	healthpb.RegisterHealthServer(g2, health.NewServer())
	lis2, _ := net.Listen("tcp", "127.0.0.1:0")
	go g2.Serve(lis2)
	defer g2.Stop()
	conn, _ := grpc.NewClient(lis2.Addr().String(), grpc.WithTransportCredentials(insecureCreds()))
	defer conn.Close()
	if _, err := healthpb.NewHealthClient(conn).Check(context.Background(), &healthpb.HealthCheckRequest{}); err != nil {
		t.Errorf("a service not guarded was refused: %v", err)
	}
	// A token over a connection without TLS is refused by the client.
	if conn3, err := grpc.NewClient(lis2.Addr().String(), grpc.WithTransportCredentials(insecureCreds()), grpc.WithPerRPCCredentials(auth.Bearer(tokUS, false))); err == nil {
		defer conn3.Close()
		if _, err := healthpb.NewHealthClient(conn3).Check(context.Background(), &healthpb.HealthCheckRequest{}); err == nil {
			t.Error("a bearer token was sent without TLS")
		}
	}
}

// TestCallersOverHTTP: the same rules for the HTTP API, 401 with a Bearer
// challenge.
func TestCallersOverHTTP(t *testing.T) {
	ca := testenv.NewCA(t)
	tk, _ := auth.ParseTokens([]byte("gw-a "+tokUS+"\n"), "callers")
	callers := auth.NewCallers("allow", tk, []string{"gw-b"})
	srv := httptest.NewUnstartedServer(callers.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })))
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{ca.Issue(t, "agent", x509.ExtKeyUsageServerAuth)},
		ClientCAs: ca.Pool, ClientAuth: tls.VerifyClientCertIfGiven, MinVersion: tls.VersionTLS12}
	srv.StartTLS()
	defer srv.Close()
	get := func(cert, token string) int {
		tc := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
		if cert != "" {
			tc.Certificates = []tls.Certificate{ca.Issue(t, cert, x509.ExtKeyUsageClientAuth)}
		}
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
		req, _ := http.NewRequest("POST", srv.URL+"/v1/allow", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == 401 && resp.Header.Get("WWW-Authenticate") == "" {
			t.Error("401 without a challenge")
		}
		return resp.StatusCode
	}
	for _, c := range []struct {
		cert, token string
		want        int
	}{{"", tokUS, 200}, {"gw-b", "", 200}, {"", "", 401}, {"", tokEU, 401}, {"envoy", "", 401}} {
		if got := get(c.cert, c.token); got != c.want {
			t.Errorf("cert %q token %q: %d, want %d", c.cert, c.token, got, c.want)
		}
	}
	if m := callers.Mode(); m != "token+cert" {
		t.Errorf("Mode = %s", m)
	}
	if auth.NewCallers("x", nil, nil).Mode() != "none" || !auth.NewCallers("x", nil, nil).Open() {
		t.Error("Callers with nothing set should be open")
	}
}

func insecureCreds() credentials.TransportCredentials { return insecure.NewCredentials() }
