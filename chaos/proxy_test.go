package chaos

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// echoServer accepts connections, greets each with "hi\n" and echoes
// every line; every line it reads is also sent on got.
func echoServer(t *testing.T) (addr string, got chan string) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	got = make(chan string, 100)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hi\n"))
				r := bufio.NewReader(c)
				for {
					line, err := r.ReadString('\n')
					if err != nil {
						return
					}
					got <- strings.TrimSpace(line)
					if _, err := c.Write([]byte(line)); err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String(), got
}

type client struct {
	c net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, addr string) *client {
	t.Helper()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &client{c: c, r: bufio.NewReader(c)}
}

// line reads one line, or returns "" and the error when none comes within
// d: the tests below use it to show that bytes do not arrive.
func (cl *client) line(d time.Duration) (string, error) {
	cl.c.SetReadDeadline(time.Now().Add(d))
	s, err := cl.r.ReadString('\n')
	return strings.TrimSpace(s), err
}

func (cl *client) send(t *testing.T, s string) {
	t.Helper()
	if _, err := cl.c.Write([]byte(s + "\n")); err != nil {
		t.Fatal(err)
	}
}

func newTestProxy(t *testing.T, target string, owner func(net.Conn) string) *Proxy {
	t.Helper()
	p, err := NewProxy("test", "127.0.0.1:0", target, owner)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestProxyPassesBytes(t *testing.T) {
	addr, _ := echoServer(t)
	p := newTestProxy(t, addr, nil)
	cl := dial(t, p.Addr())
	if s, err := cl.line(5 * time.Second); s != "hi" {
		t.Fatalf("greeting %q, %v", s, err)
	}
	for _, m := range []string{"one", "two", strings.Repeat("x", 100000)} {
		cl.send(t, m)
		if s, err := cl.line(5 * time.Second); s != m {
			t.Fatalf("echo of %d bytes: got %d bytes, %v", len(m), len(s), err)
		}
	}
}

// TestProxyCutAndHeal: a cut keeps the connection open but passes nothing
// either way; healing it closes the connection that lost bytes, and a new
// one works.
func TestProxyCutAndHeal(t *testing.T) {
	addr, got := echoServer(t)
	p := newTestProxy(t, addr, nil)
	cl := dial(t, p.Addr())
	if s, _ := cl.line(5 * time.Second); s != "hi" {
		t.Fatal("no greeting")
	}
	p.Apply("cut", Rule{Dir: Both, Link: Link{Drop: true}})
	cl.send(t, "lost")
	if s, err := cl.line(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("through a cut: read %q, %v; want a timeout (connection open, nothing passing)", s, err)
	}
	select {
	case s := <-got:
		t.Fatalf("the server read %q through a cut", s)
	default:
	}
	// A connection opened during the cut is accepted and silent too.
	cl2 := dial(t, p.Addr())
	if s, err := cl2.line(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("new connection through a cut: read %q, %v; want a timeout", s, err)
	}
	p.Remove("cut")
	if _, err := cl.line(5 * time.Second); err == nil || isTimeout(err) {
		t.Fatalf("after the heal the connection that lost bytes reads %v; want it closed", err)
	}
	cl3 := dial(t, p.Addr())
	if s, _ := cl3.line(5 * time.Second); s != "hi" {
		t.Fatal("no greeting after the heal")
	}
	cl3.send(t, "back")
	if s, err := cl3.line(5 * time.Second); s != "back" {
		t.Fatalf("after the heal: %q, %v", s, err)
	}
}

// TestProxyOneWay: dropping one direction keeps the other flowing.
func TestProxyOneWay(t *testing.T) {
	addr, got := echoServer(t)
	p := newTestProxy(t, addr, nil)

	// Up dropped: the server's bytes reach the client, the client's are
	// lost.
	p.Apply("up", Rule{Dir: Up, Link: Link{Drop: true}})
	cl := dial(t, p.Addr())
	if s, err := cl.line(5 * time.Second); s != "hi" {
		t.Fatalf("with client→server dropped the greeting should pass: %q, %v", s, err)
	}
	cl.send(t, "ping")
	if _, err := cl.line(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("with client→server dropped: %v; want no echo", err)
	}
	select {
	case s := <-got:
		t.Fatalf("the server read %q with client→server dropped", s)
	default:
	}
	p.Remove("up")

	// Down dropped: the server reads the client, the client hears
	// nothing.
	p.Apply("down", Rule{Dir: Down, Link: Link{Drop: true}})
	cl2 := dial(t, p.Addr())
	cl2.send(t, "ping")
	select {
	case s := <-got:
		if s != "ping" {
			t.Fatalf("server read %q", s)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("with server→client dropped the server should read the client")
	}
	if s, err := cl2.line(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("with server→client dropped the client read %q, %v", s, err)
	}
}

// TestProxyDelay: a delay holds bytes at least that long each way, and
// keeps their order.
func TestProxyDelay(t *testing.T) {
	addr, _ := echoServer(t)
	p := newTestProxy(t, addr, nil)
	cl := dial(t, p.Addr())
	if s, _ := cl.line(5 * time.Second); s != "hi" {
		t.Fatal("no greeting")
	}
	const d = 40 * time.Millisecond
	p.Apply("slow", Rule{Dir: Both, Link: Link{Delay: d, Jitter: 10 * time.Millisecond}})
	start := time.Now()
	for i := range 20 {
		cl.send(t, strings.Repeat("a", i+1))
	}
	for i := range 20 {
		s, err := cl.line(5 * time.Second)
		if s != strings.Repeat("a", i+1) {
			t.Fatalf("echo %d: %q, %v (order lost?)", i, s, err)
		}
	}
	if rtt := time.Since(start); rtt < 2*d {
		t.Fatalf("round trip through a %s delay each way took %s", d, rtt)
	}
}

// TestProxyParties: a rule for one party leaves another's connections
// alone, and the proxy attributes a connection to the process that opened
// it.
func TestProxyParties(t *testing.T) {
	addr, _ := echoServer(t)
	owners := NewOwners()
	owners.Set(os.Getpid(), "me")
	p := newTestProxy(t, addr, owners.Of)
	p.Apply("cut-other", Rule{Parties: []string{"other"}, Dir: Both, Link: Link{Drop: true}})
	cl := dial(t, p.Addr())
	if s, err := cl.line(5 * time.Second); s != "hi" {
		t.Fatalf("a rule for another party cut this one: %q, %v", s, err)
	}
	if n := p.Conns()["me"]; n != 1 {
		t.Fatalf("connections by party: %v; want one of \"me\"", p.Conns())
	}
	p.Apply("cut-me", Rule{Parties: []string{"me"}, Dir: Both, Link: Link{Drop: true}})
	cl.send(t, "x")
	if _, err := cl.line(300 * time.Millisecond); !isTimeout(err) {
		t.Fatalf("a rule for this party: %v; want nothing through", err)
	}
}

// TestOwnersFindsAChildProcess attributes a connection opened by another
// process (a child the test starts) to that process's party.
func TestOwnersFindsAChildProcess(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	owners := NewOwners()
	// bash's /dev/tcp opens the connection from the child process itself.
	port := ln.Addr().(*net.TCPAddr).Port
	cmd := exec.Command("bash", "-c", "exec 3<>/dev/tcp/127.0.0.1/"+strconv.Itoa(port)+"; read -t 10 <&3")
	if err := cmd.Start(); err != nil {
		t.Skipf("bash: %v", err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	owners.Set(cmd.Process.Pid, "child")
	c, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if got := owners.Of(c); got != "child" {
		t.Fatalf("owner of the child's connection: %q, want child", got)
	}
	owners.Forget(cmd.Process.Pid)
	if got := owners.Of(c); got != "" {
		t.Fatalf("owner after Forget: %q, want none", got)
	}
}

// TestProxyServerDown: a connection to a proxy whose server is gone is
// closed, as a crashed host's would be.
func TestProxyServerDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	p := newTestProxy(t, addr, nil)
	cl := dial(t, p.Addr())
	if _, err := cl.line(5 * time.Second); !errors.Is(err, io.EOF) {
		t.Fatalf("through a proxy to a dead server: %v; want EOF", err)
	}
}

func TestSupervisorKillsOnClose(t *testing.T) {
	s := NewSupervisor(t.TempDir(), NewOwners())
	p := s.Add("sleeper", "", "sleep", "60")
	if err := p.Start(); err != nil {
		t.Fatal(err)
	}
	if !p.Alive() || p.Pid() == 0 {
		t.Fatal("not running after Start")
	}
	if err := p.Start(); err == nil {
		t.Fatal("a second Start of a running process succeeded")
	}
	p.Kill()
	if p.Alive() {
		t.Fatal("alive after Kill")
	}
	if err := p.Start(); err != nil {
		t.Fatalf("restart: %v", err)
	}
	pid := p.Pid()
	s.Close()
	if p.Alive() {
		t.Fatal("alive after Close")
	}
	if err := exec.Command("kill", "-0", strconv.Itoa(pid)).Run(); err == nil {
		t.Fatalf("process %d still exists after Close", pid)
	}
	if err := p.Start(); err == nil {
		t.Fatal("Start after Close succeeded")
	}
}

func TestSocketInodeTwoWays(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	s, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	peer, local := s.RemoteAddr().(*net.TCPAddr), s.LocalAddr().(*net.TCPAddr)
	d, err := diagInode(peer, local)
	if err != nil {
		t.Fatalf("sock_diag: %v", err)
	}
	p, err := scanInode(peer, local)
	if err != nil || p == "" {
		t.Fatalf("/proc/net/tcp: %q, %v", p, err)
	}
	if strconv.FormatUint(uint64(d), 10) != p {
		t.Fatalf("sock_diag says inode %d, /proc/net/tcp %s", d, p)
	}
	start := time.Now()
	for range 100 {
		diagInode(peer, local)
	}
	t.Logf("sock_diag lookup: %s each", time.Since(start)/100)
	start = time.Now()
	for range 10 {
		scanInode(peer, local)
	}
	t.Logf("/proc/net/tcp scan: %s each", time.Since(start)/10)
}
