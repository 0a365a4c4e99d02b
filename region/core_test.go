package region

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

// countingStore wraps a store, counts its calls by kind, records their
// order and can be made to fail.
type countingStore struct {
	bucket.Store
	mu    sync.Mutex
	down  bool
	calls map[string]int
	log   []string
	taken bucket.Tokens // tokens debited by Decide and TakeUpTo
	back  bucket.Tokens // tokens given back
}

func newCounting(s bucket.Store) *countingStore {
	return &countingStore{Store: s, calls: map[string]int{}}
}

func (c *countingStore) note(op string, k bucket.Key) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.calls[op]++
	c.log = append(c.log, op+" "+k.Subject)
	if c.down {
		return fmt.Errorf("%w: test store is down", bucket.ErrUnavailable)
	}
	return nil
}

func (c *countingStore) setDown(v bool) { c.mu.Lock(); c.down = v; c.mu.Unlock() }

func (c *countingStore) count(op string) int { c.mu.Lock(); defer c.mu.Unlock(); return c.calls[op] }

func (c *countingStore) total() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, v := range c.calls {
		n += v
	}
	return n
}

func (c *countingStore) Decide(ctx context.Context, k bucket.Key, l bucket.Limit, cost bucket.Tokens, id string) (bucket.Decision, error) {
	if err := c.note("decide", k); err != nil {
		return bucket.Decision{}, err
	}
	d, err := c.Store.Decide(ctx, k, l, cost, id)
	if err == nil && d.Allowed {
		c.mu.Lock()
		c.taken += cost
		c.mu.Unlock()
	}
	return d, err
}

func (c *countingStore) TakeUpTo(ctx context.Context, k bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	if err := c.note("take", k); err != nil {
		return 0, err
	}
	got, err := c.Store.TakeUpTo(ctx, k, l, n)
	c.mu.Lock()
	c.taken += got
	c.mu.Unlock()
	return got, err
}

func (c *countingStore) Return(ctx context.Context, k bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	if err := c.note("return", k); err != nil {
		return err
	}
	c.mu.Lock()
	c.back += n
	c.mu.Unlock()
	return c.Store.Return(ctx, k, l, n)
}

func (c *countingStore) Peek(ctx context.Context, k bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := c.note("peek", k); err != nil {
		return bucket.Decision{}, err
	}
	return c.Store.Peek(ctx, k, l)
}

type fixture struct {
	clk   *clock.Manual
	store *countingStore
	view  *TableView
	core  *Core
}

// newFixture makes a core of region "a" among a, b, c with no reserve, so
// a global 300/s budget gives a floor of 100/s, burst 100.
func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	clk := clock.NewManual(t0)
	cfg := DefaultConfig()
	cfg.Region = "a"
	cfg.Floors = lease.Split{Regions: []string{"a", "b", "c"}}
	if mod != nil {
		mod(&cfg)
	}
	st := newCounting(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}))
	view := NewTableView(cfg.Region, cfg.Floors)
	core, err := NewCore(cfg, st, view)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{clk: clk, store: st, view: view, core: core}
}

var global300 = bucket.PerSecond(300)

func key(s string) bucket.Key { return bucket.Key{Rule: "api", Subject: s} }

func (f *fixture) decide(t *testing.T, k bucket.Key, cost bucket.Tokens) Result {
	t.Helper()
	r, err := f.core.Decide(context.Background(), f.clk.Now(), k, global300, cost, "")
	if err != nil {
		t.Fatalf("decide %v cost %d: %v", k, cost, err)
	}
	return r
}

func TestColdKeyIsExactAtItsFloor(t *testing.T) {
	f := newFixture(t, nil)
	admitted := 0
	for i := 0; i < 150; i++ {
		r := f.decide(t, key("cold"), 1)
		if r.Path != PathStore && r.Path != PathDenyCache {
			t.Fatalf("request %d: path %s, want store or deny-cache", i, r.Path)
		}
		if r.Decision.Limit != bucket.PerSecond(100) {
			t.Fatalf("allocation %v, want the floor 100 per 1s, burst 100", r.Decision.Limit)
		}
		if r.Decision.Allowed {
			admitted++
		}
	}
	if admitted != 100 {
		t.Fatalf("admitted %d at one instant, want the floor's burst 100", admitted)
	}
	// The denial is cached: the store saw 101 decisions, not 150.
	if n := f.store.count("decide"); n != 101 {
		t.Fatalf("store decides %d, want 101 (deny cache for the rest)", n)
	}
	f.clk.Advance(10 * time.Millisecond)
	if r := f.decide(t, key("cold"), 1); !r.Decision.Allowed {
		t.Fatalf("after 10 ms one token has refilled, got %+v", r)
	}
}

func TestHotEntryLeaseExpiryAndLentFloor(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	tab := &Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(10 * time.Second), HoldUntil: now.Add(20 * time.Second),
		Entries: []lease.Entry{{Key: key("hot"), Count: 250, Burst: 250}, {Key: key("lent"), Count: 40, Burst: 40}}}
	if !f.view.Set(tab) {
		t.Fatal("first table not installed")
	}
	cases := []struct {
		at   time.Duration
		key  string
		want bucket.Limit
		hot  bool
	}{
		{0, "hot", bucket.PerSecond(250), true},
		{0, "lent", bucket.PerSecond(40), true},
		{0, "cold", bucket.PerSecond(100), false},
		{11 * time.Second, "hot", bucket.PerSecond(100), false},  // lease over: floor
		{11 * time.Second, "lent", bucket.PerSecond(40), true},   // a lent floor stays lent until the hold ends
		{21 * time.Second, "lent", bucket.PerSecond(100), false}, // hold over: floor
	}
	for _, c := range cases {
		f.clk.Set(t0.Add(c.at))
		r := f.decide(t, key(c.key), 1)
		if r.Decision.Limit != c.want || r.Hot != c.hot {
			t.Errorf("at +%s key %s: alloc %v hot %v, want %v hot %v", c.at, c.key, r.Decision.Limit, r.Hot, c.want, c.hot)
		}
	}
	// An older table never replaces a newer one.
	if f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 0}) {
		t.Fatal("older table installed")
	}
}

