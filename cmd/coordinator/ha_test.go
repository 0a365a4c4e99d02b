package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/leasetest"
	"github.com/allot-dev/allot/internal/testenv"
)

// freePort and testEtcd name the shared test helpers for this package's
// tests: a port never handed out twice, and the harness's etcd (or a private
// one), failing under CI=true when there is none.
func freePort(t *testing.T) int { return testenv.FreePort(t) }

func testEtcd(t *testing.T) string { return strings.Join(testenv.EtcdEndpoints(t), ",") }

// etcdClient is a client of the etcd at endpoints, closed when t ends.
func etcdClient(t *testing.T, endpoints []string) *clientv3.Client {
	t.Helper()
	cli, err := clientv3.New(clientv3.Config{Endpoints: endpoints, DialTimeout: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// buildBinary builds this command once per test run (into the first
// caller's temporary directory, which lives until the run ends).
func buildBinary(t *testing.T, _ string) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "allot-coordinator-test")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "coordinator")
		if out, err := exec.Command("go", "build", "-o", builtBin, ".").CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return builtBin
}

func TestMain(m *testing.M) {
	code := m.Run()
	if builtBin != "" {
		os.RemoveAll(filepath.Dir(builtBin))
	}
	os.Exit(code)
}

type coordProc struct {
	cmd        *exec.Cmd
	grpc, http string
}

const haBudgets = `
regions: [us, eu, ap]
budgets:
  - rule: api
    limit: "600 per second, burst 60"
lease: {ttl: 2s, refresh: 500ms, drift: 100ms, hold: 4s, demand_ttl: 1200ms}
`

