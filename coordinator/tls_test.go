package coordinator

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"log/slog"
	"math/big"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "allot test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

func (ca *testCA) issue(t *testing.T, cn string, serial int64, server bool) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestMutualTLS: under mutual TLS the client certificate names the region;
// a region cannot speak for another, and a client without a certificate is
// refused.
func TestMutualTLS(t *testing.T) {
	ca := newCA(t)
	clk := clock.NewManual(t0)
	cfg := DefaultConfig()
	cfg.Lease.Budgets = testBudgets()
	cfg.Clock = clk
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.RequireClientCert = true
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	lis, _ := net.Listen("tcp", "127.0.0.1:0")
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.issue(t, "coordinator", 2, true)},
		ClientCAs:    ca.pool, ClientAuth: tls.RequireAndVerifyClientCert, MinVersion: tls.VersionTLS12,
	})))
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	defer g.Stop()
	addr := lis.Addr().String()

	dial := func(region, certName string) (*Stream, error) {
		tc := &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12}
		if certName != "" {
			tc.Certificates = []tls.Certificate{ca.issue(t, certName, 3, false)}
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
