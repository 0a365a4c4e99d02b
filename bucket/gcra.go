package bucket

import (
	"fmt"
	"math"
	"time"
)

// State is a GCRA bucket's stored state: the theoretical arrival time (TAT)
// of the next request, the instant at which the bucket would be full again.
// TAT is integer microseconds since the Unix epoch plus Rem/Den of a
// microsecond, so the state never accumulates rounding over long runs.
// Num and Den record the emission interval the state was written under, so a
// change of limit can carry over what was spent. The zero State is a full
// bucket.
type State struct {
	TAT int64 // µs since the Unix epoch
	Rem int64 // in [0, Den): fraction of a µs, in units of 1/Den
	Num int64 // interval numerator (µs) the state was written with; 0 if fresh
	Den int64 // interval denominator the state was written with
	// Burst is the burst the state was written with: with Num and Den it
	// lets a changed limit carry the bucket's tokens across.
	Burst int64
}

// Decision is the outcome of a request against a bucket.
type Decision struct {
	Allowed bool
	// Remaining is the whole tokens left after this decision, rounded down.
	Remaining Tokens
	// RetryAfter is how long until a request of the same cost could pass;
	// 0 when allowed.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Limit is the limit the decision was made under.
	Limit Limit
}

// RetryAfterSeconds rounds RetryAfter up to whole seconds, as HTTP's
// Retry-After needs; a denied decision never says 0.
func (d Decision) RetryAfterSeconds() int64 {
	if d.Allowed {
		return 0
	}
	return max(ceilSeconds(d.RetryAfter), 1)
}

// ResetSeconds rounds ResetAfter up to whole seconds.
func (d Decision) ResetSeconds() int64 { return ceilSeconds(d.ResetAfter) }

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// gcra is a bucket's position relative to now, in scaled units of 1/den µs:
// used is how much of the burst tolerance τ = burst×num is spent.
type gcra struct {
	now  int64 // µs
	used int64 // (TAT − now)×den + rem, in [0, burst×num]
	l    *Limit
	// moved is set when load re-expressed the stored state (capped it or
	// carried it over to a new limit): the new form must be stored even when
	// the request is denied, or a capped TAT would lock the caller out for
	// the whole length of a clock jump.
	moved bool
}

// load brings a stored state to now under limit l. It enforces the clock
// rules: time that runs backwards grants nothing (an absolute TAT only moves
// further away), and a TAT beyond now+τ — a clock stepped back — is capped
// at an empty bucket rather than locking the caller out for the length of
// the jump. A bucket that is full is the same under any limit. A bucket in
// debt under another limit carries its available tokens across (see carry).
func load(s *State, now int64, l *Limit) gcra {
	g := gcra{now: now, l: l}
	tau := l.tau
	if s.Den == 0 || s.TAT < now || (s.TAT == now && s.Rem == 0) {
		return g // fresh or full
	}
	if s.Num != l.num || s.Den != l.den || s.Burst != int64(l.burst) {
		g.moved = true
		if s.Num <= 0 || s.Burst <= 0 {
			g.used = tau // not a state this package wrote: empty, never full
			return g
		}
		g.used = carry(s.position(now), s.Num, s.Burst, l)
		return g
	}
	if s.TAT-now > l.tauUS {
		g.used, g.moved = tau, true
		return g
	}
	g.used = (s.TAT-now)*l.den + s.Rem
	if g.used > tau {
		g.used, g.moved = tau, true
	}
	return g
}

// position is how much of its own limit's tolerance (Burst×Num) a stored
// state has spent at now, capped at all of it; the state is not full.
func (s *State) position(now int64) int64 {
	tau := s.Burst * s.Num
	if s.TAT-now > tau/s.Den+1 {
		return tau
	}
	return min((s.TAT-now)*s.Den+s.Rem, tau)
}

// carry re-expresses a bucket that has spent used (of tolerance burst×num,
// in its own units) under the limit l: the tokens it holds carry across,
// rounded down, and at most l's burst. An increase therefore arrives spent
// and a decrease clamps; a change never refills. Keeping the tokens spent
// instead would hand a region its larger burst at once, and the region that
// gave the capacity up may have spent it a moment ago: the simulator showed
// one window admitting that burst twice.
func carry(used, num, burst int64, l *Limit) int64 {
	tokens := float64(burst*num-used) / float64(num)
	held := math.Floor(tokens * float64(l.num))
	if held >= float64(l.tau) {
		return 0
	}
	return l.tau - int64(held)
}

// state stores the position back as an absolute TAT. A full bucket is the
// zero State, the same as a bucket never seen, so stores may delete it.
func (g gcra) state() State {
	switch {
	case g.used == 0:
		return State{}
	case g.l.den == 1:
		return State{TAT: g.now + g.used, Num: g.l.num, Den: 1, Burst: int64(g.l.burst)}
	}
	return State{TAT: g.now + g.used/g.l.den, Rem: g.used % g.l.den, Num: g.l.num, Den: g.l.den, Burst: int64(g.l.burst)}
}

func (g gcra) tau() int64 { return g.l.tau }

// keep returns the state to store after a request that spent nothing: s
// itself unless load had to re-express it.
func (g gcra) keep(s State) State {
	if g.moved {
		return g.state()
	}
	return s
}

