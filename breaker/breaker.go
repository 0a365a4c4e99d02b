// Package breaker is the circuit breaker on a regional store, shared by
// the agent's decision core (package region) and the gateway's Redis path
// (package limiter): one implementation of when a store counts as down,
// how long a call may wait for it, and how its return is noticed.
//
// A Breaker does three things, with time as an argument of every method:
//
//   - It sets the deadline of every call from the latency of the calls the
//     store answered (SRTT + 4·RTTVAR, as TCP's retransmission timer does,
//     RFC 6298, and at least twice the slowest answer within Window),
//     between Timeout and MaxTimeout; a call that gets no answer
//     doubles the next calls' deadline until one is answered. A slow but
//     healthy store therefore gets the time it needs, and a store slower
//     than MaxTimeout counts as down.
//   - It opens on Failures failures in a row (no answer between them), or
//     on an error rate: Failures failures within Window that are at least
//     Ratio of the calls that ended in it (a store failing most calls
//     while answering some). A timeout of a call whose deadline the
//     breaker had already raised past (another call's timeout, or a slow
//     answer, came first) is not counted: it says the deadline was too
//     short, not that the store is gone; nor is the timeout of a call
//     while which the store answered another (a slow store's straggler). So the failures in a row that
//     open it on a store that answers nothing come at ever longer
//     deadlines, up to MaxTimeout: a slow store gets its answers in
//     before that.
//   - Open, it lets the caller decide at once without the store (the rule's
//     failure policy); after Backoff one probe goes through (a real call, or
//     the driver's ping, whichever comes first), and its answer closes the
//     breaker; a failed probe opens it again for twice the back-off, up to
//     MaxBackoff. Probes do not depend on traffic: a driver that pings the
//     store when Allow lets it notices a store's return within MaxBackoff
//     plus its tick. A driver that hears from the store another way (the
//     agent's shared state) tells Elsewhere, and the probe goes at once
//     when that way saw the store come back.
//
// The package has no third-party import, so region's deterministic core
// and the simulator run it as it is.
package breaker

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// State is a circuit breaker's state.
type State uint8

// Breaker states.
const (
	// Closed: calls go to the store.
	Closed State = iota
	// Open: calls are decided by the failure policy at once, without
	// waiting on the store.
	Open
	// HalfOpen: the back-off has passed; one probe goes to the store, the
	// other calls are decided by the policy until it answers.
	HalfOpen
)

// String returns the state's name.
func (s State) String() string {
	switch s {
	case Closed:
		return "closed"
	case Open:
		return "open"
	}
	return "half-open"
}

// Config configures a Breaker. Build it with DefaultConfig and change what
// you need; New calls Validate.
type Config struct {
	// Failures failures in a row open the breaker, and so do Failures
	// failures within Window that are at least Ratio of the calls that
	// ended within it.
	Failures int
	Ratio    float64
	Window   time.Duration
	// Backoff is how long the breaker stays open before a probe; each
	// failed probe doubles it, up to MaxBackoff.
	Backoff    time.Duration
	MaxBackoff time.Duration
	// Timeout is the shortest deadline a call gets and MaxTimeout the
	// longest; between them the deadline follows the latency of the calls
	// answered.
	Timeout    time.Duration
	MaxTimeout time.Duration
}

// DefaultConfig returns the defaults for a regional Redis.
func DefaultConfig() Config {
	return Config{
		Failures:   5,                      // a handful of failures, not one slow call
		Ratio:      0.5,                    // most calls failing: a loaded host's stragglers are not an outage
		Window:     time.Second,            // recent enough to open within a second of a cut
		Backoff:    250 * time.Millisecond, // the first probe a quarter of a second after opening
		MaxBackoff: 500 * time.Millisecond, // a store's return is noticed within half a second (plus a tick)
		Timeout:    100 * time.Millisecond, // a regional round trip is ~1 ms; 100× that is no longer healthy
		MaxTimeout: 500 * time.Millisecond, // a store slower than this is treated as down
	}
}

// ErrInvalidConfig: a Config field is out of range.
var ErrInvalidConfig = errors.New("breaker: invalid config")

