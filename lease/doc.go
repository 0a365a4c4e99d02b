// Package lease moves a global budget between regions without ever granting
// more than the budget.
//
// The package holds both ends of the lease protocol as deterministic state
// machines in the style of etcd's raft: the coordinator's Allocator and the
// region's Holder. Neither starts goroutines, performs I/O, reads the clock or
// draws randomness. Each is driven by three calls:
//
//	Step(now, msg)   // a message arrived
//	Tick(now)        // time passed
//	Ready() []Message // messages to send, in the order they must be sent
//
// The coordinator process (package coordinator), the region agent and the
// simulator wrap these with their own transports and clocks.
//
// # Model
//
// A Budget is a global limit (Count tokens per Period, Burst) shared by a set
// of regions. Each subject of the budget's rule (a tenant, an API key) has its
// own global bucket with that limit; a bucket.Key names one of them. Every
// region has a floor for every key: a static share of the budget (the budget
// minus a reserve, split by weight with floor division) that it may use with
// no lease at all. Keys that stay within their floors never reach the
// coordinator.
//
// A region whose demand presses on its allocation for a key reports the key
// as hot. The Allocator then gives each region of the budget an allocation for
// the key (max-min fair by default, proportional or static as options),
// moving capacity from regions that do not use theirs. Allocations travel in
// one lease per region: a versioned table sent as deltas, renewed at every
// refresh, valid for a TTL measured by the Holder from when it sent the
// request the grant answers.
//
// # Escrow (invariant I1)
//
// For every key, the Allocator keeps for each region an upper bound of what
// the region may be using, now and until the end of the next lease:
//
//   - every allocation value sent since the last one the region acknowledged,
//     until the region's lease could have expired (the last grant's time plus
//     TTL plus the drift margin);
//   - its floor, unless the region has acknowledged a grant that commits it to
//     stay below its floor (a lent floor) for Hold after it received it.
//
// An increase is sent only when the sum of these bounds over all regions,
// taken at their maximum over the coming lease window, stays within the
// budget's count; bursts follow counts (burst = Burst×count/Count rounded
// down), so the burst sum is bounded too. A lease is renewed only while the
// sum fits, so capacity lent by a silent region is handed back before the
// region may take it up again. Duplicated, reordered or lost messages can only
// delay an acknowledgement, never shorten a bound. A delta that only raises
// is Quiet and not acknowledged: after the last value acknowledged, a key's
// values then only rise, and the last bounds them all.
//
// A new leader starts in learning mode: it adopts what regions say they
// may use now, renews, and takes back what regions borrowed, but grants no
// increase — so it lends no floor either, since nothing lent could be
// granted to anyone. Its grants say so, and Holders apply them only
// downwards. The first leader ever to serve the regions
// (NewFirstAllocator) has nothing to learn from them: it raises while it
// learns, but no region above its share of a static split. Learning ends when every region has acknowledged a grant of
// the new term (each then ignores the old leader and holds no more than the
// new one counts), or at the latest after one TTL plus twice the drift
// margin, when every lease the previous leader could have granted has
// expired. Every grant carries the leader's term; a Holder ignores
// grants from an older term. Full tables carry the coordinator's budgets,
// so a rules change reaches every region with its next full table.
//
// # Driving the state machines
//
// Region side (one Holder per region, run by the agent that speaks for it):
//
//	h, _ := lease.NewHolder(cfg, now)         // or RestoreHolder(cfg, saved, now)
//	h.Demand(now, key, want)                  // per key in use, at least every refresh
//	h.Fed(now)                                // after giving every key's demand at now
//	h.Tick(now)                               // every ~100 ms
//	h.Step(now, msgFromCoordinator)
//	for _, m := range h.Ready() { send(m) }
//	h.Reconnect(now)                          // on every new stream
//	l, ok := h.Allocation(now, key)           // what the region may use now
//
// Coordinator side (one Allocator per leader term):
//
//	a, _ := lease.NewAllocator(cfg, term, now) // NewFirstAllocator for the first leader ever
//	a.Step(now, msgFromRegion)                // Region set by the transport
//	a.Tick(now)                               // every ~100 ms; rounds every Refresh
//	for _, m := range a.Ready() { sendTo(m.Region, m) }
package lease
