// Package region is the regional agent's deterministic core: it decides
// requests locally from the region's leased slice of every global budget,
// and holds the region's end of the lease protocol.
//
// # Model
//
// A global budget (rate R, burst B per subject) is split among regions by the
// lease protocol (package lease). Each region may use, for each key, its
// allocation: the coordinator's entry for a hot key while the region's lease
// lives, else its floor, a static share of the budget. The region enforces
// that allocation exactly in its regional store (the regional Redis, through
// bucket.Store): every read-refill-check-debit is one atomic script there.
//
// Core is the decision core. It takes time as an argument, starts no
// goroutines and reads no clock, so the simulator drives the same code the
// agent runs. For each request it
//
//   - resolves the key's allocation (Allocations: a Table of the region's
//     lease, or floors alone), caching it per key until the table changes or
//     the lease or hold ends;
//   - decides a cold key exactly, one store call per decision;
//   - for a key whose local demand over BatchWindow reaches MinBatch, takes a
//     batch of tokens from the regional bucket (TakeUpTo), of its demand or
//     its allocation's rate over BatchWindow, whichever is less, and decides
//     locally until it is spent. Tokens are debited before use (invariant I3), so
//     batches never overshoot the region's allocation; unused tokens go back
//     when the allocation shrinks, when they grow stale and on shutdown;
//   - when the store fails, applies the rule's failure policy: fail closed,
//     fail open (counted and reported as unbounded), or an emergency limit,
//     the region's allocation divided by its live agents, enforced by an
//     in-process bucket; a circuit breaker stops waiting on the store after
//     BreakerFailures consecutive failures, for a back-off window;
//   - after a detected Redis failover, for rules that ask, treats every
//     bucket as empty at the failover instant, so writes lost by
//     asynchronous replication cannot hand tokens out twice.
//
// Store wraps a Core with a clock so that it is itself a bucket.Store: the
// edge (package limiter) plugs it in unchanged, passing each rule's global
// limit; the Store substitutes the region's allocation for that key.
//
// The speaking agent's protocol (which agent speaks: SpeakerOf) and the
// Settler, which applies allocation changes to the regional buckets, are
// here too, as deterministic code. The drivers that run all of it with
// goroutines, a clock, memberlist, the shared table in Redis, the gRPC
// lease stream and metrics are package agent. region imports the standard
// library and allot's own bucket, lease, rules and clock packages only, so
// the simulator, which imports it, runs the agent's logic without any of
// the drivers' dependencies.
package region
