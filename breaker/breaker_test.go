package breaker

import (
	"errors"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)

func newBreaker(t *testing.T, mod func(*Config)) *Breaker {
	t.Helper()
	c := DefaultConfig()
	if mod != nil {
		mod(&c)
	}
	b, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestConfigValidateNamesField(t *testing.T) {
	for want, mod := range map[string]func(*Config){
		"failures=0":        func(c *Config) { c.Failures = 0 },
		"ratio=1.5":         func(c *Config) { c.Ratio = 1.5 },
		"window=0s":         func(c *Config) { c.Window = 0 },
		"backoff=0s":        func(c *Config) { c.Backoff = 0 },
		"max_backoff=100ms": func(c *Config) { c.MaxBackoff = 100 * time.Millisecond },
		"timeout=-1s":       func(c *Config) { c.Timeout = -time.Second },
		"max_timeout=10ms":  func(c *Config) { c.MaxTimeout = 10 * time.Millisecond },
	} {
		c := DefaultConfig()
		mod(&c)
		_, err := New(c)
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v", want, err)
		}
	}
}

// TestDeadlineFollowsLatency: the deadline stays at Timeout while the
// store answers in a millisecond, grows to cover a store that answers in
// 90–150 ms (so such a store is never timed out once a few answers came
// back), never passes MaxTimeout, and comes back down when the store is
// fast again.
func TestDeadlineFollowsLatency(t *testing.T) {
	b := newBreaker(t, nil)
	now := t0
	for range 100 {
		now = now.Add(10 * time.Millisecond)
		b.Observe(now, time.Millisecond)
	}
	if d := b.Deadline(); d != 100*time.Millisecond {
		t.Fatalf("deadline %s at 1 ms latency, want Timeout (100ms)", d)
	}
	// 90–150 ms, in a fixed pattern.
	lat := []time.Duration{90, 150, 120, 100, 140, 95, 130, 110, 150, 90}
	for i := range 200 {
		now = now.Add(10 * time.Millisecond)
		b.Observe(now, lat[i%len(lat)]*time.Millisecond)
	}
	if d := b.Deadline(); d < 150*time.Millisecond || d > 300*time.Millisecond {
		t.Fatalf("deadline %s at 90–150 ms latency, want above the slowest answer (150ms) and not far above", d)
	}
	for range 50 {
		now = now.Add(10 * time.Millisecond)
		b.Observe(now, 3*time.Second)
	}
	if d := b.Deadline(); d != 500*time.Millisecond {
		t.Fatalf("deadline %s at 3 s latency, want MaxTimeout (500ms)", d)
	}
	for range 200 {
		now = now.Add(10 * time.Millisecond)
		b.Observe(now, time.Millisecond)
	}
	if d := b.Deadline(); d != 100*time.Millisecond {
		t.Fatalf("deadline %s back at 1 ms latency, want Timeout (100ms)", d)
	}
}

// TestTimeoutDoublesTheDeadline: a call that got no answer doubles the
// next calls' deadline, up to MaxTimeout, until an answer comes.
func TestTimeoutDoublesTheDeadline(t *testing.T) {
	b := newBreaker(t, nil)
	now := t0
	for _, want := range []time.Duration{200, 400, 500, 500} {
		d := b.Deadline()
		now = now.Add(d)
		b.TimedOut(now, d)
		if got := b.Deadline(); got != want*time.Millisecond {
			t.Fatalf("deadline %s after a timeout at %s, want %dms", got, d, want)
		}
	}
	b.Observe(now, 2*time.Millisecond)
	if d := b.Deadline(); d != 100*time.Millisecond {
		t.Fatalf("deadline %s after an answer in 2 ms, want back at Timeout", d)
	}
}

