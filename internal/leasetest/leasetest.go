// Package leasetest runs a region's end of the lease protocol the way an
// agent runs it (agent.LeaseClient driving a region.Speaker), for tests of
// the coordinator: a test sets the region's demand directly and reads the
// allocations from the table the region publishes.
package leasetest

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// Region is one region of a single agent, leasing over a transport.
type Region struct {
	Name    string
	clk     clock.Clock
	budgets map[string]lease.Budget
	shared  *agent.MemShared
	view    *region.TableView
	client  *agent.LeaseClient
}

// Options tune a Region's lease client; zero fields keep the defaults.
type Options struct {
	Tick, Redial, Refresh, Drift time.Duration
	Seed                         uint64
}

// Start runs region name's lease client on clk over tr until ctx ends. Its
// demand reports stand until changed (they never go stale).
func Start(t testing.TB, ctx context.Context, clk clock.Clock, name string, budgets []lease.Budget, tr lease.Transport, o Options) *Region {
	t.Helper()
	r := &Region{Name: name, clk: clk, budgets: map[string]lease.Budget{}, shared: agent.NewMemShared()}
	var split lease.Split
	for _, b := range budgets {
		r.budgets[b.Rule] = b
		split = b.Split()
	}
	r.view = region.NewTableView(name, split)
	cfg := agent.DefaultSpeakerConfig()
	cfg.Region, cfg.Agent, cfg.Budgets, cfg.DemandMaxAge = name, name+"-0", budgets, 1<<62
	set := func(dst *time.Duration, v time.Duration) {
		if v > 0 {
			*dst = v
		}
	}
	set(&cfg.Tick, o.Tick)
	set(&cfg.Redial, o.Redial)
	set(&cfg.Refresh, o.Refresh)
	set(&cfg.Drift, o.Drift)
	c, err := agent.NewLeaseClient(cfg, agent.LeaseDeps{Clock: clk, Shared: r.shared, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}),
		View: r.view, Transport: tr, Members: func() []string { return []string{name + "-0"} },
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Seed: o.Seed})
	if err != nil {
		t.Fatal(err)
	}
	r.client = c
	go c.Run(ctx)
	return r
}

// Demand sets the region's demand for key to want tokens per the budget's
// period, from now on.
func (r *Region) Demand(key bucket.Key, want bucket.Tokens) {
	_ = r.shared.PutDemand(context.Background(), region.DemandReport{Agent: r.Name + "-0", At: r.clk.Now(),
		Keys: []region.DemandItem{{Rule: key.Rule, Subject: key.Subject, Want: want}}})
}

// Allocation is what the region may use of key now, as its table says,
// under the budget its Holder serves now (the coordinator's, once a full
// table brought them, as an agent's rules reload would).
func (r *Region) Allocation(key bucket.Key) bucket.Limit {
	global := r.budgets[key.Rule].Limit
	for _, b := range r.Budgets() {
		if b.Rule == key.Rule {
			global = b.Limit
		}
	}
	l, _, _ := r.view.Allocation(r.clk.Now(), key, global)
	return l
}

// Status is the region's lease as its Holder has it; zero before it
// started.
func (r *Region) Status() lease.HolderStatus {
	st, _ := r.client.Status()
	return st
}

// Budgets returns the budgets the region's Holder serves: the
// coordinator's, once a full table brought them.
func (r *Region) Budgets() []lease.Budget { return r.client.Budgets() }
