package coordinator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http/httptest"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/leaselog"
	"github.com/allot-dev/allot/internal/leasetest"
	"github.com/allot-dev/allot/lease"
)

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testBudgets() []lease.Budget {
	return []lease.Budget{{Rule: "api", Limit: bucket.PerMinute(600).WithBurst(60), Regions: []string{"a", "b", "c"}, Reserve: lease.DefaultReserve}}
}

// startServer serves s on a loopback port and returns its address.
func startServer(t *testing.T, s *Server) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(ServerOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return lis.Addr().String()
}

func newTestServer(t *testing.T, clk clock.Clock, advertise string, opts ...func(*Config)) *Server {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Lease.Budgets = testBudgets()
	cfg.Clock = clk
	cfg.Logger = slog.New(slog.DiscardHandler)
	cfg.Advertise = advertise
	cfg.Insecure = true // tests of the protocol; auth_test.go tests the proofs
	for _, o := range opts {
		o(&cfg)
	}
	s, err := NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// startRegions runs a region per name over a Client to addrs, each driven
// as an agent drives its end of the protocol (internal/leasetest), with a
// tick of 100 ms on clk.
func startRegions(t *testing.T, ctx context.Context, clk clock.Clock, addrs []string, names ...string) map[string]*leasetest.Region {
	t.Helper()
	out := map[string]*leasetest.Region{}
	for i, n := range names {
		c, err := NewClient(ClientConfig{Addrs: addrs, Region: n, ConnectTimeout: time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		out[n] = leasetest.Start(t, ctx, clk, n, testBudgets(), c,
			leasetest.Options{Tick: 100 * time.Millisecond, Redial: 20 * time.Millisecond, Seed: uint64(i + 1)})
	}
	return out
}

// drive advances the manual clock a tick at a time, waiting until every
// region's client has done its round (its timer is pending again) and
// giving the streams a moment of real time to carry the messages, until
// cond holds, checking I1 on the regions' side at every step. It fails
// after max steps.
func drive(t *testing.T, clk *clock.Manual, servers []*Server, regions map[string]*leasetest.Region, k bucket.Key, max int, cond func() bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for i := range max {
		clk.Advance(100 * time.Millisecond)
		for _, s := range servers {
			s.Tick()
		}
		if err := clk.WaitForTimers(ctx, len(regions)); err != nil {
			t.Fatalf("step %d: the regions' clients did not finish their rounds: %v", i, err)
		}
		time.Sleep(3 * time.Millisecond) // real gRPC carries the messages; lease time is the manual clock
		var sum bucket.Tokens
		for _, r := range regions {
			sum += r.Allocation(k).Count()
		}
		if sum > 600 {
			t.Fatalf("step %d: regions hold %d > budget 600", i, sum)
		}
		if cond() {
			return
		}
	}
	t.Fatalf("condition not met after %d steps", max)
}

// TestFirstLeaderStatus: the status says whether the leader leads as the
// cluster's first (its reserves started full), and a later term does not
// inherit it.
func TestFirstLeaderStatus(t *testing.T) {
	s := newTestServer(t, clock.NewManual(t0), "")
	if err := s.becomeLeader(1, true); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(0); !st.Leading || !st.First {
		t.Fatalf("after becomeLeader(1, true): leading %v, first %v; want both", st.Leading, st.First)
	}
	if err := s.BecomeLeader(2); err != nil {
		t.Fatal(err)
	}
	if st := s.Status(0); !st.Leading || st.First {
		t.Fatalf("after BecomeLeader: leading %v, first %v; want leading, not first", st.Leading, st.First)
	}
}

// TestStandalone: three regions on real gRPC over loopback reach a
// standalone leader through an address list whose first entry is dead; the
// busy region receives most of the budget once learning ends.
func TestStandalone(t *testing.T) {
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "")
	addr := startServer(t, s)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	regions := startRegions(t, ctx, clk, []string{deadAddr, addr}, "a", "b", "c")
	k := bucket.Key{Rule: "api", Subject: "t1"}
	regions["a"].Demand(k, 500)
	drive(t, clk, []*Server{s}, regions, k, 400, func() bool {
		regions["a"].Demand(k, 500)
		return regions["a"].Allocation(k).Count() >= 500
	})
}

// TestRedirect: a follower redirects regions to the leader it names.
func TestRedirect(t *testing.T) {
	clk := clock.NewManual(t0)
	leader := newTestServer(t, clk, "")
	leaderAddr := startServer(t, leader)
	follower := newTestServer(t, clk, "")
	followerAddr := startServer(t, follower)
	if err := leader.BecomeLeader(7); err != nil {
		t.Fatal(err)
	}
	follower.StepDown(leaderAddr)
	c, err := NewClient(ClientConfig{Addrs: []string{followerAddr}, Region: "a"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx := context.Background()
	st, err := c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err == nil || c.Leader() != leaderAddr {
		t.Fatalf("Recv from follower = %v, leader hint %q; want a redirect to %q", err, c.Leader(), leaderAddr)
	}
	st.Close()
	st, err = c.Connect(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	if got := st.(*Stream).Addr(); got != leaderAddr {
		t.Fatalf("second stream reaches %s, want the leader %s", got, leaderAddr)
	}
	if err := st.Send(lease.Message{Type: lease.MsgHello, Region: "a", Session: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	for range 100 {
		clk.Advance(100 * time.Millisecond)
		leader.Tick()
	}
	m, err := st.Recv()
	if err != nil || m.Type != lease.MsgGrant || m.Term != 7 {
		t.Fatalf("leader answered %v, %v; want a grant of term 7", m, err)
	}
}

// leaderStream starts a test server that leads term 1 and returns a
// stream to it as region, closed when the test ends, with the server and
// its address.
func leaderStream(t *testing.T, region string) (*Server, lease.Stream, string) {
	t.Helper()
	s := newTestServer(t, clock.NewManual(t0), "")
	addr := startServer(t, s)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	c, err := NewClient(ClientConfig{Addrs: []string{addr}, Region: region})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	st, err := c.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	return s, st, addr
}

// TestIdentity: a region may not speak for another.
func TestIdentity(t *testing.T) {
	_, st, addr := leaderStream(t, "a")
	if err := st.Send(lease.Message{Type: lease.MsgHello, Region: "b", Session: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Recv(); err == nil {
		t.Fatal("a stream of region a speaking for b was not closed")
	}
	c2, _ := NewClient(ClientConfig{Addrs: []string{addr}, Region: "nowhere"})
	defer c2.Close()
	st2, err := c2.Connect(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	_ = st2.Send(lease.Message{Type: lease.MsgHello, Session: 1, Seq: 1})
	if _, err := st2.Recv(); err == nil {
		t.Fatal("a region no budget names was served")
	}
}

// TestStatusAndMetrics: the status page, JSON, health and metrics answer
// with the allocation the regions hold.
func TestStatusAndMetrics(t *testing.T) {
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "")
	addr := startServer(t, s)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	regions := startRegions(t, ctx, clk, []string{addr}, "a", "b", "c")
	k := bucket.Key{Rule: "api", Subject: "t1"}
	drive(t, clk, []*Server{s}, regions, k, 400, func() bool {
		regions["a"].Demand(k, 500)
		return regions["a"].Allocation(k).Count() >= 500
	})
	h := s.Handler(nil)
	get := func(path string) (int, string) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Code, rec.Body.String()
	}
	for _, tc := range []struct{ path, want string }{
		{"/healthz", "ok"},
		{"/readyz", "ok"},
		{"/status", "api/t1"},
		{"/status.json", `"Leading":true`},
		// 500 wanted and the headroom a burst of a tenth of the count
		// needs against noise: 16 × 600/(2 × 60) (lease.Config.NoiseHeadroom).
		{"/metrics", `allot_coordinator_allocation{budget="api",region="a"} 580`},
		{"/metrics", "allot_coordinator_leader 1"},
	} {
		code, body := get(tc.path)
		if code != 200 || !strings.Contains(body, tc.want) {
			t.Errorf("GET %s = %d, body lacks %q:\n%.2000s", tc.path, code, tc.want, body)
		}
	}
	// Every hot key's claims: one per region, none below its allocation.
	_, js := get("/status.json")
	var st struct {
		Keys []struct {
			Counts, Claims []int64
		}
	}
	if err := json.Unmarshal([]byte(js), &st); err != nil || len(st.Keys) == 0 {
		t.Fatalf("status.json: %v, %d keys", err, len(st.Keys))
	}
	for _, k := range st.Keys {
		if len(k.Claims) != len(k.Counts) {
			t.Fatalf("claims %v for counts %v", k.Claims, k.Counts)
		}
		for i := range k.Counts {
			if k.Claims[i] < k.Counts[i] {
				t.Errorf("claim %d below allocation %d", k.Claims[i], k.Counts[i])
			}
		}
	}
	// b and c lent their floors to a: what that took from their full
	// buckets (agent.LeaseClient settling in its store) came back with
	// their acknowledgements over gRPC, into the key's stored reserve.
	_, m := get("/metrics")
	var returned float64
	for _, l := range strings.Split(m, "\n") {
		if v, ok := strings.CutPrefix(l, "allot_coordinator_reserve_tokens_returned_total "); ok {
			returned, _ = strconv.ParseFloat(v, 64)
		}
	}
	if returned <= 0 {
		t.Errorf("reserve tokens returned %v, want > 0 after b and c lent their floors", returned)
	}
	s.StepDown("")
	if code, _ := get("/readyz"); code != 503 {
		t.Errorf("readyz with no leader = %d, want 503", code)
	}
}

// TestLargeReport: a report for 120,000 hot keys (over gRPC's 4 MiB
// default) reaches the Allocator.
func TestLargeReport(t *testing.T) {
	if testing.Short() {
		t.Skip("builds a 5 MB message")
	}
	s, st, _ := leaderStream(t, "a")
	hello := lease.Message{Type: lease.MsgHello, Session: 1, Seq: 1}
	for i := range 120000 {
		hello.Demand = append(hello.Demand, lease.Demand{Key: bucket.Key{Rule: "api", Subject: fmt.Sprintf("tenant-with-a-long-name-%07d", i)}, Want: 1000})
	}
	if err := st.Send(hello); err != nil {
		t.Fatal(err)
	}
	if m, err := st.Recv(); err != nil || m.Type != lease.MsgGrant {
		t.Fatalf("got %v, %v; want the full table", m, err)
	}
	if n := s.Status(0).Budgets[0].HotKeys; n != 120000 {
		t.Fatalf("allocator knows %d hot keys, want 120000", n)
	}
}

// TestRegionsThatNeverConnected: a region the leader never heard from has
// no lease to lapse and no renewal: lapsed_leases_total stays 0 and the
// status page shows no renewal for it, while a region that held a lease and
// went silent is counted once.
func TestRegionsThatNeverConnected(t *testing.T) {
	clk := clock.NewManual(t0)
	s := newTestServer(t, clk, "")
	addr := startServer(t, s)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	regions := startRegions(t, ctx, clk, []string{addr}, "a") // b and c never connect
	k := bucket.Key{Rule: "api", Subject: "t1"}
	start := clk.Now()
	drive(t, clk, []*Server{s}, regions, k, 400, func() bool {
		return regions["a"].Status().Live && clk.Now().Sub(start) > 15*time.Second // past b's and c's would-be TTL
	})
	h := s.Handler(nil)
	get := func(path string) string {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		return rec.Body.String()
	}
	if m := get("/metrics"); !strings.Contains(m, "allot_coordinator_lapsed_leases_total 0") {
		t.Errorf("regions that never connected counted as lapsed:\n%s", grepLines(m, "lapsed"))
	}
	page := get("/status")
	for _, r := range []struct{ region, renewal string }{{"a", "ok"}, {"b", "—"}, {"c", "—"}} {
		row := regexp.MustCompile(`<tr><td class="l">` + r.region + `</td>(?s:.*?)</tr>`).FindString(page)
		if !strings.HasSuffix(row, "<td>"+r.renewal+"</td></tr>") {
			t.Errorf("status row of %s: %q, want renewal %s", r.region, row, r.renewal)
		}
	}
	// a goes silent: its lease lapses at the coordinator, counted once.
	cancel()
	for range 150 {
		clk.Advance(100 * time.Millisecond)
		s.Tick()
	}
	if m := get("/metrics"); !strings.Contains(m, "allot_coordinator_lapsed_leases_total 1") {
		t.Errorf("a's lapse not counted once:\n%s", grepLines(m, "lapsed"))
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

// TestElectionConfigValidate: etcd takes its own 60 s for a session TTL of
// 0 or less, so a dead leader would keep leading a minute; RunElection
// refuses it instead, naming the field.
func TestElectionConfigValidate(t *testing.T) {
	for want, mod := range map[string]func(*ElectionConfig){
		"prefix is empty":    func(c *ElectionConfig) { c.Prefix = "" },
		"session_ttl=0":      func(c *ElectionConfig) { c.SessionTTL = 0 },
		"session_ttl=-3":     func(c *ElectionConfig) { c.SessionTTL = -3 },
		"retry=0s must be >": func(c *ElectionConfig) { c.Retry = 0 },
	} {
		c := DefaultElectionConfig("/allot")
		mod(&c)
		if err := c.Validate(); err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: Validate() = %v", want, err)
		}
		if err := RunElection(context.Background(), nil, c, nil); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: RunElection = %v, want the config refused", want, err)
		}
	}
	if err := DefaultElectionConfig("/allot").Validate(); err != nil {
		t.Fatal(err)
	}
}

// TestTraceAtDebugLevel: at debug level a lease message is logged with its
// keys (a count and burst, a drop to the floor, a credit, a demand, a
// return), at most traceKeys of them and the rest counted; at info level
// nothing is.
func TestTraceAtDebugLevel(t *testing.T) {
	var buf strings.Builder
	s := newTestServer(t, clock.NewManual(t0), "", func(c *Config) {
		c.Logger = slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	k := func(i int) bucket.Key { return bucket.Key{Rule: "api", Subject: "t" + strconv.Itoa(i)} }
	m := lease.Message{Type: lease.MsgGrant, Region: "a", Term: 2, Grant: 7, Version: 9, Base: 8, Entries: []lease.Entry{
		{Key: k(0), Count: 420, Burst: 42}, {Key: k(1), Drop: true}, {Key: k(2), Drop: true, Credit: 3}, {Key: k(3), Count: 100, Burst: 10, Credit: 5},
	}}
	s.trace("down", m)
	want := `level=DEBUG msg="coordinator: lease message" dir=down msg="grant a term=2 grant=7 ver=9 base=8 entries=4" keys="api/t0=420/42 api/t1=floor api/t2=floor+3 api/t3=100/10+5"`
	if !strings.Contains(buf.String(), want) {
		t.Fatalf("the record is\n%s\nwant it to contain\n%s", buf.String(), want)
	}
	buf.Reset()
	up := lease.Message{Type: lease.MsgAck, Region: "b", Term: 2, Grant: 7, Version: 9, Returns: []lease.Return{{Key: k(0), Tokens: 12}}}
	for i := range leaselog.Keys + 4 {
		up.Demand = append(up.Demand, lease.Demand{Key: k(i), Want: bucket.Tokens(i)})
	}
	s.trace("up", up)
	if got := buf.String(); !strings.Contains(got, `dir=up msg="ack b term=2 grant=7 ver=9" keys="api/t0=0 api/t1=1 `) ||
		!strings.Contains(got, "api/t15=15 (5 more)\"") || strings.Contains(got, "api/t16=") {
		t.Fatalf("the record is\n%s\nwant the first %d demands and the other 5 counted", got, leaselog.Keys)
	}
	buf.Reset()
	s.log = slog.New(slog.NewTextHandler(&buf, nil))
	s.trace("down", m)
	if buf.Len() != 0 {
		t.Fatalf("at info level the message was logged:\n%s", buf.String())
	}
}
