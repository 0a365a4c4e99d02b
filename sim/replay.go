package sim

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"
)

// ReplaySpec replays recorded requests in place of (or beside) synthetic
// traffic:
//
//	replay:
//	  - file: traffic/tuesday.jsonl    # an agent's decision log, or a CSV
//	    scale: 2                       # twice the volume
//	    region_scale: {ap: 3}          # ap's records three times more
//	    move: [{from: us, to: eu, share: 0.5}]  # half of us's load lands in eu
//
// A log is JSONL (one object a line, the agents' decision log format:
// {"t":"2026-12-02T01:02:03.456789Z","region":"eu","rule":"api","subject":"9f86d081884c7d65","cost":1},
// other fields ignored) or CSV with a header naming the columns time,
// region, rule, subject and optionally cost (other columns ignored). A time
// is RFC 3339 or Unix seconds with a fraction. The log's first record lands
// at Start; records after the scenario's end are not replayed. Subjects are
// opaque: each distinct (rule, subject) is one key of the rule. See
// docs/operators.md.
type ReplaySpec struct {
	File string `yaml:"file"`
	// Format is "jsonl" or "csv"; empty takes it from the file's extension
	// (.csv is CSV, anything else JSONL).
	Format string `yaml:"format"`
	// Start is the scenario instant the log's first record lands at.
	Start time.Duration `yaml:"start"`
	// Scale multiplies the volume: a record is replayed ⌊Scale⌋ times, and
	// once more with probability Scale − ⌊Scale⌋ (a value below 1 thins the
	// log). Default 1.
	Scale float64 `yaml:"scale"`
	// RegionScale multiplies one region's records further, the same way.
	RegionScale map[string]float64 `yaml:"region_scale"`
	// Move sends a share of one region's records to another, before the
	// scaling.
	Move []MoveSpec `yaml:"move"`
	// Jitter spreads the copies a scale above 1 makes: every copy but the
	// first lands uniformly within Jitter after its record. Default: the
	// log's mean gap between records of the same region and rule, so the
	// copies fill the gaps a sampled log left.
	Jitter time.Duration `yaml:"jitter"`
	// Rules renames the log's rules to the scenario's (an access log's
	// route names to budgets, say).
	Rules map[string]string `yaml:"rules"`

	log *replayLog
}

// MoveSpec moves Share of region From's records to region To.
type MoveSpec struct {
	From  string  `yaml:"from"`
	To    string  `yaml:"to"`
	Share float64 `yaml:"share"`
}

// Bounds on a replayed log, so a wrong path fails clearly instead of
// exhausting memory.
const (
	maxReplayBytes   = 1 << 30
	maxReplayRecords = 20_000_000
)

// replayLog is a parsed log: records sorted by time, relative to the
// first.
type replayLog struct {
	at     []int64 // µs after the first record
	region []uint16
	rule   []uint16
	key    []int32 // index of the subject among the rule's
	cost   []int64
	span   int64
	keys   []int // distinct subjects per rule
	gap    []float64
}

// replayRecord is one line of a JSONL log.
type replayRecord struct {
	T       json.RawMessage `json:"t"`
	Region  string          `json:"region"`
	Rule    string          `json:"rule"`
	Subject string          `json:"subject"`
	Cost    *int64          `json:"cost"`
}

// loadReplays reads every replayed log, checks its records against the
// scenario's regions and rules, and grows each rule's keys to the subjects
// the logs name. A scenario without a duration runs to the end of its
// longest log.
func (sc *Scenario) loadReplays(dir string) error {
	fromLogs := sc.Duration == 0
	for i := range sc.Replay {
		rs := &sc.Replay[i]
		f := fmt.Sprintf("replay[%d]", i)
		if rs.File == "" {
			return bad("%s.file is empty", f)
		}
		if rs.Scale == 0 {
			rs.Scale = 1
		}
		if rs.Scale < 0 || rs.Scale > 1000 || math.IsNaN(rs.Scale) {
			return bad("%s.scale=%v must be in (0, 1000]", f, rs.Scale)
		}
		if rs.Start < 0 || rs.Jitter < 0 {
			return bad("%s: start=%s and jitter=%s must be ≥ 0", f, rs.Start, rs.Jitter)
		}
		for name, v := range rs.RegionScale {
			if sc.regionIndex(name) < 0 {
				return bad("%s.region_scale: %q is not a region", f, name)
			}
			if v < 0 || v > 1000 || math.IsNaN(v) {
				return bad("%s.region_scale.%s=%v must be in [0, 1000]", f, name, v)
			}
		}
		for j, m := range rs.Move {
			switch {
			case sc.regionIndex(m.From) < 0:
				return bad("%s.move[%d].from=%q is not a region", f, j, m.From)
			case sc.regionIndex(m.To) < 0:
				return bad("%s.move[%d].to=%q is not a region", f, j, m.To)
			case !(m.Share > 0 && m.Share <= 1):
				return bad("%s.move[%d].share=%v must be in (0, 1]", f, j, m.Share)
			}
		}
		format := rs.Format
		if format == "" {
			format = "jsonl"
			if strings.EqualFold(filepath.Ext(rs.File), ".csv") {
				format = "csv"
			}
		}
		if format != "jsonl" && format != "csv" {
			return bad("%s.format=%q must be jsonl or csv", f, rs.Format)
		}
		data, err := readFileLimited(resolvePath(dir, rs.File), maxReplayBytes)
		if err != nil {
			return fmt.Errorf("%w: %s.file=%q: %w", ErrScenario, f, rs.File, err)
		}
		log, err := sc.parseReplay(data, format, rs.Rules)
		if err != nil {
			return fmt.Errorf("%w: %s.file=%q: %w", ErrScenario, f, rs.File, err)
		}
		rs.log = log
		for r, k := range log.keys {
			sc.Rules[r].Keys = max(sc.Rules[r].Keys, k)
		}
		// A scenario timed by its logs runs until the last copy a scale
		// above 1 can place after the last record.
		tail := time.Duration(log.span+1) * time.Microsecond
		if rs.maxScale() > 1 {
			tail += max(rs.Jitter, time.Duration(log.maxGap())*time.Microsecond)
		}
		if end := (rs.Start + tail).Truncate(time.Millisecond) + time.Millisecond; fromLogs && end > sc.Duration {
			sc.Duration = end
		}
	}
	return nil
}

