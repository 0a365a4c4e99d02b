package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/sim"
)

// Binaries are the built commands a run starts.
type Binaries struct {
	Agent, Coordinator string
}

// Build builds cmd/agent and cmd/coordinator into dir with the go command
// found on PATH. It must run inside the module.
func Build(ctx context.Context, dir string) (Binaries, error) {
	gobin, err := exec.LookPath("go")
	if err != nil {
		return Binaries{}, fmt.Errorf("chaos: the go command builds the binaries: %w", err)
	}
	b := Binaries{Agent: filepath.Join(dir, "agent"), Coordinator: filepath.Join(dir, "coordinator")}
	for bin, pkg := range map[string]string{b.Agent: "github.com/allot-dev/allot/cmd/agent",
		b.Coordinator: "github.com/allot-dev/allot/cmd/coordinator"} {
		out, err := exec.CommandContext(ctx, gobin, "build", "-o", bin, pkg).CombinedOutput()
		if err != nil {
			return b, fmt.Errorf("chaos: go build %s: %w\n%s", pkg, err, out)
		}
	}
	return b, nil
}

// Cluster is the processes and proxies of one run.
type Cluster struct {
	sc     *Scenario
	dir    string
	bins   Binaries
	sup    *Supervisor
	owners *Owners
	ports  Ports
	logf   func(string, ...any)
	// traceLease starts the coordinators and the agents at -log-level
	// debug (the agents otherwise at warn).
	traceLease bool

	etcd     *Proc
	etcdAddr string
	prefix   string
	coords   []*Coord
	regions  []*Region
	proxies  []*Proxy
	docPath  string
	// auth holds the files regions prove their names with: the
	// coordinators' certificate and the CA it chains to, their tokens
	// file, and each region's token.
	auth     clusterAuth
	http     *http.Client
	closeMu  sync.Mutex
	isClosed bool
	bg       sync.WaitGroup
}

// Coord is one coordinator process and the proxy agents reach it through.
type Coord struct {
	Index        int
	Proc         *Proc
	Listen, HTTP string
	Proxy        *Proxy
	// Region is the scenario region it stands in (for the WAN latency).
	Region string
}

// Region is one region's Redis and agents.
type Region struct {
	Name   string
	Redis  []*RedisNode // [0] the initial primary; [1] its replica (Sentinel regions)
	Sent   []*Proc      // sentinels
	SentAt []string     // their addresses
	Agents []*Agent
	// Gossip is the proxy agents 1… join agent 0 through (gossip_split
	// regions only).
	Gossip *Proxy
}

// RedisNode is one redis-server and its proxies: a shared one that
// attributes each connection to its process (for sentinels, replicas and,
// in a Sentinel region, the agents, which reach the address the sentinels
// name), and in a region without Sentinel one per agent, whose party is
// fixed, so an agent's reconnections cost no lookup.
type RedisNode struct {
	Proc     *Proc
	Port     int
	Proxy    *Proxy
	PerAgent map[string]*Proxy
}

// proxies returns every proxy in front of n.
func (n *RedisNode) proxies() []*Proxy {
	out := []*Proxy{n.Proxy}
	for _, p := range n.PerAgent {
		out = append(out, p)
	}
	return out
}

// Agent is one agent process.
type Agent struct {
	Name, Region       string
	Index              int
	Proc               *Proc
	GRPC, HTTP, Gossip string
}

// sentinelMaster is the master name the sentinels monitor.
const sentinelMaster = "allot"

func (c *Cluster) path(name string) string { return filepath.Join(c.dir, name) }

// logLevel is a process's -log-level: debug when the run traces the lease
// protocol, else def.
func (c *Cluster) logLevel(def string) string {
	if c.traceLease {
		return "debug"
	}
	return def
}

