// Package httpserver builds the HTTP servers of allot's processes (the
// agent, the gateway, the coordinator's status and metrics server) with
// bounds on what one client can hold: a timeout on every phase of a
// connection, a cap on request headers, and a cap on concurrent
// connections.
//
// A client that opens a connection and sends nothing, or sends headers or a
// body a byte at a time, is cut off after ReadHeaderTimeout or ReadTimeout;
// an idle keep-alive connection after IdleTimeout; a client that does not
// read its response after WriteTimeout. At MaxConns a new connection makes
// the server close the keep-alive connection idle the longest (its client
// reconnects, as after an idle timeout), or else wait, leaving further
// connections in the kernel's backlog, until a connection ends; since every
// connection that is not idle is bounded by the read and write timeouts, a
// new client waits at most about ReadTimeout plus WriteTimeout, and
// normally not at all.
package httpserver

import (
	"crypto/tls"
	"flag"
	"fmt"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Config bounds one HTTP server.
type Config struct {
	// ReadHeaderTimeout bounds reading a request's headers, and the wait
	// for the first request on a new connection.
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a whole request, body included.
	ReadTimeout time.Duration
	// WriteTimeout bounds writing a response, from the end of the request's
	// headers.
	WriteTimeout time.Duration
	// IdleTimeout closes a keep-alive connection that waits this long for
	// its next request.
	IdleTimeout time.Duration
	// MaxHeaderBytes bounds a request's header (request line included);
	// beyond it the server answers 431.
	MaxHeaderBytes int
	// MaxConns bounds concurrent connections.
	MaxConns int
}

// DefaultConfig returns bounds that no ordinary client reaches.
func DefaultConfig() Config {
	return Config{
		ReadHeaderTimeout: 5 * time.Second,  // a client on a slow link sends its headers in well under a second
		ReadTimeout:       10 * time.Second, // the largest body any handler takes is a few hundred kilobytes
		WriteTimeout:      10 * time.Second, // responses are small: a decision, a status page, metrics
		IdleTimeout:       60 * time.Second, // keep-alive for clients that call every few seconds
		MaxHeaderBytes:    32 << 10,         // room for cookies and tokens; Go's default is 1 MiB
		MaxConns:          10_000,           // about 16 KB each while held: 160 MB at most
	}
}

// Validate reports the first value that is not positive.
func (c Config) Validate() error {
	for _, f := range []struct {
		name string
		d    time.Duration
	}{{"read_header_timeout", c.ReadHeaderTimeout}, {"read_timeout", c.ReadTimeout}, {"write_timeout", c.WriteTimeout}, {"idle_timeout", c.IdleTimeout}} {
		if f.d <= 0 {
			return fmt.Errorf("httpserver: %s=%s must be > 0", f.name, f.d)
		}
	}
	switch {
	case c.MaxHeaderBytes <= 0:
		return fmt.Errorf("httpserver: max_header_bytes=%d must be > 0", c.MaxHeaderBytes)
	case c.MaxConns <= 0:
		return fmt.Errorf("httpserver: max_conns=%d must be > 0", c.MaxConns)
	}
	return nil
}

// RegisterFlags defines the -http-* flags on fs with c's values as
// defaults, writing into c: every process names its bounds alike.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.DurationVar(&c.ReadHeaderTimeout, "http-read-header-timeout", c.ReadHeaderTimeout, "HTTP server: bound on reading a request's headers (and the wait for a new connection's first request)")
	fs.DurationVar(&c.ReadTimeout, "http-read-timeout", c.ReadTimeout, "HTTP server: bound on reading a whole request, body included")
	fs.DurationVar(&c.WriteTimeout, "http-write-timeout", c.WriteTimeout, "HTTP server: bound on writing a response")
	fs.DurationVar(&c.IdleTimeout, "http-idle-timeout", c.IdleTimeout, "HTTP server: idle keep-alive connections are closed after this")
	fs.IntVar(&c.MaxHeaderBytes, "http-max-header-bytes", c.MaxHeaderBytes, "HTTP server: largest request header (beyond it: 431)")
	fs.IntVar(&c.MaxConns, "http-max-conns", c.MaxConns, "HTTP server: most concurrent connections (at the cap an idle one is closed, else new ones wait)")
}

// Server is an http.Server with c's timeouts and header cap, serving
// through a listener that enforces MaxConns.
type Server struct {
	*http.Server
	cfg Config
	tls *tls.Config

	mu    sync.Mutex
	idle  map[net.Conn]struct{} // the listener's conns now idle between requests
	order []net.Conn            // idle conns, oldest first (may hold stale entries)

	open, evicted, waited atomic.Int64
}

// New returns a Server for h. With tlsConfig set, Serve speaks TLS.
func New(cfg Config, h http.Handler, tlsConfig *tls.Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, tls: tlsConfig, idle: map[net.Conn]struct{}{}}
	s.Server = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		ReadTimeout:       cfg.ReadTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ConnState:         s.connState,
	}
	return s, nil
}

