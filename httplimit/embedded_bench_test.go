package httplimit_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/time/rate"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/internal/benchcpu"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rls"
	"github.com/allot-dev/allot/rules"
)

const embeddedRules = `
version: bench
domain: edge
default_plan: pro
plans: {pro: "1073741824 per second"}
rules:
  - name: api
    match: {path: "/*"}
    scope: global
`

// embeddedAgent starts a region's agent in this process over an
// in-process store (floors alone: a limit nobody reaches) and returns a
// limiter deciding through it.
func embeddedAgent(b *testing.B, set *rules.Set) *limiter.StoreLimiter {
	b.Helper()
	floors := lease.Split{Regions: []string{"eu"}, Reserve: lease.DefaultReserve}
	cfg := agent.DefaultConfig()
	cfg.Name, cfg.Core.Region, cfg.Core.Floors = "bench", "eu", floors
	cfg.Core.Rules = region.RuleConfigs(set, nil)
	cfg.Speaker.Budgets = region.Budgets(set, floors, lease.MaxMin)
	ag, err := agent.New(cfg, agent.Deps{Store: bucket.NewMemory(bucket.MemoryOptions{}), Namer: region.NewNamer(set), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); ag.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	lim, err := limiter.New(limiter.Config{Rules: set, Store: ag.Store(), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	return lim
}

// rlsLimiter is a limiter.Limiter that asks an Envoy RLS v3 server, as an
// Envoy in front of the gateway would: one descriptor of the request's
// entries and its subject.
type rlsLimiter struct {
	client rlsv3.RateLimitServiceClient
	domain string
}

func (r rlsLimiter) Allow(ctx context.Context, req limiter.Request) (limiter.Decision, error) {
	entries := make([]*rlcommon.RateLimitDescriptor_Entry, 0, len(req.Descriptor)+1)
	for _, e := range req.Descriptor {
		entries = append(entries, &rlcommon.RateLimitDescriptor_Entry{Key: e.Key, Value: e.Value})
	}
	entries = append(entries, &rlcommon.RateLimitDescriptor_Entry{Key: rules.KeySubject, Value: req.Subject})
	resp, err := r.client.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: r.domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries}}})
	if err != nil {
		return limiter.Decision{}, err
	}
	st := resp.GetStatuses()[0]
	return limiter.Decision{Allowed: st.GetCode() == rlsv3.RateLimitResponse_OK, Remaining: bucket.Tokens(st.GetLimitRemaining())}, nil
}

// writer is a ResponseWriter that keeps nothing but its status, so that
// the benchmark measures the middleware and not a recorder.
type writer struct {
	h    http.Header
	code int
}

func (w *writer) Header() http.Header         { return w.h }
func (w *writer) Write(b []byte) (int, error) { return len(b), nil }
func (w *writer) WriteHeader(code int)        { w.code = code }