// TestSlowStoreDoesNotOpen: a store that turns slow (every call takes 150
// ms, above the 100 ms deadline) with many calls in flight. The calls
// begun under the old deadline all time out, but only the first counts:
// it doubles the deadline, and the others ran with a deadline the breaker
// had already raised past. The calls begun after it are answered. The breaker
// never opens; the same calls against a breaker that counted every timeout
// open it.
func TestSlowStoreDoesNotOpen(t *testing.T) {
	run := func(b *Breaker, countAll bool) {
		type call struct {
			start time.Time
			d     time.Duration
		}
		var inflight []call
		for ms := 0; ms < 2000; ms++ {
			now := t0.Add(time.Duration(ms) * time.Millisecond)
			// End the calls whose time has come: answered at 150 ms, or
			// timed out at their deadline.
			keep := inflight[:0]
			for _, c := range inflight {
				switch {
				case c.d > 150*time.Millisecond && now.Sub(c.start) >= 150*time.Millisecond:
					b.Observe(now, 150*time.Millisecond)
					b.Success(c.start)
				case c.d <= 150*time.Millisecond && now.Sub(c.start) >= c.d:
					if b.TimedOut(now, c.d) || countAll {
						b.Failure(c.start)
					}
				default:
					keep = append(keep, c)
				}
			}
			inflight = keep
			// 2 calls a millisecond.
			for range 2 {
				if b.Allow(now) {
					inflight = append(inflight, call{start: now, d: b.Deadline()})
				}
			}
		}
	}
	b := newBreaker(t, nil)
	run(b, false)
	if n := b.Opened(); n != 0 {
		t.Fatalf("breaker opened %d times on a slow store, want 0", n)
	}
	if d := b.Deadline(); d <= 150*time.Millisecond {
		t.Fatalf("deadline %s, want above the store's 150 ms", d)
	}
	base := newBreaker(t, nil)
	run(base, true)
	if n := base.Opened(); n == 0 {
		t.Fatal("counting every timeout did not open the breaker: the test does not show what the rule prevents")
	}
}

// TestDeadStoreOpens: a store that answers nothing opens the breaker once
// the deadline has grown to MaxTimeout and the failures there are counted:
// within the sum of the doubled deadlines and one more.
func TestDeadStoreOpens(t *testing.T) {
	b := newBreaker(t, nil)
	now := t0
	for range 100 {
		now = now.Add(10 * time.Millisecond)
		b.Observe(now, time.Millisecond)
		b.Success(now)
	}
	cut := now
	type call struct {
		start time.Time
		d     time.Duration
	}
	var inflight []call
	for ms := 0; b.State(now) == Closed; ms++ {
		if ms > 5000 {
			t.Fatal("a dead store did not open the breaker in 5 s")
		}
		now = cut.Add(time.Duration(ms) * time.Millisecond)
		keep := inflight[:0]
		for _, c := range inflight {
			if now.Sub(c.start) >= c.d {
				if b.TimedOut(now, c.d) {
					b.Failure(c.start)
				}
				continue
			}
			keep = append(keep, c)
		}
		inflight = keep
		if b.Allow(now) {
			inflight = append(inflight, call{start: now, d: b.Deadline()})
		}
	}
	t.Logf("opened %s after the store died", now.Sub(cut))
	// 100 + 200 + 400 + 500 ms of doubling, then the failures at 500 ms
	// within a window whose calls were answered before the cut.
	if took := now.Sub(cut); took > 2500*time.Millisecond {
		t.Fatalf("opened %s after the store died, want within 2.5 s", took)
	}
	since, ok := b.OpenSince()
	if !ok || since.Before(cut) {
		t.Fatalf("OpenSince %v %v, want after the cut", since, ok)
	}
}

// TestProbeCycle: open for Backoff, then one probe; a failed probe opens
// it again for twice the back-off, up to MaxBackoff; a good one closes it.
// OpenSince stays at the first opening throughout.
func TestProbeCycle(t *testing.T) {
	b := newBreaker(t, func(c *Config) { c.Failures, c.Ratio = 1, 0 })
	if !b.Failure(t0) {
		t.Fatal("one failure did not open a breaker of Failures 1")
	}
	since, _ := b.OpenSince()
	now := t0
	for _, backoff := range []time.Duration{250, 500, 500} {
		if b.Allow(now.Add(backoff*time.Millisecond - time.Microsecond)) {
			t.Fatalf("allowed before the %dms back-off ended", backoff)
		}
		now = now.Add(backoff * time.Millisecond)
		if b.State(now) != HalfOpen || !b.Allow(now) {
			t.Fatalf("no probe after the %dms back-off: %s", backoff, b.State(now))
		}
		if b.Allow(now) {
			t.Fatal("two probes at once")
		}
		b.Failure(now)
		if s, _ := b.OpenSince(); !s.Equal(since) {
			t.Fatalf("OpenSince moved to %v on a failed probe", s)
		}
	}
	now = now.Add(500 * time.Millisecond)
	if !b.Allow(now) {
		t.Fatal("no probe")
	}
	b.Cancel() // the prober gave up: another may probe
	if !b.Allow(now) {
		t.Fatal("no probe after a cancelled one")
	}
	b.Success(now)
	if b.State(now) != Closed {
		t.Fatalf("state %s after a good probe, want closed", b.State(now))
	}
	if _, ok := b.OpenSince(); ok {
		t.Fatal("OpenSince set while closed")
	}
	if n := b.Opened(); n != 4 {
		t.Fatalf("opened %d times, want 4 (once, and three failed probes)", n)
	}
}

