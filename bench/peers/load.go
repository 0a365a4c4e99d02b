package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Result is one measured round of one system in one cell.
type Result struct {
	System    string
	Callers   int
	Keys      int
	Round     int
	Decisions int
	Failed    int
	Seconds   float64
	P50       time.Duration
	P99       time.Duration
	P999      time.Duration
	// ServiceCPU and RedisCPU are the CPU time (user + system) the
	// service's process and its Redis's used during the round.
	ServiceCPU time.Duration
	RedisCPU   time.Duration
	// RedisCalls is the commands its Redis ran (every command in INFO
	// commandstats, scripts' inner calls included).
	RedisCalls int64
	FirstError string `json:",omitempty"`
}

// PerSecond is the round's decisions per second.
func (r Result) PerSecond() float64 { return float64(r.Decisions) / r.Seconds }

// CPUPerDecision is the service's and its Redis's CPU µs per decision.
func (r Result) CPUPerDecision() (svc, red float64) {
	n := float64(max(r.Decisions, 1))
	return float64(r.ServiceCPU.Microseconds()) / n, float64(r.RedisCPU.Microseconds()) / n
}

// Report is everything one run measured.
type Report struct {
	Start, End      time.Time
	LoadBefore      string // /proc/loadavg when the run started
	LoadAfter       string
	Systems         []string
	Setups          map[string]string
	Notes           []string
	Results         []Result
	Memory          []MemResult
	DurationOfRound time.Duration
}

// Run starts every system cfg names, drives each cell's interleaved
// rounds, measures memory per key, prints the tables to out and returns
// the report. It fails when a system does not start or a decision fails.
func Run(ctx context.Context, cfg Config, out io.Writer) (*Report, error) {
	rep := &Report{Start: time.Now(), LoadBefore: loadavg(), Setups: map[string]string{}, DurationOfRound: cfg.Duration}
	dir, cleanup, err := workDir()
	if err != nil {
		return nil, err
	}
	defer cleanup()
	names, notes, err := installPeers(ctx, cfg)
	if err != nil {
		return nil, err
	}
	rep.Notes = notes
	if cfg.BaseAgent != "" {
		if _, err := os.Stat(cfg.BaseAgent); err != nil {
			return nil, fmt.Errorf("peers: -base-agent=%q: %w", cfg.BaseAgent, err)
		}
		var with []string
		for _, n := range names {
			with = append(with, n)
			if strings.HasPrefix(n, "allot-") {
				with = append(with, n+baseSuffix)
			}
		}
		names = with
	}
	var agentBin string
	for _, n := range names {
		if strings.HasPrefix(n, "allot-") && !strings.HasSuffix(n, baseSuffix) && agentBin == "" {
			if agentBin, err = buildAgent(ctx, dir); err != nil {
				return nil, err
			}
		}
	}
	maxKeys := max(slices.Max(cfg.Keys), cfg.MemoryKeys+cfg.HotKeys)
	var systems []*system
	defer func() {
		for _, s := range systems {
			s.close()
		}
	}()
	for _, n := range names {
		s, err := startSystem(ctx, cfg, dir, n, agentBin, maxKeys)
		if err != nil {
			return nil, fmt.Errorf("peers: %s did not start: %w", n, err)
		}
		systems = append(systems, s)
		rep.Systems = append(rep.Systems, n)
		rep.Setups[n] = s.setup
	}
	fmt.Fprintf(out, "systems: %s; load average at start: %s\n", strings.Join(rep.Systems, ", "), rep.LoadBefore)
	var failed []string
	cell := 0
	for _, callers := range cfg.Callers {
		for _, keys := range cfg.Keys {
			cell++
			for round := range cfg.Rounds {
				for i := range systems {
					s := systems[(i+round)%len(systems)] // each round starts with the next system
					prefix := fmt.Sprintf("c%d-r%d-", cell, round)
					if cfg.Warmup > 0 {
						generate(ctx, s, callers, keys, cfg.Warmup, prefix)
					}
					r := measure(ctx, s, callers, keys, cfg.Duration, prefix)
					r.Round = round
					rep.Results = append(rep.Results, r)
					fmt.Fprintf(out, "  %-22s callers %-4d keys %-8d round %d: %8.0f decisions/s, p50 %s p99 %s, CPU %.1f + %.1f µs/decision, %.2f Redis commands/decision\n",
						s.name, callers, keys, round, r.PerSecond(), ms(r.P50), ms(r.P99), cpu(r.ServiceCPU, r.Decisions), cpu(r.RedisCPU, r.Decisions),
						float64(r.RedisCalls)/float64(max(r.Decisions, 1)))
					if r.Failed > 0 || r.Decisions == 0 {
						failed = append(failed, fmt.Sprintf("%s (callers %d, keys %d): %d of %d decisions failed: %s",
							s.name, callers, keys, r.Failed, r.Decisions+r.Failed, r.FirstError))
					}
					if ctx.Err() != nil {
						return nil, ctx.Err()
					}
				}
			}
		}
	}
	if cfg.MemoryKeys > 0 {
		mem, err := measureMemory(ctx, cfg, systems)
		if err != nil {
			return nil, err
		}
		rep.Memory = mem
	}
	rep.End, rep.LoadAfter = time.Now(), loadavg()
	printReport(out, rep)
	if cfg.JSON != "" {
		b, _ := json.MarshalIndent(rep, "", "  ")
		if err := os.WriteFile(cfg.JSON, b, 0o600); err != nil {
			return rep, err
		}
	}
	if len(failed) > 0 {
		return rep, fmt.Errorf("peers: decisions failed:\n  %s", strings.Join(failed, "\n  "))
	}
	return rep, nil
}