// BenchmarkEmbedded puts, in one run, the HTTP middleware deciding through
// an agent embedded in the process beside the same middleware asking an
// agent over loopback gRPC: Envoy's RLS (rls.ServerOptions, as cmd/agent
// serves it) and the allow API (grpclimit.Remote, as cmd/gateway -agent
// asks it). The agents are the same: floors alone, an in-process store,
// 1,024 tenants, a limit nobody reaches. decide is the embedded decision
// alone, without HTTP, on one tenant and on 1,024, beside
// golang.org/x/time/rate: decide/embedded as a gateway holding the
// limiter makes it (StoreLimiter.AllowInto, as the middleware does),
// decide/embedded-by-value through the Limiter interface (Allow).
func BenchmarkEmbedded(b *testing.B) {
	set, err := rules.Parse([]byte(embeddedRules), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	reqs := make([]*http.Request, 1024)
	lreqs := make([]limiter.Request, len(reqs))
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/items", nil)
		reqs[i].Header.Set("X-Tenant", "tenant-"+strconv.Itoa(i))
		lreqs[i] = limiter.Request{Subject: "tenant-" + strconv.Itoa(i),
			Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: "/items"}, {Key: rules.KeyMethod, Value: http.MethodGet}}}
	}
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	serve := func(b *testing.B, lim limiter.Limiter) {
		mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", ""), Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		h := mw(ok)
		w := &writer{h: http.Header{}}
		b.ReportAllocs()
		defer benchcpu.Start(b)()
		for i := 0; b.Loop(); i++ {
			clear(w.h)
			h.ServeHTTP(w, reqs[i&1023])
			if w.code != http.StatusNoContent {
				b.Fatalf("status %d", w.code)
			}
		}
	}
	// loopback serves lim's agent over gRPC on a loopback port and returns
	// a connection to it.
	loopback := func(b *testing.B, register func(*grpc.Server)) *grpc.ClientConn {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			b.Fatal(err)
		}
		g := grpc.NewServer(rls.ServerOptions()...)
		register(g)
		go g.Serve(lis)
		b.Cleanup(g.Stop)
		conn, err := grpc.NewClient(lis.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { conn.Close() })
		return conn
	}

	for _, keys := range []int{1, 1024} {
		b.Run("decide/embedded/keys="+strconv.Itoa(keys), func(b *testing.B) {
			lim := embeddedAgent(b, set)
			ctx := context.Background()
			var d limiter.Decision
			b.ReportAllocs()
			defer benchcpu.Start(b)()
			for i := 0; b.Loop(); i++ {
				if err := lim.AllowInto(ctx, &lreqs[i%keys], &d); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
	for _, keys := range []int{1, 1024} {
		b.Run("decide/embedded-by-value/keys="+strconv.Itoa(keys), func(b *testing.B) {
			var lim limiter.Limiter = embeddedAgent(b, set)
			ctx := context.Background()
			b.ReportAllocs()
			defer benchcpu.Start(b)()
			for i := 0; b.Loop(); i++ {
				if d, err := lim.Allow(ctx, lreqs[i%keys]); err != nil || !d.Allowed {
					b.Fatal(d, err)
				}
			}
		})
	}
	// The yardstick: golang.org/x/time/rate's AllowN on one process-local
	// limiter per tenant, which knows nothing of regions or leases.
	b.Run("decide/x-time-rate", func(b *testing.B) {
		lims := make([]*rate.Limiter, len(lreqs))
		for i := range lims {
			lims[i] = rate.NewLimiter(rate.Limit(1<<30), 1<<30)
		}
		b.ReportAllocs()
		defer benchcpu.Start(b)()
		for i := 0; b.Loop(); i++ {
			if !lims[i&1023].AllowN(time.Now(), 1) {
				b.Fatal("denied")
			}
		}
	})
	b.Run("middleware/embedded", func(b *testing.B) {
		serve(b, embeddedAgent(b, set))
	})
	b.Run("middleware/rls-loopback", func(b *testing.B) {
		lim := embeddedAgent(b, set)
		srv, err := rls.New(rls.Config{Limiter: lim, Rules: set, Logger: quiet})
		if err != nil {
			b.Fatal(err)
		}
		conn := loopback(b, func(g *grpc.Server) { rls.Register(g, srv, health.NewServer()) })
		serve(b, rlsLimiter{client: rlsv3.NewRateLimitServiceClient(conn), domain: set.Domain()})
	})
	b.Run("middleware/allow-loopback", func(b *testing.B) {
		lim := embeddedAgent(b, set)
		srv, err := grpclimit.NewAllowServer(lim)
		if err != nil {
			b.Fatal(err)
		}
		conn := loopback(b, func(g *grpc.Server) { grpclimit.RegisterAllow(g, srv, health.NewServer()) })
		remote, err := grpclimit.NewRemote(conn, time.Second)
		if err != nil {
			b.Fatal(err)
		}
		serve(b, remote)
	})
}
