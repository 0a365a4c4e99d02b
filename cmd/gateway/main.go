// Command gateway is a runnable example of allot at the edge: an HTTP API
// with routes of cost 1 (/items), 5 (/report) and 50 (/export) behind the
// rate limit middleware, plans free and pro, and a gRPC port serving
// Envoy's rate limit service v3, the allow API and gRPC health.
//
//	go run ./cmd/gateway                         # in-process buckets
//	go run ./cmd/gateway -redis 127.0.0.1:6379   # buckets in Redis, shared by every gateway on it
//	go run ./cmd/gateway -agent 127.0.0.1:9091   # decisions from an agent's allow API
//	go run ./cmd/gateway -region eu -redis 127.0.0.1:6379 \
//	    -regions eu,us -coordinators 127.0.0.1:7000 \
//	    -gossip-bind 127.0.0.1:7946                # the region's agent in this process
//	curl -i -H 'X-Tenant: acme' -H 'X-Plan: free' localhost:8080/items
//
// Identity comes from the X-Tenant and X-Plan headers (as a trusted proxy in
// front would set them), or with -identity apikey from
// "Authorization: Bearer <key>" looked up in -keys. The rules are the
// embedded example unless -rules names a file, which is reloaded when it
// changes and on SIGHUP; a bad edit is logged and the last good rules stay.
package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	_ "embed"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/httpserver"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

//go:embed rules.yaml
var exampleRules []byte

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Stdout, os.Stderr, nil); err != nil {
		fmt.Fprintln(os.Stderr, "gateway:", err)
		os.Exit(1)
	}
}

// options are the command line.
type options struct {
	httpAddr, grpcAddr string
	rulesPath          string
	redisAddr          string
	redisTimeout       time.Duration
	redisMaxTimeout    time.Duration
	identity           string
	keys               string
	logLevel           string
	check              bool
	agentAddr          string
	agentCA            string
	agentTimeout       time.Duration
	bounds             limiter.Bounds
	rlsUnknownDomain   string
	rlsMaxDescriptors  int
	memoryMaxKeys      int
	http               httpserver.Config
	allowTokens        string
	agentTokenFile     string
	embed              embedOptions // embed.go
}

