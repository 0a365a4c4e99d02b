package rules

import (
	"context"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"testing"
	"testing/synctest"
	"time"
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
