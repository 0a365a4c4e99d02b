package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// Config configures an Agent.
type Config struct {
	// Name is this agent's name, unique in its region.
	Name string
	// Core configures the decision core; Core.Region is the region.
	Core region.Config
	// Speaker configures the lease client this agent runs while it speaks
	// for the region. Region and Agent are filled in from Core and Name.
	Speaker SpeakerConfig
	// Tick is how often the agent ticks its core, reports its demand,
	// reads membership and (when not speaking) the shared table.
	Tick time.Duration
	// FailoverPoll is how often the regional Redis's run id and role are
	// read to detect a failover; 0 turns detection off.
	FailoverPoll time.Duration
	// SpeakerWait is how long a starting agent waits before it may speak
	// for the region, so that membership converges first and two agents
	// starting together do not both speak.
	SpeakerWait time.Duration
	// SpeakerLease is the speaker lease's time to live in the regional
	// store (Shared.HoldSpeaker), renewed every Tick: an agent speaks only
	// while it holds the lease, counted from when it asked for it, less a
	// tenth for the store's clock and the round trip.
	SpeakerLease time.Duration
	// CoarseClock is how often Run refreshes the coarse clock that
	// decisions from a batch read (clock.Coarse, region.Store.UseCoarse):
	// one atomic load instead of a clock read, which on some virtual
	// machines costs more than the decision. 0 reads the clock for every
	// decision. It applies only on the real clock (Deps.Clock nil or
	// clock.Real), so tests on a manual clock see every decision's time.
	CoarseClock time.Duration
}

// DefaultConfig returns a Config with production defaults; Name and
// Core.Region are left to the caller.
func DefaultConfig() Config {
	return Config{
		Core:         region.DefaultConfig(),
		Speaker:      DefaultSpeakerConfig(),
		Tick:         100 * time.Millisecond,  // tables and demand move within a tenth of a refresh
		FailoverPoll: 500 * time.Millisecond,  // a failover takes seconds; notice it within half of one
		SpeakerWait:  1500 * time.Millisecond, // memberlist joins and gossips within about a second
		SpeakerLease: 2 * time.Second,         // a crashed speaker's lease ends about when memberlist declares it dead
		CoarseClock:  time.Millisecond,        // a thousand refreshes a second cost well under 1% of a core
	}
}

// Validate reports the first problem with c, naming the field.
func (c Config) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: agent name is empty", ErrInvalidConfig)
	case c.Tick <= 0:
		return fmt.Errorf("%w: agent tick=%s must be > 0", ErrInvalidConfig, c.Tick)
	case c.FailoverPoll < 0:
		return fmt.Errorf("%w: agent failover_poll=%s must be ≥ 0", ErrInvalidConfig, c.FailoverPoll)
	case c.SpeakerWait < 0:
		return fmt.Errorf("%w: agent speaker_wait=%s must be ≥ 0", ErrInvalidConfig, c.SpeakerWait)
	case c.CoarseClock < 0:
		return fmt.Errorf("%w: agent coarse_clock=%s must be ≥ 0", ErrInvalidConfig, c.CoarseClock)
	case c.SpeakerLease <= c.Tick:
		return fmt.Errorf("%w: agent speaker_lease=%s must exceed tick=%s (it is renewed every tick)", ErrInvalidConfig, c.SpeakerLease, c.Tick)
	case c.Speaker.Tick <= 0 || c.Speaker.Refresh <= 0 || c.Speaker.Redial <= 0:
		return fmt.Errorf("%w: speaker tick=%s, refresh=%s and redial=%s must be > 0",
			ErrInvalidConfig, c.Speaker.Tick, c.Speaker.Refresh, c.Speaker.Redial)
	}
	if err := c.Core.Validate(); err != nil {
		return err
	}
	// The region's part of the speaker's config, with the names New gives it.
	sc := c.Speaker.SpeakerConfig
	sc.Region, sc.Agent = c.Core.Region, c.Name
	return sc.Validate()
}