// Serve accepts connections on l, at most MaxConns at once, until the
// server is shut down; it returns http.ErrServerClosed then.
func (s *Server) Serve(l net.Listener) error {
	ll := &limitListener{Listener: l, s: s, sem: make(chan struct{}, s.cfg.MaxConns), done: make(chan struct{})}
	var sl net.Listener = ll
	if s.tls != nil {
		tc := s.tls.Clone()
		if len(tc.NextProtos) == 0 { // as http.Server.ServeTLS does, so HTTP/2 is offered
			tc.NextProtos = []string{"h2", "http/1.1"}
		}
		sl = tls.NewListener(ll, tc)
	}
	return s.Server.Serve(sl)
}

// Stats counts a Server's connections.
type Stats struct {
	Open    int64 // connections held now
	Idle    int64 // of those, idle between requests
	Evicted int64 // idle connections closed to make room at MaxConns
	Waited  int64 // times a new connection waited at MaxConns
}

// Stats returns the counts.
func (s *Server) Stats() Stats {
	s.mu.Lock()
	idle := int64(len(s.idle))
	s.mu.Unlock()
	return Stats{Open: s.open.Load(), Idle: idle, Evicted: s.evicted.Load(), Waited: s.waited.Load()}
}

// connState tracks which of the listener's connections are idle.
func (s *Server) connState(c net.Conn, st http.ConnState) {
	if u, ok := c.(interface{ NetConn() net.Conn }); ok { // a *tls.Conn
		c = u.NetConn()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if st == http.StateIdle {
		s.idle[c] = struct{}{}
		s.order = append(s.order, c)
		return
	}
	delete(s.idle, c)
	if len(s.order) > 2*len(s.idle)+64 { // drop stale entries now and then
		kept := s.order[:0]
		for _, o := range s.order {
			if _, ok := s.idle[o]; ok {
				kept = append(kept, o)
			}
		}
		clear(s.order[len(kept):])
		s.order = kept
	}
}

// closeIdle closes the connection idle the longest, if any.
func (s *Server) closeIdle() bool {
	s.mu.Lock()
	var victim net.Conn
	for len(s.order) > 0 && victim == nil {
		c := s.order[0]
		s.order[0] = nil
		s.order = s.order[1:]
		if _, ok := s.idle[c]; ok {
			delete(s.idle, c)
			victim = c
		}
	}
	s.mu.Unlock()
	if victim == nil {
		return false
	}
	s.evicted.Add(1)
	_ = victim.Close()
	return true
}

// limitListener holds one slot of sem per open connection.
type limitListener struct {
	net.Listener
	s         *Server
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
}

// Accept takes the next connection, then a slot for it: at the cap it
// closes the connection idle the longest to free one, or waits for a
// connection to end. Waiting holds the one connection accepted, so the
// cap is exceeded by at most that one while the rest wait in the backlog.
func (l *limitListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	select {
	case l.sem <- struct{}{}:
	default:
		if !l.s.closeIdle() {
			l.s.waited.Add(1)
		}
		select {
		case l.sem <- struct{}{}:
		case <-l.done:
			_ = c.Close() // the listener is closing; the connection was never served
			return nil, net.ErrClosed
		}
	}
	l.s.open.Add(1)
	return &limitConn{Conn: c, l: l}, nil
}

// Close closes the listener and wakes an Accept waiting for a slot.
func (l *limitListener) Close() error {
	l.closeOnce.Do(func() { close(l.done) })
	return l.Listener.Close()
}

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

// Close closes the connection and frees its slot, once.
func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.s.open.Add(-1)
		<-c.l.sem
	})
	return err
}

// Collector exports servers' connection counts, labelled server:
// allot_http_connections, allot_http_idle_connections (gauges),
// allot_http_connections_evicted_total and allot_http_connection_waits_total.
type Collector struct{ servers map[string]*Server }

// NewCollector returns a Collector of servers, by name.
func NewCollector(servers map[string]*Server) *Collector { return &Collector{servers: servers} }

var (
	descOpen    = prometheus.NewDesc("allot_http_connections", "Connections an HTTP server holds.", []string{"server"}, nil)
	descIdle    = prometheus.NewDesc("allot_http_idle_connections", "Keep-alive connections idle between requests.", []string{"server"}, nil)
	descEvicted = prometheus.NewDesc("allot_http_connections_evicted_total", "Idle connections closed to make room at the connection cap.", []string{"server"}, nil)
	descWaited  = prometheus.NewDesc("allot_http_connection_waits_total", "Times a new connection waited at the connection cap (no idle one to close).", []string{"server"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descOpen, descIdle, descEvicted, descWaited} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	for name, s := range c.servers {
		st := s.Stats()
		ch <- prometheus.MustNewConstMetric(descOpen, prometheus.GaugeValue, float64(st.Open), name)
		ch <- prometheus.MustNewConstMetric(descIdle, prometheus.GaugeValue, float64(st.Idle), name)
		ch <- prometheus.MustNewConstMetric(descEvicted, prometheus.CounterValue, float64(st.Evicted), name)
		ch <- prometheus.MustNewConstMetric(descWaited, prometheus.CounterValue, float64(st.Waited), name)
	}
}
