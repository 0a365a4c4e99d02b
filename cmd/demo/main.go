// Command demo runs allot on one machine: a coordinator (the lease service
// over gRPC on loopback) and three regions of two agents each (memberlist on
// loopback, an in-process store per region standing in for its Redis),
// with generated traffic on one tenant's global budget that moves from
// region to region. It prints, every second, what each region admits
// against the global budget and the allocation the coordinator gave it, and
// at the end the totals and the largest overshoot over every time window.
//
//	go run ./cmd/demo                 # 24 s
//	go run ./cmd/demo -duration 60s -budget 5000
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

type options struct {
	duration time.Duration
	budget   int
	regions  []string
	agents   int
	heavy    float64
	light    float64
	gossip   bool
	// decisionLog, when set, records each region's decisions (decisionlog.go).
	decisionLog string
	sample      float64
}

const slot = 10 * time.Millisecond

// out receives the demo's report; tests replace it.
var out io.Writer = os.Stdout

func run() error {
	var o options
	var regions string
	flag.DurationVar(&o.duration, "duration", 24*time.Second, "how long to run (the busy region changes every third of it)")
	flag.IntVar(&o.budget, "budget", 1000, "the tenant's global budget, requests per second (burst the same)")
	flag.StringVar(&regions, "regions", "eu,us,ap", "comma-separated region names (at least 2)")
	flag.IntVar(&o.agents, "agents", 2, "agents per region, joined by memberlist on loopback")
	flag.Float64Var(&o.heavy, "heavy", 1.3, "the busy region's offered load, as a multiple of the budget")
	flag.Float64Var(&o.light, "light", 0.1, "each other region's offered load, as a multiple of the budget")
	flag.BoolVar(&o.gossip, "gossip", true, "join each region's agents with memberlist on 127.0.0.1 (false: static membership)")
	flag.StringVar(&o.decisionLog, "decision-log", "", "record each region's sampled decisions to this file, the region inserted before the extension (JSONL, for sim's replay)")
	flag.Float64Var(&o.sample, "decision-log-sample", 1, "fraction of decisions the decision log records")
	flag.Parse()
	o.regions = strings.Split(regions, ",")
	switch {
	case len(o.regions) < 2:
		return fmt.Errorf("-regions=%q: want at least 2", regions)
	case o.duration < 3*time.Second || o.duration > time.Hour:
		return fmt.Errorf("-duration=%s: want between 3s and 1h", o.duration)
	case o.budget < 10 || o.budget > 1_000_000:
		return fmt.Errorf("-budget=%d: want between 10 and 1000000", o.budget)
	case o.agents < 1 || o.agents > 10:
		return fmt.Errorf("-agents=%d: want between 1 and 10", o.agents)
	case o.heavy <= 0 || o.light < 0:
		return fmt.Errorf("-heavy=%v, -light=%v: want > 0 and ≥ 0", o.heavy, o.light)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return demo(ctx, o)
}

type demoRegion struct {
	name    string
	agents  []*agent.Agent
	lims    []*limiter.StoreLimiter
	gossip  []*agent.Gossip
	slots   []atomic.Int64 // admitted per slot
	offered atomic.Int64
	allowed atomic.Int64
	allocs  []bucket.Tokens // allocation of the hot key, per second
}

func demo(ctx context.Context, o options) error {
	yaml := fmt.Sprintf(`version: demo-1
rules:
  - name: api
    match: {path: "/*"}
    limit: "%d per second"
    scope: global
    on_unavailable: {policy: emergency}
`, o.budget)
	set, err := rules.Parse([]byte(yaml), "demo-rules.yaml")
	if err != nil {
		return err
	}
	spec := lease.Split{Regions: o.regions, Reserve: lease.DefaultReserve}
	budgets := region.Budgets(set, spec, lease.MaxMin)
	global := budgets[0].Limit

	lc := lease.DefaultConfig()
	lc.TTL, lc.Refresh, lc.Drift = 3*time.Second, 500*time.Millisecond, 150*time.Millisecond
	lc.Hold, lc.DemandTTL = 4500*time.Millisecond, 1200*time.Millisecond
	lc.Budgets = budgets
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	// The coordinator: the real lease service over gRPC on loopback, with
	// its status page.
	ccfg := coordinator.DefaultConfig()
	ccfg.Lease, ccfg.Tick, ccfg.Logger = lc, 50*time.Millisecond, quiet
	ccfg.Insecure = true // one process on loopback: its regions name themselves
	coord, err := coordinator.NewServer(ccfg)
	if err != nil {
		return err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	gs := grpc.NewServer(coordinator.ServerOptions()...)
	coord.Register(gs)
	go gs.Serve(lis)
	defer gs.Stop()
	if err := coord.BecomeLeader(uint64(time.Now().UnixMilli())); err != nil {
		return err
	}
	go coord.Run(cctx)
	hl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	hsrv := &http.Server{Handler: coord.Handler(nil), ReadHeaderTimeout: 5 * time.Second}
	go hsrv.Serve(hl)
	defer hsrv.Close()
	dlogs, closeLogs, err := openDecisionLogs(o.decisionLog, o.regions, o.sample)
	if err != nil {
		return err
	}
	defer closeLogs()
	nslots := int(o.duration/slot) + 2
	var drs []*demoRegion
	var wg sync.WaitGroup
	for ri, name := range o.regions {
		dr := &demoRegion{name: name, slots: make([]atomic.Int64, nslots)}
		store := bucket.NewMemory(bucket.MemoryOptions{}) // the region's store, shared by its agents as a regional Redis would be
		shared := agent.NewMemShared()
		var static *agent.StaticMembership
		for i := 0; i < o.agents; i++ {
			an := fmt.Sprintf("%s-agent-%d", name, i)
			var mem agent.Membership
			if o.gossip {
				gc := agent.DefaultGossipConfig()
				gc.Name, gc.Region = an, name
				if i > 0 {
					gc.Join = []string{dr.gossip[0].Addr()}
				}
				g, err := agent.StartGossip(gc)
				if err != nil {
					return fmt.Errorf("memberlist for %s: %w (try -gossip=false)", an, err)
				}
				defer g.Shutdown()
				dr.gossip = append(dr.gossip, g)
				mem = g
			} else {
				if static == nil {
					var names []string
					for j := 0; j < o.agents; j++ {
						names = append(names, fmt.Sprintf("%s-agent-%d", name, j))
					}
					static = agent.NewStaticMembership(names[0], names[1:]...)
				}
				mem = staticAs{static, an}
			}
			cfg := agent.DefaultConfig()
			cfg.Name = an
			cfg.Core.Region = name
			cfg.Core.Floors = spec
			cfg.Core.Rules = region.RuleConfigs(set, nil)
			cfg.Speaker.Budgets = budgets
			cfg.Speaker.Refresh, cfg.Speaker.Drift = lc.Refresh, lc.Drift
			client, err := coordinator.NewClient(coordinator.ClientConfig{Addrs: []string{lis.Addr().String()}, Region: name})
			if err != nil {
				return err
			}
			defer client.Close()
			a, err := agent.New(cfg, agent.Deps{Store: store, Shared: shared, Membership: mem,
				Transport: client, Namer: region.NewNamer(set), Logger: quiet, Seed: uint64(ri*100 + i + 1)})
			if err != nil {
				return err
			}
			var st bucket.Store = a.Store()
			if dl := dlogs[name]; dl != nil {
				st = agent.LogDecisions(st, dl, set)
			}
			lim, err := limiter.New(limiter.Config{Rules: set, Store: st, Logger: quiet})
			if err != nil {
				return err
			}
			dr.agents, dr.lims = append(dr.agents, a), append(dr.lims, lim)
			wg.Add(1)
			go func() { defer wg.Done(); a.Run(cctx) }()
		}
		drs = append(drs, dr)
	}
	defer func() { cancel(); wg.Wait() }()

	fmt.Fprintf(out, "allot demo: a coordinator (gRPC %s, status page http://%s/status) and %d regions × %d agents;\n", lis.Addr(), hl.Addr(), len(drs), o.agents)
	fmt.Fprintf(out, "one tenant with a global budget of %s\n", rules.FormatQuota(global))
	fmt.Fprintf(out, "floors: %d/s per region (a third of the budget held in reserve); the busy region offers %.0f/s, the others %.0f/s each\n\n",
		budgets[0].Floor(o.regions[0]).Count, o.heavy*float64(o.budget), o.light*float64(o.budget))

	// A new coordinator grants no increase until every lease a previous
	// leader could have granted has expired: one TTL of learning.
	warm := lc.TTL + lc.Drift + 200*time.Millisecond
	fmt.Fprintf(out, "the coordinator starts in learning mode for one lease TTL (%s): regions run on their floors meanwhile...\n\n", warm.Round(100*time.Millisecond))
	select {
	case <-time.After(warm):
	case <-ctx.Done():
		return nil
	}

	start := time.Now()
	phase := o.duration / time.Duration(len(drs))
	busy := func(t time.Duration) int { return min(int(t/phase), len(drs)-1) }
	tctx, tcancel := context.WithTimeout(cctx, o.duration)
	defer tcancel()
	var twg sync.WaitGroup
	for ri, dr := range drs {
		twg.Add(1)
		go func() {
			defer twg.Done()
			traffic(tctx, dr, ri, start, busy, float64(o.budget)*o.heavy, float64(o.budget)*o.light)
		}()
	}

	header(drs)
	tk := time.NewTicker(time.Second)
	defer tk.Stop()
	last := make([]int64, len(drs))
	sec := 0
loop:
	for {
		select {
		case <-tctx.Done():
			break loop
		case <-tk.C:
			sec++
			line(drs, sec, busy(time.Since(start)), global, last, float64(o.budget))
		}
	}
	twg.Wait()
	elapsed := time.Since(start)
	summary(drs, global, elapsed, coord)
	if errors.Is(ctx.Err(), context.Canceled) {
		fmt.Fprintln(out, "(interrupted)")
	}
	return nil
}

// staticAs is a shared static membership seen by one of its agents.
type staticAs struct {
	*agent.StaticMembership
	self string
}

func (s staticAs) Self() string { return s.self }

// traffic offers requests for the tenant in dr every slot: the heavy rate
// while dr is the busy region, the light one otherwise, round-robin over
// the region's agents through the edge limiter.
func traffic(ctx context.Context, dr *demoRegion, ri int, start time.Time, busy func(time.Duration) int, heavy, light float64) {
	tk := time.NewTicker(slot)
	defer tk.Stop()
	carry := 0.0
	next := 0
	req := limiter.Request{Subject: "tenant-42", Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: "/orders"}}}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tk.C:
		}
		t := time.Since(start)
		rate := light
		if busy(t) == ri {
			rate = heavy
		}
		carry += rate * slot.Seconds()
		n := int(carry)
		carry -= float64(n)
		s := int(t / slot)
		if s >= len(dr.slots) {
			return
		}
		for i := 0; i < n; i++ {
			lim := dr.lims[next%len(dr.lims)]
			next++
			dr.offered.Add(1)
			d, err := lim.Allow(ctx, req)
			if err == nil && d.Allowed {
				dr.allowed.Add(1)
				dr.slots[s].Add(1)
			}
		}
	}
}

