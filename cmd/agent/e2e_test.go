package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/internal/testenv"
)

// The end-to-end test runs real processes on loopback: a coordinator, and
// three regions, each with its own redis-server and two agents joined by
// memberlist. Traffic moves from region to region; the test checks the
// global sum in every window, that the busy region gets the budget, a
// takeover when a speaking agent is killed, each failure policy when a
// region's Redis stops, and floors when the coordinator is cut off.

const e2eRules = `version: e2e
rules:
  - name: api
    match: {path: "/api/*"}
    limit: "600 per second"
    scope: global
    on_unavailable: {policy: emergency}
  - name: closed
    match: {path: "/closed/*"}
    limit: "600 per second"
    on_unavailable: fail_closed
  - name: open
    match: {path: "/open/*"}
    limit: "600 per second"
    on_unavailable: fail_open
`

const (
	e2eRate  = 600.0
	e2eBurst = 600.0
	e2eSlot  = 10 * time.Millisecond
	// e2eCallers is how many decisions an agent's traffic has in flight
	// at most: enough to offer the busy rate with round trips of tens of
	// milliseconds, few enough not to starve the rest of the test.
	e2eCallers = 8
)

func buildBinaries(t *testing.T, dir string) (agentBin, coordBin string) {
	t.Helper()
	gobin, err := exec.LookPath("go") // go test puts its own GOROOT/bin first on PATH
	if err != nil {
		t.Fatalf("go command: %v", err)
	}
	agentBin, coordBin = filepath.Join(dir, "agent"), filepath.Join(dir, "coordinator")
	for bin, pkg := range map[string]string{agentBin: "github.com/allot-dev/allot/cmd/agent", coordBin: "github.com/allot-dev/allot/cmd/coordinator"} {
		out, err := exec.Command(gobin, "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			t.Fatalf("go build %s: %v\n%s", pkg, err, out)
		}
	}
	return agentBin, coordBin
}

// proc is a child process whose output goes to a log file.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
}

func startProc(t *testing.T, dir, name, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(dir, name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.kill()
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			if len(b) > 3000 {
				b = b[len(b)-3000:]
			}
			t.Logf("--- %s log (tail) ---\n%s", name, b)
		}
	})
	return p
}

func (p *proc) kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

type e2eAgent struct {
	name, region     string
	httpAddr, gossip string
	proc             *proc
	allow            allotv1.AllowServiceClient
}

type agentStatus struct {
	Members   []string `json:"members"`
	Speaking  bool     `json:"speaking"`
	LeaseLive bool     `json:"lease_live"`
	Table     *struct {
		Written time.Time  `json:"written"`
		Adopted *time.Time `json:"adopted"`
		Entries []struct {
			Rule    string `json:"rule"`
			Subject string `json:"subject"`
			Count   int64  `json:"count"`
		} `json:"entries"`
	} `json:"table"`
}

func (a *e2eAgent) status() (agentStatus, error) {
	var st agentStatus
	// Generous: a loaded machine can be slow to answer, and the callers
	// below either poll again or fail on an error.
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + a.httpAddr + "/status")
	if err != nil {
		return st, err
	}
	defer resp.Body.Close()
	return st, json.NewDecoder(resp.Body).Decode(&st)
}

// allocation is the agent's view of its region's allocation of the hot key
// (0 when it has no entry, the region is then at its floor).
func (a *e2eAgent) allocation() int64 {
	n, _ := a.entry()
	return n
}

// entry is the region's coordinator entry for the hot key, if it has one
// under a live lease.
func (a *e2eAgent) entry() (int64, bool) {
	st, err := a.status()
	if err != nil || st.Table == nil || !st.LeaseLive {
		return 0, false
	}
	for _, e := range st.Table.Entries {
		if e.Rule == "api" && e.Subject == "tenant-1" {
			return e.Count, true
		}
	}
	return 0, false
}

func (a *e2eAgent) decide(ctx context.Context, path string) (*allotv1.AllowResponse, error) {
	// A call that fails is an error of the test (during the outage) or
	// not counted (in the traffic); neither should come of a loaded
	// machine's slowness.
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	return a.allow.Allow(ctx, &allotv1.AllowRequest{Subject: "tenant-1",
		Descriptor_: []*allotv1.Entry{{Key: "path", Value: path}}})
}

