package agent

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// SpeakerConfig configures the lease client the speaking agent runs.
type SpeakerConfig struct {
	Region string
	Agent  string
	// region.Budgets are the leased budgets (region.Budgets of the rules).
	Budgets []lease.Budget
	// Policy is the allocation policy named in region.Budgets built from rules.
	Policy lease.AllocationPolicy
	// Drift and Refresh are the Holder's (lease.HolderConfig).
	Drift   time.Duration
	Refresh time.Duration
	// Tick is how often the Holder is ticked and demand gathered.
	Tick time.Duration
	// DemandMaxAge drops agents' demand reports older than this.
	DemandMaxAge time.Duration
	// Redial is the pause between failed connection attempts.
	Redial time.Duration
}

// DefaultSpeakerConfig returns lease client defaults matching
// lease.DefaultConfig.
func DefaultSpeakerConfig() SpeakerConfig {
	hc := lease.DefaultHolderConfig()
	return SpeakerConfig{
		Drift:        hc.Drift,
		Refresh:      hc.Refresh,
		Tick:         100 * time.Millisecond, // well inside a refresh interval
		DemandMaxAge: 2 * time.Second,        // a few missed reports
		Redial:       500 * time.Millisecond, // coordinators come back in seconds
	}
}

// speaker drives the region's lease.Holder while this agent speaks for the
// region: it restores the Holder from the shared table (so a new speaker
// resumes the lease without a lapse), feeds it the region's summed demand,
// carries its messages over the transport and publishes the resulting
// table for every agent of the region.
type speaker struct {
	cfg       SpeakerConfig
	clock     clock.Clock
	shared    Shared
	store     bucket.Store // the regional store, where allocation changes are applied
	view      *region.TableView
	transport lease.Transport
	members   func() []string
	log       *slog.Logger
	rng       *rand.Rand

	mu      sync.Mutex // serializes holder, last, pending and adopted
	holder  *lease.Holder
	last    *region.Table
	pubBase uint64 // the last publication number used
	// pending are acknowledgements held back until every live agent has
	// adopted the table publication they belong to; adopted is the
	// publication each agent last reported.
	pending []pendingAck
	adopted map[string]region.DemandReport
	// settler applies the Holder's allocation changes to the regional
	// buckets (see settle.go).
	settler *region.Settler
}

type pendingAck struct {
	m   lease.Message
	pub uint64
}

func (s *speaker) holderConfig(session uint64) lease.HolderConfig {
	s.mu.Lock()
	defer s.mu.Unlock()
	return lease.HolderConfig{Region: s.cfg.Region, Session: session, Budgets: s.cfg.Budgets,
		Drift: s.cfg.Drift, Refresh: s.cfg.Refresh}
}

// start restores or creates the Holder at now.
func (s *speaker) start(ctx context.Context, now time.Time) error {
	session := s.rng.Uint64() | 1
	var t *region.Table
	if s.shared != nil {
		var err error
		if t, err = s.shared.LoadTable(ctx); err != nil {
			s.log.Warn("agent: speaker cannot read the shared table; starting from the local view", "err", err)
			t = nil
		}
	}
	if cur := s.view.Table(); t == nil || (cur != nil && cur.Newer(t)) {
		t = cur
	}
	var h *lease.Holder
	var err error
	if t != nil {
		// A new session: the coordinator treats this Holder as a new
		// incarnation, counts what it says it holds, and renews it.
		h, err = lease.RestoreHolder(s.holderConfig(session), t.HolderState(session), now)
	} else {
		h, err = lease.NewHolder(s.holderConfig(session), now)
	}
	if err != nil {
		return fmt.Errorf("agent: speaker for %s: %w", s.cfg.Region, err)
	}
	// Publications go on from the stored table's, or from the clock when
	// that is later: a speaker that starts after the stored table was lost
	// (a Redis failover) still publishes above any table an agent holds.
	base := uint64(now.UnixMicro())
	if t != nil {
		base = max(base, t.Pub)
	}
	s.mu.Lock()
	s.holder, s.last, s.pubBase = h, t, base
	s.settler = region.NewSettler(s.cfg.Region, s.cfg.Budgets)
	s.settler.Resume(now, h)
	s.mu.Unlock()
	return nil
}