// StartCluster starts every process of sc and waits until the system is
// ready to be measured: one leader, every region with its members, one
// speaker and a live lease, and the leader past its learning period. With
// traceLease the coordinators and the speaking agents log every lease
// message (-log-level debug).
func StartCluster(ctx context.Context, sc *Scenario, bins Binaries, dir string, logf func(string, ...any), traceLease bool) (c *Cluster, err error) {
	owners := NewOwners()
	c = &Cluster{sc: sc, dir: dir, bins: bins, owners: owners, sup: NewSupervisor(dir, owners), logf: logf,
		http: &http.Client{Timeout: time.Second}, traceLease: traceLease}
	defer func() {
		if err != nil {
			c.Close()
			c = nil
		}
	}()
	if err := c.writeConfig(); err != nil {
		return c, err
	}
	if err := c.writeAuth(); err != nil {
		return c, err
	}
	if sc.Block.Coordinators > 1 {
		if err := c.startEtcd(ctx); err != nil {
			return c, err
		}
	}
	if err := c.startCoordinators(ctx); err != nil {
		return c, err
	}
	for _, rs := range sc.Sim.Regions {
		if err := c.startRegion(ctx, rs); err != nil {
			return c, err
		}
	}
	if err := c.applyWAN(); err != nil {
		return c, err
	}
	return c, c.waitReady(ctx)
}

// Close kills every process and closes every proxy.
func (c *Cluster) Close() {
	c.closeMu.Lock()
	defer c.closeMu.Unlock()
	if c.isClosed {
		return
	}
	c.isClosed = true
	c.sup.Close()
	for _, p := range c.proxies {
		_ = p.Close() // tearing down; a proxy already closed has nothing more to say
	}
}

func (c *Cluster) newProxy(name, target string) (*Proxy, error) {
	return c.addProxy(NewProxy(name, "127.0.0.1:0", target, c.owners.Of))
}

// newPartyProxy is a proxy used by one party only.
func (c *Cluster) newPartyProxy(name, target, party string) (*Proxy, error) {
	return c.addProxy(NewProxy(name, "127.0.0.1:0", target, func(net.Conn) string { return party }))
}

func (c *Cluster) addProxy(p *Proxy, err error) (*Proxy, error) {
	if err != nil {
		return nil, err
	}
	c.proxies = append(c.proxies, p)
	return p, nil
}

// rulesText is the agents' rules file: one global rule per scenario rule,
// matched by path /<rule>/…, with the rule's failure policy.
func rulesText(s *sim.Scenario) string {
	var b strings.Builder
	b.WriteString("version: chaos\ndomain: chaos\nrules:\n")
	for _, r := range s.Rules {
		pol := "fail_closed"
		switch r.Policy {
		case sim.PolicyOpen:
			pol = "fail_open"
		case sim.PolicyEmergency:
			pol = "{policy: emergency}"
		}
		fmt.Fprintf(&b, "  - name: %s\n    match: {path: \"/%s/*\"}\n    limit: \"%s\"\n    scope: global\n    on_unavailable: %s\n",
			r.Name, r.Name, quota(r), pol)
	}
	return b.String()
}

func (c *Cluster) regionNames() []string {
	var out []string
	for _, r := range c.sc.Sim.Regions {
		out = append(out, r.Name)
	}
	return out
}

func (c *Cluster) writeConfig() error {
	s := c.sc.Sim
	rules := rulesText(s)
	if err := os.WriteFile(c.path("rules.yaml"), []byte(rules), 0o600); err != nil {
		return fmt.Errorf("chaos: rules file: %w", err)
	}
	ttl, refresh, drift, hold, demandTTL := leaseTimings(s)
	var doc strings.Builder
	fmt.Fprintf(&doc, "regions: [%s]\nreserve: %v\n", strings.Join(c.regionNames(), ", "), c.sc.Reserve())
	fmt.Fprintf(&doc, "lease: {ttl: %s, refresh: %s, drift: %s, hold: %s, demand_ttl: %s}\n", ttl, refresh, drift, hold, demandTTL)
	doc.WriteString("rules: |\n")
	for _, line := range strings.Split(strings.TrimRight(rules, "\n"), "\n") {
		doc.WriteString("  " + line + "\n")
	}
	c.docPath = c.path("budgets.yaml")
	if err := os.WriteFile(c.docPath, []byte(doc.String()), 0o600); err != nil {
		return fmt.Errorf("chaos: budgets document: %w", err)
	}
	return nil
}

