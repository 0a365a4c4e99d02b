package main

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/leasetest"
)

// TestStandaloneProcess runs the binary in standalone mode on a budgets
// file: a region is served above its floor, the status page shows it, and
// SIGTERM expires the region's lease before the process exits.
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
	grpcAddr, httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t)), fmt.Sprintf("127.0.0.1:%d", freePort(t))
	cmd := exec.Command(bin, "serve", "-budgets", doc, "-listen", grpcAddr, "-http", httpAddr)
	logf, _ := os.Create(filepath.Join(dir, "coord.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })

	d, _ := coordinator.ParseDocument([]byte(haBudgets), "doc")
	budgets, _ := d.Resolve(nil)
	c, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: []string{grpcAddr}, Region: "us"})
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
	if !strings.Contains(string(body), "api/t") || !strings.Contains(string(body), "Leader, term") {
		t.Fatalf("status page lacks the hot key or the leadership:\n%s", body)
	}

	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	deadline = time.Now().Add(5 * time.Second)
	for {
		n, live := alloc()
		if !live && n == budgets[0].Floor("us").Count {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after SIGTERM the region still holds %d (lease live %v), want its floor", n, live)
		}
		time.Sleep(10 * time.Millisecond) // a real process shuts down
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("coordinator exited with %v", err)
	}
}
