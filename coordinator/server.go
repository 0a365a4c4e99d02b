package coordinator

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

// MaxMessageSize bounds one lease message on the wire: a full table or a
// report for a hundred thousand hot keys is a few megabytes, more than
// gRPC's 4 MiB default. Servers should use ServerOptions.
const MaxMessageSize = 64 << 20

// ServerOptions are the gRPC server options the lease service needs.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(MaxMessageSize), grpc.MaxSendMsgSize(MaxMessageSize)}
}

// RegionHeader is the gRPC metadata key a region names itself with when
// no client certificate identifies it.
const RegionHeader = "allot-region"

// Config configures a Server. Build it with DefaultConfig; NewServer calls
// Validate.
type Config struct {
	// Advertise is the address regions reach this coordinator at; followers
	// send it in redirects when this coordinator leads.
	Advertise string
	// Lease holds the allocator's timings and the budgets.
	Lease lease.Config
	// Tick is how often the Allocator is ticked.
	Tick time.Duration
	// SendBuffer is how many messages may wait for one region's stream;
	// beyond it messages are dropped (the protocol tolerates loss).
	SendBuffer int
	// RequireClientCert makes the client certificate's common name the only
	// accepted region identity (mutual TLS); otherwise the RegionHeader
	// metadata names the region.
	RequireClientCert bool
	// Clock reads the time; clock.Real in production.
	Clock clock.Clock
	// Logger logs stream and leadership events.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with lease.DefaultConfig and no budgets.
func DefaultConfig() Config {
	return Config{
		Lease:      lease.DefaultConfig(),
		Tick:       100 * time.Millisecond, // a thirtieth of the refresh interval
		SendBuffer: 1024,                   // many grants' worth per region
		Clock:      clock.Real{},
		Logger:     slog.Default(),
	}
}

// Validate reports the first problem with c, naming the field and value.
func (c Config) Validate() error {
	switch {
	case c.Tick <= 0 || c.Tick > c.Lease.Refresh:
		return fmt.Errorf("%w: tick=%s must be in (0, refresh=%s]", ErrInvalidConfig, c.Tick, c.Lease.Refresh)
	case c.SendBuffer <= 0:
		return fmt.Errorf("%w: send_buffer=%d must be > 0", ErrInvalidConfig, c.SendBuffer)
	case c.Clock == nil:
		return fmt.Errorf("%w: clock is nil", ErrInvalidConfig)
	}
	return c.Lease.Validate()
}

// Errors callers branch on.
var (
	// ErrInvalidConfig: a configuration value is out of range.
	ErrInvalidConfig = errors.New("coordinator: invalid config")
	// ErrRedirected: the coordinator reached is not the leader; the error
	// names the leader when known.
	ErrRedirected = errors.New("coordinator: redirected to the leader")
	// ErrNoCoordinator: no address answered.
	ErrNoCoordinator = errors.New("coordinator: no coordinator reachable")
)

// Server serves the lease protocol to regions. It is safe for concurrent
// use: every call into the Allocator holds mu.
type Server struct {
	leasev1.UnimplementedLeaseServiceServer

	cfg Config
	log *slog.Logger

	mu      sync.Mutex
	alloc   *lease.Allocator // nil while following
	term    uint64
	leader  string // the leader's address when following, if known
	budgets []lease.Budget
	streams map[string]*conn
	counts  counters
	prev    lease.Stats // allocator stats already added to counts
	// lastRound is how long the last allocation round took to compute.
	lastRound time.Duration
}

// counters are the Server's cumulative figures across terms.
type counters struct {
	up, down, dropped, rejected            uint64
	grants, renewals, increases, decreases uint64
	blocked, expired, urgent, rounds       uint64
	leaderChanges                          uint64
}

type conn struct {
	region string
	out    chan *leasev1.Message
	done   chan struct{}
	once   sync.Once
}

func (c *conn) close() { c.once.Do(func() { close(c.done) }) }

// NewServer returns a follower Server with no known leader; call
// BecomeLeader (standalone) or RunElection (HA) to lead.
func NewServer(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	return &Server{
		cfg: cfg, log: cfg.Logger, budgets: slices.Clone(cfg.Lease.Budgets),
		streams: map[string]*conn{},
	}, nil
}

// Register adds the lease service to g.
func (s *Server) Register(g *grpc.Server) { leasev1.RegisterLeaseServiceServer(g, s) }

// BecomeLeader makes s the leader of term: a new Allocator starts learning.
// Streams open from an earlier term are closed so regions say hello again.
func (s *Server) BecomeLeader(term uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.cfg.Lease
	cfg.Budgets = s.budgets
	a, err := lease.NewAllocator(cfg, term, s.cfg.Clock.Now())
	if err != nil {
		return err
	}
	s.closeStreamsLocked()
	s.alloc, s.term, s.leader, s.prev = a, term, s.cfg.Advertise, lease.Stats{}
	s.counts.leaderChanges++
	s.log.Info("coordinator: leading", "term", term, "addr", s.cfg.Advertise)
	return nil
}

// StepDown makes s a follower that redirects regions to leader ("" when
// unknown), closing every stream.
func (s *Server) StepDown(leader string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc != nil {
		s.log.Info("coordinator: stepping down", "term", s.term, "leader", leader)
	}
	s.alloc = nil
	s.leader = leader
	s.closeStreamsLocked()
}

// SetLeader records the leader's address while following.
func (s *Server) SetLeader(addr string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc == nil {
		s.leader = addr
	}
}

// Leading reports whether s leads, and its term.
func (s *Server) Leading() (bool, uint64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.alloc != nil, s.term
}

// Leader returns the leader's address as s knows it.
func (s *Server) Leader() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.leader
}

