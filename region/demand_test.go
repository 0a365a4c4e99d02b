package region

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// TestDemandWhileStoreIsDown: while the breaker is open, a key of a rule
// that fails closed is reported with no demand (the agent admits nothing
// for it, so its share is better lent), while an emergency rule's key keeps
// its demand (the agent still admits from its allocation); once the store
// answers again, the closed rule's demand is reported again.
func TestDemandWhileStoreIsDown(t *testing.T) {
	f := newFixture(t, func(c *Config) {
		c.Rules = map[string]RuleConfig{
			"closed":    {OnUnavailable: rules.FailClosed},
			"emergency": {OnUnavailable: rules.Emergency},
		}
		c.BreakerFailures, c.BreakerRatio = 3, 0 // three failures open it, whatever succeeded before
		c.BreakerBackoff, c.BreakerMaxBackoff = time.Second, time.Second
	})
	ctx := context.Background()
	k := func(rule string) bucket.Key { return bucket.Key{Rule: rule, Subject: "s"} }
	wants := func() map[string]bucket.Tokens {
		m := map[string]bucket.Tokens{}
		for _, d := range f.core.Demand(f.clk.Now()) {
			m[d.Key.Rule] = d.Want
		}
		return m
	}
	// Both keys take state (a cost of 60 presses a burst of 100) and see
	// 50 requests a second for a second.
	for ms := 0; ms < 1000; ms++ {
		if ms%20 == 0 {
			cost := bucket.Tokens(1)
			if ms == 0 {
				cost = 60
			}
			for _, r := range []string{"closed", "emergency"} {
				_, _ = f.core.Decide(ctx, f.clk.Now(), k(r), global300, cost, "")
			}
		}
		f.clk.Advance(time.Millisecond)
		if ms%100 == 99 {
			f.core.Tick(ctx, f.clk.Now())
		}
	}
	if w := wants(); w["closed"] == 0 || w["emergency"] == 0 {
		t.Fatalf("demand %v with the store up, want both reported", w)
	}
	f.store.setDown(true)
	for i := 0; i < 5; i++ {
		_, _ = f.core.Decide(ctx, f.clk.Now(), k("closed"), global300, 1, "")
	}
	if s := f.core.Breaker().State(f.clk.Now()); s != BreakerOpen {
		t.Fatalf("breaker %s, want open", s)
	}
	if w := wants(); w["closed"] != 0 || w["emergency"] == 0 {
		t.Fatalf("demand %v with the store down, want closed 0 and emergency still reported", w)
	}
	f.store.setDown(false)
	f.clk.Advance(2 * time.Second) // past the backoff: the next call probes
	_, _ = f.core.Decide(ctx, f.clk.Now(), k("closed"), global300, 1, "")
	if s := f.core.Breaker().State(f.clk.Now()); s != BreakerClosed {
		t.Fatalf("breaker %s after a good probe, want closed", s)
	}
	if w := wants(); w["closed"] == 0 {
		t.Fatalf("demand %v with the store back, want closed reported again", w)
	}
}

// TestReportedDemandIsAnAverage: a key's reported demand starts at its
// first window's rate, follows steady use, and takes a bunch of arrivals in
// one window in as a moving average does, not as a peak at the bunch's
// rate (an estimate that rose at once read it as about 670 tokens a second
// here, and made the coordinator move allocations after every such bunch).
func TestReportedDemandIsAnAverage(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	k := key("avg")
	want := func() bucket.Tokens { return f.want(k) }
	// 50 tokens a second, one every 20 ms; the attempt id gives the key
	// state at once.
	step := func(ms int) {
		for i := 0; i < ms; i++ {
			if i%20 == 0 {
				if _, err := f.core.Decide(ctx, f.clk.Now(), k, global300, 1, "a"+f.clk.Now().String()); err != nil {
					t.Fatal(err)
				}
			}
			f.clk.Advance(time.Millisecond)
		}
	}
	step(160)
	if w := want(); w < 40 || w > 60 {
		t.Fatalf("want %d after the first window at 50/s, want 40..60 (the window's rate)", w)
	}
	step(2000)
	if w := want(); w < 45 || w > 55 {
		t.Fatalf("want %d after 2 s at 50/s, want 45..55", w)
	}
	// A bunch of 100 tokens within one window (5 requests of 20), then
	// 50/s again until that window has closed.
	for i := 0; i < 5; i++ {
		_, _ = f.core.Decide(ctx, f.clk.Now(), k, global300, 20, "")
	}
	step(120)
	if w := want(); w <= 60 || w >= 400 {
		t.Fatalf("want %d after a bunch of 100 tokens in one window, want above 60 (it counts) and below 400 (an average, not the window's rate)", w)
	}
	step(3000)
	if w := want(); w < 45 || w > 60 {
		t.Fatalf("want %d 3 s after the bunch, want back near 50", w)
	}
}

