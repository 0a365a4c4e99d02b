// Command agent is allot's regional agent, run as a sidecar or a shared
// service beside the gateways of one region. It decides requests locally
// from the region's leased slice of every global budget (package region)
// and serves them as
//
//   - Envoy's rate limit service v3 (gRPC), so Envoy, Istio and Envoy
//     Gateway use it unchanged;
//   - the project's allow API over gRPC (allot.allot.v1.AllowService) and
//     HTTP (POST /v1/allow: the request as JSON, the answer a plain JSON
//     object with every field; status.go);
//   - Prometheus metrics on /metrics, /healthz and /readyz, and /status.
//
// Every flag has an environment variable (ALLOT_ and the flag's name in
// upper case with '-' as '_'); a flag on the command line wins. With no
// Redis the agent uses an in-process store (one agent, the embedded
// default); with no coordinator it runs on floors alone, and with no other
// region either its floor is the whole budget.
//
//	agent -region eu -rules rules.yaml -redis 127.0.0.1:6379 \
//	      -coordinators 10.0.0.1:7000,10.0.0.2:7000 -regions eu,us,ap \
//	      -gossip-bind 127.0.0.1:7946 -gossip-join 127.0.0.1:7947
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/allot-dev/allot/agent"
	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/httpserver"
	"github.com/allot-dev/allot/internal/heapfloor"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

// defaultHeapFloorMiB is -heap-floor-mib's default. The agent's live heap
// is a few MiB while it allocates a few KiB per decision, so under GOGC
// alone it collected many times a second, and the collections (with the
// stacks they shrink and the calls then grow again) were the largest cost
// after gRPC's in a profile of its Redis path.
const defaultHeapFloorMiB = 64

func main() {
	if err := run(context.Background(), os.Args[1:], os.Getenv, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, "agent:", err)
		os.Exit(1)
	}
}

