package agent

import (
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Membership tells an agent which agents of its region are alive.
type Membership interface {
	// Self is this agent's name.
	Self() string
	// Members returns the live agents' names, sorted, this one included.
	Members() []string
}

// Announcer is a Membership through which an agent tells the region's
// other agents that it cannot reach the regional store, and learns which
// of them say so. It must not depend on that store: Gossip carries the
// word in memberlist's node metadata. An agent that announces a cut
// decides by its emergency buckets at its share of the region's
// allocation, which the others then take out of what they spend through
// the regional bucket (region.Core.SetPeersCut); and it does not stand to
// speak for the region, which needs the store.
type Announcer interface {
	// SetCut announces whether this agent is cut from the store.
	SetCut(cut bool)
	// Cut returns the live agents, this one aside, that announce a cut,
	// sorted.
	Cut() []string
}

// StaticMembership is a fixed membership: a single agent, or tests.
type StaticMembership struct {
	mu      sync.Mutex
	self    string
	members []string
	cut     map[string]bool
}

var _ Announcer = (*StaticMembership)(nil)

// NewStaticMembership returns a membership of self and others.
func NewStaticMembership(self string, others ...string) *StaticMembership {
	m := &StaticMembership{self: self}
	m.Set(append([]string{self}, others...))
	return m
}

// Self implements Membership.
func (m *StaticMembership) Self() string { return m.self }

// Members implements Membership.
func (m *StaticMembership) Members() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.members)
}

// SetCut implements Announcer.
func (m *StaticMembership) SetCut(cut bool) { m.SetCutOf(m.self, cut) }

// SetCutOf records what member name announces, as gossip would carry it.
func (m *StaticMembership) SetCutOf(name string, cut bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.cut == nil {
		m.cut = map[string]bool{}
	}
	m.cut[name] = cut
}

// Cut implements Announcer.
func (m *StaticMembership) Cut() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []string
	for _, n := range m.members {
		if n != m.self && m.cut[n] {
			out = append(out, n)
		}
	}
	return out
}

// Set replaces the live members.
func (m *StaticMembership) Set(members []string) {
	ms := slices.Clone(members)
	slices.Sort(ms)
	ms = slices.Compact(ms)
	m.mu.Lock()
	m.members = ms
	m.mu.Unlock()
}

// GossipConfig configures memberlist membership within a region.
type GossipConfig struct {
	// Name is this agent's name, unique in the region.
	Name string
	// Region labels every packet, so agents of different regions that
	// reach each other never merge.
	Region string
	// BindAddr and BindPort are where memberlist listens (TCP and UDP).
	// Port 0 picks a free port.
	BindAddr string
	BindPort int
	// AdvertiseAddr and AdvertisePort, when set, are where the other
	// agents reach this one (TCP and UDP) instead of the bind address: a
	// NAT, or a proxy in front of it.
	AdvertiseAddr string
	AdvertisePort int
	// Join lists host:port of agents to join; empty starts a new region.
	Join []string
	// ProbeInterval, ProbeTimeout and SuspicionMult set how fast a dead
	// agent is noticed (about ProbeInterval×SuspicionMult).
	ProbeInterval time.Duration
	ProbeTimeout  time.Duration
	SuspicionMult int
	// GossipInterval is how often state is gossiped.
	GossipInterval time.Duration
	// JoinRetry is how often an agent that is alone tries Join again.
	JoinRetry time.Duration
	// Logger receives memberlist's log; nil discards it.
	Logger *log.Logger
}

// DefaultGossipConfig returns settings for agents on one LAN or host: a dead
// agent is noticed within about two seconds.
func DefaultGossipConfig() GossipConfig {
	return GossipConfig{
		BindAddr:       "127.0.0.1",
		ProbeInterval:  500 * time.Millisecond, // a region's agents are close: probe often
		ProbeTimeout:   200 * time.Millisecond, // far above a LAN round trip
		SuspicionMult:  3,                      // suspect for ~3 probe rounds before declaring death
		GossipInterval: 100 * time.Millisecond, // spread changes within a few hundred ms
		JoinRetry:      time.Second,            // peers that start together find each other within a second
	}
}