// SetBudgets replaces the budgets served (a rules change).
func (s *Server) SetBudgets(bs []lease.Budget) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc != nil {
		if err := s.alloc.SetBudgets(s.cfg.Clock.Now(), bs); err != nil {
			return err
		}
		s.dispatchLocked()
	} else {
		cfg := s.cfg.Lease
		cfg.Budgets = bs
		if err := cfg.Validate(); err != nil {
			return err
		}
	}
	s.budgets = slices.Clone(bs)
	return nil
}

// Budgets returns the budgets served.
func (s *Server) Budgets() []lease.Budget {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.budgets)
}

// ExpireAll ends every region's lease, for a coordinator stopping on
// purpose: regions drop to their floors at once.
func (s *Server) ExpireAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc != nil {
		s.alloc.ExpireAll(s.cfg.Clock.Now())
		s.dispatchLocked()
	}
}

// Run ticks the Allocator until ctx ends.
func (s *Server) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.Tick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			s.Tick()
		}
	}
}

// Tick ticks the Allocator once and sends what it says.
func (s *Server) Tick() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.alloc == nil {
		return
	}
	rounds := s.prev.Rounds
	start := time.Now() // compute time, not lease time: the real clock
	s.alloc.Tick(s.cfg.Clock.Now())
	elapsed := time.Since(start)
	s.dispatchLocked()
	if s.prev.Rounds != rounds {
		s.lastRound = elapsed
	}
}

// dispatchLocked sends the Allocator's messages. Requires s.mu.
func (s *Server) dispatchLocked() {
	for _, m := range s.alloc.Ready() {
		c := s.streams[m.Region]
		if c == nil {
			s.counts.dropped++
			continue
		}
		select {
		case c.out <- ToProto(m):
			s.counts.down++
		default:
			s.counts.dropped++
		}
	}
	st := s.alloc.Stats(s.cfg.Clock.Now())
	p := s.prev
	s.counts.grants += st.Grants - p.Grants
	s.counts.renewals += st.Renewals - p.Renewals
	s.counts.increases += st.Increases - p.Increases
	s.counts.decreases += st.Decreases - p.Decreases
	s.counts.blocked += st.Blocked - p.Blocked
	s.counts.expired += st.Expired - p.Expired
	s.counts.urgent += st.Urgent - p.Urgent
	s.counts.rounds += st.Rounds - p.Rounds
	s.prev = st
}