// TestRenewalKeepsEpoch checks that a table that only renews the lease
// leaves the view's epoch (and so every key's cached allocation) in place,
// while any table that may change an answer moves it: other entries, a
// shorter or released lease, or a renewal after a reader found the lease
// over. Each decision must still see the allocation of the current table.
func TestRenewalKeepsEpoch(t *testing.T) {
	f := newFixture(t, nil)
	entries := func(hot bucket.Tokens) []lease.Entry {
		return []lease.Entry{{Key: key("hot"), Count: hot, Burst: hot}, {Key: key("lent"), Count: 40, Burst: 40}}
	}
	pub := uint64(0)
	table := func(end, hold time.Duration, released bool, es []lease.Entry) *Table {
		pub++
		return &Table{Region: "a", Pub: pub, Term: 1, Version: pub, LeaseEnd: t0.Add(end), HoldUntil: t0.Add(hold),
			Released: released, Entries: es}
	}
	steps := []struct {
		name  string
		at    time.Duration
		tab   *Table
		moves bool
		// hot and lent are the allocations (per second) a decision sees after the step.
		hot, lent bucket.Tokens
	}{
		{"first table", 0, table(10*time.Second, 20*time.Second, false, entries(250)), true, 250, 40},
		{"renewal", time.Second, table(11*time.Second, 21*time.Second, false, entries(250)), false, 250, 40},
		{"renewal, hold unchanged", 2 * time.Second, table(12*time.Second, 21*time.Second, false, entries(250)), false, 250, 40},
		{"same lease end", 3 * time.Second, table(12*time.Second, 22*time.Second, false, entries(250)), false, 250, 40},
		{"other entries", 4 * time.Second, table(14*time.Second, 24*time.Second, false, entries(200)), true, 200, 40},
		{"shorter lease", 5 * time.Second, table(13*time.Second, 24*time.Second, false, entries(200)), true, 200, 40},
		{"released", 6 * time.Second, table(16*time.Second, 26*time.Second, true, entries(200)), true, 100, 40},
		{"renewed after release", 7 * time.Second, table(17*time.Second, 27*time.Second, false, entries(200)), true, 200, 40},
		// At +18 s the lease is over: hot is at its floor, lent still lent.
		{"lapsed, no table", 18 * time.Second, nil, false, 100, 40},
		{"renewal after a lapse", 18 * time.Second, table(30*time.Second, 40*time.Second, false, entries(200)), true, 200, 40},
		{"renewal after it", 19 * time.Second, table(31*time.Second, 41*time.Second, false, entries(200)), false, 200, 40},
	}
	for _, st := range steps {
		f.clk.Set(t0.Add(st.at))
		ep := f.view.Epoch()
		if st.tab != nil && !f.view.Set(st.tab) {
			t.Fatalf("%s: table not installed", st.name)
		}
		if moved := f.view.Epoch() != ep; moved != st.moves {
			t.Errorf("%s: epoch moved %v, want %v", st.name, moved, st.moves)
		}
		for _, k := range []struct {
			name string
			want bucket.Tokens
		}{{"hot", st.hot}, {"lent", st.lent}} {
			if r := f.decide(t, key(k.name), 1); r.Decision.Limit != bucket.PerSecond(k.want) {
				t.Errorf("%s: key %s decided under %v, want %v", st.name, k.name, r.Decision.Limit, bucket.PerSecond(k.want))
			}
		}
	}
}

// TestTableViewMatchesHolder checks that every agent's view of the table
// answers as the speaking agent's lease.Holder does.
func TestTableViewMatchesHolder(t *testing.T) {
	b := lease.Budget{Rule: "api", Limit: global300, Regions: []string{"a", "b", "c"}, Reserve: 0.25}
	hc := lease.DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 7, []lease.Budget{b}
	st := lease.HolderState{Session: 7, Term: 2, Version: 3, LeaseEnd: t0.Add(10 * time.Second), HoldUntil: t0.Add(25 * time.Second),
		Entries: []lease.Entry{{Key: key("x"), Count: 180, Burst: 180}, {Key: key("y"), Count: 10, Burst: 10}, {Key: key("z"), Count: 0, Burst: 0}}}
	h, err := lease.RestoreHolder(hc, st, t0)
	if err != nil {
		t.Fatal(err)
	}
	v := NewTableView("a", lease.Split{Regions: b.Regions, Reserve: b.Reserve})
	v.Set(TableOf("a", "agent-1", 1, h.Snapshot(), t0))
	floor := b.Floor("a").Limit
	for _, at := range []time.Duration{0, 9 * time.Second, 10 * time.Second, 24 * time.Second, 25 * time.Second, time.Minute} {
		now := t0.Add(at)
		for _, s := range []string{"x", "y", "z", "cold"} {
			want, _ := h.Allocation(now, key(s))
			got, hot, _ := v.Allocation(now, key(s), global300)
			if got != want {
				t.Errorf("at +%s key %s: view %v, holder %v", at, s, got, want)
			}
			if hot != (want != floor) {
				t.Errorf("at +%s key %s: view says hot %v for %v, the floor being %v", at, s, hot, got, floor)
			}
		}
	}
}

func TestBatchesFollowDemandAndNeverOvershoot(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour), HoldUntil: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("hot"), Count: 200_000, Burst: 200_000}}})
	global := bucket.PerSecond(600_000)
	admitted, decisions := 0, 0
	// 100 requests every millisecond (100k/s) for 2 s, below the 200k/s
	// allocation.
	for ms := 0; ms < 2000; ms++ {
		for i := 0; i < 100; i++ {
			r, err := f.core.Decide(context.Background(), f.clk.Now(), key("hot"), global, 1, "")
			if err != nil {
				t.Fatal(err)
			}
			decisions++
			if r.Decision.Allowed {
				admitted++
			}
		}
		f.clk.Advance(time.Millisecond)
		if ms%50 == 0 {
			f.core.Tick(context.Background(), f.clk.Now())
		}
	}
	if admitted != decisions {
		t.Fatalf("admitted %d of %d below the allocation", admitted, decisions)
	}
	ops := f.store.total()
	perThousand := float64(ops) * 1000 / float64(decisions)
	t.Logf("%d decisions, %d store ops (%.2f per 1000), %d refills", decisions, ops, perThousand, f.core.Stats().Refills)
	if perThousand > 10 {
		t.Fatalf("store ops per 1000 decisions = %.2f, want ≤ 10", perThousand)
	}
	// I3: every admitted token was debited from the regional bucket first.
	f.store.mu.Lock()
	debited := f.store.taken - f.store.back
	f.store.mu.Unlock()
	if bucket.Tokens(admitted) > debited {
		t.Fatalf("admitted %d tokens but only %d were debited", admitted, debited)
	}
}

// TestBatchedKeyOverItsAllocation: 1000 requests per ms (1M/s) against a
// floor of 100/s, burst 100, for 2 s. The admitted count stays within
// burst + rate×t, and the deny cache keeps the store quiet. The key is
// refilled in batches of what the regional bucket gains over BatchWindow
// (2 tokens), not of its demand capped at BatchMaxFraction of the burst
// (10), so once the burst is spent it admits about 2 tokens in every 20 ms
// rather than 10 in one of every five; and a refill asks one token more
// than a batch's worth, so one that gets less knows the bucket is empty
// and the next waits a batch's worth of intervals instead of calling to
// find nothing: one refill per 20 ms.
func TestBatchedKeyOverItsAllocation(t *testing.T) {
	f := newFixture(t, nil)
	global := bucket.PerSecond(300)
	const win = 20 // ms
	var wins []int
	admitted, inFirst := 0, 0
	for ms := 0; ms < 2000; ms++ {
		if ms%win == 0 {
			wins = append(wins, 0)
		}
		if ms == 1000 {
			inFirst = admitted
		}
		for i := 0; i < 1000; i++ {
			r, err := f.core.Decide(context.Background(), f.clk.Now(), key("flood"), global, 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if r.Decision.Allowed {
				admitted++
				wins[len(wins)-1]++
			}
		}
		f.clk.Advance(time.Millisecond)
		if ms%20 == 0 {
			f.core.Tick(context.Background(), f.clk.Now())
		}
	}
	if bound := 100 + 100*1; inFirst > bound || inFirst < 150 {
		t.Fatalf("admitted %d in the first second, want within [150, burst+rate×t = %d]", inFirst, bound)
	}
	if bound := 100 + 100*2; admitted > bound || admitted < 250 {
		t.Fatalf("admitted %d in 2 s, want within [250, burst+rate×t = %d]", admitted, bound)
	}
	if ops := f.store.total(); ops > 2*1000*1000/100 {
		t.Fatalf("%d store ops for 2M decisions", ops)
	}
	// From the second half-second on, the burst is long spent.
	steady := wins[500/win:]
	lo, hi := slices.Min(steady), slices.Max(steady)
	t.Logf("per %d ms after the burst: %d to %d tokens; %d store calls, %d of them TakeUpTo", win, lo, hi, f.store.total(), f.store.count("take"))
	if hi > 4 || lo < 1 {
		t.Fatalf("per %d ms after the burst: %d to %d tokens, want 1 to 4 (2 a window, a refill every 20 ms)", win, lo, hi)
	}
	if takes := f.store.count("take"); takes > 110 {
		t.Fatalf("%d refills in 2 s, want at most 110 (one per BatchWindow, 100)", takes)
	}
}

func TestTokensReturnedOnShrinkStaleAndShutdown(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	tab := &Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour), HoldUntil: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("hot"), Count: 10_000, Burst: 10_000}}}
	f.view.Set(tab)
	global := bucket.PerSecond(30_000)
	run := func(ms int) {
		for i := 0; i < ms; i++ {
			for j := 0; j < 50; j++ {
				if _, err := f.core.Decide(context.Background(), f.clk.Now(), key("hot"), global, 1, ""); err != nil {
					t.Fatal(err)
				}
			}
			f.clk.Advance(time.Millisecond)
		}
	}
	run(30)
	held := func() int64 {
		ks := f.core.state(key("hot"), 0)
		return ks.held()
	}
	if held() == 0 {
		t.Fatal("no batch held after 30 ms at 50k/s")
	}
	// The allocation shrinks: the next tick gives the held tokens back.
	tab2 := *tab
	tab2.Version, tab2.Pub = 2, 2
	tab2.Entries = []lease.Entry{{Key: key("hot"), Count: 1000, Burst: 1000}}
	tab2.index = nil
	f.view.Set(&tab2)
	f.core.Tick(context.Background(), f.clk.Now())
	if held() != 0 || f.store.count("return") != 1 {
		t.Fatalf("after shrink: held %d, returns %d; want 0 held, 1 return", held(), f.store.count("return"))
	}
	// Stale tokens go back after BatchTTL. The shrunk bucket refills first.
	f.clk.Advance(time.Second)
	for i := 0; i < 30 && held() == 0; i++ {
		run(1)
	}
	if held() == 0 {
		t.Fatal("no batch held")
	}
	f.clk.Advance(f.core.cfg.BatchTTL + time.Millisecond)
	f.core.Tick(context.Background(), f.clk.Now())
	if held() != 0 || f.store.count("return") != 2 {
		t.Fatalf("after batch_ttl: held %d, returns %d", held(), f.store.count("return"))
	}
	f.clk.Advance(time.Second)
	for i := 0; i < 30 && held() == 0; i++ {
		run(1)
	}
	if held() == 0 {
		t.Fatal("no batch held before shutdown")
	}
	f.core.Shutdown(context.Background(), f.clk.Now())
	if held() != 0 || f.store.count("return") != 3 {
		t.Fatalf("after shutdown: held %d, returns %d", held(), f.store.count("return"))
	}
}

