package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// woken waits on the real clock, up to 10 s, for a wake-up on in, and
// returns the bodies it holds: notices cross goroutines (and, for
// RedisShared, a real Redis), not lease time.
func woken(t *testing.T, in *Inbox, what string) [][]byte {
	t.Helper()
	select {
	case <-in.C():
		return in.Take()
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no wake-up within 10 s", what)
		return nil
	}
}

// idle reports whether in holds no wake-up and no body now.
func idle(in *Inbox) bool {
	select {
	case <-in.C():
		return false
	default:
		return len(in.Take()) == 0
	}
}

// tableIn decodes a NoticeTable's body.
func tableIn(t *testing.T, b []byte) *region.Table {
	t.Helper()
	var tab region.Table
	if err := json.Unmarshal(b, &tab); err != nil {
		t.Fatalf("a table notice's body %q: %v", b, err)
	}
	return &tab
}

// reportIn decodes a NoticeAdoption's body.
func reportIn(t *testing.T, b []byte) region.DemandReport {
	t.Helper()
	return noticeIn(t, b).DemandReport
}

// noticeIn decodes a report's notice.
func noticeIn(t *testing.T, b []byte) reportNotice {
	t.Helper()
	var n reportNotice
	if err := json.Unmarshal(b, &n); err != nil {
		t.Fatalf("a report notice's body %q: %v", b, err)
	}
	return n
}

// bigReport is agent's report adopting pub with 2,000 keys: its JSON is
// over NoticeBodyMax.
func bigReport(agent string, pub uint64) region.DemandReport {
	r := region.DemandReport{Agent: agent, At: t0, Pub: pub, Speaker: "eu-0"}
	for i := range 2000 {
		r.Keys = append(r.Keys, region.DemandItem{Rule: "api", Subject: "tenant-" + strconv.Itoa(i), Want: 12})
	}
	return r
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

// TestMemSharedNotices: a stored table wakes every watcher of tables and
// no other, carrying the table; wake-ups coalesce while the bodies wait,
// oldest first; a table not stored is not announced; an adoption carries
// its report; and a watch ends with its context.
func TestMemSharedNotices(t *testing.T) {
	sh := NewMemShared()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	t1, t2 := sh.Watch(ctx, NoticeTable), sh.Watch(ctx, NoticeTable)
	ad := sh.Watch(ctx, NoticeAdoption)
	for i, pub := range []uint64{1, 2, 3, 2} {
		ok, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Speaker: "eu-0", Pub: pub}, Fence{})
		if err != nil || ok != (i < 3) {
			t.Fatalf("publish %d: %v %v, want stored %v", pub, ok, err, i < 3)
		}
	}
	for i, in := range []*Inbox{t1, t2} {
		bodies := woken(t, in, "a table watcher")
		if len(bodies) != 3 {
			t.Fatalf("watcher %d holds %d bodies, want the 3 tables stored", i, len(bodies))
		}
		for j, b := range bodies {
			if got := tableIn(t, b); got.Pub != uint64(j+1) || got.Speaker != "eu-0" {
				t.Fatalf("watcher %d's body %d is %+v, want eu-0's publication %d", i, j, got, j+1)
			}
		}
	}
	if !idle(t1) || !idle(ad) {
		t.Fatal("three tables left a second wake-up, or woke the adoption watcher")
	}
	wctx, wcancel := context.WithCancel(ctx)
	gone := sh.Watch(wctx, NoticeAdoption)
	wcancel()
	watching(t, sh, NoticeAdoption, 1) // AfterFunc removes it on its own goroutine
	rep := region.DemandReport{Agent: "eu-1", At: t0, Pub: 3, Speaker: "eu-0",
		Keys: []region.DemandItem{{Rule: "api", Subject: "t1", Want: 12}}}
	if err := sh.Adopt(ctx, rep); err != nil {
		t.Fatal(err)
	}
	bodies := woken(t, ad, "adoption watcher")
	if n := noticeIn(t, bodies[0]); len(bodies) != 1 || n.Pub != 3 || n.Agent != "eu-1" || len(n.Keys) != 1 || !n.Whole {
		t.Fatalf("adoption bodies %q, want eu-1's whole report adopting 3, with its key", bodies)
	}
	if reps, _ := sh.Demands(ctx); len(reps) != 1 || reps[0].Pub != 3 || len(reps[0].Keys) != 1 {
		t.Fatalf("stored reports %+v, want eu-1's adopting 3, with its key", reps)
	}
	// A report larger than a notice carries goes without its keys.
	if err := sh.Adopt(ctx, bigReport("eu-1", 4)); err != nil {
		t.Fatal(err)
	}
	bodies = woken(t, ad, "adoption watcher")
	if n := noticeIn(t, bodies[0]); len(bodies) != 1 || n.Pub != 4 || len(n.Keys) != 0 || n.Whole {
		t.Fatalf("adoption bodies %q, want eu-1's report adopting 4, without its keys", bodies)
	}
	if reps, _ := sh.Demands(ctx); len(reps) != 1 || reps[0].Pub != 4 || len(reps[0].Keys) != 2000 {
		t.Fatalf("stored reports %+v, want eu-1's adopting 4, with its 2,000 keys", reps)
	}
	if !idle(gone) {
		t.Fatal("a watch whose context ended was woken")
	}
}

// TestInboxKeepsTheNewest: an inbox that is not read keeps the newest
// inboxCap bodies; the older are dropped (the ticks read the store). A
// body larger than any notice carries is kept as a bare wake-up.
func TestInboxKeepsTheNewest(t *testing.T) {
	in := newInbox()
	for i := range inboxCap + 5 {
		in.put([]byte(strconv.Itoa(i)))
	}
	got := in.Take()
	if len(got) != inboxCap || string(got[0]) != "5" || string(got[inboxCap-1]) != strconv.Itoa(inboxCap+4) {
		t.Fatalf("kept %d bodies from %q to %q, want %d from 5", len(got), got[0], got[len(got)-1], inboxCap)
	}
	if in.Take() != nil {
		t.Fatal("a second Take returned bodies again")
	}
	in.put(make([]byte, NoticeBodyMax+1))
	if got := in.Take(); len(got) != 1 || got[0] != nil {
		t.Fatalf("a body over NoticeBodyMax kept as %d bytes, want a bare wake-up (nil)", len(got[0]))
	}
	var none *Inbox
	if none.C() != nil || none.Take() != nil {
		t.Fatal("the nil inbox is not empty")
	}
}

// TestRedisSharedNotices: over a real Redis's pub/sub, the script that
// stores a table announces it and the one that stores a report announces
// that, each carrying what it stored, to a watcher on another connection,
// by kind and by region; a table not stored is not announced.
func TestRedisSharedNotices(t *testing.T) {
	addr := testenv.RedisAddr(t)
	c1 := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	c2 := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer c1.Close()
	defer c2.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prefix := fmt.Sprintf("allot-test-%s-%d:", t.Name(), time.Now().UnixNano()) // one per run (-count)
	eu, us := NewRedisShared(c1, prefix, "eu", 5*time.Second, time.Minute), NewRedisShared(c2, prefix, "us", 5*time.Second, time.Minute)
	watcher := NewRedisShared(c2, prefix, "eu", 5*time.Second, time.Minute)
	tables, adoptions := watcher.Watch(ctx, NoticeTable), watcher.Watch(ctx, NoticeAdoption)
	usTables := us.Watch(ctx, NoticeTable)
	tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 7, Version: 3,
		Entries: []lease.Entry{{Key: bucket.Key{Rule: "api", Subject: "t1"}, Count: 40, Burst: 9}}}
	if ok, err := eu.PublishTable(ctx, tab, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	bodies := woken(t, tables, "eu's table watcher")
	if len(bodies) != 1 || !tableIn(t, bodies[0]).Same(tab) || tableIn(t, bodies[0]).Pub != 7 {
		t.Fatalf("table notices %q, want publication 7 as stored", bodies)
	}
	if ok, err := eu.PublishTable(ctx, &region.Table{Region: "eu", Pub: 6}, Fence{}); err != nil || ok {
		t.Fatalf("publish an older table: %v %v, want not stored", ok, err)
	}
	// Nor one refused as not the speaker lease's holder's.
	held, err := eu.HoldSpeaker(ctx, "eu-0", Fence{}, time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	if ok, err := eu.PublishTable(ctx, &region.Table{Region: "eu", Pub: 9}, Fence{}); !errors.Is(err, ErrNotSpeaker) || ok {
		t.Fatalf("publish without the speaker lease: %v %v, want ErrNotSpeaker", ok, err)
	}
	rep := region.DemandReport{Agent: "eu-1", At: t0, Pub: 7, Speaker: "eu-0",
		Keys: []region.DemandItem{{Rule: "api", Subject: "t1", Want: 12}}}
	if err := eu.Adopt(ctx, rep); err != nil {
		t.Fatal(err)
	}
	bodies = woken(t, adoptions, "eu's adoption watcher")
	if len(bodies) != 1 {
		t.Fatalf("adoption notices %q, want one", bodies)
	}
	if got := noticeIn(t, bodies[0]); got.Agent != "eu-1" || got.Pub != 7 || got.Speaker != "eu-0" || !got.At.Equal(t0) ||
		len(got.Keys) != 1 || got.Keys[0] != rep.Keys[0] || !got.Whole {
		t.Fatalf("adoption notice %+v, want the whole report %+v", got, rep)
	}
	if err := eu.Adopt(ctx, bigReport("eu-1", 7)); err != nil {
		t.Fatal(err)
	}
	bodies = woken(t, adoptions, "eu's adoption watcher")
	if got := noticeIn(t, bodies[0]); len(bodies) != 1 || got.Pub != 7 || len(got.Keys) != 0 || got.Whole {
		t.Fatalf("adoption notices %q, want one of a report without its keys", bodies)
	}
	if reps, err := watcher.Demands(ctx); err != nil || len(reps) != 1 || len(reps[0].Keys) != 2000 {
		t.Fatalf("stored reports %+v %v, want eu-1's with its 2,000 keys", reps, err)
	}
	if err := eu.Adopt(ctx, rep); err != nil {
		t.Fatal(err)
	}
	_ = woken(t, adoptions, "eu's adoption watcher")
	if reps, err := watcher.Demands(ctx); err != nil || len(reps) != 1 || reps[0].Pub != 7 || reps[0].Keys[0].Want != 12 {
		t.Fatalf("stored reports %+v %v, want eu-1's adopting 7", reps, err)
	}
	// A table larger than a notice carries is announced as a wake-up.
	big := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 8}
	for i := range 2000 {
		big.Entries = append(big.Entries, lease.Entry{Key: bucket.Key{Rule: "api", Subject: "tenant-" + strconv.Itoa(i)}, Count: 40, Burst: 9})
	}
	if ok, err := eu.PublishTable(ctx, big, held); err != nil || !ok {
		t.Fatalf("publish the large table: %v %v", ok, err)
	}
	if b := woken(t, tables, "the large table's notice"); len(b) != 1 || string(b[0]) != "1" {
		t.Fatalf("the large table's notice carried %d bytes, want a bare wake-up", len(b[0]))
	}
	if got, err := watcher.LoadTable(ctx); err != nil || got == nil || got.Pub != 8 || len(got.Entries) != 2000 {
		t.Fatalf("the stored large table: %v, want publication 8 with 2000 entries", err)
	}
	// Redis delivers a subscriber's messages in order: once us's own
	// notice arrives, an eu notice would have arrived before it.
	if ok, err := us.PublishTable(ctx, &region.Table{Region: "us", Pub: 1}, Fence{}); err != nil || !ok {
		t.Fatalf("publish us: %v %v", ok, err)
	}
	woken(t, usTables, "us's table watcher")
	if !idle(tables) || !idle(adoptions) {
		t.Fatal("a table not stored, or a notice of another region, woke eu's watchers")
	}
}

// blindShared is a region's MemShared as one agent reaches it through a
// store that never shows what the notices carry: with noTable LoadTable
// fails, and Demands shows hide's reports adopting no table. Only a
// notice's body can then tell the agent of a table, or the speaking agent
// of hide's adoption. With oldAgent, hide announces its adoptions as an
// agent of an earlier version did, with a body that is no report.
type blindShared struct {
	*MemShared
	noTable  bool
	hide     string
	oldAgent bool
}

func (b *blindShared) LoadTable(ctx context.Context) (*region.Table, error) {
	if b.noTable {
		return nil, errors.New("test: this agent cannot read the table")
	}
	return b.MemShared.LoadTable(ctx)
}

func (b *blindShared) Demands(ctx context.Context) ([]region.DemandReport, error) {
	reps, err := b.MemShared.Demands(ctx)
	for i := range reps {
		if b.hide != "" && reps[i].Agent == b.hide {
			reps[i].Pub, reps[i].Speaker = 0, ""
		}
	}
	return reps, err
}

func (b *blindShared) Adopt(ctx context.Context, r region.DemandReport) error {
	if !b.oldAgent {
		return b.MemShared.Adopt(ctx, r)
	}
	m := b.MemShared
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demand[r.Agent] = r
	for _, w := range m.watchers[NoticeAdoption] {
		w.put([]byte("1"))
	}
	return nil
}