// Deps are what an Agent runs on. Store is required; the rest is
// optional.
type Deps struct {
	// region.Store is the regional store: redisstore.Store, or bucket.Memory for the
	// embedded default.
	Store bucket.Store
	// Redis, when set, is watched for failovers (run id or role changes),
	// and Store's calls run under the core's breaker's deadlines
	// (breaker.Timed): Store should then carry a longer timeout of its own.
	Redis redis.UniversalClient
	// Shared is the region's shared state; nil means a MemShared private
	// to this agent.
	Shared Shared
	// Membership lists the region's live agents; nil means this agent
	// alone.
	Membership Membership
	// Transport reaches the coordinator; nil means floors alone.
	Transport lease.Transport
	// region.Namer maps edge keys to budget keys; nil maps keys to themselves.
	Namer *region.Namer
	// Clock is the agent's clock; nil means clock.Real{}.
	Clock clock.Clock
	// Logger receives the agent's log; nil means slog.Default().
	Logger *slog.Logger
	// Metrics, when set, receives the agent's metrics.
	Metrics *Metrics
	// Seed seeds the agent's random source (lease sessions).
	Seed uint64
}

// Agent is a regional agent: a region.Core driven by a clock, membership of the
// region's agents, the lease client while it speaks for the region, the
// shared allocation table, failover detection and metrics. region.Store returns
// the bucket.Store the edge uses.
type Agent struct {
	cfg   Config
	deps  Deps
	core  *region.Core
	view  *region.TableView
	store *region.Store
	log   *slog.Logger
	rng   *rand.Rand

	started time.Time // when Run began, by the agent's clock
	// notices logs failed announces of the agent's reports, from its
	// rounds and its adoptions.
	notices announceLog

	mu        sync.Mutex
	speaking  bool
	fence     Fence     // the speaker lease this agent holds (zero: none)
	fenceTill time.Time // until when, by the agent's clock
	spkFence  Fence     // the lease the running lease client speaks under
	spk       *LeaseClient
	stopSpk   context.CancelFunc
	spkDone   chan struct{}
	members   []string
	runID     string
	role      string
	shards    map[string]string // on a Cluster: slot range → primary's node id
	runs      map[string]string // on a Cluster: primary's node id → run id
	closing   bool
	lastError error
	opened    int64 // breaker openings already logged; tick's alone
	// lastErrorAt is when lastError happened; recovered is set once a
	// later round reached the shared state without error.
	lastErrorAt time.Time
	recovered   bool
}

