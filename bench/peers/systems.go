package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
)

// baseSuffix names an allot system run from Config.BaseAgent.
const baseSuffix = "-base"

// allSystems are the systems the comparison knows, in report order.
var allSystems = []string{"allot-region", "allot-local", "envoyproxy-ratelimit", "gubernator"}

// peer is a peer's binary and the pinned package `go install` builds it
// from through the Go module proxy.
type peer struct {
	bin, pkg string
}

var peers = map[string]peer{
	// envoyproxy/ratelimit tags no releases the module proxy serves; this is
	// the main branch's commit of 2026-01-22 as a pseudo-version.
	"envoyproxy-ratelimit": {"service_cmd", "github.com/envoyproxy/ratelimit/src/service_cmd@v1.4.1-0.20260122083618-3fb702589d36"},
	"gubernator":           {"gubernator", "github.com/gubernator-io/gubernator/v2/cmd/gubernator@v2.13.0"},
}

// The limits every system enforces. api is what the load runs against: a
// million a second per key, which no round reaches. idle and hot are for
// the memory table: idle keys are decided once and keep their state for
// the measurement (10 an hour), hot keys are decided again and again,
// faster than 2 a second.
const (
	apiPerSecond  = 1_000_000
	idlePerHour   = 10
	hotPerSecond  = 2
	domain        = "edge"
	pathAPI       = "/orders"
	pathIdle      = "/idle"
	pathHot       = "/hot"
	subjectHeader = "subject"
)

// system is one running service under test: its process, its Redis (if
// it has one) and a client that asks it for one decision.
type system struct {
	name  string
	setup string // how it is configured, for the report
	svc   *proc
	redis *proc
	raddr string // its Redis, or ""
	// decide asks for one decision on subject at path and returns whether
	// it was admitted.
	decide func(ctx context.Context, subject, path string) (bool, error)
	conn   *grpc.ClientConn
}

// redisCalls is the commands the system's Redis has run, from INFO
// commandstats (scripts count once, and each command a script calls once
// more); 0 without a Redis.
func (s *system) redisCalls(ctx context.Context) int64 {
	if s.raddr == "" {
		return 0
	}
	c := redis.NewClient(&redis.Options{Addr: s.raddr})
	defer c.Close()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		return 0
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		if _, rest, ok := strings.Cut(line, ":calls="); ok && strings.HasPrefix(line, "cmdstat_") {
			v, _, _ := strings.Cut(rest, ",")
			x, _ := strconv.ParseInt(v, 10, 64)
			n += x
		}
	}
	return n
}

func (s *system) close() {
	if s.conn != nil {
		_ = s.conn.Close() // the run is over
	}
	s.svc.stop()
	s.redis.stop()
}

// proc is a child process whose CPU time the run reads from /proc.
type proc struct {
	name string
	cmd  *exec.Cmd
	log  *os.File
	done chan struct{}
}

