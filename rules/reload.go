package rules

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/allot-dev/allot/clock"
)

// Reloader keeps the current Set and replaces it only with a valid one: a
// rejected update leaves the last good rules in force. It is a Source and is
// safe for concurrent use. Updates can come from a file (FileWatcher), from
// etcd, or from anything else that has the bytes.
type Reloader struct {
	cur    atomic.Pointer[Set]
	mu     sync.Mutex // serializes Apply
	logger *slog.Logger
	notify func(Update)
	fails  failureLog
}

// DefaultRepeatEvery is how often a rejected update that keeps failing the
// same way is logged again: a broken file polled every second must not
// write an ERROR every second.
const DefaultRepeatEvery = time.Minute

// failureLog logs a rejected update at once when its error is new, and the
// same error again at most once per every, with the number of repeats folded
// into the record. It is safe for concurrent use.
type failureLog struct {
	mu     sync.Mutex
	clock  clock.Clock
	every  time.Duration
	last   string // the error last logged, "" after a success
	at     time.Time
	folded int
}

// log records one failure; it logs when err differs from the last one or
// every has passed since that was logged.
func (f *failureLog) log(l *slog.Logger, msg string, err error, attrs ...any) {
	f.mu.Lock()
	clk, every := f.clock, f.every
	if clk == nil {
		clk = clock.Real{}
	}
	if every <= 0 {
		every = DefaultRepeatEvery
	}
	now, text := clk.Now(), err.Error()
	if text == f.last && now.Sub(f.at) < every && now.Sub(f.at) >= 0 {
		f.folded++
		f.mu.Unlock()
		return
	}
	if text == f.last {
		attrs = append(attrs, "repeated", f.folded+1, "since", f.at)
	}
	f.last, f.at, f.folded = text, now, 0
	f.mu.Unlock()
	l.Error(msg, append(attrs, "err", err)...)
}

// reset forgets the last failure, so the next one is logged at once.
func (f *failureLog) reset() {
	f.mu.Lock()
	f.last, f.folded = "", 0
	f.mu.Unlock()
}

// Update reports one attempt to change the rules.
type Update struct {
	// Old is the set in force before, New the set in force after; they are
	// the same on a rejected or unchanged update.
	Old, New *Set
	// Changed is true when New replaced Old.
	Changed bool
	// Err is the reason the update was rejected.
	Err error
}

// NewReloader returns a Reloader holding initial, which must not be nil. The
// logger (nil for slog.Default) records every change and rejection with the
// rules' version; notify, when non-nil, is called after every Apply.
func NewReloader(initial *Set, logger *slog.Logger, notify func(Update)) *Reloader {
	if initial == nil {
		panic("rules: NewReloader with a nil Set")
	}
	if logger == nil {
		logger = slog.Default()
	}
	h := &Reloader{logger: logger, notify: notify}
	h.cur.Store(initial)
	return h
}

// Current returns the rules in force.
func (h *Reloader) Current() *Set { return h.cur.Load() }

// Apply parses data (named name in errors) and, when it is valid and differs
// from the current rules, puts it in force. A rejected update keeps the
// current rules and returns the *ValidationError.
func (h *Reloader) Apply(data []byte, name string) Update {
	h.mu.Lock()
	defer h.mu.Unlock()
	old := h.cur.Load()
	u := Update{Old: old, New: old}
	if digestOf(data) == old.Digest() {
		return h.done(u)
	}
	s, err := Parse(data, name)
	if err != nil {
		u.Err = err
		h.fails.log(h.logger, "rules rejected; keeping the last good rules", err,
			"source", name, "version", old.Version())
		return h.done(u)
	}
	h.cur.Store(s)
	u.New, u.Changed = s, true
	h.logger.Info("rules loaded", "source", name, "version", s.Version(), "previous", old.Version(),
		"rules", len(s.rules), "plans", len(s.planOrder))
	return h.done(u)
}

func (h *Reloader) done(u Update) Update {
	if u.Err == nil {
		h.fails.reset()
	}
	if h.notify != nil {
		h.notify(u)
	}
	return u
}

// FileWatcher reloads a rules file into a Reloader when the file changes (it
// polls the file's contents) and on SIGHUP.
type FileWatcher struct {
	Reloader *Reloader
	path     string
	cfg      WatchConfig
}

// WatchConfig configures a FileWatcher.
type WatchConfig struct {
	// Interval between polls of the file. Polling reads the file and compares
	// its digest, so it sees edits, renames over it (as editors and
	// Kubernetes ConfigMaps do) and changes on any filesystem.
	Interval time.Duration
	// SIGHUP makes Run reload at once on SIGHUP as well.
	SIGHUP bool
	// Logger records reloads; nil means slog.Default().
	Logger *slog.Logger
	// Notify is called after every reload attempt.
	Notify func(Update)
	// RepeatEvery is how often a reload that keeps failing the same way is
	// logged again; a new failure is logged at once. Zero means
	// DefaultRepeatEvery.
	RepeatEvery time.Duration
	// Clock times RepeatEvery; nil means clock.Real{}.
	Clock clock.Clock
}

// DefaultWatchConfig polls every second and reloads on SIGHUP.
func DefaultWatchConfig() WatchConfig {
	return WatchConfig{
		Interval:    time.Second, // short enough for an operator at a terminal, cheap for a small file
		SIGHUP:      true,        // the conventional "reload now"
		RepeatEvery: DefaultRepeatEvery,
	}
}

// Validate reports a setting that cannot work.
func (c WatchConfig) Validate() error {
	if c.Interval <= 0 {
		return fmt.Errorf("rules: watch interval=%s must be > 0", c.Interval)
	}
	if c.RepeatEvery < 0 {
		return fmt.Errorf("rules: watch repeat_every=%s must be ≥ 0", c.RepeatEvery)
	}
	return nil
}

// WatchFile loads the rules file at path, which must be valid, and returns a
// FileWatcher whose Reloader serves it. Call Run to follow changes.
func WatchFile(path string, cfg WatchConfig) (*FileWatcher, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := Load(path)
	if err != nil {
		return nil, err
	}
	h := NewReloader(s, cfg.Logger, cfg.Notify)
	h.fails.clock, h.fails.every = cfg.Clock, cfg.RepeatEvery
	return &FileWatcher{Reloader: h, path: path, cfg: cfg}, nil
}

// Current returns the rules in force.
func (w *FileWatcher) Current() *Set { return w.Reloader.Current() }

// Reload reads the file now and applies it. A file that cannot be read is
// rejected like an invalid one: the last good rules stay.
func (w *FileWatcher) Reload() Update {
	data, err := os.ReadFile(w.path)
	if err == nil && len(data) > MaxFileSize {
		err = fmt.Errorf("rules: %s is %d bytes, more than the %d allowed", w.path, len(data), MaxFileSize)
	}
	if err != nil {
		cur := w.Reloader.Current()
		w.Reloader.fails.log(w.Reloader.logger, "rules reload failed; keeping the last good rules", err,
			"source", w.path, "version", cur.Version())
		return w.Reloader.done(Update{Old: cur, New: cur, Err: fmt.Errorf("rules: reload %s: %w", w.path, err)})
	}
	return w.Reloader.Apply(data, w.path)
}

// Run polls the file every Interval, and reloads on SIGHUP when configured,
// until ctx is done. It returns ctx's error.
func (w *FileWatcher) Run(ctx context.Context) error {
	var hup chan os.Signal
	if w.cfg.SIGHUP {
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	}
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
			w.Reload()
		case <-hup:
			w.Reload()
		}
	}
}
