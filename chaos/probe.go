package chaos

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// AgentSample is one agent's state at one sampling round, from its /status
// and /metrics.
type AgentSample struct {
	Up        bool   `json:"up"`
	Speaking  bool   `json:"speaking,omitempty"`
	LeaseLive bool   `json:"lease_live,omitempty"`
	Members   int    `json:"members,omitempty"`
	Breaker   string `json:"breaker,omitempty"`
	// Entries are the region's coordinator entries the agent uses, by
	// "rule/subject", with their bursts.
	Entries map[string][2]int64 `json:"entries,omitempty"`
	// Adopted is when the agent began deciding with the table that holds
	// Entries, from the run's start (0: not known, or before the start).
	Adopted time.Duration `json:"adopted_ns,omitempty"`
	// Emergency and FailOpen count admissions on those paths so far (every
	// rule); BreakerOpened the breaker's openings so far.
	Emergency     int64 `json:"emergency,omitempty"`
	FailOpen      int64 `json:"fail_open,omitempty"`
	BreakerOpened int64 `json:"breaker_opened,omitempty"`
}

// CoordSample is one coordinator's state at one sampling round.
type CoordSample struct {
	Up       bool   `json:"up"`
	Leading  bool   `json:"leading,omitempty"`
	Learning bool   `json:"learning,omitempty"`
	Term     uint64 `json:"term,omitempty"`
}

// Round is one sampling round: every agent (by region, then index) and
// every coordinator, read concurrently starting at T.
type Round struct {
	T      time.Duration   `json:"t_ns"`
	Agents [][]AgentSample `json:"agents"`
	Coords []CoordSample   `json:"coords"`
}

// Probe samples every process's state every Every until stopped.
type Probe struct {
	c     *Cluster
	every time.Duration

	mu     sync.Mutex
	rounds []Round
}

// NewProbe returns a probe sampling c every every.
func NewProbe(c *Cluster, every time.Duration) *Probe { return &Probe{c: c, every: every} }

// Run samples from t0 until ctx ends.
func (p *Probe) Run(ctx context.Context, t0 time.Time) {
	tk := time.NewTicker(p.every)
	defer tk.Stop()
	for {
		p.sample(ctx, t0)
		select {
		case <-ctx.Done():
			return
		case <-tk.C: // sampling other processes on the real clock
		}
	}
}

// Rounds returns the rounds so far.
func (p *Probe) Rounds() []Round {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]Round(nil), p.rounds...)
}

func (p *Probe) sample(ctx context.Context, t0 time.Time) {
	r := Round{T: time.Since(t0), Agents: make([][]AgentSample, len(p.c.regions)), Coords: make([]CoordSample, len(p.c.coords))}
	// A round must not outlast its period by much: a slow answer reads as
	// down.
	sctx, cancel := context.WithTimeout(ctx, max(p.every, 500*time.Millisecond))
	defer cancel()
	var wg sync.WaitGroup
	for ri, reg := range p.c.regions {
		r.Agents[ri] = make([]AgentSample, len(reg.Agents))
		for ai, a := range reg.Agents {
			wg.Add(1)
			go func() {
				defer wg.Done()
				r.Agents[ri][ai] = p.agent(sctx, a, t0)
			}()
		}
	}
	for ci, co := range p.c.coords {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var st coordStatus
			if err := p.c.getJSON(sctx, "http://"+co.HTTP+"/status.json", &st); err == nil {
				r.Coords[ci] = CoordSample{Up: true, Leading: st.Leading, Learning: st.Learning, Term: st.Term}
			}
		}()
	}
	wg.Wait()
	if ctx.Err() != nil && r.T > 0 {
		return // a round cut short by the end of the run reads as everything down
	}
	p.mu.Lock()
	p.rounds = append(p.rounds, r)
	p.mu.Unlock()
}

