package region

import (
	"cmp"
	"context"
	"hash/maphash"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// coreShard holds the state of the keys that hash to it. keys, under mu,
// is every key; read is a copy of it that lookups use without a lock. A
// key created under mu goes into read in place while read stays at most
// half full, so read never lags keys and a key in neither, the common case
// of a cold key, is found missing without the lock. read is copied anew
// only when it would pass half full (its size doubling, so copies cost a
// constant per key created) or when keys are dropped.
type coreShard struct {
	read atomic.Pointer[readTable]
	mu   sync.RWMutex
	keys map[bucket.Key]*keyState
	_    [24]byte // keep shards on separate cache lines (64 bytes each)
}

// readTable is a shard's keys in an open-addressed table indexed by the
// hash the core already took of the key (Core.hash), so a lookup hashes
// the key once, not again as a map would. Its slots only ever go from
// empty to filled, so a lookup that reads it while a key is added finds
// every key added before, and an empty slot still ends a probe.
type readTable struct {
	mask  uint64
	slots []readSlot
	used  int // filled slots; written and read under the shard's mu only
}

// readSlot is a key's place in a readTable. h is written before ks is
// stored, and read only after ks is loaded non-nil, so the atomic store of
// ks publishes h.
type readSlot struct {
	h  uint64
	ks atomic.Pointer[keyState]
}

// find returns the state of key, whose hash is h; nil when the table does
// not hold it.
func (t *readTable) find(h uint64, key *bucket.Key) *keyState {
	for i := h & t.mask; ; i = (i + 1) & t.mask {
		sl := &t.slots[i]
		ks := sl.ks.Load()
		if ks == nil {
			return nil
		}
		if sl.h == h && ks.key == *key {
			return ks
		}
	}
}

// put fills the first empty slot of ks's probe sequence. Requires that
// the shard's mu is held and that the table has an empty slot.
func (t *readTable) put(ks *keyState) {
	i := ks.h & t.mask
	for t.slots[i].ks.Load() != nil {
		i = (i + 1) & t.mask
	}
	t.slots[i].h = ks.h
	t.slots[i].ks.Store(ks)
	t.used++
}

// addLocked adds ks, just put in keys, to read: in place while read stays
// at most half full (a miss then ends within a probe or two), by a new
// copy otherwise. Requires that s.mu is held.
func (s *coreShard) addLocked(ks *keyState) {
	if t := s.read.Load(); t != nil && 2*(t.used+1) <= len(t.slots) {
		t.put(ks)
		return
	}
	s.publishLocked()
}

// publishLocked makes read a new copy of keys, at most half full. Requires
// that s.mu is held.
func (s *coreShard) publishLocked() {
	n := 8
	for n < 2*len(s.keys) {
		n <<= 1
	}
	t := &readTable{mask: uint64(n - 1), slots: make([]readSlot, n)} // #nosec G115 -- n >= 8
	for _, ks := range s.keys {
		t.put(ks)
	}
	s.read.Store(t)
}

// keyState is what an agent keeps for one key in recent use.
type keyState struct {
	// What a decision from a batch touches comes first, in 57 bytes, to
	// share one cache line (two, for a state not aligned to one): the key,
	// which the lookup compares, and what fromBatch reads. The
	// compare-and-swap on tokens brings the line in, and the rest are then
	// hits rather than further cache-line transfers between cores. batch
	// packs the batch tokens held (debited from the regional bucket) above
	// countBits, and the decisions admitted from them since the last
	// sample below, so a decision from the batch is one compare-and-swap.
	batch       atomic.Int64
	key         bucket.Key
	deniedUntil atomic.Int64 // µs: requests of cost ≥ deniedCost are denied locally until then
	alloc       atomic.Pointer[allocCache]
	batched     atomic.Bool // local demand is large enough to batch
	// gone is set when the state is dropped from its shard, for the demand
	// order, which may still list it until it is rebuilt.
	gone       atomic.Bool
	refilling  bool         // under mu
	listed     bool         // under Core.batchedMu: in Core.batchedKeys
	arrived    atomic.Int64 // tokens asked since the last sample
	deniedCost atomic.Int64
	rs         atomic.Pointer[ruleState]
	h          uint64 // Core.hash of key

	// Next, what every sample touches (Tick samples every key every tick),
	// so that a tick brings in few cache lines per key; what only a
	// refill, a denial, an outage or an attempt id touches comes last.
	mu sync.Mutex
	// lastSample (µs) is written under mu and read without it too, so
	// that a decision within sampleEvery of the last sample skips the lock.
	lastSample atomic.Int64
	takenAt    int64   // µs of the last refill
	rate       float64 // short-term demand, tokens per second: sizes batches
	winStart   int64   // µs: start of the current demand window
	winTokens  int64   // tokens asked in the current demand window
	lastActive int64   // µs of the last sample with arrivals
	given      int64   // tokens ever added to the batch
	back       int64   // tokens ever taken out of the batch unspent (returned or lost)
	lastSpent  int64   // given − back − held at the last sample
	// demand is the reported demand, over windows from winStart.
	demand demandEstimate

	// deniedReset is when (µs) the regional bucket will be full again, as
	// the denial that set deniedUntil said: the deny cache answers with it,
	// so a repeated denial states the same reset as the first.
	deniedReset atomic.Int64
	batchLimit  bucket.Limit // the allocation the held tokens were taken under
	// dryUntil is when (µs) a batch's worth is back in the regional
	// bucket after the refill at takenAt emptied it; under mu.
	dryUntil  int64
	emergency bucket.State
	// emergencyFrom is the µs instant the outage the emergency bucket
	// serves began (the breaker's opening): a later outage starts it empty
	// again.
	emergencyFrom int64
	drained       uint64      // failover epoch this key was emptied for
	attempts      *attemptLog // recent attempt ids decided here; nil until one is seen
}

// allocCache is a key's allocation as last computed, valid while the
// allocation epoch is epoch and until has not passed. Only epoch ever
// changes once it is published (Core.allocation).
type allocCache struct {
	// What fromBatch reads comes first: epoch, until, global's count,
	// period and burst, limit's burst and tau.
	epoch  atomic.Uint64
	until  int64 // µs
	global bucket.Limit
	// limit is what this agent enforces in the regional bucket: the
	// region's allocation full, or its share of the agents that reach the
	// store while peers are cut (Core.regional).
	limit bucket.Limit
	full  bucket.Limit
	hot   bool
}

// hotSlots is the size of the hot-key cache: room for the keys in heavy
// use of a busy agent (a key in none of them is found in its shard's copy).
const hotSlots = 1024

// hash is the key's hash, for its shard and its slot in the hot-key cache.
// Rules are told apart by their names' lengths only, which costs nothing;
// keys that collide in a slot are found in their shards' copies.
func (c *Core) hash(k *bucket.Key) uint64 {
	return maphash.String(c.seed, k.Subject) + uint64(len(k.Rule))*0x9E3779B97F4A7C15
}

// slot is the key of hash h's place in the hot-key cache.
func (c *Core) slot(h uint64) *atomic.Pointer[keyState] { return &c.hot[h%hotSlots] }

func (c *Core) shard(h uint64) *coreShard { return &c.shards[(h>>10)&c.mask] }

// lookup returns key's state, nil when the key has none. It reads key in
// place: the decision path passes the key by pointer to copy it once.
func (c *Core) lookup(key *bucket.Key) *keyState {
	h := c.hash(key)
	if ks := c.slot(h).Load(); ks != nil && ks.key == *key {
		return ks
	}
	if t := c.shard(h).read.Load(); t != nil {
		return t.find(h, key)
	}
	return nil
}

// state returns key's state, creating it on first use.
func (c *Core) state(key bucket.Key, now int64) *keyState {
	if ks := c.lookup(&key); ks != nil {
		return ks
	}
	h := c.hash(&key)
	s := c.shard(h)
	s.mu.Lock()
	defer s.mu.Unlock()
	if ks := s.keys[key]; ks != nil {
		return ks
	}
	ks := &keyState{key: key, h: h, lastActive: now, winStart: now}
	ks.lastSample.Store(now)
	ks.rs.Store(c.rule(key.Rule))
	s.keys[key] = ks
	s.addLocked(ks)
	c.stats.keys.Add(1)
	c.newMu.Lock()
	c.newKeys = append(c.newKeys, ks)
	c.newMu.Unlock()
	return ks
}

// allocation returns the key's allocation at now, from the key's cache
// while it holds.
func (c *Core) allocation(ks *keyState, now time.Time, nowUS int64, global *bucket.Limit) *allocCache {
	// Both epochs only grow, so their sum changes whenever either does.
	ep := c.alloc.Epoch() + c.scaleEpoch.Load()
	old := ks.alloc.Load()
	var oldEp uint64
	if old != nil {
		oldEp = old.epoch.Load()
		if oldEp == ep && nowUS < old.until && old.global.Same(global) {
			return old
		}
	}
	full, hot, until := *global, false, int64(math.MaxInt64)
	rc := &ks.rs.Load().cfg
	if rc.Scope == rules.ScopeGlobal {
		l, h, u := c.alloc.Allocation(now, ks.key, *global)
		full, hot, until = l, h, u.UnixMicro()
	}
	limit := c.regional(full, rc)
	// An epoch moves for every key when a new table changes some keys'
	// entries; most keys then get the answer they had. Their cached one is
	// marked current in place, not replaced by a copy: its other fields
	// never change, and a concurrent refresh that moved the epoch first
	// makes the swap fail, leaving this one to replace it as below.
	if old != nil && oldEp < ep && old.until == until && old.hot == hot && old.global.Same(global) &&
		old.full.Same(&full) && old.limit.Same(&limit) && old.epoch.CompareAndSwap(oldEp, ep) {
		return old
	}
	ac := &allocCache{global: *global, limit: limit, full: full, hot: hot, until: until}
	ac.epoch.Store(ep)
	if old := ks.alloc.Swap(ac); old != nil && ac.limit.Count() > old.limit.Count() {
		// A denial remembered under a smaller allocation may no longer
		// hold.
		ks.deniedUntil.Store(0)
	}
	return ac
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

// denyUntil caches a denial of ks: requests of at least cost are denied
// locally until the instant until (µs), and told that the bucket is full
// again at reset (µs). A key denied is in heavy demand, as a batched one
// is, so it takes its place in the hot-key cache: the denials that follow
// skip the lookup in its shard.
func (c *Core) denyUntil(ks *keyState, until, reset int64, cost bucket.Tokens) {
	ks.deniedReset.Store(reset)
	ks.deniedCost.Store(int64(cost))
	ks.deniedUntil.Store(until)
	c.promote(ks)
}

// promote puts ks in the hot-key cache, writing the slot only when it holds
// another key, so that keys in use from many goroutines do not pass its
// cache line between cores.
func (c *Core) promote(ks *keyState) {
	if slot := c.slot(ks.h); slot.Load() != ks {
		slot.Store(ks)
		// Tick marks a dropped key gone before it clears its slot: one of
		// the two sees the other's write, so no dropped key stays cached.
		if ks.gone.Load() {
			slot.CompareAndSwap(ks, nil)
		}
	}
}

// Tick does the core's periodic work at now: it probes the store while
// the breaker is not closed (so the store's return is noticed with or
// without traffic), samples every key's demand, gives back batch tokens that grew stale (BatchTTL) or that a
// shrunk allocation no longer covers, and drops keys idle for IdleAfter.
// Store calls are made in key order, so a deterministic store sees a
// deterministic sequence.
func (c *Core) Tick(ctx context.Context, now time.Time) { c.TickSampled(ctx, now, nil) }

// TickSampled is Tick, calling sampled (when not nil) once every key's
// demand is sampled at now and before the batch tokens go back: a driver
// that reports the demand (Demand) from sampled stores a report as fresh
// as the samples, where after Tick it waited for those calls to the store.
// Under a slow store that wait was a round trip per key given back, most
// often in a region whose allocation just shrank, whose fall of demand
// another region waits for.
func (c *Core) TickSampled(ctx context.Context, now time.Time, sampled func()) {
	c.tickMu.Lock()
	defer c.tickMu.Unlock()
	c.Probe(ctx, now)
	nowUS := now.UnixMicro()
	ret := c.tickBuf[:0]
	for i := range c.shards {
		s := &c.shards[i]
		var idle []bucket.Key
		s.mu.RLock()
		// read holds exactly the keys of keys while mu is held; walking
		// its slots is cheaper than walking the map.
		var slots []readSlot
		if t := s.read.Load(); t != nil {
			slots = t.slots
		}
		for i := range slots {
			ks := slots[i].ks.Load()
			if ks == nil {
				continue
			}
			ks.mu.Lock()
			c.sampleLocked(ks, nowUS)
			stale := ks.held() > 0 && !ks.refilling && nowUS-ks.takenAt > c.cfg.BatchTTL.Microseconds()
			if ks.held() > 0 && !ks.refilling && !stale {
				g := ks.allocGlobal()
				ac := c.allocation(ks, now, nowUS, &g)
				stale = ac.limit != ks.batchLimit && ac.limit.Count() < ks.batchLimit.Count()
			}
			if stale {
				ret = append(ret, ks)
			} else if ks.held() == 0 && !ks.refilling && nowUS-ks.lastActive > c.cfg.IdleAfter.Microseconds() {
				idle = append(idle, ks.key)
			}
			ks.mu.Unlock()
		}
		s.mu.RUnlock()
		if len(idle) > 0 {
			s.mu.Lock()
			for _, k := range idle {
				if ks := s.keys[k]; ks != nil && ks.held() == 0 && ks.arrived.Load() == 0 {
					ks.gone.Store(true)
					c.slot(ks.h).CompareAndSwap(ks, nil)
					delete(s.keys, k)
					c.stats.keys.Add(-1)
					c.dropped.Add(1)
				}
			}
			// A lookup that already read the old copy may still use a
			// dropped key's state once; at worst a batch it takes is
			// never spent, which only under-admits.
			s.publishLocked()
			s.mu.Unlock()
		}
	}
	if sampled != nil {
		sampled()
	}
	slices.SortFunc(ret, func(a, b *keyState) int { return cmpKey(a.key, b.key) })
	for _, ks := range ret {
		c.giveBack(ctx, now, ks)
	}
	clear(ret)
	c.tickBuf = ret[:0]
	c.pruneBatched()
}

// allocGlobal is the global limit the key was last decided under.
func (ks *keyState) allocGlobal() bucket.Limit {
	if ac := ks.alloc.Load(); ac != nil {
		return ac.global
	}
	return bucket.Limit{}
}

func cmpKey(a, b bucket.Key) int {
	if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
		return c
	}
	return cmp.Compare(a.Subject, b.Subject)
}
