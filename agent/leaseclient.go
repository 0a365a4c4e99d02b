package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/leaselog"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// SpeakerConfig configures the lease client the speaking agent runs: the
// region.Speaker's settings and the driver's.
type SpeakerConfig struct {
	region.SpeakerConfig
	// Policy is the allocation policy named in Budgets built from rules.
	Policy lease.AllocationPolicy
	// Tick is how often the Speaker is ticked and demand gathered.
	Tick time.Duration
	// Redial is the pause between failed connection attempts.
	Redial time.Duration
}

// DefaultSpeakerConfig returns lease client defaults matching
// lease.DefaultConfig.
func DefaultSpeakerConfig() SpeakerConfig {
	return SpeakerConfig{
		SpeakerConfig: region.DefaultSpeakerConfig(),
		Tick:          100 * time.Millisecond, // well inside a refresh interval
		Redial:        500 * time.Millisecond, // coordinators come back in seconds
	}
}

// LeaseDeps are what a LeaseClient runs on. Shared, Store, View, Transport
// and Members are required.
type LeaseDeps struct {
	// Clock is the client's clock; nil means clock.Real{}.
	Clock clock.Clock
	// Shared is where the table is published and the agents' demand
	// reports are read.
	Shared Shared
	// Store is the regional store the allocation changes are settled in.
	Store bucket.Store
	// View is this agent's view of the region's table: it adopts every
	// table at once on publishing.
	View *region.TableView
	// Transport reaches the coordinator.
	Transport lease.Transport
	// Members returns the region's live agents, this one included.
	Members func() []string
	// Release, read as Run ends, says whether to give the region's
	// allocations back (its last agent stopping cleanly); nil means never.
	Release func() bool
	// Fence returns the speaker lease the client speaks under and
	// whether it still holds it; publications carry the fence, and while
	// it is not held the client neither publishes nor keeps a stream. Nil
	// means no lease (a client alone, publishing unfenced).
	Fence func() (Fence, bool)
	// Logger receives the client's log; nil means slog.Default().
	Logger *slog.Logger
	// Seed seeds the random source lease sessions are drawn from.
	Seed uint64
}

// LeaseClient drives a region.Speaker for the agent that speaks for its
// region: it restores the Speaker from the shared table (so a new speaker
// resumes the lease without a lapse), keeps a stream open to the
// coordinator (saying hello on every new one, pausing Redial after one
// ends), feeds the Speaker the coordinator's messages and, every Tick, the
// agents' demand reports and the live members, and carries out what the
// Speaker's Ready lists in its order: settle in the regional store, publish
// the table, send. It is the one driver of a region's end of the lease
// protocol; the Agent runs one while it speaks, and tests run one alone.
// Its methods are safe for concurrent use.
type LeaseClient struct {
	cfg  SpeakerConfig
	deps LeaseDeps
	log  *slog.Logger
	rng  *rand.Rand
	// pipe settles and publishes a carry in one round trip, nil when the
	// shared state cannot in deps.Store (SettlePublisher).
	pipe SettlePublisher

	mu sync.Mutex // serializes sp and cfg.Budgets
	sp *region.Speaker
	// carryMu is held through each carry (carry): carries go one at a
	// time, and a change of budgets waits for the one under way. Taken
	// before mu.
	carryMu sync.Mutex
	// notices logs failed announces of tables; under carryMu.
	notices announceLog
	// sendMu keeps the messages of one send together on the stream: the
	// loop sends reports while the carrier sends what a carry released.
	sendMu sync.Mutex

	// down is when the current coordinator outage began (zero: none),
	// downLogged when it was last logged and downTries the attempts it has
	// cost; Run alone uses them.
	down, downLogged time.Time
	downTries        int
	// adoptions holds the reports the agents announced (their
	// adoptions, and their demand when a notice carries it whole).
	adoptions *Inbox
	// heard is the latest report each agent announced whole, and lastRead
	// the reports the last read of the store brought; Run alone uses them
	// (merged).
	heard    map[string]region.DemandReport
	lastRead []region.DemandReport
	// heardAt is when a report of a new level announced whole last
	// ticked the Speaker.
	heardAt time.Time
	// granted is set when a grant is stepped, and cleared as a carry takes
	// Ready (carry folds a grant that came during its settle).
	granted bool
}

