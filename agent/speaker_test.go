package agent

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// cutShared is a region's Shared as one agent reaches it: down, every
// call fails as an unreachable store's would.
type cutShared struct {
	Shared
	down atomic.Bool
}

var errCut = fmt.Errorf("%w: test: cut from the store", bucket.ErrUnavailable)

func (c *cutShared) HoldSpeaker(ctx context.Context, agent string, held Fence, ttl time.Duration) (Fence, error) {
	if c.down.Load() {
		return Fence{}, errCut
	}
	return c.Shared.HoldSpeaker(ctx, agent, held, ttl)
}

func (c *cutShared) ReleaseSpeaker(ctx context.Context, f Fence) error {
	if c.down.Load() {
		return errCut
	}
	return c.Shared.ReleaseSpeaker(ctx, f)
}

func (c *cutShared) PublishTable(ctx context.Context, t *region.Table, f Fence) (bool, error) {
	if c.down.Load() {
		return false, errCut
	}
	return c.Shared.PublishTable(ctx, t, f)
}

func (c *cutShared) LoadTable(ctx context.Context) (*region.Table, error) {
	if c.down.Load() {
		return nil, errCut
	}
	return c.Shared.LoadTable(ctx)
}

func (c *cutShared) PutDemand(ctx context.Context, r region.DemandReport) error {
	if c.down.Load() {
		return errCut
	}
	return c.Shared.PutDemand(ctx, r)
}

func (c *cutShared) Demands(ctx context.Context) ([]region.DemandReport, error) {
	if c.down.Load() {
		return nil, errCut
	}
	return c.Shared.Demands(ctx)
}

// streamCount is a lease.Transport that counts the streams it has open.
type streamCount struct {
	lease.Transport
	open *atomic.Int64
}

func (s streamCount) Connect(ctx context.Context) (lease.Stream, error) {
	st, err := s.Transport.Connect(ctx)
	if err != nil {
		return nil, err
	}
	s.open.Add(1)
	return &countedStream{Stream: st, open: s.open}, nil
}

type countedStream struct {
	lease.Stream
	open *atomic.Int64
	once sync.Once
}

func (c *countedStream) Close() error {
	c.once.Do(func() { c.open.Add(-1) })
	return c.Stream.Close()
}

// speakerRegion is the region eu of a budget split with us, its
// coordinator running until ctx ends, as the speaker tests below run it:
// agents share its in-process store and shared state, and config gives
// each its settings (ticks of 20 ms).
type speakerRegion struct {
	coord  *LocalCoordinator
	shared *MemShared
	mem    *bucket.Memory
}

func newSpeakerRegion(t *testing.T, ctx context.Context) (*speakerRegion, func(name string) Config) {
	t.Helper()
	spec := lease.Split{Regions: []string{"eu", "us"}}
	budgets := []lease.Budget{{Rule: "api", Limit: bucket.PerSecond(100), Regions: spec.Regions}}
	coord, err := NewLocalCoordinator(testLeaseConfig(budgets), nil)
	if err != nil {
		t.Fatal(err)
	}
	go coord.Run(ctx, 20*time.Millisecond)
	config := func(name string) Config {
		cfg := DefaultConfig()
		cfg.Name, cfg.Core.Region, cfg.Core.Floors = name, "eu", spec
		cfg.Speaker.Budgets, cfg.Speaker.Refresh, cfg.Speaker.Drift, cfg.Speaker.Tick = budgets, 400*time.Millisecond, 100*time.Millisecond, 20*time.Millisecond
		cfg.Tick = 20 * time.Millisecond
		return cfg
	}
	return &speakerRegion{coord: coord, shared: NewMemShared(), mem: bucket.NewMemory(bucket.MemoryOptions{})}, config
}

// speakingOf lists the agents that say they speak; a nil one is stopped.
func speakingOf(agents []*Agent) []int {
	var out []int
	for i, a := range agents {
		if a != nil && a.Status().Speaking {
			out = append(out, i)
		}
	}
	return out
}

// watchSpeakers samples agents every 10 ms for d of a synctest bubble's
// clock, once the bubble is idle, and fails t when two speak at once;
// check runs at every sample.
func watchSpeakers(t *testing.T, d time.Duration, agents []*Agent, check func()) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); {
		time.Sleep(10 * time.Millisecond)
		synctest.Wait()
		if s := speakingOf(agents); len(s) > 1 {
			t.Fatalf("at %s: agents %v speak at once", time.Now().Format(time.StampMilli), s)
		}
		check()
	}
}

