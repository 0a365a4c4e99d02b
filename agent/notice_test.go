package agent

import (
	"context"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// woken waits on the real clock, up to 10 s, for a wake-up on c: notices
// cross goroutines (and, for RedisShared, a real Redis), not lease time.
func woken(t *testing.T, c <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-c:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no wake-up within 10 s", what)
	}
}

// idle reports whether c holds no wake-up now.
func idle(c <-chan struct{}) bool {
	select {
	case <-c:
		return false
	default:
		return true
	}
}

// watching waits on the real clock, up to 10 s, until n channels watch
// sh for kind: the agents subscribe from their own goroutines.
func watching(t *testing.T, sh *MemShared, kind Notice, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		sh.mu.Lock()
		got := len(sh.watchers[kind])
		sh.mu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d watchers of %s notices after 10 s, want %d", got, kind, n)
		}
		time.Sleep(time.Millisecond) // waiting for another goroutine, not for time to pass
	}
}

// TestMemSharedNotices: a notice wakes every watcher of its kind and no
// other; wake-ups coalesce, and a watch ends with its context.
func TestMemSharedNotices(t *testing.T) {
	sh := NewMemShared()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t1, t2 := sh.Watch(ctx, NoticeTable), sh.Watch(ctx, NoticeTable)
	ad := sh.Watch(ctx, NoticeAdoption)
	for range 3 {
		if err := sh.Announce(ctx, NoticeTable); err != nil {
			t.Fatal(err)
		}
	}
	woken(t, t1, "first table watcher")
	woken(t, t2, "second table watcher")
	if !idle(t1) || !idle(ad) {
		t.Fatal("three table notices left a second wake-up, or woke the adoption watcher")
	}
	wctx, wcancel := context.WithCancel(ctx)
	gone := sh.Watch(wctx, NoticeAdoption)
	wcancel()
	watching(t, sh, NoticeAdoption, 1) // AfterFunc removes it on its own goroutine
	if err := sh.Announce(ctx, NoticeAdoption); err != nil {
		t.Fatal(err)
	}
	woken(t, ad, "adoption watcher")
	if !idle(gone) {
		t.Fatal("a watch whose context ended was woken")
	}
}

// TestRedisSharedNotices: notices over a real Redis's pub/sub reach a
// watcher on another connection, by kind and by region.
func TestRedisSharedNotices(t *testing.T) {
	addr := testenv.RedisAddr(t)
	c1 := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	c2 := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c1.Close()
	defer c2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := "allot-test-" + t.Name() + ":"
	eu, us := NewRedisShared(c1, prefix, "eu", 5*time.Second, time.Minute), NewRedisShared(c2, prefix, "us", 5*time.Second, time.Minute)
	watcher := NewRedisShared(c2, prefix, "eu", 5*time.Second, time.Minute)
	tables, adoptions := watcher.Watch(ctx, NoticeTable), watcher.Watch(ctx, NoticeAdoption)
	usTables := us.Watch(ctx, NoticeTable)
	if err := eu.Announce(ctx, NoticeTable); err != nil {
		t.Fatal(err)
	}
	woken(t, tables, "eu's table watcher")
	if err := eu.Announce(ctx, NoticeAdoption); err != nil {
		t.Fatal(err)
	}
	woken(t, adoptions, "eu's adoption watcher")
	// Redis delivers a subscriber's messages in order: once us's own
	// notice arrives, an eu notice would have arrived before it.
	if err := us.Announce(ctx, NoticeTable); err != nil {
		t.Fatal(err)
	}
	woken(t, usTables, "us's table watcher")
	if !idle(tables) || !idle(adoptions) {
		t.Fatal("a notice of one kind, or of another region, woke eu's watchers twice")
	}
}

