package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/region"
)

// Shared is the state the agents of a region share: the speaker lease,
// the allocation table the speaking agent publishes, and each agent's
// demand report, which the speaking agent sums for the coordinator.
// RedisShared keeps it in the regional Redis; MemShared in process.
//
// The speaker lease makes the store the arbiter of who speaks: an agent
// speaks for its region only while it holds the lease, and the store
// takes a table only from the lease's holder. So two agents that cannot
// see each other (memberlist split inside a region) never both speak:
// the one that does not hold the lease cannot publish, and stops.
type Shared interface {
	// HoldSpeaker takes the region's speaker lease for agent for ttl, or
	// renews it when held is the lease, and returns the lease's fence. It
	// returns ErrNotSpeaker when another agent holds it.
	HoldSpeaker(ctx context.Context, agent string, held Fence, ttl time.Duration) (Fence, error)
	// ReleaseSpeaker gives the lease up if f is still the lease.
	ReleaseSpeaker(ctx context.Context, f Fence) error
	// PublishTable stores t unless the stored table has a Pub ≥ t.Pub, and
	// reports whether it stored it. It returns ErrNotSpeaker unless f is
	// the speaker lease (a zero f: unless an agent holds it).
	PublishTable(ctx context.Context, t *region.Table, f Fence) (bool, error)
	// LoadTable returns the stored table, nil if there is none.
	LoadTable(ctx context.Context) (*region.Table, error)
	// PutDemand stores agent's demand report.
	PutDemand(ctx context.Context, r region.DemandReport) error
	// Demands returns every agent's latest report, sorted by agent.
	Demands(ctx context.Context) ([]region.DemandReport, error)
}

// Notifier is a Shared that passes notices between a region's agents, so
// a table or an adoption is acted on when it is stored rather than at the
// next tick. Each notice carries what it announces, so acting on it takes
// no read of the store:
//   - PublishTable announces each table it stores (NoticeTable) in the
//     same round trip, carrying the table; every other agent decides with
//     it at once,
//   - and stores its report again with it, announced (NoticeAdoption,
//     carrying the report) in that round trip too (Adopt), which lets the
//     speaking agent acknowledge a grant without waiting for the agents'
//     ticks and its own.
//
// Every report of an agent's round goes through Adopt too, so the
// speaking agent has each agent's demand (when the notice carries it
// whole) without reading the store.
//
// A notice lost (a subscription down or reconnecting, an inbox full) costs
// only that wait, since the ticks still read the store; a notice whose body
// a watcher cannot read (an agent of another version) wakes it to read the
// store. A table or report stored but not announced (a Redis user without
// the channels' permission) is reported by an error that wraps
// ErrNotAnnounced. RedisShared and MemShared implement it.
type Notifier interface {
	// Adopt stores r as PutDemand does and announces it (NoticeAdoption).
	Adopt(ctx context.Context, r region.DemandReport) error
	// Watch returns an inbox of the notices of kind n, until ctx ends.
	Watch(ctx context.Context, n Notice) *Inbox
}

// ErrNotAnnounced: a table or report was stored, and its notice could not
// be sent.
var ErrNotAnnounced = errors.New("agent: stored, not announced")

// Notice is a kind of notice between a region's agents.
type Notice uint8

const (
	// NoticeTable: the speaking agent stored a new table; the notice
	// carries it as stored (JSON), or "1" when it is larger than
	// NoticeBodyMax.
	NoticeTable Notice = iota + 1
	// NoticeAdoption: an agent stored a report (its demand, and the table
	// it decides with); the notice carries it as a reportNotice (JSON):
	// whole when it fits NoticeBodyMax, else without its keys.
	NoticeAdoption
)

func (n Notice) String() string {
	switch n {
	case NoticeTable:
		return "table"
	case NoticeAdoption:
		return "adoption"
	}
	return "notice(" + strconv.Itoa(int(n)) + ")"
}

// inboxCap is how many notices' bodies an Inbox keeps before it drops the
// oldest: more than a region's agents announce between two reads.
const inboxCap = 64

// Inbox is one watcher's notices of one kind: a wake-up on C after each
// (coalesced: C holds at most one), and their bodies, oldest first, until
// Take. The nil Inbox never wakes. It is safe for concurrent use.
type Inbox struct {
	c      chan struct{}
	mu     sync.Mutex
	bodies [][]byte
}

func newInbox() *Inbox { return &Inbox{c: make(chan struct{}, 1)} }

