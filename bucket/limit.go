package bucket

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"time"
)

// Tokens counts units of a budget. A request's cost is a whole number of
// tokens; "/report costs 5" debits 5.
type Tokens int64

// maxScaled bounds burst×interval in the bucket's scaled integer units so that
// every intermediate value stays below 2^53: exact in Go's int64 and in the
// IEEE doubles that Redis's Lua uses for numbers.
const maxScaled = 1 << 52

// Limit is a sustained rate of Count tokens per Period plus a burst: the most
// tokens that may be spent at once from a full bucket. The zero Limit is
// invalid; build one with Per, PerSecond, PerMinute or PerHour.
//
// Internally the emission interval Period/Count is kept as an exact reduced
// fraction num/den of microseconds, so "10 per minute" is exactly one token
// every 6 s and "3 per second" does not drift by rounding 333333.3 µs.
// Limits are comparable with ==.
type Limit struct {
	count  Tokens
	period time.Duration
	burst  Tokens
	num    int64 // emission interval numerator, µs
	den    int64 // emission interval denominator
	// tau, the burst tolerance burst×num in units of 1/den µs, is derived
	// by finish; it is 0 exactly when Validate fails, so the decision path
	// validates with one comparison.
	tau int64
}

// finish derives tau from count, period and burst.
func (l Limit) finish() Limit {
	l.tau = 0
	if l.den > 0 && l.burst > 0 && int64(l.burst) <= maxScaled/l.num && l.validate() == nil {
		l.tau = int64(l.burst) * l.num
	}
	return l
}

// Per returns a limit of count tokens per period with a burst of count.
// Invalid values give a Limit that Validate rejects, naming the value.
func Per(count Tokens, period time.Duration) Limit {
	l := Limit{count: count, period: period, burst: count}
	us := period.Microseconds()
	if count > 0 && us > 0 && period%time.Microsecond == 0 {
		g := gcd(us, int64(count))
		l.num, l.den = us/g, int64(count)/g
	}
	return l.finish()
}

// PerSecond returns a limit of n tokens a second with a burst of n.
func PerSecond(n Tokens) Limit { return Per(n, time.Second) }

// PerMinute returns a limit of n tokens a minute with a burst of n:
// PerMinute(10) admits 10 at once, then one every 6 s.
func PerMinute(n Tokens) Limit { return Per(n, time.Minute) }

// PerHour returns a limit of n tokens an hour with a burst of n.
func PerHour(n Tokens) Limit { return Per(n, time.Hour) }

// WithBurst returns l with its burst set to b.
func (l Limit) WithBurst(b Tokens) Limit { l.burst = b; return l.finish() }

// Same reports whether l and o are one limit: the same count, period and
// burst, which determine the rest. It reads both in place, since a Limit
// is six words and == or an accessor called on one behind a pointer
// copies all of them first.
func (l *Limit) Same(o *Limit) bool {
	return l.count == o.count && l.period == o.period && l.burst == o.burst
}

// Fits reports whether Check(l, cost) is nil, reading l in place: l is
// valid and cost is positive and within its burst.
func (l *Limit) Fits(cost Tokens) bool { return l.tau > 0 && cost > 0 && cost <= l.burst }

// Count is the number of tokens the limit refills per Period.
func (l Limit) Count() Tokens { return l.count }

// Period is the window Count refers to.
func (l Limit) Period() time.Duration { return l.period }

// Burst is the bucket's capacity.
func (l Limit) Burst() Tokens { return l.burst }

// Rate is the sustained rate in tokens per second.
func (l Limit) Rate() float64 {
	if l.period <= 0 {
		return 0
	}
	return float64(l.count) / l.period.Seconds()
}

// Interval is the emission interval, the time one token takes to refill,
// rounded up to the microsecond.
func (l Limit) Interval() time.Duration {
	if l.den == 0 {
		return 0
	}
	return time.Duration(ceilDiv(l.num, l.den)) * time.Microsecond
}

// IntervalFraction returns the emission interval as the exact reduced
// fraction num/den of microseconds the bucket arithmetic uses, for a store
// that runs the same arithmetic elsewhere (the Redis script).
func (l Limit) IntervalFraction() (num, den int64) { return l.num, l.den }

// IsZero reports whether l is the zero Limit.
func (l Limit) IsZero() bool { return l == Limit{} }

// AdmitsNothing reports whether no request fits l: the zero Limit, or a
// burst of 0 (a region's allocation below its budget's unit).
func (l Limit) AdmitsNothing() bool { return l.burst == 0 }