func TestFailurePolicies(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rules = map[string]RuleConfig{
			"closed":    {OnUnavailable: rules.FailClosed},
			"open":      {OnUnavailable: rules.FailOpen},
			"emergency": {OnUnavailable: rules.Emergency},
		}
		// The first failures leave the breaker closed: stragglers.
		c.BreakerFailures, c.BreakerRatio = 1000, 0
	})
	f.core.SetLive(2)
	f.store.setDown(true)
	ctx := context.Background()
	k := func(rule string) bucket.Key { return bucket.Key{Rule: rule, Subject: "s"} }

	r, err := f.core.Decide(ctx, f.clk.Now(), k("closed"), global300, 1, "")
	if !errors.Is(err, ErrFailClosed) || !errors.Is(err, bucket.ErrUnavailable) || r.Path != PathFailClosed || r.Decision.Allowed {
		t.Fatalf("fail closed: %+v, %v", r, err)
	}
	for i := 0; i < 500; i++ {
		r, err = f.core.Decide(ctx, f.clk.Now(), k("open"), global300, 1, "")
		if err != nil || !r.Decision.Allowed || r.Path != PathFailOpen {
			t.Fatalf("fail open: %+v, %v", r, err)
		}
	}
	// Emergency with the breaker closed: a straggler, not an outage; the
	// emergency bucket holds nothing.
	for i := 0; i < 10; i++ {
		r, err = f.core.Decide(ctx, f.clk.Now(), k("emergency"), global300, 1, "")
		if err != nil || r.Path != PathEmergency || r.Decision.Allowed {
			t.Fatalf("emergency, breaker closed: %+v, %v", r, err)
		}
	}
	// The outage declared: the breaker opens now and the emergency bucket
	// (the floor, 100/s burst 100, divided by 2 live agents) starts empty
	// at the opening.
	f.core.Breaker().Failure(f.clk.Now())
	for f.core.Breaker().State(f.clk.Now()) == BreakerClosed {
		f.core.Breaker().Failure(f.clk.Now())
	}
	opened := f.clk.Now()
	emergency := func() int {
		admitted := 0
		for i := 0; i < 200; i++ {
			r, err = f.core.Decide(ctx, f.clk.Now(), k("emergency"), global300, 1, "")
			if err != nil || r.Path != PathEmergency {
				t.Fatalf("emergency: %+v, %v", r, err)
			}
			if r.Decision.Allowed {
				admitted++
			}
		}
		return admitted
	}
	if n := emergency(); n != 0 {
		t.Fatalf("emergency admitted %d at the opening, want 0 (its bucket starts empty)", n)
	}
	f.clk.Set(opened.Add(500 * time.Millisecond))
	if n := emergency(); n != 25 {
		t.Fatalf("emergency admitted %d half a second in, want rate/live × 0.5 s = 25", n)
	}
	f.clk.Set(opened.Add(3 * time.Second))
	if n := emergency(); n != 50 {
		t.Fatalf("emergency admitted %d 3 s in, want burst/live = 50", n)
	}
	st := f.core.Stats()
	for _, rs := range st.Rules {
		if rs.Rule == "open" && rs.Admitted[PathFailOpen] != 500 {
			t.Fatalf("fail-open count %d, want 500", rs.Admitted[PathFailOpen])
		}
	}
	// The Store adapter hands fail open to the edge as an unavailable store.
	s := NewStore(f.core, f.clk, nil, nil)
	if _, err := s.Decide(ctx, k("open"), global300, 1, ""); !errors.Is(err, ErrFailOpen) {
		t.Fatalf("store fail open: %v", err)
	}
	if d, err := s.Decide(ctx, k("emergency"), global300, 1, ""); err != nil || d.Limit != bucket.PerSecond(50) {
		t.Fatalf("store emergency: %+v %v", d, err)
	}
}