// TestReportedDemandFollowsASustainedLevel: a key's reported demand takes a
// fall beyond chance within a window or two, and a rise its use has held
// for DemandSustain, where the moving average alone would still be far from
// either (200 ms into a fall from 1,000 to 50 tokens a second it reads
// about 770; 300 ms into the rise back, about 420); a rise shorter than
// DemandSustain moves it only as an average; and a light key, whose quiet
// windows are chance, keeps the moving average.
func TestReportedDemandFollowsASustainedLevel(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	hot, light := key("hot"), key("light")
	want := f.want
	// run sends hot one token every hotEvery ms and light one every 50 ms
	// (20 a second) until stopLight, for ms milliseconds, ticking the core
	// every 100 ms as a driver does.
	run := func(ms, hotEvery int, stopLight bool) {
		for i := 0; i < ms; i++ {
			if i%hotEvery == 0 {
				_, _ = f.core.Decide(ctx, f.clk.Now(), hot, global300, 1, "h"+f.clk.Now().String())
			}
			if !stopLight && i%50 == 0 {
				_, _ = f.core.Decide(ctx, f.clk.Now(), light, global300, 1, "l"+f.clk.Now().String())
			}
			f.clk.Advance(time.Millisecond)
			if i%100 == 99 {
				f.core.Tick(ctx, f.clk.Now())
			}
		}
	}
	run(3000, 1, false) // 1,000 a second
	if w := want(hot); w < 900 || w > 1100 {
		t.Fatalf("want %d after 3 s at 1000/s, want 900..1100", w)
	}
	if w := want(light); w < 15 || w > 25 {
		t.Fatalf("light want %d after 3 s at 20/s, want 15..25", w)
	}
	run(200, 20, true) // 50 a second; light stops
	if w := want(hot); w > 100 {
		t.Fatalf("want %d 200 ms into a fall to 50/s, want ≤ 100 (the level, not the average's ~770)", w)
	}
	if w := want(light); w < 7 {
		t.Fatalf("light want %d 200 ms after it stopped, want ≥ 7 (the average's ~15: 4 tokens missed are chance)", w)
	}
	run(120, 1, true) // 1,000 a second again, for about one window
	if w := want(hot); w > 400 {
		t.Fatalf("want %d 120 ms into a rise to 1000/s, want < 400 (an average: the rise has not lasted DemandSustain)", w)
	}
	run(180, 1, true)
	if w := want(hot); w < 800 {
		t.Fatalf("want %d 300 ms into a rise to 1000/s, want ≥ 800 (the level, not the average's ~420)", w)
	}
}

// TestReportedDemandTakesASurgeInOneWindow: a rise that saw surgeTokens or
// more in one window (300 tokens a second jumping to 6,000, the move of a
// hot region's demand) sets the level after that window, not after
// DemandSustain: 120 ms in, the moving average alone would read about
// 1,000. A rise below surgeTokens per window still waits (above, 120 ms
// into a rise to 1,000 a second).
func TestReportedDemandTakesASurgeInOneWindow(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	k := key("surge")
	run := func(ms, every int, cost bucket.Tokens) {
		for i := 0; i < ms; i++ {
			if i%every == 0 {
				_, _ = f.core.Decide(ctx, f.clk.Now(), k, global300, cost, "s"+f.clk.Now().String())
			}
			f.clk.Advance(time.Millisecond)
			if i%100 == 99 {
				f.core.Tick(ctx, f.clk.Now())
			}
		}
	}
	run(3000, 10, 3) // 300 a second
	if w := f.want(k); w < 270 || w > 330 {
		t.Fatalf("want %d after 3 s at 300/s, want 270..330", w)
	}
	run(120, 1, 6) // 6,000 a second
	if w := f.want(k); w < 4000 {
		t.Fatalf("want %d 120 ms into a surge to 6000/s, want ≥ 4000 (the level after one window of about 600 tokens, not the average's ~1,000)", w)
	}
}

