package bucket

import (
	"context"
	"fmt"
	"hash/maphash"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/clock"
)

// MemoryOptions configures an in-process store.
type MemoryOptions struct {
	// Clock supplies now; the simulator and tests pass a clock.Manual.
	Clock clock.Clock // default clock.Real{}
	// Shards splits the buckets over independently locked maps so that
	// concurrent callers on different keys rarely contend.
	Shards int // default 64; rounded up to a power of two
	// AttemptWindow is how long an attempt id's decision is remembered.
	AttemptWindow time.Duration // default DefaultAttemptWindow
	// MaxKeys bounds the buckets held. At the bound, buckets that are full
	// again (the same as absent) are swept, and a new key that still finds
	// no room is refused with ErrFull, which wraps ErrUnavailable, so the
	// rule's failure policy decides. A bucket that is not full is never
	// evicted: that would forget its debits and admit them again.
	MaxKeys int // default DefaultMaxKeys; < 0: no bound
	// MaxAttempts bounds the attempt records held. At the bound a decision
	// is still made but its attempt id is not remembered: a retry is then
	// charged again, which can only deny more, never admit more.
	MaxAttempts int // default DefaultMaxKeys; < 0: no bound
}

// DefaultMaxKeys is the default bound on an in-process store's buckets and
// on its attempt records: each costs about 100 bytes plus its subject, so a
// million is some hundreds of megabytes at most.
const DefaultMaxKeys = 1_000_000

// ErrFull: the in-process store holds MaxKeys buckets that are not full and
// cannot take a new key. It wraps ErrUnavailable.
var ErrFull = fmt.Errorf("bucket: in-process store full: %w", ErrUnavailable)

// DefaultMemoryOptions returns the options NewMemory uses for zero fields.
func DefaultMemoryOptions() MemoryOptions {
	return MemoryOptions{
		Clock:         clock.Real{},
		Shards:        64, // enough to spread 2–64 cores' worth of callers
		AttemptWindow: DefaultAttemptWindow,
		MaxKeys:       DefaultMaxKeys,
		MaxAttempts:   DefaultMaxKeys,
	}
}

// Memory is an in-process Store with the same semantics as the Redis store:
// one GCRA state per key, sharded for concurrency. A bucket whose TAT has
// passed is full, which is the same as absent, so idle buckets are dropped by
// a sweep that each shard runs every sweepEvery operations; memory follows
// the keys in use, not every key ever seen. Memory is safe for concurrent use.
type Memory struct {
	clock  clock.Clock
	seed   maphash.Seed
	mask   uint64
	window int64 // µs
	shards []memShard

	maxKeys, maxAttempts int64 // ≤ 0: no bound
	keys, attempts       atomic.Int64
	refused, unrecorded  atomic.Int64
	capSweeps            atomic.Int64
	lastCapSweep         atomic.Int64 // µs
}

const sweepEvery = 4096

// capSweepEvery is the least time between two sweeps of the whole store
// made because it is at MaxKeys: a sweep visits every bucket, so refused
// requests must not each pay for one.
const capSweepEvery = int64(time.Second / time.Microsecond)

type memShard struct {
	mu sync.Mutex
	m  *Memory // for the store-wide counts
	// buckets is keyed by the key's 64-bit hash, already computed to pick
	// the shard, so a lookup hashes the key once; keys whose hashes collide
	// share a chain.
	buckets   map[uint64]*memEntry
	n         int // entries in buckets
	attempts  map[attemptKey]attemptRecord
	ops       uint32
	lastSweep int64
	_         [32]byte // keep shards on separate cache lines
}

type memEntry struct {
	key  Key
	st   State
	next *memEntry // another key with the same hash
}

type attemptKey struct {
	key Key
	id  string
}

type attemptRecord struct {
	d       Decision
	expires int64 // µs
}

var (
	_ Store   = (*Memory)(nil)
	_ Rebaser = (*Memory)(nil)
)

// NewMemory returns an in-process store.
func NewMemory(opts MemoryOptions) *Memory {
	def := DefaultMemoryOptions()
	if opts.Clock == nil {
		opts.Clock = def.Clock
	}
	if opts.Shards <= 0 {
		opts.Shards = def.Shards
	}
	if opts.AttemptWindow <= 0 {
		opts.AttemptWindow = def.AttemptWindow
	}
	if opts.MaxKeys == 0 {
		opts.MaxKeys = def.MaxKeys
	}
	if opts.MaxAttempts == 0 {
		opts.MaxAttempts = def.MaxAttempts
	}
	n := 1
	for n < opts.Shards {
		n <<= 1
	}
	m := &Memory{
		clock:  opts.Clock,
		seed:   maphash.MakeSeed(),
		mask:   uint64(n - 1), // #nosec G115 -- n >= 1
		window: opts.AttemptWindow.Microseconds(),
		shards: make([]memShard, n),

		maxKeys: int64(opts.MaxKeys), maxAttempts: int64(opts.MaxAttempts),
	}
	for i := range m.shards {
		m.shards[i].m = m
		m.shards[i].buckets = make(map[uint64]*memEntry)
		m.shards[i].attempts = make(map[attemptKey]attemptRecord)
	}
	return m
}