// noCoordinatorLogEvery spaces the log lines of a coordinator outage: one
// when it begins, one when it ends, and one this often between, rather
// than one per redial.
const noCoordinatorLogEvery = 30 * time.Second

// NewLeaseClient returns a LeaseClient; Run starts it.
func NewLeaseClient(cfg SpeakerConfig, deps LeaseDeps) (*LeaseClient, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	switch {
	case cfg.Tick <= 0 || cfg.Redial <= 0:
		return nil, fmt.Errorf("%w: speaker tick=%s and redial=%s must be > 0", ErrInvalidConfig, cfg.Tick, cfg.Redial)
	case deps.Shared == nil || deps.Store == nil || deps.View == nil || deps.Transport == nil || deps.Members == nil:
		return nil, errors.New("agent: NewLeaseClient: LeaseDeps.Shared, Store, View, Transport and Members are required")
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.Release == nil {
		deps.Release = func() bool { return false }
	}
	if deps.Fence == nil {
		deps.Fence = func() (Fence, bool) { return Fence{}, true }
	}
	c := &LeaseClient{cfg: cfg, deps: deps, log: deps.Logger, rng: rand.New(rand.NewPCG(deps.Seed, 0x7370656b))}
	if sp, ok := deps.Shared.(SettlePublisher); ok && sp.SettlesIn(deps.Store) {
		c.pipe = sp
	}
	return c, nil
}

// start restores or creates the Speaker at now, from the newer of the
// shared table and this agent's view.
func (c *LeaseClient) start(ctx context.Context, now time.Time) error {
	t, err := c.deps.Shared.LoadTable(ctx)
	if err != nil {
		c.log.Warn("agent: speaker cannot read the shared table; starting from the local view", "err", err)
		t = nil
	}
	if cur := c.deps.View.Table(); t == nil || (cur != nil && cur.Newer(t)) {
		t = cur
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	sp, err := region.RestoreSpeaker(c.cfg.SpeakerConfig, c.rng.Uint64()|1, t, now)
	if err != nil {
		return fmt.Errorf("agent: speaker for %s: %w", c.cfg.Region, err)
	}
	c.sp = sp
	return nil
}

// Run speaks for the region until ctx ends; then, when Release says so,
// it gives the region's allocations back.
func (c *LeaseClient) Run(ctx context.Context) error {
	if err := c.start(ctx, c.deps.Clock.Now()); err != nil {
		return err
	}
	defer func() {
		if c.deps.Release() {
			c.release()
		}
	}()
	// The tick timer is re-armed after each round rather than ticking on
	// its own, so a test on a manual clock can tell when a round is done.
	tick := c.deps.Clock.NewTimer(c.cfg.Tick)
	defer tick.Stop()
	c.adoptions = watch(ctx, c.deps.Shared, NoticeAdoption)
	for ctx.Err() == nil {
		if _, held := c.deps.Fence(); !held {
			// Not the region's speaker (the lease is lost, or not yet
			// renewed): no stream, until the agent stops this client or
			// the lease is held again.
			c.idle(ctx, tick)
			continue
		}
		st, err := c.deps.Transport.Connect(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			c.unreachable(err)
			c.idle(ctx, tick)
			continue
		}
		heard, err := c.stream(ctx, st, tick)
		_ = st.Close() // the stream has ended; its close reports nothing to act on
		switch {
		case ctx.Err() != nil:
		case heard:
			c.log.Info("agent: coordinator stream ended", "region", c.cfg.Region, "err", err)
		default:
			// A stream that ended before the coordinator said anything
			// (refused, or cut at once) is an attempt that failed.
			c.unreachable(err)
		}
		// A stream that ends (a redirect, a coordinator restart, another
		// agent of the region taking the stream over while membership
		// converges) is reopened after a pause, never in a tight loop.
		c.idle(ctx, tick)
	}
	return nil
}

// release gives the allocations back, for the last agent's clean stop:
// the floors are settled, the released table published and the release
// sent on a fresh stream, best effort.
func (c *LeaseClient) release() {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c.mu.Lock()
	c.sp.Release(c.deps.Clock.Now())
	c.mu.Unlock()
	msgs := c.carry(ctx)
	if len(msgs) == 0 {
		return
	}
	st, err := c.deps.Transport.Connect(ctx)
	if err != nil {
		return
	}
	defer st.Close()
	for _, m := range msgs {
		c.trace("up", m)
		if st.Send(m) != nil {
			return
		}
	}
}

// idle ticks the Speaker without a stream for Redial: the lease runs to
// its end and the table follows.
func (c *LeaseClient) idle(ctx context.Context, tick clock.Timer) {
	redial := c.deps.Clock.NewTimer(c.cfg.Redial)
	defer redial.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-redial.C():
			return
		case <-tick.C():
			c.round(ctx)
			tick.Reset(c.cfg.Tick)
		}
	}
}