func header(drs []*demoRegion) {
	fmt.Fprintf(out, "%5s ", "t")
	for _, dr := range drs {
		fmt.Fprintf(out, "| %-25s", dr.name+": admitted/s  alloc")
	}
	fmt.Fprintf(out, "| %s\n", "total admitted/s")
}

// alloc returns the region's allocation of the hot key now, and whether
// it is a coordinator entry (else the floor).
func alloc(dr *demoRegion, global bucket.Limit) (bucket.Limit, bool) {
	k := bucket.Key{Rule: "api", Subject: "tenant-42"}
	l, hot, _ := dr.agents[0].View().Allocation(time.Now(), k, global)
	return l, hot
}

func line(drs []*demoRegion, sec, busy int, global bucket.Limit, last []int64, budget float64) {
	fmt.Fprintf(out, "%4ds ", sec)
	var total int64
	for i, dr := range drs {
		a := dr.allowed.Load()
		d := a - last[i]
		last[i] = a
		total += d
		l, hot := alloc(dr, global)
		dr.allocs = append(dr.allocs, l.Count())
		mark, kind := " ", "floor"
		if i == busy {
			mark = "*"
		}
		if hot {
			kind = "lease"
		}
		fmt.Fprintf(out, "|%s%-8d %6d %-9s", mark, d, l.Count(), kind)
	}
	fmt.Fprintf(out, "| %-6d %s\n", total, bar(float64(total), budget))
}

