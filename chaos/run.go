package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/allot-dev/allot/sim"
)

// Options configure a run.
type Options struct {
	// Dir receives the run's configuration, the processes' logs and the
	// recorded history; empty means a temporary directory removed after
	// the run unless Keep.
	Dir  string
	Keep bool
	// Bins are the built binaries; empty means build them into Dir.
	Bins Binaries
	// Sample is the probe's period (default 100 ms): a move's time is read
	// from the first round that finds it done, so it is late by up to one
	// period.
	Sample time.Duration
	// Seed drives the arrivals; 0 means the scenario's first seed.
	Seed uint64
	// Logf receives progress lines; nil discards them.
	Logf func(format string, args ...any)
	// TraceLease has the coordinators and the speaking agents log every
	// lease message, with its keys, and the speakers each table they
	// publish (-log-level debug): for following a move.
	TraceLease bool
}

// FaultRecord is a fault as it was injected.
type FaultRecord struct {
	Fault
	// Start and End are when the harness began and undid the fault (End
	// is zero for a fault never undone), since the run's start.
	Start time.Duration `json:"start_ns"`
	End   time.Duration `json:"end_ns,omitempty"`
	// Healed is when the store answered again for a Redis fault (the end
	// of the outage): the cut healed, the restarted server answering, or
	// a sentinel naming the promoted replica.
	Healed time.Duration `json:"healed_ns,omitempty"`
	// Detail names what was killed or changed.
	Detail string `json:"detail,omitempty"`
	Err    string `json:"error,omitempty"`
}

// action is one step of the timeline.
type action struct {
	at    time.Duration
	fault int
	start bool
	do    func(ctx context.Context) error
}

// seed is the arrivals' seed a run given s uses: s, or the scenario's
// first seed when s is 0.
func (sc *Scenario) seed(s uint64) uint64 {
	if s == 0 {
		return sc.Sim.Seeds[0]
	}
	return s
}