// String renders the limit as "10 per 1m0s, burst 10".
func (l Limit) String() string {
	return strconv.FormatInt(int64(l.count), 10) + " per " + l.period.String() +
		", burst " + strconv.FormatInt(int64(l.burst), 10)
}

// Validate reports why l cannot be enforced, naming the offending value.
func (l Limit) Validate() error {
	if l.tau > 0 {
		return nil
	}
	if err := l.validate(); err != nil {
		return err
	}
	return fmt.Errorf("%w: %s was not built with Per", ErrInvalidLimit, l)
}

func (l Limit) validate() error {
	switch {
	case l.count <= 0:
		return fmt.Errorf("%w: rate count=%d must be > 0", ErrInvalidLimit, l.count)
	case l.period <= 0:
		return fmt.Errorf("%w: period=%s must be > 0", ErrInvalidLimit, l.period)
	case l.period%time.Microsecond != 0:
		return fmt.Errorf("%w: period=%s must be a whole number of microseconds", ErrInvalidLimit, l.period)
	case l.burst <= 0:
		return fmt.Errorf("%w: burst=%d must be > 0", ErrInvalidLimit, l.burst)
	case l.den == 0:
		return fmt.Errorf("%w: %s was not built with Per", ErrInvalidLimit, l)
	case l.den >= 1<<denBits:
		return fmt.Errorf("%w: rate count=%d per period=%s needs an interval of %d/%d µs, whose denominator exceeds 2^32; use a count that shares more factors with the period",
			ErrInvalidLimit, l.count, l.period, l.num, l.den)
	case int64(l.burst) > maxScaled/l.num:
		return fmt.Errorf("%w: burst=%d with interval %d/%d µs exceeds the exact range (burst×interval < 2^52 µs)",
			ErrInvalidLimit, l.burst, l.num, l.den)
	}
	return nil
}

// Check validates a request of cost tokens against l before any store is
// touched: an invalid limit or cost is an error naming the value, and a cost
// above the burst is ErrNeverFits, since no amount of waiting admits it.
func Check(l Limit, cost Tokens) error {
	if l.Fits(cost) {
		return nil
	}
	// The rest is out of line, so that Check inlines and a request that
	// passes copies no limit into a call.
	return checkFailed(l, cost)
}

// checkFailed is Check's answer for a request its first test did not pass.
func checkFailed(l Limit, cost Tokens) error {
	if err := l.Validate(); err != nil {
		return err
	}
	if cost <= 0 {
		return fmt.Errorf("%w: cost=%d must be > 0", ErrInvalidCost, cost)
	}
	if cost > l.burst {
		return fmt.Errorf("%w: cost=%d exceeds burst=%d", ErrNeverFits, cost, l.burst)
	}
	return nil
}

// CostOf converts a cost given as a number (from a rules file, a header or
// hits_addend) to Tokens, rejecting NaN, infinities, fractions and values ≤ 0.
func CostOf(f float64) (Tokens, error) {
	switch {
	case math.IsNaN(f) || math.IsInf(f, 0):
		return 0, fmt.Errorf("%w: cost=%v is not a finite number", ErrInvalidCost, f)
	case f <= 0:
		return 0, fmt.Errorf("%w: cost=%v must be > 0", ErrInvalidCost, f)
	case f != math.Trunc(f):
		return 0, fmt.Errorf("%w: cost=%v must be a whole number of tokens", ErrInvalidCost, f)
	case f > maxScaled:
		return 0, fmt.Errorf("%w: cost=%v is too large", ErrInvalidCost, f)
	}
	return Tokens(f), nil
}

// Errors callers branch on. Every returned error wraps one of these and
// carries the values that caused it.
var (
	// ErrInvalidLimit: the limit cannot be enforced (rate ≤ 0, burst ≤ 0, …).
	ErrInvalidLimit = errors.New("bucket: invalid limit")
	// ErrInvalidCost: the cost is ≤ 0, NaN or not a whole number.
	ErrInvalidCost = errors.New("bucket: invalid cost")
	// ErrNeverFits: the cost exceeds the burst, so it can never be admitted.
	ErrNeverFits = errors.New("bucket: cost can never fit")
	// ErrUnavailable: the store could not decide in time (Redis down, slow,
	// failing over). Callers apply the rule's failure policy.
	ErrUnavailable = errors.New("bucket: store unavailable")
)

func gcd(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

// ceilDiv returns ⌈a/b⌉ for a ≥ 0, b > 0.
func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }
