package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
)

// TestMutualTLS: under mutual TLS the client certificate names the region;
// a region cannot speak for another, and a client without a certificate is
// refused.
func TestMutualTLS(t *testing.T) {
	ca := testenv.NewCA(t)
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "", func(cfg *Config) { cfg.RequireClientCert, cfg.Insecure = true, false })
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "coordinator", x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	addr := lis.Addr().String()

	dial := func(region, certName string) (lease.Stream, error) {
		tc := &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}
		if certName != "" {
			tc.Certificates = []tls.Certificate{ca.Issue(t, certName, x509.ExtKeyUsageClientAuth)}
		}
		c, err := NewClient(ClientConfig{Addrs: []string{addr}, Region: region, TLS: tc})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c.Connect(context.Background())
	}
	// A region with its own certificate is served.
	st, err := dial("a", "a")
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Send(lease.Message{Type: lease.MsgHello, Session: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	for range 50 {
		clk.Advance(100 * time.Millisecond)
		s.Tick()
	}
	if m, err := st.Recv(); err != nil || m.Type != lease.MsgGrant || m.Region != "a" {
		t.Fatalf("region a over mTLS got %v, %v; want its grant", m, err)
	}
	st.Close()
	// Region b's certificate claiming to be a is refused.
	if st, err := dial("a", "b"); err == nil {
		if _, err := st.Recv(); err == nil {
			t.Fatal("a certificate for b was allowed to speak for a")
		}
	}
	// No certificate: the handshake fails.
	if st, err := dial("a", ""); err == nil {
		if _, err := st.Recv(); err == nil {
			t.Fatal("a client without a certificate was served")
		}
	}
}