// TestBreakerOpensProbesAndCloses: store failures open the breaker once
// they are Failures within the window and most of its calls; open, calls
// are decided at once without the store; after the back-off one probe goes
// through, a failed one doubles the back-off, a good one closes it.
func TestBreakerOpensProbesAndCloses(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.DefaultRule = RuleConfig{OnUnavailable: rules.Emergency}
		c.BreakerFailures = 3
		c.BreakerBackoff, c.BreakerMaxBackoff = time.Second, 4*time.Second
	})
	ctx := context.Background()
	// Two good calls in the window: three failures are 3 of 5, above half.
	for i := 0; i < 2; i++ {
		if _, err := f.core.Decide(ctx, f.clk.Now(), key(fmt.Sprint("ok", i)), global300, 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	f.store.setDown(true)
	for i := 0; i < 10; i++ {
		r, err := f.core.Decide(ctx, f.clk.Now(), key("k"), global300, 1, "")
		if err != nil || r.Path != PathEmergency {
			t.Fatalf("request %d: %+v %v", i, r, err)
		}
	}
	if n := f.store.total(); n != 2+3 {
		t.Fatalf("store called %d times, want 2 good and 3 failed before the breaker opened", n)
	}
	if s := f.core.Breaker().State(f.clk.Now()); s != BreakerOpen {
		t.Fatalf("breaker %s, want open", s)
	}
	// After the back-off one probe goes through; it fails: open for 2 s.
	f.clk.Advance(time.Second)
	f.core.Decide(ctx, f.clk.Now(), key("k"), global300, 1, "")
	f.core.Decide(ctx, f.clk.Now(), key("k"), global300, 1, "")
	if n := f.store.total(); n != 6 {
		t.Fatalf("store called %d times, want one probe (6)", n)
	}
	f.clk.Advance(time.Second)
	f.core.Decide(ctx, f.clk.Now(), key("k"), global300, 1, "")
	if n := f.store.total(); n != 6 {
		t.Fatalf("store called %d times during the doubled back-off, want 6", n)
	}
	f.store.setDown(false)
	f.clk.Advance(time.Second)
	r, _ := f.core.Decide(ctx, f.clk.Now(), key("k"), global300, 1, "")
	if r.Path != PathStore || f.core.Breaker().State(f.clk.Now()) != BreakerClosed {
		t.Fatalf("probe after recovery: path %s, breaker %s", r.Path, f.core.Breaker().State(f.clk.Now()))
	}
	if f.core.Stats().BreakerOpened != 2 {
		t.Fatalf("breaker opened %d times, want 2", f.core.Stats().BreakerOpened)
	}
}

// TestStragglersDoNotOpenTheBreaker: failures that are a minority of the
// window's calls (a loaded host's stragglers on a healthy store), fewer
// than BreakerFailures in a row, leave the breaker closed, however many
// there are in all.
func TestStragglersDoNotOpenTheBreaker(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	good := 0
	for ms := 0; ms < 3000; ms++ {
		// 6 good calls, then 4 failures in a row, every 10 ms.
		if ms%10 == 0 {
			f.store.setDown(ms%100 >= 60)
			if r, _ := f.core.Decide(ctx, f.clk.Now(), key(fmt.Sprint("s", ms)), global300, 1, ""); r.Path == PathStore {
				good++
			}
		}
		f.clk.Advance(time.Millisecond)
	}
	if f.core.Stats().StoreErrors < 100 || good < 100 {
		t.Fatalf("%d failures and %d good calls: the test did not make both", f.core.Stats().StoreErrors, good)
	}
	if n := f.core.Breaker().Opened(); n != 0 {
		t.Fatalf("breaker opened %d times on a minority of failures, want 0", n)
	}
}

// TestTickProbesWithoutTraffic: a region whose allocation for a key is
// zero denies the key's requests before any store call, so they can never
// be the breaker's probe; and a region without traffic sends none. Tick
// probes the store while the breaker is not closed, so the store's return
// closes it all the same, and the fail-closed key's demand, counted all
// along from its denied arrivals, is reported again at once. (Before, the
// breaker stayed half-open and the key's demand unreported: the region's
// share stayed lent away for good.)
func TestTickProbesWithoutTraffic(t *testing.T) {
	clk := clock.NewManual(t0)
	cfg := DefaultConfig()
	cfg.Region = "a"
	cfg.Floors = lease.Split{Regions: []string{"a", "b", "c"}}
	cfg.DefaultRule = RuleConfig{OnUnavailable: rules.FailClosed}
	cfg.BreakerFailures, cfg.BreakerRatio = 1, 0
	store := newCounting(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}))
	view := NewTableView("a", cfg.Floors)
	core, err := NewCore(cfg, store, view)
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	k := key("lent")
	// The key is in demand and its store fails: the breaker opens.
	if _, err := core.Decide(ctx, clk.Now(), k, global300, 1, "a1"); err != nil {
		t.Fatal(err)
	}
	store.setDown(true)
	if _, err := core.Decide(ctx, clk.Now(), k, global300, 1, ""); !errors.Is(err, ErrFailClosed) {
		t.Fatalf("store down: %v, want fail closed", err)
	}
	if s := core.Breaker().State(clk.Now()); s != BreakerOpen {
		t.Fatalf("breaker %s, want open", s)
	}
	// The region lends the key's share: a table entry of 0 under a live
	// lease.
	view.Set(TableOf("a", "a", 1, lease.HolderState{Term: 1, Version: 1, LeaseEnd: t0.Add(time.Hour),
		Entries: []lease.Entry{{Key: k, Count: 0, Burst: 0}}}, clk.Now()))
	// Its requests are denied without the store, and counted as demand.
	for i := 0; i < 50; i++ {
		clk.Advance(20 * time.Millisecond)
		r, err := core.Decide(ctx, clk.Now(), k, global300, 1, "")
		if err != nil || r.Path != PathNoAllocation {
			t.Fatalf("zero allocation: %+v %v", r, err)
		}
		if i%5 == 4 {
			core.Tick(ctx, clk.Now()) // probes fail: the store is still down
		}
	}
	if core.Breaker().State(clk.Now()) == BreakerClosed {
		t.Fatal("breaker closed while the store is down")
	}
	for _, d := range core.Demand(clk.Now()) {
		if d.Key == k && d.Want != 0 {
			t.Fatalf("demand %d while down, want 0 (a fail-closed key's share is lent)", d.Want)
		}
	}
	probes := core.Stats().Probes
	if probes == 0 {
		t.Fatal("Tick sent no probe while the breaker was open")
	}
	// The store returns; no request reaches it. The next Tick past the
	// back-off probes and closes the breaker.
	store.setDown(false)
	back := clk.Now()
	for core.Breaker().State(clk.Now()) != BreakerClosed {
		clk.Advance(100 * time.Millisecond)
		core.Tick(ctx, clk.Now())
		if clk.Now().Sub(back) > cfg.BreakerMaxBackoff+100*time.Millisecond {
			t.Fatalf("breaker %s %s after the store returned, want closed within the longest back-off plus a tick",
				core.Breaker().State(clk.Now()), clk.Now().Sub(back))
		}
	}
	var want bucket.Tokens
	for _, d := range core.Demand(clk.Now()) {
		if d.Key == k {
			want = d.Want
		}
	}
	if want < 30 || want > 70 {
		t.Fatalf("demand %d once the store answers, want about the 50/s denied meanwhile", want)
	}
}