// Validate reports the first problem with c, naming the field and value.
func (c Config) Validate() error {
	switch {
	case c.Failures < 1:
		return fmt.Errorf("%w: failures=%d must be ≥ 1", ErrInvalidConfig, c.Failures)
	case math.IsNaN(c.Ratio) || c.Ratio < 0 || c.Ratio > 1:
		return fmt.Errorf("%w: ratio=%v must be in [0, 1]", ErrInvalidConfig, c.Ratio)
	case c.Window <= 0:
		return fmt.Errorf("%w: window=%s must be > 0", ErrInvalidConfig, c.Window)
	case c.Backoff <= 0:
		return fmt.Errorf("%w: backoff=%s must be > 0", ErrInvalidConfig, c.Backoff)
	case c.MaxBackoff < c.Backoff:
		return fmt.Errorf("%w: max_backoff=%s must be ≥ backoff=%s", ErrInvalidConfig, c.MaxBackoff, c.Backoff)
	case c.Timeout <= 0:
		return fmt.Errorf("%w: timeout=%s must be > 0", ErrInvalidConfig, c.Timeout)
	case c.MaxTimeout < c.Timeout:
		return fmt.Errorf("%w: max_timeout=%s must be ≥ timeout=%s", ErrInvalidConfig, c.MaxTimeout, c.Timeout)
	}
	return nil
}

// slots divides the window into this many counters.
const slots = 10

// slot counts the calls that ended within one tenth of the window.
type slot struct {
	n       atomic.Int64 // the slot's number: µs / slot length
	ok, bad atomic.Int64
}

// What the other path to the store saw since the breaker last closed
// (Breaker.Elsewhere).
const (
	elsewhereNone     = iota // nothing yet
	elsewhereFailed          // a call that got no answer
	elsewhereAnswered        // an answer: the back-off ended, or not, once
)

// Breaker is a circuit breaker with deadlines that follow the store's
// latency; see the package documentation for the model. The zero value
// is not usable: use New. Breaker is safe for concurrent use; Allow,
// Deadline and Success on a closed breaker take no lock.
type Breaker struct {
	cfg    Config
	slotUS int64

	// openUntil is 0 when closed, else the µs time the back-off ends.
	openUntil atomic.Int64
	// deadline is the current deadline, ns.
	deadline atomic.Int64
	// lastEnd is the latest instant (µs) a call was reported to have
	// ended with its latency (Observe or TimedOut): a failure reported
	// with the instant its call began opens the breaker from then.
	lastEnd atomic.Int64
	// lastOK is the latest instant (µs) an answer came (Observe).
	lastOK atomic.Int64
	window [slots]slot
	run    atomic.Int64 // failures since the last answer
	opened atomic.Int64 // times the breaker opened
	since  atomic.Int64 // µs the breaker opened, closed to open; 0 while closed

	mu      sync.Mutex
	current time.Duration // current back-off
	probing bool
	// elsewhere is what the other path to the store (Elsewhere) saw
	// since the breaker last closed.
	elsewhere uint8
	// The deadline's estimator (requires mu): smoothed latency and its
	// variation, ns (srtt 0: no sample yet), and the floor a timeout
	// raised the deadline to until the next answer.
	srtt, rttvar float64
	floor        time.Duration
	// peak is the slowest answer within the last Window (µs peakAt when
	// it came): the deadline stays at least twice it, so an answer that
	// lifts a timeout's floor does not drop the deadline back under the
	// latencies just seen while the smoothed estimate catches up.
	peak   time.Duration
	peakAt int64
}

// New returns a closed breaker.
func New(cfg Config) (*Breaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	b := &Breaker{cfg: cfg, slotUS: max(cfg.Window.Microseconds()/slots, 1), current: cfg.Backoff}
	b.deadline.Store(int64(cfg.Timeout))
	return b, nil
}

// Config returns the breaker's configuration.
func (b *Breaker) Config() Config { return b.cfg }