// New returns an agent; Run starts it.
func New(cfg Config, deps Deps) (*Agent, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Store == nil {
		return nil, errors.New("agent: New: Deps.Store is nil")
	}
	if deps.Clock == nil {
		deps.Clock = clock.Real{}
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if deps.Shared == nil {
		deps.Shared = NewMemSharedOn(deps.Clock)
	}
	if deps.Membership == nil {
		deps.Membership = NewStaticMembership(cfg.Name)
	}
	if _, ok := deps.Store.(bucket.Rebaser); !ok {
		// The speaker applies allocation changes to the regional buckets the
		// moment they happen; a store that cannot would let a shrunk bucket
		// refill at its old rate.
		return nil, fmt.Errorf("agent: Deps.Store %T does not implement bucket.Rebaser", deps.Store)
	}
	cfg.Speaker.Region, cfg.Speaker.Agent = cfg.Core.Region, cfg.Name
	if deps.Redis != nil && cfg.Core.Breaker == nil {
		// The breaker sets each Redis call's deadline from the latency it
		// observes; the core counts the outcomes.
		b, err := breaker.New(cfg.Core.BreakerConfig())
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
		cfg.Core.Breaker = b
		deps.Store = breaker.Timed(deps.Store, b, deps.Clock)
	}
	view := region.NewTableView(cfg.Core.Region, cfg.Core.Floors)
	core, err := region.NewCore(cfg.Core, deps.Store, view)
	if err != nil {
		return nil, err
	}
	a := &Agent{cfg: cfg, deps: deps, core: core, view: view, log: deps.Logger,
		rng: rand.New(rand.NewPCG(deps.Seed, 0x616c6c6f74))}
	var observe func(region.Result, time.Duration)
	if deps.Metrics != nil {
		observe = deps.Metrics.attach(a)
	}
	a.store = region.NewStore(core, deps.Clock, deps.Namer, observe)
	return a, nil
}

// region.Store returns the bucket.Store the edge decides with.
func (a *Agent) Store() *region.Store { return a.store }

// region.Core returns the decision core.
func (a *Agent) Core() *region.Core { return a.core }

// View returns the agent's view of the region's allocation table.
func (a *Agent) View() *region.TableView { return a.view }

// Name is the agent's name.
func (a *Agent) Name() string { return a.cfg.Name }

// Region is the agent's region.
func (a *Agent) Region() string { return a.cfg.Core.Region }

// Run drives the agent until ctx ends, then stops it cleanly: batch tokens
// go back and, if this was the region's last agent, the lease is released.
func (a *Agent) Run(ctx context.Context) error {
	a.started = a.deps.Clock.Now()
	_, real := a.deps.Clock.(clock.Real)
	if real && a.cfg.CoarseClock > 0 {
		co, err := clock.NewCoarse(a.deps.Clock, a.cfg.CoarseClock)
		if err != nil {
			return fmt.Errorf("agent: %w", err)
		}
		cctx, cancel := context.WithCancel(ctx)
		done := make(chan struct{})
		go func() { defer close(done); co.Run(cctx) }()
		a.store.UseCoarse(co)
		// Decisions after Run read the clock again: nothing refreshes co.
		defer func() { a.store.UseCoarse(nil); cancel(); <-done }()
	}
	// The timer is re-armed after each round, so a test on a manual clock
	// sees it pending again once the round is done.
	t := a.deps.Clock.NewTimer(a.cfg.Tick)
	defer t.Stop()
	var lastPoll time.Time
	a.tick(ctx, &lastPoll)
	// After the first round: a subscription to a store that does not
	// answer waits for its timeout.
	// Tables are adopted on a goroutine of their own: a round makes
	// several calls to the store, and under a slow store a notice waiting
	// for the round to end would wait most of a round.
	var bg sync.WaitGroup
	if nf, ok := a.deps.Shared.(Notifier); ok {
		tables := nf.Watch(ctx, NoticeTable)
		bg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case <-tables.C():
					a.adopt(ctx, tables.Take())
				}
			}
		})
	}
	bg.Go(func() { a.reportLevels(ctx) })
	// Batched keys are sampled between rounds (Core.SampleHot), so a new
	// level of their use is read, and reported, between the agent's
	// rounds. Only on a real clock: tests on a manual one step whole
	// rounds, and count the timers pending to know when a round is done.
	if real {
		bg.Go(func() {
			clock.Every(ctx, a.deps.Clock, hotSampleEvery, a.core.SampleHot)
		})
		// The breaker's probe, and the word of a cut, between rounds: while
		// the store is down each of a round's calls waits out its deadline,
		// so rounds came about 2 s apart in chaos's redis-cut-emergency, and
		// the store's return was noticed, and a cut announced, up to a
		// round late.
		bg.Go(func() {
			clock.Every(ctx, a.deps.Clock, probeEvery, func(now time.Time) { a.betweenRounds(ctx, now) })
		})
	}
	for {
		select {
		case <-ctx.Done():
			bg.Wait()
			a.stop()
			return nil
		case <-t.C():
			a.tick(ctx, &lastPoll)
			t.Reset(a.cfg.Tick)
		}
	}
}

// adopt decides with the newest of the tables the speaking agent
// announced (bodies: the notices' bodies, as Take returns them), when it
// is newer than the view's, and stores the agent's report (its demand as
// of now) as adopting it, announced: the speaking agent then acknowledges
// the grant the table carries without waiting for this agent's next tick.
// Only when no body is a table (a speaker of another version) does it
// load the stored one. The speaking agent adopts its tables as it
// publishes them.
func (a *Agent) adopt(ctx context.Context, bodies [][]byte) {
	a.mu.Lock()
	speaking := a.speaking
	a.mu.Unlock()
	if speaking {
		return
	}
	var t *region.Table
	for _, b := range bodies {
		var u region.Table
		if json.Unmarshal(b, &u) == nil && u.Region == a.Region() && u.Newer(t) {
			t = &u
		}
	}
	if t == nil {
		var err error
		if t, err = a.deps.Shared.LoadTable(ctx); err != nil {
			a.noteErr(err)
			return
		}
	}
	now := a.deps.Clock.Now()
	if t == nil || !a.view.SetAt(t, now) {
		return
	}
	rep := region.ReportOf(a.cfg.Name, now, a.core.Demand(now))
	rep.Pub, rep.Speaker = t.Pub, t.Speaker
	if err := a.putReport(ctx, rep); err != nil {
		a.noteErr(err)
	}
}

