package region

import (
	"context"
	"errors"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Path says how a decision was made.
type Path uint8

// Decision paths.
const (
	// PathStore: the regional store decided (one script call, or the batch
	// refill that answered this request).
	PathStore Path = iota
	// PathBatch: decided locally from a batch taken from the regional
	// bucket beforehand.
	PathBatch
	// PathDenyCache: denied locally because the regional bucket was empty
	// moments ago and cannot have refilled yet.
	PathDenyCache
	// PathNoAllocation: denied because the region's allocation for the key
	// is zero or smaller than the cost.
	PathNoAllocation
	// PathEmergency: the store was unavailable; an in-process bucket with
	// the region's allocation divided by its live agents decided.
	PathEmergency
	// PathFailOpen: the store was unavailable and the rule fails open.
	PathFailOpen
	// PathFailClosed: the store was unavailable and the rule fails closed.
	PathFailClosed
	numPaths
)

var pathNames = [numPaths]string{"store", "batch", "deny-cache", "no-allocation", "emergency", "fail-open", "fail-closed"}

// String returns the path's metric label.
func (p Path) String() string {
	if p < numPaths {
		return pathNames[p]
	}
	return "unknown"
}

// Paths lists every path, for metrics.
func Paths() []Path {
	ps := make([]Path, numPaths)
	for i := range ps {
		ps[i] = Path(i)
	}
	return ps
}

// Result is one decision of the Core.
type Result struct {
	// Decision is the outcome. Its Limit is the region's allocation for
	// the key (on PathEmergency, the emergency limit this agent enforced).
	Decision bucket.Decision
	Path     Path
	// Hot is set when the allocation is a coordinator entry, not a floor.
	Hot bool
	// Alloc is the region's allocation for the key at the time.
	Alloc bucket.Limit
}

// Decide admits or denies cost tokens of key, whose global budget is
// global, at now. The error is non-nil for an invalid limit or cost, a cost
// above the global burst (bucket.ErrNeverFits), a canceled context, and
// ErrFailClosed when the store is unavailable and the rule fails closed.
// A non-empty attemptID makes a retry idempotent: this agent remembers the
// last few hundred attempt ids per key for bucket.DefaultAttemptWindow, and
// the store remembers those it decides across agents.
func (c *Core) Decide(ctx context.Context, now time.Time, key bucket.Key, global bucket.Limit, cost bucket.Tokens, attemptID string) (Result, error) {
	var res Result
	err := c.DecideInto(ctx, now, &key, &global, cost, attemptID, &res)
	return res, err
}

// DecideInto is Decide reading the key and the global limit in place and
// writing the result into res, which it overwrites whole: a caller that
// decides in a loop (the simulator) copies neither the 136-byte result nor
// the 80 bytes of arguments per decision.
func (c *Core) DecideInto(ctx context.Context, now time.Time, key *bucket.Key, global *bucket.Limit, cost bucket.Tokens, attemptID string, res *Result) error {
	res.Decision, res.Alloc = bucket.Decision{}, bucket.Limit{}
	path, ac, err := c.decide(ctx, now, *key, global, cost, attemptID, &res.Decision, &res.Alloc)
	res.Path = path
	res.Hot = ac != nil && ac.hot
	return err
}

// decide is Decide writing the decision into d, so that a decision from a
// batch copies nothing it does not have to, and the region's allocation
// into alloc when it is not nil. It returns the path and the key's cached
// allocation (nil for a key decided without state).
func (c *Core) decide(ctx context.Context, now time.Time, key bucket.Key, global *bucket.Limit, cost bucket.Tokens, attemptID string, d *bucket.Decision, alloc *bucket.Limit) (Path, *allocCache, error) {
	if !global.Fits(cost) {
		d.Limit = *global
		return PathNoAllocation, nil, bucket.Check(*global, cost)
	}
	nowUS := now.UnixMicro()
	ks := c.lookup(&key)
	if ks == nil {
		path, done, err := c.cold(ctx, now, key, global, cost, attemptID, d, alloc)
		if done {
			return path, nil, err
		}
		ks = c.state(key, nowUS)
	}
	ac := c.allocation(ks, now, nowUS, global)
	if alloc != nil {
		*alloc = ac.full
	}
	if attemptID != "" {
		return c.decideAttempt(ctx, now, nowUS, ks, ac, cost, attemptID, d)
	}
	if ks.held() > 0 || ks.batched.Load() {
		if cost <= ac.limit.Burst() && (nowUS >= ks.deniedUntil.Load() || int64(cost) < ks.deniedCost.Load()) {
			if left, ok := ks.take(cost, true); ok {
				// take counted the decision in the key's batch word; it
				// is folded into the rule's counters at the next sample.
				d.Allowed, d.Remaining, d.Limit = true, bucket.Tokens(left), ac.limit
				return PathBatch, ac, nil
			}
		}
	}
	var res Result
	err := c.slow(ctx, now, nowUS, ks, ac, cost, attemptID, &res)
	*d = res.Decision
	return res.Path, ac, err
}

// fromBatch decides cost tokens of key from the key's batch at nowUS, a
// reading that may lag the true time (a clock.Coarse), when that is what
// decide would do at any instant from nowUS to nowUS+slackUS: the key's
// cached allocation is current and holds past nowUS+slackUS, no cached
// denial covers the request at nowUS (nor so later), and the batch holds
// cost tokens. It returns the tokens left in the batch and the key's
// cached allocation when it decided (the request admitted, at the cached
// allocation's limit), and nil, having changed nothing, otherwise; the
// caller then decides with decide on a true reading. So a reading stale by
// less than slackUS gives the answer decide gives on a true one: the only
// input that could turn that answer the other way with a later time is a
// lease ending, and the cached allocation outlives the slack.
func (c *Core) fromBatch(nowUS, slackUS int64, key *bucket.Key, global *bucket.Limit, cost bucket.Tokens) (int64, *allocCache) {
	if !global.Fits(cost) {
		return 0, nil
	}
	ks := c.lookup(key)
	if ks == nil || (ks.held() == 0 && !ks.batched.Load()) {
		return 0, nil
	}
	ac := ks.alloc.Load()
	if ac == nil || ac.epoch.Load() != c.alloc.Epoch()+c.scaleEpoch.Load() || nowUS+slackUS >= ac.until || !ac.global.Same(global) {
		return 0, nil
	}
	// A limit that does not fit the cost (a burst below it, or a zero
	// allocation) is left to decide.
	if !ac.limit.Fits(cost) || (nowUS < ks.deniedUntil.Load() && int64(cost) >= ks.deniedCost.Load()) {
		return 0, nil
	}
	left, ok := ks.take(cost, true)
	if !ok {
		return 0, nil
	}
	return left, ac
}

// coldSample: every coldSample-th decision of a key without state gives
// it state, so a key in heavy demand far below its allocation (which the
// store never reports as pressed) is soon tracked and batched, while
// keys in light use keep none.
const coldSample = 64

// cold decides a request for a key with no local state: exactly, in the
// store, keeping no state unless the key needs it — a coordinator entry, an
// attempt id, a failover to drain, the store unavailable (the emergency
// bucket lives in the state), the bucket pressed (denied, under half full,
// or with a share too small for the cost: demand to report, denials to
// cache), or the periodic sample. done
// is false when the caller must decide with state instead; no store call
// was made then.
func (c *Core) cold(ctx context.Context, now time.Time, key bucket.Key, global *bucket.Limit, cost bucket.Tokens, attemptID string, d *bucket.Decision, alloc *bucket.Limit) (Path, bool, error) {
	rs := c.rule(key.Rule)
	lim := *global
	if rs.cfg.Scope == rules.ScopeGlobal {
		var hot bool
		lim, hot, _ = c.alloc.Allocation(now, key, *global)
		if hot {
			return 0, false, nil
		}
	}
	full := lim
	lim = c.regional(lim, &rs.cfg)
	// A share that cannot carry the cost (a floor whose burst rounds
	// below it) presses the key as surely as a denial: it takes state so
	// that its demand is reported and the coordinator can lease it what it
	// needs, rather than stay cold and unreported until a sample.
	if attemptID != "" || cost > lim.Burst() || (rs.cfg.EmptyOnFailover && c.failEpoch.Load() > 0) || c.coldCount.Add(1)%coldSample == 0 {
		return 0, false, nil
	}
	// Last: a true answer may make this call the breaker's probe, which
	// must then reach the store and report back.
	if !c.breaker.Allow(now) {
		return 0, false, nil
	}
	if alloc != nil {
		*alloc = full
	}
	dd, err := c.store.Decide(ctx, key, lim, cost, attemptID)
	c.stats.storeOps.Add(1)
	if err != nil {
		if isInputErr(err) || ctx.Err() != nil {
			c.breaker.Cancel()
			d.Limit = lim
			return PathStore, true, err
		}
		c.storeFailed(now, err)
		ks := c.state(key, now.UnixMicro())
		ac := c.allocation(ks, now, now.UnixMicro(), global)
		ks.arrived.Add(int64(cost))
		res := Result{Alloc: ac.full, Decision: bucket.Decision{Limit: ac.limit}}
		err := c.fallback(now, ks, ac, cost, &res)
		*d = res.Decision
		return res.Path, true, err
	}
	c.breaker.Success(now)
	*d = dd
	if dd.Allowed {
		rs.admitted[PathStore].Add(1)
	} else {
		rs.denied[PathStore].Add(1)
	}
	if !dd.Allowed || dd.Remaining < lim.Burst()/2 {
		// Pressed: from now on the key has state (its demand is reported
		// and its denials cached).
		ks := c.state(key, now.UnixMicro())
		ks.arrived.Add(int64(cost))
		if !dd.Allowed && dd.RetryAfter > 0 {
			c.denyUntil(ks, now.Add(dd.RetryAfter).UnixMicro(), now.Add(dd.ResetAfter).UnixMicro(), cost)
		}
	}
	return PathStore, true, nil
}

// decideAttempt decides a request that carries an attempt id: a retry of
// one this agent decided within the attempt window gets the first answer
// and is not charged again.
func (c *Core) decideAttempt(ctx context.Context, now time.Time, nowUS int64, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string, d *bucket.Decision) (Path, *allocCache, error) {
	ks.mu.Lock()
	if ks.attempts != nil {
		if r, ok := ks.attempts.recall(attemptID, nowUS); ok {
			ks.mu.Unlock()
			*d = r.d
			return r.path, ac, nil
		}
	}
	ks.mu.Unlock()
	var res Result
	if ks.held() > 0 || ks.batched.Load() {
		if cost <= ac.limit.Burst() && (nowUS >= ks.deniedUntil.Load() || int64(cost) < ks.deniedCost.Load()) {
			if left, ok := ks.take(cost, true); ok {
				res = Result{Path: PathBatch, Decision: bucket.Decision{Allowed: true, Remaining: bucket.Tokens(left), Limit: ac.limit}}
			}
		}
	}
	var err error
	if res.Path != PathBatch {
		err = c.slow(ctx, now, nowUS, ks, ac, cost, attemptID, &res)
	}
	if err == nil {
		ks.mu.Lock()
		if ks.attempts == nil {
			ks.attempts = &attemptLog{byID: map[string]attemptRec{}}
		}
		ks.attempts.remember(attemptID, attemptRec{d: res.Decision, path: res.Path, expires: nowUS + bucket.DefaultAttemptWindow.Microseconds()})
		ks.mu.Unlock()
	}
	*d = res.Decision
	return res.Path, ac, err
}

// slow is every decision but one from a held batch.
func (c *Core) slow(ctx context.Context, now time.Time, nowUS int64, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string, res *Result) error {
	lim := ac.limit
	*res = Result{Hot: ac.hot, Alloc: ac.full, Decision: bucket.Decision{Limit: lim}}
	// Arrivals are counted for demand on every path but the batch's, whose
	// spending sampleLocked reads off the batch itself.
	if cost > lim.Burst() { // a zero allocation has burst 0
		ks.arrived.Add(int64(cost))
		res.Path, res.Decision.RetryAfter = PathNoAllocation, c.cfg.DenyRetry
		c.done(ks, res)
		return nil
	}
	if du := ks.deniedUntil.Load(); nowUS < du && int64(cost) >= ks.deniedCost.Load() {
		ks.arrived.Add(int64(cost))
		res.Path = PathDenyCache
		res.Decision.RetryAfter = time.Duration(du-nowUS) * time.Microsecond
		// This agent has not touched the bucket since the denial this one
		// repeats: it is full again when that denial said (later if other
		// agents spent from it meanwhile).
		res.Decision.ResetAfter = max(time.Duration(ks.deniedReset.Load()-nowUS)*time.Microsecond, res.Decision.RetryAfter)
		c.done(ks, res)
		return nil
	}
	if ks.batched.Load() {
		return c.refill(ctx, now, ks, ac, cost, attemptID, res)
	}
	return c.exact(ctx, now, ks, ac, cost, attemptID, res)
}

// done counts res.
func (c *Core) done(ks *keyState, res *Result) {
	if res.Decision.Allowed {
		ks.rs.Load().admitted[res.Path].Add(1)
	} else {
		ks.rs.Load().denied[res.Path].Add(1)
	}
}

// isInputErr reports whether err is about the request, not the store.
func isInputErr(err error) bool {
	return errors.Is(err, bucket.ErrInvalidLimit) || errors.Is(err, bucket.ErrInvalidCost) || errors.Is(err, bucket.ErrNeverFits)
}

// exact decides one request in the store.
func (c *Core) exact(ctx context.Context, now time.Time, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string, res *Result) error {
	lim := ac.limit
	ks.arrived.Add(int64(cost))
	c.sample(ks, now)
	if !c.breaker.Allow(now) {
		return c.fallback(now, ks, ac, cost, res)
	}
	c.drain(ctx, now, ks, lim)
	d, err := c.store.Decide(ctx, ks.key, lim, cost, attemptID)
	c.stats.storeOps.Add(1)
	if err != nil {
		if isInputErr(err) || ctx.Err() != nil {
			// About the request, or the caller gave up: no verdict on the
			// store.
			c.breaker.Cancel()
			return err
		}
		c.storeFailed(now, err)
		return c.fallback(now, ks, ac, cost, res)
	}
	c.breaker.Success(now)
	if !d.Allowed && d.RetryAfter > 0 {
		c.denyUntil(ks, now.Add(d.RetryAfter).UnixMicro(), now.Add(d.ResetAfter).UnixMicro(), cost)
	}
	res.Decision, res.Path = d, PathStore
	c.done(ks, res)
	return nil
}
