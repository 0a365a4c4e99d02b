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
	var out []KeyDemand
	down := c.breaker.State(now) != BreakerClosed
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		for _, ks := range s.keys {
			if ks.rs.Load().cfg.Scope != rules.ScopeGlobal {
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
		s.mu.RUnlock()
	}
	slices.SortFunc(out, func(a, b KeyDemand) int { return cmpKey(a.Key, b.Key) })
	return out
}