func parseFlags(args []string, stderr io.Writer) (options, error) {
	var o options
	fs := flag.NewFlagSet("gateway", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.httpAddr, "http", "127.0.0.1:8080", "HTTP listen address (the API, /metrics, /healthz)")
	fs.StringVar(&o.grpcAddr, "grpc", "127.0.0.1:8081", "gRPC listen address (Envoy RLS v3, allow API, health); empty to disable")
	fs.StringVar(&o.rulesPath, "rules", "", "rules file, reloaded on change and SIGHUP; empty for the embedded example")
	fs.StringVar(&o.redisAddr, "redis", "", "Redis address for shared buckets; empty for in-process buckets")
	bc := breaker.DefaultConfig()
	fs.DurationVar(&o.redisTimeout, "redis-timeout", bc.Timeout, "shortest deadline of a Redis call; it follows the latency Redis answers with, up to -redis-max-timeout, then the circuit breaker and the rule's failure policy apply")
	fs.DurationVar(&o.redisMaxTimeout, "redis-max-timeout", bc.MaxTimeout, "longest deadline of a Redis call: a Redis slower than this counts as down (when not given, at least -redis-timeout)")
	fs.StringVar(&o.identity, "identity", "header", "identity source: header (X-Tenant, X-Plan) or apikey (Authorization: Bearer)")
	fs.StringVar(&o.keys, "keys", "key-free=acme:free,key-pro=globex:pro", "API keys for -identity apikey: key=tenant:plan,...")
	fs.StringVar(&o.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.StringVar(&o.agentAddr, "agent", "", "ask this allow API (an agent's or another gateway's gRPC address) instead of deciding here")
	fs.StringVar(&o.agentCA, "agent-ca", "", "CA (PEM) the agent's certificate must chain to: speak TLS to -agent (default plaintext)")
	fs.DurationVar(&o.agentTimeout, "agent-timeout", 100*time.Millisecond, "deadline of a call to -agent, connecting included; past it the request is answered 503 (the limiter is unavailable)")
	fs.BoolVar(&o.check, "check", false, "validate the rules, print their budgets and exit (status 1 with every problem listed if invalid)")
	o.bounds = limiter.DefaultBounds()
	o.bounds.RegisterFlags(fs)
	fs.StringVar(&o.rlsUnknownDomain, "rls-unknown-domain", string(rls.AllowUnknownDomain), "RLS requests for a domain the rules do not serve: allow (logged and counted) or deny (over the limit)")
	fs.IntVar(&o.rlsMaxDescriptors, "rls-max-descriptors", rls.MaxDescriptors, "most descriptors in one RLS request")
	fs.IntVar(&o.memoryMaxKeys, "memory-max-keys", bucket.DefaultMaxKeys, "most buckets the in-process store holds (without -redis); at the bound new keys get the rule's failure policy; < 0: no bound")
	o.http = httpserver.DefaultConfig()
	o.http.RegisterFlags(fs)
	fs.StringVar(&o.allowTokens, "allow-tokens", "", "tokens file of the callers allowed to use this gateway's allow API (gRPC); empty: any caller that reaches it")
	fs.StringVar(&o.agentTokenFile, "agent-token-file", "", "file holding this gateway's token for the -agent allow API (sent in clear: the agent is expected on the same host or network)")
	o.embed.register(fs)
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	if fs.NArg() > 0 {
		return o, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	maxGiven := false
	fs.Visit(func(f *flag.Flag) { maxGiven = maxGiven || f.Name == "redis-max-timeout" })
	if maxGiven && o.redisMaxTimeout < o.redisTimeout {
		return o, fmt.Errorf("-redis-max-timeout=%s must be ≥ -redis-timeout=%s", o.redisMaxTimeout, o.redisTimeout)
	}
	if o.memoryMaxKeys == 0 {
		return o, fmt.Errorf("-memory-max-keys=0: give the most buckets (> 0), or < 0 for no bound")
	}
	if o.agentCA != "" && o.agentAddr == "" {
		return o, fmt.Errorf("-agent-ca=%q needs -agent", o.agentCA)
	}
	if _, err := rls.ParseDomainAction(o.rlsUnknownDomain); err != nil {
		return o, fmt.Errorf("-rls-unknown-domain: %w", err)
	}
	if err := o.embed.validate(o.agentAddr, o.redisAddr); err != nil {
		return o, err
	}
	return o, o.bounds.Validate()
}

// Ready reports the addresses a started gateway listens on.
type Ready struct {
	HTTP, GRPC string
}

// run starts the gateway and serves until ctx is done. ready, when set,
// receives the listening addresses.
func run(ctx context.Context, args []string, stdout, stderr io.Writer, ready chan<- Ready) error {
	o, err := parseFlags(args, stderr)
	if err != nil {
		return err
	}
	if o.check {
		return checkRules(o.rulesPath, stdout)
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(o.logLevel)); err != nil {
		return fmt.Errorf("-log-level=%q: %w", o.logLevel, err)
	}
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector())
	metrics, err := limiter.NewMetrics(reg)
	if err != nil {
		return err
	}

	// Rules: the embedded example, or a file followed for changes.
	var src rules.Source
	var watcher *rules.FileWatcher
	// emb is the embedded agent (-region), told of every rules change.
	var emb atomic.Pointer[embedded]
	if o.rulesPath == "" {
		s, err := rules.Parse(exampleRules, "embedded rules.yaml")
		if err != nil {
			return err
		}
		src = s
		metrics.SetRules(s)
	} else {
		cfg := rules.DefaultWatchConfig()
		cfg.Logger = logger
		cfg.Notify = func(u rules.Update) {
			metrics.Reload(u) // the rules in force and the reloads rejected
			if e := emb.Load(); e != nil && u.Changed {
				if err := e.agent.SetRules(u.New, nil); err != nil {
					logger.Error("gateway: rules change not applied to the embedded agent", "err", err)
				}
			}
		}
		if watcher, err = rules.WatchFile(o.rulesPath, cfg); err != nil {
			return err
		}
		src = watcher
		metrics.SetRules(watcher.Current())
	}

	// Store: Redis shared by every gateway on it, or in process.
	mem := bucket.NewMemory(bucket.MemoryOptions{MaxKeys: o.memoryMaxKeys})
	var store bucket.Store = mem
	storeName := "memory"
	var client redis.UniversalClient
	// regional is the store an embedded agent decides on: it runs its own
	// breaker over it (agent.New), so it gets the store without the
	// gateway's.
	var regional bucket.Store = mem
	if o.redisAddr != "" {
		client = redisstore.NewUniversalClient([]string{o.redisAddr}, "", "")
		defer client.Close()
		bc := breaker.DefaultConfig()
		bc.Timeout, bc.MaxTimeout = o.redisTimeout, max(o.redisMaxTimeout, o.redisTimeout)
		br, err := breaker.New(bc)
		if err != nil {
			return fmt.Errorf("-redis-timeout, -redis-max-timeout: %w", err)
		}
		rs, err := redisstore.New(client, redisstore.Options{Timeout: bc.MaxTimeout})
		if err != nil {
			return err
		}
		// The agent's circuit breaker: a Redis that does not answer fails
		// calls at once by the rule's failure policy instead of holding
		// each for its deadline.
		regional, storeName = rs, "redis "+o.redisAddr
		if o.embed.region == "" {
			store = breaker.Guard(rs, br, nil)
			reg.MustRegister(limiter.NewBreakerCollector(br, nil))
		}
	} else {
		reg.MustRegister(limiter.NewMemoryCollector(map[string]*bucket.Memory{"buckets": mem}))
	}
	if o.embed.region != "" {
		// The region's agent runs here: decisions come from its batches
		// and its regional store, within the leased allocation, with no
		// call out of the process. It stops when ctx ends, before the
		// stores close.
		actx, stopAgent := context.WithCancel(context.WithoutCancel(ctx))
		e, err := startAgent(actx, o.embed, src.Current(), regional, client, logger, reg)
		if err != nil {
			stopAgent()
			return err
		}
		emb.Store(e)
		defer e.close()
		defer stopAgent()
		store, storeName = e.agent.Store(), "agent "+o.embed.region+" in process over "+storeName
	}
	var lim limiter.Limiter
	local, err := limiter.New(limiter.Config{
		Rules: src, Store: store, Logger: logger, Bounds: o.bounds,
		OnDecision: metrics.Decision, OnEvent: metrics.Event,
	})
	if err != nil {
		return err
	}
	lim = local
	if o.agentAddr != "" {
		// Decisions come from an agent's allow API; the rules above only
		// serve -check and the RLS domain.
		creds := insecure.NewCredentials()
		if o.agentCA != "" {
			if creds, err = agentTLS(o.agentCA); err != nil {
				return err
			}
		}
		dial := []grpc.DialOption{grpc.WithTransportCredentials(creds)}
		if o.agentTokenFile != "" {
			tok, err := auth.ReadToken(o.agentTokenFile)
			if err != nil {
				return fmt.Errorf("-agent-token-file: %w", err)
			}
			// Without -agent-ca the token crosses in clear: the agent is
			// expected on the same host or network.
			dial = append(dial, grpc.WithPerRPCCredentials(auth.Bearer(tok, o.agentCA == "")))
		}
		conn, err := grpc.NewClient(o.agentAddr, dial...)
		if err != nil {
			return fmt.Errorf("-agent=%q: %w", o.agentAddr, err)
		}
		defer conn.Close()
		if lim, err = grpclimit.NewRemote(conn, o.agentTimeout); err != nil {
			return fmt.Errorf("-agent-timeout: %w", err)
		}
		storeName = "agent " + o.agentAddr
	}

	identity, err := identityFunc(o)
	if err != nil {
		return err
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: identity, Logger: logger, Bounds: o.bounds})
	if err != nil {
		return err
	}
	api := http.NewServeMux()
	for _, route := range []string{"/items", "/report", "/export"} {
		api.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_ = json.NewEncoder(w).Encode(map[string]string{"route": route})
		})
	}
	root := http.NewServeMux()
	root.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	root.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = io.WriteString(w, "ok\n") }) // a gone client needs no answer
	root.Handle("/", mw(api))

	hl, err := net.Listen("tcp", o.httpAddr)
	if err != nil {
		return err
	}
	httpSrv, err := httpserver.New(o.http, root, nil)
	if err != nil {
		_ = hl.Close() // already failing with the error below
		return err
	}
	reg.MustRegister(httpserver.NewCollector(map[string]*httpserver.Server{"gateway": httpSrv}))
	errc := make(chan error, 3)
	go func() { errc <- httpSrv.Serve(hl) }()

	var grpcSrv *grpc.Server
	r := Ready{HTTP: hl.Addr().String()}
	if o.grpcAddr != "" {
		gl, err := net.Listen("tcp", o.grpcAddr)
		if err != nil {
			_ = hl.Close() // already failing with the error below
			return err
		}
		var callers *auth.Callers
		if o.allowTokens != "" {
			tk, err := auth.LoadTokens(o.allowTokens)
			if err != nil {
				_ = hl.Close() // already failing with the error below
				return fmt.Errorf("-allow-tokens: %w", err)
			}
			callers = auth.NewCallers("allow", tk, nil)
		} else {
			callers = auth.NewCallers("allow", nil, nil)
		}
		reg.MustRegister(callers)
		gopts := rls.ServerOptions()
		if !callers.Open() {
			gopts = append(gopts, grpc.UnaryInterceptor(callers.UnaryServerInterceptor(grpclimit.AllowServiceName)))
		}
		grpcSrv = grpc.NewServer(gopts...)
		hs := health.NewServer()
		healthpb.RegisterHealthServer(grpcSrv, hs)
		rlsSrv, err := rls.New(rls.Config{Limiter: lim, Rules: src, Logger: logger, Bounds: o.bounds,
			UnknownDomain: rls.DomainAction(o.rlsUnknownDomain), MaxDescriptors: o.rlsMaxDescriptors})
		if err != nil {
			return err
		}
		reg.MustRegister(rlsSrv)
		rls.Register(grpcSrv, rlsSrv, hs)
		allowSrv, err := grpclimit.NewAllowServer(lim, grpclimit.WithBounds(o.bounds))
		if err != nil {
			return err
		}
		grpclimit.RegisterAllow(grpcSrv, allowSrv, hs)
		go func() { errc <- grpcSrv.Serve(gl) }()
		r.GRPC = gl.Addr().String()
	}
	if watcher != nil {
		go func() { _ = watcher.Run(ctx) }()
	}
	logger.Info("gateway: serving", "http", r.HTTP, "grpc", r.GRPC, "store", storeName,
		"rules", src.Current().Source(), "rules_version", src.Current().Version())
	if ready != nil {
		ready <- r
	}

	select {
	case <-ctx.Done():
	case err := <-errc:
		if !errors.Is(err, http.ErrServerClosed) {
			logger.Error("gateway: server failed", "err", err)
		}
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_ = httpSrv.Shutdown(shutdownCtx)
	if grpcSrv != nil {
		grpcSrv.GracefulStop()
	}
	logger.Info("gateway: stopped")
	return nil
}

