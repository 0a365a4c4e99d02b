package bucket

import "time"

// TokenState is a token bucket's stored state: the tokens it held at Last,
// scaled by the limit's interval numerator so that refill is exact integer
// arithmetic. The zero TokenState with Last == 0 is a full bucket.
//
// The token bucket and GCRA are the same limiter written two ways (tokens
// held versus the time at which the bucket is full again). The stores use
// GCRA because its state is one instant; TokenBucket is here for callers
// and baselines that think in tokens, and the tests check that the two
// agree on every sequence whose clock does not step back.
type TokenState struct {
	Level int64 // tokens × num
	Last  int64 // µs since the Unix epoch; 0 if fresh
}

// TokenBucket admits cost tokens from a token bucket in state s at now, or
// denies and debits nothing. Time that steps back refills nothing: Last
// never moves backwards, so the refill of that interval is not paid twice.
func TokenBucket(s TokenState, now time.Time, l Limit, cost Tokens) (Decision, TokenState, error) {
	if err := Check(l, cost); err != nil {
		return Decision{Limit: l}, s, err
	}
	t := now.UnixMicro()
	tau := int64(l.burst) * l.num
	level := tau
	if s.Last != 0 {
		level = s.Level
		if elapsed := t - s.Last; elapsed > 0 {
			if elapsed >= (tau-level)/l.den+1 {
				level = tau
			} else {
				level = min(level+elapsed*l.den, tau)
			}
		}
	}
	last := max(s.Last, t)
	g := gcra{now: t, used: tau - level, l: &l}
	inc := int64(cost) * l.num
	if inc > level {
		return g.decision(false, cost), TokenState{Level: level, Last: last}, nil
	}
	g.used += inc
	return g.decision(true, cost), TokenState{Level: level - inc, Last: last}, nil
}
