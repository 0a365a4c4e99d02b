package region

import (
	"cmp"
	"context"
	"errors"
	"hash/maphash"
	"maps"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Path says how a decision was made.
type Path uint8

// Decision paths.
const (
	// PathStore: the regional store decided (one script call, or the batch
	// refill that answered this request).
	PathStore Path = iota
	// PathBatch: decided locally from a batch taken from the regional
	// bucket beforehand.
	PathBatch
	// PathDenyCache: denied locally because the regional bucket was empty
	// moments ago and cannot have refilled yet.
	PathDenyCache
	// PathNoAllocation: denied because the region's allocation for the key
	// is zero or smaller than the cost.
	PathNoAllocation
	// PathEmergency: the store was unavailable; an in-process bucket with
	// the region's allocation divided by its live agents decided.
	PathEmergency
	// PathFailOpen: the store was unavailable and the rule fails open.
	PathFailOpen
	// PathFailClosed: the store was unavailable and the rule fails closed.
	PathFailClosed
	numPaths
)

var pathNames = [numPaths]string{"store", "batch", "deny-cache", "no-allocation", "emergency", "fail-open", "fail-closed"}

// String returns the path's metric label.
func (p Path) String() string {
	if p < numPaths {
		return pathNames[p]
	}
	return "unknown"
}

// Paths lists every path, for metrics.
func Paths() []Path {
	ps := make([]Path, numPaths)
	for i := range ps {
		ps[i] = Path(i)
	}
	return ps
}

// Result is one decision of the Core.
type Result struct {
	// Decision is the outcome. Its Limit is the region's allocation for
	// the key (on PathEmergency, the emergency limit this agent enforced).
	Decision bucket.Decision
	Path     Path
	// Hot is set when the allocation is a coordinator entry, not a floor.
	Hot bool
	// Alloc is the region's allocation for the key at the time.
	Alloc bucket.Limit
}

// Core is an agent's deterministic decision core: the region's allocation
// per key, enforced in the regional store, with token batches for keys in
// heavy local demand, the rule's failure policy and a circuit breaker when
// the store fails, and buckets started empty after a detected Redis
// failover. Time is an argument of every method; Core starts no goroutines
// and reads no clock. Its only I/O is calls to its bucket.Store, made
// synchronously by the caller's goroutine.
//
// The hot path (a key deciding from its batch) takes no lock and allocates
// nothing: a lookup in an immutable copy of the key's shard, a cached
// allocation and one compare-and-swap on the key's token count. Core is safe for concurrent
// use.
type Core struct {
	cfg     Config
	store   bucket.Store
	alloc   Allocations
	breaker *Breaker
	seed    maphash.Seed
	mask    uint64
	shards  []coreShard
	// hot caches the state of batched keys, found by a cheap hash of the
	// key, so the busiest keys skip the shard's map lookup.
	hot [hotSlots]atomic.Pointer[keyState]

	rulesMu sync.Mutex
	rules   atomic.Pointer[map[string]*ruleState]

	live      atomic.Int64
	coldCount atomic.Uint64
	// keysVer counts keys created and dropped. Demand lists keys in the
	// order of demandOrder, sorted by key and rebuilt only when keysVer has
	// moved since, so a report does not sort every key on every tick.
	keysVer     atomic.Uint64
	demandMu    sync.Mutex
	demandOrder []*keyState
	demandVer   uint64
	failEpoch   atomic.Uint64
	failAt      atomic.Int64 // µs
	lastErr     atomic.Pointer[error]
	stats       coreStats
	tickBuf     []*keyState
	tickMu      sync.Mutex
	batchMinus  float64 // MinBatch as a float, cached
}

// coreShard holds the state of the keys that hash to it. keys, under mu,
// is every key; read is an immutable copy that lookups use without a lock,
// republished (as sync.Map does) once the misses have cost about as much as
// a copy.
type coreShard struct {
	read   atomic.Pointer[map[bucket.Key]*keyState]
	mu     sync.RWMutex
	keys   map[bucket.Key]*keyState
	misses int
	_      [24]byte // keep shards on separate cache lines
}

// publishLocked makes read a copy of keys. Requires that s.mu is held.
func (s *coreShard) publishLocked() {
	m := maps.Clone(s.keys)
	s.read.Store(&m)
	s.misses = 0
}

// ruleState is a rule's configuration and counters.
type ruleState struct {
	name     string
	cfg      RuleConfig
	admitted [numPaths]atomic.Int64
	denied   [numPaths]atomic.Int64
}

type coreStats struct {
	storeOps, storeErrors, refills, returns, returned, drains, drained, failovers, keys atomic.Int64
}

// keyState is what an agent keeps for one key in recent use.
type keyState struct {
	// What a decision from a batch touches comes first, to share one cache
	// line: the compare-and-swap on tokens brings it in, and the rest are
	// then hits rather than further cache-line transfers between cores.
	// batch packs the batch tokens held (debited from the regional bucket)
	// above countBits, and the decisions admitted from them since the last
	// sample below, so a decision from the batch is one compare-and-swap.
	batch       atomic.Int64
	arrived     atomic.Int64 // tokens asked since the last sample
	deniedUntil atomic.Int64 // µs: requests of cost ≥ deniedCost are denied locally until then
	deniedCost  atomic.Int64
	alloc       atomic.Pointer[allocCache]
	rs          atomic.Pointer[ruleState]
	batched     atomic.Bool // local demand is large enough to batch

	key bucket.Key
	// gone is set when the state is dropped from its shard, for the demand
	// order, which may still list it until it is rebuilt.
	gone atomic.Bool

	mu         sync.Mutex
	refilling  bool
	batchLimit bucket.Limit // the allocation the held tokens were taken under
	takenAt    int64        // µs of the last refill
	rate       float64      // short-term demand, tokens per second: sizes batches
	lastSample int64        // µs
	demand     float64      // moving average over windows of at least demandWindow, tokens per second: reported
	winStart   int64        // µs: start of the current demand window
	winTokens  int64        // tokens asked in the current demand window
	lastActive int64        // µs of the last sample with arrivals
	emergency  bucket.State
	drained    uint64      // failover epoch this key was emptied for
	attempts   *attemptLog // recent attempt ids decided here; nil until one is seen
	given      int64       // tokens ever added to the batch
	back       int64       // tokens ever taken out of the batch unspent (returned or lost)
	lastSpent  int64       // given − back − held at the last sample
}

type allocCache struct {
	epoch  uint64
	global bucket.Limit
	limit  bucket.Limit
	hot    bool
	until  int64 // µs
}

const hotSlots = 256

// hotSlot is a cheap hash of a key for the hot-key cache: a collision only
// sends a lookup on to the shard's map.
func hotSlot(k bucket.Key) int {
	h := uint(len(k.Subject))*0x9E37 + uint(len(k.Rule))*0x85EB
	if n := len(k.Subject); n > 0 {
		h += uint(k.Subject[0])*31 + uint(k.Subject[n-1])*131 + uint(k.Subject[n/2])*7
	}
	if n := len(k.Rule); n > 0 {
		h += uint(k.Rule[n-1]) * 17
	}
	return int(h % hotSlots)
}

// sampleEvery is how often a key's short-term demand estimate takes in its
// arrivals on the decision path (Tick samples every key too): often enough
// that a flash crowd is batched within moments.
const sampleEvery = 10 * time.Millisecond

// demandWindow is the shortest window the reported demand is measured
// over, so that arrivals bunched in one short sample do not read as a
// higher rate.
const demandWindow = 100 * time.Millisecond

// NewCore returns a Core deciding in store with the region's allocations.
func NewCore(cfg Config, store bucket.Store, alloc Allocations) (*Core, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if store == nil {
		return nil, errors.New("region: NewCore: store is nil")
	}
	if alloc == nil {
		alloc = NewTableView(cfg.Region, cfg.Floors)
	}
	if cfg.DefaultRule.Scope == "" {
		cfg.DefaultRule.Scope = rules.ScopeGlobal
	}
	if cfg.DefaultRule.OnUnavailable == "" {
		cfg.DefaultRule.OnUnavailable = rules.FailClosed
	}
	n := 1
	for n < cfg.Shards {
		n <<= 1
	}
	c := &Core{
		cfg:        cfg,
		store:      store,
		alloc:      alloc,
		breaker:    NewBreaker(cfg.BreakerFailures, cfg.BreakerBackoff, cfg.BreakerMaxBackoff),
		seed:       maphash.MakeSeed(),
		mask:       uint64(n - 1),
		shards:     make([]coreShard, n),
		batchMinus: float64(cfg.MinBatch),
	}
	for i := range c.shards {
		c.shards[i].keys = map[bucket.Key]*keyState{}
	}
	c.live.Store(1)
	c.SetRules(cfg.Rules)
	return c, nil
}

// SetRules replaces the per-rule settings (after a rules reload). Counters
// of rules that stay are kept.
func (c *Core) SetRules(rcs map[string]RuleConfig) {
	c.rulesMu.Lock()
	defer c.rulesMu.Unlock()
	old := c.rules.Load()
	m := make(map[string]*ruleState, len(rcs))
	for name, rc := range rcs {
		if rc.Scope == "" {
			rc.Scope = rules.ScopeGlobal
		}
		if rc.OnUnavailable == "" {
			rc.OnUnavailable = rules.FailClosed
		}
		rs := &ruleState{name: name, cfg: rc}
		if old != nil {
			if o := (*old)[name]; o != nil {
				for i := range o.admitted {
					rs.admitted[i].Store(o.admitted[i].Load())
					rs.denied[i].Store(o.denied[i].Load())
				}
			}
		}
		m[name] = rs
	}
	c.rules.Store(&m)
	// Keys hold their rule's state; let them pick up the new one.
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.Lock()
		for _, ks := range s.keys {
			if rs := m[ks.key.Rule]; rs != nil {
				ks.rs.Store(rs)
			}
		}
		s.mu.Unlock()
	}
}