func start(dir, name, bin string, args, env []string) (*proc, error) {
	f, err := os.Create(filepath.Join(dir, name+".log"))
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.Env = append(os.Environ(), env...)
	if err := cmd.Start(); err != nil {
		_ = f.Close() // the start failed; that is the error to report
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{name: name, cmd: cmd, log: f, done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(p.done) }()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop kills the process (SIGKILL: nothing it holds is kept) and waits.
func (p *proc) stop() {
	if p == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	<-p.done
	_ = p.log.Close() // the process is gone; its log is complete or lost either way
}

// tail is the end of the process's output, for an error message.
func (p *proc) tail() string {
	b, _ := os.ReadFile(p.log.Name())
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return strings.TrimSpace(string(b))
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func freeAddr() (string, error) {
	p, err := freePort()
	return "127.0.0.1:" + strconv.Itoa(p), err
}

// startRedis starts a redis-server on a free loopback port, with no
// persistence, and waits until it answers.
func startRedis(ctx context.Context, dir, name string) (*proc, string, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, "", fmt.Errorf("peers: redis-server is not installed (apt-get install redis-server): %w", err)
	}
	port, err := freePort()
	if err != nil {
		return nil, "", err
	}
	rdir := filepath.Join(dir, name+"-redis")
	if err := os.MkdirAll(rdir, 0o750); err != nil {
		return nil, "", err
	}
	addr := "127.0.0.1:" + strconv.Itoa(port)
	p, err := start(dir, name+"-redis", bin, []string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", rdir}, nil)
	if err != nil {
		return nil, "", err
	}
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	err = waitFor(ctx, p, 10*time.Second, func(ctx context.Context) error { return c.Ping(ctx).Err() })
	if err != nil {
		p.stop()
		return nil, "", fmt.Errorf("peers: redis-server for %s: %w", name, err)
	}
	return p, addr, nil
}

// waitFor polls ready until it succeeds, the process exits or the time is up.
func waitFor(ctx context.Context, p *proc, within time.Duration, ready func(context.Context) error) error {
	deadline := time.Now().Add(within)
	var err error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited: %s", p.name, p.tail())
		}
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err = ready(cctx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		time.Sleep(50 * time.Millisecond) // waiting for a process to listen, not for time to pass
	}
	return fmt.Errorf("%s did not answer within %s: %v; output: %s", p.name, within, err, p.tail())
}

// startSystem starts one system (and its Redis) and waits until it decides.
func startSystem(ctx context.Context, cfg Config, dir, name, agentBin string, maxKeys int) (*system, error) {
	switch name {
	case "allot-region", "allot-local":
		return startAllot(ctx, dir, name, agentBin)
	case "allot-region" + baseSuffix, "allot-local" + baseSuffix:
		s, err := startAllot(ctx, dir, name, cfg.BaseAgent)
		if err == nil {
			s.setup += ", the binary " + cfg.BaseAgent
		}
		return s, err
	case "envoyproxy-ratelimit":
		return startRatelimit(ctx, dir, filepath.Join(cfg.BinDir, peers[name].bin))
	case "gubernator":
		return startGubernator(ctx, dir, filepath.Join(cfg.BinDir, peers[name].bin), maxKeys)
	}
	return nil, fmt.Errorf("peers: unknown system %q (known: %s)", name, strings.Join(allSystems, ", "))
}

// allotRules is the agent's rules file: the same three limits as the
// peers, in the given scope.
func allotRules(scope string) string {
	return fmt.Sprintf(`version: bench-peers
domain: %[1]s
rules:
  - name: idle
    match: {path: %[2]s}
    limit: "%[3]d per hour"
    scope: %[4]s
  - name: hot
    match: {path: %[5]s}
    limit: "%[6]d per second"
    scope: %[4]s
  - name: api
    match: {path: "/*"}
    limit: "%[7]d per second"
    scope: %[4]s
`, domain, pathIdle, idlePerHour, scope, pathHot, hotPerSecond, apiPerSecond)
}

// startAllot runs the agent binary: allot-region on its own Redis (every
// decision a script call), allot-local on its in-process store. Without a
// coordinator the agent runs on floors alone; for scopes region and local
// the floor is the rule's own limit, which checkLimit confirms.
func startAllot(ctx context.Context, dir, name, bin string) (*system, error) {
	scope := strings.TrimSuffix(strings.TrimPrefix(name, "allot-"), baseSuffix)
	rulesPath := filepath.Join(dir, name+"-rules.yaml")
	if err := os.WriteFile(rulesPath, []byte(allotRules(scope)), 0o600); err != nil {
		return nil, err
	}
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	s := &system{name: name}
	args := []string{"-region", "bench", "-name", name, "-rules", rulesPath, "-grpc-listen", grpcAddr,
		"-http-listen", httpAddr, "-log-level", "error"}
	if scope == "region" {
		if s.redis, s.raddr, err = startRedis(ctx, dir, name); err != nil {
			return nil, err
		}
		// A deadline of a second, not the default 100 ms: on a shared
		// machine under other load a round trip can miss 100 ms, and the
		// rule's policy (fail closed) would then deny what the peers, which
		// have no deadline, would wait for.
		args = append(args, "-redis", s.raddr, "-redis-timeout", "1s")
		s.setup = "agent binary, `scope: region` rules, its own Redis (a script call per decision, concurrent decisions sharing calls), `-redis-timeout 1s`"
	} else {
		s.setup = "agent binary, `scope: local` rules, in-process store, no Redis"
	}
	if s.svc, err = start(dir, name, bin, args, nil); err != nil {
		s.close()
		return nil, err
	}
	if err := s.dialRLS(ctx, grpcAddr); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// startRatelimit runs envoyproxy/ratelimit as its README recommends for
// production: Redis over TCP, write buffering with REDIS_PIPELINE_WINDOW at
// 150 µs (the low end of the 150–500 µs it recommends; REDIS_PIPELINE_LIMIT
// has no effect since its move to radix v4), the default pool of 10
// connections, Prometheus metrics (as allot exports) instead of statsd,
// and the same limits as descriptors in its YAML.
func startRatelimit(ctx context.Context, dir, bin string) (*system, error) {
	const name = "envoyproxy-ratelimit"
	root := filepath.Join(dir, "ratelimit-runtime")
	cdir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cdir, 0o750); err != nil {
		return nil, err
	}
	yaml := fmt.Sprintf(`domain: %s
descriptors:
  - key: %s
    descriptors:
      - key: path
        value: %s
        rate_limit: {unit: hour, requests_per_unit: %d}
      - key: path
        value: %s
        rate_limit: {unit: second, requests_per_unit: %d}
      - key: path
        rate_limit: {unit: second, requests_per_unit: %d}
`, domain, subjectHeader, pathIdle, idlePerHour, pathHot, hotPerSecond, apiPerSecond)
	if err := os.WriteFile(filepath.Join(cdir, "bench.yaml"), []byte(yaml), 0o600); err != nil {
		return nil, err
	}
	s := &system{name: name, setup: "its service_cmd, fixed window (INCRBY + EXPIRE pipelined), REDIS_PIPELINE_WINDOW=150us, pool 10, Prometheus metrics, its own Redis"}
	var err error
	if s.redis, s.raddr, err = startRedis(ctx, dir, name); err != nil {
		return nil, err
	}
	ports := make([]int, 4)
	for i := range ports {
		if ports[i], err = freePort(); err != nil {
			s.close()
			return nil, err
		}
	}
	env := []string{
		"USE_STATSD=false", "USE_PROMETHEUS=true", "PROMETHEUS_ADDR=127.0.0.1:" + strconv.Itoa(ports[3]),
		"LOG_LEVEL=warn", "REDIS_SOCKET_TYPE=tcp", "REDIS_URL=" + s.raddr,
		"REDIS_PIPELINE_WINDOW=150us",
		"RUNTIME_ROOT=" + root, "RUNTIME_SUBDIRECTORY=ratelimit", "RUNTIME_APPDIRECTORY=config", "RUNTIME_WATCH_ROOT=false",
		"HOST=127.0.0.1", "PORT=" + strconv.Itoa(ports[0]),
		"DEBUG_HOST=127.0.0.1", "DEBUG_PORT=" + strconv.Itoa(ports[1]),
		"GRPC_HOST=127.0.0.1", "GRPC_PORT=" + strconv.Itoa(ports[2]),
	}
	if s.svc, err = start(dir, name, bin, nil, env); err != nil {
		s.close()
		return nil, err
	}
	if err := s.dialRLS(ctx, "127.0.0.1:"+strconv.Itoa(ports[2])); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// dialRLS connects the Envoy RLS v3 client and waits until the service
// admits a decision under the api limit, whose current_limit it checks.
func (s *system) dialRLS(ctx context.Context, addr string) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	s.conn = conn
	c := rlsv3.NewRateLimitServiceClient(conn)
	s.decide = func(ctx context.Context, subject, path string) (bool, error) {
		resp, err := c.ShouldRateLimit(ctx, rlsRequest(subject, path))
		if err != nil {
			return false, err
		}
		return resp.GetOverallCode() == rlsv3.RateLimitResponse_OK, nil
	}
	return waitFor(ctx, s.svc, 30*time.Second, func(ctx context.Context) error {
		resp, err := c.ShouldRateLimit(ctx, rlsRequest("ready", pathAPI))
		if err != nil {
			return err
		}
		return checkLimit(resp)
	})
}

// checkLimit requires an admission under a limit of at least the api
// limit per second: a system that enforced less (an agent's floor, a
// misread config) could deny during the load and measure something else.
func checkLimit(resp *rlsv3.RateLimitResponse) error {
	if resp.GetOverallCode() != rlsv3.RateLimitResponse_OK || len(resp.GetStatuses()) != 1 {
		return fmt.Errorf("readiness decision = %v, want one OK status", resp)
	}
	cl := resp.GetStatuses()[0].GetCurrentLimit()
	if cl == nil {
		return fmt.Errorf("readiness decision has no current_limit: %v", resp)
	}
	per := map[rlsv3.RateLimitResponse_RateLimit_Unit]float64{
		rlsv3.RateLimitResponse_RateLimit_SECOND: 1, rlsv3.RateLimitResponse_RateLimit_MINUTE: 60,
		rlsv3.RateLimitResponse_RateLimit_HOUR: 3600, rlsv3.RateLimitResponse_RateLimit_DAY: 86400,
	}[cl.GetUnit()]
	if per == 0 {
		return fmt.Errorf("readiness decision's unit %s is not one the check knows", cl.GetUnit())
	}
	mult := float64(max(cl.GetUnitMultiplier().GetValue(), 1))
	if rate := float64(cl.GetRequestsPerUnit()) / (per * mult); rate < apiPerSecond {
		return fmt.Errorf("effective limit %.0f per second, want %d: the load would be denied", rate, apiPerSecond)
	}
	return nil
}

func rlsRequest(subject, path string) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, HitsAddend: 1, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: subjectHeader, Value: subject}, {Key: "path", Value: path}}}}}
}