// TestProbeThatTimesOutWaitsNoLonger: a probe that waits out its deadline
// (a store that dropped it) and fails lets the next probe go the back-off
// after it began, at once here, not a back-off after it failed: the
// store's return is then noticed within max(back-off, deadline) of it.
func TestProbeThatTimesOutWaitsNoLonger(t *testing.T) {
	b := newBreaker(t, func(c *Config) { c.Failures, c.Ratio = 1, 0 })
	if !b.Failure(t0) {
		t.Fatal("one failure did not open a breaker of Failures 1")
	}
	probe := t0.Add(250 * time.Millisecond)
	if !b.Allow(probe) {
		t.Fatal("no probe after the back-off")
	}
	d := b.cfg.MaxTimeout // the deadline a dead store raised
	end := probe.Add(d)
	if b.TimedOut(end, d) {
		b.Failure(probe)
	}
	// The back-off is now 500 ms, as long as the probe took.
	if b.State(end) != HalfOpen || !b.Allow(end) {
		t.Fatalf("no probe at %s, 500 ms after the failed one began: %s",
			end.Sub(t0), b.State(end))
	}
	b.Success(end)
	if b.State(end) != Closed {
		t.Fatalf("state %s after a good probe, want closed", b.State(end))
	}
}

// TestElsewhereProbesOnAReturn: the other path's first answer after one
// of its failures, within an opening, lets the probe go before the
// back-off ends; it closes nothing by itself, acts once per opening, not
// on an answer with no failure before it, and a failed probe backs off as
// any other. A closed breaker is left alone.
func TestElsewhereProbesOnAReturn(t *testing.T) {
	b := newBreaker(t, func(c *Config) { c.Failures, c.Ratio = 1, 0 })
	b.Elsewhere(t0, false)
	b.Elsewhere(t0, true)
	if b.State(t0) != Closed || b.Opened() != 0 {
		t.Fatalf("Elsewhere on a closed breaker: %s, opened %d", b.State(t0), b.Opened())
	}
	b.Failure(t0)
	at := t0.Add(50 * time.Millisecond) // within the 250 ms back-off
	b.Elsewhere(at, true)               // no failure before it: says nothing of a return
	if b.Allow(at) {
		t.Fatal("a probe on an answer with no failure of the other path before it")
	}
	b.Elsewhere(at, false)
	b.Elsewhere(at, true) // the first answer was that one: no more this opening
	if b.Allow(at) {
		t.Fatal("a probe on a second answer within one opening")
	}
	end := t0.Add(250 * time.Millisecond)
	if !b.Allow(end) {
		t.Fatal("no probe at the end of the back-off")
	}
	b.Success(end)

	// Opened again: a failure, then an answer, is a return.
	b.Failure(end)
	ret := end.Add(100 * time.Millisecond)
	b.Elsewhere(end, false)
	if b.Allow(ret) {
		t.Fatal("a probe before the back-off, the other path only failing")
	}
	b.Elsewhere(ret, true)
	if b.State(ret) != HalfOpen {
		t.Fatalf("state %s after the return, want half-open (Elsewhere closes nothing)", b.State(ret))
	}
	if !b.Allow(ret) {
		t.Fatal("no probe at once on the other path's return")
	}
	b.Failure(ret)
	// The failed probe doubles the back-off from its start: 500 ms, and
	// the other path's next return within the opening changes nothing.
	b.Elsewhere(ret, false)
	b.Elsewhere(ret.Add(100*time.Millisecond), true)
	if next := ret.Add(499 * time.Millisecond); b.Allow(next) {
		t.Fatalf("a probe %s after a failed one, within its 500 ms back-off", next.Sub(ret))
	}
	if !b.Allow(ret.Add(500 * time.Millisecond)) {
		t.Fatal("no probe at the end of the doubled back-off")
	}
}

