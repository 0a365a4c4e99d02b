// Command demo runs allot on one machine: a coordinator (the lease service
// over gRPC on loopback) and three regions of two agents each (memberlist on
// loopback, an in-process store per region standing in for its Redis),
// with generated traffic on one tenant's global budget that moves from
// region to region. It prints, every second, what each region admits
// against the global budget and the allocation in force there (its floor,
// or what the coordinator leased it, and which), with a legend, and at the
// end the totals and the largest overshoot over every time window.
//
//	go run ./cmd/demo                 # the coordinator's learning, then 24 s
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
	flag.DurationVar(&o.duration, "duration", 24*time.Second, "how long to run after the coordinator's learning has ended at the latest (the busy region changes every third of it)")
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
	// A new leader grants no increase for one lease TTL and twice the
	// drift (lease.NewAllocator): the regions run on their floors meanwhile.
	learn := lc.TTL + 2*lc.Drift
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
	leaderAt := time.Now()
	if err := coord.BecomeLeader(uint64(leaderAt.UnixMilli())); err != nil {
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
	nslots := int((learn+o.duration)/slot) + 2
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
			go func() { defer wg.Done(); _ = a.Run(cctx) }() // Run ends with nil when cctx does
		}
		drs = append(drs, dr)
	}
	defer func() { cancel(); wg.Wait() }()

	phase := o.duration / time.Duration(len(drs))
	intro(drs, o, budgets[0], lis.Addr().String(), hl.Addr().String(), learn, phase)

	start := time.Now()
	// The first busy region stays busy until the latest end of the
	// coordinator's learning, then each is busy for a third of the duration.
	learnEnd := max(leaderAt.Add(learn).Sub(start), 0)
	busy := func(t time.Duration) int { return min(int(max(t-learnEnd, 0)/phase), len(drs)-1) }
	tctx, tcancel := context.WithTimeout(cctx, learnEnd+o.duration)
	defer tcancel()
	var twg sync.WaitGroup
	for ri, dr := range drs {
		twg.Add(1)
		go func() {
			defer twg.Done()
			traffic(tctx, dr, ri, start, busy, float64(o.budget)*o.heavy, float64(o.budget)*o.light)
		}()
	}

	header(drs, o.budget)
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
			learning := func() bool { return coord.Status(0).Learning }
			line(drs, sec, busy(time.Since(start)), global, budgets[0], last, float64(o.budget), learning)
		}
	}
	twg.Wait()
	elapsed := time.Since(start)
	summary(drs, global, elapsed, learnEnd, coord)
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

// intro prints what runs, what the traffic is, and the legend of the
// rows that follow.
func intro(drs []*demoRegion, o options, b lease.Budget, grpcAddr, httpAddr string, learn, phase time.Duration) {
	var names []string
	for _, dr := range drs {
		names = append(names, dr.name)
	}
	floor := b.Floor(o.regions[0]).Count
	fmt.Fprintf(out, "allot demo: a coordinator (gRPC %s; its status page: open http://%s/status in a browser)\n", grpcAddr, httpAddr)
	fmt.Fprintf(out, "and %d regions (%s) of %d agents each, on this machine. One tenant, one global budget:\n", len(drs), strings.Join(names, ", "), o.agents)
	fmt.Fprintf(out, "%s (R = %.0f tokens/s, B = %d at once), over all regions together.\n\n", rules.FormatQuota(b.Limit), b.Limit.Rate(), b.Limit.Burst())
	fmt.Fprintf(out, "Each region's floor, what it may use with no lease, is %d/s: the budget less the %d/s reserve\n", floor, b.ReserveCount())
	fmt.Fprintf(out, "the coordinator holds back, split %d ways. The coordinator leases the rest where the demand is:\n", len(drs))
	fmt.Fprintln(out, "the busy region gets the reserve and what quiet regions lend of their floors; a quiet region")
	fmt.Fprintln(out, "keeps its demand (with headroom only when the budget has room for it), so it sits below its floor.")
	fmt.Fprintf(out, "\nTraffic: the busy region offers %.0f/s, the others %.0f/s each. The busy region is %s first,\n",
		o.heavy*float64(o.budget), o.light*float64(o.budget), drs[0].name)
	fmt.Fprintf(out, "through the coordinator's learning (no increase, every region on its floor; at most its first %s\n", learn.Round(100*time.Millisecond))
	fmt.Fprintf(out, "as leader, less once every region has answered it), then each region is busy for %s in turn.\n\n", phase.Round(100*time.Millisecond))
	fmt.Fprintln(out, "Every second, per region: the requests it admitted that second, then its allocation of the tenant's")
	fmt.Fprintln(out, "budget (tokens/s) and what that allocation is:")
	fmt.Fprintf(out, "  floor  the region's floor (%d/s): no lease entry for the tenant, or one equal to the floor\n", floor)
	fmt.Fprintln(out, "  lent   a lease entry below the floor: the region lends the rest to a busier one")
	fmt.Fprintln(out, "  grant  a lease entry above the floor: the reserve and others' lent floors, leased to it")
	fmt.Fprintln(out, "  *      the busy region")
	fmt.Fprintln(out, "A region may admit more than its allocation in a second: its bucket holds up to a second's allocation")
	fmt.Fprintln(out, "(the burst), full after a quiet spell, on top of what refills.")
	fmt.Fprintf(out, "The bar is the total admitted against the budget (each # is %.0f/s; ! is over it). \"learning\" marks\n", float64(o.budget)/barWidth)
	fmt.Fprintln(out, "the seconds at whose end the coordinator was still learning.")
	fmt.Fprintln(out)
}