// publish writes the Holder's table when it changed. Requires s.mu.
func (s *speaker) publishLocked(ctx context.Context, now time.Time) {
	t := region.TableOf(s.cfg.Region, s.cfg.Agent, s.pubBase+1, s.holder.Snapshot(), now)
	if t.Same(s.last) {
		return
	}
	s.last, s.pubBase = t, t.Pub
	if s.shared != nil {
		ok, err := s.shared.PublishTable(ctx, t)
		if err == nil && !ok {
			// Another speaker (while membership was split) published a
			// higher number: go on above it, so the region's agents take
			// this table.
			if cur, lerr := s.shared.LoadTable(ctx); lerr == nil && cur != nil && cur.Pub >= t.Pub {
				t = region.TableOf(s.cfg.Region, s.cfg.Agent, cur.Pub+1, s.holder.Snapshot(), now)
				s.last, s.pubBase = t, t.Pub
				_, err = s.shared.PublishTable(ctx, t)
			}
		}
		if err != nil {
			s.log.Warn("agent: publish table", "region", s.cfg.Region, "err", err)
		}
	}
	s.view.Set(t)
}

// run speaks for the region until ctx ends. release, read at the end,
// says whether to give the allocations back (the region's last agent
// stopping cleanly).
func (s *speaker) run(ctx context.Context, release func() bool) error {
	if err := s.start(ctx, s.clock.Now()); err != nil {
		return err
	}
	defer func() {
		if release() {
			s.mu.Lock()
			now := s.clock.Now()
			s.holder.Release(now)
			msgs := s.holder.Ready()
			s.settleLocked(context.Background(), now)
			s.publishLocked(context.Background(), now)
			s.mu.Unlock()
			if len(msgs) > 0 {
				s.sendOnce(msgs)
			}
		}
	}()
	tick := time.NewTicker(s.cfg.Tick)
	defer tick.Stop()
	for ctx.Err() == nil {
		st, err := s.transport.Connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			s.log.Warn("agent: no coordinator", "region", s.cfg.Region, "err", err)
			s.idle(ctx, tick.C, s.cfg.Redial)
			continue
		}
		s.stream(ctx, st, tick.C)
		st.Close()
		// A stream that ends (a redirect, a coordinator restart, another
		// agent of the region taking the stream over while membership
		// converges) is reopened after a pause, never in a tight loop.
		s.idle(ctx, tick.C, s.cfg.Redial)
	}
	return nil
}

// sendOnce delivers msgs on a fresh stream, best effort, for the release.
func (s *speaker) sendOnce(msgs []lease.Message) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st, err := s.transport.Connect(ctx)
	if err != nil {
		return
	}
	defer st.Close()
	for _, m := range msgs {
		if st.Send(m) != nil {
			return
		}
	}
}

// idle ticks the Holder without a stream for d: the lease runs to its end
// and the table follows.
func (s *speaker) idle(ctx context.Context, tick <-chan time.Time, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
			return
		case <-tick:
			s.step(ctx, nil, nil)
		}
	}
}

// stream runs one connection until it fails or ctx ends.
func (s *speaker) stream(ctx context.Context, st lease.Stream, tick <-chan time.Time) {
	recv := make(chan lease.Message, 64)
	done := make(chan error, 1)
	go func() {
		for {
			m, err := st.Recv()
			if err != nil {
				done <- err
				return
			}
			select {
			case recv <- m:
			case <-ctx.Done():
				done <- ctx.Err()
				return
			}
		}
	}()
	s.mu.Lock()
	s.pending = nil // acknowledgements of the last stream are answered by the hello
	s.holder.Reconnect(s.clock.Now())
	s.mu.Unlock()
	if err := s.step(ctx, st, nil); err != nil {
		return
	}
	for {
		select {
		case <-ctx.Done():
			st.Close()
			<-done
			return
		case err := <-done:
			s.log.Info("agent: coordinator stream ended", "region", s.cfg.Region, "err", err)
			return
		case m := <-recv:
			if err := s.step(ctx, st, &m); err != nil {
				st.Close()
				<-done
				return
			}
		case <-tick:
			if err := s.step(ctx, st, nil); err != nil {
				st.Close()
				<-done
				return
			}
		}
	}
}

