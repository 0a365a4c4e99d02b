package coordinator

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/leasetest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
)

const (
	tokA = "a-0123456789abcdef0123"
	tokB = "b-0123456789abcdef0123"
	tokC = "c-0123456789abcdef0123"
)

func regionTokens(t *testing.T) *auth.Tokens {
	t.Helper()
	tk, err := auth.ParseTokens([]byte("a "+tokA+"\nb "+tokB+"\nc "+tokC+"\n"), "tokens")
	if err != nil {
		t.Fatal(err)
	}
	return tk
}

// startTLS serves s over TLS on a loopback port. clientAuth is what the TLS
// layer asks of clients; VerifyClientCertIfGiven leaves the decision about
// a missing certificate to the Server, which is what these tests are about.
func startTLS(t *testing.T, s *Server, ca *testenv.CA, clientAuth tls.ClientAuthType) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(append(ServerOptions(), grpc.Creds(credentials.NewTLS(&tls.Config{
		Certificates: []tls.Certificate{ca.Issue(t, "coordinator", x509.ExtKeyUsageServerAuth)},
		ClientCAs:    ca.Pool, ClientAuth: clientAuth, MinVersion: tls.VersionTLS12,
	})))...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

// dialer makes clients of one coordinator, as region, with an optional
// client certificate (issued by ca) and token.
type dialer struct {
	t    *testing.T
	addr string
	ca   *testenv.CA
}

func (d dialer) client(region string, cert *testenv.CA, certName, token string) *Client {
	d.t.Helper()
	tc := &tls.Config{RootCAs: d.ca.Pool, MinVersion: tls.VersionTLS12}
	if certName != "" {
		tc.Certificates = []tls.Certificate{cert.Issue(d.t, certName, x509.ExtKeyUsageClientAuth)}
	}
	cfg := ClientConfig{Addrs: []string{d.addr}, Region: region, TLS: tc, ConnectTimeout: 5 * time.Second}
	if token != "" {
		cfg.Credentials = auth.Bearer(token, false)
	}
	c, err := NewClient(cfg)
	if err != nil {
		d.t.Fatal(err)
	}
	d.t.Cleanup(func() { c.Close() })
	return c
}

// attempt opens a stream with c, says hello for session and returns the
// error that ends it (nil if the stream was served a grant).
func attempt(t *testing.T, c *Client, session uint64) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := c.Connect(ctx)
	if err != nil {
		return err
	}
	defer st.Close()
	// A stream admitted but never answered must not hang the test: closing
	// it ends the Recv below with CANCELED, which no caller expects.
	stop := time.AfterFunc(10*time.Second, func() { st.Close() })
	defer stop.Stop()
	if err := st.Send(lease.Message{Type: lease.MsgHello, Session: session, Seq: 1}); err != nil {
		_, err = st.Recv()
		return err
	}
	_, err = st.Recv()
	return err
}

// honest runs region a over c, driven as an agent drives it
// (internal/leasetest), and drives the clock until a holds at least 300 of
// key k, which only a live lease gives it: b and c never connect, so once
// learning ends a gets the reserve (200) above its floor (133), the floors
// of regions that never reported staying theirs.
type honest struct {
	r   *leasetest.Region
	s   *Server
	clk *clock.Manual
	k   bucket.Key
}

func startHonest(t *testing.T, s *Server, clk *clock.Manual, c *Client) *honest {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	r := leasetest.Start(t, ctx, clk, "a", testBudgets(), c,
		leasetest.Options{Tick: 100 * time.Millisecond, Redial: 20 * time.Millisecond, Seed: 4242})
	x := &honest{r: r, s: s, clk: clk, k: bucket.Key{Rule: "api", Subject: "t1"}}
	r.Demand(x.k, 500)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	x.step(t, 400, func() bool { return x.alloc() >= 300 })
	return x
}

func (x *honest) alloc() bucket.Tokens { return x.r.Allocation(x.k).Count() }

// step advances the clock by 100 ms at a time, a tick of a's client,
// waiting until its round is done, until cond holds; it fails after max
// steps.
func (x *honest) step(t *testing.T, max int, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for range max {
		x.clk.Advance(100 * time.Millisecond)
		x.s.Tick()
		if err := x.clk.WaitForTimers(ctx, 1); err != nil {
			t.Fatalf("a's client did not finish its round: %v", err)
		}
		time.Sleep(3 * time.Millisecond) // lets the stream carry messages; lease time is the manual clock
		if cond() {
			return
		}
	}
	t.Fatalf("condition not met after %d steps", max)
}

// holds checks that a's stream is the one the coordinator serves, that it
// proved its region, and that a's lease lives with its 300 or more.
func (x *honest) holds(t *testing.T, when string) {
	t.Helper()
	live := x.r.Status().Live
	var view RegionView
	for _, v := range x.s.Status(0).Regions {
		if v.Region == "a" {
			view = v
		}
	}
	if !live || !view.Connected || !view.Authenticated || x.alloc() < 300 {
		t.Fatalf("%s: a's lease live %v, stream connected %v authenticated %v, allocation %d; want its authenticated stream and ≥ 300",
			when, live, view.Connected, view.Authenticated, x.alloc())
	}
}

// impersonate makes n attempts with c while a's client keeps running, and
// checks each fails with code and that a keeps its stream and lease.
func (x *honest) impersonate(t *testing.T, what string, c *Client, n int, code codes.Code) {
	t.Helper()
	for i := range n {
		err := attempt(t, c, uint64(9000+i))
		if status.Code(err) != code {
			t.Fatalf("%s, attempt %d: %v; want %s", what, i, err, code)
		}
		x.step(t, 1, func() bool { return true })
		x.holds(t, what)
	}
}

// TestImpersonationToken: regions prove themselves with tokens over TLS.
// A client naming region a with b's token, a wrong token or none is
// refused; a client with a's own token (a second agent, or a stolen token)
// cannot take a's live stream; through 40 such attempts a's stream stays
// up and keeps its lease.
func TestImpersonationToken(t *testing.T) {
	ca := testenv.NewCA(t)
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "", func(c *Config) { c.RegionTokens, c.Insecure = regionTokens(t), false })
	d := dialer{t, startTLS(t, s, ca, tls.NoClientCert), ca}
	x := startHonest(t, s, clk, d.client("a", nil, "", tokA))
	x.holds(t, "before")
	x.impersonate(t, "b's token naming a", d.client("a", nil, "", tokB), 10, codes.Unauthenticated)
	x.impersonate(t, "a wrong token", d.client("a", nil, "", "not-a-token-of-anyone-0123"), 10, codes.Unauthenticated)
	x.impersonate(t, "no token", d.client("a", nil, "", ""), 10, codes.Unauthenticated)
	x.impersonate(t, "a's token, another session", d.client("a", nil, "", tokA), 10, codes.AlreadyExists)
	st := s.Status(0)
	if st.Auth != "token" {
		t.Errorf("auth mode %q, want token", st.Auth)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.counts
	if n.refused["unauthenticated"] != 30 || n.refused["held"] != 10 || n.takeovers["silent"]+n.takeovers["same-session"] != 0 {
		t.Errorf("refusals %v, takeovers %v; want 30 unauthenticated, 10 held, no takeover", n.refused, n.takeovers)
	}
}

// TestImpersonationMTLS: regions prove themselves with client
// certificates. A certificate for b naming a, no certificate, and a
// certificate for a from another CA are refused; a second client with a's
// certificate cannot take a's live stream.
func TestImpersonationMTLS(t *testing.T) {
	ca, other := testenv.NewCA(t), testenv.NewCA(t)
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "", func(c *Config) { c.RequireClientCert, c.Insecure = true, false })
	d := dialer{t, startTLS(t, s, ca, tls.VerifyClientCertIfGiven), ca}
	x := startHonest(t, s, clk, d.client("a", ca, "a", ""))
	x.holds(t, "before")
	x.impersonate(t, "b's certificate naming a", d.client("a", ca, "b", ""), 10, codes.PermissionDenied)
	x.impersonate(t, "no certificate", d.client("a", nil, "", ""), 10, codes.Unauthenticated)
	x.impersonate(t, "a's name from another CA", d.client("a", other, "a", ""), 5, codes.Unavailable) // the TLS handshake fails
	x.impersonate(t, "a's certificate, another session", d.client("a", ca, "a", ""), 10, codes.AlreadyExists)
	if st := s.Status(0); st.Auth != "mtls" {
		t.Errorf("auth mode %q, want mtls", st.Auth)
	}
}

