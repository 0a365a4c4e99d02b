package httplimit_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// An HTTP server with the region's agent in its own process: the
// middleware decides through the agent, which holds the region's lease
// from the coordinator and knows the region's other agents over
// memberlist, with no call out of the process per decision. The
// coordinator runs here on loopback only to make the example whole; in
// production it is cmd/coordinator, and the regional store is Redis
// (redisstore.New) shared by the region's agents.
func Example_embeddedAgent() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	set, err := rules.Parse([]byte(`
version: example
rules:
  - name: api
    match: {path: "/*"}
    limit: "3 per hour"   # per tenant, worldwide
    scope: global
`), "rules.yaml")
	if err != nil {
		panic(err)
	}
	// The regions sharing the budget; eu's floor is its share of the
	// two thirds not held in reserve for the coordinator to grant.
	floors, _ := agent.Floors("eu", []string{"eu"}, nil, lease.DefaultReserve, true)
	coordAddr := startCoordinator(ctx, region.Budgets(set, floors, lease.MaxMin))

	// The region's agent: leases over coordinator.Client, membership over
	// memberlist (Join lists the region's other agents), the regional store.
	cfg := agent.DefaultConfig()
	cfg.Name, cfg.Core.Region, cfg.Core.Floors = "gateway-1", "eu", floors
	cfg.Core.Rules = region.RuleConfigs(set, nil)
	cfg.Speaker.Budgets = region.Budgets(set, floors, lease.MaxMin)
	leases, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: []string{coordAddr}, Region: "eu"})
	if err != nil {
		panic(err)
	}
	defer leases.Close()
	gc := agent.DefaultGossipConfig()
	gc.Name, gc.Region, gc.Join = cfg.Name, "eu", nil // e.g. []string{"10.0.0.2:7946"}
	members, err := agent.StartGossip(gc)
	if err != nil {
		panic(err)
	}
	defer members.Shutdown()
	ag, err := agent.New(cfg, agent.Deps{
		Store:      bucket.NewMemory(bucket.MemoryOptions{}), // redisstore.New(client, redisstore.Options{}) with other agents
		Membership: members, Transport: leases, Namer: region.NewNamer(set),
		Logger: slog.New(slog.DiscardHandler),
	})
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	go func() { defer close(done); ag.Run(ctx) }()
	defer func() { cancel(); <-done }()

	// The middleware over the agent's store.
	lim, err := limiter.New(limiter.Config{Rules: set, Store: ag.Store()})
	if err != nil {
		panic(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", "")})
	if err != nil {
		panic(err)
	}
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "ok") }))

	// Decided on eu's floor, 2 an hour: a new coordinator grants more only
	// after one lease TTL.
	for range 3 {
		req := httptest.NewRequest(http.MethodGet, "/items", nil)
		req.Header.Set("X-Tenant", "acme")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		fmt.Println(rec.Code, rec.Header().Get("X-RateLimit-Remaining"))
	}
	// Output:
	// 200 1
	// 200 0
	// 429 0
}

// startCoordinator serves the lease protocol for budgets on a loopback
// port until ctx ends, and returns its address.
func startCoordinator(ctx context.Context, budgets []lease.Budget) string {
	cfg := coordinator.DefaultConfig()
	cfg.Lease.Budgets = budgets
	cfg.Insecure = true // one process on loopback: the region names itself
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := coordinator.NewServer(cfg)
	if err != nil {
		panic(err)
	}
	if err := s.BecomeLeader(1); err != nil {
		panic(err)
	}
	go s.Run(ctx)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	g := grpc.NewServer(coordinator.ServerOptions()...)
	s.Register(g)
	go g.Serve(lis)
	context.AfterFunc(ctx, g.Stop)
	return lis.Addr().String()
}