// startGubernator runs Gubernator v2 as a one-node member-list cluster,
// with a cache large enough for every key of the run (its LRU would
// otherwise evict live limits), token bucket. It has no Envoy RLS, so the
// generator calls its own gRPC API, V1/GetRateLimits, with the same
// limits; it keeps limits in process and has no Redis.
func startGubernator(ctx context.Context, dir, bin string, maxKeys int) (*system, error) {
	const name = "gubernator"
	grpcAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	httpAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	gossipAddr, err := freeAddr()
	if err != nil {
		return nil, err
	}
	cache := max(2*maxKeys, 50_000)
	s := &system{name: name, setup: fmt.Sprintf("its cmd/gubernator, one node of a member-list cluster (its default discovery), GUBER_CACHE_SIZE=%d, token bucket, no trace exporter, its own gRPC API (no RLS); limits in process, no Redis", cache)}
	env := []string{"GUBER_GRPC_ADDRESS=" + grpcAddr, "GUBER_HTTP_ADDRESS=" + httpAddr,
		"GUBER_ADVERTISE_ADDRESS=" + grpcAddr, "GUBER_PEER_DISCOVERY_TYPE=member-list",
		"GUBER_MEMBERLIST_ADDRESS=" + gossipAddr, "GUBER_MEMBERLIST_BIND_ADDRESS=" + gossipAddr, "GUBER_MEMBERLIST_KNOWN_NODES=" + gossipAddr,
		"GUBER_CACHE_SIZE=" + strconv.Itoa(cache), "GUBER_LOG_LEVEL=warn", "OTEL_TRACES_EXPORTER=none"}
	if s.svc, err = start(dir, name, bin, nil, env); err != nil {
		return nil, err
	}
	conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.ForceCodecV2(rawCodec{})))
	if err != nil {
		s.close()
		return nil, err
	}
	s.conn = conn
	s.decide = func(ctx context.Context, subject, path string) (bool, error) {
		return gubernatorDecide(ctx, conn, subject, path)
	}
	err = waitFor(ctx, s.svc, 30*time.Second, func(ctx context.Context) error {
		ok, err := s.decide(ctx, "ready", pathAPI)
		if err == nil && !ok {
			err = errors.New("readiness decision over the limit")
		}
		return err
	})
	if err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

