// Package testenv gives tests the real servers they need: the Redis and etcd
// that `make test` starts (ALLOT_REDIS_ADDR, ALLOT_ETCD_ENDPOINTS), or
// throwaway redis-server processes a test starts and stops itself (to kill a
// primary mid-test, say). Under CI=true a missing server fails the test
// instead of skipping it.
package testenv

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/loopback"
	"github.com/redis/go-redis/v9"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// CI reports whether the tests run under CI, where nothing may be skipped
// for want of a server.
func CI() bool { return os.Getenv("CI") == "true" }

// missing fails under CI and skips elsewhere.
func missing(t testing.TB, format string, args ...any) {
	t.Helper()
	if CI() {
		t.Fatalf(format, args...)
	}
	t.Skipf(format, args...)
}

// RedisAddr returns the address of the shared test Redis, starting a private
// one when ALLOT_REDIS_ADDR is not set.
func RedisAddr(t testing.TB) string {
	t.Helper()
	if addr := os.Getenv("ALLOT_REDIS_ADDR"); addr != "" {
		c := redis.NewClient(&redis.Options{Addr: addr})
		defer c.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := c.Ping(ctx).Err(); err != nil {
			missing(t, "testenv: ALLOT_REDIS_ADDR=%s does not answer PING: %v", addr, err)
		}
		return addr
	}
	return StartRedis(t).Addr
}

// RedisClient returns a client of the shared test Redis, closed at cleanup.
func RedisClient(t testing.TB) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: RedisAddr(t), ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// RedisServer is a redis-server process owned by one test.
type RedisServer struct {
	Addr string
	Port int
	cmd  *exec.Cmd
	dir  string
	args []string
}

// StartRedis starts a redis-server on a free loopback port with no
// persistence and maxmemory-policy noeviction, plus any extra
// "--name value" arguments, and stops it when the test ends.
func StartRedis(t testing.TB, extra ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		missing(t, "testenv: redis-server not installed (make test installs it): %v", err)
	}
	s := &RedisServer{dir: t.TempDir()}
	for attempt := 0; attempt < 5; attempt++ {
		s.Port = FreePort(t)
		s.Addr = net.JoinHostPort("127.0.0.1", strconv.Itoa(s.Port))
		s.args = append([]string{"--port", strconv.Itoa(s.Port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
			"--dir", s.dir}, extra...)
		if err = s.start(bin); err == nil {
			t.Cleanup(s.Kill)
			return s
		}
	}
	t.Fatalf("testenv: start redis-server: %v", err)
	return nil
}

func (s *RedisServer) start(bin string) error {
	s.cmd = exec.Command(bin, s.args...)
	s.cmd.Stdout, s.cmd.Stderr = nil, nil
	if err := s.cmd.Start(); err != nil {
		return err
	}
	c := redis.NewClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if s.cmd.ProcessState != nil {
			break
		}
		time.Sleep(20 * time.Millisecond) // waiting for a process to listen, not for time to pass
	}
	s.Kill()
	return fmt.Errorf("redis-server on %s did not answer", s.Addr)
}

// Kill stops the server at once (SIGKILL), as a crash would.
func (s *RedisServer) Kill() {
	if s.cmd != nil && s.cmd.Process != nil {
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
		s.cmd = nil
	}
}

// Pause stops the server's process (SIGSTOP) without closing anything:
// connections stay open and new ones are accepted by the kernel, but
// nothing is answered, as with a server blackholed by the network.
func (s *RedisServer) Pause(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatalf("testenv: pause redis-server: %v", err)
	}
	t.Cleanup(func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// Resume lets a paused server answer again (SIGCONT).
func (s *RedisServer) Resume(t testing.TB) {
	t.Helper()
	if err := s.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatalf("testenv: resume redis-server: %v", err)
	}
}

// Restart starts the server again on the same port, empty.
func (s *RedisServer) Restart(t testing.TB) {
	t.Helper()
	s.Kill()
	bin, _ := exec.LookPath("redis-server")
	if err := s.start(bin); err != nil {
		t.Fatalf("testenv: restart redis-server: %v", err)
	}
}