func (c *Cluster) startEtcd(ctx context.Context) error {
	bin, err := exec.LookPath("etcd")
	if err != nil {
		return fmt.Errorf("chaos: etcd not installed (make test installs etcd-server): %w", err)
	}
	cp, err := c.ports.Next()
	if err != nil {
		return err
	}
	pp, err := c.ports.Next()
	if err != nil {
		return err
	}
	client, peer := fmt.Sprintf("http://127.0.0.1:%d", cp), fmt.Sprintf("http://127.0.0.1:%d", pp)
	c.etcdAddr = fmt.Sprintf("127.0.0.1:%d", cp)
	c.prefix = "/allot-chaos"
	c.etcd = c.sup.Add("etcd", "", bin, "--name", "chaos", "--data-dir", c.path("etcd-data"),
		"--listen-client-urls", client, "--advertise-client-urls", client,
		"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
		"--initial-cluster", "chaos="+peer, "--log-level", "error")
	if err := c.etcd.Start(); err != nil {
		return err
	}
	// `rules put` needs etcd serving: retrying it is the readiness check.
	var last []byte
	err = waitFor(ctx, 30*time.Second, "etcd serving and the budgets stored", func() bool {
		cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		out, err := exec.CommandContext(cctx, c.bins.Coordinator, "rules", "put", "-etcd", c.etcdAddr,
			"-prefix", c.prefix, "-f", c.docPath).CombinedOutput()
		last = out
		return err == nil
	})
	if err != nil {
		return fmt.Errorf("%w\n%s", err, last)
	}
	return nil
}

func (c *Cluster) startCoordinators(ctx context.Context) error {
	s := c.sc.Sim
	for i := range c.sc.Block.Coordinators {
		listen, err := c.ports.Addr()
		if err != nil {
			return err
		}
		httpAddr, err := c.ports.Addr()
		if err != nil {
			return err
		}
		px, err := c.newProxy(fmt.Sprintf("coordinator-%d", i), listen)
		if err != nil {
			return err
		}
		region := s.Coordinator.Regions[min(i, len(s.Coordinator.Regions)-1)]
		// Regions reach a coordinator through its proxy, and so does a
		// redirect: the advertised address is the proxy's.
		args := []string{"serve", "-listen", listen, "-http", httpAddr, "-advertise", px.Addr(), "-budgets", c.docPath}
		args = append(args, c.auth.coordinatorArgs()...)
		args = append(args, "-log-level", c.logLevel("info"))
		if c.etcd != nil {
			args = append(args, "-etcd", c.etcdAddr, "-prefix", c.prefix, "-session-ttl", strconv.Itoa(sessionTTL(s)))
		}
		p := c.sup.Add(fmt.Sprintf("coordinator-%d", i), "", c.bins.Coordinator, args...)
		if err := p.Start(); err != nil {
			return err
		}
		c.coords = append(c.coords, &Coord{Index: i, Proc: p, Listen: listen, HTTP: httpAddr, Proxy: px, Region: region})
	}
	return waitFor(ctx, 30*time.Second, "a coordinator leads", func() bool {
		_, err := c.Leader()
		return err == nil
	})
}

func redisArgs(port int, dir string, extra ...string) []string {
	return append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--maxmemory-policy", "noeviction", "--dir", dir}, extra...)
}

func (c *Cluster) startRedis(ctx context.Context, name string, extra func(proxyPort int) []string) (*RedisNode, error) {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return nil, fmt.Errorf("chaos: redis-server not installed (make test installs it): %w", err)
	}
	port, err := c.ports.Next()
	if err != nil {
		return nil, err
	}
	px, err := c.newProxy(name, fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return nil, err
	}
	dir := c.path(name)
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, err
	}
	var ex []string
	if extra != nil {
		ex = extra(proxyPort(px))
	}
	p := c.sup.Add(name, name, bin, redisArgs(port, dir, ex...)...)
	n := &RedisNode{Proc: p, Port: port, Proxy: px}
	if err := p.Start(); err != nil {
		return nil, err
	}
	return n, c.waitRedis(ctx, n)
}

// waitRedis waits until the server answers PING on its own port.
func (c *Cluster) waitRedis(ctx context.Context, n *RedisNode) error {
	cl := redis.NewClient(&redis.Options{Addr: fmt.Sprintf("127.0.0.1:%d", n.Port), MaxRetries: -1})
	defer cl.Close()
	return waitFor(ctx, 10*time.Second, n.Proc.Name+" answers PING", func() bool {
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		return cl.Ping(pctx).Err() == nil
	})
}

