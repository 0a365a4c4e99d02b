package region

import (
	"context"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// countBits is how many low bits of keyState.batch count decisions; the
// count wraps (losing only metric counts) past 2^24 between samples.
const (
	countBits = 24
	countMask = 1<<countBits - 1
)

// held is the batch tokens held.
func (ks *keyState) held() int64 { return ks.batch.Load() >> countBits }

// take spends cost tokens of the batch if it holds them; left is what
// remains. count counts the decision in the batch word (the paths that
// count decisions themselves pass false).
func (ks *keyState) take(cost bucket.Tokens, count bool) (left int64, ok bool) {
	inc := int64(0)
	if count {
		inc = 1
	}
	for {
		w := ks.batch.Load()
		t := w >> countBits
		if t < int64(cost) {
			return t, false
		}
		nw := (t-int64(cost))<<countBits | (w+inc)&countMask
		if ks.batch.CompareAndSwap(w, nw) {
			return t - int64(cost), true
		}
	}
}

// addTokens adds n tokens to the batch.
func (ks *keyState) addTokens(n int64) { ks.batch.Add(n << countBits) }

// takeAll empties the batch and returns the tokens it held.
func (ks *keyState) takeAll() int64 {
	for {
		w := ks.batch.Load()
		if ks.batch.CompareAndSwap(w, w&countMask) {
			return w >> countBits
		}
	}
}

// takeCount returns and clears the decisions counted since the last call.
func (ks *keyState) takeCount() int64 {
	for {
		w := ks.batch.Load()
		if ks.batch.CompareAndSwap(w, w&^countMask) {
			return w & countMask
		}
	}
}

// refill takes a batch for ks from the store and decides the request from
// it. One refill per key runs at a time; a request that finds the batch
// empty while another refills is decided exactly.
func (c *Core) refill(ctx context.Context, now time.Time, ks *keyState, ac *allocCache, cost bucket.Tokens, attemptID string, res *Result) error {
	lim := ac.limit
	c.sample(ks, now)
	ks.mu.Lock()
	if ks.refilling {
		ks.mu.Unlock()
		return c.exact(ctx, now, ks, ac, cost, attemptID, res)
	}
	if left, ok := ks.take(cost, false); ok {
		ks.mu.Unlock()
		res.Path = PathBatch
		res.Decision.Allowed, res.Decision.Remaining = true, bucket.Tokens(left)
		c.done(ks, res)
		return nil
	}
	if !c.breaker.Allow(now) {
		ks.mu.Unlock()
		ks.arrived.Add(int64(cost))
		return c.fallback(now, ks, ac, cost, res)
	}
	if nowUS := now.UnixMicro(); nowUS < ks.dryUntil && ks.batchLimit == lim {
		// The last refill emptied the regional bucket and its batch is
		// spent: a batch's worth is not back before dryUntil, so a call
		// now would find next to nothing. Denied here, and by the deny
		// cache until then.
		// The bucket is full again a burst's worth of intervals after
		// the refill that emptied it.
		until, full := ks.dryUntil, ks.takenAt+(time.Duration(lim.Burst())*lim.Interval()).Microseconds()
		ks.mu.Unlock()
		res.Path = PathDenyCache
		c.denyEmpty(ks, res, cost, nowUS, until, full, time.Duration(until-nowUS)*time.Microsecond)
		return nil
	}
	want := c.batchSize(ks.rate, lim, cost)
	// One token more than a batch's worth, within the cap: a refill that
	// gets less has emptied the bucket, and the next waits for dryUntil
	// instead of calling to find it empty.
	ask := min(want+1, max(c.batchCap(lim), want))
	ks.refilling = true
	ks.mu.Unlock()

	c.drain(ctx, now, ks, lim)
	got, err := c.store.TakeUpTo(ctx, ks.key, lim, ask)
	c.stats.storeOps.Add(1)
	ks.mu.Lock()
	ks.refilling = false
	if err == nil {
		ks.batchLimit, ks.takenAt = lim, now.UnixMicro()
		if got < ask {
			// It took every whole token the bucket held: a batch's
			// worth is back want intervals from now.
			ks.dryUntil = now.Add(time.Duration(want) * lim.Interval()).UnixMicro()
		}
		if got > 0 {
			ks.given += int64(got)
			ks.addTokens(int64(got))
		}
	}
	ks.mu.Unlock()
	if err != nil {
		ks.arrived.Add(int64(cost))
		if isInputErr(err) || ctx.Err() != nil {
			c.breaker.Cancel()
			return err
		}
		c.storeFailed(now, err)
		return c.fallback(now, ks, ac, cost, res)
	}
	c.breaker.Success(now)
	c.stats.refills.Add(1)
	res.Path = PathStore
	if left, ok := ks.take(cost, false); ok {
		res.Decision.Allowed, res.Decision.Remaining = true, bucket.Tokens(left)
		c.done(ks, res)
		return nil
	}
	// The regional bucket held fewer than cost tokens: it is empty now.
	// Nothing is asked of it again until a batch's worth has refilled (the
	// tokens wait in the regional bucket meanwhile, up to its burst, so
	// none is lost), which keeps a key over its allocation at a few store
	// calls per batch window.
	held := ks.held()
	retry := time.Duration(max(int64(cost)-held, 1)) * lim.Interval()
	quiet := time.Duration(max(int64(want)-held, 1)) * lim.Interval()
	// The refill took every token the bucket held: it is full again a
	// burst's worth of intervals from now.
	full := now.Add(time.Duration(lim.Burst()) * lim.Interval()).UnixMicro()
	c.denyEmpty(ks, res, cost, now.UnixMicro(), now.Add(max(retry, quiet)).UnixMicro(), full, retry)
	return nil
}

// denyEmpty denies a request of cost on ks, whose last refill emptied the
// regional bucket: the deny cache answers for the key until until (µs), the
// request may be retried after retry, and the bucket is full again at full
// (µs).
func (c *Core) denyEmpty(ks *keyState, res *Result, cost bucket.Tokens, nowUS, until, full int64, retry time.Duration) {
	ks.arrived.Add(int64(cost))
	c.denyUntil(ks, until, full, 1)
	res.Decision.RetryAfter = retry
	res.Decision.ResetAfter = max(time.Duration(full-nowUS)*time.Microsecond, retry)
	c.done(ks, res)
}

// batchSize is the next batch for a key: over BatchWindow, its demand or
// the allocation's rate, whichever is less; at least the request's cost, at
// most BatchMaxFraction of the burst. A key whose demand exceeds its
// allocation empties the regional bucket, and then each refill takes what
// the bucket gained since the last: batches of the demand would leave it
// admitting in clumps, a batch every few tens of milliseconds, which
// the allocation's rate smooths to what the regional bucket refills over
// BatchWindow.
func (c *Core) batchSize(rate float64, lim bucket.Limit, cost bucket.Tokens) bucket.Tokens {
	n := bucket.Tokens(min(rate, lim.Rate()) * c.cfg.BatchWindow.Seconds())
	return max(min(n, c.batchCap(lim)), cost, 1)
}

// batchCap is the largest batch under lim: BatchMaxFraction of its burst.
func (c *Core) batchCap(lim bucket.Limit) bucket.Tokens {
	return bucket.Tokens(float64(lim.Burst()) * c.cfg.BatchMaxFraction)
}

// giveBack returns ks's batch tokens to the regional bucket under the key's
// current allocation. Tokens that cannot be returned are lost, which only
// ever under-admits.
func (c *Core) giveBack(ctx context.Context, now time.Time, ks *keyState) {
	ks.mu.Lock()
	n := ks.takeAll()
	ks.back += max(n, 0)
	lim := ks.batchLimit
	if n > 0 {
		ks.dryUntil = 0 // the bucket gets them back
	}
	ks.mu.Unlock()
	if n <= 0 {
		return
	}
	if g := ks.allocGlobal(); !g.IsZero() {
		if ac := c.allocation(ks, now, now.UnixMicro(), &g); !ac.limit.IsZero() {
			lim = ac.limit
		}
	}
	if lim.IsZero() || !c.breaker.Allow(now) {
		return
	}
	err := c.store.Return(ctx, ks.key, lim, bucket.Tokens(n))
	c.stats.storeOps.Add(1)
	if err != nil {
		if isInputErr(err) || ctx.Err() != nil {
			c.breaker.Cancel()
		} else {
			c.storeFailed(now, err)
		}
		return
	}
	c.breaker.Success(now)
	c.stats.returns.Add(1)
	c.stats.returned.Add(n)
}

// Shutdown gives back every batch token, for a clean stop.
func (c *Core) Shutdown(ctx context.Context, now time.Time) {
	var all []*keyState
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for _, ks := range s.keys {
			if ks.held() > 0 {
				all = append(all, ks)
			}
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(all, func(a, b *keyState) int { return cmpKey(a.key, b.key) })
	for _, ks := range all {
		c.giveBack(ctx, now, ks)
	}
}