func TestFailoverStartsBucketsEmpty(t *testing.T) {
	for _, empty := range []bool{false, true} {
		t.Run(fmt.Sprint("empty=", empty), func(t *testing.T) {
			f := newFixture(t, func(c *Config) { c.DefaultRule.EmptyOnFailover = empty })
			f.core.Failover(f.clk.Now())
			f.clk.Advance(100 * time.Millisecond)
			admitted := 0
			for i := 0; i < 200; i++ {
				if r := f.decide(t, key("k"), 1); r.Decision.Allowed {
					admitted++
				}
			}
			want := 100
			if empty {
				want = 10 // refilled in the 100 ms since the failover at 100/s
			}
			if admitted != want {
				t.Fatalf("admitted %d, want %d", admitted, want)
			}
		})
	}
}

func TestDeterministic(t *testing.T) {
	run := func() string {
		f := newFixture(t, func(c *Config) { c.DefaultRule = RuleConfig{OnUnavailable: rules.Emergency} })
		var b strings.Builder
		for ms := 0; ms < 300; ms++ {
			if ms == 150 {
				f.store.setDown(true)
			}
			if ms == 200 {
				f.store.setDown(false)
			}
			for i := 0; i < 20; i++ {
				r := f.decide(t, key(fmt.Sprint("k", i%3)), bucket.Tokens(1+i%2))
				fmt.Fprintf(&b, "%d %s %v %d|", ms, r.Path, r.Decision.Allowed, r.Decision.Remaining)
			}
			f.clk.Advance(time.Millisecond)
			if ms%25 == 0 {
				f.core.Tick(context.Background(), f.clk.Now())
			}
		}
		f.core.Shutdown(context.Background(), f.clk.Now())
		return b.String() + strings.Join(f.store.log, ",")
	}
	if a, b := run(), run(); a != b {
		t.Fatal("two runs with the same inputs differ")
	}
}

func TestNoAllocationDenies(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("zero"), Count: 0}}})
	r := f.decide(t, key("zero"), 1)
	if r.Decision.Allowed || r.Path != PathNoAllocation || r.Decision.RetryAfter <= 0 {
		t.Fatalf("zero allocation: %+v", r)
	}
	// A cost above the region's burst but within the global burst waits for
	// more allocation; it is not "can never fit".
	r = f.decide(t, key("big"), 200)
	if r.Decision.Allowed || r.Path != PathNoAllocation {
		t.Fatalf("cost 200 over floor burst 100: %+v", r)
	}
	if _, err := f.core.Decide(context.Background(), now, key("big"), global300, 301, ""); !errors.Is(err, bucket.ErrNeverFits) {
		t.Fatalf("cost over the global burst: %v, want ErrNeverFits", err)
	}
}

// TestDemandReportsEveryTrackedKey: a key the agent keeps state for is
// reported with its demand however far below its floor, so the coordinator
// can tell a region using a little of its floor from one using none; keys
// in light use without state are not.
func TestDemandReportsEveryTrackedKey(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("hot"), Count: 250, Burst: 250}}})
	// "calm" takes state by pressing its bucket once (60 of a burst of
	// 100); "light" never does.
	f.decide(t, key("calm"), 60)
	// "press" asks 200/s against a floor of 100/s; "calm" and "light"
	// 10/s; "hot" 5/s.
	for ms := 0; ms < 3000; ms++ {
		if ms%5 == 0 {
			f.decide(t, key("press"), 1)
		}
		if ms%100 == 0 {
			f.decide(t, key("calm"), 1)
		}
		if ms%100 == 50 {
			f.decide(t, key("light"), 1)
		}
		if ms%200 == 0 {
			f.decide(t, key("hot"), 1)
		}
		f.clk.Advance(time.Millisecond)
		if ms%100 == 99 {
			f.core.Tick(context.Background(), f.clk.Now())
		}
	}
	ds := f.core.Demand(f.clk.Now())
	var got []string
	for _, d := range ds {
		got = append(got, fmt.Sprintf("%s hot=%v", d.Key.Subject, d.Hot))
		if d.Key.Subject == "press" && (d.Want < 150 || d.Want > 260) {
			t.Errorf("press want %d/s, want about 200", d.Want)
		}
		if d.Key.Subject == "calm" && (d.Want < 5 || d.Want > 40) {
			t.Errorf("calm want %d/s, want about 10", d.Want)
		}
	}
	if strings.Join(got, ",") != "calm hot=false,hot hot=true,press hot=false" {
		t.Fatalf("demand %v, want calm, hot and press", got)
	}
}