// available is the whole tokens that could be spent now.
func (g gcra) available() Tokens { return Tokens((g.tau() - g.used) / g.l.num) }

func (g gcra) decision(allowed bool, cost Tokens) Decision {
	d := Decision{
		Allowed:    allowed,
		Remaining:  g.available(),
		ResetAfter: scaledDuration(g.used, g.l.den),
		Limit:      *g.l,
	}
	if !allowed {
		d.RetryAfter = scaledDuration(g.used+int64(cost)*g.l.num-g.tau(), g.l.den)
	}
	return d
}

// scaledDuration converts scaled units to a duration, rounding up to the µs.
func scaledDuration(v, den int64) time.Duration {
	if v <= 0 {
		return 0
	}
	if den == 1 {
		return time.Duration(v) * time.Microsecond
	}
	return time.Duration(ceilDiv(v, den)) * time.Microsecond
}

// Decide admits cost tokens from the bucket in state s at now under l, or
// denies them and debits nothing. It returns the decision and the state to
// store. The error is non-nil only for an invalid limit or cost, or
// ErrNeverFits; s is then returned unchanged.
func Decide(s State, now time.Time, l Limit, cost Tokens) (Decision, State, error) {
	if err := Check(l, cost); err != nil {
		return Decision{Limit: l}, s, err
	}
	d := decideIn(&s, now.UnixMicro(), &l, cost)
	return d, s, nil
}

// decideIn is Decide on a checked limit and cost at now µs. It writes the
// new state through s, which spares the decision path two copies of it.
func decideIn(s *State, now int64, l *Limit, cost Tokens) Decision {
	g := load(s, now, l)
	inc := int64(cost) * l.num
	if g.used+inc > g.tau() {
		*s = g.keep(*s)
		return g.decision(false, cost)
	}
	g.used += inc
	*s = g.state()
	return g.decision(true, cost)
}

// TakeUpTo takes as many of n tokens as the bucket holds now, possibly none,
// and returns how many it took. Agents use it to fetch a batch for a hot key:
// tokens are debited here, before they are spent locally.
func TakeUpTo(s State, now time.Time, l Limit, n Tokens) (Tokens, Decision, State, error) {
	if err := Check(l, 1); err != nil {
		return 0, Decision{Limit: l}, s, err
	}
	if n <= 0 {
		return 0, Decision{Limit: l}, s, errCost(n)
	}
	got, d, ns := takeUpTo(s, now.UnixMicro(), &l, n)
	return got, d, ns, nil
}

func takeUpTo(s State, now int64, l *Limit, n Tokens) (Tokens, Decision, State) {
	g := load(&s, now, l)
	got := min(n, g.available())
	if got <= 0 {
		return 0, g.decision(false, 1), g.keep(s)
	}
	g.used += int64(got) * l.num
	return got, g.decision(true, got), g.state()
}

// Return gives n unused tokens back to the bucket; the bucket never holds
// more than its burst afterwards.
func Return(s State, now time.Time, l Limit, n Tokens) (Decision, State, error) {
	if err := Check(l, 1); err != nil {
		return Decision{Limit: l}, s, err
	}
	if n <= 0 {
		return Decision{Limit: l}, s, errCost(n)
	}
	d, ns := giveBack(s, now.UnixMicro(), &l, n)
	return d, ns, nil
}

func giveBack(s State, now int64, l *Limit, n Tokens) (Decision, State) {
	g := load(&s, now, l)
	n = min(n, l.burst)
	g.used = max(g.used-int64(n)*l.num, 0)
	return g.decision(true, 0), g.state()
}

// Peek reports what the bucket holds at now without changing it. Its
// Allowed says whether one token is available.
func Peek(s State, now time.Time, l Limit) (Decision, error) {
	if err := Check(l, 1); err != nil {
		return Decision{Limit: l}, err
	}
	return peek(s, now.UnixMicro(), &l), nil
}

func peek(s State, now int64, l *Limit) Decision {
	g := load(&s, now, l)
	return g.decision(g.used+l.num <= g.tau(), 1)
}

// Rebase moves a bucket from limit from to limit to at now, as a region must
// the moment its allocation for a key changes: the tokens the bucket holds
// under from (a bucket never seen or full holds from's whole burst) carry
// across, rounded down and at most to's burst, and the bucket refills at
// to's rate from now on. Without it a bucket would go on refilling at the
// old rate until its next request, while the rate it gave up is already in
// use in another region.
func Rebase(s State, now time.Time, from, to Limit) (State, error) {
	if err := Check(from, 1); err != nil {
		return s, err
	}
	if err := Check(to, 1); err != nil {
		return s, err
	}
	return rebase(s, now.UnixMicro(), &from, &to), nil
}

func rebase(s State, now int64, from, to *Limit) State {
	g := load(&s, now, from)
	used := carry(g.used, from.num, int64(from.burst), to)
	return gcra{now: now, used: used, l: to}.state()
}

// errCost is the error for a batch size or return count that is not > 0.
func errCost(n Tokens) error {
	return fmt.Errorf("%w: n=%d must be > 0", ErrInvalidCost, n)
}