// options are the agent's settings, from flags and the environment.
type options struct {
	region, name, rulesPath            string
	redisAddrs, redisMaster, redisPass string
	redisPrefix                        string
	redisTimeout, redisMaxTimeout      time.Duration
	gossipAdvertise                    string
	coordinators, regions, weights     string
	reserve                            float64
	floors                             lease.Split // -regions, -weights and -reserve, as agent.Floors gives them
	alone                              bool        // no coordinator and no other region: floors are whole budgets
	policy                             string
	gossipBind, gossipJoin             string
	grpcListen, httpListen             string
	tlsCert, tlsKey, tlsCA             string
	coordTLS, redisTLS                 bool
	failoverEmpty                      string
	leaseRefresh, leaseDrift           time.Duration
	logLevel                           string
	breakerFailures                    int
	breakerBackoff, batchWindow        time.Duration
	batchFraction                      float64
	heapFloorMiB                       int
	b                                  boundary // boundary.go
	dl                                 decisionLogFlags
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("agent", flag.ContinueOnError)
	fs.SetOutput(stderr)
	host, _ := os.Hostname()
	defName := fmt.Sprintf("%s-%d", host, os.Getpid())
	lc := lease.DefaultConfig()
	cc := region.DefaultConfig()
	fs.StringVar(&o.region, "region", "", "this agent's region (required)")
	fs.StringVar(&o.name, "name", defName, "this agent's name, unique in the region")
	fs.StringVar(&o.rulesPath, "rules", "", "rules file (YAML; reloaded on change and SIGHUP) (required)")
	fs.StringVar(&o.redisAddrs, "redis", "", "regional Redis: host:port (single), several (Cluster) or Sentinel addresses with -redis-master; empty: in-process store")
	fs.StringVar(&o.redisMaster, "redis-master", "", "Sentinel master name (makes -redis Sentinel addresses)")
	fs.StringVar(&o.redisPass, "redis-password", "", "Redis password")
	fs.StringVar(&o.redisPrefix, "redis-prefix", "allot:", "prefix of every Redis key the agent writes")
	fs.DurationVar(&o.redisTimeout, "redis-timeout", cc.Timeout, "shortest deadline of a Redis call; it follows the latency Redis answers with, up to -redis-max-timeout, then the rule's failure policy applies")
	fs.DurationVar(&o.redisMaxTimeout, "redis-max-timeout", cc.MaxTimeout, "longest deadline of a Redis call: a Redis slower than this counts as down (when not given, at least -redis-timeout)")
	fs.StringVar(&o.coordinators, "coordinators", "", "coordinator addresses, comma-separated; empty: floors alone")
	fs.BoolVar(&o.redisTLS, "redis-tls", false, "connect to Redis over TLS (server verified against -tls-ca; -tls-cert/-tls-key as client certificate when given)")
	fs.BoolVar(&o.coordTLS, "coordinator-tls", false, "TLS to the coordinators, verified against -coordinator-ca (else -tls-ca, else the system roots); with -tls-cert/-tls-key the certificate proves the region (mutual TLS)")
	fs.StringVar(&o.regions, "regions", "", "every region sharing the budgets, comma-separated, as the coordinator has them (floors); empty: this region alone")
	fs.StringVar(&o.weights, "weights", "", "floor weights in -regions order, comma-separated; empty: equal")
	fs.Float64Var(&o.reserve, "reserve", lease.DefaultReserve, "share of every budget kept out of floors for the coordinator to grant (none for an agent alone: no -coordinators, no other -regions)")
	fs.StringVar(&o.policy, "allocation-policy", "max-min", "allocation policy named in the budgets: max-min, proportional or static")
	fs.DurationVar(&o.leaseRefresh, "lease-refresh", lc.Refresh, "lease report interval until the coordinator names its own")
	fs.DurationVar(&o.leaseDrift, "lease-drift", lc.Drift, "clock drift margin over one lease TTL")
	fs.StringVar(&o.gossipBind, "gossip-bind", "", "memberlist bind address host:port for the region's agents; empty: this agent alone")
	fs.StringVar(&o.gossipJoin, "gossip-join", "", "memberlist addresses of other agents of the region, comma-separated")
	fs.StringVar(&o.gossipAdvertise, "gossip-advertise", "", "host:port the region's other agents reach this one's memberlist at (TCP and UDP), when not -gossip-bind (a NAT or a proxy)")
	fs.StringVar(&o.grpcListen, "grpc-listen", "127.0.0.1:8081", "gRPC address: Envoy RLS v3, the allow API, health")
	fs.StringVar(&o.httpListen, "http-listen", "127.0.0.1:8080", "HTTP address: /v1/allow, /metrics, /healthz, /readyz, /status")
	fs.StringVar(&o.tlsCert, "tls-cert", "", "TLS certificate (PEM) for the gRPC and HTTP servers")
	fs.StringVar(&o.tlsKey, "tls-key", "", "TLS key (PEM)")
	fs.StringVar(&o.tlsCA, "tls-ca", "", "CA (PEM) that client certificates of the gRPC and HTTP servers must chain to (mutual TLS: every client needs one), and that the coordinator's (without -coordinator-ca) and Redis's certificates must chain to")
	fs.StringVar(&o.failoverEmpty, "failover-empty", "", "rules (comma-separated, or *) whose buckets start empty after a detected Redis failover")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error; debug also logs the speaking agent's lease messages and table publications")
	fs.IntVar(&o.breakerFailures, "breaker-failures", cc.BreakerFailures, "Redis failures that open the circuit breaker: in a row, or within a second when they are at least half its calls")
	fs.DurationVar(&o.breakerBackoff, "breaker-backoff", cc.BreakerBackoff, "how long the breaker stays open before a probe (less when the agent's round report finds Redis back)")
	fs.DurationVar(&o.batchWindow, "batch-window", cc.BatchWindow, "local demand one token batch covers")
	fs.Float64Var(&o.batchFraction, "batch-max-fraction", cc.BatchMaxFraction, "largest batch, as a fraction of the region's burst")
	fs.IntVar(&o.heapFloorMiB, "heap-floor-mib", defaultHeapFloorMiB, "MiB the heap may grow over its live size before a garbage collection (GOGC's percent when that is more; 0: GOGC alone)")
	o.b.register(fs)
	o.dl.register(fs)

	// The environment fills in every flag not given on the command line.
	set := map[string]bool{}
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := "ALLOT_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v := getenv(env); v != "" {
			if err := fs.Set(f.Name, v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %w", env, v, err)
			}
			set[f.Name] = true
		}
	})
	if envErr != nil {
		return o, envErr
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case o.region == "":
		return o, errors.New("-region (ALLOT_REGION) is required")
	case o.rulesPath == "":
		return o, errors.New("-rules (ALLOT_RULES) is required")
	case (o.tlsCert == "") != (o.tlsKey == ""):
		return o, fmt.Errorf("-tls-cert=%q and -tls-key=%q must be given together", o.tlsCert, o.tlsKey)
	case o.coordTLS && o.tlsCert == "" && o.b.coordTokenFile == "":
		return o, errors.New("-coordinator-tls needs -tls-cert and -tls-key, or -coordinator-token-file")
	case o.coordinators != "" && o.regions == "":
		// Floors must be the coordinator's: a region that thought itself
		// alone would take the whole budget as its floor.
		return o, fmt.Errorf("-coordinators=%q needs -regions (every region sharing the budgets, as the coordinator has them)", o.coordinators)
	}
	if o.heapFloorMiB < 0 {
		return o, fmt.Errorf("-heap-floor-mib=%d must be ≥ 0 (0: GOGC alone)", o.heapFloorMiB)
	}
	if set["redis-max-timeout"] && o.redisMaxTimeout < o.redisTimeout {
		return o, fmt.Errorf("-redis-max-timeout=%s must be ≥ -redis-timeout=%s", o.redisMaxTimeout, o.redisTimeout)
	}
	var err error
	if o.floors, o.alone, err = floorSplit(o); err != nil {
		return o, err
	}
	return o, o.b.validate(o)
}