func header(drs []*demoRegion, budget int) {
	fmt.Fprintf(out, "%5s ", "t")
	for _, dr := range drs {
		fmt.Fprintf(out, "| %-23s", fmt.Sprintf("%s: admitted  alloc", dr.name))
	}
	fmt.Fprintf(out, "| total admitted of %d/s\n", budget)
}

// alloc returns the region's allocation of the hot key now, and whether
// it is a coordinator entry (else the floor).
func alloc(dr *demoRegion, global bucket.Limit) (bucket.Limit, bool) {
	k := bucket.Key{Rule: "api", Subject: "tenant-42"}
	l, hot, _ := dr.agents[0].View().Allocation(time.Now(), k, global)
	return l, hot
}

// line prints one second's row; learning is asked after the allocations
// are read, so a row marked learning shows allocations read while the
// coordinator was learning.
func line(drs []*demoRegion, sec, busy int, global bucket.Limit, b lease.Budget, last []int64, budget float64, learning func() bool) {
	fmt.Fprintf(out, "%4ds ", sec)
	var total int64
	for i, dr := range drs {
		a := dr.allowed.Load()
		d := a - last[i]
		last[i] = a
		total += d
		l, hot := alloc(dr, global)
		dr.allocs = append(dr.allocs, l.Count())
		mark := " "
		if i == busy {
			mark = "*"
		}
		fmt.Fprintf(out, "|%s%8d %6d %-6s ", mark, d, l.Count(), allocKind(hot, l.Count(), b.Floor(dr.name).Count))
	}
	phase := ""
	if learning() {
		phase = " learning"
	}
	fmt.Fprintf(out, "| %5d %s%s\n", total, bar(float64(total), budget), phase)
}

// allocKind names an allocation of count for the legend: the floor (no
// lease entry, or one equal to it), lent (an entry below it) or grant (an
// entry above it).
func allocKind(entry bool, count, floor bucket.Tokens) string {
	switch {
	case entry && count < floor:
		return "lent"
	case entry && count > floor:
		return "grant"
	}
	return "floor"
}

// barWidth is the width of a full budget's bar.
const barWidth = 20

func bar(v, budget float64) string {
	n := int(math.Round(v / budget * barWidth))
	if n > barWidth {
		return strings.Repeat("#", barWidth) + strings.Repeat("!", min(n-barWidth, 10))
	}
	return strings.Repeat("#", max(n, 0)) + strings.Repeat(".", barWidth-max(n, 0))
}