// shard returns the shard that holds k and k's hash.
func (m *Memory) shard(k Key) (*memShard, uint64) {
	h := maphash.String(m.seed, k.Subject) ^ maphash.String(m.seed, k.Rule)*0x9E3779B97F4A7C15
	return &m.shards[(h>>7)&m.mask], h
}

// Decide implements Store.
func (m *Memory) Decide(_ context.Context, key Key, l Limit, cost Tokens, attemptID string) (Decision, error) {
	if err := Check(l, cost); err != nil {
		return Decision{Limit: l}, err
	}
	now := m.clock.Now().UnixMicro()
	s, h := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick(now)
	var ak attemptKey
	if attemptID != "" {
		ak = attemptKey{key, attemptID}
		if r, ok := s.attempts[ak]; ok && r.expires > now {
			return r.d, nil
		}
	}
	var d Decision
	if e := s.find(h, key); e != nil {
		decideIn(&e.st, now, &l, cost, &d) // in place: the common path copies no state
		if e.st == (State{}) {
			s.remove(h, e)
		}
	} else {
		var ns State
		decideIn(&ns, now, &l, cost, &d)
		if ns != (State{}) && !m.room(s, now) {
			return Decision{Limit: l}, ErrFull
		}
		s.put(h, key, nil, State{}, ns)
	}
	if attemptID != "" {
		s.remember(ak, attemptRecord{d: d, expires: now + m.window})
	}
	return d, nil
}

// TakeUpTo implements Store.
func (m *Memory) TakeUpTo(_ context.Context, key Key, l Limit, n Tokens) (Tokens, error) {
	if err := Check(l, 1); err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, errCost(n)
	}
	now := m.clock.Now().UnixMicro()
	s, h := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tick(now)
	p, st := s.get(h, key)
	got, _, ns := takeUpTo(st, now, &l, n)
	if p == nil && ns != (State{}) && !m.room(s, now) {
		return 0, ErrFull
	}
	s.put(h, key, p, st, ns)
	return got, nil
}

// Return implements Store. It is never refused at MaxKeys: giving tokens
// back to an absent bucket, which is full, stores nothing.
func (m *Memory) Return(_ context.Context, key Key, l Limit, n Tokens) error {
	if err := Check(l, 1); err != nil {
		return err
	}
	if n <= 0 {
		return errCost(n)
	}
	now := m.clock.Now().UnixMicro()
	s, h := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	p, st := s.get(h, key)
	_, ns := giveBack(st, now, &l, n)
	s.put(h, key, p, st, ns)
	return nil
}

// Rebase implements Rebaser, the credit given back under the same lock.
// Like Return it is never refused at MaxKeys: refusing to apply a limit
// change would leave the bucket judged by the old limit.
func (m *Memory) Rebase(_ context.Context, key Key, from, to Limit, credit Tokens) (Tokens, error) {
	if err := checkRebase(from, to); err != nil {
		return 0, err
	}
	if credit < 0 {
		return 0, errCost(credit)
	}
	now := m.clock.Now().UnixMicro()
	s, h := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	p, st := s.get(h, key)
	ns, lost := rebase(st, now, &from, &to)
	if credit > 0 {
		_, ns = giveBack(ns, now, &to, credit)
	}
	s.put(h, key, p, st, ns)
	return lost, nil
}

// Peek implements Store.
func (m *Memory) Peek(_ context.Context, key Key, l Limit) (Decision, error) {
	if err := Check(l, 1); err != nil {
		return Decision{Limit: l}, err
	}
	now := m.clock.Now().UnixMicro()
	s, h := m.shard(key)
	s.mu.Lock()
	defer s.mu.Unlock()
	_, st := s.get(h, key)
	return peek(st, now, &l), nil
}

// find returns key's entry, or nil. Requires that s.mu is held.
func (s *memShard) find(h uint64, key Key) *memEntry {
	for e := s.buckets[h]; e != nil; e = e.next {
		if e.key == key {
			return e
		}
	}
	return nil
}

// get returns key's entry (nil if absent) and its state. Requires that
// s.mu is held.
func (s *memShard) get(h uint64, key Key) (*memEntry, State) {
	if e := s.find(h, key); e != nil {
		return e, e.st
	}
	return nil, State{}
}

