package region

import (
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Demand lists, sorted by key, every key of a global rule this agent has
// local state for, with its demand at now: the keys it used within the
// demand window (even a little) and those with a coordinator entry. The
// region's speaker sums the agents' lists and reports them all, so the
// coordinator can tell a region that uses a little of its floor from one
// that uses none: a key missing from the region's report is taken as
// unused there, and its floor may be lent. A key used well within its
// floor keeps no state on the cold path (see cold) until a sample or a
// press gives it some, so it is missing too until then. Keys whose demand
// has decayed to nothing and that hold no entry are left out once
// stopReported has passed since their last arrival: until then they are
// listed with no demand, so the speaker hears that the use stopped rather
// than keep the last reading it had; a key idle for IdleAfter has no
// state.
//
// While the store is unavailable (the breaker not closed), a key of a rule
// that fails closed is reported with no demand: the agent admits nothing
// for it, so its share of the budget is better lent to regions that can
// use it, and it is reported again, and taken back, once the store answers.
//
// The coordinator keeps state only for keys some region presses on, so its
// memory still follows hot keys; the report's size follows the keys the
// region uses.
func (c *Core) Demand(now time.Time) []KeyDemand { return c.AppendDemand(nil, now) }

// AppendDemand is Demand appending to dst, for a driver that reuses its
// buffer tick after tick.
func (c *Core) AppendDemand(dst []KeyDemand, now time.Time) []KeyDemand {
	c.demandMu.Lock()
	defer c.demandMu.Unlock()
	order := c.sortedKeys()
	out := slices.Grow(dst, len(order))
	down := c.breaker.State(now) != BreakerClosed
	nowUS := now.UnixMicro()
	for _, ks := range order {
		if ks.gone.Load() || ks.rs.Load().cfg.Scope != rules.ScopeGlobal {
			continue
		}
		ac := ks.alloc.Load()
		if ac == nil {
			continue
		}
		ks.mu.Lock()
		rate, active := ks.demand.rate, ks.lastActive
		ks.mu.Unlock()
		want := bucket.Tokens(math.Ceil(rate * ac.global.Period().Seconds()))
		if want <= 0 && !ac.hot && nowUS-active > stopReported.Microseconds() {
			continue
		}
		if down && ks.rs.Load().cfg.OnUnavailable == rules.FailClosed {
			want, rate = 0, 0
		}
		out = append(out, KeyDemand{Key: ks.key, Want: want, Rate: rate, Alloc: ac.full, Hot: ac.hot})
	}
	return out
}

// sortedKeys returns every key state the core holds, sorted by key: the
// order kept from the last call, less the keys dropped since (marked gone),
// merged with the keys created since, sorted on their own. A key created
// while it runs is merged at the next call. Requires that c.demandMu is
// held.
func (c *Core) sortedKeys() []*keyState {
	c.newMu.Lock()
	fresh := c.newKeys
	c.newKeys = nil
	c.newMu.Unlock()
	if len(fresh) == 0 && c.dropped.Load() == 0 {
		return c.demandOrder
	}
	c.dropped.Store(0)
	byKey := func(a, b *keyState) int { return cmpKey(a.key, b.key) }
	slices.SortFunc(fresh, byKey)
	old, out := c.demandOrder, c.spareOrder[:0]
	i, j := 0, 0
	for i < len(old) || j < len(fresh) {
		var ks *keyState
		switch {
		case j == len(fresh) || i < len(old) && byKey(old[i], fresh[j]) <= 0:
			ks, i = old[i], i+1
		default:
			ks, j = fresh[j], j+1
		}
		if !ks.gone.Load() {
			out = append(out, ks)
		}
	}
	clear(old)
	c.demandOrder, c.spareOrder = out, old[:0]
	return out
}

// stopReported is how long after its last arrival a key whose demand
// estimate fell to nothing, and that holds no entry, is still listed by
// Demand, with no demand. Left out at once, the stop never reached the
// speaker: it kept the key's last reading, which the region then reported
// until a refresh interval had passed. In the simulator's demand-shift
// (seed 1) the old region's estimate fell in two steps, 5,000 → 627 a
// second, read from the window the stop began in, and then to nothing;
// the first took its entry away (627 is below its floor), so the second
// was never listed, and the region reported 627 and then 276 (one agent's
// reading) for 2 s while the region the demand moved to waited for the
// difference (convergence 2.5 s against 0.75 s). A second is several
// rounds of reports: a round the speaker merges away, or one too soon
// after its last urgent report to send at once, does not lose the stop.
const stopReported = time.Second

// sampleEvery is how often a key's short-term demand estimate takes in its
// arrivals on the decision path (Tick samples every key too): often enough
// that a flash crowd is batched within moments.
const sampleEvery = 10 * time.Millisecond

// demandWindow is the shortest window the reported demand is measured
// over, so that arrivals bunched in one short sample do not read as a
// higher rate.
const demandWindow = 100 * time.Millisecond

// sample takes ks's arrivals into its demand estimates when sampleEvery
// has passed, and decides whether the key is batched. The short-term
// estimate, which sizes batches, rises at once (a flash crowd is batched
// within one sample) and decays with DemandHalfLife. The reported demand is
// a demandEstimate: a moving average that follows a sustained change of
// level at once.
func (c *Core) sample(ks *keyState, now time.Time) {
	nowUS := now.UnixMicro()
	if nowUS-ks.lastSample.Load() < sampleEvery.Microseconds() {
		return // as sampleLocked would, without the lock
	}
	ks.mu.Lock()
	defer ks.mu.Unlock()
	c.sampleLocked(ks, nowUS)
}

// ewma moves est toward the rate inst seen over dt µs: at once when inst is
// higher, with half-life hl µs when lower.
func ewma(est, inst float64, dt, hl int64) float64 {
	est = average(est, inst, dt, hl)
	if inst > est {
		est = inst
	}
	return est
}

// average moves est toward the rate inst seen over dt µs with half-life hl
// µs, both ways; an estimate of 0 (nothing seen yet, or decayed to nothing)
// starts at inst.
func average(est, inst float64, dt, hl int64) float64 {
	if est == 0 {
		return inst
	}
	decay := math.Exp2(-float64(dt) / float64(hl))
	est = est*decay + inst*(1-decay)
	if est < 1e-9 {
		est = 0
	}
	return est
}

// demandEstimate is a key's reported demand, in tokens per second: a
// moving average with half-life DemandHalfLife over windows of at least
// demandWindow, which starts at the first window's rate (a key new or idle
// again is reported at its full rate within one window), and which moves
// at once to a new level once the key's use has held it for DemandSustain.
//
// The average alone does not rise at once on purpose: an estimate that did
// turned every bunch of arrivals in one window (a few costly requests) into
// a peak a hundred times the key's use, the coordinator moved allocations
// after those peaks, and every move costs the region that gains capacity
// the burst it adds, since an increase arrives spent. But the average is
// slow the other way too: a region whose use fell from twice the budget to
// a tenth of it reported the fall over about 2 s (four half-lives), holding
// an allocation another region was waiting for. So the estimate watches the
// run of consecutive windows on one side of it — each at least twice the
// estimate (rising), or each at most half of it (falling) — and once the
// run is beyond chance (the larger of the tokens seen and the tokens
// expected over it is at least sustainTokens) the estimate becomes the
// run's mean rate: a rise once it has lasted DemandSustain, a fall at once.
//
// A rise must last: a bunch within one window is not a new level, and a
// rise read early moves capacity to the region and back — unless its one
// window saw surgeTokens or more, which is no bunch. A fall need not:
// a window at most half the estimate that expected 64 tokens or more is no
// bunch, and a floor the region wants again after a lull is kept for it by
// the coordinator's hold over the budget's fill time; and a window in
// which a collapse is already beyond chance is closed before demandWindow
// has passed (fell). Waiting DemandSustain
// for a fall too, rotating-hot read 0.848 of the ideal instead of 0.861,
// and dup-reorder 0.782 instead of 0.807 (seed 1; seeds 2–4 alike). A key so
// light that a quiet window is chance moves only as an average.
type demandEstimate struct {
	rate float64
	// dir is the side of the current run: +1 rising, −1 falling, 0 none.
	dir int8
	// runUS, runTokens and runExpect are the run's length, the tokens seen
	// in it, and the tokens the estimate expected over it.
	runUS     int64
	runTokens int64
	runExpect float64
	// firstUS and firstTokens are the run's first window, which began
	// before the change: the level a run sets is read from the windows
	// after it.
	firstUS, firstTokens int64
	// straddled is set when a fall was taken from its first window alone:
	// the next window, if lower, is the level.
	straddled bool
	// settleUS and settleTokens are the windows a fall's level was read
	// from, and those since (0: none): until they have seen sustainTokens,
	// the level is their mean, every window neither a rise nor a further
	// collapse joining it.
	settleUS, settleTokens int64
}

// sustainTokens is how many tokens a run of windows must have seen (when
// rising) or been expected to see (when falling) before the estimate takes
// its level: a Poisson count expected at 64 falls to half of that or rises
// to twice of it by chance less than once in 10,000 runs, while a key
// reported at a few tokens a second keeps the moving average alone, whose
// quiet windows are chance.
const sustainTokens = 64

// surgeTokens is how many tokens one window of a rising run must have seen
// to set the level at once, before DemandSustain has passed: a rise that
// large in one window (a region whose use jumped to several times its
// estimate) is a new level, not a bunch of a few requests, and waiting a
// second window for it held the move for the region the demand moved to.
// With it rotating-hot's tight form read 0.902 instead of 0.897 at seeds
// 1–3, bursty-diurnal the same; at 128 bursty-diurnal lost 0.003 (its
// on/off bursts read as levels and moved floors back and forth).
const surgeTokens = 256

// add takes in a window of w µs that saw tokens, with half-life hl µs and
// sustain µs the time a rising run must last to set the level. It reports
// whether a run set the level: a rise or a fall beyond chance.
//
// A run that sets the level is read from its windows after the first when
// it has them: the first began before the change, so its rate lies
// between the old level and the new. With it counted, a fall from 900 to
// 150 tokens a second read about 260, which the average then took a second
// or more to bring down while another region waited for the difference,
// and a rise read short of the level the region then pressed for. Two
// exceptions: a fall taken from its first window alone (closed early, see
// fell) is lowered to the next window's rate if that is lower; and a stop,
// whose later windows saw nothing, keeps the whole run's mean and decays
// as an average from there — read as nothing at once, the off phase of
// on/off traffic lent floors the next burst needed (bursty-diurnal's worst
// budget −0.011 over seeds 11–40).
func (d *demandEstimate) add(tokens, w, hl, sustain int64) (leveled bool) {
	r := float64(tokens) / (float64(w) / 1e6)
	if d.rate == 0 {
		d.rate, d.dir, d.straddled = average(0, r, w, hl), 0, false
		d.settleUS, d.settleTokens = 0, 0
		return false
	}
	if d.straddled {
		d.straddled = false
		if r < d.rate {
			d.rate = r
			return true // the fall's level, read from this window
		}
	}
	if d.settleUS > 0 {
		// A fall's level is still being read: it is the mean of the windows
		// since the fall, not an average from the first reading. Only a
		// rise (twice the level) or a further collapse (a quarter of it)
		// ends the reading early, and is taken as usual.
		if r < 2*d.rate && 4*r > d.rate {
			d.settleUS += w
			d.settleTokens += tokens
			d.rate = float64(d.settleTokens) / (float64(d.settleUS) / 1e6)
			if d.settleTokens >= sustainTokens {
				d.settleUS, d.settleTokens = 0, 0
			}
			return false
		}
		d.settleUS, d.settleTokens = 0, 0
	}
	var dir int8
	switch {
	case r >= 2*d.rate:
		dir = 1
	case 2*r <= d.rate:
		dir = -1
	}
	if dir != d.dir {
		d.dir, d.runUS, d.runTokens, d.runExpect = dir, 0, 0, 0
		d.firstUS, d.firstTokens = w, tokens
	}
	if dir != 0 {
		d.runUS += w
		d.runTokens += tokens
		d.runExpect += d.rate * float64(w) / 1e6
	}
	d.rate = average(d.rate, r, w, hl)
	if (dir < 0 || dir > 0 && (d.runUS >= sustain || d.runTokens >= surgeTokens)) && max(float64(d.runTokens), d.runExpect) >= sustainTokens {
		us, tok := d.runUS, d.runTokens
		switch {
		case us > d.firstUS && (dir > 0 || tok > d.firstTokens):
			us, tok = us-d.firstUS, tok-d.firstTokens
			if dir < 0 && tok < sustainTokens {
				d.settleUS, d.settleTokens = us, tok
			}
		case us == d.firstUS && dir < 0:
			d.straddled = true
		}
		d.rate = float64(tok) / (float64(us) / 1e6)
		d.dir, d.runUS, d.runTokens, d.runExpect = 0, 0, 0, 0
		return true
	}
	return false
}

// fell reports whether a window of w µs so far that saw tokens is already
// a fall beyond chance: the estimate expected at least sustainTokens over
// it and it saw at most half of that. Such a window is closed at once,
// before demandWindow has passed: a key whose use collapsed (the region
// that cooled, holding an allocation another region waits for) is seen
// within a few samples instead of at the end of a window that began before
// the fall, which read as a partial fall and took a second window. A rise
// still waits for the whole window, since a bunch of arrivals in a short
// one is no new level.
func (d *demandEstimate) fell(tokens, w int64) bool {
	expect := d.rate * float64(w) / 1e6
	return expect >= sustainTokens && float64(2*tokens) <= expect
}

// sampleLocked requires that ks.mu is held.
func (c *Core) sampleLocked(ks *keyState, nowUS int64) {
	dt := nowUS - ks.lastSample.Load()
	if dt < sampleEvery.Microseconds() {
		return
	}
	if n := ks.takeCount(); n > 0 {
		ks.rs.Load().admitted[PathBatch].Add(n)
	}
	hl := c.cfg.DemandHalfLife.Microseconds()
	spent := ks.given - ks.back - ks.held()
	a := ks.arrived.Swap(0) + max(spent-ks.lastSpent, 0)
	ks.lastSpent = spent
	ks.rate = ewma(ks.rate, float64(a)/(float64(dt)/1e6), dt, hl)
	ks.lastSample.Store(nowUS)
	ks.winTokens += a
	if w := nowUS - ks.winStart; w >= demandWindow.Microseconds() || ks.demand.fell(ks.winTokens, w) {
		if ks.demand.add(ks.winTokens, w, hl, c.cfg.DemandSustain.Microseconds()) && ks.rs.Load().cfg.Scope == rules.ScopeGlobal {
			select {
			case c.leveled <- struct{}{}:
			default: // one is pending already
			}
		}
		ks.winStart, ks.winTokens = nowUS, 0
	}
	if a > 0 {
		ks.lastActive = nowUS
	}
	batch := ks.rate*c.cfg.BatchWindow.Seconds() >= c.batchMinus
	if ac := ks.alloc.Load(); ac != nil && batch {
		batch = float64(ac.limit.Burst())*c.cfg.BatchMaxFraction >= c.batchMinus
	}
	// Marked batched before it is listed: a prune that finds it listed
	// keeps it.
	if was := ks.batched.Swap(batch); batch && !was {
		c.promote(ks)
		c.listBatched(ks)
	}
}

// SampleHot samples at now the demand of the batched keys, the keys in
// heavy use, as Tick samples every key but without the rest of its work.
// A key whose lock is taken (a refill holding it across a call to the
// store) is left to its next sample. Decisions served from a key's batch
// do not sample it (they read no clock under a coarse one), so without
// SampleHot a batched key was sampled only as its batch ran out or at the
// agent's round, and a fall of its use, which makes its batch last
// longer, was read at the next round: 0.2–0.4 s late under chaos's
// redis-slow, whose rounds are slow. It samples every batched key
// (batchedKeys), not only those of the hot-key cache: a key whose slot
// another key took (their hashes share it; a denied key takes its slot
// too) was left to the rounds. Safe to call beside decisions and Tick.
func (c *Core) SampleHot(now time.Time) {
	nowUS := now.UnixMicro()
	c.sampleMu.Lock()
	defer c.sampleMu.Unlock()
	c.batchedMu.Lock()
	keys := append(c.sampleBuf[:0], c.batchedKeys...)
	c.batchedMu.Unlock()
	for _, ks := range keys {
		if !ks.batched.Load() || ks.gone.Load() || nowUS-ks.lastSample.Load() < sampleEvery.Microseconds() || !ks.mu.TryLock() {
			continue
		}
		c.sampleLocked(ks, nowUS)
		ks.mu.Unlock()
	}
	clear(keys) // keep no dropped key alive
	c.sampleBuf = keys[:0]
}

// listBatched adds ks, just turned batched, to batchedKeys unless it is
// listed already.
func (c *Core) listBatched(ks *keyState) {
	c.batchedMu.Lock()
	if !ks.listed {
		ks.listed = true
		c.batchedKeys = append(c.batchedKeys, ks)
	}
	c.batchedMu.Unlock()
}

// pruneBatched takes out of batchedKeys the keys no longer batched and
// those dropped (Tick calls it; SampleHot skips them meanwhile).
func (c *Core) pruneBatched() {
	c.batchedMu.Lock()
	defer c.batchedMu.Unlock()
	keep := c.batchedKeys[:0]
	for _, ks := range c.batchedKeys {
		if ks.batched.Load() && !ks.gone.Load() {
			keep = append(keep, ks)
		} else {
			ks.listed = false
		}
	}
	clear(c.batchedKeys[len(keep):])
	c.batchedKeys = keep
}

// Leveled receives when a global key's reported demand (Demand) took a new
// level since the last receive: a rise or a fall its windows put beyond
// chance (demandEstimate). A driver that stores reports on a slow round
// stores one at once on it: the level is what another region waits on,
// for what this one gives back or asks. Several levels taken before a
// receive are one.
func (c *Core) Leveled() <-chan struct{} { return c.leveled }

// KeyDemand is one key's local demand.
type KeyDemand struct {
	Key bucket.Key
	// Want is the demand in tokens per the budget's period.
	Want bucket.Tokens
	// Rate is the demand in tokens per second.
	Rate float64
	// Alloc is the region's allocation for the key; Hot is set when it is a
	// coordinator entry.
	Alloc bucket.Limit
	Hot   bool
}
