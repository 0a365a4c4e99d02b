package rules

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"testing/synctest"
	"time"

	"github.com/allot-dev/allot/clock"
)

// TestRunPollsFile moves the watcher's fake clock past one poll interval and
// checks that the edited file is in force, with no real waiting.
func TestRunPollsFile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "rules.yaml")
		if err := os.WriteFile(path, []byte("version: one\nrules:\n  - name: a\n    limit: \"1/s\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg := WatchConfig{Interval: 5 * time.Second, Logger: quiet}
		w, err := WatchFile(path, cfg)
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- w.Run(ctx) }()
		if err := os.WriteFile(path, []byte("version: two\nrules:\n  - name: a\n    limit: \"2/s\"\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		time.Sleep(4 * time.Second) // fake time: before the first poll
		synctest.Wait()
		if v := w.Current().Version(); v != "one" {
			t.Errorf("before the poll: version %q, want one", v)
		}
		time.Sleep(time.Second)
		synctest.Wait()
		if v := w.Current().Version(); v != "two" {
			t.Errorf("after the poll: version %q, want two", v)
		}
		cancel()
		if err := <-done; err != context.Canceled {
			t.Errorf("Run returned %v", err)
		}
	})
}

// TestRunReloadsOnSIGHUP sends the process a SIGHUP and waits for the
// watcher to report the reload; the poll interval is too long to matter.
func TestRunReloadsOnSIGHUP(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	if err := os.WriteFile(path, []byte("version: one\nrules:\n  - name: a\n    limit: \"1/s\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	reloaded := make(chan Update, 4)
	w, err := WatchFile(path, WatchConfig{Interval: time.Hour, SIGHUP: true, Logger: quiet,
		Notify: func(u Update) { reloaded <- u }})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	started := make(chan struct{})
	go func() {
		close(started)
		_ = w.Run(ctx)
	}()
	<-started
	if err := os.WriteFile(path, []byte("version: two\nrules:\n  - name: a\n    limit: \"2/s\"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// Run may not have called signal.Notify yet; resend until it reloads.
	// The test's own registration keeps an early SIGHUP from ending the
	// process.
	guard := make(chan os.Signal, 16)
	signal.Notify(guard, syscall.SIGHUP)
	defer signal.Stop(guard)
	deadline := time.After(10 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case u := <-reloaded:
			if !u.Changed || u.New.Version() != "two" {
				t.Fatalf("SIGHUP reload: %+v", u)
			}
			return
		case <-tick.C:
			if err := syscall.Kill(os.Getpid(), syscall.SIGHUP); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatal("no reload within 10s of SIGHUP")
		}
	}
}

// TestRejectedReloadsAreLoggedOnce: a file that keeps failing the same way
// is logged once, then again only after RepeatEvery with the repeats
// counted; a new failure, or the same one after a success, is logged at
// once.
func TestRejectedReloadsAreLoggedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rules.yaml")
	good := []byte("version: one\nrules:\n  - name: a\n    limit: \"1/s\"\n")
	if err := os.WriteFile(path, good, 0o600); err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	var logs countingHandler
	w, err := WatchFile(path, WatchConfig{Interval: time.Second, Logger: slog.New(&logs), Clock: clk, RepeatEvery: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	write := func(b string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(b), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	poll := func(n int) {
		for range n {
			clk.Advance(time.Second)
			w.Reload()
		}
	}
	write("version: two\nrules: [\n")
	poll(30)
	if n := logs.errors(); n != 1 {
		t.Fatalf("30 polls of one broken file logged %d errors, want 1", n)
	}
	poll(31) // 61 s after the first record
	if n := logs.errors(); n != 2 {
		t.Fatalf("after a minute: %d errors, want 2", n)
	}
	if r := logs.last(); r["repeated"] != "60" {
		t.Errorf("repeat record %v: want repeated=60", r)
	}
	write("version: two\nrules:\n  - name: a\n    limit: \"zero\"\n") // another failure
	poll(1)
	if n := logs.errors(); n != 3 {
		t.Fatalf("a new failure: %d errors, want 3", n)
	}
	if err := os.Remove(path); err != nil { // an unreadable file is a failure too
		t.Fatal(err)
	}
	poll(5)
	if n := logs.errors(); n != 4 {
		t.Fatalf("a missing file polled 5 times: %d errors, want 4", n)
	}
	write(string(good))
	poll(1)
	write("version: two\nrules: [\n")
	poll(1)
	if n := logs.errors(); n != 5 {
		t.Fatalf("the first failure again after a good reload: %d errors, want 5", n)
	}
}

// countingHandler keeps every record's attributes, for tests of logging.
type countingHandler struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.recs = append(h.recs, r.Clone())
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }

func (h *countingHandler) errors() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	n := 0
	for _, r := range h.recs {
		if r.Level == slog.LevelError {
			n++
		}
	}
	return n
}

func (h *countingHandler) last() map[string]string {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string]string{}
	if len(h.recs) == 0 {
		return out
	}
	h.recs[len(h.recs)-1].Attrs(func(a slog.Attr) bool {
		out[a.Key] = a.Value.String()
		return true
	})
	return out
}