// TestRatioOverWindow: failures that never come Failures in a row open
// the breaker once they are at least Ratio of the window's calls, and not
// before; calls older than the window do not count.
func TestRatioOverWindow(t *testing.T) {
	b := newBreaker(t, nil)
	ok, bad := 0, 0
	for range 30 {
		b.Success(t0)
		ok++
	}
	// Four failures, one answer, over and over: never five in a row.
	for i := 0; ; i++ {
		if i > 1000 {
			t.Fatal("never opened")
		}
		if i%5 == 4 {
			b.Success(t0)
			ok++
			continue
		}
		bad++
		opened := b.Failure(t0)
		want := bad >= 5 && float64(bad) >= 0.5*float64(bad+ok)
		if opened != want {
			t.Fatalf("after %d failures and %d answers: opened %v, want %v", bad, ok, opened, want)
		}
		if opened {
			break
		}
	}
	// A window later, the 100 answers before no longer count.
	c := newBreaker(t, nil)
	for range 100 {
		c.Success(t0)
	}
	later := t0.Add(1100 * time.Millisecond)
	for range 4 {
		c.Failure(later)
		c.Success(later.Add(time.Millisecond)) // keep them from being in a row
	}
	if c.State(later) != Closed {
		t.Fatal("opened on 4 failures among 8 calls")
	}
	if !c.Failure(later) {
		t.Fatal("5 failures among 9 calls a window after 100 answers did not open it")
	}
}

// TestFailuresInARow: Failures failures with no answer between them open
// the breaker whatever the window held, so a lone caller waiting out each
// deadline opens it too; an answer between them starts the count again.
func TestFailuresInARow(t *testing.T) {
	b := newBreaker(t, nil)
	for range 1000 {
		b.Success(t0)
	}
	for i := range 4 {
		if b.Failure(t0.Add(time.Duration(i) * 500 * time.Millisecond)) {
			t.Fatalf("opened after %d failures in a row", i+1)
		}
	}
	b.Success(t0.Add(2 * time.Second))
	for i := range 5 {
		opened := b.Failure(t0.Add(2*time.Second + time.Duration(i)*500*time.Millisecond))
		if opened != (i == 4) {
			t.Fatalf("failure %d after an answer: opened %v", i+1, opened)
		}
	}
}

// TestTimeoutWhileAnsweredDoesNotCount: at MaxTimeout every call in
// flight has the same deadline, so the rule about deadlines since raised
// cannot tell a slow store's stragglers from a dead store's silence. A
// timeout counts only when no answer came while the call waited: on a
// store that answers others, it is a straggler.
func TestTimeoutWhileAnsweredDoesNotCount(t *testing.T) {
	b := newBreaker(t, nil)
	now := t0
	for range 4 { // the deadline to its cap
		d := b.Deadline()
		now = now.Add(d)
		b.TimedOut(now, d)
	}
	d := b.Deadline()
	if d != b.Config().MaxTimeout {
		t.Fatalf("deadline %s, want MaxTimeout", d)
	}
	// A call begins; another is answered while it waits; it times out.
	begin := now
	b.Observe(begin.Add(200*time.Millisecond), 450*time.Millisecond)
	if d := b.Deadline(); d != b.Config().MaxTimeout {
		t.Fatalf("deadline %s after a 450 ms answer, want MaxTimeout", d)
	}
	if b.TimedOut(begin.Add(d), d) {
		t.Fatal("a timeout counted though the store answered another call meanwhile")
	}
	// The next call waits and nothing is answered: it counts.
	begin = begin.Add(d)
	if !b.TimedOut(begin.Add(d), d) {
		t.Fatal("a timeout with no answer meanwhile did not count")
	}
}