func (p *Probe) agent(ctx context.Context, a *Agent, t0 time.Time) AgentSample {
	st, err := p.c.Status(ctx, a)
	if err != nil {
		return AgentSample{}
	}
	s := AgentSample{Up: true, Speaking: st.Speaking, LeaseLive: st.LeaseLive, Members: len(st.Members), Breaker: st.Breaker}
	if st.Table != nil && len(st.Table.Entries) > 0 {
		s.Entries = map[string][2]int64{}
		for _, e := range st.Table.Entries {
			s.Entries[e.Rule+"/"+e.Subject] = [2]int64{e.Count, e.Burst}
		}
		// The processes share the harness's clock (no skew is given to
		// real processes).
		if at := st.Table.Adopted; at != nil && at.After(t0) {
			s.Adopted = at.Sub(t0)
		}
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+a.HTTP+"/metrics", nil)
	if err != nil {
		return s
	}
	resp, err := p.c.http.Do(req)
	if err != nil {
		return s
	}
	defer resp.Body.Close()
	ms, err := parseMetrics(resp.Body, "allot_region_decisions_total", "allot_region_breaker_opened_total")
	if err != nil {
		return s
	}
	for _, m := range ms {
		switch {
		case m.name == "allot_region_breaker_opened_total":
			s.BreakerOpened += int64(m.value)
		case m.labels["result"] == "admitted" && m.labels["path"] == "emergency":
			s.Emergency += int64(m.value)
		case m.labels["result"] == "admitted" && m.labels["path"] == "fail-open":
			s.FailOpen += int64(m.value)
		}
	}
	return s
}

// metric is one sample line of the Prometheus text format.
type metric struct {
	name   string
	labels map[string]string
	value  float64
}

// parseMetrics reads the samples of the named metrics from the Prometheus
// text exposition format (the subset client_golang writes: one sample a
// line, labels in braces, values without timestamps).
func parseMetrics(r io.Reader, names ...string) ([]metric, error) {
	var out []metric
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || line[0] == '#' {
			continue
		}
		want := false
		for _, n := range names {
			if strings.HasPrefix(line, n) && len(line) > len(n) && (line[len(n)] == '{' || line[len(n)] == ' ') {
				want = true
				break
			}
		}
		if !want {
			continue
		}
		m, err := parseMetricLine(line)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

func parseMetricLine(line string) (metric, error) {
	m := metric{labels: map[string]string{}}
	rest := line
	if i := strings.IndexAny(line, "{ "); i >= 0 {
		m.name, rest = line[:i], line[i:]
	}
	if strings.HasPrefix(rest, "{") {
		end := strings.LastIndexByte(rest, '}')
		if end < 0 {
			return m, fmt.Errorf("chaos: metrics line %q: unclosed labels", line)
		}
		body := rest[1:end]
		rest = rest[end+1:]
		for body != "" {
			eq := strings.IndexByte(body, '=')
			if eq < 0 || eq+1 >= len(body) || body[eq+1] != '"' {
				return m, fmt.Errorf("chaos: metrics line %q: bad label", line)
			}
			k := body[:eq]
			v, n, err := unquote(body[eq+1:])
			if err != nil {
				return m, fmt.Errorf("chaos: metrics line %q: %w", line, err)
			}
			m.labels[k] = v
			body = strings.TrimPrefix(body[eq+1+n:], ",")
		}
	}
	f := strings.Fields(rest)
	if len(f) == 0 {
		return m, fmt.Errorf("chaos: metrics line %q: no value", line)
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return m, fmt.Errorf("chaos: metrics line %q: value: %w", line, err)
	}
	m.value = v
	return m, nil
}

// unquote reads a double-quoted label value with \\, \" and \n escapes,
// returning it and the bytes consumed.
func unquote(s string) (string, int, error) {
	var b strings.Builder
	for i := 1; i < len(s); i++ {
		switch s[i] {
		case '\\':
			if i+1 >= len(s) {
				return "", 0, fmt.Errorf("dangling escape")
			}
			i++
			if s[i] == 'n' {
				b.WriteByte('\n')
			} else {
				b.WriteByte(s[i])
			}
		case '"':
			return b.String(), i + 1, nil
		default:
			b.WriteByte(s[i])
		}
	}
	return "", 0, fmt.Errorf("unterminated label value")
}