// load is what one closed-loop run observed.
type load struct {
	decisions, failed int
	lat               []time.Duration
	firstErr          error
	elapsed           time.Duration
}

// generate runs callers closed-loop callers against s for d: each asks
// for a decision and, once answered, for the next. Caller c walks its own
// stretch of the key space, so with at least as many keys as callers no
// two callers share a key, and with a million keys none repeats within a
// round: cold keys.
func generate(ctx context.Context, s *system, callers, keys int, d time.Duration, prefix string) load {
	stride := max(keys/callers, 1)
	var (
		mu  sync.Mutex
		all load
		wg  sync.WaitGroup
	)
	start := time.Now()
	deadline := start.Add(d)
	for c := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var l load
			l.lat = make([]time.Duration, 0, 4096)
			for i := 0; time.Now().Before(deadline) && ctx.Err() == nil; i++ {
				subject := prefix + strconv.Itoa((c*stride+i)%keys)
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				t := time.Now()
				ok, err := s.decide(cctx, subject, pathAPI)
				el := time.Since(t)
				cancel()
				if err == nil && !ok {
					err = errors.New("denied under a limit nobody reaches")
				}
				if err != nil {
					l.failed++
					if l.firstErr == nil {
						l.firstErr = err
					}
					continue
				}
				l.decisions++
				l.lat = append(l.lat, el)
			}
			mu.Lock()
			all.decisions += l.decisions
			all.failed += l.failed
			all.lat = append(all.lat, l.lat...)
			if all.firstErr == nil {
				all.firstErr = l.firstErr
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	all.elapsed = time.Since(start)
	return all
}

// measure is one round: generate, with the CPU the service and its Redis
// used meanwhile read from /proc.
func measure(ctx context.Context, s *system, callers, keys int, d time.Duration, prefix string) Result {
	calls0 := s.redisCalls(ctx)
	svc0, red0 := cpuTime(s.svc), cpuTime(s.redis)
	l := generate(ctx, s, callers, keys, d, prefix)
	svc1, red1 := cpuTime(s.svc), cpuTime(s.redis)
	calls1 := s.redisCalls(ctx)
	slices.Sort(l.lat)
	r := Result{System: s.name, Callers: callers, Keys: keys, Decisions: l.decisions, Failed: l.failed,
		Seconds: l.elapsed.Seconds(), ServiceCPU: svc1 - svc0, RedisCPU: red1 - red0,
		P50: pct(l.lat, 0.50), P99: pct(l.lat, 0.99), P999: pct(l.lat, 0.999), RedisCalls: calls1 - calls0}
	if l.firstErr != nil {
		r.FirstError = l.firstErr.Error()
	}
	return r
}

func pct(sorted []time.Duration, q float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(int(float64(len(sorted))*q), len(sorted)-1)]
}

var clkTck = func() int64 {
	out, err := exec.Command("getconf", "CLK_TCK").Output()
	if err == nil {
		if n, err := strconv.ParseInt(strings.TrimSpace(string(out)), 10, 64); err == nil && n > 0 {
			return n
		}
	}
	return 100
}()

// cpuTime is a process's user + system CPU time so far, from
// /proc/<pid>/stat (utime and stime, in clock ticks), all threads
// included; 0 for no process.
func cpuTime(p *proc) time.Duration {
	if p == nil {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p.pid()))
	if err != nil {
		return 0
	}
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(ut+st) * time.Second / time.Duration(clkTck)
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