func TestIdleKeysAreDropped(t *testing.T) {
	f := newFixture(t, nil)
	// Keys in light use keep no state (one in coldSample decisions gives
	// a key state); keys whose bucket is pressed do.
	for i := 0; i < 30; i++ {
		f.decide(t, key(fmt.Sprint("light", i)), 1)
	}
	if n := f.core.Stats().Keys; n != 0 {
		t.Fatalf("keys %d after light use, want 0", n)
	}
	for i := 0; i < 100; i++ {
		f.decide(t, key(fmt.Sprint("k", i)), 60) // more than half the floor's burst of 100
	}
	if n := f.core.Stats().Keys; n != 100 {
		t.Fatalf("keys %d, want 100", n)
	}
	// The first tick takes the arrivals in; the next, IdleAfter later,
	// finds none since.
	f.clk.Advance(time.Second)
	f.core.Tick(context.Background(), f.clk.Now())
	f.clk.Advance(f.core.cfg.IdleAfter + time.Second)
	f.core.Tick(context.Background(), f.clk.Now())
	if n := f.core.Stats().Keys; n != 0 {
		t.Fatalf("keys %d after idle, want 0", n)
	}
}

func TestConfigValidateNamesField(t *testing.T) {
	cases := map[string]func(*Config){
		"region is empty":      func(c *Config) { c.Region = "" },
		"batch_max_fraction":   func(c *Config) { c.BatchMaxFraction = 2 },
		"failures=0":           func(c *Config) { c.BreakerFailures = 0 },
		"max_timeout=50ms":     func(c *Config) { c.MaxTimeout = 50 * time.Millisecond },
		"demand_sustain=50ms":  func(c *Config) { c.DemandSustain = 50 * time.Millisecond },
		"do not include":       func(c *Config) { c.Floors.Regions = []string{"x"} },
		"on_unavailable=\"x\"": func(c *Config) { c.Rules = map[string]RuleConfig{"r": {OnUnavailable: "x"}} },
	}
	for want, mod := range cases {
		c := DefaultConfig()
		c.Region = "a"
		mod(&c)
		err := c.Validate()
		if err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

func TestConcurrentDecisionsStayWithinAllocation(t *testing.T) {
	clk := clock.NewManual(t0)
	cfg := DefaultConfig()
	cfg.Region = "a"
	st := newCounting(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}))
	core, err := NewCore(cfg, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	l := bucket.PerSecond(10_000)
	var wg sync.WaitGroup
	var mu sync.Mutex
	admitted := 0
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			n := 0
			for i := 0; i < 5000; i++ {
				r, err := core.Decide(context.Background(), clk.Now(), key("hot"), l, 1, "")
				if err != nil {
					t.Error(err)
					return
				}
				if r.Decision.Allowed {
					n++
				}
				if i%500 == 0 {
					core.Tick(context.Background(), clk.Now())
				}
			}
			mu.Lock()
			admitted += n
			mu.Unlock()
		}()
	}
	wg.Wait()
	// The clock never moved: at most the burst is admitted, batches or not.
	if admitted > 10_000 {
		t.Fatalf("admitted %d, burst 10000", admitted)
	}
}

func TestAttemptIDsAreChargedOnce(t *testing.T) {
	f := newFixture(t, nil)
	now := f.clk.Now()
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: now.Add(time.Hour), HoldUntil: now.Add(time.Hour),
		Entries: []lease.Entry{{Key: key("hot"), Count: 100_000, Burst: 100_000}}})
	global := bucket.PerSecond(300_000)
	ctx := context.Background()
	// Make the key batched.
	for ms := 0; ms < 20; ms++ {
		for i := 0; i < 50; i++ {
			f.core.Decide(ctx, f.clk.Now(), key("hot"), global, 1, "")
		}
		f.clk.Advance(time.Millisecond)
	}
	first, err := f.core.Decide(ctx, f.clk.Now(), key("hot"), global, 5, "attempt-1")
	if err != nil || first.Path != PathBatch || !first.Decision.Allowed {
		t.Fatalf("first attempt: %+v %v", first, err)
	}
	held := f.core.state(key("hot"), 0).held()
	for i := 0; i < 3; i++ {
		again, err := f.core.Decide(ctx, f.clk.Now(), key("hot"), global, 5, "attempt-1")
		if err != nil || again.Decision != first.Decision {
			t.Fatalf("retry %d: %+v, want the first decision %+v", i, again.Decision, first.Decision)
		}
	}
	if h := f.core.state(key("hot"), 0).held(); h != held {
		t.Fatalf("retries spent %d tokens", held-h)
	}
	// Past the attempt window the id is a new request.
	f.clk.Advance(bucket.DefaultAttemptWindow + time.Second)
	if r, _ := f.core.Decide(ctx, f.clk.Now(), key("hot"), global, 5, "attempt-1"); r.Decision == first.Decision {
		t.Fatal("an attempt id older than the window was replayed")
	}
}