func bar(v, budget float64) string {
	const width = 20
	n := int(math.Round(v / budget * width))
	if n > width {
		return strings.Repeat("#", width) + strings.Repeat("!", min(n-width, 10))
	}
	return strings.Repeat("#", max(n, 0)) + strings.Repeat(".", width-max(n, 0))
}

// summary prints the totals, the overshoot over every window and how the
// allocation moved.
func summary(drs []*demoRegion, global bucket.Limit, elapsed time.Duration, coord *coordinator.Server) {
	R, B := global.Rate(), float64(global.Burst())
	var total, offered int64
	fmt.Fprintf(out, "\n%-8s %10s %10s %8s\n", "region", "offered", "admitted", "share")
	for _, dr := range drs {
		total += dr.allowed.Load()
		offered += dr.offered.Load()
	}
	for _, dr := range drs {
		a := dr.allowed.Load()
		fmt.Fprintf(out, "%-8s %10d %10d %7.1f%%\n", dr.name, dr.offered.Load(), a, 100*float64(a)/math.Max(float64(total), 1))
	}
	ideal := B + R*elapsed.Seconds()
	fmt.Fprintf(out, "%-8s %10d %10d   of at most B + R·t = %.0f + %.0f × %.1fs = %.0f (%.1f%% used)\n",
		"total", offered, total, B, R, elapsed.Seconds(), ideal, 100*float64(total)/ideal)

	// The largest excess over B + R·t in any window, in linear time:
	// max over j of (A(j) − R·t_j) − min over i ≤ j of (A(i) − R·t_i) − B.
	n := len(drs[0].slots)
	var cum float64
	minPrefix, worst := 0.0, math.Inf(-1)
	for s := 0; s < n; s++ {
		for _, dr := range drs {
			cum += float64(dr.slots[s].Load())
		}
		v := cum - R*slot.Seconds()*float64(s+1)
		worst = math.Max(worst, v-minPrefix-B)
		minPrefix = math.Min(minPrefix, cum-R*slot.Seconds()*float64(s+1))
	}
	// A slot counts every admission in it at its start: allow one slot's
	// worth of refill for that rounding.
	tol := R * slot.Seconds()
	verdict := "within the budget"
	if worst > tol {
		verdict = "OVER the budget"
	}
	fmt.Fprintf(out, "largest excess over B + R·t in any window: %.0f tokens (%s; %.0f allowed for %s slots)\n", math.Max(worst, 0), verdict, tol, slot)

	fmt.Fprintln(out, "\nallocation of the hot key per region, tokens/s, every 2 s (floor when no lease entry):")
	for _, dr := range drs {
		var parts []string
		for i := 1; i < len(dr.allocs); i += 2 {
			parts = append(parts, fmt.Sprint(dr.allocs[i]))
		}
		fmt.Fprintf(out, "  %-6s %s\n", dr.name, strings.Join(parts, " "))
	}
	cs := coord.Status(10)
	fmt.Fprintf(out, "\ncoordinator: term %d, learning %v, %d hot key(s)\n", cs.Term, cs.Learning, len(cs.Keys))
	for _, k := range cs.Keys {
		fmt.Fprintf(out, "  %s/%s: allocation %v, floors %v, demand %v per %s\n", k.Key.Rule, k.Key.Subject, k.Counts, k.Floors, k.Wants, k.Budget.Limit.Period())
	}
	fmt.Fprintln(out, "regional store operations per 1000 decisions (light traffic is decided exactly, one call each; heavy traffic from batches):")
	for _, dr := range drs {
		var ops, decisions int64
		for _, a := range dr.agents {
			s := a.Core().Stats()
			ops += s.StoreOps
			for _, r := range s.Rules {
				ad, de := r.Total()
				decisions += ad + de
			}
		}
		fmt.Fprintf(out, "  %-6s %6.1f  (%d operations, %d decisions)\n", dr.name, 1000*float64(ops)/math.Max(float64(decisions), 1), ops, decisions)
	}
}