// Run runs one scenario on real processes and judges it. The error is for
// a run that could not be made (a process that would not start); a run
// that was made returns its Result, whatever the verdict.
func Run(ctx context.Context, sc *Scenario, opts Options) (res *Result, err error) {
	logf := opts.Logf
	if logf == nil {
		logf = func(string, ...any) {}
	}
	if opts.Sample <= 0 {
		opts.Sample = 100 * time.Millisecond
	}
	opts.Seed = sc.seed(opts.Seed)
	dir := opts.Dir
	if dir == "" {
		if dir, err = os.MkdirTemp("", "allot-chaos-"+sc.Name()+"-"); err != nil {
			return nil, fmt.Errorf("chaos: %w", err)
		}
		if !opts.Keep {
			defer os.RemoveAll(dir)
		}
	} else if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	if raw, err := os.ReadFile(sc.Path); err == nil {
		// A copy of the scenario beside the history, so the run can be
		// judged again later (Judge).
		_ = os.WriteFile(filepath.Join(dir, "scenario.yaml"), raw, 0o600) // #nosec G703 -- dir is the operator's -dir or a fresh temporary directory
	}
	bins := opts.Bins
	if bins.Agent == "" {
		logf("%s: building the binaries", sc.Name())
		if bins, err = Build(ctx, dir); err != nil {
			return nil, err
		}
	}
	logf("%s: starting processes in %s", sc.Name(), dir)
	began := time.Now()
	c, err := StartCluster(ctx, sc, bins, dir, logf, opts.TraceLease)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	logf("%s: ready after %s", sc.Name(), time.Since(began).Round(100*time.Millisecond))

	gen, err := NewGenerator(sc, c)
	if err != nil {
		return nil, err
	}
	defer gen.Close()
	probe := NewProbe(c, opts.Sample)
	records := make([]FaultRecord, len(sc.Faults))
	for i, f := range sc.Faults {
		records[i].Fault = f
	}
	var recMu sync.Mutex
	actions := c.timeline(sc, gen, records, &recMu)

	runCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	t0 := time.Now()
	load := loadAvg()
	selfCPU0, procCPU0 := selfCPU(), c.procCPU()
	probeCtx, stopProbe := context.WithCancel(runCtx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); probe.Run(probeCtx, t0) }()
	var loadMu sync.Mutex
	loads := []float64{load}
	go func() {
		defer wg.Done()
		tk := time.NewTicker(5 * time.Second)
		defer tk.Stop()
		for {
			select {
			case <-probeCtx.Done():
				return
			case <-tk.C: // the host's load average, every 5 s
				loadMu.Lock()
				loads = append(loads, loadAvg())
				loadMu.Unlock()
			}
		}
	}()
	tlDone := make(chan struct{})
	go func() {
		defer close(tlDone)
		for _, a := range actions {
			if d := time.Until(t0.Add(a.at)); d > 0 {
				select {
				case <-runCtx.Done():
					return
				case <-time.After(d): // the fault's instant on the run's real clock
				}
			}
			err := a.do(runCtx)
			recMu.Lock()
			r := &records[a.fault]
			now := time.Since(t0)
			if a.start {
				r.Start = now
			} else if r.End == 0 {
				r.End = now
			}
			if err != nil {
				r.Err = strings.TrimSpace(r.Err + " " + err.Error())
				logf("%s: %s at %s: %v", sc.Name(), r.Name(), now.Round(time.Millisecond), err)
			}
			recMu.Unlock()
		}
	}()
	logf("%s: load and faults for %s", sc.Name(), sc.Sim.Duration)
	gen.Run(runCtx, t0, opts.Seed)
	<-tlDone
	c.bg.Wait()
	// One more round after the load, then stop sampling.
	probe.sample(probeCtx, t0)
	stopProbe()
	wg.Wait()
	loads = append(loads, loadAvg())
	wall := time.Since(t0).Seconds()
	harnessCPU := (selfCPU() - selfCPU0) / wall
	var procsCPU float64
	for pid, v := range c.procCPU() {
		procsCPU += v - procCPU0[pid] // a process started since counts from zero
	}
	procsCPU /= wall
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	hist := gen.History()
	rounds := probe.Rounds()
	recMu.Lock()
	recs := append([]FaultRecord(nil), records...)
	recMu.Unlock()
	res = Analyze(sc, hist, rounds, recs, opts.Sample)
	res.Seed = opts.Seed
	res.LoadAvg = summarizeLoad(loads)
	res.CPU = CPU{Harness: harnessCPU, Processes: procsCPU}
	res.Dir = dir
	if opts.Keep || opts.Dir != "" {
		if err := writeHistory(filepath.Join(dir, "history.json"), history{Decisions: hist, Rounds: rounds, Faults: recs,
			SampleNS: opts.Sample, Seed: opts.Seed, LoadAvg: res.LoadAvg, CPU: res.CPU}); err != nil {
			logf("%s: %v", sc.Name(), err)
		}
	}
	logf("%s: %s (%s) after %s", sc.Name(), res.Verdict, res.Outcome, time.Since(began).Round(100*time.Millisecond))
	return res, nil
}

// history is what a run recorded, as written to history.json.
type history struct {
	Decisions []Decision    `json:"decisions"`
	Rounds    []Round       `json:"rounds"`
	Faults    []FaultRecord `json:"faults"`
	SampleNS  time.Duration `json:"sample_ns"`
	Seed      uint64        `json:"seed"`
	LoadAvg   LoadAvg       `json:"load_average"`
	CPU       CPU           `json:"cpu_cores"`
}

func writeHistory(path string, h history) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("chaos: history: %w", err)
	}
	defer f.Close()
	if err := json.NewEncoder(f).Encode(h); err != nil {
		return fmt.Errorf("chaos: history: %w", err)
	}
	return nil
}

// Judge judges again a run kept on disk (its directory holds
// scenario.yaml and history.json), as the checker now stands.
func Judge(dir string) (*Result, error) {
	sc, err := Load(filepath.Join(dir, "scenario.yaml"))
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "history.json"))
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	var h history
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, fmt.Errorf("chaos: %s: %w", filepath.Join(dir, "history.json"), err)
	}
	for i := range h.Faults {
		h.Faults[i].Index = i
		if i < len(sc.Faults) {
			h.Faults[i].Sim = sc.Faults[i].Sim
		}
	}
	if h.SampleNS == 0 { // kept before the period was recorded, at 200 ms
		h.SampleNS = 200 * time.Millisecond
	}
	res := Analyze(sc, h.Decisions, h.Rounds, h.Faults, h.SampleNS)
	res.Seed, res.LoadAvg, res.CPU, res.Dir = h.Seed, h.LoadAvg, h.CPU, dir
	return res, nil
}

// loadAvg reads the host's one-minute load average (0 when unknown).
func loadAvg() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}

