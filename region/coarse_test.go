package region

import (
	"context"
	"errors"
	"math/rand/v2"
	"reflect"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

// readCounter is a Clock that counts its reads, to show which decisions
// read no clock.
type readCounter struct {
	clock.Clock
	reads atomic.Int64
}

func (r *readCounter) Now() time.Time { r.reads.Add(1); return r.Clock.Now() }

// global6000 gives each of the fixture's three regions a floor of 2,000/s.
var global6000 = bucket.PerSecond(6000)

// TestCoarseBatchDecidesAsTheClock drives two agents with the same
// allocations and the same requests at the same instants: one reads its
// clock for every decision, the other decides from batches on a coarse
// reading that lags the clock by up to 0.9 s (less than coarseSlack). Every
// answer must be the same, through batching, denials, ticks and the end of
// the lease (at +10 s, after which the hot key is back at its floor), and
// most of the coarse agent's batch decisions must have read no clock. A
// third agent, on a coarse reading too, is asked as package limiter asks
// a bucket.Admitter (Admit, then Declined when it declines), with the
// same answers again.
func TestCoarseBatchDecidesAsTheClock(t *testing.T) {
	for seed := range uint64(8) {
		coarseTwins(t, seed)
	}
}

func coarseTwins(t *testing.T, seed uint64) {
	ctx := context.Background()
	tab := func() *Table {
		return &Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: t0.Add(10 * time.Second), HoldUntil: t0.Add(20 * time.Second),
			Entries: []lease.Entry{{Key: key("hot"), Count: 2500, Burst: 2500}, {Key: key("lent"), Count: 400, Burst: 400}}}
	}
	exact := newFixture(t, nil)
	exact.view.Set(tab())
	exactSt := NewStore(exact.core, exact.clk, nil, nil)
	fast := newFixture(t, nil)
	fast.view.Set(tab())
	rc := &readCounter{Clock: fast.clk}
	fastSt := NewStore(fast.core, rc, nil, nil)
	co, err := clock.NewCoarse(fast.clk, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	fastSt.UseCoarse(co)
	adm := newFixture(t, nil)
	adm.view.Set(tab())
	admSt := NewStore(adm.core, adm.clk, nil, nil)
	admCo, err := clock.NewCoarse(adm.clk, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	admSt.UseCoarse(admCo)
	var admitter bucket.Admitter = admSt
	var admitted int64

	rng := rand.New(rand.NewPCG(seed, 2))
	keys := []string{"hot", "hot", "hot", "lent", "warm", "cold"}
	var decisions, fastReads int64
	var refreshed time.Time
	for now := t0; now.Before(t0.Add(14 * time.Second)); {
		now = now.Add(time.Duration(rng.IntN(2000)) * time.Microsecond)
		exact.clk.Set(now)
		fast.clk.Set(now)
		adm.clk.Set(now)
		// The coarse reading lags by up to 0.9 s: refreshed at random.
		if now.Sub(refreshed) > 900*time.Millisecond || rng.IntN(500) == 0 {
			co.Refresh()
			admCo.Refresh()
			refreshed = now
		}
		if rng.IntN(200) == 0 {
			exact.core.Tick(ctx, now)
			fast.core.Tick(ctx, now)
			adm.core.Tick(ctx, now)
		}
		k, cost := key(keys[rng.IntN(len(keys))]), bucket.Tokens(1+rng.IntN(3))
		want, werr := exactSt.Decide(ctx, k, global6000, cost, "")
		before := rc.reads.Load()
		got, gerr := fastSt.Decide(ctx, k, global6000, cost, "")
		if rc.reads.Load() == before {
			fastReads++
		}
		decisions++
		if got != want || (gerr == nil) != (werr == nil) {
			t.Fatalf("seed %d at +%s key %s cost %d: coarse agent %+v (%v), clock agent %+v (%v)", seed, now.Sub(t0), k.Subject, cost, got, gerr, want, werr)
		}
		var ad bucket.Decision
		var aerr error
		if rem, lim := admitter.Admit(k, global6000, cost); lim != nil {
			ad, admitted = bucket.Decision{Allowed: true, Remaining: rem, Limit: *lim}, admitted+1
		} else {
			ad, aerr = admitter.Declined(ctx, k, global6000, cost)
		}
		if ad != want || (aerr == nil) != (werr == nil) {
			t.Fatalf("seed %d at +%s key %s cost %d: admitting agent %+v (%v), clock agent %+v (%v)", seed, now.Sub(t0), k.Subject, cost, ad, aerr, want, werr)
		}
	}
	if a, b := exact.core.Stats(), fast.core.Stats(); !reflect.DeepEqual(a, b) {
		t.Errorf("seed %d: stats differ: clock agent %+v, coarse agent %+v", seed, a, b)
	}
	if a, b := exact.core.Stats(), adm.core.Stats(); !reflect.DeepEqual(a, b) {
		t.Errorf("seed %d: stats differ: clock agent %+v, admitting agent %+v", seed, a, b)
	}
	if admitted < decisions/4 {
		t.Errorf("seed %d: %d of %d decisions admitted by Admit, want at least a quarter", seed, admitted, decisions)
	}
	// Most decisions of the hot key come from its batch while the lease
	// lives: a good share of all decisions read no clock.
	if fastReads < decisions/4 {
		t.Errorf("seed %d: %d of %d decisions read no clock, want at least a quarter", seed, fastReads, decisions)
	}
}

// TestCoarseBatchStopsBeforeTheLeaseEnds: a reading within coarseSlack of
// the lease's end never decides from the batch, however stale it is, so a
// lagging reading cannot use the lease past its end.
func TestCoarseBatchStopsBeforeTheLeaseEnds(t *testing.T) {
	ctx := context.Background()
	f := newFixture(t, nil)
	end := t0.Add(10 * time.Second)
	f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: end, HoldUntil: end,
		Entries: []lease.Entry{{Key: key("hot"), Count: 12500, Burst: 2500}}})
	rc := &readCounter{Clock: f.clk}
	st := NewStore(f.core, rc, nil, nil)
	co, err := clock.NewCoarse(f.clk, time.Millisecond)
	if err != nil {
		t.Fatal(err)
	}
	st.UseCoarse(co)
	batchHot(t, f, st, co)
	for _, c := range []struct {
		reading time.Duration // before the lease's end
		coarse  bool
	}{{2 * time.Second, true}, {coarseSlack + time.Millisecond, true}, {coarseSlack, false}, {time.Millisecond, false}} {
		f.clk.Set(end.Add(-c.reading))
		co.Refresh()
		before := rc.reads.Load()
		d, err := st.Decide(ctx, key("hot"), global6000, 1, "")
		if err != nil || !d.Allowed {
			t.Fatalf("%s before the end: %+v, %v", c.reading, d, err)
		}
		if coarse := rc.reads.Load() == before; coarse != c.coarse {
			t.Errorf("%s before the lease's end: decided on the coarse reading %v, want %v", c.reading, coarse, c.coarse)
		}
	}
}

