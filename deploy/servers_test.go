package deploy

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"sync"
	"testing"
	"time"
)

// need returns the path of a program the tests run, failing under CI
// (scripts/test.sh installs it) and skipping elsewhere when it is missing.
func need(t *testing.T, prog, pkg string) string {
	t.Helper()
	path, err := exec.LookPath(prog)
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("%s is not installed (apt-get install %s; scripts/test.sh does)", prog, pkg)
		}
		t.Skipf("%s is not installed (apt-get install %s; scripts/test.sh does)", prog, pkg)
	}
	return path
}

// server is a process a test started, stopped at cleanup.
type server struct {
	Addr string
	cmd  *exec.Cmd
}

// Kill stops the server at once, as a crash would.
func (s *server) Kill() {
	if s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd.Process = nil
	}
}

// startRedis starts a throwaway redis-server on a loopback port, with no
// persistence.
func startRedis(t *testing.T) *server {
	t.Helper()
	bin := need(t, "redis-server", "redis-server")
	port := freePort(t)
	cmd := exec.Command(bin, "--port", fmt.Sprint(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{Addr: fmt.Sprintf("127.0.0.1:%d", port), cmd: cmd}
	t.Cleanup(s.Kill)
	waitListening(t, s.Addr, 10*time.Second)
	return s
}

// waitListening waits until addr accepts TCP connections.
func waitListening(t *testing.T, addr string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s not listening after %s: %v", addr, limit, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// syncBuffer collects a process's output while the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