// hotSampleEvery is how often the agent samples its batched keys between
// rounds (Core.SampleHot): a fall of use is read within two windows of the
// demand estimate (100 ms each) plus this.
const hotSampleEvery = 20 * time.Millisecond

// probeEvery is how often the agent offers its breaker a probe between
// rounds (Core.Probe) and announces its cut if it changed: an open
// breaker's probe goes within this of its back-off's end, and the word of
// a breaker that opened or closed leaves within this of it. A closed
// breaker returns at once, and an unchanged cut is not sent again.
const probeEvery = 25 * time.Millisecond

// betweenRounds offers the breaker a probe at now and announces whether
// the agent is cut from the store, as the round does at its start: the
// other agents take a cut agent's share out of the regional bucket only
// once they hear of it, and until then its emergency buckets spend on top
// of what they spend.
func (a *Agent) betweenRounds(ctx context.Context, now time.Time) {
	a.core.Probe(ctx, now)
	a.sayCut(now)
}

// sayCut announces whether the agent is cut from the store at now (its
// breaker not closed), where its membership carries the word, and
// returns it.
func (a *Agent) sayCut(now time.Time) bool {
	cut := a.core.Breaker().State(now) != region.BreakerClosed
	if an, ok := a.deps.Membership.(Announcer); ok {
		an.SetCut(cut)
	}
	return cut
}

// reportLevels stores the agent's report as soon as the core says a key's
// demand took a new level (Core.Leveled), until ctx ends: at most one
// every half tick, a level within half a tick of the last one reported so
// being left to the round. The round reports as it starts, and under
// chaos's redis-slow rounds came 230–370 ms apart: left to them, the old
// region's agents stored a fall 0.30–0.64 s after the shift, while
// another region waited for what it gave back.
func (a *Agent) reportLevels(ctx context.Context) {
	var last time.Time
	for {
		select {
		case <-ctx.Done():
			return
		case <-a.core.Leveled():
		}
		now := a.deps.Clock.Now()
		if !last.IsZero() && now.Sub(last) < a.cfg.Tick/2 {
			continue // the round reports it, within a tick
		}
		last = now
		rep := a.report(now)
		rep.Level = true
		if err := a.putReport(ctx, rep); err != nil {
			a.noteErr(err)
		}
	}
}