// TestCoarseBatchRejectsWhatDecideRejects: a request that bucket.Check
// would reject (no cost, a cost over the burst, a zero or invalid limit)
// is never decided from a batch on the coarse reading, even for a key
// holding batch tokens: it gets the answer and the error decide gives.
func TestCoarseBatchRejectsWhatDecideRejects(t *testing.T) {
	ctx := context.Background()
	batched := func(coarse bool) (*Store, *clock.Coarse) {
		f := newFixture(t, nil)
		f.view.Set(&Table{Region: "a", Pub: 1, Term: 1, Version: 1, LeaseEnd: t0.Add(time.Hour), HoldUntil: t0.Add(time.Hour),
			Entries: []lease.Entry{{Key: key("hot"), Count: 12500, Burst: 2500}}})
		st := NewStore(f.core, f.clk, nil, nil)
		co, err := clock.NewCoarse(f.clk, time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		if coarse {
			st.UseCoarse(co)
		}
		batchHot(t, f, st, co)
		return st, co
	}
	exact, _ := batched(false)
	fast, co := batched(true)
	co.Refresh()
	for _, c := range []struct {
		name  string
		limit bucket.Limit
		cost  bucket.Tokens
		want  error
	}{
		{"no cost", global6000, 0, bucket.ErrInvalidCost},
		{"a negative cost", global6000, -1, bucket.ErrInvalidCost},
		{"a cost over the burst", global6000, 6001, bucket.ErrNeverFits},
		{"a zero limit", bucket.Limit{}, 1, bucket.ErrInvalidLimit},
		{"a limit without a period", bucket.Per(6000, 0), 1, bucket.ErrInvalidLimit},
	} {
		want, werr := exact.Decide(ctx, key("hot"), c.limit, c.cost, "")
		got, gerr := fast.Decide(ctx, key("hot"), c.limit, c.cost, "")
		if !errors.Is(gerr, c.want) || !errors.Is(werr, c.want) || got != want {
			t.Errorf("%s: coarse agent %+v (%v), clock agent %+v (%v), want %v", c.name, got, gerr, want, werr, c.want)
		}
	}
	if d, err := fast.Decide(ctx, key("hot"), global6000, 1, ""); err != nil || !d.Allowed {
		t.Fatalf("a valid request after them: %+v, %v", d, err)
	}
}

// batchHot makes key "hot" a batched key: a burst of 200 decisions within
// one sample, 100 µs apart, the coarse clock refreshed at each; the key
// must then hold batch tokens. Its allocation must exceed that demand
// (10,000/s), or batches shrink to the allocation's rate.
func batchHot(t *testing.T, f *fixture, st *Store, co *clock.Coarse) {
	t.Helper()
	for i := 0; i < 200; i++ {
		f.clk.Advance(100 * time.Microsecond)
		co.Refresh()
		if _, err := st.Decide(context.Background(), key("hot"), global6000, 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	hot := key("hot")
	if held := f.core.lookup(&hot).held(); held < 4 {
		t.Fatalf("%d batch tokens held after 200 decisions in 20 ms, want at least 4", held)
	}
}