// metricsOf returns the /metrics page served at addr.
func metricsOf(addr string) (string, error) {
	c := http.Client{Timeout: 10 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return string(b), err
}

func waitE2E(t *testing.T, within time.Duration, what string, cond func() bool) time.Duration {
	t.Helper()
	start := time.Now()
	for !cond() {
		if time.Since(start) > within {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(50 * time.Millisecond) // polling other processes
	}
	return time.Since(start)
}

func TestEndToEndRealProcesses(t *testing.T) {
	if testing.Short() {
		t.Skip("end-to-end test starts real processes")
	}
	dir := t.TempDir()
	agentBin, coordBin := buildBinaries(t, dir)
	rulesPath := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(e2eRules), 0o600); err != nil {
		t.Fatal(err)
	}
	regions := []string{"r1", "r2", "r3"}
	docPath := filepath.Join(dir, "budgets.yaml")
	doc := fmt.Sprintf("regions: [r1, r2, r3]\nreserve: 0.333\nrules_file: %s\nlease: {ttl: 5s, refresh: 500ms, drift: 100ms, hold: 6s, demand_ttl: 1200ms}\n", rulesPath)
	if err := os.WriteFile(docPath, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	coordAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	coordHTTP := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
	coord := startProc(t, dir, "coordinator", coordBin, "serve", "-budgets", docPath, "-listen", coordAddr,
		"-http", coordHTTP, "-insecure")

	agents := map[string][]*e2eAgent{}
	redises := map[string]*testenv.RedisServer{}
	for _, r := range regions {
		redises[r] = testenv.StartRedis(t)
		for i := 0; i < 2; i++ {
			a := &e2eAgent{name: fmt.Sprintf("%s-%d", r, i), region: r,
				httpAddr: fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t)),
				gossip:   fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))}
			grpcAddr := fmt.Sprintf("127.0.0.1:%d", testenv.FreePort(t))
			args := []string{"-region", r, "-name", a.name, "-rules", rulesPath, "-redis", redises[r].Addr,
				"-coordinators", coordAddr, "-regions", strings.Join(regions, ","), "-reserve", "0.333",
				"-gossip-bind", a.gossip, "-grpc-listen", grpcAddr, "-http-listen", a.httpAddr,
				"-lease-refresh", "500ms", "-lease-drift", "100ms", "-redis-timeout", "200ms",
				"-breaker-failures", "3", "-breaker-backoff", "300ms", "-failover-empty", "*", "-log-level", "warn",
				"-insecure"} // the coordinator above runs -insecure; auth is tested in boundary_test.go
			if i > 0 {
				args = append(args, "-gossip-join", agents[r][0].gossip)
			}
			a.proc = startProc(t, dir, a.name, agentBin, args...)
			conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close() })
			a.allow = allotv1.NewAllowServiceClient(conn)
			agents[r] = append(agents[r], a)
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, r := range regions {
				for _, a := range agents[r] {
					st, err := a.status()
					t.Logf("%s: %+v %v", a.name, st, err)
				}
			}
		}
	})
	waitE2E(t, 60*time.Second, "every region has two members, one speaker and a live lease", func() bool {
		for _, r := range regions {
			speakers := 0
			for _, a := range agents[r] {
				st, err := a.status()
				if err != nil || len(st.Members) != 2 || !st.LeaseLive {
					return false
				}
				if st.Speaking {
					speakers++
				}
			}
			if speakers != 1 {
				return false
			}
		}
		return true
	})
	// Every agent says when it adopted the table it decides with: after
	// the speaking agent wrote it, and not later than now.
	for _, r := range regions {
		for _, a := range agents[r] {
			st, err := a.status()
			if err != nil || st.Table == nil || st.Table.Adopted == nil {
				t.Fatalf("%s: status without the table's adoption: %+v, %v", a.name, st, err)
			}
			if at := *st.Table.Adopted; at.Before(st.Table.Written) || at.After(time.Now()) {
				t.Fatalf("%s: table written %s, adopted %s, read at %s", a.name, st.Table.Written, at, time.Now())
			}
		}
	}
	// The coordinator learns for one TTL before granting increases. It
	// starts learning when it starts leading, which on a loaded machine
	// can be well after the process was started: ask it.
	waitE2E(t, 30*time.Second, "the coordinator leads and has done learning", func() bool {
		m, err := metricsOf(coordHTTP)
		return err == nil && strings.Contains(m, "\nallot_coordinator_leader 1\n") && strings.Contains(m, "\nallot_coordinator_learning 0\n")
	})

	// Traffic: the busy region offers 900/s, the others 60/s each.
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	start := time.Now()
	slots := make([]atomic.Int64, 4000) // 40 s of 10 ms slots
	var busy atomic.Value
	busy.Store("r1")
	var wg sync.WaitGroup
	for _, r := range regions {
		for _, a := range agents[r] {
			// The offered rate is what is owed by the real time elapsed,
			// and the decisions are made by several callers: one caller
			// making them one after another offers at most one per round
			// trip, and a round trip on a loaded machine is long enough
			// (15 ms seen) that the busy region's demand never reached
			// half the budget. What the callers cannot take is dropped,
			// not owed: a backlog would go on offering a region's old
			// rate after the traffic moved.
			work := make(chan struct{}, 2*e2eCallers)
			for range e2eCallers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for {
						select {
						case <-ctx.Done():
							return
						case <-work:
						}
						d, err := a.decide(ctx, "/api/orders")
						if err == nil && d.GetAllowed() {
							if s := int(time.Since(start) / e2eSlot); s < len(slots) {
								slots[s].Add(1)
							}
						}
					}
				}()
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				tk := time.NewTicker(e2eSlot)
				defer tk.Stop()
				carry, last := 0.0, time.Now()
				for {
					select {
					case <-ctx.Done():
						return
					case <-tk.C:
					}
					rate := 30.0
					if busy.Load().(string) == a.region {
						rate = 450
					}
					now := time.Now()
					carry += rate * now.Sub(last).Seconds()
					last = now
					for ; carry >= 1; carry-- {
						select {
						case work <- struct{}{}:
						default:
							carry = 0
						}
					}
				}
			}()
		}
	}

	// The busy region receives most of the budget within a few refresh
	// intervals; then the traffic moves.
	region := func(r string) func() bool {
		return func() bool {
			for _, a := range agents[r] {
				if a.allocation() < int64(e2eRate/2) {
					return false
				}
			}
			return true
		}
	}
	// Within a few refresh intervals (500 ms) when the machine is idle;
	// the bounds are for a loaded one.
	took := waitE2E(t, 30*time.Second, "r1 holds more than half the budget", region("r1"))
	t.Logf("r1 holds more than half the budget %s after its traffic started", took.Round(10*time.Millisecond))
	time.Sleep(2 * time.Second) // steady state: let the window check see it
	busy.Store("r2")
	took = waitE2E(t, 30*time.Second, "r2 holds more than half the budget after the shift", region("r2"))
	t.Logf("r2 holds more than half the budget %s after the shift", took.Round(10*time.Millisecond))

	// Kill r2's speaking agent: the other takes over and the lease never
	// lapses.
	var spk, other *e2eAgent
	for _, a := range agents["r2"] {
		st, err := a.status()
		if err != nil {
			t.Fatal(err)
		}
		if st.Speaking {
			spk = a
		} else {
			other = a
		}
	}
	if spk == nil || other == nil {
		t.Fatal("r2 has no single speaker")
	}
	spk.proc.kill()
	killed := time.Now()
	for {
		st, err := other.status()
		if err != nil {
			t.Fatal(err)
		}
		if !st.LeaseLive {
			t.Fatalf("r2's lease lapsed %s after its speaker was killed", time.Since(killed))
		}
		if st.Speaking && len(st.Members) == 1 {
			break
		}
		// The lease (TTL 5 s) bounds the takeover: the check above
		// fails first if it is late. This only ends the loop.
		if time.Since(killed) > 30*time.Second {
			t.Fatal("no takeover within 30 s")
		}
		time.Sleep(50 * time.Millisecond)
	}
	t.Logf("takeover %s after the speaker was killed; the lease stayed live", time.Since(killed).Round(10*time.Millisecond))

	// Stop r3's Redis: each rule's policy answers at once.
	a3 := agents["r3"][0]
	lent, hasEntry := a3.entry()
	atFloor := !hasEntry || lent >= 100
	redises["r3"].Kill()
	counts := map[string]int{}
	t0 := time.Now()
	for i := 0; i < 200; i++ {
		for _, p := range []string{"/closed/x", "/open/x", "/api/x"} {
			d, err := a3.decide(ctx, p)
			if err != nil {
				t.Fatalf("%s during the outage: %v", p, err)
			}
			if d.GetAllowed() {
				counts[p]++
			}
			if p == "/closed/x" && d.GetReason() != allotv1.Reason_REASON_UNAVAILABLE {
				t.Fatalf("fail closed: reason %v", d.GetReason())
			}
		}
	}
	outage := time.Since(t0)
	// Emergency: r3's allocation divided by its two live agents. r3 is light,
	// so its allocation is at most its floor (⌊(600−200)/3⌋ = 133/s, burst
	// 133): at most 66 at once plus 66/s. When the coordinator had lent most
	// of r3's floor to the busy region the emergency limit is that much
	// smaller, down to nothing, so the lower bound holds only near the floor.
	if counts["/closed/x"] != 0 || counts["/open/x"] != 200 || counts["/api/x"] > 66+int(math.Ceil(66*outage.Seconds()))+1 ||
		(atFloor && counts["/api/x"] < 30) {
		t.Fatalf("policies during the outage (%s): admitted %v; want closed 0, open 200, api ≤ 66 + 66/s (and ≥ 30 at the floor; entry %d, %v)",
			outage.Round(time.Millisecond), counts, lent, hasEntry)
	}
	// Decisions that waited on Redis (200 ms each) would take two
	// minutes; answered at once they take seconds, up to half a minute
	// on a loaded machine with the traffic above still running.
	if outage > 60*time.Second {
		t.Fatalf("600 decisions took %s without Redis", outage)
	}
	t.Logf("without Redis: %v admitted of 200 each, in %s", counts, outage.Round(time.Millisecond))

	// Cut the coordinator: regions run to the end of their leases, then on
	// floors.
	coord.kill()
	cut := time.Now()
	a1 := agents["r1"][0]
	lapse := waitE2E(t, 30*time.Second, "r1 falls back to floors", func() bool {
		st, err := a1.status()
		return err == nil && !st.LeaseLive
	})
	if lapse < 2*time.Second {
		t.Fatalf("r1 dropped its lease %s after the cut, before it could have expired", lapse)
	}
	t.Logf("r1 ran on its lease for %s after the coordinator was cut, then on floors", lapse.Round(10*time.Millisecond))
	_ = cut
	time.Sleep(time.Second)
	cancel()
	wg.Wait()

	// The global sum in every window stays within B + R·t, plus what
	// batches may spend after their debit (R × batch TTL) and one slot of
	// rounding.
	n := int(time.Since(start)/e2eSlot) + 1
	n = min(n, len(slots))
	var cum, minPrefix, worst float64
	worst = math.Inf(-1)
	var total int64
	from, minAt, to := 0, 0, 0 // the worst window is slots [from, to]
	for s := 0; s < n; s++ {
		v := slots[s].Load()
		total += v
		cum += float64(v)
		x := cum - e2eRate*e2eSlot.Seconds()*float64(s+1)
		if x-minPrefix-e2eBurst > worst {
			worst, from, to = x-minPrefix-e2eBurst, minAt, s
		}
		if x < minPrefix {
			minPrefix, minAt = x, s+1
		}
	}
	tol := e2eRate*0.1 + e2eRate*e2eSlot.Seconds()
	t.Logf("admitted %d in %s; largest excess over B + R·t in any window: %.0f (allowed %.0f)", total,
		time.Since(start).Round(time.Millisecond), math.Max(worst, 0), tol)
	if worst > tol {
		// Admissions are counted when their answer arrives: a test
		// process stalled for a while counts late answers together, so
		// say where the window lies and how the admissions fell in it.
		var per []int64
		for s := from; s <= to; s += 10 {
			var v int64
			for i := s; i < min(s+10, to+1); i++ {
				v += slots[i].Load()
			}
			per = append(per, v)
		}
		t.Fatalf("the global sum exceeded B + R·t by %.0f tokens in the window from +%s to +%s; admitted per 100 ms in it: %v",
			worst, time.Duration(from)*e2eSlot, time.Duration(to+1)*e2eSlot, per)
	}
}