// TestRepeatedDenialsCarryTheReset: a denial the deny cache answers states
// the same reset as the store's denial it repeats (what the bucket says at
// that instant), at fixed instants on a manual clock, for a cold key denied
// by the store and for a batched key whose refill found the bucket empty.
func TestRepeatedDenialsCarryTheReset(t *testing.T) {
	f := newFixture(t, nil)
	global := bucket.PerMinute(30) // a floor of 10 per minute, burst 10: one token every 6 s
	floor := bucket.PerMinute(10)
	ctx := context.Background()
	decide := func(k bucket.Key) Result {
		t.Helper()
		r, err := f.core.Decide(ctx, f.clk.Now(), k, global, 1, "")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	peek := func(k bucket.Key) bucket.Decision {
		t.Helper()
		d, err := f.store.Store.Peek(ctx, k, floor)
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	k := key("cold")
	for i := 0; i < 10; i++ {
		if r := decide(k); !r.Decision.Allowed {
			t.Fatalf("request %d denied within the burst: %+v", i, r)
		}
	}
	steps := []struct {
		at           time.Duration
		path         Path
		retry, reset time.Duration
	}{
		{time.Second, PathStore, 5 * time.Second, 59 * time.Second}, // the store's denial
		{2 * time.Second, PathDenyCache, 4 * time.Second, 58 * time.Second},
		{3500 * time.Millisecond, PathDenyCache, 2500 * time.Millisecond, 56500 * time.Millisecond},
		{5999 * time.Millisecond, PathDenyCache, time.Millisecond, 54001 * time.Millisecond},
	}
	for _, s := range steps {
		f.clk.Set(t0.Add(s.at))
		r := decide(k)
		if r.Decision.Allowed || r.Path != s.path || r.Decision.RetryAfter != s.retry || r.Decision.ResetAfter != s.reset || r.Decision.Remaining != 0 {
			t.Fatalf("at t0+%s: %s %+v; want denied on %s, retry %s, reset %s", s.at, r.Path, r.Decision, s.path, s.retry, s.reset)
		}
		if p := peek(k); p.ResetAfter != s.reset {
			t.Fatalf("at t0+%s: the answer says reset %s, the bucket %s", s.at, r.Decision.ResetAfter, p.ResetAfter)
		}
	}
	f.clk.Set(t0.Add(6 * time.Second))
	if r := decide(k); !r.Decision.Allowed {
		t.Fatalf("at t0+6s a token has refilled: %+v", r)
	}

	// A batched key: a flood makes it batched; once a refill finds the
	// bucket empty, that denial and the cached ones after it state the
	// bucket's reset.
	f.clk.Set(t0.Add(time.Minute))
	hot := key("hot")
	var refillDenied bool
	var denied time.Time
	for ms := 0; ms < 200 && !refillDenied; ms++ {
		for i := 0; i < 20; i++ {
			r := decide(hot)
			if !r.Decision.Allowed && r.Path == PathStore {
				if p := peek(hot); r.Decision.ResetAfter != p.ResetAfter || p.ResetAfter != 60*time.Second {
					t.Fatalf("refill denial at %s: reset %s, the bucket (emptied) %s, want 1m0s", f.clk.Now().Sub(t0), r.Decision.ResetAfter, p.ResetAfter)
				}
				refillDenied, denied = true, f.clk.Now()
				break
			}
		}
		f.clk.Advance(time.Millisecond)
		f.core.Tick(ctx, f.clk.Now())
	}
	if !refillDenied {
		t.Fatal("no refill found the bucket empty")
	}
	for _, d := range []time.Duration{time.Millisecond, time.Second, 4 * time.Second} {
		f.clk.Set(denied.Add(d))
		r := decide(hot)
		if r.Decision.Allowed || r.Path != PathDenyCache {
			t.Fatalf("%s after the refill's denial: %s %+v, want the deny cache", d, r.Path, r.Decision)
		}
		if p := peek(hot); r.Decision.ResetAfter != p.ResetAfter || r.Decision.ResetAfter != 60*time.Second-d {
			t.Fatalf("%s after the refill's denial: reset %s, the bucket %s, want %s", d, r.Decision.ResetAfter, p.ResetAfter, 60*time.Second-d)
		}
	}
}

// TestDemandListsAStopForAWhile: a key with no entry whose use stopped,
// its estimate fallen to nothing, is listed with no demand until
// stopReported has passed since its last arrival, so the speaker hears
// the stop instead of keeping the key's last reading; then it is left
// out.
func TestDemandListsAStopForAWhile(t *testing.T) {
	f := newFixture(t, nil)
	want := func() (bucket.Tokens, bool) {
		for _, d := range f.core.Demand(f.clk.Now()) {
			if d.Key.Subject == "press" {
				return d.Want, true
			}
		}
		return 0, false
	}
	// 1,000 a second against a floor of 100 a second, for 2 s.
	for ms := 0; ms < 2000; ms++ {
		f.decide(t, key("press"), 1)
		f.clk.Advance(time.Millisecond)
		if ms%100 == 99 {
			f.core.Tick(context.Background(), f.clk.Now())
		}
	}
	if w, ok := want(); !ok || w < 800 {
		t.Fatalf("pressing: want %d (listed %v), want about 1,000", w, ok)
	}
	stopped := f.clk.Now()
	zeroAt := time.Duration(-1)
	for f.clk.Now().Sub(stopped) < stopReported+500*time.Millisecond {
		f.clk.Advance(10 * time.Millisecond)
		f.core.Tick(context.Background(), f.clk.Now())
		w, ok := want()
		since := f.clk.Now().Sub(stopped)
		switch {
		case ok && w == 0 && zeroAt < 0:
			zeroAt = since
		case ok && w > 0 && zeroAt >= 0:
			t.Fatalf("%v after the stop: want %d again after it read nothing", since, w)
		case !ok && since <= stopReported:
			t.Fatalf("%v after the stop: the key is no longer listed (its stop read at %v), want it listed with no demand until %v", since, zeroAt, stopReported)
		case ok && since > stopReported+10*time.Millisecond:
			t.Fatalf("%v after the stop: still listed (want %d), want it left out after %v", since, w, stopReported)
		}
	}
	if zeroAt < 0 || zeroAt > 300*time.Millisecond {
		t.Fatalf("the stop read as no demand %v after it (−1: never), want within 300 ms", zeroAt)
	}
	t.Logf("listed with no demand from %v after the stop", zeroAt)
}