// startListener starts eu-1, an agent of region eu that does not speak
// (no coordinator), on sh and clk (nil: the real clock, the fake one in a
// synctest bubble); stop stops it.
func startListener(t *testing.T, clk clock.Clock, sh Shared) (a *Agent, cfg Config, stop func()) {
	t.Helper()
	return startListenerOn(t, clk, sh, bucket.NewMemory(bucket.MemoryOptions{Clock: clk}))
}

// startListenerOn is startListener deciding in the bucket store st.
func startListenerOn(t *testing.T, clk clock.Clock, sh Shared, st bucket.Store) (a *Agent, cfg Config, stop func()) {
	t.Helper()
	cfg = DefaultConfig()
	cfg.Name, cfg.Core.Region = "eu-1", "eu"
	a, err := New(cfg, Deps{Store: st, Shared: sh, Clock: clk,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = a.Run(ctx) }()
	return a, cfg, func() { cancel(); <-done }
}

// runListener runs startListener's agent on the manual clock clk until
// the test ends. It returns the agent and its config once the agent
// watches for tables (its first round done); watched is the MemShared
// underneath sh.
func runListener(t *testing.T, clk *clock.Manual, sh Shared, watched *MemShared) (*Agent, Config) {
	t.Helper()
	a, cfg, stop := startListener(t, clk, sh)
	t.Cleanup(stop)
	watching(t, watched, NoticeTable, 1)
	return a, cfg
}

// TestAgentAdoptsAnnouncedTable: told of a table, an agent that does not
// speak decides with the table the notice carries, without reading the
// store (its LoadTable fails), and stores its report again as adopting
// it, announced, before its next tick (the manual clock never moves). A
// notice with no table in it (a speaker of an earlier version) has it load
// the stored table.
func TestAgentAdoptsAnnouncedTable(t *testing.T) {
	clk := clock.NewManual(t0)
	sh := NewMemSharedOn(clk)
	blind := &blindShared{MemShared: sh, noTable: true}
	a, _ := runListener(t, clk, blind, sh)
	ctx := t.Context()
	adoptions := sh.Watch(ctx, NoticeAdoption)
	tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 42}
	if ok, err := sh.PublishTable(ctx, tab, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	bodies := woken(t, adoptions, "the adoption")
	if got := a.View().Table(); got == nil || got.Pub != 42 {
		t.Fatalf("the agent decides with %+v, want publication 42", got)
	}
	if len(bodies) != 1 || reportIn(t, bodies[0]).Pub != 42 {
		t.Fatalf("adoption notices %q, want one adopting 42", bodies)
	}
	reps, err := sh.Demands(ctx)
	if err != nil || len(reps) != 1 || reps[0].Agent != "eu-1" || reps[0].Pub != 42 || reps[0].Speaker != "eu-0" || !reps[0].At.Equal(t0) {
		t.Fatalf("stored reports %+v %v, want eu-1's of %s adopting eu-0's publication 42", reps, err, t0)
	}

	// A speaker of an earlier version: its notice is a wake-up, "1".
	blind.noTable = false
	if ok, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Speaker: "eu-0", Pub: 43}, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	woken(t, adoptions, "the adoption of 43")
	sh.mu.Lock()
	sh.table = &region.Table{Region: "eu", Speaker: "eu-0", Pub: 44}
	sh.watchers[NoticeTable][0].put([]byte("1"))
	sh.mu.Unlock()
	if bodies := woken(t, adoptions, "the adoption of 44"); len(bodies) != 1 || reportIn(t, bodies[0]).Pub != 44 {
		t.Fatalf("adoption notices %q, want one adopting the stored 44", bodies)
	}
	if !clk.Now().Equal(t0) {
		t.Fatalf("the clock moved to %s", clk.Now())
	}
}