// room reports whether s may take one more bucket, sweeping the whole
// store first (at most once per capSweepEvery) when it is at MaxKeys.
// Requires that s.mu is held; it takes the other shards' locks one at a
// time, and only one caller sweeps at once, so no two callers wait on each
// other.
func (m *Memory) room(s *memShard, now int64) bool {
	if m.maxKeys <= 0 || m.keys.Load() < m.maxKeys {
		return true
	}
	last := m.lastCapSweep.Load()
	if now-last >= capSweepEvery && m.lastCapSweep.CompareAndSwap(last, now) {
		m.capSweeps.Add(1)
		for i := range m.shards {
			o := &m.shards[i]
			if o != s {
				o.mu.Lock()
			}
			o.sweep(now)
			if o != s {
				o.mu.Unlock()
			}
		}
		if m.keys.Load() < m.maxKeys {
			return true
		}
	}
	m.refused.Add(1)
	return false
}

// remember records an attempt's decision unless the store holds
// MaxAttempts records. Requires that s.mu is held.
func (s *memShard) remember(ak attemptKey, r attemptRecord) {
	if _, ok := s.attempts[ak]; !ok {
		if s.m.maxAttempts > 0 && s.m.attempts.Load() >= s.m.maxAttempts {
			s.m.unrecorded.Add(1)
			return
		}
		s.m.attempts.Add(1)
	}
	s.attempts[ak] = r
}

// remove unlinks e from the chain for h. Requires that s.mu is held.
func (s *memShard) remove(h uint64, e *memEntry) {
	s.n--
	s.m.keys.Add(-1)
	head := s.buckets[h]
	if head == e {
		if e.next == nil {
			delete(s.buckets, h)
		} else {
			s.buckets[h] = e.next
		}
		return
	}
	for p := head; p != nil; p = p.next {
		if p.next == e {
			p.next = e.next
			return
		}
	}
}

// put stores ns where get found st: in place on the common path, an insert
// only for a new bucket, a delete when the bucket is full again (full is the
// same as absent). Requires that s.mu is held.
func (s *memShard) put(h uint64, key Key, e *memEntry, st, ns State) {
	switch {
	case ns == st:
	case e == nil:
		s.n++
		s.m.keys.Add(1)
		s.buckets[h] = &memEntry{key: key, st: ns, next: s.buckets[h]}
	case ns == (State{}):
		s.remove(h, e)
	default:
		e.st = ns
	}
}

// Len returns the number of buckets and attempt records held, for tests and
// metrics.
func (m *Memory) Len() (buckets, attempts int) {
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		buckets += s.n
		attempts += len(s.attempts)
		s.mu.Unlock()
	}
	return buckets, attempts
}

// MemoryStats counts what an in-process store holds and what its bounds
// refused.
type MemoryStats struct {
	Keys     int64 // buckets held
	Attempts int64 // attempt records held
	// Refused counts new keys refused with ErrFull at MaxKeys.
	Refused int64
	// Unrecorded counts attempt ids not remembered at MaxAttempts.
	Unrecorded int64
	// CapSweeps counts sweeps of the whole store made at MaxKeys.
	CapSweeps int64
	// MaxKeys is the bound on Keys, 0 when there is none.
	MaxKeys int64
}

// Stats returns the store's counts without taking its locks.
func (m *Memory) Stats() MemoryStats {
	return MemoryStats{
		Keys: m.keys.Load(), Attempts: m.attempts.Load(), Refused: m.refused.Load(),
		Unrecorded: m.unrecorded.Load(), CapSweeps: m.capSweeps.Load(), MaxKeys: max(m.maxKeys, 0),
	}
}

// Sweep drops every full bucket and expired attempt record now.
func (m *Memory) Sweep() {
	now := m.clock.Now().UnixMicro()
	for i := range m.shards {
		s := &m.shards[i]
		s.mu.Lock()
		s.sweep(now)
		s.mu.Unlock()
	}
}

// tick counts an operation and sweeps the shard every sweepEvery of them.
// Requires that s.mu is held.
func (s *memShard) tick(now int64) {
	s.ops++
	if s.ops%sweepEvery == 0 && now > s.lastSweep {
		s.sweep(now)
	}
}

// sweep requires that s.mu is held. Deleting a full bucket changes no
// decision, so the map's random iteration order cannot change outcomes.
func (s *memShard) sweep(now int64) {
	s.lastSweep = now
	for h, head := range s.buckets {
		var keep *memEntry
		for e := head; e != nil; {
			next := e.next
			if e.st.full(now) {
				s.n--
				s.m.keys.Add(-1)
			} else {
				e.next, keep = keep, e
			}
			e = next
		}
		if keep == nil {
			delete(s.buckets, h)
		} else {
			s.buckets[h] = keep
		}
	}
	for k, r := range s.attempts {
		if r.expires <= now {
			delete(s.attempts, k)
			s.m.attempts.Add(-1)
		}
	}
}
