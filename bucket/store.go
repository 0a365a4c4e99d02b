package bucket

import (
	"context"
	"errors"
	"time"
)

// Key names one bucket: the rule it belongs to and the subject (tenant, API
// key, user…) it limits. Stores may hash the subject before storing it.
type Key struct {
	Rule    string
	Subject string
}

// Store holds buckets and applies the GCRA operations to them atomically.
// Every implementation has the same semantics as the pure functions in this
// package (Decide, TakeUpTo, Return, Peek); the conformance suite in
// storetest checks that. Implementations are safe for concurrent use.
//
// Every method checks the limit and cost before touching storage: a cost
// above the burst returns ErrNeverFits without a round trip. A store that
// cannot answer in time returns an error wrapping ErrUnavailable.
type Store interface {
	// Decide admits cost tokens or denies and debits nothing. A non-empty
	// attemptID makes a retry idempotent: the same key and attemptID within
	// the store's attempt window return the first decision without debiting
	// again.
	Decide(ctx context.Context, key Key, l Limit, cost Tokens, attemptID string) (Decision, error)
	// TakeUpTo debits up to n tokens, as many as the bucket holds, and
	// returns how many it took (possibly 0).
	TakeUpTo(ctx context.Context, key Key, l Limit, n Tokens) (Tokens, error)
	// Return gives back n unused tokens, never filling past the burst.
	Return(ctx context.Context, key Key, l Limit, n Tokens) error
	// Peek reports the bucket's state without changing it.
	Peek(ctx context.Context, key Key, l Limit) (Decision, error)
}

// DefaultAttemptWindow is how long a store remembers an attempt id's
// decision: long enough to cover a client's retries of one request.
const DefaultAttemptWindow = 10 * time.Second

// Rebaser is implemented by stores that can move a bucket to a new limit at
// once (see Rebase), atomically with reading what the move took away: the
// whole tokens the bucket held beyond the new burst (lost). With credit > 0
// the same atomic step then gives that many tokens back under the new
// limit, never past its burst, as Return does: the settlement of a raise
// that carries tokens of the budget's stored reserve (region.Change.Apply),
// one round trip to the store where a Rebase and a Return took two. The
// in-process store, redisstore.Store and breaker.Store implement it.
type Rebaser interface {
	Rebase(ctx context.Context, key Key, from, to Limit, credit Tokens) (lost Tokens, err error)
}

// Pinger is implemented by stores that can tell cheaply whether they
// answer, without touching a bucket: a circuit breaker probes a store
// that failed with it (redisstore.Store sends PING).
type Pinger interface {
	Ping(ctx context.Context) error
}

// Admitter is implemented by stores that can admit some requests from
// tokens they hold in process (a regional agent's batch) without a call
// to Decide: a caller in the same process then copies neither Decide's
// arguments nor its answer through memory, which, for a decision of about
// a hundred nanoseconds, is a fair part of it. region.Store implements it.
type Admitter interface {
	// Admit gives, with a non-nil limit, the answer Decide(ctx, key, l,
	// cost, "") would: Decision{Allowed: true, Remaining: remaining,
	// Limit: *limit} and a nil error, with the same effects. *limit
	// belongs to the store, which never changes it; the caller must not
	// either. (A Limit returned by value is spilled to memory by the
	// caller with narrow stores and read back with wide loads, which
	// stall.) When it cannot, limit is nil and nothing has changed: the
	// caller then calls Declined.
	Admit(key Key, l Limit, cost Tokens) (remaining Tokens, limit *Limit)
	// Declined is Decide(ctx, key, l, cost, "") for a request Admit
	// declined, without trying again what Admit tried: the same answer.
	Declined(ctx context.Context, key Key, l Limit, cost Tokens) (Decision, error)
}

// IsUnavailable reports whether err means the store could not decide.
func IsUnavailable(err error) bool { return errors.Is(err, ErrUnavailable) }