// agentTLS is TLS to the agent, whose certificate must chain to the CA in
// caFile and name the host of -agent (an agent beside the gateway, on
// 127.0.0.1, has a certificate for 127.0.0.1).
func agentTLS(caFile string) (credentials.TransportCredentials, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, fmt.Errorf("-agent-ca: %w", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("-agent-ca=%q: no certificate found", caFile)
	}
	return credentials.NewTLS(&tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}), nil
}

// checkRules validates a rules file and prints its budgets.
func checkRules(path string, w io.Writer) error {
	var s *rules.Set
	var err error
	if path == "" {
		s, err = rules.Parse(exampleRules, "embedded rules.yaml")
	} else {
		s, err = rules.Load(path)
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(w, "%s: ok, version %s, %d plans, %d rules\n", s.Source(), s.Version(), len(s.Plans()), len(s.Rules()))
	fmt.Fprintf(w, "%-20s %-10s %-32s %-7s %-12s %s\n", "RULE", "PLAN", "QUOTA", "SCOPE", "UNAVAILABLE", "SHARED")
	for _, b := range s.Budgets() {
		plan := strings.Join(b.Plans, ",")
		if plan == "" {
			plan = "-"
		}
		fmt.Fprintf(w, "%-20s %-10s %-32s %-7s %-12s %v\n", b.Rule, plan, rules.FormatQuota(b.Limit), b.Scope, b.Failure.Policy, b.Shared)
	}
	// Costs some plans cannot pay are allowed (an entitlement), but worth
	// seeing: those requests are refused with 403 on those plans.
	for _, r := range s.Rules() {
		if r.Source != rules.FromPlan {
			continue
		}
		costs := append([]rules.Cost{{Cost: r.DefaultCost}}, r.Costs...)
		for _, p := range s.Plans() {
			for _, c := range costs {
				if c.Cost > p.Limit.Burst() {
					where := "by default"
					if c.Path != "" || c.Method != "" {
						where = strings.TrimSpace(c.Method + " " + c.Path)
					}
					fmt.Fprintf(w, "note: rule %s: cost %d (%s) exceeds plan %s's burst %d: refused with 403 on %s\n",
						r.Name, c.Cost, where, p.Name, p.Limit.Burst(), p.Name)
				}
			}
		}
	}
	return nil
}

func identityFunc(o options) (httplimit.IdentityFunc, error) {
	switch o.identity {
	case "header":
		return httplimit.TrustedHeader("X-Tenant", "X-Plan"), nil
	case "apikey":
		keys := map[string]httplimit.Identity{}
		for _, kv := range strings.Split(o.keys, ",") {
			key, id, ok := strings.Cut(strings.TrimSpace(kv), "=")
			tenant, plan, ok2 := strings.Cut(id, ":")
			if !ok || !ok2 || key == "" || tenant == "" {
				return nil, fmt.Errorf("-keys entry %q: want key=tenant:plan", kv)
			}
			keys[key] = httplimit.Identity{Subject: tenant, Plan: plan}
		}
		return httplimit.APIKey("Authorization", httplimit.StaticKeys(keys)), nil
	}
	return nil, fmt.Errorf("-identity=%q: want header or apikey", o.identity)
}
