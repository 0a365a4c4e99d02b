package agent

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

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

// Run ticks the allocator every tick of its clock until ctx ends. Its
// timer is re-armed after each round, so a test on a manual clock sees it
// pending again once the round is done (clock.Manual.WaitForTimers).
func (c *LocalCoordinator) Run(ctx context.Context, tick time.Duration) {
	t := c.clock.NewTimer(tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C():
			c.mu.Lock()
			c.alloc.Tick(c.clock.Now())
			c.flushLocked()
			c.mu.Unlock()
			t.Reset(tick)
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

// Keys reports the allocator's view of its hot keys (at most limit).
func (c *LocalCoordinator) Keys(limit int) []lease.KeyStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.alloc.Keys(limit)
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
