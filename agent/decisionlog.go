package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// DecisionLogConfig configures a sampled decision log: the traffic an
// agent decides, recorded so the simulator can replay it (sim's replay).
type DecisionLogConfig struct {
	// Path is the file written; it is appended to if it exists.
	Path string
	// Sample is the fraction of decisions recorded, in (0, 1]. Each
	// decision is drawn independently, so a budget's recorded rate is its
	// real rate × Sample; replay with scale 1/Sample for the real volume.
	Sample float64
	// MaxBytes bounds the file: a record that would take it past MaxBytes
	// first moves it to Path+".1" (replacing the one there) and starts a
	// new one, so the log never holds more than 2 × MaxBytes on disk.
	MaxBytes int64
	// Region names the agent's region in every record.
	Region string
	// Clock stamps the records; nil means clock.Real{}.
	Clock clock.Clock
}

// DefaultDecisionLogConfig samples 1% of decisions into files of at most
// 64 MiB.
func DefaultDecisionLogConfig() DecisionLogConfig {
	return DecisionLogConfig{
		Sample:   0.01,     // a busy agent's tens of thousands of decisions a second fit in a few hundred records
		MaxBytes: 64 << 20, // hours of a busy agent's sampled records
	}
}

// Validate reports the first problem with c, naming the field and value.
func (c DecisionLogConfig) Validate() error {
	switch {
	case c.Path == "":
		return errors.New("agent: decision log: path is empty")
	case math.IsNaN(c.Sample) || c.Sample <= 0 || c.Sample > 1:
		return fmt.Errorf("agent: decision log: sample=%v must be in (0, 1]", c.Sample)
	case c.MaxBytes < 4096:
		return fmt.Errorf("agent: decision log: max_bytes=%d must be ≥ 4096", c.MaxBytes)
	case c.Region == "":
		return errors.New("agent: decision log: region is empty")
	}
	return nil
}

// DecisionLog writes sampled decisions as JSONL, one object a line:
//
//	{"t":"2026-12-02T01:02:03.456789Z","region":"eu","rule":"api/pro","subject":"9f86d081884c7d65","cost":1,"allowed":true}
//
// t is the decision's time (RFC 3339, UTC, microseconds), rule the budget
// charged (rules.RuleBudget.Name: the rule, or "rule/plan" for a plan
// rule), subject the first 8 bytes of the SHA-256 of the subject in hex —
// the same subject hashes alike on every agent, and no identity is written
// in clear (a hash of a guessable identity can still be found by trying
// them all: keep the log where the identities are) — and cost the tokens
// asked. DecisionLog is safe for concurrent use; Record never blocks on
// the disk for longer than one buffered write.
type DecisionLog struct {
	cfg DecisionLogConfig
	clk clock.Clock
	// threshold is Sample scaled to a uint64 draw: a decision is recorded
	// when a draw of the runtime's lock-free generator falls below it, so
	// the decisions not sampled take no lock.
	threshold uint64

	mu      sync.Mutex // guards everything below
	f       *os.File
	w       *bufio.Writer
	size    int64
	rotated int64
	written int64
	err     error
	line    []byte
}

// OpenDecisionLog opens (or creates) the log file.
func OpenDecisionLog(cfg DecisionLogConfig) (*DecisionLog, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &DecisionLog{cfg: cfg, clk: cfg.Clock, threshold: uint64(cfg.Sample * math.MaxUint64)}
	if cfg.Sample >= 1 {
		l.threshold = math.MaxUint64
	}
	if l.clk == nil {
		l.clk = clock.Real{}
	}
	if err := l.open(); err != nil {
		return nil, err
	}
	return l, nil
}