// TestReportedDemandTakesACollapseAtOnce: a key whose use collapses (from
// 1,000 to 50 tokens a second) is reported at half its old level or less
// within 130 ms of the fall, however the windows fall against it: a window
// is closed at a sample as soon as the estimate expected sustainTokens over
// it and it saw at most half of that. The 100 ms windows alone took up to
// 160 ms (a window ending just after the fall reads as no fall, and the
// next one must run its whole length).
func TestReportedDemandTakesACollapseAtOnce(t *testing.T) {
	for offset := 0; offset < 100; offset += 10 {
		k := key("hot")
		f, run := exactDriver(t, k, offset)
		want := func() bucket.Tokens { return f.want(k) }
		run(3000+offset, 1)
		if w := want(); w < 900 || w > 1100 {
			t.Fatalf("offset %d: want %d after 3 s at 1000/s, want 900..1100", offset, w)
		}
		took := 0
		for want() > 500 && took < 300 {
			run(10, 20)
			took += 10
		}
		if took > 130 {
			t.Errorf("offset %d: want %d %d ms into a fall from 1000/s to 50/s, want ≤ 500 within 130 ms", offset, want(), took)
		}
	}
}

// exactDriver returns a fixture whose every decision is exact (no
// batches), so that every one samples the key, and run, which sends k one
// token every every ms for ms milliseconds, ticking the core every 100 ms,
// offset ms into each, as a driver does.
func exactDriver(t *testing.T, k bucket.Key, offset int) (*fixture, func(ms, every int)) {
	f := newFixture(t, func(c *Config) { c.MinBatch = 1 << 40 })
	ctx := context.Background()
	n := 0
	return f, func(ms, every int) {
		for i := 0; i < ms; i++ {
			if i%every == 0 {
				_, _ = f.core.Decide(ctx, f.clk.Now(), k, global300, 1, "d"+f.clk.Now().String())
			}
			f.clk.Advance(time.Millisecond)
			if n++; n%100 == offset {
				f.core.Tick(ctx, f.clk.Now())
			}
		}
	}
}

// want is k's reported demand now, 0 when the core reports none for it.
func (f *fixture) want(k bucket.Key) bucket.Tokens {
	for _, d := range f.core.Demand(f.clk.Now()) {
		if d.Key == k {
			return d.Want
		}
	}
	return 0
}

// TestShareTooSmallForTheCostIsReported: a key whose floor cannot carry
// its requests' cost (150 against the floor's burst of 100) is pressed
// from its first request. It takes state and its demand is reported, so
// the coordinator can lease it what it needs; a key left cold would stay
// unreported, its requests denied, until one in coldSample decisions gave
// it state.
func TestShareTooSmallForTheCostIsReported(t *testing.T) {
	f := newFixture(t, nil)
	k := key("big")
	for i := range 10 {
		r := f.decide(t, k, 150)
		if r.Decision.Allowed || r.Path != PathNoAllocation {
			t.Fatalf("request %d: allowed=%v on path %s, want denied for want of allocation", i, r.Decision.Allowed, r.Path)
		}
		if n := f.core.Stats().Keys; n != 1 {
			t.Fatalf("request %d: %d keys with state, want the pressed key's", i, n)
		}
		f.clk.Advance(100 * time.Millisecond)
		f.core.Tick(context.Background(), f.clk.Now())
	}
	if w := f.want(k); w < 750 {
		t.Fatalf("reported want %d, want about the 1,500 tokens a second it was asked", w)
	}
}

// TestReportedDemandReadsAFallFromAfterIt: a key whose use falls to about
// 77 tokens a second (a region's share of a demand that moved away, at an
// agent of two) is reported near its new level within 300 ms of the fall,
// however the windows fall against it. The run that takes a fall is read
// from its windows after the first, which began before the fall; a fall
// taken from that first window alone (closed early: from 1,000 a second the
// estimate expects 64 tokens within 64 ms) is lowered to the next window's
// rate. With the first window counted, the level read 111–148 from 500 a
// second at three of the ten offsets, and 170 from 1,000 at one, and the
// average took a second or more to bring it down while another region
// waited for the difference.
func TestReportedDemandReadsAFallFromAfterIt(t *testing.T) {
	for _, from := range []int{2, 1} { // one token every 2 ms (500/s), every 1 ms (1,000/s)
		for offset := 0; offset < 100; offset += 10 {
			k := key("fall")
			f, run := exactDriver(t, k, offset)
			run(3000+offset, from)
			level := bucket.Tokens(1000 / from)
			if w := f.want(k); w < level*9/10 || w > level*11/10 {
				t.Fatalf("from %d/s, offset %d: want %d after 3 s, want within 10%%", level, offset, w)
			}
			run(300, 13)
			if w := f.want(k); w > 110 {
				t.Errorf("from %d/s, offset %d: want %d 300 ms into a fall to 77/s, want ≤ 110", level, offset, w)
			}
		}
	}
}