// step applies m (or, when nil, the region's demand and a tick) to the
// Holder, sends what it has to say on st (dropped when st is nil: it says
// hello again on reconnect) and publishes the table.
func (s *speaker) step(ctx context.Context, st lease.Stream, m *lease.Message) error {
	var demand []lease.Demand
	var reports []region.DemandReport
	members := s.members()
	if m == nil && s.shared != nil {
		var err error
		if reports, err = s.shared.Demands(ctx); err == nil {
			demand = region.SumDemand(reports, members, s.clock.Now(), s.cfg.DemandMaxAge)
		}
	}
	s.mu.Lock()
	now := s.clock.Now()
	if s.adopted == nil {
		s.adopted = map[string]region.DemandReport{}
	}
	for _, r := range reports {
		if now.Sub(r.At) <= s.cfg.DemandMaxAge {
			s.adopted[r.Agent] = region.DemandReport{Agent: r.Agent, Pub: r.Pub, Speaker: r.Speaker}
		}
	}
	if m != nil {
		if err := s.holder.Step(now, *m); err != nil {
			s.log.Warn("agent: bad message from coordinator", "region", s.cfg.Region, "msg", m.String(), "err", err)
		}
	} else {
		for _, d := range demand {
			s.holder.Demand(now, d.Key, d.Want)
		}
		s.holder.Tick(now)
	}
	out := s.holder.Ready()
	s.settleLocked(ctx, now)
	s.publishLocked(ctx, now)
	if st == nil {
		s.pending = nil
		s.mu.Unlock()
		return nil
	}
	// An acknowledgement tells the coordinator the region no longer uses
	// what the grant took away; the other agents use it until they read
	// the new table. So it waits until every live agent reports that table.
	var send []lease.Message
	for _, o := range out {
		if o.Type == lease.MsgAck {
			s.pending = append(s.pending, pendingAck{m: o, pub: s.last.Pub})
		} else {
			send = append(send, o)
		}
	}
	done := s.adoptedLocked(members)
	i := 0
	for ; i < len(s.pending) && s.pending[i].pub <= done; i++ {
		send = append(send, s.pending[i].m)
	}
	s.pending = s.pending[i:]
	s.mu.Unlock()
	for _, o := range send {
		if err := st.Send(o); err != nil {
			return err
		}
	}
	return nil
}

// adoptedLocked is the table publication every live agent but this one has
// reported adopting (this one adopts on publishing). Requires s.mu.
func (s *speaker) adoptedLocked(members []string) uint64 {
	done := uint64(math.MaxUint64)
	for _, a := range members {
		if a == s.cfg.Agent {
			continue
		}
		r := s.adopted[a]
		if r.Speaker != s.cfg.Agent {
			return 0 // it decides with another speaker's table
		}
		done = min(done, r.Pub)
	}
	return done
}

// setBudgets replaces the Holder's budgets.
func (s *speaker) setBudgets(bs []lease.Budget) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.cfg.Budgets = bs
	if s.settler != nil {
		s.settler.SetBudgets(bs)
	}
	if s.holder == nil {
		return nil
	}
	if err := s.holder.SetBudgets(bs); err != nil {
		return fmt.Errorf("agent: speaker for %s: %w", s.cfg.Region, err)
	}
	return nil
}

// status returns the Holder's status, ok false before it starts.
func (s *speaker) status(now time.Time) (lease.HolderStatus, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.holder == nil {
		return lease.HolderStatus{}, false
	}
	return s.holder.Status(now), true
}

// LocalCoordinator is a coordinator in process: a lease.Allocator behind a
// mutex, ticked by Run, with a lease.Transport per region. The one-machine
// demo and tests use it; production runs cmd/coordinator. It is safe for
// concurrent use.
type LocalCoordinator struct {
	mu      sync.Mutex
	alloc   *lease.Allocator
	clock   clock.Clock
	streams map[string]*localStream
	down    bool
	msgs    int64
}