// tick is one round of the agent's periodic work.
func (a *Agent) tick(ctx context.Context, lastPoll *time.Time) {
	now := a.deps.Clock.Now()
	members := a.deps.Membership.Members()
	if !slices.Contains(members, a.cfg.Name) {
		members = append(members, a.cfg.Name)
		slices.Sort(members)
	}
	a.core.SetLive(len(members))
	// An agent that cannot reach the store says so (its emergency buckets
	// decide), and the others take its share out of the regional bucket.
	cutSelf := a.sayCut(now)
	var cut []string
	if an, ok := a.deps.Membership.(Announcer); ok {
		cut = an.Cut()
	}
	a.core.SetPeersCut(len(cut))
	// The speaker is the agent that published the table this one decides
	// with while it reaches the store, else the lowest of the agents that
	// reach it (all of them when none does) (region.SpeakerOf), and speaks
	// only while it holds the lease.
	candidates := slices.DeleteFunc(slices.Clone(members), func(m string) bool {
		return slices.Contains(cut, m) || (cutSelf && m == a.cfg.Name)
	})
	if len(candidates) == 0 {
		candidates = members
	}
	speak := a.deps.Transport != nil && region.SpeakerOf(candidates, a.view.Speaker()) == a.cfg.Name && now.Sub(a.started) >= a.cfg.SpeakerWait
	a.mu.Lock()
	a.members = members
	a.mu.Unlock()
	// The failover poll runs beside the round's first calls, so neither
	// waits for the other.
	var polled chan struct{}
	if a.cfg.FailoverPoll > 0 && a.deps.Redis != nil && now.Sub(*lastPoll) >= a.cfg.FailoverPoll {
		*lastPoll = now
		polled = make(chan struct{})
		go func() {
			defer close(polled)
			a.pollFailover(ctx, now)
		}()
	}
	// The report goes first, as soon as the core has sampled the demand:
	// after the round's other calls to the store it was as old as they
	// took when it reached the speaking agent, a few round trips under a
	// slow store (the poll, and the batch tokens the core gives back, most
	// often in a region whose allocation just shrank and whose fall of
	// demand another region waits for). A failover the poll finds is
	// applied before the core gives batch tokens back, as before.
	ok := true
	var rep region.DemandReport
	a.core.TickSampled(ctx, now, func() {
		rep = a.report(now)
		if err := a.putReport(ctx, rep); err != nil {
			a.noteErr(err)
			ok = false
		}
		if polled != nil {
			<-polled
		}
	})
	// While the breaker is open the report's fate tells the core
	// (Core.Elsewhere): taken after one that was not, the store is back,
	// so the breaker probes now rather than at the end of its back-off,
	// and the report, which carried no demand for the rules that fail
	// closed, is stored again with it. Left to the back-off (up to
	// 500 ms), the speaker lent the region's share away meanwhile.
	if cutSelf {
		at := a.deps.Clock.Now()
		if a.core.Elsewhere(ctx, at, ok) && ok {
			a.sayCut(at)
			rep = a.report(at)
			if err := a.putReport(ctx, rep); err != nil {
				a.noteErr(err)
				ok = false
			}
		}
	}
	if n := a.core.Breaker().Opened(); n != a.opened {
		// Why a breaker opened is what tells an outage from a slow store.
		a.opened = n
		a.log.Warn("agent: breaker on the regional store opened", "region", a.Region(), "agent", a.cfg.Name,
			"opened", n, "state", a.core.Breaker().State(now).String(), "deadline", a.core.Breaker().Deadline(), "err", a.core.LastError())
	}
	fence, held := a.holdSpeaker(ctx, now, speak)
	a.setSpeaking(ctx, speak && held, fence)
	// An agent that does not speak reads the table at its round, a table
	// no notice brought; so does one that stands without the lease (two
	// that cannot see each other both stand; one back from a cut names
	// itself in its view until it reads another's table): reading only
	// when it did not stand, it decided with its own last table, at its
	// floors once that lease ended, for as long as it stood.
	if !speak || !held {
		if t, err := a.deps.Shared.LoadTable(ctx); err != nil {
			a.noteErr(err)
			ok = false
		} else if t != nil && a.view.SetAt(t, a.deps.Clock.Now()) {
			// A table no notice brought (none announced, or one lost):
			// the report says so at once, as it did when it came last.
			rep.Pub, rep.Speaker = t.Pub, t.Speaker
			if err := a.putReport(ctx, rep); err != nil {
				a.noteErr(err)
				ok = false
			}
		}
	}
	if ok {
		a.noteOK()
	}
}

// report is the agent's report at now: its demand, and the table it
// decides with.
func (a *Agent) report(now time.Time) region.DemandReport {
	rep := region.ReportOf(a.cfg.Name, now, a.core.Demand(now))
	if t := a.view.Table(); t != nil {
		rep.Pub, rep.Speaker = t.Pub, t.Speaker
	}
	return rep
}

// putReport stores the agent's report, announced when the store passes
// notices (Notifier.Adopt): the speaking agent then has the agent's demand
// and adoption one trip to the store after it was stored, without reading
// it.
func (a *Agent) putReport(ctx context.Context, rep region.DemandReport) error {
	nf, ok := a.deps.Shared.(Notifier)
	if !ok {
		return a.deps.Shared.PutDemand(ctx, rep)
	}
	err := nf.Adopt(ctx, rep)
	if err != nil && !errors.Is(err, ErrNotAnnounced) {
		return err
	}
	a.notices.note(a.log, err, "reports", "region", a.Region(), "agent", a.cfg.Name)
	return nil
}