// TestDemandEstimateReadsTheRunAfterItsFirstWindow drives the estimate
// window by window: a fall or a rise is read from the run's windows after
// its first (which straddles the change); a fall taken from one window
// closed early is lowered to the next window's rate; and a stop, whose
// later windows saw nothing, is still read as the whole run's mean and
// then decays as an average (read as nothing at once, the off phase of
// on/off traffic lent floors the next burst needed: bursty-diurnal's worst
// budget −0.011 over seeds 11–40).
func TestDemandEstimateReadsTheRunAfterItsFirstWindow(t *testing.T) {
	const w, hl, sustain = 100_000, 500_000, 200_000 // µs
	steady := func(perWindow int64) *demandEstimate {
		d := &demandEstimate{}
		for i := 0; i < 50; i++ {
			d.add(perWindow, w, hl, sustain)
		}
		return d
	}
	near := func(name string, got, want float64) {
		t.Helper()
		if got < want*0.99 || got > want*1.01 {
			t.Errorf("%s: rate %.1f, want %.1f", name, got, want)
		}
	}
	// 500/s, then a window that straddles a fall to 80/s, then one at 80/s.
	d := steady(50)
	d.add(20, w, hl, sustain)
	d.add(8, w, hl, sustain)
	near("fall", d.rate, 80)
	// The same stop: the run's mean with its first window, 100/s, then an
	// average toward nothing.
	d = steady(50)
	d.add(20, w, hl, sustain)
	d.add(0, w, hl, sustain)
	near("stop", d.rate, 100)
	d.add(0, w, hl, sustain)
	if d.rate <= 0 || d.rate >= 100 {
		t.Errorf("stop, a window later: rate %.1f, want an average between 0 and 100", d.rate)
	}
	// 1,000/s, a fall taken from one window closed early at 64 ms that saw
	// 20 tokens (312.5/s), then a whole window at 80/s: the level is 80.
	d = steady(100)
	d.add(20, 64_000, hl, sustain)
	near("early-closed fall", d.rate, 312.5)
	d.add(8, w, hl, sustain)
	near("early-closed fall, next window", d.rate, 80)
	// 100/s, then a window that straddles a rise to 450/s, then one at
	// 450/s: the rise is the second window's 450/s (with the first counted,
	// the run's mean read 350).
	d = steady(10)
	d.add(25, w, hl, sustain)
	d.add(45, w, hl, sustain)
	near("rise", d.rate, 450)
}

// TestDemandEstimateSettlesAFallOnItsMean replays one agent's windows
// from a chaos run (healthy, the region the demand left at 45 s): 465/s,
// a window straddling the fall, two windows of 14 tokens (139/s, what
// arrived just after it), then the agent's new rate of about 60–75/s. The
// level read from the two windows is 139; the windows after it join that
// reading as a mean until 64 tokens are seen, so the estimate is near the
// new rate within three windows, where an average from 139 took about
// 1.2 s (it read 111 three windows later). A rise ends the reading at once.
func TestDemandEstimateSettlesAFallOnItsMean(t *testing.T) {
	const hl, sustain = 500_000, 200_000 // µs
	d := &demandEstimate{}
	for range 50 {
		d.add(47, 101_000, hl, sustain)
	}
	for _, win := range [][2]int64{{42, 169_000}, {14, 101_000}, {14, 101_000}} {
		d.add(win[0], win[1], hl, sustain)
	}
	if d.rate < 130 || d.rate > 145 {
		t.Fatalf("after the fall: rate %.1f, want the 139/s of the windows after its first", d.rate)
	}
	for range 3 {
		d.add(6, 101_000, hl, sustain)
	}
	if d.rate > 85 {
		t.Fatalf("three windows at 59/s after the fall's level: rate %.1f, want their mean with the level's window (79), ≤ 85", d.rate)
	}
	d.add(60, 101_000, hl, sustain) // a rise: not part of the fall
	if d.settleUS != 0 {
		t.Fatal("a rise did not end the fall's reading")
	}
	if d.rate < 79 {
		t.Fatalf("after a rise window: rate %.1f, want at least the level before it", d.rate)
	}
}