// Client returns a client of this server, closed at cleanup.
func (s *RedisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

var (
	portsMu sync.Mutex
	given   = map[int]bool{}
)

// FreePort returns a loopback port that was free, for TCP and UDP (memberlist
// binds both), a moment ago, and never the same port twice in one test
// binary: the kernel may hand a just-closed port out again, and two servers
// of one test must not be given the same one. It is picked below the
// kernel's ephemeral range, which outgoing connections draw from
// (loopback.Port).
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	p, err := loopback.Port(given)
	if err != nil {
		t.Fatalf("testenv: %v", err)
	}
	return p
}

// EtcdEndpoints returns the shared test etcd's client endpoints, starting a
// private etcd when ALLOT_ETCD_ENDPOINTS is not set.
func EtcdEndpoints(t testing.TB) []string {
	t.Helper()
	if e := os.Getenv("ALLOT_ETCD_ENDPOINTS"); e != "" {
		return strings.Split(e, ",")
	}
	return StartEtcd(t)
}

// StartEtcd starts a single-member etcd on free loopback ports in a temporary
// directory and stops it when the test ends.
func StartEtcd(t testing.TB) []string {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		missing(t, "testenv: etcd not installed (make test installs etcd-server): %v", err)
	}
	dir := t.TempDir()
	cp, pp := FreePort(t), FreePort(t)
	client := fmt.Sprintf("http://127.0.0.1:%d", cp)
	peer := fmt.Sprintf("http://127.0.0.1:%d", pp)
	cmd := exec.Command(bin, "--name", "t", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "t="+peer, "--log-level", "error")
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatalf("testenv: start etcd: %v", err)
	}
	go func() { // drain the log so etcd never blocks on a full pipe
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
		}
	}()
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := fmt.Sprintf("127.0.0.1:%d", cp)
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatalf("testenv: etcd client: %v", err)
	}
	defer cli.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		// Listening is not serving: wait until a read is answered.
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		_, err := cli.Get(ctx, "health")
		cancel()
		if err == nil {
			return []string{addr}
		}
		if time.Now().After(deadline) {
			t.Fatalf("testenv: etcd on %s did not answer: %v", addr, err)
		}
		time.Sleep(50 * time.Millisecond) // waiting for a process to start
	}
}

// StartRedisCluster starts n redis-server processes in cluster mode (no
// replicas), joins them with `redis-cli --cluster create`, waits until the
// cluster reports ok, and returns the node addresses.
func StartRedisCluster(t testing.TB, n int) []string {
	t.Helper()
	return StartRedisClusterReplicas(t, n, 0).Addrs()
}

// RedisCluster is a Redis Cluster owned by one test: its servers, in the
// order `redis-cli --cluster create` was given them (primaries first).
type RedisCluster struct {
	Servers []*RedisServer
}

// Addrs returns the nodes' addresses.
func (c *RedisCluster) Addrs() []string {
	out := make([]string, len(c.Servers))
	for i, s := range c.Servers {
		out[i] = s.Addr
	}
	return out
}

// StartRedisClusterReplicas starts primaries × (1 + replicas)
// redis-server processes in cluster mode (node timeout 1 s, so a killed
// primary's replica is promoted within a few seconds), joins them with
// `redis-cli --cluster create --cluster-replicas replicas`, and waits
// until every node reports cluster_state:ok.
func StartRedisClusterReplicas(t testing.TB, primaries, replicas int) *RedisCluster {
	t.Helper()
	if _, err := exec.LookPath("redis-cli"); err != nil {
		missing(t, "testenv: redis-cli not installed: %v", err)
	}
	rc := &RedisCluster{}
	for range primaries * (1 + replicas) {
		rc.Servers = append(rc.Servers, StartRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "1000"))
	}
	args := append([]string{"--cluster", "create"}, rc.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("testenv: redis-cli --cluster create: %v\n%s", err, out)
	}
	if err := rc.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	return rc
}

