package httplimit_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// Environment of a child process started by TestTwoProcessesShareRedis.
const (
	childRedisEnv  = "ALLOT_HTTPLIMIT_CHILD_REDIS"
	childPrefixEnv = "ALLOT_HTTPLIMIT_CHILD_PREFIX"
)

func TestMain(m *testing.M) {
	if addr := os.Getenv(childRedisEnv); addr != "" {
		os.Exit(serveChild(addr, os.Getenv(childPrefixEnv)))
	}
	os.Exit(m.Run())
}

// serveChild is a whole HTTP server in its own process: the gateway rules on
// a Redis store, listening on a loopback port that it prints, until its
// standard input closes.
func serveChild(addr, prefix string) int {
	fail := func(err error) int { fmt.Fprintln(os.Stderr, "child:", err); return 1 }
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c.Close()
	store, err := redisstore.New(c, redisstore.Options{Prefix: prefix})
	if err != nil {
		return fail(err)
	}
	rs, err := rules.Parse([]byte(gatewayRules), "gateway.yaml")
	if err != nil {
		return fail(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: store, Logger: quiet})
	if err != nil {
		return fail(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", "X-Plan")})
	if err != nil {
		return fail(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return fail(err)
	}
	srv := &http.Server{Handler: mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok from "+strconv.Itoa(os.Getpid()))
	})), ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	fmt.Println("LISTEN", ln.Addr().String())
	_, _ = io.Copy(io.Discard, os.Stdin)
	srv.Close()
	return 0
}

func startChild(t *testing.T, redisAddr, prefix string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childRedisEnv+"="+redisAddr, childPrefixEnv+"="+prefix)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		stdin.Close()
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	line := make(chan string, 1)
	go func() {
		s, _ := bufio.NewReader(stdout).ReadString('\n')
		line <- s
	}()
	select {
	case s := <-line:
		addr, ok := strings.CutPrefix(strings.TrimSpace(s), "LISTEN ")
		if !ok {
			t.Fatalf("child printed %q", s)
		}
		return addr
	case <-time.After(30 * time.Second):
		t.Fatal("child did not start within 30 s")
	}
	return ""
}

// TestTwoProcessesShareRedis runs two HTTP servers in separate processes on
// one real Redis; a client alternating between them on the free plan (10 per
// minute) gets exactly 10 of 11 requests through.
func TestTwoProcessesShareRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts two processes")
	}
	redisAddr := testenv.RedisAddr(t)
	prefix := fmt.Sprintf("httplimit-test-%d-%d:", os.Getpid(), time.Now().UnixNano())
	servers := []string{startChild(t, redisAddr, prefix), startChild(t, redisAddr, prefix)}
	start := time.Now()
	client := &http.Client{Timeout: 10 * time.Second}
	var statuses []string
	pids := map[string]bool{}
	for i := range 11 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+servers[i%2]+"/items", nil)
		req.Header.Set("X-Tenant", "alice")
		req.Header.Set("X-Plan", "free")
		resp, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		statuses = append(statuses, strconv.Itoa(resp.StatusCode))
		if resp.StatusCode == 200 {
			pids[string(b)] = true
			if want := strconv.Itoa(9 - i); resp.Header.Get("X-RateLimit-Remaining") != want {
				t.Errorf("request %d: X-RateLimit-Remaining %q, want %s", i, resp.Header.Get("X-RateLimit-Remaining"), want)
			}
		} else if ra := resp.Header.Get("Retry-After"); ra == "" || ra == "0" {
			t.Errorf("request %d: status %d with Retry-After %q", i, resp.StatusCode, ra)
		}
	}
	if elapsed := time.Since(start); elapsed > 5*time.Second {
		t.Fatalf("11 requests took %s; a token refills every 6 s, so the count is not meaningful", elapsed)
	}
	want := "200 200 200 200 200 200 200 200 200 200 429"
	if got := strings.Join(statuses, " "); got != want {
		t.Errorf("statuses %s, want %s", got, want)
	}
	if len(pids) != 2 {
		t.Errorf("admitted by %d processes, want 2: %v", len(pids), pids)
	}
}
