package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/leasetest"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/sim"
)

// copyOps copies the operator's example budgets and rules files into dir.
func copyOps(t *testing.T, dir string) string {
	t.Helper()
	for _, f := range []string{"budgets.yaml", "rules.yaml"} {
		b, err := os.ReadFile(filepath.Join("../../sim/testdata/ops", f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return filepath.Join(dir, "budgets.yaml")
}

// TestExportRoundTrips exports the example budgets file as a scenario and
// loads it in the simulator: the same regions, the budgets the coordinator
// resolves (names, limits, weights, reserve), the file's lease timings;
// and it runs.
func TestExportRoundTrips(t *testing.T) {
	dir := t.TempDir()
	budgets := copyOps(t, dir)
	out := filepath.Join(dir, "scenarios", "what-if.yaml")
	if err := os.Mkdir(filepath.Dir(out), 0o755); err != nil {
		t.Fatal(err)
	}
	var msg bytes.Buffer
	if err := exportCmd([]string{"-budgets", budgets, "-o", out, "-name", "prod", "-duration", "5s"}, &msg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(msg.String(), "3 budgets over 3 regions") {
		t.Errorf("export said %q", msg.String())
	}
	text, _ := os.ReadFile(out)
	if !strings.Contains(string(text), "budgets_file: ../budgets.yaml") {
		t.Errorf("the scenario does not name the budgets file relative to itself:\n%s", text)
	}
	sc, err := sim.LoadScenario(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	doc, err := coordinator.LoadDocument(budgets)
	if err != nil {
		t.Fatal(err)
	}
	want, err := doc.Resolve(fromRules)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Name != "prod" || sc.Duration != 5*time.Second || len(sc.Regions) != 3 || sc.Regions[0].Name != "us" {
		t.Errorf("scenario %s, %s, regions %+v", sc.Name, sc.Duration, sc.Regions)
	}
	if len(sc.Rules) != len(want) {
		t.Fatalf("%d rules, want the %d budgets served", len(sc.Rules), len(want))
	}
	for i, b := range want {
		r := sc.Rules[i]
		if r.Name != b.Rule || r.Count != int64(b.Limit.Count()) || r.Period != b.Limit.Period() || r.Burst != int64(b.Limit.Burst()) ||
			r.Reserve != b.Reserve || len(r.Weights) != 3 || r.Weights[0] != 2 {
			t.Errorf("rule %+v, want budget %s %s reserve %v weights %v", r, b.Rule, b.Limit, b.Reserve, b.Weights)
		}
	}
	lc := doc.LeaseConfig(lease.DefaultConfig())
	if c := sc.Coordinator; c.LeaseTTL != lc.TTL || c.Refresh != lc.Refresh {
		t.Errorf("coordinator %+v, want the file's ttl %s refresh %s", c, lc.TTL, lc.Refresh)
	}
	if d := lease.DriftFor(sc.Coordinator.LeaseTTL, sc.Coordinator.Drift); d < lc.Drift || d > lc.Drift+time.Microsecond {
		t.Errorf("drift ρ=%v gives a margin of %s, want the file's %s", sc.Coordinator.Drift, d, lc.Drift)
	}
	res, err := sim.Run(sc, 1, sim.Options{Systems: []string{"allot"}})
	if err != nil || res.Verdict != sim.Pass {
		t.Fatalf("run: %v, %+v", err, res)
	}
}

// TestExportFromLiveStatus runs a real coordinator on the example's
// budgets with a region pressing on one key over gRPC, and exports from
// its status endpoint: the key's reported demand becomes traffic, which
// the simulator replays on the same budgets.
func TestExportFromLiveStatus(t *testing.T) {
	dir := t.TempDir()
	budgets := copyOps(t, dir)
	doc, err := coordinator.LoadDocument(budgets)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := doc.Resolve(fromRules)
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := coordinator.DefaultConfig()
	cfg.Lease = doc.LeaseConfig(cfg.Lease)
	cfg.Lease.Budgets, cfg.Clock, cfg.Insecure = bs, clk, true
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(coordinator.ServerOptions()...)
	s.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	if err := s.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler(nil), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { hs.Close() })

	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	c, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: []string{lis.Addr().String()}, Region: "us", ConnectTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	us := leasetest.Start(t, ctx, clk, "us", bs, c, leasetest.Options{Tick: 100 * time.Millisecond, Redial: 20 * time.Millisecond, Seed: 1})
	k := bucket.Key{Rule: "api/pro", Subject: "tenant-7"}
	wctx, wcancel := context.WithTimeout(ctx, time.Minute)
	defer wcancel()
	for i := 0; ; i++ {
		us.Demand(k, 150)
		if len(s.Status(10).Keys) > 0 {
			break
		}
		if i > 2000 {
			t.Fatal("no hot key after 200 s of lease time")
		}
		clk.Advance(100 * time.Millisecond)
		s.Tick()
		if err := clk.WaitForTimers(wctx, 1); err != nil {
			t.Fatalf("the region's client did not finish its round: %v", err)
		}
		time.Sleep(3 * time.Millisecond) // real gRPC carries the messages; lease time is the manual clock
	}

	out := filepath.Join(dir, "live.yaml")
	var msg bytes.Buffer
	if err := exportCmd([]string{"-budgets", budgets, "-status", hl.Addr().String(), "-o", out, "-duration", "5s"}, &msg); err != nil {
		t.Fatal(err)
	}
	text, _ := os.ReadFile(out)
	if !strings.Contains(string(text), `{region: us, rule: api/pro, rate: 150, key: 0}   # hot key "tenant-7"'s reported demand`) {
		t.Fatalf("the scenario lacks the hot key's demand as traffic:\n%s", text)
	}
	sc, err := sim.LoadScenario(out)
	if err != nil {
		t.Fatalf("%v\n%s", err, text)
	}
	if len(sc.Traffic) != 1 || sc.Traffic[0].Rate != 150 || sc.Traffic[0].Rule != "api/pro" {
		t.Fatalf("traffic %+v", sc.Traffic)
	}
	res, err := sim.Run(sc, 1, sim.Options{Systems: []string{"allot"}})
	if err != nil || res.Verdict != sim.Pass || res.Arrivals < 600 {
		t.Fatalf("run: %v, verdict %s, %d arrivals (want ~750 at 150/s for 5 s)", err, res.Verdict, res.Arrivals)
	}
}

func TestExportRejectsBadInput(t *testing.T) {
	dir := t.TempDir()
	budgets := copyOps(t, dir)
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{}, "give -budgets"},
		{[]string{"-budgets", filepath.Join(dir, "nope.yaml")}, "no such file"},
		{[]string{"-budgets", budgets, "-duration", "-1s"}, "-duration=-1s must be > 0"},
		{[]string{"-budgets", budgets, "-status", "127.0.0.1:1"}, `-status="127.0.0.1:1"`},
	} {
		t.Setenv("ALLOT_ETCD", "")
		var out bytes.Buffer
		if err := exportCmd(tc.args, &out); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}

// TestExportFromEtcd exports the budgets document an HA cluster stores in
// etcd: the document is written beside the scenario, which names it.
func TestExportFromEtcd(t *testing.T) {
	endpoints := testenv.EtcdEndpoints(t)
	prefix := fmt.Sprintf("/allot-export-%d", time.Now().UnixNano())
	data := []byte("regions: [us, eu]\nbudgets:\n  - {rule: api, limit: \"600 per second, burst 60\"}\nlease: {ttl: 6s, refresh: 2s}\n")
	cli := etcdClient(t, endpoints)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := coordinator.PutDocument(ctx, cli, prefix, data, fromRules); err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(t.TempDir(), "ha.yaml")
	var msg bytes.Buffer
	if err := exportCmd([]string{"-etcd", strings.Join(endpoints, ","), "-prefix", prefix, "-o", out, "-duration", "3s"}, &msg); err != nil {
		t.Fatal(err)
	}
	stored, err := os.ReadFile(strings.TrimSuffix(out, ".yaml") + ".budgets.yaml")
	if err != nil || !bytes.Equal(stored, data) {
		t.Fatalf("document beside the scenario: %v, %q", err, stored)
	}
	sc, err := sim.LoadScenario(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Rules) != 1 || sc.Rules[0].Name != "api" || sc.Rules[0].Count != 600 || sc.Rules[0].Burst != 60 ||
		sc.Coordinator.LeaseTTL != 6*time.Second || len(sc.Regions) != 2 {
		t.Errorf("scenario rules %+v, ttl %s, regions %+v", sc.Rules, sc.Coordinator.LeaseTTL, sc.Regions)
	}
	if err := exportCmd([]string{"-etcd", strings.Join(endpoints, ","), "-prefix", prefix + "-empty", "-o", out}, &msg); err == nil ||
		!strings.Contains(err.Error(), "nothing stored at "+prefix+"-empty/budgets") {
		t.Errorf("empty prefix: err = %v", err)
	}
}

// TestExportRefusesAFollower: a coordinator that does not lead has no
// allocation in its status; exporting from it is refused, naming it.
func TestExportRefusesAFollower(t *testing.T) {
	dir := t.TempDir()
	budgets := copyOps(t, dir)
	cfg := coordinator.DefaultConfig()
	cfg.Insecure, cfg.Logger = true, slog.New(slog.DiscardHandler)
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := &http.Server{Handler: s.Handler(nil), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = hs.Serve(hl) }()
	t.Cleanup(func() { hs.Close() })
	var out bytes.Buffer
	err = exportCmd([]string{"-budgets", budgets, "-status", hl.Addr().String()}, &out)
	if err == nil || !strings.Contains(err.Error(), "is not the leader") || !strings.Contains(err.Error(), hl.Addr().String()) {
		t.Fatalf("err = %v, want the follower refused by its address", err)
	}
}