// unreachable notes an attempt to reach the coordinator that failed with
// err, and logs the outage when it begins and every noCoordinatorLogEvery.
func (c *LeaseClient) unreachable(err error) {
	now := c.deps.Clock.Now()
	c.downTries++
	switch {
	case c.down.IsZero():
		c.down, c.downLogged = now, now
		c.log.Warn("agent: no coordinator", "region", c.cfg.Region, "err", err)
	case now.Sub(c.downLogged) >= noCoordinatorLogEvery:
		c.downLogged = now
		c.log.Warn("agent: still no coordinator", "region", c.cfg.Region, "for", now.Sub(c.down).Round(time.Second),
			"attempts", c.downTries, "err", err)
	}
}

// reached notes that the coordinator answered, ending an outage.
func (c *LeaseClient) reached() {
	if !c.down.IsZero() {
		c.log.Info("agent: coordinator reached", "region", c.cfg.Region, "after", c.deps.Clock.Now().Sub(c.down).Round(time.Millisecond),
			"attempts", c.downTries)
	}
	c.down, c.downTries = time.Time{}, 0
}

// stream runs one connection until it fails or ctx ends, and reports
// whether the coordinator said anything on it and the error that ended it.
func (c *LeaseClient) stream(ctx context.Context, st lease.Stream, tick clock.Timer) (heard bool, _ error) {
	recv := make(chan lease.Message, 64)
	done := make(chan error, 1)
	// ended is closed as this loop gives the stream up, so a receiver
	// waiting to hand it a message when the queue is full stops too.
	ended := make(chan struct{})
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
			case <-ended:
				done <- lease.ErrStreamClosed
				return
			}
		}
	}()
	// The round's read of the agents' reports runs off this loop
	// (reading, while one is under way), so a grant or an adoption is
	// carried out while the read waits for the store; the tick is
	// re-armed once the round is done, or as the stream ends.
	var reading chan []region.DemandReport
	defer func() {
		if reading != nil {
			tick.Reset(c.cfg.Tick)
		}
	}()
	c.mu.Lock()
	c.sp.Connected(c.deps.Clock.Now())
	c.mu.Unlock()
	if err := c.send(st, c.carry(ctx)); err != nil {
		close(ended)
		return false, err
	}
	// From here the carrier carries out what the Speaker's Ready lists,
	// on a goroutine of its own, while this loop steps the coordinator's
	// messages into the Speaker, ticks it and sends its reports. Under a
	// slow regional store a carry takes a round trip or two (a renewal's
	// publication; a grant's settle and publication), and with the carry
	// on this loop, a fall of demand an agent had stored waited for it
	// before its report left, and a grant for the carry before it.
	cr := newCarrier(c, ctx, st)
	// later fires when a report announced within half a tick of the last
	// one that ticked the Speaker may tick it (heardRound).
	later := c.deps.Clock.NewTimer(c.cfg.Tick)
	later.Stop()
	defer later.Stop() // every way out, the receiver's error too
	stop := func() {
		_ = st.Close() // the stream is dropped either way
		close(ended)
		cr.stop()
		<-done
	}
	// takeReports ticks the Speaker with the reports a read brought, and
	// the newer ones the agents announced since.
	takeReports := func(reports []region.DemandReport) error {
		reading = nil
		defer tick.Reset(c.cfg.Tick)
		if reports == nil {
			return c.roundWith(st, cr, nil) // the store did not answer
		}
		c.lastRead = reports
		later.Stop() // this round takes the announced reports too
		return c.roundWith(st, cr, c.merged())
	}
	for {
		var err error
		// An adoption, the reports a read brought and the tick that
		// starts the next read go before a grant waiting with them: each
		// may send the coordinator a report, which waits for nothing,
		// where a grant waits for the carry under way.
		select {
		case <-c.adoptions.C():
			err = c.adopted(ctx, st, cr, later, c.adoptions.Take())
		case <-later.C():
			err = c.heardRound(st, cr, later)
		case reports := <-reading:
			err = takeReports(reports)
		case <-tick.C():
			reading = c.readReports(ctx)
		default:
			select {
			case <-ctx.Done():
				stop() // shutting down
				return heard, nil
			case err := <-done:
				_ = st.Close()
				cr.stop()
				return heard, err
			case err = <-cr.failed:
			case m := <-recv:
				if !heard {
					heard = true
					c.reached()
				}
				c.mu.Lock()
				c.step(m)
				// Messages that arrived meanwhile are stepped too, and
				// carried out together: under a slow regional store, a
				// settle and a publication per message fell behind a
				// coordinator that renews and regrants faster than that,
				// and each table and acknowledgement waited for every one
				// before it. Those that arrive during a carry are stepped
				// at once and carried out together by the next.
				for len(recv) > 0 { // this loop alone receives from recv
					c.step(<-recv)
				}
				c.mu.Unlock()
				cr.poke()
			case <-tick.C():
				reading = c.readReports(ctx)
			case reports := <-reading:
				err = takeReports(reports)
			case <-c.adoptions.C():
				err = c.adopted(ctx, st, cr, later, c.adoptions.Take())
			case <-later.C():
				err = c.heardRound(st, cr, later)
			}
		}
		if err != nil {
			stop() // the send failed; the stream is dropped either way
			return heard, err
		}
	}
}