func (l *DecisionLog) open() error {
	f, err := os.OpenFile(l.cfg.Path, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return fmt.Errorf("agent: decision log: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close() // the error above is the one to report
		return fmt.Errorf("agent: decision log: %w", err)
	}
	l.f, l.w, l.size = f, bufio.NewWriterSize(f, 32<<10), st.Size()
	return nil
}

// sampled draws whether to record one decision.
func (l *DecisionLog) sampled() bool {
	return l.threshold == math.MaxUint64 || rand.Uint64() < l.threshold
}

// Record samples one decision at now and, if drawn, writes it. A write
// error stops the log (Err reports it); decisions go on.
func (l *DecisionLog) Record(now time.Time, budget, subject string, cost bucket.Tokens, allowed bool) {
	if !l.sampled() {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil || l.f == nil {
		return
	}
	l.write(now, budget, subject, cost, allowed)
}

// write appends one record; it requires that l.mu is held.
func (l *DecisionLog) write(now time.Time, budget, subject string, cost bucket.Tokens, allowed bool) {
	sum := sha256.Sum256([]byte(subject))
	b := l.line[:0]
	b = append(b, `{"t":"`...)
	b = now.UTC().AppendFormat(b, "2006-01-02T15:04:05.000000Z07:00")
	b = append(b, `","region":`...)
	b = strconv.AppendQuote(b, l.cfg.Region)
	b = append(b, `,"rule":`...)
	b = strconv.AppendQuote(b, budget)
	b = append(b, `,"subject":"`...)
	b = hex.AppendEncode(b, sum[:8])
	b = append(b, `","cost":`...)
	b = strconv.AppendInt(b, int64(cost), 10)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, allowed)
	b = append(b, "}\n"...)
	l.line = b
	if l.size+int64(len(b)) > l.cfg.MaxBytes && l.size > 0 {
		if err := l.rotate(); err != nil {
			l.err = err
			return
		}
	}
	if _, err := l.w.Write(b); err != nil {
		l.err = fmt.Errorf("agent: decision log: %w", err)
		return
	}
	l.size += int64(len(b))
	l.written++
}

// rotate moves the full file to Path+".1"; it requires that l.mu is held.
func (l *DecisionLog) rotate() error {
	if err := l.w.Flush(); err != nil {
		return fmt.Errorf("agent: decision log: %w", err)
	}
	if err := l.f.Close(); err != nil {
		return fmt.Errorf("agent: decision log: %w", err)
	}
	if err := os.Rename(l.cfg.Path, l.cfg.Path+".1"); err != nil {
		return fmt.Errorf("agent: decision log: rotate: %w", err)
	}
	l.rotated++
	return l.open()
}

// Flush writes the buffered records to the file.
func (l *DecisionLog) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.err != nil {
		return l.err
	}
	if l.w == nil {
		return nil
	}
	if err := l.w.Flush(); err != nil {
		l.err = fmt.Errorf("agent: decision log: %w", err)
	}
	return l.err
}

// Close flushes and closes the file; later records are dropped.
func (l *DecisionLog) Close() error {
	err := l.Flush()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f != nil {
		if cerr := l.f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("agent: decision log: %w", cerr)
		}
		l.f, l.w = nil, nil
	}
	return err
}

// DecisionLogStats counts what a log wrote.
type DecisionLogStats struct {
	Records   int64
	Rotations int64
	// Err is the write error that stopped the log, if any.
	Err error
}

// Stats reports what the log wrote.
func (l *DecisionLog) Stats() DecisionLogStats {
	l.mu.Lock()
	defer l.mu.Unlock()
	return DecisionLogStats{Records: l.written, Rotations: l.rotated, Err: l.err}
}

// LogDecisions returns st with every Decide sampled into log under the
// name of the budget it charges, which the current rules of src give
// (region.Namer: a plan rule's key is charged to its plan's budget). The
// other methods pass through.
func LogDecisions(st bucket.Store, log *DecisionLog, src rules.Source) bucket.Store {
	return &loggedStore{Store: st, log: log, src: src}
}

type loggedStore struct {
	bucket.Store
	log *DecisionLog
	src rules.Source
	// namer caches the Namer of the rules set it was built from.
	namer atomic.Pointer[setNamer]
}

type setNamer struct {
	set   *rules.Set
	namer *region.Namer
}

// Decide implements bucket.Store.
func (s *loggedStore) Decide(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	d, err := s.Store.Decide(ctx, key, l, cost, attemptID)
	lg := s.log
	if !lg.sampled() {
		return d, err
	}
	budget := s.budgetOf(key, l)
	lg.mu.Lock()
	if lg.f != nil && lg.err == nil {
		// A rule that fails open is admitted by the edge on ErrFailOpen.
		allowed := (err == nil && d.Allowed) || errors.Is(err, region.ErrFailOpen)
		lg.write(lg.clk.Now(), budget, key.Subject, cost, allowed)
	}
	lg.mu.Unlock()
	return d, err
}

// budgetOf names the budget key is charged to under limit l.
func (s *loggedStore) budgetOf(key bucket.Key, l bucket.Limit) string {
	if s.src == nil {
		return key.Rule
	}
	set := s.src.Current()
	sn := s.namer.Load()
	if sn == nil || sn.set != set {
		sn = &setNamer{set: set, namer: region.NewNamer(set)}
		s.namer.Store(sn)
	}
	return sn.namer.Budget(key, l).Rule
}