// TestOneSpeakerUnderASplit: a region's two agents cannot see each other
// (each one's membership is itself alone, as in a partition inside the
// region) but share the region's store. Each stands to speak; the speaker
// lease in the store lets one. When that one is cut from the store it
// cannot renew the lease: it stops speaking and drops its stream before
// the lease ends in the store, and the other takes it over then. Sampled
// every 10 ms throughout: never two agents speaking, never two streams
// open. In a synctest bubble on its fake clock.
func TestOneSpeakerUnderASplit(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		reg, config := newSpeakerRegion(t, ctx)
		var agents []*Agent
		var cuts []*cutShared
		var streams [2]atomic.Int64
		var wg sync.WaitGroup
		names := []string{"eu-0", "eu-1"}
		for i, name := range names {
			cs := &cutShared{Shared: reg.shared}
			a, err := New(config(name), Deps{Store: reg.mem, Shared: cs, Membership: NewStaticMembership(name),
				Transport: streamCount{Transport: reg.coord.Transport("eu"), open: &streams[i]},
				Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)), Seed: uint64(i + 1)})
			if err != nil {
				t.Fatal(err)
			}
			agents, cuts = append(agents, a), append(cuts, cs)
			wg.Add(1)
			go func() { defer wg.Done(); a.Run(ctx) }()
		}
		speaking := func() []int { return speakingOf(agents) }
		watch := func(d time.Duration) {
			t.Helper()
			watchSpeakers(t, d, agents, func() {
				if n := streams[0].Load() + streams[1].Load(); n > 1 {
					t.Fatalf("at %s: %d streams open (%d, %d)", time.Now().Format(time.StampMilli), n, streams[0].Load(), streams[1].Load())
				}
			})
		}
		watch(3 * time.Second) // SpeakerWait, a hello and a grant
		s := speaking()
		if len(s) != 1 {
			t.Fatalf("speakers %v after 3 s, want one", s)
		}
		first, other := s[0], 1-s[0]
		cuts[first].down.Store(true)
		watch(3 * time.Second)
		if s := speaking(); len(s) != 1 || s[0] != other {
			t.Fatalf("speakers %v 3 s after agent %d was cut from the store, want agent %d alone", s, first, other)
		}
		if streams[first].Load() != 0 {
			t.Fatalf("agent %d, cut, still has a stream", first)
		}
		// Healed, the first stands to speak again (it sees no one) but the
		// lease is the other's: it stays silent.
		cuts[first].down.Store(false)
		watch(3 * time.Second)
		if s := speaking(); len(s) != 1 || s[0] != other {
			t.Fatalf("speakers %v after the heal, want agent %d alone", s, other)
		}
		if !agents[other].Status().LeaseLive {
			t.Fatal("the region's lease lapsed across the takeover")
		}
		// The first, standing without the lease and with no notices from
		// this store, decides with the speaker's tables: it reads them at
		// its rounds, as an agent that does not stand does.
		tb := agents[first].View().Table()
		if tb == nil || tb.Speaker != names[other] || !tb.Live(time.Now()) {
			t.Fatalf("agent %d, standing without the lease, decides with %+v, want a live table of %s", first, tb, names[other])
		}
		cancel()
		wg.Wait()
	})
}

// TestRedisSpeakerLease: the lease's scripts on a real Redis. One agent
// takes it; another cannot while it is held; the holder renews it and
// publishes under its fence; a publication under any other fence, or
// none, is refused; released, the lease goes to the next with a higher
// token, and the old fence publishes no more. The lease expires in the
// store after its TTL (PTTL within it).
func TestRedisSpeakerLease(t *testing.T) {
	c := testenv.RedisClient(t)
	ctx := context.Background()
	// A prefix of its own per run: a table an earlier run (-count) left
	// in the suite's Redis would refuse this run's publication numbers.
	sh := NewRedisShared(c, fmt.Sprintf("allot-test-%s-%d:", t.Name(), time.Now().UnixNano()), "eu", time.Second, time.Minute)
	a, err := sh.HoldSpeaker(ctx, "eu-0", Fence{}, 2*time.Second)
	if err != nil || a.Agent != "eu-0" || a.Token == 0 {
		t.Fatalf("first hold: %+v %v", a, err)
	}
	if _, err := sh.HoldSpeaker(ctx, "eu-1", Fence{}, 2*time.Second); !errors.Is(err, ErrNotSpeaker) {
		t.Fatalf("second agent: %v, want ErrNotSpeaker", err)
	}
	if r, err := sh.HoldSpeaker(ctx, "eu-0", a, 2*time.Second); err != nil || r != a {
		t.Fatalf("renewal: %+v %v, want %+v", r, err, a)
	}
	if ms, err := c.PTTL(ctx, sh.leaseKey).Result(); err != nil || ms <= 0 || ms > 2*time.Second {
		t.Fatalf("lease PTTL %s %v, want within its 2 s", ms, err)
	}
	tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 10}
	if ok, err := sh.PublishTable(ctx, tab, a); err != nil || !ok {
		t.Fatalf("publish under the lease: %v %v", ok, err)
	}
	for _, f := range []Fence{{}, {Agent: "eu-1", Token: a.Token}, {Agent: "eu-0", Token: a.Token + 1}} {
		if _, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Pub: 11}, f); !errors.Is(err, ErrNotSpeaker) {
			t.Fatalf("publish under %q: %v, want ErrNotSpeaker", f, err)
		}
	}
	if err := sh.ReleaseSpeaker(ctx, Fence{Agent: "eu-1", Token: a.Token}); err != nil {
		t.Fatal(err)
	}
	if _, err := sh.HoldSpeaker(ctx, "eu-1", Fence{}, 2*time.Second); !errors.Is(err, ErrNotSpeaker) {
		t.Fatalf("after another's release: %v, want the lease still eu-0's", err)
	}
	if err := sh.ReleaseSpeaker(ctx, a); err != nil {
		t.Fatal(err)
	}
	b, err := sh.HoldSpeaker(ctx, "eu-1", Fence{}, 2*time.Second)
	if err != nil || b.Agent != "eu-1" || b.Token <= a.Token {
		t.Fatalf("after the release: %+v %v, want eu-1 with a higher token than %d", b, err, a.Token)
	}
	if _, err := sh.PublishTable(ctx, &region.Table{Region: "eu", Pub: 12}, a); !errors.Is(err, ErrNotSpeaker) {
		t.Fatalf("the old holder publishes: %v, want ErrNotSpeaker", err)
	}
	if tb, err := sh.LoadTable(ctx); err != nil || tb.Pub != 10 {
		t.Fatalf("stored table %+v %v, want publication 10", tb, err)
	}
}