// floorSplit is agent.Floors over the flags, -weights parsed. An agent
// alone drops -reserve and -weights; they are checked first as a region's
// split is (region.ValidateFloors), so that a mistake shows at the first
// start and not when the region is joined.
func floorSplit(o options) (lease.Split, bool, error) {
	var weights []int64
	for _, w := range split(o.weights) {
		n, err := strconv.ParseInt(w, 10, 64)
		if err != nil {
			return lease.Split{}, false, fmt.Errorf("-weights=%q: %w", o.weights, err)
		}
		weights = append(weights, n)
	}
	spec, alone := agent.Floors(o.region, split(o.regions), weights, o.reserve, o.coordinators != "")
	if alone {
		dropped := lease.Split{Regions: []string{o.region}, Weights: weights, Reserve: o.reserve}
		if err := region.ValidateFloors(dropped, o.region); err != nil {
			return lease.Split{}, false, fmt.Errorf("-reserve=%v, -weights=%q: %w", o.reserve, o.weights, err)
		}
	}
	return spec, alone, nil
}

func split(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func run(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	o, err := parse(args, getenv, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("-log-level=%q: %w", o.logLevel, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level})).With("region", o.region, "agent", o.name)
	defer heapfloor.Start(uint64(o.heapFloorMiB) << 20)() // #nosec G115 -- parse refuses a negative floor
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()

	spec, alone := o.floors, o.alone
	policy, err := lease.ParseAllocationPolicy(o.policy)
	if err != nil {
		return fmt.Errorf("-allocation-policy: %w", err)
	}

	cfg := agent.DefaultConfig()
	cfg.Name = o.name
	cfg.Core.Region = o.region
	cfg.Core.Floors = spec
	cfg.Core.BreakerFailures, cfg.Core.BreakerBackoff = o.breakerFailures, o.breakerBackoff
	cfg.Core.BreakerMaxBackoff = max(cfg.Core.BreakerMaxBackoff, o.breakerBackoff)
	cfg.Core.Timeout, cfg.Core.MaxTimeout = o.redisTimeout, max(o.redisMaxTimeout, o.redisTimeout)
	cfg.Core.BatchWindow, cfg.Core.BatchMaxFraction = o.batchWindow, o.batchFraction
	cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Policy = o.leaseRefresh, o.leaseDrift, policy
	emptyOn := split(o.failoverEmpty)

	// Rules, reloaded on change and SIGHUP.
	var ag *agent.Agent
	var rulesMetrics *limiter.RulesMetrics
	watcher, err := rules.WatchFile(o.rulesPath, rules.WatchConfig{Interval: time.Second, SIGHUP: true, Logger: logger,
		Notify: func(u rules.Update) {
			if rulesMetrics != nil {
				rulesMetrics.Reload(u)
			}
			if u.Changed && ag != nil {
				if err := ag.SetRules(u.New, emptyOn); err != nil {
					logger.Error("agent: rules change not applied to the lease", "err", err)
				}
			}
		}})
	if err != nil {
		return err
	}
	set := watcher.Current()
	cfg.Core.Rules = region.RuleConfigs(set, emptyOn)
	cfg.Speaker.Budgets = region.Budgets(set, spec, policy)

	deps := agent.Deps{Logger: logger, Namer: region.NewNamer(set), Seed: uint64(time.Now().UnixNano())}
	// TLS.
	var serverTLS, clientTLS *tls.Config
	if o.tlsCert != "" {
		if serverTLS, clientTLS, err = loadTLS(o.tlsCert, o.tlsKey, o.tlsCA); err != nil {
			return err
		}
	}
	// The regional store.
	var collectMemory map[string]*bucket.Memory
	if addrs := split(o.redisAddrs); len(addrs) > 0 {
		var c redis.UniversalClient
		if o.redisTLS {
			rt, err := redisTLSConfig(clientTLS, o.tlsCA)
			if err != nil {
				return err
			}
			// redisstore.NewUniversalClient's settings, plus TLS.
			ro := redisstore.ClientOptions(addrs, o.redisMaster, o.redisPass)
			ro.TLSConfig = rt
			c = redis.NewUniversalClient(ro)
		} else {
			c = redisstore.NewUniversalClient(addrs, o.redisMaster, o.redisPass)
		}
		defer c.Close()
		// The agent gives each call the breaker's deadline (which follows
		// Redis's latency); the store's own bound is the longest of them.
		rs, err := redisstore.New(c, redisstore.Options{Prefix: o.redisPrefix, Timeout: cfg.Core.MaxTimeout})
		if err != nil {
			return err
		}
		deps.Store, deps.Redis = rs, c
		// The table and demand reports are off the decision path: they may
		// wait longer than a decision would.
		deps.Shared = agent.NewRedisShared(c, o.redisPrefix, o.region, max(cfg.Core.MaxTimeout, time.Second), time.Hour)
		logger.Info("agent: regional store is Redis", "addrs", addrs, "sentinel_master", o.redisMaster)
	} else {
		mem := bucket.NewMemory(bucket.MemoryOptions{MaxKeys: o.b.memoryMaxKeys})
		deps.Store = mem
		collectMemory = map[string]*bucket.Memory{"buckets": mem}
		logger.Info("agent: no Redis configured; deciding in process (one agent per region)", "max_keys", o.b.memoryMaxKeys)
	}
	// Membership.
	if o.gossipBind != "" {
		gc := agent.DefaultGossipConfig()
		gc.Name, gc.Region, gc.Join = o.name, o.region, split(o.gossipJoin)
		if gc.BindAddr, gc.BindPort, err = agent.HostPort(o.gossipBind); err != nil {
			return fmt.Errorf("-gossip-bind=%q: %w", o.gossipBind, err)
		}
		if o.gossipAdvertise != "" {
			if gc.AdvertiseAddr, gc.AdvertisePort, err = agent.HostPort(o.gossipAdvertise); err != nil {
				return fmt.Errorf("-gossip-advertise=%q: %w", o.gossipAdvertise, err)
			}
		}
		g, err := agent.StartGossip(gc)
		if err != nil {
			return err
		}
		defer g.Leave(time.Second)
		deps.Membership = g
		logger.Info("agent: gossiping", "addr", g.Addr(), "join", gc.Join)
	}
	// The coordinator.
	coordAuth := "none"
	if addrs := split(o.coordinators); len(addrs) > 0 {
		cc := coordinator.ClientConfig{Addrs: addrs, Region: o.region}
		if coordAuth, err = o.b.coordinatorAuth(o, &cc, clientTLS); err != nil {
			return err
		}
		warnInsecure(logger, coordAuth, addrs)
		client, err := coordinator.NewClient(cc)
		if err != nil {
			return err
		}
		defer client.Close()
		deps.Transport = client
		logger.Info("agent: leasing from the coordinators", "addrs", addrs, "regions", spec.Regions, "auth", coordAuth)
	} else if alone {
		logger.Info("agent: no coordinator and no other region configured; the region's floors are its whole budgets")
	} else {
		logger.Info("agent: no coordinator configured; running on floors alone", "regions", spec.Regions, "reserve", spec.Reserve)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	deps.Metrics = agent.NewMetrics(reg)
	if rulesMetrics, err = limiter.NewRulesMetrics(reg); err != nil {
		return err
	}
	rulesMetrics.SetRules(set)
	authInfo(reg, coordAuth)
	if collectMemory != nil {
		reg.MustRegister(limiter.NewMemoryCollector(collectMemory))
	}
	callers, err := o.b.callers()
	if err != nil {
		return err
	}
	reg.MustRegister(callers)

	ag, err = agent.New(cfg, deps)
	if err != nil {
		return err
	}
	store, closeLog, err := o.dl.wrap(ctx, ag.Store(), watcher, o.region, logger)
	if err != nil {
		return err
	}
	defer closeLog()
	lim, err := limiter.New(limiter.Config{Rules: watcher, Store: store, Logger: logger, Bounds: o.b.bounds})
	if err != nil {
		return err
	}

	// Servers.
	hs := health.NewServer()
	gopts := append(rls.ServerOptions(), grpcGuard(callers)...)
	if serverTLS != nil {
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(serverTLS)))
	}
	gs := grpc.NewServer(gopts...)
	rs, err := rls.New(rls.Config{Limiter: lim, Rules: watcher, Logger: logger, Bounds: o.b.bounds,
		UnknownDomain: rls.DomainAction(o.b.rlsUnknownDomain), MaxDescriptors: o.b.rlsMaxDescriptors})
	if err != nil {
		return err
	}
	reg.MustRegister(rs)
	rls.Register(gs, rs, hs)
	as, err := grpclimit.NewAllowServer(lim, grpclimit.WithBounds(o.b.bounds))
	if err != nil {
		return err
	}
	grpclimit.RegisterAllow(gs, as, hs)
	healthpb.RegisterHealthServer(gs, hs)
	gl, err := net.Listen("tcp", o.grpcListen)
	if err != nil {
		return fmt.Errorf("-grpc-listen=%q: %w", o.grpcListen, err)
	}
	hl, err := net.Listen("tcp", o.httpListen)
	if err != nil {
		return fmt.Errorf("-http-listen=%q: %w", o.httpListen, err)
	}
	info := map[string]string{"coordinator_auth": coordAuth, "allow_auth": callers.Mode()}
	hsrv, err := httpserver.New(o.b.http, mux(lim, ag, reg, watcher, callers, o.b, info), serverTLS)
	if err != nil {
		return err
	}
	reg.MustRegister(httpserver.NewCollector(map[string]*httpserver.Server{"agent": hsrv}))

	runCtx, cancelRun := context.WithCancel(context.Background())
	agentDone := make(chan struct{})
	go func() { defer close(agentDone); _ = ag.Run(runCtx) }() // Run ends with nil when runCtx does
	go watcher.Run(runCtx)
	errc := make(chan error, 2)
	go func() { errc <- gs.Serve(gl) }()
	go func() { errc <- hsrv.Serve(hl) }()
	logger.Info("agent: serving", "grpc", gl.Addr().String(), "http", hl.Addr().String(), "rules", set.Version())

	var serveErr error
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	}
	logger.Info("agent: stopping")
	hs.Shutdown()
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = hsrv.Shutdown(sctx)
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-sctx.Done():
		gs.Stop()
	}
	// The agent returns its batch tokens (and releases the lease when it
	// is the region's last agent) as it stops.
	cancelRun()
	<-agentDone
	if errors.Is(serveErr, http.ErrServerClosed) || errors.Is(serveErr, grpc.ErrServerStopped) {
		serveErr = nil
	}
	return serveErr
}