// C returns the channel of wake-ups (nil for the nil Inbox).
func (b *Inbox) C() <-chan struct{} {
	if b == nil {
		return nil
	}
	return b.c
}

// Take returns the bodies received since the last Take, oldest first.
func (b *Inbox) Take() [][]byte {
	if b == nil {
		return nil
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.bodies
	b.bodies = nil
	return out
}

// put keeps body and wakes the watcher. A body larger than any notice
// carries (NoticeBodyMax) is kept as nil, a wake-up that makes the
// watcher read the store: nobody with access to the channel can make an
// inbox hold more than inboxCap such bodies.
func (b *Inbox) put(body []byte) {
	if len(body) > NoticeBodyMax {
		body = nil
	}
	b.mu.Lock()
	if len(b.bodies) == inboxCap {
		b.bodies = slices.Delete(b.bodies, 0, 1)
	}
	b.bodies = append(b.bodies, body)
	b.mu.Unlock()
	select {
	case b.c <- struct{}{}:
	default:
	}
}

// watch is sh's Watch for n, or nil (an inbox that never wakes) when sh
// passes no notices.
func watch(ctx context.Context, sh Shared, n Notice) *Inbox {
	if nf, ok := sh.(Notifier); ok {
		return nf.Watch(ctx, n)
	}
	return nil
}

// announceLog logs, once until one goes through again, that notices could
// not be announced: the region then works at its ticks' pace,
// and a notice refused for good (a Redis user without the channels'
// permission) would otherwise log at every table. It is safe for
// concurrent use.
type announceLog struct{ down atomic.Bool }

// note takes the outcome of an announce of what.
func (l *announceLog) note(log *slog.Logger, err error, what string, attrs ...any) {
	switch {
	case err != nil && l.down.CompareAndSwap(false, true):
		log.Warn("agent: cannot announce "+what+"; the region waits for its ticks", append(attrs, "err", err)...)
	case err == nil && l.down.CompareAndSwap(true, false):
		log.Info("agent: announcing "+what+" again", attrs...)
	}
}

// Fence is a speaker lease as its holder knows it: the agent and the
// token the store gave it when it took the lease (tokens increase with
// every new lease). The zero Fence is no lease.
type Fence struct {
	Agent string
	Token uint64
}

// IsZero reports whether f is no lease.
func (f Fence) IsZero() bool { return f == Fence{} }

// String is the lease's value in the store: "<token> <agent>".
func (f Fence) String() string {
	if f.IsZero() {
		return ""
	}
	return strconv.FormatUint(f.Token, 10) + " " + f.Agent
}

// parseFence reads a lease's value.
func parseFence(s string) (Fence, error) {
	tok, agent, ok := strings.Cut(s, " ")
	n, err := strconv.ParseUint(tok, 10, 64)
	if !ok || err != nil || agent == "" {
		return Fence{}, fmt.Errorf("agent: speaker lease %q is not \"<token> <agent>\"", s)
	}
	return Fence{Agent: agent, Token: n}, nil
}

// ErrNotSpeaker: another agent holds the region's speaker lease.
var ErrNotSpeaker = errors.New("agent: another agent holds the speaker lease")

// MemShared is Shared in process: for a region whose agents share one
// process, or one agent on the in-process store. Its speaker lease expires
// by its clock. It is safe for concurrent use.
type MemShared struct {
	clk    clock.Clock
	mu     sync.Mutex
	table  *region.Table
	demand map[string]region.DemandReport
	lease  Fence
	until  time.Time // the lease's expiry
	tokens uint64
	// watchers are the inboxes watching each kind of notice.
	watchers map[Notice][]*Inbox
}

var (
	_ Shared   = (*MemShared)(nil)
	_ Notifier = (*MemShared)(nil)
)

// NewMemShared returns an empty MemShared on the real clock.
func NewMemShared() *MemShared { return NewMemSharedOn(nil) }

// NewMemSharedOn returns an empty MemShared on clk (nil: clock.Real{}).
func NewMemSharedOn(clk clock.Clock) *MemShared {
	if clk == nil {
		clk = clock.Real{}
	}
	return &MemShared{clk: clk, demand: map[string]region.DemandReport{}}
}

// leaseLocked is the lease in force at now. Requires that m.mu is held.
func (m *MemShared) leaseLocked() Fence {
	if !m.clk.Now().Before(m.until) {
		m.lease = Fence{}
	}
	return m.lease
}

// HoldSpeaker implements Shared.
func (m *MemShared) HoldSpeaker(_ context.Context, agent string, held Fence, ttl time.Duration) (Fence, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	switch cur := m.leaseLocked(); {
	case !cur.IsZero() && cur == held:
	case cur.IsZero():
		m.tokens++
		m.lease = Fence{Agent: agent, Token: m.tokens}
	default:
		return Fence{}, ErrNotSpeaker
	}
	m.until = m.clk.Now().Add(ttl)
	return m.lease, nil
}

// ReleaseSpeaker implements Shared.
func (m *MemShared) ReleaseSpeaker(_ context.Context, f Fence) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !f.IsZero() && m.leaseLocked() == f {
		m.lease = Fence{}
	}
	return nil
}

