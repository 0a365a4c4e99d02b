package region

import (
	"context"
	"errors"
	"time"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Failover records a detected failover of the regional Redis at now: for
// rules with EmptyOnFailover, every bucket counts as empty at now, so it
// admits at most what refills after now.
func (c *Core) Failover(now time.Time) {
	c.failAt.Store(now.UnixMicro())
	c.failEpoch.Add(1)
	c.stats.failovers.Add(1)
}

// storeFailed counts a store failure, of a call begun at now, for the
// breaker; a timeout under a deadline the breaker had already raised past
// (breaker.ErrOutgrown) is not counted against the store.
func (c *Core) storeFailed(now time.Time, err error) {
	c.stats.storeErrors.Add(1)
	c.lastErr.Store(&err)
	if errors.Is(err, breaker.ErrOutgrown) {
		c.breaker.Cancel()
		return
	}
	c.breaker.Failure(now)
}

// probeKey and probeLimit are what a probe peeks at in a store that
// cannot ping: a bucket no rule names, read, never written.
var (
	probeKey   = bucket.Key{Rule: "allot-probe", Subject: "probe"}
	probeLimit = bucket.PerSecond(1)
)

// Probe asks the store whether it answers, when the breaker is not closed
// and lets a probe through at now: a ping (bucket.Pinger), else a Peek.
// The breaker's return to closed therefore never waits on traffic, nor on
// the path a request takes (a key with no allocation is denied before any
// store call). Tick calls it; a driver whose rounds a dead store slows
// (each of their calls waits out its deadline) calls it between them too,
// so the probe is due the back-off after the last one began, not at the
// next round. Safe beside Tick and decisions: the breaker lets one probe
// through at a time, and a closed one costs an atomic load.
func (c *Core) Probe(ctx context.Context, now time.Time) {
	if c.breaker.State(now) == BreakerClosed || !c.breaker.Allow(now) {
		return
	}
	var err error
	if p, ok := c.store.(bucket.Pinger); ok {
		err = p.Ping(ctx)
	} else {
		_, err = c.store.Peek(ctx, probeKey, probeLimit)
	}
	c.stats.probes.Add(1)
	switch {
	case err == nil:
		c.breaker.Success(now)
	case ctx.Err() != nil:
		c.breaker.Cancel()
	default:
		c.storeFailed(now, err)
	}
}

// Elsewhere tells the core the outcome of another call begun at now to
// its store's server (the agent's shared state: its report, on the same
// regional Redis), answered or not. An answer after that path failed while
// the breaker was open says the store is back: the breaker probes at once
// instead of at the end of its back-off (Breaker.Elsewhere, then Probe).
// Meanwhile the agent reported no demand for the rules that fail closed,
// and its speaker lent their share away. It reports whether the breaker is
// closed after; only the probe, under the breaker's deadline, closes it.
func (c *Core) Elsewhere(ctx context.Context, now time.Time, answered bool) bool {
	c.breaker.Elsewhere(now, answered) // nothing on a closed breaker
	if answered {
		c.Probe(ctx, now) // nothing unless the breaker lets a probe through
	}
	return c.breaker.State(now) == BreakerClosed
}

// LastError returns the last store error seen, nil if none.
func (c *Core) LastError() error {
	if p := c.lastErr.Load(); p != nil {
		return *p
	}
	return nil
}

// fallback decides a request the store could not, by the rule's policy.
//
// An emergency rule admits from the key's emergency bucket only while the
// breaker is open, that is while this agent declares (and, through its
// driver, announces) that it cannot reach the store; the bucket starts
// empty at the instant the breaker opened. So emergency admissions never
// overlap the regional bucket's: before the opening the regional bucket
// decided, after it the emergency bucket refills from nothing at this
// agent's share. While the breaker is closed the emergency bucket holds
// nothing: a store call that fails then (a straggler on a healthy store)
// is denied from it, as from an empty bucket.
func (c *Core) fallback(now time.Time, ks *keyState, ac *allocCache, cost bucket.Tokens, res *Result) error {
	lim := ac.limit
	rc := &ks.rs.Load().cfg
	switch rc.OnUnavailable {
	case rules.FailOpen:
		res.Path = PathFailOpen
		res.Decision = bucket.Decision{Allowed: true, Limit: lim}
		c.done(ks, res)
		return nil
	case rules.Emergency:
		since, open := c.breaker.OpenSince()
		el := EmergencyLimit(ac.full, rc, c.Live())
		res.Path = PathEmergency
		if !open || el.IsZero() || cost > el.Burst() {
			res.Decision = bucket.Decision{Limit: el, RetryAfter: c.cfg.DenyRetry}
			c.done(ks, res)
			return nil
		}
		ks.mu.Lock()
		if at := since.UnixMicro(); ks.emergencyFrom != at {
			// A new outage: empty at its start.
			ks.emergencyFrom = at
			ks.emergency = bucket.Empty(since, el)
		}
		d, ns, err := bucket.Decide(ks.emergency, now, el, cost)
		if err == nil {
			ks.emergency = ns
		}
		ks.mu.Unlock()
		if err != nil {
			d = bucket.Decision{Limit: el, RetryAfter: c.cfg.DenyRetry}
		}
		res.Decision = d
		c.done(ks, res)
		return nil
	}
	res.Path = PathFailClosed
	res.Decision = bucket.Decision{Limit: lim, RetryAfter: c.cfg.BreakerBackoff}
	c.done(ks, res)
	return ErrFailClosed
}

// drain empties ks's bucket once per detected failover, for rules with
// EmptyOnFailover: what the bucket holds beyond what it would hold had it
// been empty at the failover is taken and discarded. Agents that race only
// drain more, never less.
func (c *Core) drain(ctx context.Context, now time.Time, ks *keyState, lim bucket.Limit) {
	if !ks.rs.Load().cfg.EmptyOnFailover {
		return
	}
	ep := c.failEpoch.Load()
	if ep == 0 {
		return
	}
	ks.mu.Lock()
	if ks.drained == ep {
		ks.mu.Unlock()
		return
	}
	ks.drained = ep
	ks.mu.Unlock()
	elapsed := now.UnixMicro() - c.failAt.Load()
	iv := lim.Interval().Microseconds()
	if iv <= 0 {
		return
	}
	refilled := bucket.Tokens(max(elapsed, 0) / iv)
	if refilled >= lim.Burst() {
		return
	}
	d, err := c.store.Peek(ctx, ks.key, lim)
	c.stats.storeOps.Add(1)
	if err != nil {
		return
	}
	if excess := d.Remaining - refilled; excess > 0 {
		got, err := c.store.TakeUpTo(ctx, ks.key, lim, excess)
		c.stats.storeOps.Add(1)
		if err == nil {
			c.stats.drains.Add(1)
			c.stats.drained.Add(int64(got))
		}
	}
}

// EmergencyLimit is the region's allocation a divided among live agents,
// capped by the rule's emergency limit: count and burst rounded down, so
// the agents' emergency buckets together never exceed the allocation. The
// zero Limit (admit nothing) when a share rounds to nothing. The
// simulator's baselines divide their share with it too.
func EmergencyLimit(a bucket.Limit, rc *RuleConfig, live int) bucket.Limit {
	if a.IsZero() {
		return a
	}
	if el := rc.EmergencyLimit; !el.IsZero() && el.Rate() < a.Rate() {
		a = el
	}
	live = max(live, 1)
	c := a.Count() / bucket.Tokens(live)
	b := a.Burst() / bucket.Tokens(live)
	if c <= 0 || b <= 0 {
		return bucket.Limit{}
	}
	return bucket.Per(c, a.Period()).WithBurst(b)
}