// noteErr records err as the last error, logging it unless it repeats one
// still current.
func (a *Agent) noteErr(err error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastError == nil || a.recovered || a.lastError.Error() != err.Error() {
		a.log.Warn("agent: store or shared state", "region", a.Region(), "agent", a.cfg.Name, "err", err)
	}
	a.lastError, a.lastErrorAt, a.recovered = err, a.deps.Clock.Now(), false
}

// noteOK records a round that reached the shared state without error: the
// last error, if any, is no longer current.
func (a *Agent) noteOK() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.lastError != nil && !a.recovered {
		a.recovered = true
		a.log.Info("agent: shared state reachable again", "region", a.Region(), "agent", a.cfg.Name,
			"after", a.deps.Clock.Now().Sub(a.lastErrorAt).Round(time.Millisecond))
	}
}

// holdSpeaker takes or renews the speaker lease when the agent stands to
// speak, and gives it up when it no longer does; it returns the lease and
// whether it is held at now. A lease the store did not renew (it did not
// answer) is held until it ends.
func (a *Agent) holdSpeaker(ctx context.Context, now time.Time, want bool) (Fence, bool) {
	a.mu.Lock()
	f, till := a.fence, a.fenceTill
	a.mu.Unlock()
	if !want {
		if !f.IsZero() {
			a.setSpeaking(ctx, false, Fence{}) // stop speaking before the lease goes
			if err := a.deps.Shared.ReleaseSpeaker(ctx, f); err != nil {
				a.noteErr(err)
			}
			a.mu.Lock()
			a.fence, a.fenceTill = Fence{}, time.Time{}
			a.mu.Unlock()
		}
		return Fence{}, false
	}
	nf, err := a.deps.Shared.HoldSpeaker(ctx, a.cfg.Name, f, a.cfg.SpeakerLease)
	switch {
	case err == nil:
		f, till = nf, now.Add(a.cfg.SpeakerLease-a.cfg.SpeakerLease/10)
	case errors.Is(err, ErrNotSpeaker):
		f, till = Fence{}, time.Time{}
	default:
		a.noteErr(err)
	}
	a.mu.Lock()
	a.fence, a.fenceTill = f, till
	a.mu.Unlock()
	return f, now.Before(till)
}

// leaseFence is the lease client's view of the speaker lease: the fence
// it was started under, held while the agent's lease is that one and has
// not ended.
func (a *Agent) leaseFence() (Fence, bool) {
	now := a.deps.Clock.Now()
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.spkFence, a.fence == a.spkFence && now.Before(a.fenceTill)
}

