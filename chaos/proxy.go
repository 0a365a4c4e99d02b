package chaos

import (
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Dir is a direction through a proxy.
type Dir uint8

// Directions: Up is client to server (an agent to Redis or a coordinator),
// Down is server to client.
const (
	Up Dir = 1 << iota
	Down
	Both = Up | Down
)

// Link is what a fault does to the bytes of one direction.
type Link struct {
	// Drop discards every byte read; the connection stays open. A
	// connection that lost bytes is closed when the drop is removed: its
	// stream is broken, as a connection whose retransmissions ran out is.
	Drop bool
	// Delay holds every chunk this long before it is written, plus a
	// uniform random extra of up to Jitter; order is kept.
	Delay, Jitter time.Duration
}

// Rule applies a Link to the connections of some parties in some
// directions.
type Rule struct {
	// Parties are the clients the rule applies to (names the proxy's Owner
	// returns); empty means every client.
	Parties []string
	Dir     Dir
	Link    Link
}

func (r Rule) matches(party string, d Dir) bool {
	return r.Dir&d != 0 && (len(r.Parties) == 0 || slices.Contains(r.Parties, party))
}

// Proxy is a TCP fault proxy in front of one server. Every accepted
// connection is attributed to a party (the process that opened it, see
// Owners) and forwarded to the target; the rules in force decide, chunk by
// chunk, whether its bytes pass, wait or are dropped. Rules change at run
// time. A Proxy is safe for concurrent use.
type Proxy struct {
	name   string
	target string
	ln     net.Listener
	owner  func(net.Conn) string

	rules atomic.Pointer[[]namedRule]

	mu     sync.Mutex
	conns  map[*pconn]struct{}
	closed bool
	seed   uint64
	wg     sync.WaitGroup
}

type namedRule struct {
	id string
	Rule
}

// pconn is one proxied connection.
type pconn struct {
	party          string
	client, server net.Conn
	lost           atomic.Bool
	once           sync.Once
}

func (c *pconn) close() {
	c.once.Do(func() {
		_ = c.client.Close() // both ends go; an end already closed has nothing more to say
		_ = c.server.Close() // as above
	})
}

// NewProxy listens on addr (a free loopback port when addr ends in ":0")
// and forwards to target. owner attributes a connection to a party; nil
// attributes every connection to "".
func NewProxy(name, addr, target string, owner func(net.Conn) string) (*Proxy, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("chaos: proxy %s: listen %s: %w", name, addr, err)
	}
	if owner == nil {
		owner = func(net.Conn) string { return "" }
	}
	p := &Proxy{name: name, target: target, ln: ln, owner: owner, conns: map[*pconn]struct{}{}, seed: uint64(time.Now().UnixNano())}
	p.rules.Store(&[]namedRule{})
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// Addr is the address clients dial.
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Name is the proxy's name.
func (p *Proxy) Name() string { return p.name }

// Apply adds rule r under id, replacing a rule with the same id.
func (p *Proxy) Apply(id string, r Rule) {
	p.mu.Lock()
	defer p.mu.Unlock()
	old := *p.rules.Load()
	next := make([]namedRule, 0, len(old)+1)
	for _, nr := range old {
		if nr.id != id {
			next = append(next, nr)
		}
	}
	next = append(next, namedRule{id: id, Rule: r})
	p.rules.Store(&next)
}

// Remove removes the rule id. Connections that lost bytes and no longer
// drop are closed, so their endpoints reconnect on a clean stream.
func (p *Proxy) Remove(id string) {
	p.mu.Lock()
	old := *p.rules.Load()
	next := make([]namedRule, 0, len(old))
	for _, nr := range old {
		if nr.id != id {
			next = append(next, nr)
		}
	}
	p.rules.Store(&next)
	var broken []*pconn
	for c := range p.conns {
		if c.lost.Load() && !p.link(c.party, Up).Drop && !p.link(c.party, Down).Drop {
			broken = append(broken, c)
		}
	}
	p.mu.Unlock()
	for _, c := range broken {
		c.close()
	}
}

// link is the effect of every rule in force on party's bytes in direction
// d: any drop drops, delays and jitters add up.
func (p *Proxy) link(party string, d Dir) Link {
	var l Link
	for _, r := range *p.rules.Load() {
		if r.matches(party, d) {
			l.Drop = l.Drop || r.Link.Drop
			l.Delay += r.Link.Delay
			l.Jitter += r.Link.Jitter
		}
	}
	return l
}

// Conns returns the number of open connections per party.
func (p *Proxy) Conns() map[string]int {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := map[string]int{}
	for c := range p.conns {
		out[c.party]++
	}
	return out
}

// Close stops accepting and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	conns := make([]*pconn, 0, len(p.conns))
	for c := range p.conns {
		conns = append(conns, c)
	}
	p.mu.Unlock()
	err := p.ln.Close()
	for _, c := range conns {
		c.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		client, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.wg.Add(1)
		go p.serve(client)
	}
}