func loadTLS(certFile, keyFile, caFile string) (server, client *tls.Config, err error) {
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, nil, fmt.Errorf("-tls-cert=%q -tls-key=%q: %w", certFile, keyFile, err)
	}
	server = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	client = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := certPool("-tls-ca", caFile)
		if err != nil {
			return nil, nil, err
		}
		server.ClientCAs, server.ClientAuth = pool, tls.RequireAndVerifyClientCert
		client.RootCAs = pool
	}
	return server, client, nil
}

// redisTLSConfig is the client TLS for Redis: the agent's client
// certificate when it has one, the CA in caFile (else the system roots).
func redisTLSConfig(client *tls.Config, caFile string) (*tls.Config, error) {
	if client != nil {
		return client.Clone(), nil
	}
	tc := &tls.Config{MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pool, err := certPool("-tls-ca", caFile)
		if err != nil {
			return nil, err
		}
		tc.RootCAs = pool
	}
	return tc, nil
}

// certPool reads the CA certificates (PEM) in file, given by flag.
func certPool(flag, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s=%q: %w", flag, file, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s=%q: no certificate found", flag, file)
	}
	return pool, nil
}

// mux serves the HTTP endpoints; info is added to /status, and callers
// guards /v1/allow.
func mux(lim limiter.Limiter, ag *agent.Agent, reg *prometheus.Registry, src rules.Source, callers *auth.Callers, b boundary, info map[string]string) *http.ServeMux {
	m := http.NewServeMux()
	m.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	m.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("ok\n")) // the client has gone; nothing is left to tell it
	})
	m.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		st := ag.Status()
		if st.Breaker == region.BreakerOpen {
			http.Error(w, "regional store unavailable (circuit breaker open)", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ready\n")) // the client has gone; nothing is left to tell it
	})
	m.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, statusOf(ag.Status(), ag.Core().Stats(), src.Current().Version(), info), true)
	})
	m.Handle("POST /v1/allow", callers.Middleware(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := readBody(w, r, b.maxBody)
		if errors.Is(err, errBodyTooLarge) {
			writeJSON(w, http.StatusRequestEntityTooLarge, errorJSON{err.Error()}, false)
			return
		}
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{"agent: /v1/allow: " + err.Error()}, false)
			return
		}
		// The request is the gRPC API's AllowRequest in protobuf's JSON
		// form, which takes snake_case (and camelCase) names, and numbers
		// or strings for cost.
		var in allotv1.AllowRequest
		if err := protojson.Unmarshal(body, &in); err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{"agent: /v1/allow: " + err.Error()}, false)
			return
		}
		req, err := grpclimit.RequestFromProtoBounded(&in, b.bounds)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{err.Error()}, false)
			return
		}
		d, err := lim.Allow(r.Context(), req)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, errorJSON{err.Error()}, false)
			return
		}
		writeJSON(w, http.StatusOK, allowOf(d), false)
	})))
	return m
}