// TestSampleHotReadsABatchedKeysFall: a key batched at 2,000 decisions a
// second stops. Sampled every 20 ms by SampleHot, its estimate takes the
// fall within 250 ms, and Leveled says so. Without SampleHot (and no
// Tick) nothing samples it in that time: no decision comes to do it.
func TestSampleHotReadsABatchedKeysFall(t *testing.T) {
	for _, hot := range []bool{true, false} {
		f := newFixture(t, nil)
		k, global := key("hot"), bucket.PerSecond(30000)
		ctx := context.Background()
		for range 4000 { // 2 s at 2,000 a second
			if _, err := f.core.Decide(ctx, f.clk.Now(), k, global, 1, ""); err != nil {
				t.Fatal(err)
			}
			f.clk.Advance(500 * time.Microsecond)
		}
		f.core.Tick(ctx, f.clk.Now())
		if ks := f.core.lookup(&k); ks == nil || !ks.batched.Load() {
			t.Fatal("the key is not batched at 2,000 a second: the test does not reach what it checks")
		}
		select {
		case <-f.core.Leveled(): // the rise, read before
		default:
		}
		leveled, rate := awaitLevel(f, k, func() {
			f.clk.Advance(20 * time.Millisecond)
			if hot {
				f.core.SampleHot(f.clk.Now())
			}
		})
		t.Logf("SampleHot %v: leveled after %v, reported at %.0f a second", hot, leveled, rate)
		switch {
		case hot && (leveled == 0 || rate > 1000):
			t.Fatalf("sampled by SampleHot: the stop leveled after %v (0: never), reported at %.0f a second; want within 250 ms, below 1,000", leveled, rate)
		case !hot && (leveled != 0 || rate < 1000):
			t.Fatalf("unsampled: the stop leveled after %v, reported at %.0f a second; nothing should have read it", leveled, rate)
		}
	}
}

// TestSampleHotReadsAKeyOutOfTheHotCache: two keys batched at 2,000
// decisions a second whose hashes share a slot of the hot-key cache; the
// slot holds one. The other stops, and SampleHot still takes its fall
// within 250 ms: it samples every batched key, not those of the cache
// alone, which left this one to the agent's rounds.
func TestSampleHotReadsAKeyOutOfTheHotCache(t *testing.T) {
	f := newFixture(t, nil)
	a := key("a")
	var b bucket.Key
	for i := 0; i < 1_000_000; i++ {
		if k := key("b" + strconv.Itoa(i)); f.core.hash(&k)%hotSlots == f.core.hash(&a)%hotSlots {
			b = k
			break
		}
	}
	if b.Subject == "" {
		t.Fatal("no key shares a's slot")
	}
	global := bucket.PerSecond(30000)
	ctx := context.Background()
	for range 4000 { // 2 s at 2,000 a second each
		for _, k := range []bucket.Key{a, b} {
			if _, err := f.core.Decide(ctx, f.clk.Now(), k, global, 1, ""); err != nil {
				t.Fatal(err)
			}
		}
		f.clk.Advance(500 * time.Microsecond)
	}
	f.core.Tick(ctx, f.clk.Now())
	ka, kb := f.core.lookup(&a), f.core.lookup(&b)
	if ka == nil || kb == nil || !ka.batched.Load() || !kb.batched.Load() {
		t.Fatal("the keys are not both batched: the test does not reach what it checks")
	}
	out, in := b, a // stop the key the slot does not hold
	if f.core.slot(ka.h).Load() != ka {
		out, in = a, b
	}
	select {
	case <-f.core.Leveled(): // the rises, read before
	default:
	}
	leveled, rate := awaitLevel(f, out, func() {
		for range 40 { // the key the slot holds goes on
			if _, err := f.core.Decide(ctx, f.clk.Now(), in, global, 1, ""); err != nil {
				t.Fatal(err)
			}
			f.clk.Advance(500 * time.Microsecond)
		}
		f.core.SampleHot(f.clk.Now())
	})
	if leveled == 0 || rate > 1000 {
		t.Fatalf("the stopped key out of the cache: leveled after %v (0: never), reported at %.0f a second; want within 250 ms, below 1,000", leveled, rate)
	}
}

// awaitLevel calls step (which moves the clock) for up to 250 ms until
// the core says a key's demand took a new level (Core.Leveled), and
// returns how long that took (0: never) and k's reported rate then.
func awaitLevel(f *fixture, k bucket.Key, step func()) (leveled time.Duration, rate float64) {
	start := f.clk.Now()
	for f.clk.Now().Sub(start) < 250*time.Millisecond && leveled == 0 {
		step()
		select {
		case <-f.core.Leveled():
			leveled = f.clk.Now().Sub(start)
		default:
		}
	}
	for _, d := range f.core.Demand(f.clk.Now()) {
		if d.Key == k {
			rate = d.Rate
		}
	}
	return leveled, rate
}
