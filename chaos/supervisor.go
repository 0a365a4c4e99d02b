package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"github.com/allot-dev/allot/internal/loopback"
)

// Supervisor starts and kills the run's processes. Every process is started
// from one OS thread that stays locked for the supervisor's life, with
// Pdeathsig SIGKILL (so the kernel kills the children if the harness dies,
// even by kill -9; Pdeathsig fires when the starting thread ends, hence the
// locked thread) and in its own process group (so a terminal's Ctrl-C
// reaches the harness, which kills them itself). Close kills every process
// still running. A Supervisor is safe for concurrent use.
type Supervisor struct {
	dir    string
	owners *Owners

	reqs chan spawnReq
	quit chan struct{}

	mu     sync.Mutex
	procs  []*Proc
	closed bool
}

type spawnReq struct {
	cmd  *exec.Cmd
	done chan error
}

// Proc is one supervised process; Start again after Kill restarts it with
// the same arguments (and so the same ports).
type Proc struct {
	Name  string
	Party string // the party proxies attribute its connections to ("" for none)
	Bin   string
	Args  []string

	s      *Supervisor
	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	starts int
}

// NewSupervisor returns a supervisor writing process logs to dir.
func NewSupervisor(dir string, owners *Owners) *Supervisor {
	s := &Supervisor{dir: dir, owners: owners, reqs: make(chan spawnReq), quit: make(chan struct{})}
	go s.spawner()
	return s
}

// spawner starts processes from one locked OS thread that never exits
// while the supervisor lives.
func (s *Supervisor) spawner() {
	runtime.LockOSThread() // never unlocked: the children's Pdeathsig is tied to this thread
	for {
		select {
		case r := <-s.reqs:
			r.done <- r.cmd.Start()
		case <-s.quit:
			return
		}
	}
}

// Add registers a process without starting it.
func (s *Supervisor) Add(name, party, bin string, args ...string) *Proc {
	p := &Proc{Name: name, Party: party, Bin: bin, Args: args, s: s}
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p
}

// Start starts p (again). Its output is appended to <dir>/<name>.log.
func (p *Proc) Start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
		default:
			return fmt.Errorf("chaos: %s is running", p.Name)
		}
	}
	p.s.mu.Lock()
	closed := p.s.closed
	p.s.mu.Unlock()
	if closed {
		return fmt.Errorf("chaos: start %s: supervisor closed", p.Name)
	}
	f, err := os.OpenFile(filepath.Join(p.s.dir, p.Name+".log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("chaos: %s log: %w", p.Name, err)
	}
	fmt.Fprintf(f, "--- start %d at %s: %s %q\n", p.starts+1, time.Now().Format(time.RFC3339Nano), p.Bin, p.Args)
	cmd := exec.Command(p.Bin, p.Args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	req := spawnReq{cmd: cmd, done: make(chan error, 1)}
	select {
	case p.s.reqs <- req:
	case <-p.s.quit:
		_ = f.Close() // the start failed; that is the error to report
		return fmt.Errorf("chaos: start %s: supervisor closed", p.Name)
	}
	if err := <-req.done; err != nil {
		_ = f.Close() // as above
		return fmt.Errorf("chaos: start %s: %w", p.Name, err)
	}
	p.starts++
	p.cmd = cmd
	done := make(chan struct{})
	p.done = done
	if p.Party != "" && p.s.owners != nil {
		p.s.owners.Set(cmd.Process.Pid, p.Party)
	}
	go func() {
		_ = cmd.Wait() // a killed process exits with an error by design
		_ = f.Close()  // the child wrote the log; closing it loses nothing the run judges
		if p.s.owners != nil {
			p.s.owners.Forget(cmd.Process.Pid)
		}
		close(done)
	}()
	return nil
}

// Kill sends SIGKILL (a crash: no clean shutdown) and waits for the exit.
func (p *Proc) Kill() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	<-done
}

// Alive reports whether p is running.
func (p *Proc) Alive() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return false
	}
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// Pid is the running process's id (0 when it is not running).
func (p *Proc) Pid() int {
	if !p.Alive() {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

// Close kills every process and stops the spawner. It is safe to call more
// than once.
func (s *Supervisor) Close() {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return
	}
	s.closed = true
	procs := append([]*Proc(nil), s.procs...)
	s.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Add(1)
		go func() { defer wg.Done(); p.Kill() }()
	}
	wg.Wait()
	close(s.quit)
}

// Ports hands out free loopback ports, never the same one twice in a run:
// the kernel may give a just-closed port out again.
type Ports struct {
	mu    sync.Mutex
	given map[int]bool
}

// Next returns a loopback port free for TCP and UDP a moment ago
// (memberlist binds both), below the kernel's ephemeral range, from which
// any connection a process opens before the server binds the port could
// take it (loopback.Port).
func (ps *Ports) Next() (int, error) {
	ps.mu.Lock()
	defer ps.mu.Unlock()
	if ps.given == nil {
		ps.given = map[int]bool{}
	}
	p, err := loopback.Port(ps.given)
	if err != nil {
		return 0, fmt.Errorf("chaos: %w", err)
	}
	return p, nil
}

// Addr returns a free loopback host:port.
func (ps *Ports) Addr() (string, error) {
	p, err := ps.Next()
	if err != nil {
		return "", err
	}
	return fmt.Sprintf("127.0.0.1:%d", p), nil
}

// waitFor polls cond every 50 ms until it holds, ctx ends or within passes.
// It is for other processes coming up, not for time to pass.
func waitFor(ctx context.Context, within time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("chaos: %s: not within %s", what, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond): // polling other processes
		}
	}
	return nil
}