// TestTakeover: a stream of region a may take the place of a's stream when
// it continues the same session (the Holder reconnecting) or when a's
// stream has been silent for TakeoverAfter; a stream that proves nothing
// never takes an authenticated stream's place; and a takeover, once made,
// is not undone before the new stream has itself been silent that long.
func TestTakeover(t *testing.T) {
	ca := testenv.NewCA(t)
	clk := clock.NewManual(t0)
	// Insecure with tokens: a migration, where both kinds of stream exist.
	s := newTestServer(t, clk, "", func(c *Config) { c.RegionTokens, c.Insecure = regionTokens(t), true })
	d := dialer{t, startTLS(t, s, ca, tls.NoClientCert), ca}
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	withToken, without := d.client("a", nil, "", tokA), d.client("a", nil, "", "")
	seq := uint64(0)
	open := func(c *Client, session uint64) lease.Stream {
		t.Helper()
		st, err := c.Connect(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		seq++ // a reconnecting Holder's hello comes after its earlier messages
		if err := st.Send(lease.Message{Type: lease.MsgHello, Session: session, Seq: seq}); err != nil {
			t.Fatal(err)
		}
		return st
	}
	served := func(st lease.Stream) {
		t.Helper()
		for range 50 {
			clk.Advance(10 * time.Millisecond)
			s.Tick()
		}
		if m, err := st.Recv(); err != nil || m.Type != lease.MsgGrant {
			t.Fatalf("stream not served: %v, %v", m, err)
		}
	}
	first := open(withToken, 1)
	served(first)
	if err := attempt(t, withToken, 2); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("another session while the first speaks: %v; want AlreadyExists", err)
	}
	// The same session again (its Holder reconnecting): served at once, and
	// the old stream is told to go.
	again := open(withToken, 1)
	served(again)
	if _, err := recvUntilEnd(first); !errors.Is(err, ErrRedirected) {
		t.Fatalf("the replaced stream ended with %v; want a redirect", err)
	}
	// Silent for less than TakeoverAfter (2 × refresh = 6 s): still held.
	clk.Advance(5 * time.Second)
	if err := attempt(t, withToken, 3); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("after 5 s of silence: %v; want AlreadyExists", err)
	}
	// Past it, a stream that proves nothing still may not take its place,
	// one with a's token may.
	clk.Advance(2 * time.Second)
	if err := attempt(t, without, 4); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("an unauthenticated stream after silence: %v; want AlreadyExists", err)
	}
	third := open(withToken, 5)
	served(third)
	if _, err := recvUntilEnd(again); !errors.Is(err, ErrRedirected) {
		t.Fatalf("the silent stream ended with %v; want a redirect", err)
	}
	// The new stream is not displaced at once by the session it displaced.
	if err := attempt(t, withToken, 1); status.Code(err) != codes.AlreadyExists {
		t.Fatalf("the displaced session coming back at once: %v; want AlreadyExists", err)
	}
	s.mu.Lock()
	n := s.counts
	s.mu.Unlock()
	if n.takeovers["same-session"] != 1 || n.takeovers["silent"] != 1 || n.refused["held"] != 4 {
		t.Errorf("takeovers %v, refusals %v; want 1 same-session, 1 silent, 4 held", n.takeovers, n.refused)
	}
	// The metrics and the status page say how regions authenticate.
	rec := httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/metrics", nil))
	for _, want := range []string{`allot_coordinator_auth_info{mode="insecure"} 1`, `allot_coordinator_stream_takeovers_total{cause="silent"} 1`,
		`allot_coordinator_stream_refusals_total{reason="held"} 4`} {
		if !strings.Contains(rec.Body.String(), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
	rec = httptest.NewRecorder()
	s.Handler(nil).ServeHTTP(rec, httptest.NewRequest("GET", "/status", nil))
	if !strings.Contains(rec.Body.String(), "insecure — regions are accepted by name alone") {
		t.Errorf("/status does not warn of the insecure mode")
	}
}

// recvUntilEnd reads st until it ends.
func recvUntilEnd(st lease.Stream) (lease.Message, error) {
	for {
		m, err := st.Recv()
		if err != nil {
			return m, err
		}
	}
}

// TestInsecureHeldStream: even with no proof at all, a client that
// reconnects in a loop naming a region does not take the live stream of the
// region's agent (it did: 29 reconnects in 15 s left the agent on its
// floors).
func TestInsecureHeldStream(t *testing.T) {
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "")
	addr := startServer(t, s)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	regions := startRegions(t, ctx, clk, []string{addr}, "a")
	k := bucket.Key{Rule: "api", Subject: "t1"}
	regions["a"].Demand(k, 500)
	want := func() bool {
		return regions["a"].Allocation(k).Count() >= 300 // floor 133 + reserve 200: b and c never connect
	}
	drive(t, clk, []*Server{s}, regions, k, 400, want)
	impostor, err := NewClient(ClientConfig{Addrs: []string{addr}, Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer impostor.Close()
	for i := range 29 {
		if err := attempt(t, impostor, uint64(100+i)); status.Code(err) != codes.AlreadyExists {
			t.Fatalf("reconnect %d: %v; want AlreadyExists", i, err)
		}
		drive(t, clk, []*Server{s}, regions, k, 1, func() bool { return true })
		live := regions["a"].Status().Live
		if !live || !want() {
			t.Fatalf("after reconnect %d the real region lost its lease (live %v, allocation %d)", i, live, regions["a"].Allocation(k).Count())
		}
	}
}