// parseReplay parses a log's records. Errors name the line and the value.
func (sc *Scenario) parseReplay(data []byte, format string, rename map[string]string) (*replayLog, error) {
	type rec struct {
		t            int64 // µs since the Unix epoch
		region, rule int
		subject      string
		cost         int64
	}
	var recs []rec
	add := func(line int, ts, region, rule, subject string, cost int64, costGiven bool) error {
		t, err := parseReplayTime(ts)
		if err != nil {
			return fmt.Errorf("line %d: t=%s: %w", line, ts, err)
		}
		ri := sc.regionIndex(region)
		if ri < 0 {
			return fmt.Errorf("line %d: region=%q is not a region of the scenario", line, region)
		}
		if to, ok := rename[rule]; ok {
			rule = to
		}
		ui := sc.ruleIndex(rule)
		if ui < 0 {
			return fmt.Errorf("line %d: rule=%q is not a rule of the scenario (rules: %s; replay rules: can rename)", line, rule, sc.ruleNames())
		}
		if !costGiven {
			cost = 1
		}
		burst := sc.Rules[ui].Burst
		if burst == 0 {
			burst = sc.Rules[ui].Count // setDefaults will
		}
		if cost < 1 || cost > burst {
			return fmt.Errorf("line %d: cost=%d must be in [1, burst=%d of rule %q]", line, cost, burst, rule)
		}
		if subject == "" {
			return fmt.Errorf("line %d: subject is empty", line)
		}
		if len(recs) >= maxReplayRecords {
			return fmt.Errorf("line %d: more than %d records", line, maxReplayRecords)
		}
		recs = append(recs, rec{t: t, region: ri, rule: ui, subject: subject, cost: cost})
		return nil
	}
	switch format {
	case "jsonl":
		sc := bufio.NewScanner(bytes.NewReader(data))
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		line := 0
		for sc.Scan() {
			line++
			b := bytes.TrimSpace(sc.Bytes())
			if len(b) == 0 || b[0] == '#' {
				continue
			}
			var r replayRecord
			if err := json.Unmarshal(b, &r); err != nil {
				return nil, fmt.Errorf("line %d: not a JSON object: %w", line, err)
			}
			ts := strings.Trim(string(r.T), `"`)
			if ts == "" {
				return nil, fmt.Errorf("line %d: t is missing", line)
			}
			var cost int64
			if r.Cost != nil {
				cost = *r.Cost
			}
			if err := add(line, ts, r.Region, r.Rule, r.Subject, cost, r.Cost != nil); err != nil {
				return nil, err
			}
		}
		if err := sc.Err(); err != nil {
			return nil, fmt.Errorf("line %d: %w", line+1, err)
		}
	case "csv":
		cr := csv.NewReader(bytes.NewReader(data))
		cr.Comment = '#'
		cr.FieldsPerRecord = -1
		header, err := cr.Read()
		if err != nil {
			return nil, fmt.Errorf("line 1: header: %w", err)
		}
		col := map[string]int{}
		for i, h := range header {
			col[strings.ToLower(strings.TrimSpace(h))] = i
		}
		for _, need := range []string{"time", "region", "rule", "subject"} {
			if _, ok := col[need]; !ok {
				return nil, fmt.Errorf("line 1: header %q has no %q column (want time, region, rule, subject and optionally cost)", strings.Join(header, ","), need)
			}
		}
		ci, hasCost := col["cost"]
		for {
			row, err := cr.Read()
			if errors.Is(err, io.EOF) {
				break
			}
			line, _ := cr.FieldPos(0)
			if err != nil {
				return nil, fmt.Errorf("line %d: %w", line, err)
			}
			get := func(name string) string {
				if i := col[name]; i < len(row) {
					return strings.TrimSpace(row[i])
				}
				return ""
			}
			var cost int64
			costGiven := hasCost && ci < len(row) && strings.TrimSpace(row[ci]) != ""
			if costGiven {
				if cost, err = strconv.ParseInt(strings.TrimSpace(row[ci]), 10, 64); err != nil {
					return nil, fmt.Errorf("line %d: cost=%q is not a whole number", line, row[ci])
				}
			}
			if err := add(line, get("time"), get("region"), get("rule"), get("subject"), cost, costGiven); err != nil {
				return nil, err
			}
		}
	}
	if len(recs) == 0 {
		return nil, errors.New("no records")
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].t < recs[j].t })
	log := &replayLog{keys: make([]int, len(sc.Rules)), gap: make([]float64, len(sc.Regions)*len(sc.Rules))}
	subjects := make([]map[string]int32, len(sc.Rules))
	counts := make([]int, len(sc.Regions)*len(sc.Rules))
	t0 := recs[0].t
	for _, r := range recs {
		m := subjects[r.rule]
		if m == nil {
			m = map[string]int32{}
			subjects[r.rule] = m
		}
		k, ok := m[r.subject]
		if !ok {
			k = int32(len(m)) // #nosec G115 -- a subject a record; 2^31 records would not fit in memory
			m[r.subject] = k
		}
		log.at = append(log.at, r.t-t0)
		log.region = append(log.region, uint16(r.region)) // #nosec G115 -- validate caps regions at 255
		log.rule = append(log.rule, uint16(r.rule))       // #nosec G115 -- validate caps rules at 65535
		log.key = append(log.key, k)
		log.cost = append(log.cost, r.cost)
		counts[r.region*len(sc.Rules)+r.rule]++
	}
	log.span = recs[len(recs)-1].t - t0
	for r, m := range subjects {
		log.keys[r] = len(m)
	}
	for i, n := range counts {
		if n > 0 {
			log.gap[i] = float64(max(log.span, 1)) / float64(n)
		}
	}
	return log, nil
}

// parseReplayTime reads RFC 3339 or Unix seconds into µs since the epoch.
func parseReplayTime(s string) (int64, error) {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t.UnixMicro(), nil
	}
	v, err := strconv.ParseFloat(s, 64)
	if err != nil || math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || v > 1e11 {
		return 0, errors.New("want RFC 3339 or Unix seconds")
	}
	return int64(math.Round(v * 1e6)), nil
}