// serve dials the target for one accepted client and pumps both ways.
func (p *Proxy) serve(client net.Conn) {
	defer p.wg.Done()
	party := p.owner(client)
	server, err := net.DialTimeout("tcp", p.target, time.Second)
	if err != nil {
		// The server is down (killed): the client sees its connection
		// closed, as it would from a host whose process died.
		_ = client.Close()
		return
	}
	c := &pconn{party: party, client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.close()
		return
	}
	p.conns[c] = struct{}{}
	seed := p.seed
	p.seed++
	p.mu.Unlock()
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pump(c, client, server, Up, seed) }()
	go func() { defer wg.Done(); p.pump(c, server, client, Down, seed^0x9e3779b97f4a7c15) }()
	wg.Wait()
	c.close()
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// chunk is bytes read at one instant, due for writing at due.
type chunk struct {
	b   []byte
	due time.Time
}

// maxQueued bounds the chunks held for delay per direction of one
// connection; a full queue stops reading, which pushes back on the sender
// as a slow network would.
const maxQueued = 1024

// pump copies src to dst through the rules of direction d. Reads and
// writes run in two goroutines joined by a queue, so a delay holds bytes
// without holding back later reads.
func (p *Proxy) pump(c *pconn, src, dst net.Conn, d Dir, seed uint64) {
	q := make(chan chunk, maxQueued)
	done := make(chan struct{})
	// pending counts chunks queued and not yet written; at zero the
	// writer is idle, so the reader may write a chunk due now itself
	// without passing an earlier one (the common case costs no hop).
	var pending atomic.Int64
	go func() {
		defer close(done)
		for ch := range q {
			if w := time.Until(ch.due); w > 0 {
				time.Sleep(w) // the chunk's delay: real time on a real link
			}
			_, err := dst.Write(ch.b)
			pending.Add(-1)
			if err != nil {
				c.close()
				for range q { // drain so the reader never blocks
					pending.Add(-1)
				}
				return
			}
		}
	}()
	rng := rand.New(rand.NewPCG(seed, 0))
	var last time.Time
	buf := make([]byte, 32<<10)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			l := p.link(c.party, d)
			if l.Drop {
				c.lost.Store(true)
			} else {
				due := time.Now().Add(l.Delay)
				if l.Jitter > 0 {
					due = due.Add(time.Duration(rng.Int64N(int64(l.Jitter) + 1)))
				}
				if due.Before(last) {
					due = last // keep the stream's order
				}
				last = due
				if l.Delay == 0 && l.Jitter == 0 && pending.Load() == 0 {
					if _, werr := dst.Write(buf[:n]); werr != nil {
						c.close()
					}
				} else {
					pending.Add(1)
					q <- chunk{b: slices.Clone(buf[:n]), due: due}
				}
			}
		}
		if err != nil {
			close(q)
			<-done
			if errors.Is(err, io.EOF) {
				// The sender closed its side: pass the close on once
				// everything before it is written, and let the other
				// direction finish.
				if tc, ok := dst.(*net.TCPConn); ok {
					_ = tc.CloseWrite()
					return
				}
			}
			c.close()
			return
		}
	}
}