func (s *Server) closeStreamsLocked() {
	for r, c := range s.streams {
		c.close()
		delete(s.streams, r)
	}
}

// Connect serves one region's stream.
func (s *Server) Connect(stream leasev1.LeaseService_ConnectServer) error {
	ctx := stream.Context()
	region, err := s.identify(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.alloc == nil {
		leader := s.leader
		s.mu.Unlock()
		return stream.Send(ToProto(lease.Message{Type: lease.MsgRedirect, Region: region, Leader: leader}))
	}
	c := &conn{region: region, out: make(chan *leasev1.Message, s.cfg.SendBuffer), done: make(chan struct{})}
	if old := s.streams[region]; old != nil {
		old.close() // the region reconnected; its old stream is dead to it
	}
	s.streams[region] = c
	s.mu.Unlock()
	s.log.Info("coordinator: region connected", "region", region)
	defer func() {
		s.mu.Lock()
		if s.streams[region] == c {
			delete(s.streams, region)
		}
		s.mu.Unlock()
		c.close()
	}()

	recvErr := make(chan error, 1)
	go func() {
		for {
			p, err := stream.Recv()
			if err != nil {
				recvErr <- err
				return
			}
			if err := s.step(region, FromProto(p)); err != nil {
				recvErr <- err
				return
			}
		}
	}()
	for {
		select {
		case m := <-c.out:
			if err := stream.Send(m); err != nil {
				return err
			}
		case <-c.done:
			// Replaced, or stepping down: tell the region where to go.
			s.mu.Lock()
			leader := s.leader
			s.mu.Unlock()
			_ = stream.Send(ToProto(lease.Message{Type: lease.MsgRedirect, Region: region, Leader: leader}))
			return nil
		case err := <-recvErr:
			if errors.Is(err, context.Canceled) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		}
	}
}

// step hands one message from region to the Allocator.
func (s *Server) step(region string, m lease.Message) error {
	if m.Region != "" && m.Region != region {
		s.mu.Lock()
		s.counts.rejected++
		s.mu.Unlock()
		return status.Errorf(codes.PermissionDenied, "coordinator: region %q may not speak for %q", region, m.Region)
	}
	m.Region = region
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.up++
	if s.alloc == nil {
		return nil // stepping down; the stream is being closed
	}
	if err := s.alloc.Step(s.cfg.Clock.Now(), m); err != nil {
		s.counts.rejected++
		if errors.Is(err, lease.ErrUnknownRegion) {
			return status.Errorf(codes.PermissionDenied, "%v", err)
		}
		s.log.Warn("coordinator: bad message", "region", region, "msg", m.String(), "err", err)
	}
	s.dispatchLocked()
	return nil
}

// identify names the region on the other end of ctx's stream: the client
// certificate's common name under mutual TLS, else the RegionHeader.
func (s *Server) identify(ctx context.Context) (string, error) {
	var header string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RegionHeader); len(v) > 0 {
			header = v[0]
		}
	}
	if cn := certName(ctx); cn != "" {
		if header != "" && header != cn {
			return "", status.Errorf(codes.PermissionDenied, "coordinator: certificate for %q may not speak for %q", cn, header)
		}
		return cn, nil
	}
	if s.cfg.RequireClientCert {
		return "", status.Error(codes.Unauthenticated, "coordinator: a client certificate is required")
	}
	if header == "" {
		return "", status.Errorf(codes.Unauthenticated, "coordinator: no region named (metadata %q)", RegionHeader)
	}
	return header, nil
}

// certName is the common name (or first DNS name) of the verified client
// certificate, "" without one.
func certName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return nameOf(ti.State.VerifiedChains[0][0])
}

func nameOf(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return ""
}