// rule returns the state of rule name, adding the default for a new name.
func (c *Core) rule(name string) *ruleState {
	if rs := (*c.rules.Load())[name]; rs != nil {
		return rs
	}
	c.rulesMu.Lock()
	defer c.rulesMu.Unlock()
	old := *c.rules.Load()
	if rs := old[name]; rs != nil {
		return rs
	}
	m := make(map[string]*ruleState, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	rs := &ruleState{name: name, cfg: c.cfg.DefaultRule}
	m[name] = rs
	c.rules.Store(&m)
	return rs
}

// SetLive sets the number of live agents in the region (this one
// included), which divides the emergency limit.
func (c *Core) SetLive(n int) { c.live.Store(int64(max(n, 1))) }

// Live returns the number of live agents the core divides by.
func (c *Core) Live() int { return int(c.live.Load()) }

// Failover records a detected failover of the regional Redis at now: for
// rules with EmptyOnFailover, every bucket counts as empty at now, so it
// admits at most what refills after now.
func (c *Core) Failover(now time.Time) {
	c.failAt.Store(now.UnixMicro())
	c.failEpoch.Add(1)
	c.stats.failovers.Add(1)
}

// Breaker returns the core's circuit breaker on the store.
func (c *Core) Breaker() *Breaker { return c.breaker }

// Allocations returns the allocation source.
func (c *Core) Allocations() Allocations { return c.alloc }

func (c *Core) shard(k bucket.Key) *coreShard {
	h := maphash.String(c.seed, k.Subject) + uint64(len(k.Rule))*0x9E3779B97F4A7C15
	return &c.shards[(h>>7)&c.mask]
}

// lookup returns key's state, nil when the key has none.
func (c *Core) lookup(key bucket.Key) *keyState {
	if ks := c.hot[hotSlot(key)].Load(); ks != nil && ks.key == key {
		return ks
	}
	s := c.shard(key)
	if m := s.read.Load(); m != nil {
		if ks := (*m)[key]; ks != nil {
			return ks
		}
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ks := s.keys[key]
	if ks != nil {
		s.missLocked()
	}
	return ks
}

// missLocked counts a lookup that found a key in keys but not in read, and
// republishes read once that has cost about as much as a copy. Requires
// that s.mu is held.
func (s *coreShard) missLocked() {
	s.misses++
	if s.misses > len(s.keys)/2+8 {
		s.publishLocked()
	}
}

// state returns key's state, creating it on first use.
func (c *Core) state(key bucket.Key, now int64) *keyState {
	if ks := c.lookup(key); ks != nil {
		return ks
	}
	s := c.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[key]; ks != nil {
		return ks
	}
	ks := &keyState{key: key, lastSample: now, lastActive: now, winStart: now}
	ks.rs.Store(c.rule(key.Rule))
	s.keys[key] = ks
	s.missLocked()
	c.stats.keys.Add(1)
	c.keysVer.Add(1)
	return ks
}

// allocation returns the key's allocation at now, from the key's cache
// while it holds.
func (c *Core) allocation(ks *keyState, now time.Time, global bucket.Limit) *allocCache {
	ep := c.alloc.Epoch()
	nowUS := now.UnixMicro()
	if ac := ks.alloc.Load(); ac != nil && ac.epoch == ep && nowUS < ac.until && sameLimit(ac.global, global) {
		return ac
	}
	ac := &allocCache{epoch: ep, global: global, limit: global, until: math.MaxInt64}
	if ks.rs.Load().cfg.Scope == rules.ScopeGlobal {
		l, hot, until := c.alloc.Allocation(now, ks.key, global)
		ac.limit, ac.hot, ac.until = l, hot, until.UnixMicro()
	}
	if old := ks.alloc.Swap(ac); old != nil && ac.limit.Count() > old.limit.Count() {
		// A denial remembered under a smaller allocation may no longer
		// hold.
		ks.deniedUntil.Store(0)
	}
	return ac
}

// sameLimit compares limits by what defines them (count, period, burst),
// cheaper than comparing every cached field.
func sameLimit(a, b bucket.Limit) bool {
	return a.Count() == b.Count() && a.Burst() == b.Burst() && a.Period() == b.Period()
}

// Allocation returns the region's allocation for key under global at now.
func (c *Core) Allocation(now time.Time, key bucket.Key, global bucket.Limit) (bucket.Limit, bool) {
	if c.rule(key.Rule).cfg.Scope != rules.ScopeGlobal {
		return global, false
	}
	l, hot, _ := c.alloc.Allocation(now, key, global)
	return l, hot
}

// attemptLog remembers the last decisions made for attempt ids on a key,
// so a retry of a request decided from a batch is not charged twice. It is
// per agent: a retry that reaches another agent is charged again unless the
// store decides it (the store remembers attempt ids across agents).
type attemptLog struct {
	byID  map[string]attemptRec
	order []string // ring of ids, oldest first once full
	next  int
}

type attemptRec struct {
	d       bucket.Decision
	path    Path
	expires int64 // µs
}

// attemptLogSize bounds the attempt ids remembered per key: retries come
// within moments, so the last few hundred suffice.
const attemptLogSize = 256

func (l *attemptLog) recall(id string, nowUS int64) (attemptRec, bool) {
	r, ok := l.byID[id]
	return r, ok && nowUS < r.expires
}

func (l *attemptLog) remember(id string, r attemptRec) {
	if _, ok := l.byID[id]; ok {
		l.byID[id] = r
		return
	}
	if len(l.order) < attemptLogSize {
		l.order = append(l.order, id)
	} else {
		delete(l.byID, l.order[l.next])
		l.order[l.next] = id
		l.next = (l.next + 1) % attemptLogSize
	}
	l.byID[id] = r
}

// countBits is how many low bits of keyState.batch count decisions; the
// count wraps (losing only metric counts) past 2^24 between samples.
const (
	countBits = 24
	countMask = 1<<countBits - 1
)

// held is the batch tokens held.
func (ks *keyState) held() int64 { return ks.batch.Load() >> countBits }

// take spends cost tokens of the batch if it holds them; left is what
// remains. count counts the decision in the batch word (the paths that
// count decisions themselves pass false).
func (ks *keyState) take(cost bucket.Tokens, count bool) (left int64, ok bool) {
	inc := int64(0)
	if count {
		inc = 1
	}
	for {
		w := ks.batch.Load()
		t := w >> countBits
		if t < int64(cost) {
			return t, false
		}
		nw := (t-int64(cost))<<countBits | (w+inc)&countMask
		if ks.batch.CompareAndSwap(w, nw) {
			return t - int64(cost), true
		}
	}
}

// addTokens adds n tokens to the batch.
func (ks *keyState) addTokens(n int64) { ks.batch.Add(n << countBits) }

// takeAll empties the batch and returns the tokens it held.
func (ks *keyState) takeAll() int64 {
	for {
		w := ks.batch.Load()
		if ks.batch.CompareAndSwap(w, w&countMask) {
			return w >> countBits
		}
	}
}

// takeCount returns and clears the decisions counted since the last call.
func (ks *keyState) takeCount() int64 {
	for {
		w := ks.batch.Load()
		if ks.batch.CompareAndSwap(w, w&^countMask) {
			return w & countMask
		}
	}
}

func (ks *keyState) denyUntil(until int64, cost bucket.Tokens) {
	ks.deniedCost.Store(int64(cost))
	ks.deniedUntil.Store(until)
}

// Decide admits or denies cost tokens of key, whose global budget is
// global, at now. The error is non-nil for an invalid limit or cost, a cost
// above the global burst (bucket.ErrNeverFits), a canceled context, and
// ErrFailClosed when the store is unavailable and the rule fails closed.
// A non-empty attemptID makes a retry idempotent: this agent remembers the
// last few hundred attempt ids per key for bucket.DefaultAttemptWindow, and
// the store remembers those it decides across agents.
func (c *Core) Decide(ctx context.Context, now time.Time, key bucket.Key, global bucket.Limit, cost bucket.Tokens, attemptID string) (Result, error) {
	var res Result
	path, ac, err := c.decide(ctx, now, key, &global, cost, attemptID, &res.Decision, &res.Alloc)
	res.Path = path
	res.Hot = ac != nil && ac.hot
	return res, err
}

// decide is Decide writing the decision into d, so that a decision from a
// batch copies nothing it does not have to, and the region's allocation
// into alloc when it is not nil. It returns the path and the key's cached
// allocation (nil for a key decided without state).
func (c *Core) decide(ctx context.Context, now time.Time, key bucket.Key, global *bucket.Limit, cost bucket.Tokens, attemptID string, d *bucket.Decision, alloc *bucket.Limit) (Path, *allocCache, error) {
	if err := bucket.Check(*global, cost); err != nil {
		d.Limit = *global
		return PathNoAllocation, nil, err
	}
	nowUS := now.UnixMicro()
	ks := c.lookup(key)
	if ks == nil {
		path, done, err := c.cold(ctx, now, key, global, cost, attemptID, d, alloc)
		if done {
			return path, nil, err
		}
		ks = c.state(key, nowUS)
	}
	ac := c.allocation(ks, now, *global)
	if alloc != nil {
		*alloc = ac.limit
	}
	if attemptID != "" {
		return c.decideAttempt(ctx, now, nowUS, ks, ac, cost, attemptID, d)
	}
	if ks.held() > 0 || ks.batched.Load() {
		if cost <= ac.limit.Burst() && (nowUS >= ks.deniedUntil.Load() || int64(cost) < ks.deniedCost.Load()) {
			if left, ok := ks.take(cost, true); ok {
				// take counted the decision in the key's batch word; it
				// is folded into the rule's counters at the next sample.
				d.Allowed, d.Remaining, d.Limit = true, bucket.Tokens(left), ac.limit
				return PathBatch, ac, nil
			}
		}
	}
	res, err := c.slow(ctx, now, nowUS, ks, ac, cost, attemptID)
	*d = res.Decision
	return res.Path, ac, err
}

// coldSample: every coldSample-th decision of a key without state gives
// it state, so a key in heavy demand far below its allocation (which the
// store never reports as pressed) is soon tracked and batched, while
// keys in light use keep none.
const coldSample = 64

// cold decides a request for a key with no local state: exactly, in the
// store, keeping no state unless the key needs it — a coordinator entry, an
// attempt id, a failover to drain, the store unavailable (the emergency
// bucket lives in the state), the bucket pressed (denied, or under half
// full: demand to report, denials to cache), or the periodic sample. done
// is false when the caller must decide with state instead; no store call
// was made then.
func (c *Core) cold(ctx context.Context, now time.Time, key bucket.Key, global *bucket.Limit, cost bucket.Tokens, attemptID string, d *bucket.Decision, alloc *bucket.Limit) (Path, bool, error) {
	rs := c.rule(key.Rule)
	lim := *global
	if rs.cfg.Scope == rules.ScopeGlobal {
		var hot bool
		lim, hot, _ = c.alloc.Allocation(now, key, *global)
		if hot {
			return 0, false, nil
		}
	}
	if attemptID != "" || (rs.cfg.EmptyOnFailover && c.failEpoch.Load() > 0) || c.coldCount.Add(1)%coldSample == 0 {
		return 0, false, nil
	}
	// Last: a true answer may make this call the breaker's probe, which
	// must then reach the store and report back.
	if !c.breaker.Allow(now) {
		return 0, false, nil
	}
	if alloc != nil {
		*alloc = lim
	}
	if cost > lim.Burst() {
		*d = bucket.Decision{Limit: lim, RetryAfter: c.cfg.DenyRetry}
		rs.denied[PathNoAllocation].Add(1)
		return PathNoAllocation, true, nil
	}
	dd, err := c.store.Decide(ctx, key, lim, cost, attemptID)
	c.stats.storeOps.Add(1)
	if err != nil {
		if isInputErr(err) || ctx.Err() != nil {
			c.breaker.Success(now)
			d.Limit = lim
			return PathStore, true, err
		}
		c.storeFailed(now, err)
		ks := c.state(key, now.UnixMicro())
		ac := c.allocation(ks, now, *global)
		ks.arrived.Add(int64(cost))
		res, err := c.fallback(now, ks, ac.limit, cost, Result{Alloc: ac.limit, Decision: bucket.Decision{Limit: ac.limit}})
		*d = res.Decision
		return res.Path, true, err
	}
	c.breaker.Success(now)
	*d = dd
	if dd.Allowed {
		rs.admitted[PathStore].Add(1)
	} else {
		rs.denied[PathStore].Add(1)
	}
	if !dd.Allowed || dd.Remaining < lim.Burst()/2 {
		// Pressed: from now on the key has state (its demand is reported
		// and its denials cached).
		ks := c.state(key, now.UnixMicro())
		ks.arrived.Add(int64(cost))
		if !dd.Allowed && dd.RetryAfter > 0 {
			ks.denyUntil(now.Add(dd.RetryAfter).UnixMicro(), cost)
		}
	}
	return PathStore, true, nil
}

// decideAttempt decides a request that carries an attempt id: a retry of
// one this agent decided within the attempt window gets the first answer
// and is not charged again.
func (c *Core) decideAttempt(ctx context.Context, now time.Time, nowUS int64, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string, d *bucket.Decision) (Path, *allocCache, error) {
	ks.mu.Lock()
	if ks.attempts != nil {
		if r, ok := ks.attempts.recall(attemptID, nowUS); ok {
			ks.mu.Unlock()
			*d = r.d
			return r.path, ac, nil
		}
	}
	ks.mu.Unlock()
	var res Result
	if ks.held() > 0 || ks.batched.Load() {
		if cost <= ac.limit.Burst() && (nowUS >= ks.deniedUntil.Load() || int64(cost) < ks.deniedCost.Load()) {
			if left, ok := ks.take(cost, true); ok {
				res = Result{Path: PathBatch, Decision: bucket.Decision{Allowed: true, Remaining: bucket.Tokens(left), Limit: ac.limit}}
			}
		}
	}
	var err error
	if res.Path != PathBatch {
		res, err = c.slow(ctx, now, nowUS, ks, ac, cost, attemptID)
	}
	if err == nil {
		ks.mu.Lock()
		if ks.attempts == nil {
			ks.attempts = &attemptLog{byID: map[string]attemptRec{}}
		}
		ks.attempts.remember(attemptID, attemptRec{d: res.Decision, path: res.Path, expires: nowUS + bucket.DefaultAttemptWindow.Microseconds()})
		ks.mu.Unlock()
	}
	*d = res.Decision
	return res.Path, ac, err
}

// slow is every decision but one from a held batch.
func (c *Core) slow(ctx context.Context, now time.Time, nowUS int64, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string) (Result, error) {
	lim := ac.limit
	res := Result{Hot: ac.hot, Alloc: lim, Decision: bucket.Decision{Limit: lim}}
	// Arrivals are counted for demand on every path but the batch's, whose
	// spending sampleLocked reads off the batch itself.
	if cost > lim.Burst() { // a zero allocation has burst 0
		ks.arrived.Add(int64(cost))
		res.Path, res.Decision.RetryAfter = PathNoAllocation, c.cfg.DenyRetry
		return c.done(ks, res), nil
	}
	if du := ks.deniedUntil.Load(); nowUS < du && int64(cost) >= ks.deniedCost.Load() {
		ks.arrived.Add(int64(cost))
		res.Path = PathDenyCache
		res.Decision.RetryAfter = time.Duration(du-nowUS) * time.Microsecond
		return c.done(ks, res), nil
	}
	if ks.batched.Load() {
		return c.refill(ctx, now, ks, lim, cost, attemptID, res)
	}
	return c.exact(ctx, now, ks, lim, cost, attemptID, res)
}

// done counts res.
func (c *Core) done(ks *keyState, res Result) Result {
	if res.Decision.Allowed {
		ks.rs.Load().admitted[res.Path].Add(1)
	} else {
		ks.rs.Load().denied[res.Path].Add(1)
	}
	return res
}

// isInputErr reports whether err is about the request, not the store.
func isInputErr(err error) bool {
	return errors.Is(err, bucket.ErrInvalidLimit) || errors.Is(err, bucket.ErrInvalidCost) || errors.Is(err, bucket.ErrNeverFits)
}

// exact decides one request in the store.
func (c *Core) exact(ctx context.Context, now time.Time, ks *keyState, lim bucket.Limit, cost bucket.Tokens, attemptID string, res Result) (Result, error) {
	ks.arrived.Add(int64(cost))
	c.sample(ks, now)
	if !c.breaker.Allow(now) {
		return c.fallback(now, ks, lim, cost, res)
	}
	c.drain(ctx, now, ks, lim)
	d, err := c.store.Decide(ctx, ks.key, lim, cost, attemptID)
	c.stats.storeOps.Add(1)
	if err != nil {
		if isInputErr(err) {
			c.breaker.Success(now)
			return res, err
		}
		if ctx.Err() != nil {
			c.breaker.Success(now) // the caller gave up; the store is not to blame
			return res, err
		}
		c.storeFailed(now, err)
		return c.fallback(now, ks, lim, cost, res)
	}
	c.breaker.Success(now)
	if !d.Allowed && d.RetryAfter > 0 {
		ks.denyUntil(now.Add(d.RetryAfter).UnixMicro(), cost)
	}
	res.Decision, res.Path = d, PathStore
	return c.done(ks, res), nil
}

// refill takes a batch for ks from the store and decides the request from
// it. One refill per key runs at a time; a request that finds the batch
// empty while another refills is decided exactly.
func (c *Core) refill(ctx context.Context, now time.Time, ks *keyState, lim bucket.Limit, cost bucket.Tokens, attemptID string, res Result) (Result, error) {
	c.sample(ks, now)
	ks.mu.Lock()
	if ks.refilling {
		ks.mu.Unlock()
		return c.exact(ctx, now, ks, lim, cost, attemptID, res)
	}
	if left, ok := ks.take(cost, false); ok {
		ks.mu.Unlock()
		res.Path = PathBatch
		res.Decision.Allowed, res.Decision.Remaining = true, bucket.Tokens(left)
		return c.done(ks, res), nil
	}
	if !c.breaker.Allow(now) {
		ks.mu.Unlock()
		ks.arrived.Add(int64(cost))
		return c.fallback(now, ks, lim, cost, res)
	}
	want := c.batchSize(ks.rate, lim, cost)
	ks.refilling = true
	ks.mu.Unlock()

	c.drain(ctx, now, ks, lim)
	got, err := c.store.TakeUpTo(ctx, ks.key, lim, want)
	c.stats.storeOps.Add(1)
	ks.mu.Lock()
	ks.refilling = false
	if err == nil {
		ks.batchLimit, ks.takenAt = lim, now.UnixMicro()
		if got > 0 {
			ks.given += int64(got)
			ks.addTokens(int64(got))
		}
	}
	ks.mu.Unlock()
	if err != nil {
		ks.arrived.Add(int64(cost))
		if isInputErr(err) || ctx.Err() != nil {
			c.breaker.Success(now)
			return res, err
		}
		c.storeFailed(now, err)
		return c.fallback(now, ks, lim, cost, res)
	}
	c.breaker.Success(now)
	c.stats.refills.Add(1)
	res.Path = PathStore
	if left, ok := ks.take(cost, false); ok {
		res.Decision.Allowed, res.Decision.Remaining = true, bucket.Tokens(left)
		return c.done(ks, res), nil
	}
	// The regional bucket held fewer than cost tokens: it is empty now.
	// Nothing is asked of it again until a batch's worth has refilled (the
	// tokens wait in the regional bucket meanwhile, up to its burst, so
	// none is lost), which keeps a key over its allocation at a few store
	// calls per batch window.
	ks.arrived.Add(int64(cost))
	held := ks.held()
	retry := time.Duration(max(int64(cost)-held, 1)) * lim.Interval()
	quiet := time.Duration(max(int64(want)-held, 1)) * lim.Interval()
	ks.denyUntil(now.Add(max(retry, quiet)).UnixMicro(), 1)
	res.Decision.RetryAfter = retry
	return c.done(ks, res), nil
}

// batchSize is the next batch for a key: its demand over BatchWindow, at
// least the request's cost, at most BatchMaxFraction of the burst.
func (c *Core) batchSize(rate float64, lim bucket.Limit, cost bucket.Tokens) bucket.Tokens {
	n := bucket.Tokens(rate * c.cfg.BatchWindow.Seconds())
	hi := bucket.Tokens(float64(lim.Burst()) * c.cfg.BatchMaxFraction)
	return max(min(n, hi), cost, 1)
}

// sample takes ks's arrivals into its demand estimates when sampleEvery
// has passed, and decides whether the key is batched. The short-term
// estimate, which sizes batches, rises at once (a flash crowd is batched
// within one sample) and decays with DemandHalfLife. The reported demand is
// a plain moving average with half-life DemandHalfLife, which starts at the
// first window's rate (a key new or idle again is reported at its full rate
// within one window). It does not rise at once: a rise-at-once estimate
// turns every bunch of arrivals in one window (a few costly requests, the
// on-phase of on/off traffic) into a peak a hundred times the key's use,
// the coordinator moves allocations after those peaks, and every move
// costs the region that gains capacity the burst it adds, since an
// increase arrives spent.
func (c *Core) sample(ks *keyState, now time.Time) {
	nowUS := now.UnixMicro()
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

// sampleLocked requires that ks.mu is held.
func (c *Core) sampleLocked(ks *keyState, nowUS int64) {
	dt := nowUS - ks.lastSample
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
	ks.lastSample = nowUS
	ks.winTokens += a
	if w := nowUS - ks.winStart; w >= demandWindow.Microseconds() {
		ks.demand = average(ks.demand, float64(ks.winTokens)/(float64(w)/1e6), w, hl)
		ks.winStart, ks.winTokens = nowUS, 0
	}
	if a > 0 {
		ks.lastActive = nowUS
	}
	batch := ks.rate*c.cfg.BatchWindow.Seconds() >= c.batchMinus
	if ac := ks.alloc.Load(); ac != nil && batch {
		batch = float64(ac.limit.Burst())*c.cfg.BatchMaxFraction >= c.batchMinus
	}
	if batch && !ks.batched.Load() {
		c.hot[hotSlot(ks.key)].Store(ks)
	}
	ks.batched.Store(batch)
}

// storeFailed counts a store failure for the breaker.
func (c *Core) storeFailed(now time.Time, err error) {
	c.stats.storeErrors.Add(1)
	c.lastErr.Store(&err)
	c.breaker.Failure(now)
}

// LastError returns the last store error seen, nil if none.
func (c *Core) LastError() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// fallback decides a request the store could not, by the rule's policy.
func (c *Core) fallback(now time.Time, ks *keyState, lim bucket.Limit, cost bucket.Tokens, res Result) (Result, error) {
	rc := &ks.rs.Load().cfg
	switch rc.OnUnavailable {
	case rules.FailOpen:
		res.Path = PathFailOpen
		res.Decision = bucket.Decision{Allowed: true, Limit: lim}
		return c.done(ks, res), nil
	case rules.Emergency:
		el := emergencyLimit(lim, rc, c.Live())
		res.Path = PathEmergency
		if el.IsZero() || cost > el.Burst() {
			res.Decision = bucket.Decision{Limit: el, RetryAfter: c.cfg.DenyRetry}
			return c.done(ks, res), nil
		}
		ks.mu.Lock()
		d, ns, err := bucket.Decide(ks.emergency, now, el, cost)
		if err == nil {
			ks.emergency = ns
		}
		ks.mu.Unlock()
		if err != nil {
			d = bucket.Decision{Limit: el, RetryAfter: c.cfg.DenyRetry}
		}
		res.Decision = d
		return c.done(ks, res), nil
	}
	res.Path = PathFailClosed
	res.Decision = bucket.Decision{Limit: lim, RetryAfter: c.cfg.BreakerBackoff}
	c.done(ks, res)
	return res, ErrFailClosed
}

// drain empties ks's bucket once per detected failover, for rules with
// EmptyOnFailover: what the bucket holds beyond what it would hold had it
// been empty at the failover is taken and discarded. Agents that race only
// drain more, never less.
func (c *Core) drain(ctx context.Context, now time.Time, ks *keyState, lim bucket.Limit) {
	if !ks.rs.Load().cfg.EmptyOnFailover {
		return
	}
	ep := c.failEpoch.Load()
	if ep == 0 {
		return
	}
	ks.mu.Lock()
	if ks.drained == ep {
		ks.mu.Unlock()
		return
	}
	ks.drained = ep
	ks.mu.Unlock()
	elapsed := now.UnixMicro() - c.failAt.Load()
	iv := lim.Interval().Microseconds()
	if iv <= 0 {
		return
	}
	refilled := bucket.Tokens(max(elapsed, 0) / iv)
	if refilled >= lim.Burst() {
		return
	}
	d, err := c.store.Peek(ctx, ks.key, lim)
	c.stats.storeOps.Add(1)
	if err != nil {
		return
	}
	if excess := d.Remaining - refilled; excess > 0 {
		got, err := c.store.TakeUpTo(ctx, ks.key, lim, excess)
		c.stats.storeOps.Add(1)
		if err == nil {
			c.stats.drains.Add(1)
			c.stats.drained.Add(int64(got))
		}
	}
}

// Tick does the core's periodic work at now: it samples every key's
// demand, gives back batch tokens that grew stale (BatchTTL) or that a
// shrunk allocation no longer covers, and drops keys idle for IdleAfter.
// Store calls are made in key order, so a deterministic store sees a
// deterministic sequence.
func (c *Core) Tick(ctx context.Context, now time.Time) {
	c.tickMu.Lock()
	defer c.tickMu.Unlock()
	nowUS := now.UnixMicro()
	ret := c.tickBuf[:0]
	for i := range c.shards {
		s := &c.shards[i]
		var idle []bucket.Key
		s.mu.RLock()
		for k, ks := range s.keys {
			ks.mu.Lock()
			c.sampleLocked(ks, nowUS)
			stale := ks.held() > 0 && !ks.refilling && nowUS-ks.takenAt > c.cfg.BatchTTL.Microseconds()
			if ks.held() > 0 && !ks.refilling && !stale {
				ac := c.allocation(ks, now, ks.allocGlobal())
				stale = ac.limit != ks.batchLimit && ac.limit.Count() < ks.batchLimit.Count()
			}
			if stale {
				ret = append(ret, ks)
			} else if ks.held() == 0 && !ks.refilling && nowUS-ks.lastActive > c.cfg.IdleAfter.Microseconds() {
				idle = append(idle, k)
			}
			ks.mu.Unlock()
		}
		s.mu.RUnlock()
		if len(idle) > 0 {
			s.mu.Lock()
			for _, k := range idle {
				if ks := s.keys[k]; ks != nil && ks.held() == 0 && ks.arrived.Load() == 0 {
					c.hot[hotSlot(k)].CompareAndSwap(ks, nil)
					delete(s.keys, k)
					ks.gone.Store(true)
					c.stats.keys.Add(-1)
					c.keysVer.Add(1)
				}
			}
			// A lookup that already read the old copy may still use a
			// dropped key's state once; at worst a batch it takes is
			// never spent, which only under-admits.
			s.publishLocked()
			s.mu.Unlock()
		}
	}
	slices.SortFunc(ret, func(a, b *keyState) int { return cmpKey(a.key, b.key) })
	for _, ks := range ret {
		c.giveBack(ctx, now, ks)
	}
	clear(ret)
	c.tickBuf = ret[:0]
}

// allocGlobal is the global limit the key was last decided under.
func (ks *keyState) allocGlobal() bucket.Limit {
	if ac := ks.alloc.Load(); ac != nil {
		return ac.global
	}
	return bucket.Limit{}
}

// giveBack returns ks's batch tokens to the regional bucket under the key's
// current allocation. Tokens that cannot be returned are lost, which only
// ever under-admits.
func (c *Core) giveBack(ctx context.Context, now time.Time, ks *keyState) {
	ks.mu.Lock()
	n := ks.takeAll()
	ks.back += max(n, 0)
	lim := ks.batchLimit
	ks.mu.Unlock()
	if n <= 0 {
		return
	}
	if g := ks.allocGlobal(); !g.IsZero() {
		if ac := c.allocation(ks, now, g); !ac.limit.IsZero() {
			lim = ac.limit
		}
	}
	if lim.IsZero() || !c.breaker.Allow(now) {
		return
	}
	err := c.store.Return(ctx, ks.key, lim, bucket.Tokens(n))
	c.stats.storeOps.Add(1)
	if err != nil {
		if !isInputErr(err) {
			c.storeFailed(now, err)
		}
		return
	}
	c.breaker.Success(now)
	c.stats.returns.Add(1)
	c.stats.returned.Add(n)
}

// Shutdown gives back every batch token, for a clean stop.
func (c *Core) Shutdown(ctx context.Context, now time.Time) {
	var all []*keyState
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for _, ks := range s.keys {
			if ks.held() > 0 {
				all = append(all, ks)
			}
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(all, func(a, b *keyState) int { return cmpKey(a.key, b.key) })
	for _, ks := range all {
		c.giveBack(ctx, now, ks)
	}
}

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

func cmpKey(a, b bucket.Key) int {
	if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
		return c
	}
	return cmp.Compare(a.Subject, b.Subject)
}

// Stats counts what a Core has done.
type Stats struct {
	// StoreOps is every call to the store; StoreErrors those that failed.
	StoreOps, StoreErrors int64
	// Refills is batches taken; Returns and Returned the give-backs and the
	// tokens they returned.
	Refills, Returns, Returned int64
	// Drains and Drained are buckets emptied after failovers and the tokens
	// taken; Failovers the failovers recorded.
	Drains, Drained, Failovers int64
	// BreakerOpened is how many times the breaker opened.
	BreakerOpened int64
	// Keys is the keys with local state.
	Keys int64
	// Rules holds per-rule counts by path, sorted by rule.
	Rules []RuleStats
}

// RuleStats counts one rule's decisions by path.
type RuleStats struct {
	Rule     string
	Policy   rules.FailurePolicy
	Admitted [numPaths]int64
	Denied   [numPaths]int64
}

// Stats returns the counters. Decisions from batches reach the per-rule
// counts at each key's next sample (Tick samples every key).
func (c *Core) Stats() Stats {
	s := &c.stats
	st := Stats{
		StoreOps: s.storeOps.Load(), StoreErrors: s.storeErrors.Load(), Refills: s.refills.Load(),
		Returns: s.returns.Load(), Returned: s.returned.Load(), Drains: s.drains.Load(), Drained: s.drained.Load(),
		Failovers: s.failovers.Load(), BreakerOpened: c.breaker.Opened(), Keys: s.keys.Load(),
	}
	for name, rs := range *c.rules.Load() {
		r := RuleStats{Rule: name, Policy: rs.cfg.OnUnavailable}
		for i := range rs.admitted {
			r.Admitted[i] = rs.admitted[i].Load()
			r.Denied[i] = rs.denied[i].Load()
		}
		st.Rules = append(st.Rules, r)
	}
	slices.SortFunc(st.Rules, func(a, b RuleStats) int { return cmp.Compare(a.Rule, b.Rule) })
	return st
}

// Total sums a RuleStats over paths.
func (r RuleStats) Total() (admitted, denied int64) {
	for i := range r.Admitted {
		admitted += r.Admitted[i]
		denied += r.Denied[i]
	}
	return admitted, denied
}