func ms(d time.Duration) string { return strconv.FormatFloat(float64(d)/1e6, 'f', 2, 64) }

func cpu(d time.Duration, n int) float64 { return float64(d.Microseconds()) / float64(max(n, 1)) }

// span prints the range of a figure over a cell's rounds.
func span(xs []float64, f func(float64) string) string {
	lo, hi := slices.Min(xs), slices.Max(xs)
	if f(lo) == f(hi) {
		return f(lo)
	}
	return f(lo) + "–" + f(hi)
}

func printReport(out io.Writer, rep *Report) {
	fmt.Fprintf(out, "\n### Decisions (%d interleaved rounds of %s per system per cell; load average %s at start, %s at end)\n\n",
		roundsOf(rep), rep.DurationOfRound, rep.LoadBefore, rep.LoadAfter)
	fmt.Fprintln(out, "| callers | keys | system | decisions/s | p50 / p99 / p999 ms | CPU µs per decision (service + Redis) | CPU vs envoyproxy/ratelimit |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	type cellKey struct{ callers, keys int }
	var cells []cellKey
	by := map[cellKey]map[string][]Result{}
	for _, r := range rep.Results {
		k := cellKey{r.Callers, r.Keys}
		if by[k] == nil {
			by[k] = map[string][]Result{}
			cells = append(cells, k)
		}
		by[k][r.System] = append(by[k][r.System], r)
	}
	kf := func(x float64) string {
		if x >= 1000 {
			return strconv.FormatFloat(x/1000, 'f', 1, 64) + "k"
		}
		return strconv.FormatFloat(x, 'f', 0, 64)
	}
	msf := func(x float64) string { return strconv.FormatFloat(x, 'f', 2, 64) }
	itf := func(x float64) string { return strconv.FormatFloat(x, 'f', 0, 64) }
	for _, k := range cells {
		base := totalCPU(by[k]["envoyproxy-ratelimit"])
		for _, name := range rep.Systems {
			rs := by[k][name]
			if len(rs) == 0 {
				continue
			}
			var rate, p50, p99, p999, tot, svc, red []float64
			for _, r := range rs {
				s, d := r.CPUPerDecision()
				rate = append(rate, r.PerSecond())
				p50 = append(p50, float64(r.P50)/1e6)
				p99 = append(p99, float64(r.P99)/1e6)
				p999 = append(p999, float64(r.P999)/1e6)
				svc, red, tot = append(svc, s), append(red, d), append(tot, s+d)
			}
			ratio := "—"
			if base > 0 {
				ratio = strconv.FormatFloat(totalCPU(rs)/base, 'f', 2, 64) + "×"
			}
			cpuCol := span(tot, itf)
			if slices.Max(red) > 0 {
				cpuCol += " (" + span(svc, itf) + " + " + span(red, itf) + ")"
			}
			fmt.Fprintf(out, "| %d | %s | %s | %s | %s / %s / %s | %s | %s |\n", k.callers, thousands(k.keys), name,
				span(rate, kf), span(p50, msf), span(p99, msf), span(p999, msf), cpuCol, ratio)
		}
	}
	fmt.Fprintln(out, "\nCPU vs envoyproxy/ratelimit: the system's CPU (service + Redis) over all the cell's rounds per decision, divided by envoyproxy/ratelimit's.")
	if len(rep.Memory) > 0 {
		printMemory(out, rep.Memory)
	}
	fmt.Fprintln(out, "\nHow each system ran:")
	for _, n := range rep.Systems {
		fmt.Fprintf(out, "- %s: %s\n", n, rep.Setups[n])
	}
	for _, n := range rep.Notes {
		fmt.Fprintf(out, "- left out: %s\n", n)
	}
}

func roundsOf(rep *Report) int {
	n := 0
	for _, r := range rep.Results {
		n = max(n, r.Round+1)
	}
	return n
}

// totalCPU is the CPU µs (service + Redis) per decision over rounds.
func totalCPU(rs []Result) float64 {
	var cpu time.Duration
	n := 0
	for _, r := range rs {
		cpu += r.ServiceCPU + r.RedisCPU
		n += r.Decisions
	}
	if n == 0 {
		return 0
	}
	return float64(cpu.Microseconds()) / float64(n)
}

// thousands writes n with commas: 1,000,000.
func thousands(n int) string {
	s := strconv.Itoa(n)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