func (sc *Scenario) ruleNames() string {
	var out []string
	for _, r := range sc.Rules {
		out = append(out, r.Name)
	}
	return strings.Join(out, ", ")
}

// replayStream is one (region, rule) stream of a replayed log, expanded by
// the scale and moves for one run.
type replayStream struct {
	at   []Micros
	key  []int32
	cost []int64
	pos  int
}

// replaySources expands every replayed log into one source per region and
// rule, drawing the scale's fractions, the moves and the copies' jitter
// from rng.
func replaySources(sc *Scenario, rng *rand.Rand, ruleBase []int, end Micros) []*source {
	var out []*source
	nr, nu := len(sc.Regions), len(sc.Rules)
	for _, rs := range sc.Replay {
		log := rs.log
		if log == nil {
			continue
		}
		streams := make([]*replayStream, nr*nu)
		regionScale := make([]float64, nr)
		for i, r := range sc.Regions {
			regionScale[i] = rs.Scale
			if v, ok := rs.RegionScale[r.Name]; ok {
				regionScale[i] *= v
			}
		}
		start := us(rs.Start)
		for i := range log.at {
			g := int(log.region[i])
			for _, m := range rs.Move {
				if g == sc.regionIndex(m.From) && rng.Float64() < m.Share {
					g = sc.regionIndex(m.To)
					break
				}
			}
			f := regionScale[g]
			n := int(f)
			if rng.Float64() < f-float64(n) {
				n++
			}
			u := int(log.rule[i])
			jitter := float64(us(rs.Jitter))
			if jitter == 0 {
				jitter = log.gap[int(log.region[i])*nu+u]
			}
			si := g*nu + u
			st := streams[si]
			if st == nil {
				st = &replayStream{}
				streams[si] = st
			}
			keys := sc.Rules[u].Keys
			for c := 0; c < n; c++ {
				t := start + Micros(log.at[i])
				if c > 0 {
					t += Micros(rng.Float64() * jitter)
				}
				if t >= end {
					continue
				}
				st.at = append(st.at, t)
				st.key = append(st.key, log.key[i]%int32(keys)) // #nosec G115 -- validate caps keys at 10^7
				st.cost = append(st.cost, min(log.cost[i], sc.Rules[u].Burst))
			}
		}
		for si, st := range streams {
			if st == nil || len(st.at) == 0 {
				continue
			}
			sort.Stable(st)
			g, u := si/nu, si%nu
			out = append(out, &source{region: g, rule: u, base: ruleBase[u], keys: sc.Rules[u].Keys,
				fixed: -1, start: st.at[0], stop: end, replay: st})
		}
	}
	return out
}

func (s *replayStream) Len() int           { return len(s.at) }
func (s *replayStream) Less(i, j int) bool { return s.at[i] < s.at[j] }
func (s *replayStream) Swap(i, j int) {
	s.at[i], s.at[j] = s.at[j], s.at[i]
	s.key[i], s.key[j] = s.key[j], s.key[i]
	s.cost[i], s.cost[j] = s.cost[j], s.cost[i]
}

// next returns the time of the stream's next record, or −1 at its end.
func (s *replayStream) next() Micros {
	if s.pos >= len(s.at) {
		return -1
	}
	return s.at[s.pos]
}

// draw returns the next record's key and cost and moves past it.
func (s *replayStream) draw() (key int, cost int64) {
	key, cost = int(s.key[s.pos]), s.cost[s.pos]
	s.pos++
	return key, cost
}

// maxScale is the largest factor any region's records are scaled by.
func (rs *ReplaySpec) maxScale() float64 {
	m := rs.Scale
	for _, v := range rs.RegionScale {
		m = max(m, rs.Scale*v)
	}
	return m
}

// maxGap is the largest mean gap between records of one region and rule.
func (l *replayLog) maxGap() float64 {
	var m float64
	for _, g := range l.gap {
		m = max(m, g)
	}
	return math.Ceil(m)
}