// WaitOK waits until every live node reports cluster_state:ok and, with
// replicas, until every replica's link to its primary is up.
func (c *RedisCluster) WaitOK(within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		ok, live := 0, 0
		for _, s := range c.Servers {
			if s.cmd == nil {
				continue
			}
			live++
			cl := redis.NewClient(&redis.Options{Addr: s.Addr})
			info, err := cl.ClusterInfo(context.Background()).Result()
			repl, rerr := cl.Info(context.Background(), "replication").Result()
			_ = cl.Close() // the answers are in hand
			if err == nil && rerr == nil && strings.Contains(info, "cluster_state:ok") &&
				(strings.Contains(repl, "role:master") || strings.Contains(repl, "master_link_status:up")) {
				ok++
			}
		}
		if ok == live {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: redis cluster %v: %d of %d nodes ok after %s", c.Addrs(), ok, live, within)
		}
		time.Sleep(50 * time.Millisecond) // waiting for every node to agree on slots
	}
}

// Sentinel is a primary, a replica and the Sentinels watching them, all
// owned by one test.
type Sentinel struct {
	Primary, Replica *RedisServer
	Addr             string   // the first Sentinel's address
	Addrs            []string // every Sentinel's address
	Master           string   // the monitored master's name
}

// StartSentinel starts a primary, a replica of it and a Sentinel that
// monitors them as master "allot" with quorum 1 and fast failover timings.
func StartSentinel(t testing.TB) *Sentinel {
	t.Helper()
	return StartSentinels(t, 1)
}

// StartSentinels starts a primary, a replica of it and n Sentinels that
// monitor them as master "allot" with a majority quorum (n/2 + 1), down
// after 1 s, and waits until every Sentinel names the primary.
func StartSentinels(t testing.TB, n int) *Sentinel {
	t.Helper()
	if _, err := exec.LookPath("redis-sentinel"); err != nil {
		missing(t, "testenv: redis-sentinel not installed (make test installs it): %v", err)
	}
	primary := StartRedis(t)
	replica := StartRedis(t, "--replicaof", "127.0.0.1", strconv.Itoa(primary.Port))
	s := &Sentinel{Primary: primary, Replica: replica, Master: "allot"}
	for range n {
		dir := t.TempDir()
		port := FreePort(t)
		conf := filepath.Join(dir, "sentinel.conf")
		body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor allot 127.0.0.1 %d %d\n"+
			"sentinel down-after-milliseconds allot 1000\nsentinel failover-timeout allot 5000\n"+
			"sentinel parallel-syncs allot 1\n", port, dir, primary.Port, n/2+1)
		if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("redis-sentinel", conf)
		if err := cmd.Start(); err != nil {
			t.Fatalf("testenv: start redis-sentinel: %v", err)
		}
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
		s.Addrs = append(s.Addrs, fmt.Sprintf("127.0.0.1:%d", port))
	}
	s.Addr = s.Addrs[0]
	for _, a := range s.Addrs {
		c := redis.NewSentinelClient(&redis.Options{Addr: a})
		deadline := time.Now().Add(10 * time.Second)
		for {
			addr, err := c.GetMasterAddrByName(context.Background(), s.Master).Result()
			if err == nil && len(addr) == 2 && addr[1] == strconv.Itoa(primary.Port) {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close() // failing anyway
				t.Fatalf("testenv: sentinel on %s did not report master %s", a, primary.Addr)
			}
			time.Sleep(50 * time.Millisecond) // waiting for the sentinel to find its master
		}
		_ = c.Close() // the sentinel has answered
	}
	return s
}

// MasterAddr returns the address the first Sentinel names as master.
func (s *Sentinel) MasterAddr(ctx context.Context) (string, error) {
	c := redis.NewSentinelClient(&redis.Options{Addr: s.Addr})
	defer c.Close()
	addr, err := c.GetMasterAddrByName(ctx, s.Master).Result()
	if err != nil {
		return "", err
	}
	return net.JoinHostPort(addr[0], addr[1]), nil
}
