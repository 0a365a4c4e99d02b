package region

import (
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Demand lists, sorted by key, every key of a global rule this agent has
// local state for, with its demand at now: the keys it used within the
// demand window (even a little) and those with a coordinator entry. The
// region's speaker sums the agents' lists and reports them all, so the
// coordinator can tell a region that uses a little of its floor from one
// that uses none: a key missing from the region's report is unused there,
// and its floor may be lent. Keys whose demand has decayed to nothing and
// that hold no entry are left out; a key idle for IdleAfter has no state.
//
// While the store is unavailable (the breaker not closed), a key of a rule
// that fails closed is reported with no demand: the agent admits nothing
// for it, so its share of the budget is better lent to regions that can
// use it, and it is reported again, and taken back, once the store answers.
//
// The coordinator keeps state only for keys some region presses on, so its
// memory still follows hot keys; the report's size follows the keys the
// region uses.
func (c *Core) Demand(now time.Time) []KeyDemand {
	c.demandMu.Lock()
	defer c.demandMu.Unlock()
	order := c.sortedKeys()
	out := make([]KeyDemand, 0, len(order))
	down := c.breaker.State(now) != BreakerClosed
	for _, ks := range order {
		if ks.gone.Load() || ks.rs.Load().cfg.Scope != rules.ScopeGlobal {
			continue
		}
		ac := ks.alloc.Load()
		if ac == nil {
			continue
		}
		ks.mu.Lock()
		rate := ks.demand
		ks.mu.Unlock()
		want := bucket.Tokens(math.Ceil(rate * ac.global.Period().Seconds()))
		if want <= 0 && !ac.hot {
			continue
		}
		if down && ks.rs.Load().cfg.OnUnavailable == rules.FailClosed {
			want, rate = 0, 0
		}
		out = append(out, KeyDemand{Key: ks.key, Want: want, Rate: rate, Alloc: ac.limit, Hot: ac.hot})
	}
	return out
}

// sortedKeys returns every key state the core holds, sorted by key,
// rebuilding the list only when keys were created or dropped since. A key
// created while it is rebuilt moves keysVer again, so the next call
// rebuilds; one dropped is marked gone. Requires that c.demandMu is held.
func (c *Core) sortedKeys() []*keyState {
	ver := c.keysVer.Load()
	if c.demandOrder != nil && ver == c.demandVer {
		return c.demandOrder
	}
	order := c.demandOrder[:0]
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for _, ks := range s.keys {
			order = append(order, ks)
		}
		s.mu.RUnlock()
	}
	slices.SortFunc(order, func(a, b *keyState) int { return cmpKey(a.key, b.key) })
	c.demandOrder, c.demandVer = order, ver
	return order
}