func (c *Cluster) startRegion(ctx context.Context, rs sim.RegionSpec) error {
	s, b := c.sc.Sim, c.sc.Block
	reg := &Region{Name: rs.Name}
	c.regions = append(c.regions, reg)
	sentinel := slices.Contains(b.Sentinel, rs.Name)
	announce := func(pp int) []string {
		if !sentinel {
			return nil
		}
		// Replicas announce their proxy, so the sentinels (and through
		// them the agents) reach every server through its proxy.
		return []string{"--replica-announce-ip", "127.0.0.1", "--replica-announce-port", strconv.Itoa(pp)}
	}
	primary, err := c.startRedis(ctx, "redis-"+rs.Name, announce)
	if err != nil {
		return err
	}
	reg.Redis = append(reg.Redis, primary)
	redisFlag := []string{"-redis", primary.Proxy.Addr()}
	if sentinel {
		replica, err := c.startRedis(ctx, "redis-"+rs.Name+"-replica", func(pp int) []string {
			return append(announce(pp), "--replicaof", "127.0.0.1", strconv.Itoa(proxyPort(primary.Proxy)))
		})
		if err != nil {
			return err
		}
		reg.Redis = append(reg.Redis, replica)
		bin, err := exec.LookPath("redis-sentinel")
		if err != nil {
			return fmt.Errorf("chaos: redis-sentinel not installed (make test installs it): %w", err)
		}
		for i := range 3 {
			port, err := c.ports.Next()
			if err != nil {
				return err
			}
			dir := c.path(fmt.Sprintf("sentinel-%s-%d", rs.Name, i))
			if err := os.MkdirAll(dir, 0o750); err != nil {
				return err
			}
			conf := filepath.Join(dir, "sentinel.conf")
			body := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s 127.0.0.1 %d 2\n"+
				"sentinel down-after-milliseconds %s 1000\nsentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
				port, dir, sentinelMaster, proxyPort(primary.Proxy), sentinelMaster, sentinelMaster, sentinelMaster)
			if err := os.WriteFile(conf, []byte(body), 0o600); err != nil {
				return err
			}
			name := fmt.Sprintf("sentinel-%s-%d", rs.Name, i)
			p := c.sup.Add(name, name, bin, conf)
			if err := p.Start(); err != nil {
				return err
			}
			reg.Sent = append(reg.Sent, p)
			reg.SentAt = append(reg.SentAt, fmt.Sprintf("127.0.0.1:%d", port))
		}
		if err := waitFor(ctx, 20*time.Second, "sentinels of "+rs.Name+" know the replica", func() bool {
			return c.sentinelsReady(ctx, reg)
		}); err != nil {
			return err
		}
		redisFlag = []string{"-redis", strings.Join(reg.SentAt, ","), "-redis-master", sentinelMaster}
	}

	_, refresh, drift, _, _ := leaseTimings(s)
	var coords []string
	for _, co := range c.coords {
		coords = append(coords, co.Proxy.Addr())
	}
	emptyOn := ""
	if s.Redis.OnFailover == "empty" {
		emptyOn = "*"
	}
	split := false
	for _, f := range c.sc.Faults {
		if f.Kind == FaultGossipSplit && f.Region == rs.Name {
			split = true
		}
	}
	for i := range rs.Agents {
		a := &Agent{Name: fmt.Sprintf("%s-%d", rs.Name, i), Region: rs.Name, Index: i}
		var err error
		if a.GRPC, err = c.ports.Addr(); err != nil {
			return err
		}
		if a.HTTP, err = c.ports.Addr(); err != nil {
			return err
		}
		if a.Gossip, err = c.ports.Addr(); err != nil {
			return err
		}
		args := []string{"-region", rs.Name, "-name", a.Name, "-rules", c.path("rules.yaml"),
			"-coordinators", strings.Join(coords, ","), "-regions", strings.Join(c.regionNames(), ","),
			"-reserve", strconv.FormatFloat(c.sc.Reserve(), 'g', -1, 64),
			"-gossip-bind", a.Gossip, "-grpc-listen", a.GRPC, "-http-listen", a.HTTP,
			"-lease-refresh", refresh.String(), "-lease-drift", drift.String(),
			"-redis-timeout", s.Agent.Timeout.String(),
			"-breaker-failures", strconv.Itoa(s.Agent.BreakerFailures), "-breaker-backoff", s.Agent.BreakerBackoff.String(),
			"-batch-window", s.Agent.BatchWindow.String(),
			"-batch-max-fraction", strconv.FormatFloat(s.Agent.BatchMaxFraction, 'g', -1, 64),
			"-log-level", c.logLevel("warn")}
		args = append(args, c.auth.agentArgs(rs.Name)...)
		if !sentinel {
			px, err := c.newPartyProxy("redis-"+rs.Name+"-for-"+a.Name, fmt.Sprintf("127.0.0.1:%d", primary.Port), a.Name)
			if err != nil {
				return err
			}
			if primary.PerAgent == nil {
				primary.PerAgent = map[string]*Proxy{}
			}
			primary.PerAgent[a.Name] = px
			redisFlag = []string{"-redis", px.Addr()}
		}
		args = append(args, redisFlag...)
		if emptyOn != "" {
			args = append(args, "-failover-empty", emptyOn)
		}
		if i == 1 && split {
			gp, err := c.newProxy("gossip-"+rs.Name, reg.Agents[0].Gossip)
			if err != nil {
				return err
			}
			reg.Gossip = gp
		}
		if i > 0 {
			join := reg.Agents[0].Gossip
			if reg.Gossip != nil {
				join = reg.Gossip.Addr()
			}
			args = append(args, "-gossip-join", join)
		}
		a.Proc = c.sup.Add(a.Name, a.Name, c.bins.Agent, args...)
		reg.Agents = append(reg.Agents, a)
	}
	if reg.Gossip != nil {
		// The split holds from the start: agents 1… cannot reach agent 0
		// to join it until the fault ends.
		reg.Gossip.Apply("split", Rule{Dir: Both, Link: Link{Drop: true}})
	}
	for _, a := range reg.Agents {
		if err := a.Proc.Start(); err != nil {
			return err
		}
	}
	return nil
}