// Allow reports whether a call may go to the store at now. A true answer
// while half-open makes the caller the probe: it must report Success or
// Failure.
func (b *Breaker) Allow(now time.Time) bool {
	u := b.openUntil.Load()
	if u == 0 {
		return true
	}
	if now.UnixMicro() < u {
		return false
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.Load() == 0 {
		return true
	}
	if b.probing || now.UnixMicro() < b.openUntil.Load() {
		return false
	}
	b.probing = true
	return true
}

// Success records a call the store answered, begun at now: it counts
// toward the error rate and closes an open breaker.
func (b *Breaker) Success(now time.Time) {
	b.count(now.UnixMicro(), false)
	if b.run.Load() != 0 {
		b.run.Store(0)
	}
	if b.openUntil.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.probing, b.current, b.elsewhere = false, b.cfg.Backoff, elsewhereNone
	b.openUntil.Store(0)
	b.since.Store(0)
}

// Elsewhere records the outcome of a call begun at now that another path
// made to the same store (the agent's shared state on the regional Redis):
// answered or not. While the breaker is open, the first answer after a
// failure of that path ends the back-off at now, so that the next Allow
// makes its caller the probe: that path saw the store go and come back,
// before the back-off would tell. It closes nothing: only a probe under
// this breaker's deadline does, and a failed one backs off from its start
// as any other. Only the first answer since the breaker opened counts,
// and only after a failure: a store failing some of its calls answers the
// other path now and then, and a probe at each answer closed the breaker
// on a lucky one over and over (the simulator's redis-slow-partial opened
// it four times as often, and its agents' emergency buckets admitted
// beyond the peers' share). A closed breaker is left as it is.
func (b *Breaker) Elsewhere(now time.Time, answered bool) {
	if b.openUntil.Load() == 0 {
		return
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.Load() == 0 || b.elsewhere == elsewhereAnswered {
		return // closed meanwhile, or this opening's answer already counted
	}
	if !answered {
		b.elsewhere = elsewhereFailed
		return
	}
	// Only an answer after a failure is a return; either way this
	// opening's answer has now been counted.
	failedBefore := b.elsewhere == elsewhereFailed
	b.elsewhere = elsewhereAnswered
	nowUS := max(now.UnixMicro(), 1) // 0 says closed
	if failedBefore && !b.probing && nowUS < b.openUntil.Load() {
		b.openUntil.Store(nowUS)
	}
}

// Cancel records a call that got no verdict on the store (the caller gave
// up, or the request itself was invalid): if it was the probe, another
// call may probe.
func (b *Breaker) Cancel() {
	if b.openUntil.Load() == 0 {
		return
	}
	b.mu.Lock()
	b.probing = false
	b.mu.Unlock()
}

// Failure records a call begun at now that the store did not answer. It
// reports whether this failure opened the breaker.
func (b *Breaker) Failure(now time.Time) bool {
	nowUS := now.UnixMicro()
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.openUntil.Load() != 0 {
		if !b.probing {
			return false // a call that began before the breaker opened
		}
		// The next probe is due the back-off after this one began, not
		// after it failed: a probe that waited out its deadline (up to
		// MaxTimeout on a store that dropped it) already spent that wait.
		// From its end, a probe sent just before the store came back kept
		// the breaker open for the deadline and the back-off, about a
		// second at the defaults, where one back-off is the promise.
		b.probing = false
		b.current = min(2*b.current, b.cfg.MaxBackoff)
		b.openUntil.Store(nowUS + b.current.Microseconds())
		b.opened.Add(1)
		return true
	}
	b.count(nowUS, true)
	inRow := b.run.Add(1) >= int64(b.cfg.Failures)
	bad, ok := b.sum(nowUS)
	if !inRow && (bad < int64(b.cfg.Failures) || float64(bad) < b.cfg.Ratio*float64(bad+ok)) {
		return false
	}
	b.run.Store(0)
	// Opened from when the failure was reported (its call's end), not from
	// when the call began, which may be a deadline ago.
	end := max(nowUS, b.lastEnd.Load())
	for i := range b.window {
		b.window[i].ok.Store(0)
		b.window[i].bad.Store(0)
	}
	b.current = b.cfg.Backoff
	b.openUntil.Store(end + b.current.Microseconds())
	b.since.Store(end)
	b.opened.Add(1)
	return true
}

// count adds a call that ended at µs nowUS to the window. Counts are
// approximate under races (an add racing its slot's reset may be lost),
// which moves the error rate by a call at most.
func (b *Breaker) count(nowUS int64, bad bool) {
	n := nowUS / b.slotUS
	s := &b.window[n%slots]
	for {
		m := s.n.Load()
		if m == n {
			break
		}
		if m > n {
			return // a call begun a window ago: its slot holds later calls now
		}
		if s.n.CompareAndSwap(m, n) {
			s.ok.Store(0)
			s.bad.Store(0)
			break
		}
	}
	if bad {
		s.bad.Add(1)
	} else {
		s.ok.Add(1)
	}
}

// sum returns the failures and successes within the window ending at nowUS.
func (b *Breaker) sum(nowUS int64) (bad, ok int64) {
	n := nowUS / b.slotUS
	for i := range b.window {
		s := &b.window[i]
		if m := s.n.Load(); m > n-slots && m <= n {
			bad += s.bad.Load()
			ok += s.ok.Load()
		}
	}
	return bad, ok
}

// State reports the breaker's state at now.
func (b *Breaker) State(now time.Time) State {
	u := b.openUntil.Load()
	switch {
	case u == 0:
		return Closed
	case now.UnixMicro() < u:
		return Open
	}
	return HalfOpen
}

// Opened is how many times the breaker has opened (a failed probe opens
// it again).
func (b *Breaker) Opened() int64 { return b.opened.Load() }

// OpenSince returns when the breaker went from closed to open, and false
// while it is closed: the start of the outage it declares, which failed
// probes do not move.
func (b *Breaker) OpenSince() (time.Time, bool) {
	us := b.since.Load()
	if us == 0 || b.openUntil.Load() == 0 {
		return time.Time{}, false
	}
	return time.UnixMicro(us), true
}

// Deadline is how long the next call may wait for the store.
func (b *Breaker) Deadline() time.Duration { return time.Duration(b.deadline.Load()) }

// Observe records a call the store answered after latency, at now (when
// the answer came): the deadline follows the smoothed latency and its
// variation, and a floor a timeout raised is lifted.
func (b *Breaker) Observe(now time.Time, latency time.Duration) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastEnd.Store(max(b.lastEnd.Load(), now.UnixMicro()))
	b.lastOK.Store(max(b.lastOK.Load(), now.UnixMicro()))
	r := float64(max(latency, 0))
	if b.srtt == 0 {
		b.srtt, b.rttvar = max(r, 1), r/2
	} else {
		b.rttvar = 0.75*b.rttvar + 0.25*math.Abs(b.srtt-r)
		b.srtt = 0.875*b.srtt + 0.125*r
	}
	b.floor = 0
	if nowUS := now.UnixMicro(); latency >= b.peak || nowUS-b.peakAt > b.cfg.Window.Microseconds() {
		b.peak, b.peakAt = latency, nowUS
	}
	b.setDeadlineLocked()
}

// TimedOut records a call given deadline d that got no answer, at now:
// the next calls get twice d (up to MaxTimeout) until one is answered. It
// reports whether the timeout counts against the store (the caller then
// reports a Failure): not when the deadline was already above d, raised by
// an earlier timeout or a slow answer since the call began, since the
// call only shows what the breaker already knew, that d was too short;
// and not when the store answered another call while this one waited,
// since a store that answers is slow, not gone (at MaxTimeout many calls
// in flight time out together on a slow store, and each would count).
func (b *Breaker) TimedOut(now time.Time, d time.Duration) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastEnd.Store(max(b.lastEnd.Load(), now.UnixMicro()))
	counts := d >= b.Deadline() && b.lastOK.Load() <= now.Add(-d).UnixMicro()
	if f := min(2*d, b.cfg.MaxTimeout); f > b.floor {
		b.floor = f
	}
	b.setDeadlineLocked()
	return counts
}

// setDeadlineLocked recomputes the deadline. Requires that b.mu is held.
func (b *Breaker) setDeadlineLocked() {
	d := max(b.cfg.Timeout, 2*b.peak)
	if b.srtt > 0 {
		d = max(d, time.Duration(b.srtt+4*b.rttvar))
	}
	b.deadline.Store(int64(min(max(d, b.floor), b.cfg.MaxTimeout)))
}
