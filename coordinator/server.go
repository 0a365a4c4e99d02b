package coordinator

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/leaselog"
	"github.com/allot-dev/allot/lease"
)

// MaxMessageSize bounds one lease message on the wire: a full table or a
// report for a hundred thousand hot keys is a few megabytes, more than
// gRPC's 4 MiB default, and 200,000 keys of 256-byte subjects are 57 MB.
// Servers should use ServerOptions.
const MaxMessageSize = 64 << 20

// ServerOptions are the gRPC server options the lease service needs, with
// the default Limits.
func ServerOptions() []grpc.ServerOption { return DefaultLimits().ServerOptions() }

// ServerOptions are the gRPC server options for l: the receive limit, and
// keepalive pings so that a stream whose peer vanished (a host gone without
// closing its connections) ends within a minute rather than holding its
// region's place.
func (l Limits) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.MaxRecvMsgSize(l.MaxMessageBytes), grpc.MaxSendMsgSize(MaxMessageSize),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 20 * time.Second})}
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
	// RequireClientCert makes a stream prove its region with a client
	// certificate naming it (mutual TLS).
	RequireClientCert bool
	// RegionTokens, when set, makes a stream prove the region its
	// RegionHeader names with a bearer token listed for that region. With
	// RequireClientCert as well, a stream needs both.
	RegionTokens *auth.Tokens
	// Insecure accepts a stream that proves nothing: the RegionHeader alone
	// names its region. Without it, RequireClientCert or RegionTokens must
	// be set. A stream that presents a wrong token or a certificate for
	// another region is refused even so.
	Insecure bool
	// TakeoverAfter is how long a region's stream must have been silent
	// before another stream of the region may take its place (see
	// Connect); 0 means twice the lease's refresh interval.
	TakeoverAfter time.Duration
	// FirstMessage bounds the wait for a new stream's first message, which
	// decides whether it may take the region's place.
	FirstMessage time.Duration
	// Limits bounds what one region may send.
	Limits Limits
	// Clock reads the time; clock.Real in production.
	Clock clock.Clock
	// Logger logs stream and leadership events.
	Logger *slog.Logger
}