// Validate reports the first problem with c, naming the field.
func (c GossipConfig) Validate() error {
	switch {
	case c.Name == "":
		return fmt.Errorf("%w: gossip name is empty", ErrInvalidConfig)
	case c.Region == "":
		return fmt.Errorf("%w: gossip region is empty", ErrInvalidConfig)
	case c.BindPort < 0 || c.BindPort > 65535:
		return fmt.Errorf("%w: gossip bind_port=%d out of range", ErrInvalidConfig, c.BindPort)
	case net.ParseIP(c.BindAddr) == nil:
		return fmt.Errorf("%w: gossip bind_addr=%q is not an IP address", ErrInvalidConfig, c.BindAddr)
	case c.AdvertiseAddr != "" && net.ParseIP(c.AdvertiseAddr) == nil:
		return fmt.Errorf("%w: gossip advertise_addr=%q is not an IP address", ErrInvalidConfig, c.AdvertiseAddr)
	case c.AdvertisePort < 0 || c.AdvertisePort > 65535 || (c.AdvertisePort > 0) != (c.AdvertiseAddr != ""):
		return fmt.Errorf("%w: gossip advertise_port=%d must be in [1, 65535] with an advertise_addr (%q), else 0", ErrInvalidConfig, c.AdvertisePort, c.AdvertiseAddr)
	case c.ProbeInterval <= 0 || c.ProbeTimeout <= 0 || c.ProbeTimeout >= c.ProbeInterval:
		return fmt.Errorf("%w: gossip probe_timeout=%s must be in (0, probe_interval=%s)", ErrInvalidConfig, c.ProbeTimeout, c.ProbeInterval)
	case c.SuspicionMult < 1:
		return fmt.Errorf("%w: gossip suspicion_mult=%d must be ≥ 1", ErrInvalidConfig, c.SuspicionMult)
	case c.GossipInterval <= 0:
		return fmt.Errorf("%w: gossip gossip_interval=%s must be > 0", ErrInvalidConfig, c.GossipInterval)
	case c.JoinRetry <= 0:
		return fmt.Errorf("%w: gossip join_retry=%s must be > 0", ErrInvalidConfig, c.JoinRetry)
	}
	return nil
}

// Gossip is Membership over hashicorp/memberlist: the agents of a region
// gossip to know who is alive. It is safe for concurrent use.
type Gossip struct {
	cfg  GossipConfig
	ml   *memberlist.Memberlist
	stop chan struct{}
	once sync.Once
	// cut is what this agent announces in its node metadata; updating
	// serializes the re-advertisements.
	cut      atomic.Bool
	updating sync.Mutex
	// peersCut is the agents whose metadata announces a cut, kept by the
	// event delegate: memberlist updates a node's Meta in place, so it is
	// read only in memberlist's callbacks.
	metaMu   sync.Mutex
	peersCut map[string]bool
}

var (
	_ Membership = (*Gossip)(nil)
	_ Announcer  = (*Gossip)(nil)
)

// metaCut is the node metadata of an agent that announces a cut.
const metaCut = "cut"

// gossipDelegate gives memberlist this agent's metadata; it carries no
// messages of its own.
type gossipDelegate struct{ g *Gossip }

func (d gossipDelegate) NodeMeta(int) []byte {
	if d.g.cut.Load() {
		return []byte(metaCut)
	}
	return nil
}

// NotifyJoin, NotifyLeave and NotifyUpdate keep Gossip.peersCut.
func (d gossipDelegate) NotifyJoin(n *memberlist.Node)   { d.note(n.Name, string(n.Meta) == metaCut) }
func (d gossipDelegate) NotifyUpdate(n *memberlist.Node) { d.note(n.Name, string(n.Meta) == metaCut) }
func (d gossipDelegate) NotifyLeave(n *memberlist.Node)  { d.note(n.Name, false) }

func (d gossipDelegate) note(name string, cut bool) {
	d.g.metaMu.Lock()
	defer d.g.metaMu.Unlock()
	if cut {
		d.g.peersCut[name] = true
	} else {
		delete(d.g.peersCut, name)
	}
}

func (gossipDelegate) NotifyMsg([]byte)                {}
func (gossipDelegate) GetBroadcasts(int, int) [][]byte { return nil }
func (gossipDelegate) LocalState(bool) []byte          { return nil }
func (gossipDelegate) MergeRemoteState([]byte, bool)   {}

