package coordinator

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/lease"
)

// ClientConfig configures a Client.
type ClientConfig struct {
	// Addrs are the coordinators' addresses (host:port); any of them may
	// lead. A redirect may name another.
	Addrs []string
	// Region is the region this client speaks for. Under mutual TLS the
	// certificate must name the same region.
	Region string
	// TLS, when set, secures the connection (with a client certificate
	// for mutual TLS); nil dials without TLS.
	TLS *tls.Config
	// Credentials, when set, are sent with every stream: the region's
	// token (auth.Bearer).
	Credentials credentials.PerRPCCredentials
	// ConnectTimeout bounds one attempt to open a stream on one address.
	ConnectTimeout time.Duration
}

// Validate reports the first problem with c, naming the field and value.
func (c ClientConfig) Validate() error {
	switch {
	case len(c.Addrs) == 0:
		return fmt.Errorf("%w: client addrs is empty", ErrInvalidConfig)
	case c.Region == "":
		return fmt.Errorf("%w: client region is empty", ErrInvalidConfig)
	case c.ConnectTimeout < 0:
		return fmt.Errorf("%w: client connect_timeout=%s must be ≥ 0", ErrInvalidConfig, c.ConnectTimeout)
	}
	for _, a := range c.Addrs {
		if a == "" {
			return fmt.Errorf("%w: client addrs contains an empty address", ErrInvalidConfig)
		}
	}
	return nil
}

// Client opens lease streams to whichever coordinator leads (a
// lease.Transport): it tries the
// leader it last heard of, then every address in turn, and remembers the
// leader a redirect names. It is the region side's transport: a region's
// speaking agent calls Connect, exchanges lease.Messages on the Stream, and
// calls Connect again when the stream ends (with a pause of its choosing).
// A Client is safe for concurrent use.
type Client struct {
	cfg ClientConfig

	mu    sync.Mutex
	conns map[string]*grpc.ClientConn
	hint  string // the leader, as last heard
	next  int    // where the round of addresses resumes
}

var _ lease.Transport = (*Client)(nil)

// NewClient returns a Client; it dials lazily.
func NewClient(cfg ClientConfig) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.ConnectTimeout == 0 {
		cfg.ConnectTimeout = 2 * time.Second
	}
	cfg.Addrs = slices.Clone(cfg.Addrs)
	return &Client{cfg: cfg, conns: map[string]*grpc.ClientConn{}}, nil
}

// Leader returns the leader's address as last heard, "" if none.
func (c *Client) Leader() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hint
}

// Connect opens a stream to a coordinator: the last known leader first,
// then each configured address once. The stream may still turn out to
// reach a follower, whose redirect ends it (Recv returns ErrRedirected) and
// points the next Connect at the leader. It fails with ErrNoCoordinator
// when no address accepts a stream.
func (c *Client) Connect(ctx context.Context) (lease.Stream, error) {
	c.mu.Lock()
	order := make([]string, 0, len(c.cfg.Addrs)+1)
	if c.hint != "" {
		order = append(order, c.hint)
	}
	for i := range c.cfg.Addrs {
		a := c.cfg.Addrs[(c.next+i)%len(c.cfg.Addrs)]
		if a != c.hint {
			order = append(order, a)
		}
	}
	c.next = (c.next + 1) % len(c.cfg.Addrs)
	c.mu.Unlock()
	var errs []error
	for _, addr := range order {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		s, err := c.open(ctx, addr)
		if err == nil {
			return s, nil
		}
		c.mu.Lock()
		if c.hint == addr {
			c.hint = ""
		}
		c.mu.Unlock()
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, fmt.Errorf("%w (region %q): %w", ErrNoCoordinator, c.cfg.Region, errors.Join(errs...))
}

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc := c.conns[addr]; cc != nil {
		return cc, nil
	}
	creds := insecure.NewCredentials()
	if c.cfg.TLS != nil {
		creds = credentials.NewTLS(c.cfg.TLS)
	}
	opts := []grpc.DialOption{grpc.WithTransportCredentials(creds),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(MaxMessageSize), grpc.MaxCallSendMsgSize(MaxMessageSize))}
	if c.cfg.Credentials != nil {
		opts = append(opts, grpc.WithPerRPCCredentials(c.cfg.Credentials))
	}
	cc, err := grpc.NewClient(addr, opts...)
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

func (c *Client) open(ctx context.Context, addr string) (*Stream, error) {
	cc, err := c.conn(addr)
	if err != nil {
		return nil, err
	}
	sctx, cancel := context.WithCancel(context.Background())
	sctx = metadata.AppendToOutgoingContext(sctx, RegionHeader, c.cfg.Region)
	// Opening waits for the connection, but no longer than ConnectTimeout
	// or ctx; the stream itself lives until Close.
	stop := context.AfterFunc(ctx, cancel)
	timer := time.AfterFunc(c.cfg.ConnectTimeout, cancel)
	st, err := leasev1.NewLeaseServiceClient(cc).Connect(sctx)
	timer.Stop()
	stop()
	if err != nil {
		cancel()
		return nil, err
	}
	return &Stream{c: c, addr: addr, st: st, cancel: cancel}, nil
}

// Close closes every connection.
func (c *Client) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	var errs []error
	for a, cc := range c.conns {
		errs = append(errs, cc.Close())
		delete(c.conns, a)
	}
	return errors.Join(errs...)
}

// Stream is one open lease stream. Send and Recv may be called from
// different goroutines; Close ends the stream.
type Stream struct {
	c      *Client
	addr   string
	st     leasev1.LeaseService_ConnectClient
	cancel context.CancelFunc
	sendMu sync.Mutex
}

// Addr is the coordinator this stream reaches.
func (s *Stream) Addr() string { return s.addr }

// Send sends m.
func (s *Stream) Send(m lease.Message) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	return s.st.Send(ToProto(m))
}

// Recv returns the next message. A redirect ends the stream: Recv records
// the leader for the next Connect and returns an error wrapping
// ErrRedirected.
func (s *Stream) Recv() (lease.Message, error) {
	p, err := s.st.Recv()
	if err != nil {
		return lease.Message{}, err
	}
	m := FromProto(p)
	if m.Type == lease.MsgRedirect {
		s.c.mu.Lock()
		if m.Leader != s.addr {
			s.c.hint = m.Leader
		}
		s.c.mu.Unlock()
		s.cancel()
		return m, fmt.Errorf("%w: %s says the leader is %q", ErrRedirected, s.addr, m.Leader)
	}
	s.c.mu.Lock()
	s.c.hint = s.addr // it answered as the leader
	s.c.mu.Unlock()
	return m, nil
}

// Close ends the stream.
func (s *Stream) Close() error {
	s.sendMu.Lock()
	_ = s.st.CloseSend()
	s.sendMu.Unlock()
	s.cancel()
	return nil
}