// PublishTable implements Shared.
func (m *MemShared) PublishTable(_ context.Context, t *region.Table, f Fence) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.leaseLocked() != f {
		return false, ErrNotSpeaker
	}
	if m.table != nil && m.table.Pub >= t.Pub {
		return false, nil
	}
	m.table = t
	if len(m.watchers[NoticeTable]) > 0 {
		body, err := json.Marshal(t)
		if err != nil {
			body = nil // a body no watcher reads: they read the store
		}
		m.announceLocked(NoticeTable, tableNotice(body))
	}
	return true, nil
}

// LoadTable implements Shared.
func (m *MemShared) LoadTable(context.Context) (*region.Table, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.table, nil
}

// PutDemand implements Shared.
func (m *MemShared) PutDemand(_ context.Context, r region.DemandReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demand[r.Agent] = r
	return nil
}

// Demands implements Shared.
func (m *MemShared) Demands(context.Context) ([]region.DemandReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]region.DemandReport, 0, len(m.demand))
	for _, r := range m.demand {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b region.DemandReport) int { return strings.Compare(a.Agent, b.Agent) })
	return out, nil
}

// Adopt implements Notifier.
func (m *MemShared) Adopt(_ context.Context, r region.DemandReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demand[r.Agent] = r
	if len(m.watchers[NoticeAdoption]) > 0 {
		body, err := adoptionNotice(r)
		if err != nil {
			body = nil // a body no watcher reads: the speaking agent reads the store
		}
		m.announceLocked(NoticeAdoption, body)
	}
	return nil
}

// announceLocked hands body, as RedisShared's notices carry it, to every
// watcher of n. Requires that m.mu is held.
func (m *MemShared) announceLocked(n Notice, body []byte) {
	for _, b := range m.watchers[n] {
		b.put(body)
	}
}

// Watch implements Notifier.
func (m *MemShared) Watch(ctx context.Context, n Notice) *Inbox {
	in := newInbox()
	m.mu.Lock()
	if m.watchers == nil {
		m.watchers = map[Notice][]*Inbox{}
	}
	m.watchers[n] = append(m.watchers[n], in)
	m.mu.Unlock()
	context.AfterFunc(ctx, func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		m.watchers[n] = slices.DeleteFunc(m.watchers[n], func(w *Inbox) bool { return w == in })
	})
	return in
}

// RedisShared is Shared in the regional Redis: the speaker lease in a
// string (SET NX PX, its value the Fence, tokens from a counter beside
// it), the table in one hash and the demand reports in another, all
// hash-tagged by region so Cluster keeps them in one slot. The table is
// replaced by one script that checks the publisher's fence against the
// lease and compares publication numbers, so neither an agent that lost
// the lease nor a stale speaker overwrites the table. Notices go over
// Redis pub/sub, one channel per kind and region.
type RedisShared struct {
	c        redis.UniversalClient
	tableKey string
	demKey   string
	leaseKey string
	tokenKey string
	noticeCh string // the channel prefix; the kind's name follows
	timeout  time.Duration
	ttl      time.Duration
}

var (
	_ Shared   = (*RedisShared)(nil)
	_ Notifier = (*RedisShared)(nil)
)

// NewRedisShared returns region's shared state in c under prefix. Keys
// expire after ttl without writes (a region whose agents are all gone
// leaves nothing behind).
func NewRedisShared(c redis.UniversalClient, prefix, region string, timeout, ttl time.Duration) *RedisShared {
	if prefix == "" {
		prefix = "allot:"
	}
	base := prefix + "region:{" + region + "}:"
	return &RedisShared{c: c, tableKey: base + "table", demKey: base + "demand", leaseKey: base + "speaker",
		tokenKey: base + "speaker-token", noticeCh: base + "notice:", timeout: timeout, ttl: ttl}
}

