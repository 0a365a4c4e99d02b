package bucket

import (
	"fmt"
	"math"
	"math/bits"
	"time"
)

// State is a GCRA bucket's stored state: the theoretical arrival time (TAT)
// of the next request, the instant at which the bucket would be full again,
// kept as integer microseconds since the Unix epoch plus a fraction rem/den
// of a microsecond, so the state never accumulates rounding over long runs.
// It also records the limit it was written under (the interval num/den and
// the burst), so a change of limit can carry the bucket's tokens across.
// The zero State is a full bucket. States are comparable with ==.
//
// State is four words on purpose: the compiler keeps a struct of up to four
// words in registers, and a fifth made every decision copy it through memory.
// rem and den share a word, which is why a limit's interval denominator must
// stay below 2^32 (see Limit.Validate).
type State struct {
	tat   int64  // µs since the Unix epoch
	frac  uint64 // rem<<32 | den: rem in [0, den) is the TAT's fraction of a µs, in units of 1/den; 0 if fresh
	num   int64  // interval numerator (µs) the state was written with
	burst int64  // burst the state was written with
}

const denBits = 32

func (s *State) den() int64 { return int64(s.frac & (1<<denBits - 1)) }
func (s *State) rem() int64 { return int64(s.frac >> denBits) }

// Full reports whether the bucket is full at now: never written, or
// refilled since. A full bucket is the same under any limit.
func (s State) Full(now time.Time) bool { return s.full(now.UnixMicro()) }

// WrittenUnder reports whether the state was last written under limit l,
// the limit a later decision under another limit carries it from (see
// Rebase). The simulator checks with it that a region's bucket was moved to
// a new allocation before the agents could decide with it.
func (s State) WrittenUnder(l Limit) bool {
	return s.frac != 0 && s.num == l.num && s.den() == l.den && s.burst == int64(l.burst)
}

// full reports whether the bucket is full at now µs.
func (s *State) full(now int64) bool {
	return s.frac == 0 || s.tat < now || (s.tat == now && s.rem() == 0)
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
	if s.full(now) {
		return g // fresh or full
	}
	if s.num != l.num || s.frac&(1<<denBits-1) != uint64(l.den) || s.burst != int64(l.burst) { // #nosec G115 -- l.den is in [1, 2^32): load runs only under a validated limit
		g.moved = true
		if s.num <= 0 || s.burst <= 0 {
			g.used = tau // not a state this package wrote: empty, never full
			return g
		}
		g.used = carry(s.position(now), s.num, s.burst, l)
		return g
	}
	// (tat−now)×den can overflow for a TAT far ahead (a clock stepped
	// back); the full product decides the cap either way.
	hi, lo := bits.Mul64(uint64(s.tat-now), uint64(l.den)) // #nosec G115 -- the state is not full, so tat >= now; l.den >= 1
	if hi != 0 || lo > uint64(tau) {                       // #nosec G115 -- tau > 0 under a validated limit
		g.used, g.moved = tau, true
		return g
	}
	g.used = int64(lo) + s.rem() // #nosec G115 -- lo <= tau, an int64
	if g.used > tau {
		g.used, g.moved = tau, true
	}
	return g
}