// gubernatorDecide sends one GetRateLimitsReq (pb.gubernator, encoded by
// hand so the module needs no Gubernator code) and reads its one
// RateLimitResp: status UNDER_LIMIT (0) and no error is an admission.
func gubernatorDecide(ctx context.Context, conn *grpc.ClientConn, subject, path string) (bool, error) {
	name, limit, durMs := "api", int64(apiPerSecond), int64(1000)
	switch path {
	case pathIdle:
		name, limit, durMs = "idle", idlePerHour, 3_600_000
	case pathHot:
		name, limit, durMs = "hot", hotPerSecond, 1000
	}
	var r []byte
	r = protowire.AppendTag(r, 1, protowire.BytesType)
	r = protowire.AppendString(r, name)
	r = protowire.AppendTag(r, 2, protowire.BytesType)
	r = protowire.AppendString(r, subject)
	r = protowire.AppendTag(r, 3, protowire.VarintType)
	r = protowire.AppendVarint(r, 1) // hits
	r = protowire.AppendTag(r, 4, protowire.VarintType)
	r = protowire.AppendVarint(r, uint64(limit))
	r = protowire.AppendTag(r, 5, protowire.VarintType)
	r = protowire.AppendVarint(r, uint64(durMs))
	req := protowire.AppendTag(nil, 1, protowire.BytesType)
	req = protowire.AppendBytes(req, r)
	var resp []byte
	if err := conn.Invoke(ctx, "/pb.gubernator.V1/GetRateLimits", &req, &resp); err != nil {
		return false, err
	}
	// GetRateLimitsResp{responses: [RateLimitResp{status: 1, error: 5}]}.
	for len(resp) > 0 {
		num, typ, n := protowire.ConsumeTag(resp)
		if n < 0 {
			return false, protowire.ParseError(n)
		}
		resp = resp[n:]
		if num != 1 || typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, resp); n < 0 {
				return false, protowire.ParseError(n)
			}
			resp = resp[n:]
			continue
		}
		one, n := protowire.ConsumeBytes(resp)
		if n < 0 {
			return false, protowire.ParseError(n)
		}
		var status uint64
		for len(one) > 0 {
			fnum, ftyp, m := protowire.ConsumeTag(one)
			if m < 0 {
				return false, protowire.ParseError(m)
			}
			one = one[m:]
			switch {
			case fnum == 1 && ftyp == protowire.VarintType:
				status, m = protowire.ConsumeVarint(one)
			case fnum == 5 && ftyp == protowire.BytesType:
				var msg []byte
				msg, m = protowire.ConsumeBytes(one)
				if len(msg) > 0 {
					return false, fmt.Errorf("gubernator: %s", msg)
				}
			default:
				m = protowire.ConsumeFieldValue(fnum, ftyp, one)
			}
			if m < 0 {
				return false, protowire.ParseError(m)
			}
			one = one[m:]
		}
		return status == 0, nil
	}
	return false, errors.New("gubernator: empty GetRateLimitsResp")
}