// TestSpeakerStaysWhenALowerAgentJoins: a region's speaker keeps speaking
// when an agent with a lower name joins (one restarted): the newcomer,
// which would be the lowest, decides with the speaker's table and does not
// stand, so the region keeps its stream and its Speaker. When the speaker
// stops and leaves the membership, the newcomer takes over. Sampled every
// 10 ms: never two agents speaking. In a synctest bubble on its fake
// clock. With the speaker chosen as the lowest name alone, eu-0 takes
// over 1.5 s (SpeakerWait) after it starts.
func TestSpeakerStaysWhenALowerAgentJoins(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		reg, config := newSpeakerRegion(t, ctx)
		names := []string{"eu-0", "eu-1"}
		var agents [2]*Agent
		var members [2]*StaticMembership
		var opened [2]atomic.Int64
		var stops [2]context.CancelFunc
		var done [2]chan struct{}
		var wg sync.WaitGroup
		start := func(i int, others ...string) {
			members[i] = NewStaticMembership(names[i], others...)
			a, err := New(config(names[i]), Deps{Store: reg.mem, Shared: reg.shared, Membership: members[i],
				Transport: openCount{reg.coord.Transport("eu"), &opened[i]},
				Logger:    slog.New(slog.NewTextHandler(io.Discard, nil)), Seed: uint64(i + 1)})
			if err != nil {
				t.Fatal(err)
			}
			agents[i] = a
			actx, stop := context.WithCancel(ctx)
			stops[i], done[i] = stop, make(chan struct{})
			wg.Add(1)
			go func() { defer wg.Done(); defer close(done[i]); a.Run(actx) }()
		}
		speaking := func() []int { return speakingOf(agents[:]) }
		watch := func(d time.Duration) {
			t.Helper()
			watchSpeakers(t, d, agents[:], func() {})
		}
		start(1)
		watch(3 * time.Second) // SpeakerWait, a hello and a grant
		if s := speaking(); len(s) != 1 || s[0] != 1 || !agents[1].Status().LeaseLive {
			t.Fatalf("speakers %v after 3 s (lease live %v), want eu-1 alone with a live lease", s, agents[1].Status().LeaseLive)
		}
		// eu-0 joins: both see both.
		start(0, names[1])
		members[1].Set(names)
		watch(4 * time.Second)
		if s := speaking(); len(s) != 1 || s[0] != 1 {
			t.Fatalf("speakers %v 4 s after eu-0 joined, want eu-1 still", s)
		}
		if n := opened[1].Load(); n != 1 {
			t.Fatalf("eu-1 opened %d streams, want its first alone", n)
		}
		if n := opened[0].Load(); n != 0 {
			t.Fatalf("eu-0, which does not speak, opened %d streams", n)
		}
		if !agents[1].Status().LeaseLive {
			t.Fatal("the region's lease lapsed while eu-0 joined")
		}
		// eu-1 stops and leaves: eu-0 takes over.
		stops[1]()
		<-done[1]
		if agents[1].Status().Speaking {
			t.Fatal("eu-1 says it speaks after it stopped")
		}
		members[0].Set(names[:1])
		watch(3 * time.Second)
		if s := speaking(); len(s) != 1 || s[0] != 0 {
			t.Fatalf("speakers %v 3 s after eu-1 left, want eu-0", s)
		}
		if !agents[0].Status().LeaseLive {
			t.Fatal("eu-0 speaks without a live lease")
		}
		cancel()
		wg.Wait()
	})
}

// openCount is a lease.Transport that counts the streams it opened.
type openCount struct {
	lease.Transport
	n *atomic.Int64
}

func (o openCount) Connect(ctx context.Context) (lease.Stream, error) {
	st, err := o.Transport.Connect(ctx)
	if err == nil {
		o.n.Add(1)
	}
	return st, err
}