// stuckShared is a MemShared whose next write of a report, once armed,
// blocks until the agent stops: an agent's round stuck on a slow store.
type stuckShared struct {
	*MemShared
	armed atomic.Bool
	stuck chan struct{} // closed once a write blocks
}

// Adopt stores and announces every report of an agent on a Notifier.
func (s *stuckShared) Adopt(ctx context.Context, r region.DemandReport) error {
	if s.armed.CompareAndSwap(true, false) {
		close(s.stuck)
		<-ctx.Done() // until the agent stops
	}
	return s.MemShared.Adopt(ctx, r)
}

// TestAgentAdoptsWhileItsRoundWaits: an agent whose round is stuck on the
// store (its report's write does not return) still adopts an announced
// table and announces its adoption: the notice does not wait for the
// round.
func TestAgentAdoptsWhileItsRoundWaits(t *testing.T) {
	clk := clock.NewManual(t0)
	sh := &stuckShared{MemShared: NewMemSharedOn(clk), stuck: make(chan struct{})}
	a, cfg := runListener(t, clk, sh, sh.MemShared)
	ctx := t.Context()
	adoptions := sh.Watch(ctx, NoticeAdoption)
	sh.armed.Store(true)
	clk.Advance(cfg.Tick) // the next round, which sticks
	select {
	case <-sh.stuck:
	case <-time.After(10 * time.Second):
		t.Fatal("the agent's round did not reach the store within 10 s")
	}
	if ok, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Speaker: "eu-0", Pub: 42}, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	if b := woken(t, adoptions, "the adoption while the round waits"); len(b) != 1 || reportIn(t, b[0]).Pub != 42 {
		t.Fatalf("adoption notices %q, want one adopting 42", b)
	}
	if got := a.View().Table(); got == nil || got.Pub != 42 {
		t.Fatalf("the agent decides with %+v, want publication 42", got)
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
//
// Through a blind store (blindShared) the notices' bodies are all that
// can carry the table to eu-1 and its adoption back: no read of the store
// is on the path either. With eu-1 of an earlier version (its notices
// carry no report), the speaking agent reads the stored reports.
func TestGrantAcknowledgedWithoutTheAgentsTicks(t *testing.T) {
	for _, tc := range []struct {
		name     string
		speaker  blindShared
		listener blindShared
	}{
		{"readable store", blindShared{}, blindShared{}},
		{"blind store", blindShared{hide: "eu-1"}, blindShared{noTable: true}},
		{"agent of an earlier version", blindShared{}, blindShared{oldAgent: true}},
	} {
		t.Run(tc.name, func(t *testing.T) { grantAcknowledgedWithoutTicks(t, tc.speaker, tc.listener) })
	}
}

func grantAcknowledgedWithoutTicks(t *testing.T, speaker, listener blindShared) {
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
		through := speaker
		if i == 1 {
			cfg.Tick, cfg.SpeakerLease = time.Hour, 2*time.Hour
			through = listener
		}
		through.MemShared = sh
		a, err := New(cfg, Deps{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), Shared: &through,
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
	// the coordinator grants it the reserve. (A new version of eu's grants
	// alone is not that: under load the end of learning's whole table came
	// first, the key not yet hot, and the test stopped pressing before the
	// raise, so no decrease could follow.)
	k := bucket.Key{Rule: "api", Subject: "tenant-1"}
	st.until(80, "eu granted the reserve", func() bool {
		for range 45 {
			_, _ = agents[0].Store().Decide(ctx, k, global, 1, "")
		}
		for _, ks := range coord.Keys(10) {
			if ks.Key == k && ks.Counts[0] > ks.Floors[0] {
				return true
			}
		}
		return false
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
	if ok, err := from.PublishTable(ctx, &region.Table{Region: "eu", Pub: 1}, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	woken(t, tables, "before the restart")
	srv.Restart(t)
	// The subscriber reconnects on its own schedule: publish until one
	// arrives, for at most 20 s of real time.
	deadline := time.Now().Add(20 * time.Second)
	for pub := uint64(2); ; pub++ {
		// Fails until the publisher has reconnected too.
		_, _ = from.PublishTable(ctx, &region.Table{Region: "eu", Pub: pub}, Fence{})
		select {
		case <-tables.C():
			if got := tableIn(t, tables.Take()[0]); got.Pub < 2 {
				t.Fatalf("after the restart the notice carried publication %d", got.Pub)
			}
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
	tables, adoptions := shared[1].Watch(ctx, NoticeTable), shared[1].Watch(ctx, NoticeAdoption)
	if ok, err := shared[0].PublishTable(ctx, &region.Table{Region: "eu", Pub: 5}, Fence{}); err != nil || !ok {
		t.Fatalf("publish: %v %v", ok, err)
	}
	if b := woken(t, tables, "the table watcher on the cluster"); len(b) != 1 || tableIn(t, b[0]).Pub != 5 {
		t.Fatalf("table notices %q, want publication 5", b)
	}
	if err := shared[0].Adopt(ctx, region.DemandReport{Agent: "eu-1", At: t0, Pub: 5}); err != nil {
		t.Fatal(err)
	}
	if b := woken(t, adoptions, "the adoption watcher on the cluster"); len(b) != 1 || reportIn(t, b[0]).Pub != 5 {
		t.Fatalf("adoption notices %q, want eu-1's adopting 5", b)
	}
}

// TestRefusedNoticesWarnOnce: a Redis user without the notice channels'
// permission (an ACL with resetchannels) cannot announce: its tables and
// reports are stored all the same, with an error that says they were not
// announced. The region still works, at its ticks' pace, and the speaking
// agent warns once, not at every table it publishes.
func TestRefusedNoticesWarnOnce(t *testing.T) {
	srv := testenv.StartRedis(t)
	ctx := context.Background()
	if err := srv.Client(t).Do(ctx, "ACL", "SETUSER", "agent", "on", ">agent-secret-1234", "~*", "+@all", "resetchannels").Err(); err != nil {
		t.Fatal(err)
	}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr, Username: "agent", Password: "agent-secret-1234", ContextTimeoutEnabled: true})
	t.Cleanup(func() { c.Close() })
	sh := NewRedisShared(c, "allot:", "eu", 5*time.Second, time.Minute)
	if ok, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Pub: 1}, Fence{}); !ok || !errors.Is(err, ErrNotAnnounced) || !strings.Contains(err.Error(), "publish to the channel") {
		t.Fatalf("publish as a user without channels: %v %v, want stored, not announced (no permission)", ok, err)
	}
	if tab, err := sh.LoadTable(ctx); err != nil || tab == nil || tab.Pub != 1 {
		t.Fatalf("stored table %+v %v, want publication 1", tab, err)
	}
	if err := sh.Adopt(ctx, region.DemandReport{Agent: "eu-1", At: t0, Pub: 1}); !errors.Is(err, ErrNotAnnounced) || !strings.Contains(err.Error(), "publish to the channel") {
		t.Fatalf("adopt as a user without channels: %v, want stored, not announced (no permission)", err)
	}
	if reps, err := sh.Demands(ctx); err != nil || len(reps) != 1 || reps[0].Pub != 1 {
		t.Fatalf("stored reports %+v %v, want eu-1's adopting 1", reps, err)
	}
	if err := srv.Client(t).Del(ctx, "allot:region:{eu}:table", "allot:region:{eu}:demand").Err(); err != nil {
		t.Fatal(err)
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

// slowRound is a MemShared whose LoadTable takes delay, and that records
// how old each report is when it is stored.
type slowRound struct {
	*MemShared
	delay time.Duration
	mu    sync.Mutex
	ages  []time.Duration
}

func (s *slowRound) LoadTable(ctx context.Context) (*region.Table, error) {
	time.Sleep(s.delay) // in a synctest bubble: the store's latency, on the fake clock
	return s.MemShared.LoadTable(ctx)
}

// storedAtOnce fails the test unless at least n reports were stored, each
// as its round sampled it; why says what else the test saw.
func (s *slowRound) storedAtOnce(t *testing.T, n int, why string) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.ages) < n {
		t.Fatalf("%d reports stored, want %d or more", len(s.ages), n)
	}
	for _, age := range s.ages {
		if age > 0 {
			t.Fatalf("reports stored %v after the round sampled them, want at once (%sall: %v)", age, why, s.ages)
		}
	}
}

// Adopt stores and announces every report of an agent on a Notifier.
func (s *slowRound) Adopt(ctx context.Context, r region.DemandReport) error {
	s.mu.Lock()
	s.ages = append(s.ages, time.Since(r.At))
	s.mu.Unlock()
	return s.MemShared.Adopt(ctx, r)
}

// TestAgentReportsBeforeItsSlowerCalls: an agent's round stores its
// report before it reads the table, so under a store that takes 400 ms to
// answer that read, the report is stored as the round sampled it. After
// the read it was 400 ms old when stored, and as much older when the
// speaking agent read it.
func TestAgentReportsBeforeItsSlowerCalls(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := &slowRound{MemShared: NewMemShared(), delay: 400 * time.Millisecond}
		_, _, stop := startListener(t, nil, sh)
		time.Sleep(5 * time.Second)
		stop()
		sh.storedAtOnce(t, 5, "")
	})
}

// noNotices hides a MemShared's notices: a region whose Redis user may not
// publish, or an agent of a version without them.
type noNotices struct{ Shared }

// TestAgentReportsATableItLoadedInTheSameRound: without notices, an agent
// that loads a new table in its round stores a report adopting it in that
// round, not a round later, so the speaking agent's acknowledgement does
// not wait a tick more for the report going first.
func TestAgentReportsATableItLoadedInTheSameRound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := NewMemShared()
		ctx := t.Context()
		_, cfg, stop := startListener(t, nil, noNotices{sh})
		defer stop()
		time.Sleep(1050 * time.Millisecond) // between two rounds
		if ok, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Speaker: "eu-0", Pub: 42}, Fence{}); err != nil || !ok {
			t.Fatalf("publish: %v %v", ok, err)
		}
		published := time.Now()
		for {
			reps, _ := sh.Demands(ctx)
			if len(reps) == 1 && reps[0].Pub == 42 {
				break
			}
			time.Sleep(time.Millisecond)
		}
		if took := time.Since(published); took > cfg.Tick {
			t.Fatalf("the report adopting the table came %v after it was stored, want within a tick (%v)", took, cfg.Tick)
		}
	})
}