// StartGossip creates the memberlist and joins the agents in cfg.Join. A
// join that reaches nobody is not an error: the agent starts alone and the
// others join it.
func StartGossip(cfg GossipConfig) (*Gossip, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	g := &Gossip{cfg: cfg, stop: make(chan struct{}), peersCut: map[string]bool{}}
	mc := memberlist.DefaultLANConfig()
	mc.Name = cfg.Name
	mc.Label = "allot-region:" + cfg.Region
	mc.BindAddr, mc.BindPort = cfg.BindAddr, cfg.BindPort
	mc.AdvertiseAddr, mc.AdvertisePort = cfg.BindAddr, cfg.BindPort
	if cfg.AdvertiseAddr != "" {
		mc.AdvertiseAddr, mc.AdvertisePort = cfg.AdvertiseAddr, cfg.AdvertisePort
	}
	mc.Delegate, mc.Events = gossipDelegate{g}, gossipDelegate{g}
	mc.ProbeInterval, mc.ProbeTimeout, mc.SuspicionMult = cfg.ProbeInterval, cfg.ProbeTimeout, cfg.SuspicionMult
	mc.GossipInterval = cfg.GossipInterval
	mc.PushPullInterval = 5 * time.Second
	mc.TCPTimeout = time.Second
	if cfg.Logger != nil {
		mc.Logger = cfg.Logger
	} else {
		mc.LogOutput = io.Discard
	}
	ml, err := memberlist.Create(mc)
	if err != nil {
		return nil, fmt.Errorf("agent: memberlist on %s:%d: %w", cfg.BindAddr, cfg.BindPort, err)
	}
	g.ml = ml
	if cfg.BindPort == 0 && cfg.AdvertiseAddr == "" {
		// Advertise the port the OS picked.
		g.cfg.BindPort = int(ml.LocalNode().Port)
	}
	if len(cfg.Join) > 0 {
		// Errors mean nobody answered yet (the others may be starting
		// too): keep trying while this agent is alone.
		_, _ = ml.Join(cfg.Join)
		go g.rejoin()
	}
	return g, nil
}

// rejoin retries the join every JoinRetry while the agent sees no one else.
func (g *Gossip) rejoin() {
	t := time.NewTicker(g.cfg.JoinRetry)
	defer t.Stop()
	for {
		select {
		case <-g.stop:
			return
		case <-t.C:
			if g.ml.NumMembers() <= 1 {
				_, _ = g.ml.Join(g.cfg.Join)
			}
		}
	}
}

// Addr returns host:port of this agent's memberlist, for others to join.
func (g *Gossip) Addr() string {
	n := g.ml.LocalNode()
	return net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
}

// Self implements Membership.
func (g *Gossip) Self() string { return g.cfg.Name }

// Members implements Membership.
func (g *Gossip) Members() []string {
	var out []string
	for _, n := range g.ml.Members() {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

// SetCut implements Announcer: a change is re-advertised to the other
// agents in the background (memberlist gossips it within a few
// GossipIntervals).
func (g *Gossip) SetCut(cut bool) {
	if g.cut.Swap(cut) == cut {
		return
	}
	go func() {
		g.updating.Lock()
		defer g.updating.Unlock()
		select {
		case <-g.stop:
			return
		default:
		}
		_ = g.ml.UpdateNode(time.Second) // an error means no broadcast yet; gossip and push-pull carry it later
	}()
}

// Cut implements Announcer.
func (g *Gossip) Cut() []string {
	var out []string
	members := g.Members()
	g.metaMu.Lock()
	defer g.metaMu.Unlock()
	for _, n := range members {
		if n != g.cfg.Name && g.peersCut[n] {
			out = append(out, n)
		}
	}
	return out
}

// Join joins more agents.
func (g *Gossip) Join(addrs []string) error {
	if _, err := g.ml.Join(addrs); err != nil {
		return fmt.Errorf("agent: join %v: %w", addrs, err)
	}
	return nil
}

// Leave tells the others this agent is going, then stops gossiping.
func (g *Gossip) Leave(timeout time.Duration) error {
	g.once.Do(func() { close(g.stop) })
	err := g.ml.Leave(timeout)
	return errors.Join(err, g.ml.Shutdown())
}

// Shutdown stops gossiping without telling anyone, as a crash would.
func (g *Gossip) Shutdown() error {
	g.once.Do(func() { close(g.stop) })
	return g.ml.Shutdown()
}
