package main

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/leasetest"
	"github.com/allot-dev/allot/internal/testenv"
)

// TestStandaloneProcess runs the binary in standalone mode on a budgets
// file, regions proving themselves with tokens over TLS: a region is served
// above its floor, the status page shows it, and SIGINT (as SIGTERM)
// expires the region's lease before the process exits, saying so in the
// log.
func TestStandaloneProcess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	doc := filepath.Join(dir, "budgets.yaml")
	if err := os.WriteFile(doc, []byte(haBudgets), 0o644); err != nil {
		t.Fatal(err)
	}
	ca := testenv.NewCA(t)
	_, certFile, keyFile := ca.WriteFiles(t, dir, "coordinator")
	tokens := filepath.Join(dir, "tokens")
	const usToken = "us-token-0123456789abcdef"
	if err := os.WriteFile(tokens, []byte("us "+usToken+"\neu eu-token-0123456789abcdef\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	grpcAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "serve", "-budgets", doc, "-listen", grpcAddr, "-http", httpAddr,
		"-tls-cert", certFile, "-tls-key", keyFile, "-region-tokens", tokens, "-log-level", "debug")
	logf, _ := os.Create(filepath.Join(dir, "coord.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	d, _ := coordinator.ParseDocument([]byte(haBudgets), "doc")
	budgets, _ := d.Resolve(nil)
	c, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: []string{grpcAddr}, Region: "us",
		TLS: &tls.Config{RootCAs: ca.Pool, MinVersion: tls.VersionTLS12}, Credentials: auth.Bearer(usToken, false)})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	us := leasetest.Start(t, ctx, clock.Real{}, "us", budgets, c, leasetest.Options{Tick: 20 * time.Millisecond,
		Redial: 100 * time.Millisecond, Refresh: 500 * time.Millisecond, Drift: 100 * time.Millisecond, Seed: 1})
	key := bucket.Key{Rule: "api", Subject: "t"}
	us.Demand(key, 300)
	alloc := func() (bucket.Tokens, bool) {
		return us.Allocation(key).Count(), us.Status().Live
	}
	deadline := time.Now().Add(20 * time.Second)
	for n, _ := alloc(); n < 300; n, _ = alloc() {
		if time.Now().After(deadline) {
			t.Fatalf("region holds %d, want ≥ 300 (its demand; the silent regions keep their floors)", n)
		}
		time.Sleep(10 * time.Millisecond) // a real process serves it
	}
	resp, err := http.Get("http://" + httpAddr + "/status")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !strings.Contains(string(body), "api/t") || !strings.Contains(string(body), "Leader, term") || !strings.Contains(string(body), "Region authentication: token.") {
		t.Fatalf("status page lacks the hot key, the leadership or the authentication mode:\n%s", body)
	}

	if err := cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		n, live := alloc()
		if !live && n == budgets[0].Floor("us").Count {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGINT the region still holds %d (lease live %v), want its floor", n, live)
		}
		time.Sleep(10 * time.Millisecond) // a real process shuts down
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("coordinator exited with %v", err)
	}
	logs, _ := os.ReadFile(filepath.Join(dir, "coord.log"))
	for _, want := range []string{`msg="coordinator: stopping" signal=interrupt`, `msg="coordinator: expiring every region's lease before exit"`, `msg="coordinator: stopped"`} {
		if !strings.Contains(string(logs), want) {
			t.Errorf("the log lacks %s:\n%s", want, logs)
		}
	}
	// At debug level every lease message is logged with its keys: the
	// region's hello and its report of the key, and a grant of it at its
	// demand or more.
	if !regexp.MustCompile(`level=DEBUG msg="coordinator: lease message" dir=up msg="hello us `).Match(logs) ||
		!regexp.MustCompile(`dir=up msg="report us [^"]*" keys="api/t=300"`).Match(logs) {
		t.Errorf("the debug log lacks the region's hello or its report of api/t:\n%s", logs)
	}
	granted := false
	for _, m := range regexp.MustCompile(`dir=down msg="grant us [^"]*" keys="api/t=(\d+)/\d+`).FindAllSubmatch(logs, -1) {
		if n, _ := strconv.Atoi(string(m[1])); n >= 300 {
			granted = true
		}
	}
	if !granted {
		t.Errorf("the debug log lacks a grant of api/t of 300 or more:\n%s", logs)
	}
}

// TestServeNeedsRegionAuth: a coordinator with neither mutual TLS nor
// region tokens refuses to start unless told -insecure; then it warns at
// start and says so on /status and in its metrics.
func TestServeNeedsRegionAuth(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	dir := t.TempDir()
	bin := buildBinary(t, dir)
	doc := filepath.Join(dir, "budgets.yaml")
	if err := os.WriteFile(doc, []byte(haBudgets), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(bin, "serve", "-budgets", doc, "-listen", "127.0.0.1:0", "-http", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "regions must prove who they are") {
		t.Fatalf("serve without region authentication: %v\n%s", err, out)
	}
	out, err = exec.Command(bin, "serve", "-budgets", doc, "-region-tokens", doc, "-listen", "127.0.0.1:0").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "would send tokens in clear") {
		t.Fatalf("serve with tokens and no TLS: %v\n%s", err, out)
	}
	// Flags that would be taken silently: etcd's own 60 s for a session TTL
	// it does not accept, an address regions cannot dial.
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"-etcd", "127.0.0.1:1", "-session-ttl", "0"}, "session_ttl=0 must be > 0"},
		{[]string{"-advertise", "nonsense"}, `-advertise="nonsense" must be host:port`},
		{[]string{"-log-level", "loud"}, `-log-level="loud"`},
	} {
		args := append([]string{"serve", "-budgets", doc, "-listen", "127.0.0.1:0", "-http", "127.0.0.1:0", "-insecure"}, c.args...)
		out, err := exec.Command(bin, args...).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("serve %q: %v, want an error saying %q\n%s", c.args, err, c.want, out)
		}
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "serve", "-budgets", doc, "-listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "-http", httpAddr, "-insecure")
	var log strings.Builder
	var logMu sync.Mutex
	cmd.Stderr = writerFunc(func(p []byte) (int, error) { logMu.Lock(); defer logMu.Unlock(); return log.Write(p) })
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	get := func(path string) string {
		deadline := time.Now().Add(20 * time.Second)
		for {
			resp, err := http.Get("http://" + httpAddr + path)
			if err == nil {
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				return string(b)
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s: %v", path, err)
			}
			time.Sleep(20 * time.Millisecond) // the process is starting
		}
	}
	if body := get("/status"); !strings.Contains(body, "insecure — regions are accepted by name alone") {
		t.Errorf("/status does not show the insecure mode:\n%s", body)
	}
	if body := get("/metrics"); !strings.Contains(body, `allot_coordinator_auth_info{mode="insecure"} 1`) || !strings.Contains(body, `allot_http_connections{server="status"}`) {
		t.Errorf("/metrics lacks the auth mode or the HTTP server's connections")
	}
	logMu.Lock()
	defer logMu.Unlock()
	if !strings.Contains(log.String(), "level=WARN") || !strings.Contains(log.String(), "accepted by name alone (insecure)") {
		t.Errorf("no warning at start:\n%s", log.String())
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