// setSpeaking starts or stops the lease client; a client running under
// another lease than fence is restarted, since another agent may have
// spoken in between.
func (a *Agent) setSpeaking(ctx context.Context, speak bool, fence Fence) {
	a.mu.Lock()
	if a.speaking && speak && a.spkFence != fence {
		a.mu.Unlock()
		a.setSpeaking(ctx, false, Fence{})
		a.mu.Lock()
	}
	if speak == a.speaking || a.closing {
		a.mu.Unlock()
		return
	}
	a.speaking = speak
	if !speak {
		cancel, done := a.stopSpk, a.spkDone
		a.spk, a.stopSpk, a.spkDone = nil, nil, nil
		a.mu.Unlock()
		a.log.Info("agent: another agent speaks for the region now", "region", a.Region(), "agent", a.cfg.Name)
		cancel()
		<-done
		return
	}
	// Only setSpeaking and stop end the speaker, so that stop can decide
	// (closing) whether the lease is released before the speaker exits.
	a.spkFence = fence
	s, err := NewLeaseClient(a.cfg.Speaker, LeaseDeps{Clock: a.deps.Clock, Shared: a.deps.Shared, Store: a.deps.Store,
		View: a.view, Transport: a.deps.Transport, Members: a.Members, Release: a.releaseOnStop, Logger: a.log,
		Fence: a.leaseFence, Seed: a.rng.Uint64()})
	if err != nil {
		a.speaking = false
		a.mu.Unlock()
		a.noteErr(err)
		return
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	done := make(chan struct{})
	a.spk, a.stopSpk, a.spkDone = s, cancel, done
	a.mu.Unlock()
	a.log.Info("agent: speaking for the region", "region", a.Region(), "agent", a.cfg.Name)
	go func() {
		defer close(done)
		if err := s.Run(sctx); err != nil {
			a.noteErr(err)
		}
	}()
}

// releaseOnStop reports whether the speaker should release the lease as it
// stops: only when the agent is closing and no other agent is alive.
func (a *Agent) releaseOnStop() bool {
	a.mu.Lock()
	closing := a.closing
	a.mu.Unlock()
	return closing && len(a.deps.Membership.Members()) <= 1
}

// stop returns batch tokens and stops the speaker.
func (a *Agent) stop() {
	a.mu.Lock()
	a.closing = true
	cancel, done := a.stopSpk, a.spkDone
	f := a.fence
	a.mu.Unlock()
	if cancel != nil {
		cancel()
		<-done
	}
	ctx, c := context.WithTimeout(context.Background(), time.Second)
	defer c()
	// The next agent may take the lease at once, not when it ends.
	if err := a.deps.Shared.ReleaseSpeaker(ctx, f); err != nil {
		a.noteErr(err)
	}
	// Its lease client has stopped: the status says so at once, not when
	// the agent's own view of the lease would have ended.
	a.mu.Lock()
	a.speaking, a.fence, a.fenceTill = false, Fence{}, time.Time{}
	a.mu.Unlock()
	a.core.Shutdown(ctx, a.deps.Clock.Now())
}

// SetRules puts a new rules set in force: per-rule policies and scopes,
// budget names, and the budgets the speaking agent's Holder serves (floors
// change at once). emptyOnFailover is as in region.RuleConfigs.
func (a *Agent) SetRules(set *rules.Set, emptyOnFailover []string) error {
	budgets := region.Budgets(set, a.cfg.Core.Floors, a.cfg.Speaker.Policy)
	a.core.SetRules(region.RuleConfigs(set, emptyOnFailover))
	a.store.SetNamer(region.NewNamer(set))
	a.mu.Lock()
	a.cfg.Speaker.Budgets = budgets
	s := a.spk
	a.mu.Unlock()
	if s != nil {
		return s.SetBudgets(budgets)
	}
	return nil
}

// Members returns the live agents of the region as last seen.
func (a *Agent) Members() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.members)
}

// pollFailover reads the Redis server's run id and role; a change of
// either from what was seen before is a failover or a restart, after which
// buckets may have lost writes. On a Cluster it does so per shard: each
// slot range's primary (a replica promoted, by CLUSTER FAILOVER or after
// its primary died, changes it) and each primary's run id (a primary
// restarted in place).
func (a *Agent) pollFailover(ctx context.Context, now time.Time) {
	c, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	if cc, ok := a.deps.Redis.(*redis.ClusterClient); ok {
		a.pollCluster(c, cc, now)
		return
	}
	info, err := a.deps.Redis.Info(c, "server", "replication").Result()
	if err != nil {
		return
	}
	runID, role := infoField(info, "run_id"), infoField(info, "role")
	a.mu.Lock()
	changed := a.runID != "" && (runID != a.runID || role != a.role)
	a.runID, a.role = runID, role
	a.mu.Unlock()
	if changed {
		a.log.Warn("agent: regional Redis failed over or restarted", "region", a.Region(), "run_id", runID, "role", role)
		a.core.Failover(now)
	}
}