// TestHAFailover runs three coordinator processes on a real etcd with
// simulated regions pressing on one key, kills the leader with SIGKILL,
// and checks that a new leader with a larger term takes over, that the
// regions reconnect through the other addresses and are served again, and
// that the allocations the regions hold never sum above the budget. Then a
// rules change halves the budget through etcd and every region gets it.
func TestHAFailover(t *testing.T) {
	if testing.Short() {
		t.Skip("starts etcd and three coordinator processes")
	}
	endpoints := testEtcd(t)
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	prefix := fmt.Sprintf("/allot-test-%d", time.Now().UnixNano())
	docPath := filepath.Join(dir, "budgets.yaml")
	if err := os.WriteFile(docPath, []byte(haBudgets), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "rules", "put", "-etcd", endpoints, "-prefix", prefix, "-f", docPath).CombinedOutput(); err != nil {
		t.Fatalf("rules put: %v\n%s", err, out)
	}
	out, err := exec.Command(bin, "rules", "get", "-etcd", endpoints, "-prefix", prefix).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "600 per second") {
		t.Fatalf("rules get: %v\n%s", err, out)
	}

	var procs []*coordProc
	var addrs []string
	for i := range 3 {
		p := &coordProc{grpc: fmt.Sprintf("127.0.0.1:%d", freePort(t)), http: fmt.Sprintf("127.0.0.1:%d", freePort(t))}
		p.cmd = exec.Command(bin, "serve", "-etcd", endpoints, "-prefix", prefix, "-listen", p.grpc, "-http", p.http, "-session-ttl", "2", "-insecure")
		logf, _ := os.Create(filepath.Join(dir, fmt.Sprintf("coord%d.log", i)))
		p.cmd.Stdout, p.cmd.Stderr = logf, logf
		if err := p.cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = p.cmd.Process.Kill(); _ = p.cmd.Wait() })
		procs = append(procs, p)
		addrs = append(addrs, p.grpc)
	}
	doc, _ := coordinator.ParseDocument([]byte(haBudgets), "doc")
	budgets, _ := doc.Resolve(nil)
	budget := budgets[0].Limit

	// Regions, each driven as an agent drives its end of the protocol,
	// behind a Client that knows all three addresses, every region
	// pressing on one key.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	key := bucket.Key{Rule: "api", Subject: "tenant"}
	regs := map[string]*leasetest.Region{}
	want := map[string]bucket.Tokens{"us": 300, "eu": 150, "ap": 60}
	for i, name := range []string{"us", "eu", "ap"} {
		c, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: addrs, Region: name, ConnectTimeout: 500 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		regs[name] = leasetest.Start(t, ctx, clock.Real{}, name, budgets, c, leasetest.Options{Tick: 20 * time.Millisecond,
			Redial: 100 * time.Millisecond, Refresh: 500 * time.Millisecond, Drift: 100 * time.Millisecond, Seed: uint64(i + 1)})
		regs[name].Demand(key, want[name])
	}
	// sample checks I1 on the regions' side and returns each region's
	// allocation and term.
	var maxSum bucket.Tokens
	sample := func() (map[string]bucket.Tokens, map[string]uint64) {
		counts, terms := map[string]bucket.Tokens{}, map[string]uint64{}
		var sum, burst bucket.Tokens
		for name, r := range regs {
			l := r.Allocation(key)
			terms[name] = r.Status().Term
			counts[name] = l.Count()
			sum += l.Count()
			burst += l.Burst()
		}
		maxSum = max(maxSum, sum)
		if sum > budget.Count() || burst > budget.Burst() {
			t.Fatalf("regions hold %d/%d > budget %s: %v", sum, burst, budget, counts)
		}
		return counts, terms
	}
	// until samples every 10 ms until cond holds or the deadline passes.
	until := func(what string, d time.Duration, cond func(map[string]bucket.Tokens, map[string]uint64) bool) {
		t.Helper()
		deadline := time.Now().Add(d)
		for time.Now().Before(deadline) {
			if c, tm := sample(); cond(c, tm) {
				return
			}
			time.Sleep(10 * time.Millisecond) // real processes: sample on the wall clock
		}
		c, tm := sample()
		t.Fatalf("%s: not within %s (allocations %v, terms %v)", what, d, c, tm)
	}
	served := func(c map[string]bucket.Tokens, _ map[string]uint64) bool {
		return c["us"] >= 300 && c["eu"] >= 150 && c["ap"] >= 60
	}
	until("regions served by the first leader", 30*time.Second, served)
	_, terms := sample()
	leader, first := findLeader(t, procs)
	t.Logf("leader %s, term %d", leader.grpc, terms["us"])
	// The cluster's first leader records itself in etcd and starts every
	// reserve full; the next one finds the record and counts them from
	// the end of its learning.
	if !first {
		t.Fatal("the cluster's first leader does not lead as the first")
	}
	gctx, gcancel := context.WithTimeout(ctx, 5*time.Second)
	rec, err := etcdClient(t, strings.Split(endpoints, ",")).Get(gctx, coordinator.LedKey(prefix))
	gcancel()
	if err != nil || len(rec.Kvs) != 1 || string(rec.Kvs[0].Value) != strconv.FormatUint(terms["us"], 10) {
		t.Fatalf("etcd's %s: %v (%v), want the first term %d", coordinator.LedKey(prefix), rec, err, terms["us"])
	}

	if err := leader.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = leader.cmd.Wait()
	killed := time.Now()
	oldTerm := terms["us"]
	until("regions on a new leader's term", 30*time.Second, func(_ map[string]bucket.Tokens, tm map[string]uint64) bool {
		return tm["us"] > oldTerm && tm["eu"] > oldTerm && tm["ap"] > oldTerm
	})
	until("regions served by the new leader", 30*time.Second, served)
	var rest []*coordProc
	for _, p := range procs {
		if p != leader {
			rest = append(rest, p)
		}
	}
	nl, first := findLeader(t, rest)
	if first {
		t.Fatal("the leader after a failover leads as the first")
	}
	_, terms = sample()
	t.Logf("new leader %s, term %d, regions served again %s after the kill; largest sum held %d of %d",
		nl.grpc, terms["us"], time.Since(killed).Round(time.Millisecond), maxSum, budget.Count())

	// A rules change halves the budget: stored in etcd, watched by the new
	// leader and pushed to every region with a full table.
	half := strings.Replace(haBudgets, "600 per second, burst 60", "300 per second, burst 30", 1)
	if err := os.WriteFile(docPath, []byte(half), 0o644); err != nil {
		t.Fatal(err)
	}
	changed := time.Now()
	if out, err := exec.Command(bin, "rules", "put", "-etcd", endpoints, "-prefix", prefix, "-f", docPath).CombinedOutput(); err != nil {
		t.Fatalf("rules put: %v\n%s", err, out)
	}
	until("regions on the new budget", 10*time.Second, func(map[string]bucket.Tokens, map[string]uint64) bool {
		for _, r := range regs {
			bs := r.Budgets()
			if len(bs) != 1 || bs[0].Limit.Count() != 300 {
				return false
			}
		}
		return true
	})
	t.Logf("every region had the halved budget %s after `rules put` started", time.Since(changed).Round(time.Millisecond))
	budget = bucket.PerSecond(300).WithBurst(30)
	end := time.Now().Add(4 * time.Second)
	for time.Now().Before(end) {
		sample()                          // fails if the regions hold more than the new budget
		time.Sleep(10 * time.Millisecond) // real processes
	}
}

// findLeader returns the coordinator that leads, and whether it leads as
// the first leader the cluster ever had (its status's First).
func findLeader(t *testing.T, procs []*coordProc) (*coordProc, bool) {
	t.Helper()
	for range 100 {
		for _, p := range procs {
			resp, err := http.Get("http://" + p.http + "/status.json")
			if err != nil {
				continue
			}
			var st struct{ Leading, First bool }
			_ = json.NewDecoder(resp.Body).Decode(&st)
			resp.Body.Close()
			if st.Leading {
				return p, st.First
			}
		}
		time.Sleep(50 * time.Millisecond) // real processes
	}
	t.Fatal("no coordinator leads")
	return nil, false
}