// TestAgentAdoptsAnnouncedTable: told of a table, an agent that does not
// speak decides with it and stores its report again as adopting it, and
// announces that, before its next tick (the manual clock never moves).
func TestAgentAdoptsAnnouncedTable(t *testing.T) {
	clk := clock.NewManual(t0)
	sh := NewMemSharedOn(clk)
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region = "eu-1", "eu"
	a, err := New(cfg, Deps{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Shared: sh, Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); a.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// Its first round is done once it watches for tables.
	watching(t, sh, NoticeTable, 1)
	adoptions := sh.Watch(ctx, NoticeAdoption)
	tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 42}
	if ok, err := sh.PublishTable(ctx, tab, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	if err := sh.Announce(ctx, NoticeTable); err != nil {
		t.Fatal(err)
	}
	woken(t, adoptions, "the adoption")
	if got := a.View().Table(); got == nil || got.Pub != 42 {
		t.Fatalf("the agent decides with %+v, want publication 42", got)
	}
	reps, err := sh.Demands(ctx)
	if err != nil || len(reps) != 1 || reps[0].Agent != "eu-1" || reps[0].Pub != 42 || reps[0].Speaker != "eu-0" || !reps[0].At.Equal(t0) {
		t.Fatalf("stored reports %+v %v, want eu-1's of %s adopting eu-0's publication 42", reps, err, t0)
	}
	if !clk.Now().Equal(t0) {
		t.Fatalf("the clock moved to %s", clk.Now())
	}
}

// TestGrantAcknowledgedWithoutTheAgentsTicks: a region of two agents on
// one MemShared. The agent that does not speak ticks once, as it starts
// (its tick is an hour): every table after that reaches it only by the
// speaking agent's notice, and its adoption reaches the speaking agent
// only by its own. Once a decrease arrived (a raise asks for no
// acknowledgement), the clock stands still, and the coordinator still sees
// it acknowledged: no agent's tick and no round of the speaking agent is
// on its path.
func TestGrantAcknowledgedWithoutTheAgentsTicks(t *testing.T) {
	global, spec, budgets, clk, coord := localBudget(t, []string{"eu"}, 0.5)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	sh := NewMemSharedOn(clk)
	logger := slog.New(slog.NewTextHandler(io.Discard, nil))
	var agents []*Agent
	for i, name := range []string{"eu-0", "eu-1"} {
		cfg := DefaultConfig()
		cfg.Name, cfg.Core.Region, cfg.Core.Floors = name, "eu", spec
		cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = 400*time.Millisecond, 100*time.Millisecond, tick
		cfg.Speaker.Budgets = budgets
		cfg.Tick, cfg.SpeakerWait = tick, 0
		if i == 1 {
			cfg.Tick, cfg.SpeakerLease = time.Hour, 2*time.Hour
		}
		a, err := New(cfg, Deps{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Shared: sh,
			Membership: NewStaticMembership(name, "eu-0", "eu-1"), Transport: coord.Transport("eu"), Clock: clk,
			Logger: logger, Seed: uint64(i + 1)})
		if err != nil {
			t.Fatal(err)
		}
		actx, acancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); a.Run(actx) }()
		t.Cleanup(func() { acancel(); <-done })
		agents = append(agents, a)
	}
	watching(t, sh, NoticeTable, 2) // both agents are past their first round
	// The coordinator, both agents and the lease client wait on timers.
	st := stepper{t: t, clk: clk, timers: 4}
	eu := func() lease.RegionStatus {
		for _, r := range coord.Regions() {
			if r.Region == "eu" {
				return r
			}
		}
		return lease.RegionStatus{}
	}
	st.until(40, "eu known to the coordinator, speaking", func() bool {
		return eu().Known && agents[0].Status().Speaking
	})
	watching(t, sh, NoticeAdoption, 1) // the lease client's
	// eu presses on its floor through eu-0 (900 a second against 300):
	// the coordinator grants it the reserve.
	v0 := eu().Version
	k := bucket.Key{Rule: "api", Subject: "tenant-1"}
	st.until(80, "a new version of eu's grants", func() bool {
		for range 45 {
			_, _ = agents[0].Store().Decide(ctx, k, global, 1, "")
		}
		return eu().Version > v0
	})
	// eu stops: the coordinator takes the reserve back, a decrease, which
	// eu can acknowledge only once eu-1 adopted the table carrying it (a
	// raise asks for no acknowledgement: lease.Message.Quiet).
	d0 := coord.Stats().Decreases
	st.until(80, "a decrease of eu's grants", func() bool { return coord.Stats().Decreases > d0 })
	// From here the clock stands still: no agent ticks and no round runs.
	deadline := time.Now().Add(10 * time.Second)
	for r := eu(); r.Acked != r.Version; r = eu() {
		if time.Now().After(deadline) {
			t.Fatalf("version %d acknowledged up to %d after 10 s without a tick", r.Version, r.Acked)
		}
		time.Sleep(time.Millisecond) // waiting for the notices' goroutines, not for time to pass
	}
	spk := agents[0].View().Table()
	if got := agents[1].View().Table(); spk == nil || got == nil || got.Pub != spk.Pub || got.Speaker != "eu-0" {
		t.Fatalf("eu-1 decides with %+v, want eu-0's %+v", got, spk)
	}
	reps, err := sh.Demands(ctx)
	if err != nil || len(reps) != 2 || reps[1].Agent != "eu-1" || !reps[1].At.After(t0) || reps[1].Pub != spk.Pub {
		t.Fatalf("reports %+v %v: want eu-1's, written after its one tick at %s, adopting %d", reps, err, t0, spk.Pub)
	}
}

