// Package limiter is the one interface a gateway calls to admit a request:
// Allow(ctx, Request) → Decision. HTTP middleware, the Envoy rate limit
// service, the project's own gRPC API and the gRPC interceptor all sit on it.
//
// StoreLimiter, the implementation here, resolves a request against the
// rules in force (rule, subject, plan, cost), then charges one bucket in a
// bucket.Store keyed bucket.Key{Rule: rule name, Subject: subject}. It does
// not know what the store is: the in-process bucket.Memory, redisstore.Store
// (exact within a region), or a regional agent that substitutes its leased
// share of the global budget. When the store answers bucket.ErrUnavailable
// the rule's failure policy decides: fail closed (deny), fail open (admit
// and count), or an emergency limit enforced in process, whose size a
// function supplies so that an agent can divide it among the live agents of
// its region.
//
// What a denial means is in Decision.Reason; nothing here writes HTTP or
// gRPC. Events that operators must see (unknown plans, missing identity,
// store errors, fallbacks, shadow denials) go to a hook and to log/slog.
package limiter

import (
	"context"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Limiter admits or denies requests. Implementations are safe for
// concurrent use.
type Limiter interface {
	// Allow decides one request. The error is non-nil only for a request
	// that cannot be decided as given (a negative cost, a rule name that does
	// not exist, a canceled context); a store outage is a Decision with
	// ReasonUnavailable or a fallback, never an error.
	Allow(ctx context.Context, req Request) (Decision, error)
}

// Request is one request to admit.
type Request struct {
	// Subject is the caller's identity (tenant, API key, user). Rules whose
	// subject is descriptor keys or shared ignore it. Empty means the
	// request has no identity.
	Subject string
	// Plan is the subject's plan. Empty means: the descriptor's plan entry
	// (the rules' plan_key), else the default plan.
	Plan string
	// Rule names the rule to charge. Empty means: the first rule matching
	// Descriptor.
	Rule string
	// Descriptor describes the request for matching and cost tables.
	Descriptor rules.Descriptor
	// Cost is the tokens to charge; 0 means the rule's cost for Descriptor.
	Cost bucket.Tokens
	// AttemptID makes retries of one request idempotent in the store.
	AttemptID string
}

// Reason says why a decision came out as it did.
type Reason string

// Reasons. Only ReasonOK and ReasonNoRule come with Allowed on their own;
// the others deny unless a shadow rule, fail open, or an explicit allow of
// unknown plans admitted the request anyway.
const (
	ReasonOK Reason = "ok"
	// ReasonOverLimit: the bucket has too few tokens now; RetryAfter says
	// when it will have enough.
	ReasonOverLimit Reason = "over-limit"
	// ReasonNeverFits: the cost exceeds the burst, so waiting cannot help.
	// No store was touched.
	ReasonNeverFits Reason = "can-never-fit"
	// ReasonUnknownPlan: the plan is not in the rules and unknown_plan is
	// deny (or allow, with Allowed set).
	ReasonUnknownPlan Reason = "unknown-plan"
	// ReasonNoIdentity: the request has no subject and no_identity is deny.
	ReasonNoIdentity Reason = "no-identity"
	// ReasonUnavailable: the store is unavailable and the rule fails closed
	// (or fails open, with Allowed set).
	ReasonUnavailable Reason = "unavailable"
	// ReasonNoRule: no rule matches the descriptor; the request is allowed
	// without limit, since the rules do not cover it.
	ReasonNoRule Reason = "no-rule"
)

// Decision is the outcome of Allow.
type Decision struct {
	Allowed bool
	Reason  Reason
	// Remaining is the whole tokens left in the bucket after the decision.
	Remaining bucket.Tokens
	// RetryAfter is how long until a request of the same cost could pass;
	// 0 when allowed or when waiting cannot help.
	RetryAfter time.Duration
	// ResetAfter is how long until the bucket is full again.
	ResetAfter time.Duration
	// Limit is the limit in force: the one the request was judged against.
	// It is Quota, or the share of it the store enforces (a regional
	// agent's allocation, zero when the region may admit nothing now), or
	// the emergency limit of a rule whose store was unavailable.
	// Remaining, RetryAfter and ResetAfter are about it.
	Limit bucket.Limit
	// Quota is the quota the rules give the request, before any share;
	// zero when no limit applied (no rule, no identity, unknown plan denied
	// or allowed).
	Quota bucket.Limit
	// Policy names the quota for clients: the plan for a plan rule, else the
	// rule. It is the name in the RateLimit-Policy header.
	Policy string
	// Rule and Plan are the rule and the plan that applied.
	Rule string
	Plan string
	// Key is the bucket charged (or that would have been).
	Key bucket.Key
	// Cost is the tokens the request cost.
	Cost bucket.Tokens
	// Shadow is set when the rule is in shadow mode: Allowed is then always
	// true and Reason says what would have happened.
	Shadow bool
	// Fallback is the failure policy applied when the store was
	// unavailable; empty otherwise.
	Fallback rules.FailurePolicy
	// Status is the HTTP status the rules ask for this denial (no_identity's
	// status); 0 lets the transport choose.
	Status int
	// RulesVersion is the version of the rules the decision was made under.
	RulesVersion string
}

// RetryAfterSeconds rounds RetryAfter up to whole seconds, never below 1
// for a denial that waiting can cure (over limit, unavailable), as HTTP's
// Retry-After needs. It is 0 for an allowed request and for a denial that
// waiting cannot cure.
func (d Decision) RetryAfterSeconds() int64 {
	if d.Allowed {
		return 0
	}
	switch d.Reason {
	case ReasonOverLimit, ReasonUnavailable:
		return max(ceilSeconds(d.RetryAfter), 1)
	}
	return 0
}

// ResetSeconds rounds ResetAfter up to whole seconds.
func (d Decision) ResetSeconds() int64 { return ceilSeconds(d.ResetAfter) }

// Limited reports whether a quota applied, so quota headers make sense.
func (d Decision) Limited() bool { return !d.Quota.IsZero() }

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Second - 1) / time.Second)
}

// EventKind classifies an Event.
type EventKind string

// Event kinds.
const (
	EventUnknownPlan EventKind = "unknown-plan"
	EventNoIdentity  EventKind = "no-identity"
	EventStoreError  EventKind = "store-error"
	EventFailOpen    EventKind = "fail-open"
	EventEmergency   EventKind = "emergency"
	EventShadowDeny  EventKind = "shadow-deny"
	EventNeverFits   EventKind = "can-never-fit"
)

// Event is something operators must be able to see and count.
type Event struct {
	Kind         EventKind
	Time         time.Time
	Rule         string
	Plan         string
	Subject      string
	Reason       Reason
	Err          error
	RulesVersion string
}