// summary prints the totals, the share of the budget used and why it is
// below 100%, the overshoot over every window and how the allocation
// moved. learnEnd is the latest end of the coordinator's learning, from
// the start of the traffic.
func summary(drs []*demoRegion, global bucket.Limit, elapsed, learnEnd time.Duration, coord *coordinator.Server) {
	R, B := global.Rate(), float64(global.Burst())
	var total, offered int64
	fmt.Fprintf(out, "\n%-8s %10s %10s  %s\n", "region", "offered", "admitted", "share of all admitted")
	for _, dr := range drs {
		total += dr.allowed.Load()
		offered += dr.offered.Load()
	}
	for _, dr := range drs {
		a := dr.allowed.Load()
		fmt.Fprintf(out, "%-8s %10d %10d  %5.1f%%\n", dr.name, dr.offered.Load(), a, 100*float64(a)/math.Max(float64(total), 1))
	}
	fmt.Fprintf(out, "%-8s %10d %10d\n", "total", offered, total)

	// Admissions after the latest end of learning, from the slots.
	n := len(drs[0].slots)
	var after float64
	for s := int(learnEnd / slot); s < n; s++ {
		for _, dr := range drs {
			after += float64(dr.slots[s].Load())
		}
	}
	ideal := B + R*elapsed.Seconds()
	idealAfter := B + R*(elapsed-learnEnd).Seconds()
	fmt.Fprintf(out, "\nused: %d admitted of at most B + R·t = %.0f + %.0f/s × %.1f s = %.0f, the most an exact global limiter\n",
		total, B, R, elapsed.Seconds(), ideal)
	fmt.Fprintf(out, "could have admitted in the run: %.1f%%; in the %.1f s after learning could last, %.0f of %.0f: %.1f%%.\n",
		100*float64(total)/ideal, (elapsed - learnEnd).Seconds(), after, idealAfter, 100*after/idealAfter)
	fmt.Fprintln(out, "Below 100% because capacity waits while it moves: while the coordinator learns no region may pass its")
	fmt.Fprintln(out, "floor; after the busy region changes, the new one grows only as the old one gives its lease back (the")
	fmt.Fprintln(out, "dip in the total for a few seconds); a quiet region's allocation is its demand as its agents")
	fmt.Fprintln(out, "estimate it, and what its arrivals leave of it is unused; and of the burst B, split like the budget,")
	fmt.Fprintln(out, "quiet regions leave their share undrawn.")

	// The largest excess over B + R·t in any window, in linear time:
	// max over j of (A(j) − R·t_j) − min over i ≤ j of (A(i) − R·t_i) − B.
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
	fmt.Fprintf(out, "\nlargest excess over B + R·t in any window: %.0f tokens (%s; %.0f allowed for %s slots)\n", math.Max(worst, 0), verdict, tol, slot)

	fmt.Fprintln(out, "\nallocation of the tenant per region, tokens/s, every 2 s (the floor when no lease entry):")
	for _, dr := range drs {
		var parts []string
		for i := 1; i < len(dr.allocs); i += 2 {
			parts = append(parts, fmt.Sprintf("%4d", dr.allocs[i]))
		}
		fmt.Fprintf(out, "  %-6s %s\n", dr.name, strings.Join(parts, " "))
	}
	cs := coord.Status(10)
	learning := "learning over"
	if cs.Learning {
		learning = "still learning"
	}
	since := time.UnixMilli(int64(min(cs.Term, math.MaxInt64))) // a term is the instant its leader was elected
	fmt.Fprintf(out, "\ncoordinator: leader since %s (its term, %d, is that instant in Unix milliseconds); %s; %d hot key(s)\n",
		since.Format("15:04:05.000"), cs.Term, learning, len(cs.Keys))
	for _, k := range cs.Keys {
		fmt.Fprintf(out, "  %s/%s, tokens per %s:\n", k.Key.Rule, k.Key.Subject, k.Budget.Limit.Period())
		row := func(what string, v []bucket.Tokens) {
			fmt.Fprintf(out, "    %-11s", what)
			for _, x := range v {
				fmt.Fprintf(out, " %6d", x)
			}
			fmt.Fprintln(out)
		}
		fmt.Fprintf(out, "    %-11s", "")
		for _, r := range k.Regions {
			fmt.Fprintf(out, " %6s", r)
		}
		fmt.Fprintln(out)
		row("allocation", k.Counts)
		row("floor", k.Floors)
		row("demand", k.Wants)
	}
	fmt.Fprintln(out, "\nregional store operations per 1000 decisions (light traffic is decided exactly, one call each; heavy traffic from batches):")
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