// TestRedisSharedNoticesAfterARestart: a watch outlives its Redis: after
// the server is killed and started again, empty, notices reach the
// watcher again once the client has subscribed anew (those sent while it
// had not are lost, which the ticks make good).
func TestRedisSharedNoticesAfterARestart(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub, sub := srv.Client(t), srv.Client(t)
	from := NewRedisShared(pub, "allot-test:", "eu", 5*time.Second, time.Minute)
	tables := NewRedisShared(sub, "allot-test:", "eu", 5*time.Second, time.Minute).Watch(ctx, NoticeTable)
	if err := from.Announce(ctx, NoticeTable); err != nil {
		t.Fatal(err)
	}
	woken(t, tables, "before the restart")
	srv.Restart(t)
	// The subscriber reconnects on its own schedule: announce until one
	// arrives, for at most 20 s of real time.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_ = from.Announce(ctx, NoticeTable) // fails until the publisher has reconnected too
		select {
		case <-tables:
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("no notice reached the watcher within 20 s of the restart")
		}
	}
}

// TestRedisSharedNoticesOnACluster: on a real three-node Redis Cluster, a
// notice announced through one cluster client (seeded with one node)
// reaches a watcher on another (seeded with another node).
func TestRedisSharedNoticesOnACluster(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	addrs := testenv.StartRedisCluster(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var shared []*RedisShared
	for _, seed := range [][]string{{addrs[0]}, {addrs[2]}} {
		c := redis.NewClusterClient(&redis.ClusterOptions{Addrs: seed, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		shared = append(shared, NewRedisShared(c, "allot-test:", "eu", 5*time.Second, time.Minute))
	}
	adoptions := shared[1].Watch(ctx, NoticeAdoption)
	if err := shared[0].Announce(ctx, NoticeAdoption); err != nil {
		t.Fatal(err)
	}
	woken(t, adoptions, "the watcher on the cluster")
}

// TestRefusedNoticesWarnOnce: a Redis user without the notice channels'
// permission (an ACL with resetchannels) cannot announce. The region
// still works, at its ticks' pace, and the speaking agent warns once,
// not at every table it publishes.
func TestRefusedNoticesWarnOnce(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "agent", "on", ">agent-secret-1234", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "agent", Password: "agent-secret-1234", ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	sh := NewRedisShared(c, "allot:", "eu", 5*time.Second, time.Minute)
	if err := sh.Announce(ctx, NoticeTable); err == nil || !strings.Contains(err.Error(), "NOPERM") {
		t.Fatalf("announce as a user without channels: %v, want NOPERM", err)
	}

	global, spec, budgets, clk, coord := localBudget(t, []string{"eu"}, 0.5)
	var log syncBuffer
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region, cfg.Core.Floors = "eu-0", "eu", spec
	cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = 400*time.Millisecond, 100*time.Millisecond, tick
	cfg.Speaker.Budgets = budgets
	cfg.Tick, cfg.SpeakerWait = tick, 0
	a, err := New(cfg, Deps{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Shared: sh,
		Transport: coord.Transport("eu"), Clock: clk, Logger: slog.New(slog.NewTextHandler(&log, nil))})
	if err != nil {
		t.Fatal(err)
	}
	actx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); a.Run(actx) }()
	defer func() { cancel(); <-done }()
	st := stepper{t: t, clk: clk, timers: 3} // the coordinator, the agent, its lease client
	k := bucket.Key{Rule: "api", Subject: "tenant-1"}
	var pubs []uint64
	st.until(80, "five tables published", func() bool {
		for range 45 {
			_, _ = a.Store().Decide(ctx, k, global, 1, "")
		}
		if tb := a.View().Table(); tb != nil && (len(pubs) == 0 || tb.Pub != pubs[len(pubs)-1]) {
			pubs = append(pubs, tb.Pub)
		}
		return len(pubs) >= 5
	})
	msg := "agent: cannot announce tables; the region waits for its ticks"
	if n := log.count(msg); n != 1 {
		t.Fatalf("%d warnings that tables cannot be announced over %d publications, want 1\n%s", n, len(pubs), log.String())
	}
}