// channel is the pub/sub channel of notices of kind n.
func (r *RedisShared) channel(n Notice) string { return r.noticeCh + n.String() }

// Watch implements Notifier: a subscription to the kind's channel, which
// the client re-establishes after a lost connection (notices sent
// meanwhile are lost). It returns once Redis confirmed the subscription,
// or after the timeout.
func (r *RedisShared) Watch(ctx context.Context, n Notice) *Inbox {
	in := newInbox()
	ps := r.c.Subscribe(ctx, r.channel(n))
	cctx, cancel := r.ctx(ctx)
	_, _ = ps.Receive(cctx) // the confirmation; a failure is retried by the client
	cancel()
	msgs := ps.Channel()
	go func() {
		defer ps.Close()
		for {
			select {
			case <-ctx.Done():
				return
			case m, ok := <-msgs:
				if !ok {
					return
				}
				in.put([]byte(m.Payload))
			}
		}
	}()
	return in
}

// stored reads the reply of a script that stores and then announces: 1,
// or, stored but not announced, the error PUBLISH gave (a string).
func stored(res any, what, ch string) error {
	if msg, ok := res.(string); ok {
		return fmt.Errorf("%w: %s on %s: %s", ErrNotAnnounced, what, ch, msg)
	}
	return nil
}

// announceLua announces ARGV[i] on channel ARGV[j] as the last step of a
// script that stored it, returning PUBLISH's error as a string: a Redis
// user without the channel's permission still stores.
const announceLua = `
local sent = redis.pcall('PUBLISH', ARGV[%d], ARGV[%d])
if type(sent) == 'table' and sent.err then return sent.err end
return 1`

// NoticeBodyMax is the largest table (its JSON) a notice carries: 64 KiB,
// a few hundred entries. A larger one is announced with a bare wake-up,
// "1", and each agent reads it from the store, as it reads a table it
// missed: Redis disconnects a subscriber that falls behind once its output
// buffer passes client-output-buffer-limit's pubsub class (8 MB for a
// minute by default), and each inbox keeps inboxCap bodies.
const NoticeBodyMax = 64 << 10

// tableNotice is what a notice of a table whose JSON is body carries.
func tableNotice(body []byte) []byte {
	if len(body) > NoticeBodyMax || body == nil {
		return []byte("1")
	}
	return body
}

// reportNotice is what a notice of an agent's report carries: the report,
// and whether its keys are all there (Whole). A report whose JSON is over
// NoticeBodyMax goes without its keys (Speaker.Adopted reads who adopted
// what, at what instant; the speaking agent reads the demand from the
// store at its tick), so a notice's size does not follow the keys an agent
// uses. A watcher of an earlier version reads it as a report and ignores
// Whole.
type reportNotice struct {
	region.DemandReport
	Whole bool `json:"whole,omitempty"`
}

// adoptionNotice is what a notice of r carries (reportNotice).
func adoptionNotice(r region.DemandReport) ([]byte, error) {
	b, err := json.Marshal(reportNotice{DemandReport: r, Whole: true})
	if err != nil || len(b) <= NoticeBodyMax {
		return b, err
	}
	r.Keys = nil
	return json.Marshal(reportNotice{DemandReport: r})
}

// publishScript: KEYS table, lease; ARGV pub, body, ttl ms, fence ("":
// none), channel, notice. -1: the fence is not the lease; 0: a table as
// new is stored; then as announceLua, the notice announced on the
// channel.
var publishScript = redis.NewScript(`
local lease = redis.call('GET', KEYS[2])
if ARGV[4] == '' then
  if lease then return -1 end
elseif lease ~= ARGV[4] then
  return -1
end
local cur = redis.call('HGET', KEYS[1], 'pub')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'pub', ARGV[1], 'body', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])` + fmt.Sprintf(announceLua, 5, 6))

// demandScript: KEYS demand; ARGV agent, report, ttl ms, and to announce
// it, channel and notice. As announceLua: the notice announced on the
// channel.
var demandScript = redis.NewScript(`
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
if #ARGV < 5 then return 1 end` + fmt.Sprintf(announceLua, 4, 5))

// holdScript: KEYS lease, token counter; ARGV agent, held fence (""),
// lease ttl ms, counter ttl ms. The lease's value, or nil when another
// agent holds it.
var holdScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur then
  if cur == ARGV[2] then
    redis.call('PEXPIRE', KEYS[1], ARGV[3])
    return cur
  end
  return false