func proxyPort(p *Proxy) int {
	a := p.Addr()
	n, _ := strconv.Atoi(a[strings.LastIndexByte(a, ':')+1:])
	return n
}

// sentinelsReady reports whether every sentinel names the primary's proxy
// as the master and knows a replica.
func (c *Cluster) sentinelsReady(ctx context.Context, reg *Region) bool {
	for _, addr := range reg.SentAt {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		reps, err := sc.Replicas(qctx, sentinelMaster).Result()
		cancel()
		_ = sc.Close() // a query client; the answer is already in hand
		if err != nil || len(reps) == 0 {
			return false
		}
	}
	return true
}

// SentinelMaster returns the master address the region's first answering
// sentinel names.
func (c *Cluster) SentinelMaster(ctx context.Context, reg *Region) (string, error) {
	var last error
	for _, addr := range reg.SentAt {
		sc := redis.NewSentinelClient(&redis.Options{Addr: addr, MaxRetries: -1})
		qctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
		a, err := sc.GetMasterAddrByName(qctx, sentinelMaster).Result()
		cancel()
		_ = sc.Close() // as above
		if err == nil && len(a) == 2 {
			return a[0] + ":" + a[1], nil
		}
		last = err
	}
	return "", fmt.Errorf("chaos: no sentinel of %s names a master: %v", reg.Name, last)
}

// oneWay is the scenario's one-way latency from region a to b, as the
// simulator reads its matrix.
func oneWay(s *sim.Scenario, a, b string) time.Duration {
	if d, ok := s.Latency[a][b]; ok {
		return d
	}
	if d, ok := s.Latency[b][a]; ok {
		return d
	}
	return 500 * time.Microsecond
}

// applyWAN delays every agent's coordinator links by the scenario's
// one-way latency between its region and the coordinator's, with the
// scenario's jitter. Latencies below a millisecond are left to loopback.
func (c *Cluster) applyWAN() error {
	if !*c.sc.Block.WAN {
		return nil
	}
	s := c.sc.Sim
	for _, co := range c.coords {
		for _, reg := range c.regions {
			d := oneWay(s, reg.Name, co.Region)
			if d < time.Millisecond {
				continue
			}
			co.Proxy.Apply("wan-"+reg.Name, Rule{Parties: c.agentNames(reg), Dir: Both,
				Link: Link{Delay: d, Jitter: time.Duration(s.Jitter * float64(d))}})
		}
	}
	return nil
}