// position is how much of its own limit's tolerance (burst×num) a stored
// state has spent at now, capped at all of it; the state is not full.
func (s *State) position(now int64) int64 {
	tau := s.burst * s.num
	den := s.den()
	if s.tat-now > tau/den+1 {
		return tau
	}
	return min((s.tat-now)*den+s.rem(), tau)
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

// clamped is the whole tokens carry takes away from a bucket that spent
// used of tolerance burst*num: what it holds beyond l's burst, rounded
// down. The script computes it the same way, in the same order.
func clamped(used, num, burst int64, l *Limit) Tokens {
	tokens := float64(burst*num-used) / float64(num)
	held := math.Floor(tokens * float64(l.num))
	if held <= float64(l.tau) {
		return 0
	}
	return Tokens(math.Floor((held - float64(l.tau)) / float64(l.num)))
}

// state stores the position back as an absolute TAT. A full bucket is the
// zero State, the same as a bucket never seen, so stores may delete it.
func (g *gcra) state() State {
	var s State
	g.store(&s)
	return s
}

// store writes the position through s field by field: building a State and
// copying it costs the decision path a store-forwarding stall.
func (g *gcra) store(s *State) {
	if g.used == 0 {
		*s = State{}
		return
	}
	q, r := g.used, int64(0)
	if den := g.l.den; den != 1 {
		q = g.used / den
		r = g.used - q*den
	}
	s.tat, s.frac = g.now+q, uint64(r)<<denBits|uint64(g.l.den) // #nosec G115 -- r is in [0, den) and den in [1, 2^32)
	s.num, s.burst = g.l.num, int64(g.l.burst)
}

func (g *gcra) tau() int64 { return g.l.tau }

// keep updates *s after a request that spent nothing: it stays as it is
// unless load had to re-express it.
func (g *gcra) keep(s *State) {
	if g.moved {
		g.store(s)
	}
}

// available is the whole tokens that could be spent now.
func (g *gcra) available() Tokens {
	if g.l.num == 1 {
		return Tokens(g.tau() - g.used)
	}
	return Tokens((g.tau() - g.used) / g.l.num)
}

func (g *gcra) decision(allowed bool, cost Tokens) Decision {
	var d Decision
	g.fill(&d, allowed, cost)
	return d
}

// fill writes the decision through d field by field, for the same reason
// as store.
func (g *gcra) fill(d *Decision, allowed bool, cost Tokens) {
	d.Allowed = allowed
	d.Remaining = g.available()
	d.ResetAfter = scaledDuration(g.used, g.l.den)
	d.RetryAfter = 0
	if !allowed {
		d.RetryAfter = scaledDuration(g.used+int64(cost)*g.l.num-g.tau(), g.l.den)
	}
	d.Limit = *g.l
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
func Decide(s State, now time.Time, l Limit, cost Tokens) (d Decision, ns State, err error) {
	ns = s
	if err := Check(l, cost); err != nil {
		return Decision{Limit: l}, s, err
	}
	decideIn(&ns, now.UnixMicro(), &l, cost, &d)
	return d, ns, nil
}

// decideIn is Decide on a checked limit and cost at now µs. It writes the
// new state through s and the decision through d, which spares the decision
// path copies of both.
func decideIn(s *State, now int64, l *Limit, cost Tokens, d *Decision) {
	g := load(s, now, l)
	inc := int64(cost) * l.num
	if g.used+inc > g.tau() {
		g.keep(s)
		g.fill(d, false, cost)
		return
	}
	g.used += inc
	g.store(s)
	g.fill(d, true, cost)
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

// Empty is the state of a bucket of limit l holding nothing at now: it
// refills from then at l's rate. A limit that fails Check gives the zero
// state.
func Empty(now time.Time, l Limit) State {
	if Check(l, 1) != nil {
		return State{}
	}
	_, _, s := takeUpTo(State{}, now.UnixMicro(), &l, l.Burst())
	return s
}

func takeUpTo(s State, now int64, l *Limit, n Tokens) (Tokens, Decision, State) {
	g := load(&s, now, l)
	got := min(n, g.available())
	if got <= 0 {
		g.keep(&s)
		return 0, g.decision(false, 1), s
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
// use in another region. From a limit that admits nothing (the zero Limit,
// or a burst of 0) the bucket is left empty at now: whatever its state
// refilled to since it last admitted was another region's to use.
//
// lost is the whole tokens the move took away: what the bucket held under
// from beyond to's burst, rounded down (0 from a limit that admits
// nothing). A region reports them so the coordinator can put them back in
// the budget's stored reserve (lease.Demand.Returned).
func Rebase(s State, now time.Time, from, to Limit) (_ State, lost Tokens, _ error) {
	if err := checkRebase(from, to); err != nil {
		return s, 0, err
	}
	ns, lost := rebase(s, now.UnixMicro(), &from, &to)
	return ns, lost, nil
}

// checkRebase reports why a bucket cannot be moved from from to to: to
// must admit a request, from must too unless it admits nothing.
func checkRebase(from, to Limit) error {
	if !from.AdmitsNothing() {
		if err := Check(from, 1); err != nil {
			return err
		}
	}
	return Check(to, 1)
}

func rebase(s State, now int64, from, to *Limit) (State, Tokens) {
	if from.AdmitsNothing() {
		return (&gcra{now: now, used: to.tau, l: to}).state(), 0
	}
	g := load(&s, now, from)
	used := carry(g.used, from.num, int64(from.burst), to)
	lost := clamped(g.used, from.num, int64(from.burst), to)
	g = gcra{now: now, used: used, l: to}
	return g.state(), lost
}

// errCost is the error for a batch size or return count that is not > 0.
func errCost(n Tokens) error {
	return fmt.Errorf("%w: n=%d must be > 0", ErrInvalidCost, n)
}