end
local tok = redis.call('INCR', KEYS[2])
redis.call('PEXPIRE', KEYS[2], ARGV[4])
local v = tok .. ' ' .. ARGV[1]
redis.call('SET', KEYS[1], v, 'PX', ARGV[3])
return v`)

// releaseScript: KEYS lease; ARGV fence.
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0`)

// HoldSpeaker implements Shared.
func (r *RedisShared) HoldSpeaker(ctx context.Context, agent string, held Fence, ttl time.Duration) (Fence, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	v, err := holdScript.Run(ctx, r.c, []string{r.leaseKey, r.tokenKey}, agent, held.String(),
		max(ttl.Milliseconds(), 1), r.ttl.Milliseconds()).Text()
	if errors.Is(err, redis.Nil) {
		return Fence{}, ErrNotSpeaker
	}
	if err != nil {
		return Fence{}, fmt.Errorf("%w: agent: speaker lease %s: %w", bucket.ErrUnavailable, r.leaseKey, err)
	}
	return parseFence(v)
}

// ReleaseSpeaker implements Shared.
func (r *RedisShared) ReleaseSpeaker(ctx context.Context, f Fence) error {
	if f.IsZero() {
		return nil
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	if err := releaseScript.Run(ctx, r.c, []string{r.leaseKey}, f.String()).Err(); err != nil {
		return fmt.Errorf("%w: agent: release speaker lease %s: %w", bucket.ErrUnavailable, r.leaseKey, err)
	}
	return nil
}

func (r *RedisShared) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// PublishTable implements Shared.
func (r *RedisShared) PublishTable(ctx context.Context, t *region.Table, f Fence) (bool, error) {
	args, err := r.publishArgs(t, f)
	if err != nil {
		return false, err
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	res, err := publishScript.Run(ctx, r.c, r.publishKeys(), args...).Result()
	return r.published(t, f, res, err)
}

// publishKeys and publishArgs are publishScript's keys and arguments for
// t under f.
func (r *RedisShared) publishKeys() []string { return []string{r.tableKey, r.leaseKey} }

func (r *RedisShared) publishArgs(t *region.Table, f Fence) ([]any, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return nil, fmt.Errorf("agent: encode table: %w", err)
	}
	return []any{strconv.FormatUint(t.Pub, 10), body, r.ttl.Milliseconds(), f.String(), r.channel(NoticeTable), tableNotice(body)}, nil
}

// published reads publishScript's reply for t under f as PublishTable
// returns it.
func (r *RedisShared) published(t *region.Table, f Fence, res any, err error) (bool, error) {
	if err != nil {
		return false, fmt.Errorf("%w: agent: publish table to %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	if n, ok := res.(int64); ok && n < 1 {
		if n < 0 {
			return false, fmt.Errorf("%w: publish table to %s under %q", ErrNotSpeaker, r.tableKey, f.String())
		}
		return false, nil
	}
	return true, stored(res, "agent: announce table "+strconv.FormatUint(t.Pub, 10), r.channel(NoticeTable))
}

// SettlePublisher is a Shared that can settle a carry's changes and
// publish its table in one round trip to the store (RedisShared on a
// single primary). Under a store 60 ms away each way, the two calls one
// after the other held a region's new table back a round trip more, twice
// in every move of demand: at the region that gives back and at the one
// that takes it.
type SettlePublisher interface {
	// SettlesIn reports whether SettleAndPublish can settle in st.
	SettlesIn(st bucket.Store) bool
	// SettleAndPublish settles changes in st (region.Settle) and then
	// publishes t under f (Shared.PublishTable), in one round trip, no
	// agent able to read t before every change it carries is settled. st
	// is one SettlesIn accepts. The Outcome is Settle's; the bool and the
	// error are PublishTable's.
	SettleAndPublish(ctx context.Context, st bucket.Store, changes []region.Change, t *region.Table, f Fence) (region.Outcome, bool, error)
}

var _ SettlePublisher = (*RedisShared)(nil)

// SettlesIn implements SettlePublisher: st must be a redisstore.Store that
// queues on this shared state's own client (redisstore.Store.QueuesOn),
// directly or under the breaker's deadlines (breaker.Timed).
func (r *RedisShared) SettlesIn(st bucket.Store) bool { return r.queuer(st) != nil }

// queuer is the redisstore.Store st is or wraps when it queues on this
// shared state's client, nil otherwise.
func (r *RedisShared) queuer(st bucket.Store) *redisstore.Store {
	for {
		switch s := st.(type) {
		case *redisstore.Store:
			if !s.QueuesOn(r.c) {
				return nil
			}
			return s
		case interface{ Inner() bucket.Store }:
			st = s.Inner()
		default:
			return nil
		}
	}
}

// SettleAndPublish implements SettlePublisher: the rebases and then the
// publication are pipelined on one connection, which Redis runs in order
// (redisstore.Store.QueueRebases), under the shared state's timeout, as
// the publication alone was (not the breaker's deadline, which a settle
// through breaker.Timed ran under: a pipeline of a rebase and a
// publication is not a decision's call, whose latency the breaker
// follows). A change to an allocation that admits nothing writes nothing,
// as Change.Apply. On a store SettlesIn refuses, it settles and then
// publishes, two round trips.
func (r *RedisShared) SettleAndPublish(ctx context.Context, st bucket.Store, changes []region.Change, t *region.Table, f Fence) (region.Outcome, bool, error) {
	args, err := r.publishArgs(t, f)
	rs := r.queuer(st)
	if err != nil || rs == nil {
		// Two round trips, settled first (an encoding error is
		// PublishTable's to give).
		o := region.Settle(ctx, st, changes)
		stored, err := r.PublishTable(ctx, t, f)
		return o, stored, err
	}
	var o region.Outcome
	var queued []region.Change
	var rbs []redisstore.Rebasing
	for _, c := range changes {
		if c.To.AdmitsNothing() {
			continue // nothing to write
		}
		queued = append(queued, c)
		rbs = append(rbs, redisstore.Rebasing{Key: c.Key, From: c.From, To: c.To, Credit: c.Credit})
	}
	cctx, cancel := r.ctx(ctx)
	defer cancel()
	p := r.c.Pipeline()
	done := rs.QueueRebases(cctx, p, rbs)
	// With its source, as the rebases: a server that lost the script
	// (restarted, failed over) would refuse EVALSHA, and the table would
	// wait another round trip.
	pub := publishScript.Eval(cctx, p, r.publishKeys(), args...)
	_, _ = p.Exec(cctx) // each command's error is read from it
	lost, errs := done()
	for i, c := range queued {
		o.Add(c, lost[i], errs[i])
	}
	res, err := pub.Result()
	stored, err := r.published(t, f, res, err)
	return o, stored, err
}

// LoadTable implements Shared.
func (r *RedisShared) LoadTable(ctx context.Context) (*region.Table, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	b, err := r.c.HGet(ctx, r.tableKey, "body").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: agent: load table from %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	t := &region.Table{}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("agent: decode table from %s: %w", r.tableKey, err)
	}
	return t, nil
}

// PutDemand implements Shared.
func (r *RedisShared) PutDemand(ctx context.Context, d region.DemandReport) error {
	return r.putDemand(ctx, d, false)
}

// Adopt implements Notifier: the report stored and announced by one
// script.
func (r *RedisShared) Adopt(ctx context.Context, d region.DemandReport) error {
	return r.putDemand(ctx, d, true)
}

// putDemand stores d, and with announce also announces its adoption, in
// one script.
func (r *RedisShared) putDemand(ctx context.Context, d region.DemandReport, announce bool) error {
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("agent: encode demand: %w", err)
	}
	args := []any{d.Agent, b, r.ttl.Milliseconds()}
	ch := r.channel(NoticeAdoption)
	if announce {
		note, err := adoptionNotice(d)
		if err != nil {
			return fmt.Errorf("agent: encode demand: %w", err)
		}
		args = append(args, ch, note)
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	res, err := demandScript.Run(ctx, r.c, []string{r.demKey}, args...).Result()
	if err != nil {
		return fmt.Errorf("%w: agent: put demand to %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	return stored(res, "agent: announce adoption by "+d.Agent, ch)
}

// Demands implements Shared.
func (r *RedisShared) Demands(ctx context.Context) ([]region.DemandReport, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	m, err := r.c.HGetAll(ctx, r.demKey).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: agent: read demand from %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	out := make([]region.DemandReport, 0, len(m))
	for agent, s := range m {
		var d region.DemandReport
		if json.Unmarshal([]byte(s), &d) != nil {
			continue // a report this version cannot read counts as none
		}
		d.Agent = agent
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b region.DemandReport) int { return strings.Compare(a.Agent, b.Agent) })
	return out, nil
}