// DefaultConfig returns a Config with lease.DefaultConfig and no budgets.
func DefaultConfig() Config {
	return Config{
		Lease:        lease.DefaultConfig(),
		Tick:         100 * time.Millisecond, // a thirtieth of the refresh interval
		SendBuffer:   1024,                   // many grants' worth per region
		FirstMessage: 10 * time.Second,       // a region says hello at once; this only bounds a silent client
		Limits:       DefaultLimits(),
		Clock:        clock.Real{},
		Logger:       slog.Default(),
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
	case !c.RequireClientCert && c.RegionTokens == nil && !c.Insecure:
		return fmt.Errorf("%w: regions prove nothing: set RequireClientCert (mutual TLS) or RegionTokens, or Insecure to accept a region by its name alone", ErrInvalidConfig)
	case c.TakeoverAfter < 0:
		return fmt.Errorf("%w: takeover_after=%s must be ≥ 0", ErrInvalidConfig, c.TakeoverAfter)
	case c.FirstMessage <= 0:
		return fmt.Errorf("%w: first_message=%s must be > 0", ErrInvalidConfig, c.FirstMessage)
	}
	if err := c.Limits.Validate(); err != nil {
		return err
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
	byRule  map[string]lease.Budget // budgets by rule, for sanitize
	streams map[string]*conn
	counts  counters
	logs    map[string]*logState // rate-limited logs by kind
	prev    lease.Stats          // allocator stats already added to counts
	// lastRound is how long the last allocation round took to compute.
	lastRound time.Duration
}

// counters are the Server's cumulative figures across terms.
type counters struct {
	up, down, dropped, rejected            uint64
	grants, renewals, increases, decreases uint64
	blocked, expired, urgent, rounds       uint64
	leaderChanges, carried, returned       uint64
	refused                                map[string]uint64 // streams refused, by reason
	takeovers                              map[string]uint64 // streams that took a region's place, by cause
	sanitized                              [3]uint64         // entries clipped, dropped, clamped
}

type conn struct {
	region string
	authed bool // proved its region (certificate or token)
	out    chan *leasev1.Message
	done   chan struct{}
	once   sync.Once
	// The rest is guarded by Server.mu.
	session uint64    // the session of the last message received
	heard   time.Time // when it was admitted or last sent a message
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
	if cfg.TakeoverAfter == 0 {
		cfg.TakeoverAfter = 2 * cfg.Lease.Refresh
	}
	s := &Server{
		cfg: cfg, log: cfg.Logger, streams: map[string]*conn{}, logs: map[string]*logState{},
		counts: counters{refused: map[string]uint64{}, takeovers: map[string]uint64{}},
	}
	s.setBudgetsLocked(cfg.Lease.Budgets)
	if cfg.Insecure {
		s.log.Warn("coordinator: regions are accepted by name alone (insecure): any client that reaches the lease port can speak for any region",
			"auth", s.AuthMode())
	}
	return s, nil
}

// AuthMode names how regions prove who they are: mtls, token, mtls+token,
// or insecure (a name alone is accepted).
func (s *Server) AuthMode() string {
	switch {
	case s.cfg.Insecure:
		return "insecure"
	case s.cfg.RequireClientCert && s.cfg.RegionTokens != nil:
		return "mtls+token"
	case s.cfg.RequireClientCert:
		return "mtls"
	}
	return "token"
}

// setBudgetsLocked records bs as the budgets served. Requires s.mu, or
// that s is not shared yet.
func (s *Server) setBudgetsLocked(bs []lease.Budget) {
	s.budgets = slices.Clone(bs)
	s.byRule = make(map[string]lease.Budget, len(bs))
	for _, b := range bs {
		s.byRule[b.Rule] = b
	}
}

// Register adds the lease service to g.
func (s *Server) Register(g *grpc.Server) { leasev1.RegisterLeaseServiceServer(g, s) }

// BecomeLeader makes s the leader of term: a new Allocator starts learning.
// Streams open from an earlier term are closed so regions say hello again.
func (s *Server) BecomeLeader(term uint64) error { return s.becomeLeader(term, false) }

// becomeLeader is BecomeLeader; with first, for the first leader that ever
// serves the regions (lease.NewFirstAllocator: every key's stored reserve
// starts full, and it raises while it learns). Only RunElection passes it, from its etcd record (LedKey):
// a coordinator without etcd, which may have been restarted, cannot know.
func (s *Server) becomeLeader(term uint64, first bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	cfg := s.cfg.Lease
	cfg.Budgets = s.budgets
	newAlloc := lease.NewAllocator
	if first {
		newAlloc = lease.NewFirstAllocator
	}
	a, err := newAlloc(cfg, term, s.cfg.Clock.Now())
	if err != nil {
		return err
	}
	s.closeStreamsLocked()
	s.alloc, s.term, s.leader, s.prev = a, term, s.cfg.Advertise, lease.Stats{}
	s.counts.leaderChanges++
	s.log.Info("coordinator: leading", "term", term, "addr", s.cfg.Advertise, "first", first)
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
	s.setBudgetsLocked(bs)
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
		s.trace("down", m)
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
	s.counts.carried += st.Carried - p.Carried
	s.counts.returned += st.Returned - p.Returned
	s.prev = st
}

func (s *Server) closeStreamsLocked() {
	for r, c := range s.streams {
		c.close()
		delete(s.streams, r)
	}
}

// Connect serves one region's stream.
//
// The stream must prove its region (identify). Its first message decides
// whether it may take the region's place, since a region has at most one
// stream: it may when the region has none; when it continues the session
// the region's stream speaks for (the same Holder reconnecting, whose old
// stream is dead to it); or when the region's stream has been silent for
// TakeoverAfter (its agent gone, or another agent of the region now
// speaking). A stream that proves nothing never takes the place of one
// that proved its region. Otherwise it is refused with ALREADY_EXISTS and
// the region's stream goes on: a client that reconnects in a loop can no
// longer push the region's agent off its lease, and two agents that both
// speak while their membership converges keep one stream rather than
// taking it from each other. A refused client retries after its pause.
func (s *Server) Connect(stream leasev1.LeaseService_ConnectServer) error {
	ctx := stream.Context()
	region, authed, err := s.identify(ctx)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.alloc == nil {
		leader := s.leader
		s.mu.Unlock()
		return stream.Send(ToProto(lease.Message{Type: lease.MsgRedirect, Region: region, Leader: leader}))
	}
	s.mu.Unlock()

	first, err := s.firstMessage(stream, region)
	if err != nil {
		return err
	}
	if first.Region != "" && first.Region != region {
		s.mu.Lock()
		s.counts.rejected++
		s.refuseLocked("wrong-region", "region", region, "speaks_for", trim(first.Region))
		s.mu.Unlock()
		return status.Errorf(codes.PermissionDenied, "coordinator: region %q may not speak for %q", region, trim(first.Region))
	}
	c := &conn{region: region, authed: authed, out: make(chan *leasev1.Message, s.cfg.SendBuffer), done: make(chan struct{})}
	s.mu.Lock()
	if s.alloc == nil {
		leader := s.leader
		s.mu.Unlock()
		return stream.Send(ToProto(lease.Message{Type: lease.MsgRedirect, Region: region, Leader: leader}))
	}
	now := s.cfg.Clock.Now()
	if old := s.streams[region]; old != nil {
		cause, ok := s.mayTakeOverLocked(old, authed, first.Session, now)
		if !ok {
			silent := now.Sub(old.heard)
			s.refuseLocked("held", "region", region, "authenticated", authed, "held_authenticated", old.authed, "silent", silent)
			s.mu.Unlock()
			return status.Errorf(codes.AlreadyExists, "coordinator: region %q already has a live stream (heard %s ago); another may take its place after %s of silence",
				region, silent.Round(time.Millisecond), s.cfg.TakeoverAfter)
		}
		s.counts.takeovers[cause]++
		s.logLocked("takeover", slog.LevelInfo, "coordinator: a new stream takes the region's place", "region", region, "cause", cause)
		old.close() // the region reconnected; its old stream is dead to it
	}
	c.session, c.heard = first.Session, now
	s.streams[region] = c
	s.mu.Unlock()
	s.log.Info("coordinator: region connected", "region", region, "authenticated", authed)
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
		if err := s.step(c, first); err != nil {
			recvErr <- err
			return
		}
		for {
			p, err := stream.Recv()
			if err != nil {
				recvErr <- s.recvError(region, err)
				return
			}
			if err := s.step(c, FromProto(p)); err != nil {
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

// firstMessage waits up to FirstMessage for a new stream's first message.
func (s *Server) firstMessage(stream leasev1.LeaseService_ConnectServer, region string) (lease.Message, error) {
	type result struct {
		p   *leasev1.Message
		err error
	}
	got := make(chan result, 1)
	go func() {
		p, err := stream.Recv()
		got <- result{p, err}
	}()
	t := time.NewTimer(s.cfg.FirstMessage)
	defer t.Stop()
	select {
	case r := <-got:
		if r.err != nil {
			return lease.Message{}, s.recvError(region, r.err)
		}
		return FromProto(r.p), nil
	case <-t.C:
		// Returning ends the stream, which ends the Recv above.
		return lease.Message{}, status.Errorf(codes.DeadlineExceeded, "coordinator: region %q sent nothing within %s", region, s.cfg.FirstMessage)
	}
}

// recvError counts and logs a message the transport refused (one over
// MaxMessageBytes), and returns err.
func (s *Server) recvError(region string, err error) error {
	if status.Code(err) == codes.ResourceExhausted {
		s.mu.Lock()
		s.refuseLocked("too-large", "region", region, "max_message_bytes", s.cfg.Limits.MaxMessageBytes, "err", err)
		s.mu.Unlock()
	}
	return err
}

// mayTakeOverLocked reports whether a new stream, authenticated or not,
// whose first message is for session, may take old's place at now, and
// why. Requires s.mu.
func (s *Server) mayTakeOverLocked(old *conn, authed bool, session uint64, now time.Time) (string, bool) {
	switch {
	case old.authed && !authed:
		return "", false
	case session != 0 && session == old.session:
		return "same-session", true
	case now.Sub(old.heard) >= s.cfg.TakeoverAfter:
		return "silent", true
	}
	return "", false
}

// refuseLocked counts a refused stream or message by reason and logs it,
// at most once per logEvery per reason. Requires s.mu.
func (s *Server) refuseLocked(reason string, attrs ...any) {
	s.counts.refused[reason]++
	s.logLocked("refused:"+reason, slog.LevelWarn, "coordinator: refused", append([]any{"reason", reason}, attrs...)...)
}

// logEvery bounds the records of one kind, so that a client retrying in a
// loop, or a region sending garbage, cannot flood the log.
const logEvery = 10 * time.Second

type logState struct {
	last   time.Time
	folded int
}

// trace logs a lease message up from a region (as the Allocator takes it,
// after sanitize) or down to one, with its keys and their values, at
// debug level: every message, unpaced, so that a move can be followed
// from report to decrease, acknowledgement and raise (docs/design.md,
// "Operations").
func (s *Server) trace(dir string, m lease.Message) {
	leaselog.Trace(s.log, "coordinator: lease message", dir, m)
}

// logLocked logs msg at most once per logEvery for kind, with the number
// of records folded into it. It reads the real clock: log pacing is not
// lease time. Requires s.mu.
func (s *Server) logLocked(kind string, level slog.Level, msg string, attrs ...any) {
	now := time.Now()
	st := s.logs[kind]
	if st == nil {
		st = &logState{}
		s.logs[kind] = st
	}
	if !st.last.IsZero() && now.Sub(st.last) < logEvery {
		st.folded++
		return
	}
	if st.folded > 0 {
		attrs = append(attrs, "folded", st.folded)
	}
	st.last, st.folded = now, 0
	s.log.Log(context.Background(), level, msg, attrs...)
}

// step hands one message from c's region to the Allocator, made safe by
// sanitize.
func (s *Server) step(c *conn, m lease.Message) error {
	region := c.region
	if m.Region != "" && m.Region != region {
		s.mu.Lock()
		s.counts.rejected++
		s.refuseLocked("wrong-region", "region", region, "speaks_for", trim(m.Region))
		s.mu.Unlock()
		return status.Errorf(codes.PermissionDenied, "coordinator: region %q may not speak for %q", region, trim(m.Region))
	}
	m.Region = region
	s.mu.Lock()
	defer s.mu.Unlock()
	s.counts.up++
	c.heard, c.session = s.cfg.Clock.Now(), m.Session
	if s.alloc == nil {
		return nil // stepping down; the stream is being closed
	}
	m, n := sanitize(m, s.byRule, s.cfg.Limits)
	if n.any() {
		s.counts.sanitized[0] += uint64(n.clipped) // #nosec G115 -- counts of entries, >= 0
		s.counts.sanitized[1] += uint64(n.dropped) // #nosec G115 -- as above
		s.counts.sanitized[2] += uint64(n.clamped) // #nosec G115 -- as above
		s.logLocked("sanitized:"+region, slog.LevelWarn, "coordinator: a region's message was cut to its bounds", "region", region,
			"type", m.Type.String(), "clipped", n.clipped, "dropped", n.dropped, "clamped", n.clamped,
			"max_report_keys", s.cfg.Limits.MaxReportKeys, "max_key_bytes", s.cfg.Limits.MaxKeyBytes)
	}
	s.trace("up", m)
	if err := s.alloc.Step(s.cfg.Clock.Now(), m); err != nil {
		s.counts.rejected++
		if errors.Is(err, lease.ErrUnknownRegion) {
			s.refuseLocked("unknown-region", "region", region)
			return status.Errorf(codes.PermissionDenied, "%v", err)
		}
		s.logLocked("bad:"+region, slog.LevelWarn, "coordinator: bad message", "region", region, "msg", m.String(), "err", err)
	}
	s.dispatchLocked()
	return nil
}

// trim shortens a name a client sent for logs and errors.
func trim(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// identify names the region on the other end of ctx's stream and says
// whether the stream proved it: a verified client certificate naming it,
// or a bearer token listed for it. The region is the RegionHeader, else
// the certificate's name. A certificate naming another region, or a token
// that is not the region's, is refused in every mode; a stream that proves
// nothing is refused unless the Server is Insecure.
func (s *Server) identify(ctx context.Context) (region string, authed bool, err error) {
	var header string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		if v := md.Get(RegionHeader); len(v) > 0 {
			header = v[0]
		}
	}
	cn, token := auth.PeerName(ctx), auth.TokenFromContext(ctx)
	region = header
	if region == "" {
		region = cn
	}
	refuse := func(reason string, code codes.Code, format string, args ...any) (string, bool, error) {
		s.mu.Lock()
		s.refuseLocked(reason, "region", trim(region), "certificate", trim(cn))
		s.mu.Unlock()
		return "", false, status.Errorf(code, format, args...)
	}
	switch {
	case region == "":
		return refuse("unauthenticated", codes.Unauthenticated, "coordinator: no region named (metadata %q)", RegionHeader)
	case cn != "" && cn != region:
		return refuse("wrong-region", codes.PermissionDenied, "coordinator: certificate for %q may not speak for %q", trim(cn), trim(region))
	}
	certOK := cn != ""
	tokenOK := token != "" && s.cfg.RegionTokens != nil && s.cfg.RegionTokens.Verify(region, token)
	switch {
	case token != "" && !tokenOK:
		return refuse("unauthenticated", codes.Unauthenticated, "coordinator: the token is not region %q's", trim(region))
	case s.cfg.RequireClientCert && !certOK:
		return refuse("unauthenticated", codes.Unauthenticated, "coordinator: a client certificate naming the region is required")
	case s.cfg.RegionTokens != nil && !tokenOK && !s.cfg.Insecure:
		return refuse("unauthenticated", codes.Unauthenticated, "coordinator: region %q must present its token", trim(region))
	}
	return region, certOK || tokenOK, nil
}