// selfCPU is the harness's CPU time so far, in seconds.
func selfCPU() float64 {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// procCPU is the CPU time so far of every running process of the
// cluster, in seconds, by pid (from /proc/<pid>/stat, at 100 ticks a
// second).
func (c *Cluster) procCPU() map[int]float64 {
	out := map[int]float64{}
	c.sup.mu.Lock()
	procs := append([]*Proc(nil), c.sup.procs...)
	c.sup.mu.Unlock()
	for _, p := range procs {
		pid := p.Pid()
		if pid == 0 {
			continue
		}
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// The command name is in parentheses and may hold spaces: count
		// fields after the last ')'. utime and stime are fields 14 and 15.
		rest := string(b[strings.LastIndexByte(string(b), ')')+1:])
		f := strings.Fields(rest)
		if len(f) < 13 {
			continue
		}
		u, _ := strconv.ParseFloat(f[11], 64)
		st, _ := strconv.ParseFloat(f[12], 64)
		out[pid] = (u + st) / 100
	}
	return out
}

func summarizeLoad(ls []float64) LoadAvg {
	var la LoadAvg
	if len(ls) == 0 {
		return la
	}
	la.Start, la.End = ls[0], ls[len(ls)-1]
	for _, v := range ls {
		la.Max = max(la.Max, v)
		la.Mean += v / float64(len(ls))
	}
	return la
}

// timeline turns the scenario's faults into actions on the cluster, sorted
// by instant (a fault's start before another's end at the same instant).
func (c *Cluster) timeline(sc *Scenario, gen *Generator, recs []FaultRecord, mu *sync.Mutex) []action {
	var out []action
	set := func(i int, fn func(r *FaultRecord)) {
		mu.Lock()
		fn(&recs[i])
		mu.Unlock()
	}
	for i, f := range sc.Faults {
		id := fmt.Sprintf("fault-%d", i)
		reg := c.Region(f.Region)
		parties := func() []string {
			if f.Agent != nil {
				return []string{reg.Agents[*f.Agent].Name}
			}
			return c.agentNames(reg)
		}
		rule := func(d Dir, l Link) Rule { return Rule{Parties: parties(), Dir: d, Link: l} }
		onCoords := func(r Rule) func(context.Context) error {
			return func(context.Context) error {
				for _, co := range c.coords {
					co.Proxy.Apply(id, r)
				}
				return nil
			}
		}
		offCoords := func(context.Context) error {
			for _, co := range c.coords {
				co.Proxy.Remove(id)
			}
			return nil
		}
		onRedis := func(r Rule) func(context.Context) error {
			return func(context.Context) error {
				for _, n := range reg.Redis {
					for _, px := range n.proxies() {
						px.Apply(id, r)
					}
				}
				return nil
			}
		}
		offRedis := func(context.Context) error {
			for _, n := range reg.Redis {
				for _, px := range n.proxies() {
					px.Remove(id)
				}
			}
			return nil
		}
		add := func(at time.Duration, start bool, do func(context.Context) error) {
			out = append(out, action{at: at, fault: i, start: start, do: do})
		}
		switch f.Kind {
		case sim.FaultCoordinatorCut, sim.FaultRegionCut:
			add(f.At, true, onCoords(rule(Both, Link{Drop: true})))
			add(f.End(), false, offCoords)
		case FaultCoordinatorDelay:
			add(f.At, true, onCoords(rule(Both, Link{Delay: f.Delay, Jitter: f.Jitter})))
			add(f.End(), false, offCoords)
		case FaultCoordinatorOneway:
			d := Up
			if f.Direction == "from" {
				d = Down
			}
			add(f.At, true, onCoords(rule(d, Link{Drop: true})))
			add(f.End(), false, offCoords)
		case sim.FaultRedisCut:
			add(f.At, true, onRedis(rule(Both, Link{Drop: true})))
			add(f.End(), false, offRedis)
		case FaultRedisDelay, sim.FaultRedisSlow:
			add(f.At, true, onRedis(rule(Both, Link{Delay: f.Delay, Jitter: f.Jitter})))
			add(f.End(), false, func(context.Context) error {
				return offRedis(context.Background())
			})
		case FaultGossipSplit:
			add(f.At, true, func(context.Context) error { return nil }) // in force from the start
			add(f.End(), false, func(context.Context) error { reg.Gossip.Remove("split"); return nil })
		case sim.FaultAgentCrash, FaultSpeakerKill:
			var victim *Agent
			add(f.At, true, func(ctx context.Context) error {
				if f.Kind == FaultSpeakerKill {
					a, err := c.Speaker(ctx, reg)
					if err != nil {
						return err
					}
					victim = a
				} else {
					victim = reg.Agents[*orZero(f.Agent)]
				}
				st, _ := c.Status(ctx, victim)
				gen.SetDown(victim, true)
				victim.Proc.Kill()
				set(i, func(r *FaultRecord) { r.Detail = fmt.Sprintf("killed %s (speaking: %v)", victim.Name, st.Speaking) })
				return nil
			})
			if f.For > 0 {
				add(f.End(), false, func(ctx context.Context) error {
					if victim == nil {
						return errors.New("chaos: nothing was killed")
					}
					return c.restartAgent(ctx, gen, victim)
				})
			}
		case sim.FaultLeaderFailover, FaultCoordinatorKill:
			var victim *Coord
			add(f.At, true, func(ctx context.Context) error {
				co, err := c.Leader()
				if err != nil {
					return err
				}
				victim = co
				co.Proc.Kill()
				set(i, func(r *FaultRecord) { r.Detail = fmt.Sprintf("killed coordinator-%d (the leader)", co.Index) })
				return nil
			})
			restart := f.For
			if f.Kind == sim.FaultLeaderFailover {
				restart = sc.Block.LeaderRestart
			}
			if restart > 0 && f.At+restart <= sc.Sim.Duration {
				add(f.At+restart, false, func(ctx context.Context) error {
					if victim == nil {
						return errors.New("chaos: nothing was killed")
					}
					return victim.Proc.Start()
				})
			}
		case FaultRedisKill, sim.FaultRedisFailover:
			var victim *RedisNode
			add(f.At, true, func(ctx context.Context) error {
				victim = reg.Redis[0]
				if len(reg.SentAt) > 0 {
					m, err := c.SentinelMaster(ctx, reg)
					if err != nil {
						return err
					}
					for _, n := range reg.Redis {
						if n.Proxy.Addr() == m {
							victim = n
						}
					}
				}
				victim.Proc.Kill()
				killedAt := time.Now()
				set(i, func(r *FaultRecord) { r.Detail = "killed " + victim.Proc.Name })
				if len(reg.SentAt) > 0 {
					// The outage ends when a sentinel names another master.
					c.background(func() {
						old := victim.Proxy.Addr()
						err := waitFor(ctx, 30*time.Second, "a sentinel names the promoted replica", func() bool {
							m, err := c.SentinelMaster(ctx, reg)
							return err == nil && m != old
						})
						set(i, func(r *FaultRecord) {
							if err == nil {
								r.Healed = r.Start + time.Since(killedAt)
								r.Detail += fmt.Sprintf("; replica promoted after %s", time.Since(killedAt).Round(10*time.Millisecond))
							} else {
								r.Err = err.Error()
							}
						})
					})
				}
				return nil
			})
			if f.For > 0 {
				add(f.End(), false, func(ctx context.Context) error {
					if victim == nil {
						return errors.New("chaos: nothing was killed")
					}
					if err := victim.Proc.Start(); err != nil {
						return err
					}
					started := time.Now()
					c.background(func() {
						err := c.waitRedis(ctx, victim)
						set(i, func(r *FaultRecord) {
							switch {
							case err != nil:
								r.Err = err.Error()
							case len(reg.SentAt) == 0:
								// The outage ends when the restarted server answers.
								r.Healed = f.End() + time.Since(started)
								r.Detail += "; restarted empty"
							default:
								r.Detail += "; restarted (a replica again)"
							}
						})
					})
					return nil
				})
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return out[i].at < out[j].at })
	return out
}

func orZero(p *int) *int {
	if p == nil {
		z := 0
		return &z
	}
	return p
}

// restartAgent starts a killed agent again and puts it back in the load's
// rotation once it answers.
func (c *Cluster) restartAgent(ctx context.Context, gen *Generator, a *Agent) error {
	if err := a.Proc.Start(); err != nil {
		return err
	}
	c.background(func() {
		_ = waitFor(ctx, 15*time.Second, a.Name+" answers after its restart", func() bool {
			_, err := c.Status(ctx, a)
			return err == nil
		})
		gen.SetDown(a, false)
	})
	return nil
}

// background runs fn (a bounded wait for a process) beside the timeline;
// Run waits for it before judging.
func (c *Cluster) background(fn func()) {
	c.bg.Add(1)
	go func() { defer c.bg.Done(); fn() }()
}