// pollCluster is pollFailover on a Redis Cluster. A shard is known by
// its slot range; its identity is its primary's node id, and each
// primary's run id is kept by node id. A shard that fails over drains
// every key of the rules that empty on failover, not only its own: the
// core keeps one failover epoch, which errs on the side of denying.
func (a *Agent) pollCluster(ctx context.Context, cc *redis.ClusterClient, now time.Time) {
	list, err := cc.ClusterShards(ctx).Result()
	if err != nil {
		return
	}
	shards := make(map[string]string, len(list))
	for _, s := range list {
		var rng []byte
		for i, r := range s.Slots {
			if i > 0 {
				rng = append(rng, ',')
			}
			rng = strconv.AppendInt(append(strconv.AppendInt(rng, r.Start, 10), '-'), r.End, 10)
		}
		// A shard's primary is its online master; a shard with none (its
		// primary failed, no replica promoted yet) is left as it was.
		for _, n := range s.Nodes {
			if n.Role == "master" && n.Health == "online" && len(rng) > 0 {
				shards[string(rng)] = n.ID
				break
			}
		}
	}
	var mu sync.Mutex
	runs := map[string]string{}
	// A primary that does not answer leaves its run id unknown this round;
	// the slot map above still shows its replacement.
	_ = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
		id, err := c.ClusterMyID(ctx).Result()
		if err != nil {
			return err
		}
		info, err := c.Info(ctx, "server").Result()
		if err != nil {
			return err
		}
		mu.Lock()
		runs[id] = infoField(info, "run_id")
		mu.Unlock()
		return nil
	})
	var moved []string
	a.mu.Lock()
	for rng, id := range shards {
		if old, ok := a.shards[rng]; ok && old != id {
			moved = append(moved, rng)
		} else if ok && runs[id] != "" && a.runs[id] != "" && runs[id] != a.runs[id] {
			moved = append(moved, rng)
		}
	}
	if a.shards == nil {
		a.shards, a.runs = map[string]string{}, map[string]string{}
	}
	for rng, id := range shards {
		a.shards[rng] = id
	}
	for id, run := range runs {
		a.runs[id] = run
	}
	a.mu.Unlock()
	if len(moved) > 0 {
		slices.Sort(moved)
		a.log.Warn("agent: regional Redis Cluster shards failed over or restarted", "region", a.Region(), "slots", moved)
		a.core.Failover(now)
	}
}

// infoField returns field's value in a Redis INFO reply.
func infoField(info, field string) string {
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), field+":"); ok {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Status describes an agent for health checks, metrics and the demo.
type Status struct {
	Region  string
	Agent   string
	Members []string
	// Speaking: the agent runs the region's lease client and holds the
	// speaker lease at now (a client whose lease ended sends nothing, even
	// before the next tick stops it).
	Speaking bool
	// Lease is the region's lease as the shared table says (zero without
	// a table).
	LeaseLive bool
	LeaseEnd  time.Time
	Table     *region.Table
	// Adopted is when the agent began deciding with Table (its clock),
	// zero if not known.
	Adopted time.Time
	Breaker region.BreakerState
	// LastError is the last error met with the shared state (or in
	// starting the speaker), nil if none; LastErrorAt is when, and
	// LastErrorCurrent is false once a later round reached the shared
	// state without error.
	LastError        error
	LastErrorAt      time.Time
	LastErrorCurrent bool
}

// Status reports the agent's state at its clock's now.
func (a *Agent) Status() Status {
	now := a.deps.Clock.Now()
	t, adopted := a.view.Installed()
	a.mu.Lock()
	st := Status{Region: a.Region(), Agent: a.cfg.Name, Members: slices.Clone(a.members), Speaking: a.speaking && now.Before(a.fenceTill),
		Table: t, Breaker: a.core.Breaker().State(now), LastError: a.lastError, LastErrorAt: a.lastErrorAt,
		LastErrorCurrent: a.lastError != nil && !a.recovered}
	a.mu.Unlock()
	if t != nil {
		st.LeaseLive, st.LeaseEnd, st.Adopted = t.Live(now), t.LeaseEnd, adopted
	}
	return st
}

// HolderStatus reports the speaker's lease.Holder status; ok is false when
// this agent does not speak.
func (a *Agent) HolderStatus() (lease.HolderStatus, bool) {
	a.mu.Lock()
	s := a.spk
	a.mu.Unlock()
	if s == nil {
		return lease.HolderStatus{}, false
	}
	return s.Status()
}

// ErrInvalidConfig: a Config or GossipConfig field is out of range.
var ErrInvalidConfig = errors.New("agent: invalid config")