// workDir is the run's temporary directory: rules files, logs, Redis dirs.
func workDir() (string, func(), error) {
	dir, err := os.MkdirTemp("", "allot-bench-peers-")
	if err != nil {
		return "", nil, err
	}
	return dir, func() { _ = os.RemoveAll(dir) }, nil
}

// buildAgent builds cmd/agent from the module this program runs in.
func buildAgent(ctx context.Context, dir string) (string, error) {
	root, err := moduleRoot(ctx)
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "agent")
	cmd := exec.CommandContext(ctx, "go", "build", "-o", bin, "./cmd/agent")
	cmd.Dir = root
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("peers: go build ./cmd/agent: %w: %s", err, out.String())
	}
	return bin, nil
}

func moduleRoot(ctx context.Context) (string, error) {
	out, err := exec.CommandContext(ctx, "go", "env", "GOMOD").Output()
	if err != nil {
		return "", fmt.Errorf("peers: go env GOMOD: %w", err)
	}
	mod := strings.TrimSpace(string(out))
	if mod == "" || mod == os.DevNull {
		return "", errors.New("peers: not inside the allot module (run from the repository)")
	}
	return filepath.Dir(mod), nil
}

// installPeers makes sure each peer named in systems has its binary in
// binDir, installing it with `go install` when asked. It returns the
// systems to run and a note for each peer left out.
func installPeers(ctx context.Context, cfg Config) ([]string, []string, error) {
	var run, notes []string
	for _, name := range cfg.Systems {
		p, ok := peers[name]
		if !ok {
			run = append(run, name)
			continue
		}
		bin := filepath.Join(cfg.BinDir, p.bin)
		if _, err := os.Stat(bin); err != nil && cfg.Install {
			cmd := exec.CommandContext(ctx, "go", "install", p.pkg)
			cmd.Env = append(os.Environ(), "GOBIN="+cfg.BinDir, "GOFLAGS=-mod=mod")
			cmd.Dir = os.TempDir() // outside this module: the peer resolves its own dependencies
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err != nil {
				notes = append(notes, fmt.Sprintf("%s: `go install %s` failed: %v", name, p.pkg, lastLine(out.String())))
				if cfg.RequirePeers {
					return nil, nil, fmt.Errorf("peers: go install %s: %w: %s", p.pkg, err, out.String())
				}
				continue
			}
		}
		if _, err := os.Stat(bin); err != nil {
			if cfg.RequirePeers {
				return nil, nil, fmt.Errorf("peers: %s is not installed at %s (ALLOT_BENCH_PEERS=1 requires it; -install installs it): %w", name, bin, err)
			}
			notes = append(notes, fmt.Sprintf("%s: not installed at %s, left out (`make bench-peers` installs it)", name, bin))
			continue
		}
		run = append(run, name)
	}
	return run, notes, nil
}

func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}

// rawCodec passes pre-encoded protobuf bytes through gRPC, for the one
// Gubernator call.
type rawCodec struct{}

func (rawCodec) Name() string { return "proto" }

func (rawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(*v.(*[]byte))}, nil
}

func (rawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	*v.(*[]byte) = data.Materialize()
	return nil
}
