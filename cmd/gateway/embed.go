package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// embedOptions are the flags of the embedded mode: the gateway runs its
// region's agent in its own process (package agent) and decides through
// it, with no call to a sidecar.
type embedOptions struct {
	region, name       string
	regions            string
	coordinators       string
	coordinatorCA      string
	coordinatorToken   string
	gossipBind, gossip string
}

func (e *embedOptions) register(fs *flag.FlagSet) {
	host, _ := os.Hostname()
	fs.StringVar(&e.region, "region", "", "run this region's agent in the gateway's own process and decide through it (leases from -coordinators, membership over -gossip-bind); empty: no embedded agent")
	fs.StringVar(&e.name, "agent-name", fmt.Sprintf("%s-%d", host, os.Getpid()), "with -region: the embedded agent's name, unique in the region")
	fs.StringVar(&e.regions, "regions", "", "with -region: every region sharing the budgets, comma-separated, as the coordinator has them (floors); empty: this region alone")
	fs.StringVar(&e.coordinators, "coordinators", "", "with -region: coordinator addresses, comma-separated; empty: floors alone")
	fs.StringVar(&e.coordinatorCA, "coordinator-ca", "", "with -coordinators: CA (PEM) the coordinator's certificate must chain to: speak TLS (default plaintext)")
	fs.StringVar(&e.coordinatorToken, "coordinator-token-file", "", "with -coordinators: file holding the region's token for the coordinator (sent in clear without -coordinator-ca)")
	fs.StringVar(&e.gossipBind, "gossip-bind", "", "with -region: memberlist address host:port shared with the region's other agents; empty: this agent alone")
	fs.StringVar(&e.gossip, "gossip-join", "", "with -gossip-bind: memberlist addresses of the region's other agents, comma-separated")
}

// validate reports the first flag of the embedded mode given without what
// it needs.
func (e *embedOptions) validate(agentAddr, redisAddr string) error {
	if e.region == "" {
		for _, f := range []struct{ name, v string }{{"regions", e.regions}, {"coordinators", e.coordinators},
			{"gossip-bind", e.gossipBind}, {"gossip-join", e.gossip}, {"coordinator-ca", e.coordinatorCA},
			{"coordinator-token-file", e.coordinatorToken}} {
			if f.v != "" {
				return fmt.Errorf("-%s=%q needs -region", f.name, f.v)
			}
		}
		return nil
	}
	switch {
	case agentAddr != "":
		return fmt.Errorf("-region=%q and -agent=%q exclude each other: decide in process or ask an agent", e.region, agentAddr)
	case e.name == "":
		return errors.New("-agent-name is empty")
	case e.coordinators != "" && e.regions == "":
		// Floors must be the coordinator's: a region that thought itself
		// alone would take the whole budget as its floor.
		return fmt.Errorf("-coordinators=%q needs -regions (every region sharing the budgets, as the coordinator has them)", e.coordinators)
	case e.coordinators == "" && (e.coordinatorCA != "" || e.coordinatorToken != ""):
		return errors.New("-coordinator-ca and -coordinator-token-file need -coordinators")
	case e.gossipBind == "" && e.gossip != "":
		return fmt.Errorf("-gossip-join=%q needs -gossip-bind", e.gossip)
	case e.gossipBind != "" && redisAddr == "":
		// The region's agents decide on its buckets and read its table in
		// the regional Redis; in-process buckets would be one per agent.
		return fmt.Errorf("-gossip-bind=%q needs -redis (the region's agents share its buckets and allocation table)", e.gossipBind)
	}
	return nil
}

// embedded is a running embedded agent and what it holds open.
type embedded struct {
	agent   *agent.Agent
	closers []func()
	done    chan struct{}
}

// close stops what startAgent opened, after the agent's Run has returned
// (its last act gives batch tokens back and may release the lease).
func (e *embedded) close() {
	<-e.done
	for i := len(e.closers) - 1; i >= 0; i-- {
		e.closers[i]()
	}
}

// startAgent builds the region's agent over store (and, when the store is
// Redis, client: the region's shared table and failover watch) and runs it
// until ctx ends. The caller decides through its Store and closes it with
// close once ctx has ended.
func startAgent(ctx context.Context, e embedOptions, set *rules.Set, store bucket.Store, client redis.UniversalClient,
	logger *slog.Logger, reg prometheus.Registerer) (*embedded, error) {
	out := &embedded{done: make(chan struct{})}
	fail := func(err error) (*embedded, error) {
		close(out.done)
		out.close()
		return nil, err
	}
	spec, _ := agent.Floors(e.region, split(e.regions), nil, lease.DefaultReserve, e.coordinators != "")
	cfg := agent.DefaultConfig()
	cfg.Name, cfg.Core.Region, cfg.Core.Floors = e.name, e.region, spec
	cfg.Core.Rules = region.RuleConfigs(set, nil)
	cfg.Speaker.Budgets = region.Budgets(set, spec, cfg.Speaker.Policy)
	deps := agent.Deps{Store: store, Logger: logger.With("region", e.region, "agent", e.name),
		Namer: region.NewNamer(set), Metrics: agent.NewMetrics(reg), Seed: uint64(time.Now().UnixNano())}
	if client != nil {
		deps.Redis = client
		// The table and demand reports are off the decision path: they may
		// wait longer than a decision would.
		deps.Shared = agent.NewRedisShared(client, "allot:", e.region, time.Second, time.Hour)
	}
	if e.gossipBind != "" {
		gc := agent.DefaultGossipConfig()
		gc.Name, gc.Region, gc.Join = e.name, e.region, split(e.gossip)
		var err error
		if gc.BindAddr, gc.BindPort, err = agent.HostPort(e.gossipBind); err != nil {
			return fail(fmt.Errorf("-gossip-bind=%q: %w", e.gossipBind, err))
		}
		g, err := agent.StartGossip(gc)
		if err != nil {
			return fail(err)
		}
		out.closers = append(out.closers, func() { _ = g.Leave(time.Second); _ = g.Shutdown() })
		deps.Membership = g
	}
	if addrs := split(e.coordinators); len(addrs) > 0 {
		cc := coordinator.ClientConfig{Addrs: addrs, Region: e.region}
		if e.coordinatorCA != "" {
			pool, err := readCA("-coordinator-ca", e.coordinatorCA)
			if err != nil {
				return fail(err)
			}
			cc.TLS = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
		}
		if e.coordinatorToken != "" {
			tok, err := auth.ReadToken(e.coordinatorToken)
			if err != nil {
				return fail(fmt.Errorf("-coordinator-token-file: %w", err))
			}
			cc.Credentials = auth.Bearer(tok, e.coordinatorCA == "")
		}
		c, err := coordinator.NewClient(cc)
		if err != nil {
			return fail(err)
		}
		out.closers = append(out.closers, func() { _ = c.Close() })
		deps.Transport = c
	}
	a, err := agent.New(cfg, deps)
	if err != nil {
		return fail(err)
	}
	out.agent = a
	go func() {
		defer close(out.done)
		if err := a.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			logger.Error("gateway: embedded agent stopped", "err", err)
		}
	}()
	logger.Info("gateway: embedded agent", "region", e.region, "agent", e.name, "regions", spec.Regions,
		"coordinators", split(e.coordinators), "gossip", e.gossipBind, "join", split(e.gossip))
	return out, nil
}

// readCA reads a PEM file of CA certificates named by flag.
func readCA(flag, file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s=%q: no certificate found", flag, file)
	}
	return pool, nil
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