// slowReturns is an in-process bucket store whose Return, the batch tokens
// a core gives back, takes delay.
type slowReturns struct {
	*bucket.Memory
	delay   time.Duration
	returns atomic.Int64
}

func (s *slowReturns) Return(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	s.returns.Add(1)
	time.Sleep(s.delay) // in a synctest bubble: the store's latency, on the fake clock
	return s.Memory.Return(ctx, key, l, n)
}

// TestAgentReportsBeforeItGivesBatchesBack: a round stores its report as
// soon as the core has sampled the demand, before the core gives back the
// batch tokens that went stale, so under a store that takes 400 ms to take
// them back the report is stored as the round sampled it. Stored after
// them, it was 400 ms old in every round that gave a batch back, as it is
// in a region whose allocation just shrank.
func TestAgentReportsBeforeItGivesBatchesBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		sh := &slowRound{MemShared: NewMemShared()}
		st := &slowReturns{Memory: bucket.NewMemory(bucket.MemoryOptions{}), delay: 400 * time.Millisecond}
		a, _, stop := startListenerOn(t, nil, sh, st)
		ctx := t.Context()
		k, global := bucket.Key{Rule: "api", Subject: "t1"}, bucket.PerSecond(10000)
		// Bursts of 1,000 a second, batched, each followed by a lull in
		// which the batch left over goes stale and goes back.
		for range 5 {
			for range 200 {
				if _, err := a.Store().Decide(ctx, k, global, 1, ""); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}
			time.Sleep(time.Second)
		}
		stop()
		n := st.returns.Load()
		if n == 0 {
			t.Fatal("no batch tokens were given back: the test does not reach what it checks")
		}
		sh.storedAtOnce(t, 10, fmt.Sprintf("%d batches given back; ", n))
	})
}