// NewLocalCoordinator returns a coordinator serving cfg's budgets.
func NewLocalCoordinator(cfg lease.Config, clk clock.Clock) (*LocalCoordinator, error) {
	if clk == nil {
		clk = clock.Real{}
	}
	a, err := lease.NewAllocator(cfg, 1, clk.Now())
	if err != nil {
		return nil, err
	}
	return &LocalCoordinator{alloc: a, clock: clk, streams: map[string]*localStream{}}, nil
}

// Run ticks the allocator every tick until ctx ends.
func (c *LocalCoordinator) Run(ctx context.Context, tick time.Duration) {
	t := time.NewTicker(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			c.mu.Lock()
			c.alloc.Tick(c.clock.Now())
			c.flushLocked()
			c.mu.Unlock()
		}
	}
}

// SetDown cuts (true) or restores every region's connection, as a
// partition between the regions and the coordinator would.
func (c *LocalCoordinator) SetDown(down bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.down = down
	if down {
		for r, s := range c.streams {
			s.closeLocked()
			delete(c.streams, r)
		}
	}
}

// Messages is how many messages the coordinator has received.
func (c *LocalCoordinator) Messages() int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.msgs
}

// region.Stats returns the allocator's counters.
func (c *LocalCoordinator) Stats() lease.Stats {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Stats(c.clock.Now())
}

// Regions reports the allocator's view of every region.
func (c *LocalCoordinator) Regions() []lease.RegionStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Regions()
}

// Transport returns region's transport.
func (c *LocalCoordinator) Transport(region string) lease.Transport {
	return localTransport{c: c, region: region}
}

// flushLocked routes the allocator's messages. Requires c.mu.
func (c *LocalCoordinator) flushLocked() {
	for _, m := range c.alloc.Ready() {
		if s := c.streams[m.Region]; s != nil {
			s.push(m)
		}
	}
}

type localTransport struct {
	c      *LocalCoordinator
	region string
}

func (t localTransport) Connect(ctx context.Context) (lease.Stream, error) {
	t.c.mu.Lock()
	defer t.c.mu.Unlock()
	if t.c.down {
		return nil, fmt.Errorf("agent: local coordinator for %s: %w", t.region, lease.ErrStreamClosed)
	}
	if old := t.c.streams[t.region]; old != nil {
		old.closeLocked()
	}
	s := &localStream{c: t.c, region: t.region, in: make(chan lease.Message, 256), closed: make(chan struct{})}
	t.c.streams[t.region] = s
	return s, nil
}

type localStream struct {
	c      *LocalCoordinator
	region string
	in     chan lease.Message
	closed chan struct{}
	once   sync.Once
}

func (s *localStream) push(m lease.Message) {
	select {
	case s.in <- m:
	default: // a stalled region loses messages, as on a network
	}
}

func (s *localStream) Send(m lease.Message) error {
	c := s.c
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-s.closed:
		return lease.ErrStreamClosed
	default:
	}
	m.Region = s.region // a region only ever speaks for itself
	c.msgs++
	if err := c.alloc.Step(c.clock.Now(), m); err != nil {
		return fmt.Errorf("agent: local coordinator: %w", err)
	}
	c.flushLocked()
	return nil
}

func (s *localStream) Recv() (lease.Message, error) {
	select {
	case m := <-s.in:
		return m, nil
	case <-s.closed:
		return lease.Message{}, lease.ErrStreamClosed
	}
}

func (s *localStream) Close() error {
	s.c.mu.Lock()
	defer s.c.mu.Unlock()
	s.closeLocked()
	if s.c.streams[s.region] == s {
		delete(s.c.streams, s.region)
	}
	return nil
}

func (s *localStream) closeLocked() { s.once.Do(func() { close(s.closed) }) }

// settleLocked applies every changed allocation to the regional buckets at
// now. Requires s.mu.
func (s *speaker) settleLocked(ctx context.Context, now time.Time) {
	if s.store == nil || s.settler == nil {
		return
	}
	s.settler.Settle(ctx, now, s.holder, s.store)
}