// carrier carries out the Speaker's Ready on a goroutine of its own while
// a stream is open (LeaseClient.stream): poke asks for a carry, and a poke
// during a carry asks for one more after it, which carries out everything
// the Speaker took meanwhile. A send that fails is reported on failed, and
// the carrier stops.
type carrier struct {
	kick   chan struct{}
	failed chan error
	quit   chan struct{}
	done   chan struct{}
}

func newCarrier(c *LeaseClient, ctx context.Context, st lease.Stream) *carrier {
	cr := &carrier{kick: make(chan struct{}, 1), failed: make(chan error, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(cr.done)
		for {
			select {
			case <-cr.quit:
				return
			case <-cr.kick:
			}
			if err := c.send(st, c.carry(ctx)); err != nil {
				cr.failed <- err
				return
			}
		}
	}()
	return cr
}

// poke asks the carrier for a carry.
func (cr *carrier) poke() {
	select {
	case cr.kick <- struct{}{}:
	default: // one is asked for already
	}
}

// stop stops the carrier once the carry under way, if any, is done.
func (cr *carrier) stop() {
	close(cr.quit)
	<-cr.done
}

// step steps the Speaker with m. Requires c.mu.
func (c *LeaseClient) step(m lease.Message) {
	c.trace("down", m)
	if m.Type == lease.MsgGrant {
		c.granted = true
	}
	if err := c.sp.Step(c.deps.Clock.Now(), m); err != nil {
		c.log.Warn("agent: bad message from coordinator", "region", c.cfg.Region, "msg", m.String(), "err", err)
	}
}

// round is a round without a stream: it reads the agents' reports, ticks
// the Speaker with them and carries out what it says itself, sending
// nothing.
func (c *LeaseClient) round(ctx context.Context) {
	reports := c.demands(ctx)
	now, members := c.live(reports)
	c.mu.Lock()
	c.sp.Tick(now, reports, members)
	c.mu.Unlock()
	c.carry(ctx)
}

// live returns now and the region's live agents given reports, which a
// round ticks the Speaker with.
func (c *LeaseClient) live(reports []region.DemandReport) (time.Time, []string) {
	now := c.deps.Clock.Now()
	return now, liveOf(c.deps.Members(), reports, now, c.cfg.DemandMaxAge)
}

// demands reads the agents' reports; nil when the store did not answer,
// and then neither demand nor adoption moves the round.
func (c *LeaseClient) demands(ctx context.Context) []region.DemandReport {
	reports, err := c.deps.Shared.Demands(ctx)
	if err != nil {
		return nil
	}
	return reports
}

// readReports reads the agents' reports on a goroutine of its own and
// delivers them on the channel it returns. Under a slow regional store
// that read took a round trip of the loop in every round: a grant or an
// adoption that arrived meanwhile waited for it.
func (c *LeaseClient) readReports(ctx context.Context) chan []region.DemandReport {
	ch := make(chan []region.DemandReport, 1)
	go func() { ch <- c.demands(ctx) }()
	return ch
}

// roundWith is a round on stream st with the reports already read: the
// report the round makes, if any, and the acknowledgements its reports
// release are sent at once, and the rest is left to the carrier. A read
// that the store ran before an agent stored the adoption it announced
// meanwhile puts that agent back to its earlier table; the next round's
// read has the adoption again, so an acknowledgement waits at most that
// round longer.
func (c *LeaseClient) roundWith(st lease.Stream, cr *carrier, reports []region.DemandReport) error {
	now, members := c.live(reports)
	c.mu.Lock()
	c.sp.Tick(now, reports, members)
	out := append(c.sp.Reports(), c.sp.Acks()...)
	c.mu.Unlock()
	cr.poke()
	return c.send(st, out)
}

// adopted takes the reports the agents announced as adopting a table
// (bodies: the notices' bodies, as Take returns them) while
// acknowledgements wait for one, and sends those the reports release on
// st. Only when a body is no report (an agent of another version) does it
// read the stored reports.
func (c *LeaseClient) adopted(ctx context.Context, st lease.Stream, cr *carrier, later clock.Timer, bodies [][]byte) error {
	reports := make([]region.DemandReport, len(bodies))
	level := false
	for i, b := range bodies {
		var n reportNotice
		if json.Unmarshal(b, &n) != nil || n.Agent == "" {
			reports = nil
			break
		}
		reports[i] = n.DemandReport
		if n.Whole {
			if c.heard == nil {
				c.heard = make(map[string]region.DemandReport)
			}
			c.heard[n.Agent] = n.DemandReport
			level = level || n.Level
		}
	}
	// A new level one of them carries ticks the Speaker without waiting
	// for the next read of the store. The rest wait for it (their demand
	// is taken then, as merged has it): ticked by every round's report,
	// the Speaker sent a report for each, and the simulator's library sent
	// 22.4 lease messages a second over whole runs instead of 18.9.
	if level {
		if err := c.heardRound(st, cr, later); err != nil {
			return err
		}
	}
	if len(reports) == 0 {
		c.mu.Lock()
		waiting := c.sp.PendingAcks() > 0
		c.mu.Unlock()
		if !waiting {
			return nil
		}
		var err error
		if reports, err = c.deps.Shared.Demands(ctx); err != nil {
			return nil // the next round reads them again
		}
	}
	// The adoptions are taken whether or not an acknowledgement waits for
	// them yet: one may be on its way to the carrier's next Ready. Those
	// they release leave at once, not after the carry under way.
	c.mu.Lock()
	c.sp.Adopted(c.deps.Clock.Now(), reports)
	out := c.sp.Acks()
	c.mu.Unlock()
	cr.poke()
	return c.send(st, out)
}

// heardRound ticks the Speaker with the reports the agents announced
// whole (merged), at most every half tick: now, or, within half a tick of
// the last such round, when later fires at its end. A report announced
// within that half tick used to wait for the next read of the store: in
// chaos's redis-slow, the speaking agent's own report of a fall, stored
// 30 ms after the other agent's, reached the Speaker 190 ms later, and a
// third of all reports more than 60 ms after they were stored.
func (c *LeaseClient) heardRound(st lease.Stream, cr *carrier, later clock.Timer) error {
	now := c.deps.Clock.Now()
	if wait := c.cfg.Tick/2 - now.Sub(c.heardAt); wait > 0 {
		later.Reset(wait) // the same end for every report of the half tick
		return nil
	}
	c.heardAt = now
	return c.roundWith(st, cr, c.merged())
}

// merged is each agent's latest report: of the last read's and of those
// the agents announced whole, the one it wrote last. An announced report
// older than DemandMaxAge is forgotten (the Speaker would not count it).
func (c *LeaseClient) merged() []region.DemandReport {
	now := c.deps.Clock.Now()
	out := slices.Clone(c.lastRead)
	for a, h := range c.heard {
		if now.Sub(h.At) > c.cfg.DemandMaxAge {
			delete(c.heard, a)
			continue
		}
		switch i := slices.IndexFunc(out, func(r region.DemandReport) bool { return r.Agent == a }); {
		case i < 0:
			out = append(out, h)
		case h.At.After(out[i].At):
			out[i] = h
		}
	}
	slices.SortFunc(out, func(a, b region.DemandReport) int { return strings.Compare(a.Agent, b.Agent) })
	return out
}

// liveOf is the region's live agents as the speaker counts them: those
// memberlist sees, and every agent whose demand report is fresh. An agent
// memberlist cannot see (a partition inside the region) but that reaches
// the region's store decides with the tables published there: its demand
// counts, and acknowledgements wait until it adopts them, as for any
// other.
func liveOf(members []string, reports []region.DemandReport, now time.Time, maxAge time.Duration) []string {
	out := members
	for _, r := range reports {
		if now.Sub(r.At) <= maxAge && !slices.Contains(out, r.Agent) {
			if len(out) == len(members) {
				out = slices.Clone(members)
			}
			out = append(out, r.Agent)
		}
	}
	if len(out) != len(members) {
		slices.Sort(out)
	}
	return out
}

// errLostLease: the speaker lease is no longer held; the stream is
// dropped.
var errLostLease = errors.New("agent: the speaker lease is lost")

// send sends msgs on st while the client holds the speaker lease.
func (c *LeaseClient) send(st lease.Stream, msgs []lease.Message) error {
	if _, held := c.deps.Fence(); !held {
		return errLostLease
	}
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	for _, m := range msgs {
		c.trace("up", m)
		if err := st.Send(m); err != nil {
			return err
		}
	}
	return nil
}

// trace logs a lease message the speaker takes from the coordinator (down)
// or sends it (up), with its keys, at debug level. Beside the
// coordinator's own trace it shows a grant's time in the region: from its
// arrival through the carry (traced as the table's publication) to the
// acknowledgement.
func (c *LeaseClient) trace(dir string, m lease.Message) {
	leaselog.Trace(c.log, "agent: lease message", dir, m)
}

// carry carries out the Speaker's Ready in its order: it settles every
// change in the regional store, publishes the table to the shared store
// (both in one round trip when the shared state can: SettlePublisher)
// and this agent's view, reports the outcome, and returns the messages to
// send. A publication refused because another speaker published a higher
// number is made again above it at once. The calls to the stores are made
// without c.mu, so the Speaker takes messages, demand and adoptions
// meanwhile (the next carry carries them out); carries go one at a time
// (carryMu). Requires that c.mu is not held.
func (c *LeaseClient) carry(ctx context.Context) []lease.Message {
	c.carryMu.Lock()
	defer c.carryMu.Unlock()
	var send []lease.Message
	trace := c.log.Enabled(ctx, slog.LevelDebug)
	for range 2 {
		var began time.Time
		if trace {
			began = time.Now() // the carry's own time, for the trace: the real clock
		}
		rd, o, sent, pub := c.settle(ctx)
		send = append(send, sent...)
		if t := rd.Publish; t != nil {
			var ok bool
			var err error
			if pub != nil {
				ok, err = pub.stored, pub.err
			} else {
				f, _ := c.deps.Fence()
				ok, err = c.deps.Shared.PublishTable(ctx, t, f)
			}
			if ok {
				// A Notifier announced it as it stored it, or says it could not.
				c.notices.note(c.log, err, "tables", "region", c.cfg.Region)
				err = nil
			}
			if err == nil && !ok {
				if cur, lerr := c.deps.Shared.LoadTable(ctx); lerr == nil && cur != nil && cur.Pub >= t.Pub {
					o.Refused, o.StoredPub = true, cur.Pub
				}
			}
			if err != nil {
				c.log.Warn("agent: publish table", "region", c.cfg.Region, "err", err)
			}
			if !errors.Is(err, ErrNotSpeaker) {
				// The region's store is unreachable, or took it: this
				// agent decides with it either way. A table refused as
				// not the lease holder's is not this region's table.
				c.deps.View.SetAt(t, c.deps.Clock.Now())
			}
			if trace {
				c.tracePublished(ctx, t, ok, began)
			}
		}
		c.mu.Lock()
		c.sp.Advance(o)
		send = append(send, rd.Send...)
		// An adoption that came in before this Advance released the
		// acknowledgements before the one held for its returns, not that
		// one: it goes now, not at the end of the next carry.
		send = append(send, c.sp.Acks()...)
		c.mu.Unlock()
		if !o.Refused {
			break
		}
	}
	return send
}

// tracePublished logs at debug level that the carry begun at began
// settled its changes and published t (stored, or not: refused or
// failed), and how long that took. The carry calls it, and reads the
// clock for it, only when the log is at debug level.
func (c *LeaseClient) tracePublished(ctx context.Context, t *region.Table, stored bool, began time.Time) {
	c.log.LogAttrs(ctx, slog.LevelDebug, "agent: table published", slog.Uint64("pub", t.Pub), slog.Uint64("version", t.Version),
		slog.Bool("stored", stored), slog.Duration("took", time.Since(began)))
}

// maxFolds is how many grants that arrive during a carry's settles one
// carry folds in before it publishes.
const maxFolds = 2

// publication is how settle published a Ready's table along with its
// settlement.
type publication struct {
	stored bool
	err    error
}

// settle takes the Speaker's Ready and settles it in the regional store.
// When the shared state can (SettlePublisher), a Ready with a table to
// publish is settled and published in one round trip, and pub says how
// (nil: not published).
// Otherwise a grant stepped meanwhile is folded in, up to maxFolds: the
// Speaker is advanced with the settle's outcome, its next Ready settled
// too, and only the newest table is left to publish (it carries every
// grant folded, and agents adopt it one publication sooner). Every table
// published is settled first; one never published is only ever superseded
// by one with a higher publication number, which the acknowledgements
// waiting for it wait for. sent are the messages of the Ready advanced
// here. Requires c.carryMu, not c.mu.
func (c *LeaseClient) settle(ctx context.Context) (rd region.Ready, o region.Outcome, sent []lease.Message, pub *publication) {
	sp := c.pipe
	for folds := 0; ; folds++ {
		c.mu.Lock()
		if folds > 0 {
			c.sp.Advance(o)
			sent = append(sent, rd.Send...)
		}
		next := c.sp.Ready()
		c.granted = false
		c.mu.Unlock()
		if next.Publish == nil && folds > 0 {
			next.Publish = rd.Publish // still the newest, not yet published
		}
		if sp != nil && next.Publish != nil {
			f, _ := c.deps.Fence()
			pub = &publication{}
			o, pub.stored, pub.err = sp.SettleAndPublish(ctx, c.deps.Store, next.Settle, next.Publish, f)
			return next, o, sent, pub
		}
		rd, o = next, region.Settle(ctx, c.deps.Store, next.Settle)
		c.mu.Lock()
		fold := c.granted && rd.Publish != nil && folds < maxFolds
		c.mu.Unlock()
		if !fold {
			return rd, o, sent, pub
		}
	}
}

// SetBudgets replaces the Speaker's budgets (after a rules change).
func (c *LeaseClient) SetBudgets(bs []lease.Budget) error {
	c.carryMu.Lock()
	defer c.carryMu.Unlock()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.cfg.Budgets = bs
	if c.sp == nil {
		return nil
	}
	return c.sp.SetBudgets(bs)
}

// Status returns the Holder's status, ok false before Run started.
func (c *LeaseClient) Status() (lease.HolderStatus, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sp == nil {
		return lease.HolderStatus{}, false
	}
	return c.sp.Status(c.deps.Clock.Now()), true
}

// Budgets returns the budgets the Speaker's Holder serves (the
// coordinator's, once a full table brought them), nil before Run started.
func (c *LeaseClient) Budgets() []lease.Budget {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.sp == nil {
		return nil
	}
	return c.sp.Budgets()
}