// levelLog is a slowRound (LoadTable takes delay) that also records when
// each report was stored and the demand it gave key.
type levelLog struct {
	slowRound
	key    bucket.Key
	mu     sync.Mutex
	stored []time.Time
	wants  []bucket.Tokens
}

func (l *levelLog) Adopt(ctx context.Context, r region.DemandReport) error {
	var want bucket.Tokens
	for _, k := range r.Keys {
		if k.Rule == l.key.Rule && k.Subject == l.key.Subject {
			want = k.Want
		}
	}
	l.mu.Lock()
	l.stored, l.wants = append(l.stored, time.Now()), append(l.wants, want)
	l.mu.Unlock()
	return l.slowRound.Adopt(ctx, r)
}

// firstBelow returns how long after from the first report giving the key
// at most want was stored (false: none was).
func (l *levelLog) firstBelow(from time.Time, want bucket.Tokens) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for i, at := range l.stored {
		if !at.Before(from) && l.wants[i] <= want {
			return at.Sub(from), true
		}
	}
	return 0, false
}

// TestAgentReportsANewLevelAtOnce: an agent's round reads the table from
// a store that takes 400 ms to answer, so its rounds come about every
// half second. A batched key's use falls from 1,000 a second to 50 four
// times; the agent samples its batched keys every 20 ms between rounds,
// and stores its report as soon as the core's estimate takes the fall:
// within 150 ms of it (100–120 ms in runs of this test). Left to the
// rounds, the falls were stored up to 560 ms after them; with the reports
// stored at once but batched keys sampled only at rounds and refills,
// 180–300 ms.
func TestAgentReportsANewLevelAtOnce(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		k := bucket.Key{Rule: "api", Subject: "t1"}
		sh := &levelLog{slowRound: slowRound{MemShared: NewMemShared(), delay: 400 * time.Millisecond}, key: k}
		a, _, stop := startListenerOn(t, nil, sh, bucket.NewMemory(bucket.MemoryOptions{}))
		ctx := t.Context()
		global := bucket.PerSecond(10000)
		var falls []time.Time
		for i := range 4 {
			for range 1500 { // 1.5 s at 1,000 a second
				if _, err := a.Store().Decide(ctx, k, global, 1, ""); err != nil {
					t.Fatal(err)
				}
				time.Sleep(time.Millisecond)
			}
			falls = append(falls, time.Now())
			for range 30 + 7*i { // 50 a second, from 0.6 s to 0.8 s, so the falls meet the rounds at different points
				if _, err := a.Store().Decide(ctx, k, global, 1, ""); err != nil {
					t.Fatal(err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		}
		stop()
		var worst time.Duration
		for i, f := range falls {
			took, ok := sh.firstBelow(f, 500)
			if !ok {
				t.Fatalf("the fall at %d was never reported", i)
			}
			t.Logf("fall %d stored %v after it", i, took)
			worst = max(worst, took)
		}
		t.Logf("worst fall stored %v after it", worst)
		if worst > 150*time.Millisecond {
			t.Fatalf("a fall from 1,000 a second to 50 was stored %v after it, want within 150 ms", worst)
		}
	})
}