func (c *Cluster) agentNames(reg *Region) []string {
	var out []string
	for _, a := range reg.Agents {
		out = append(out, a.Name)
	}
	return out
}

// Region returns the named region.
func (c *Cluster) Region(name string) *Region {
	for _, r := range c.regions {
		if r.Name == name {
			return r
		}
	}
	return nil
}

// coordStatus is the part of a coordinator's /status.json the harness
// reads.
type coordStatus struct {
	Leading  bool
	Term     uint64
	Learning bool
}

func (c *Cluster) getJSON(ctx context.Context, url string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("chaos: GET %s: %s", url, resp.Status)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}

// Leader returns the coordinator that says it leads (and is not learning
// when ready is asked for).
func (c *Cluster) Leader() (*Coord, error) {
	var leaders []*Coord
	for _, co := range c.coords {
		if !co.Proc.Alive() {
			continue
		}
		var st coordStatus
		if err := c.getJSON(context.Background(), "http://"+co.HTTP+"/status.json", &st); err == nil && st.Leading {
			leaders = append(leaders, co)
		}
	}
	if len(leaders) != 1 {
		return nil, fmt.Errorf("chaos: %d coordinators lead", len(leaders))
	}
	return leaders[0], nil
}

// AgentStatus is the part of an agent's /status the harness reads.
type AgentStatus struct {
	Members   []string `json:"members"`
	Speaking  bool     `json:"speaking"`
	LeaseLive bool     `json:"lease_live"`
	Breaker   string   `json:"breaker"`
	Table     *struct {
		Speaker string `json:"speaker"`
		// Adopted is when the agent began deciding with the table, nil
		// when it does not say.
		Adopted *time.Time `json:"adopted"`
		Entries []struct {
			Rule    string `json:"rule"`
			Subject string `json:"subject"`
			Count   int64  `json:"count"`
			Burst   int64  `json:"burst"`
		} `json:"entries"`
	} `json:"table"`
}

// Status reads agent a's /status.
func (c *Cluster) Status(ctx context.Context, a *Agent) (AgentStatus, error) {
	var st AgentStatus
	err := c.getJSON(ctx, "http://"+a.HTTP+"/status", &st)
	return st, err
}

// Speaker returns the region's agent that says it speaks, if exactly one
// does.
func (c *Cluster) Speaker(ctx context.Context, reg *Region) (*Agent, error) {
	var sp []*Agent
	for _, a := range reg.Agents {
		if !a.Proc.Alive() {
			continue
		}
		if st, err := c.Status(ctx, a); err == nil && st.Speaking {
			sp = append(sp, a)
		}
	}
	if len(sp) != 1 {
		return nil, fmt.Errorf("chaos: %d agents of %s speak", len(sp), reg.Name)
	}
	return sp[0], nil
}

func (c *Cluster) splitRegion(name string) bool {
	for _, f := range c.sc.Faults {
		if f.Kind == FaultGossipSplit && f.Region == name {
			return true
		}
	}
	return false
}

// waitReady waits until every region has all its members, one speaker and
// a live lease (a split region: every agent answering), and the leader has
// ended its learning period, so the measured run starts in steady state.
func (c *Cluster) waitReady(ctx context.Context) error {
	var why string
	err := waitFor(ctx, 90*time.Second, "the system is ready", func() bool {
		for _, reg := range c.regions {
			speakers := 0
			for _, a := range reg.Agents {
				st, err := c.Status(ctx, a)
				if err != nil {
					why = a.Name + " does not answer: " + err.Error()
					return false
				}
				if c.splitRegion(reg.Name) {
					continue
				}
				if len(st.Members) != len(reg.Agents) || !st.LeaseLive {
					why = fmt.Sprintf("%s: members %v, lease live %v", a.Name, st.Members, st.LeaseLive)
					return false
				}
				if st.Speaking {
					speakers++
				}
			}
			if !c.splitRegion(reg.Name) && speakers != 1 {
				why = fmt.Sprintf("%s has %d speakers", reg.Name, speakers)
				return false
			}
		}
		co, err := c.Leader()
		if err != nil {
			why = err.Error()
			return false
		}
		var st coordStatus
		if err := c.getJSON(ctx, "http://"+co.HTTP+"/status.json", &st); err != nil || st.Learning {
			why = "the leader is learning"
			return false
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w (%s)", err, why)
	}
	return nil
}
