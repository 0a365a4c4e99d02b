package region

import (
	"errors"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Core is an agent's deterministic decision core: the region's allocation
// per key, enforced in the regional store, with token batches for keys in
// heavy local demand, the rule's failure policy and a circuit breaker when
// the store fails, and buckets started empty after a detected Redis
// failover. Time is an argument of every method; Core starts no goroutines
// and reads no clock. Its only I/O is calls to its bucket.Store, made
// synchronously by the caller's goroutine.
//
// The hot path (a key deciding from its batch) takes no lock and allocates
// nothing: a lookup in a lock-free copy of the key's shard, a cached
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
	// key, so the busiest keys skip the lookup in their shard.
	hot [hotSlots]atomic.Pointer[keyState]
	// batchedKeys lists every key that turned batched, until Tick's
	// prune finds it no longer batched or dropped: SampleHot
	// samples them all, where a slot of the hot-key cache holds one of
	// the keys whose hashes share it. sampleBuf is SampleHot's copy.
	batchedMu   sync.Mutex
	batchedKeys []*keyState
	sampleMu    sync.Mutex // serializes SampleHot, which owns sampleBuf
	sampleBuf   []*keyState

	rulesMu sync.Mutex
	rules   atomic.Pointer[map[string]*ruleState]

	live atomic.Int64
	// peersCut is how many live agents of the region other than this one
	// announce that they cannot reach the regional store (they decide by
	// their emergency buckets); scaleEpoch changes with it, so cached
	// allocations are recomputed.
	peersCut   atomic.Int64
	scaleEpoch atomic.Uint64
	coldCount  atomic.Uint64
	// Demand lists keys in the order of demandOrder, sorted by key, into
	// which the keys created since (newKeys) are merged and from which the
	// dropped ones are taken, so a report does not sort every key on every
	// tick. dropped counts keys dropped since.
	demandMu    sync.Mutex // held by Demand; taken before newMu
	demandOrder []*keyState
	spareOrder  []*keyState
	newMu       sync.Mutex // guards newKeys; taken under a shard's mu
	newKeys     []*keyState
	dropped     atomic.Int64
	failEpoch   atomic.Uint64
	failAt      atomic.Int64 // µs
	lastErr     atomic.Pointer[error]
	stats       coreStats
	tickBuf     []*keyState
	tickMu      sync.Mutex
	batchMinus  float64 // MinBatch as a float, cached
	// leveled receives (without blocking) when a global key's reported
	// demand took a new level (Leveled).
	leveled chan struct{}
}

// ruleState is a rule's configuration and counters.
type ruleState struct {
	name     string
	cfg      RuleConfig
	admitted [numPaths]atomic.Int64
	denied   [numPaths]atomic.Int64
}

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
	br := cfg.Breaker
	if br == nil {
		var err error
		if br, err = breaker.New(cfg.BreakerConfig()); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	c := &Core{
		cfg:        cfg,
		store:      store,
		alloc:      alloc,
		breaker:    br,
		seed:       maphash.MakeSeed(),
		leveled:    make(chan struct{}, 1),
		mask:       uint64(n - 1), // #nosec G115 -- n >= 1
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
func (c *Core) SetLive(n int) {
	if int64(max(n, 1)) != c.live.Swap(int64(max(n, 1))) && c.peersCut.Load() > 0 {
		c.scaleEpoch.Add(1)
	}
}

// SetPeersCut sets how many live agents of the region, this one aside,
// announce that they cannot reach the regional store. Each of them admits
// up to the region's allocation ÷ live agents from its emergency bucket
// (rules with the emergency policy), so the others take that share from
// the region's allocation instead of adding it on top: they decide the
// keys of those rules in the regional bucket at allocation × (live − n) ÷
// live, count and burst rounded down.
func (c *Core) SetPeersCut(n int) {
	n = max(n, 0)
	if int64(n) != c.peersCut.Swap(int64(n)) {
		c.scaleEpoch.Add(1)
	}
}

// PeersCut returns what SetPeersCut last set.
func (c *Core) PeersCut() int { return int(c.peersCut.Load()) }

// regional is the limit this agent enforces in the regional bucket for a
// key whose region's allocation is a: a itself, or for an emergency rule
// while peers are cut, a's share of the agents that still reach the store.
func (c *Core) regional(a bucket.Limit, rc *RuleConfig) bucket.Limit {
	cut := c.peersCut.Load()
	if cut == 0 || rc.OnUnavailable != rules.Emergency || a.IsZero() {
		return a
	}
	live := c.live.Load()
	if cut >= live {
		return bucket.Limit{}
	}
	n := a.Count() * bucket.Tokens(live-cut) / bucket.Tokens(live)
	b := a.Burst() * bucket.Tokens(live-cut) / bucket.Tokens(live)
	if n <= 0 || b <= 0 {
		return bucket.Limit{}
	}
	return bucket.Per(n, a.Period()).WithBurst(b)
}

// Live returns the number of live agents the core divides by.
func (c *Core) Live() int { return int(c.live.Load()) }

// Breaker returns the core's circuit breaker on the store.
func (c *Core) Breaker() *Breaker { return c.breaker }

// Allocations returns the allocation source.
func (c *Core) Allocations() Allocations { return c.alloc }
