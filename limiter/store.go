package limiter

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/rules"
)

// Errors callers branch on.
var (
	// ErrUnknownRule: Request.Rule names no rule in force.
	ErrUnknownRule = errors.New("limiter: unknown rule")
	// ErrInvalidRequest: the request cannot be decided as given.
	ErrInvalidRequest = errors.New("limiter: invalid request")
)

// EmergencyLimitFunc returns the emergency limit of one bucket of rule r
// while the store is unavailable; normal is the limit the bucket has when
// the store is up. A regional agent divides the region's allocation by its
// live agents here.
type EmergencyLimitFunc func(r *rules.Rule, key bucket.Key, normal bucket.Limit) bucket.Limit

// RuleEmergencyLimit is the default EmergencyLimitFunc: the rule's
// on_unavailable limit when it sets one, else the normal limit.
func RuleEmergencyLimit(r *rules.Rule, _ bucket.Key, normal bucket.Limit) bucket.Limit {
	if !r.Failure.Limit.IsZero() {
		return r.Failure.Limit
	}
	return normal
}

// Config configures a StoreLimiter.
type Config struct {
	// Rules gives the rules in force; a *rules.Set, a *rules.Reloader or a
	// *rules.FileWatcher. Required.
	Rules rules.Source
	// Store holds the buckets of global- and region-scoped rules. Required.
	Store bucket.Store
	// Local holds the buckets of local-scoped rules and the emergency
	// buckets: an in-process store. Nil means a bucket.Memory on Clock.
	Local bucket.Store
	// Clock stamps events and times decisions; nil means clock.Real{}.
	Clock clock.Clock
	// EmergencyLimit sizes emergency buckets; nil means RuleEmergencyLimit.
	EmergencyLimit EmergencyLimitFunc
	// OnEvent, when set, receives every Event synchronously; it must be
	// quick and safe for concurrent use.
	OnEvent func(Event)
	// OnDecision, when set, receives every decision and how long it took,
	// for metrics; it must be quick and safe for concurrent use.
	OnDecision func(Decision, time.Duration)
	// Logger records events; nil means slog.Default().
	Logger *slog.Logger
	// LogEvery bounds logging to one record per event kind per interval
	// (the hook still sees every event); the record says how many were
	// folded into it.
	LogEvery time.Duration
	// Bounds limits the size of a request's fields; a request over them is
	// an error wrapping ErrTooLarge. The zero value means DefaultBounds.
	Bounds Bounds
}

// DefaultConfig returns a Config with every optional field set; Rules and
// Store must still be filled in.
func DefaultConfig() Config {
	return Config{
		Clock:          clock.Real{},
		EmergencyLimit: RuleEmergencyLimit,
		Logger:         slog.Default(),
		LogEvery:       time.Second, // an outage at 10k req/s must not write 10k lines a second
		Bounds:         DefaultBounds(),
	}
}

// Validate reports a missing or unusable field.
func (c Config) Validate() error {
	switch {
	case c.Rules == nil:
		return errors.New("limiter: Config.Rules is nil")
	case c.Rules.Current() == nil:
		return errors.New("limiter: Config.Rules has no rules in force")
	case c.Store == nil:
		return errors.New("limiter: Config.Store is nil")
	case c.LogEvery < 0:
		return fmt.Errorf("limiter: Config.LogEvery=%s must be ≥ 0", c.LogEvery)
	}
	return c.Bounds.OrDefault().Validate()
}

// StoreLimiter is the Limiter on a bucket.Store. It is safe for concurrent
// use.
type StoreLimiter struct {
	cfg   Config
	local bucket.Store
	// admit is Store as a bucket.Admitter, nil when it is not one.
	admit bucket.Admitter
	stats stats
	logMu sync.Mutex
	logs  map[EventKind]*logState
}

type logState struct {
	last   time.Time
	folded int
}

type stats struct {
	decisions, denied, failOpen, emergency, storeErrors, unknownPlan, noIdentity, shadowDenied, neverFits atomic.Int64
}

// Stats counts what a StoreLimiter has done since it was made.
type Stats struct {
	Decisions    int64
	Denied       int64
	FailOpen     int64 // admitted because the store was unavailable and the rule fails open
	Emergency    int64 // decided by an emergency bucket
	StoreErrors  int64
	UnknownPlan  int64
	NoIdentity   int64
	ShadowDenied int64 // would have been denied, admitted by a shadow rule
	NeverFits    int64
}

var _ Limiter = (*StoreLimiter)(nil)

// New returns a StoreLimiter. Zero optional fields take DefaultConfig's
// values.
func New(cfg Config) (*StoreLimiter, error) {
	def := DefaultConfig()
	if cfg.Clock == nil {
		cfg.Clock = def.Clock
	}
	if cfg.EmergencyLimit == nil {
		cfg.EmergencyLimit = def.EmergencyLimit
	}
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	if cfg.LogEvery == 0 {
		cfg.LogEvery = def.LogEvery
	}
	cfg.Bounds = cfg.Bounds.OrDefault()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &StoreLimiter{cfg: cfg, local: cfg.Local, logs: map[EventKind]*logState{}}
	l.admit, _ = cfg.Store.(bucket.Admitter)
	if l.local == nil {
		l.local = bucket.NewMemory(bucket.MemoryOptions{Clock: cfg.Clock})
	}
	return l, nil
}

// Rules returns the rules in force.
func (l *StoreLimiter) Rules() *rules.Set { return l.cfg.Rules.Current() }

// Stats returns the counters.
func (l *StoreLimiter) Stats() Stats {
	s := &l.stats
	return Stats{
		Decisions: s.decisions.Load(), Denied: s.denied.Load(), FailOpen: s.failOpen.Load(),
		Emergency: s.emergency.Load(), StoreErrors: s.storeErrors.Load(), UnknownPlan: s.unknownPlan.Load(),
		NoIdentity: s.noIdentity.Load(), ShadowDenied: s.shadowDenied.Load(), NeverFits: s.neverFits.Load(),
	}
}

// Allow implements Limiter.
func (l *StoreLimiter) Allow(ctx context.Context, req Request) (d Decision, err error) {
	err = l.AllowInto(ctx, &req, &d)
	return d, err
}

// AllowInto is Allow reading the request in place and writing the
// decision into *d, which it overwrites whole: the same decision, error,
// events, counters and hooks as Allow(ctx, *req). It neither modifies nor
// keeps req or d.
//
// A Request is some 100 bytes and a Decision some 300: a caller in the
// same process as an embedded agent, whose decision takes little more than
// a hundred nanoseconds, spends a fair part of it copying them into and
// out of Allow. The saving is for a caller holding the *StoreLimiter
// itself: a call through an interface moves its pointer arguments to the
// heap, which costs more than the copies.
func (l *StoreLimiter) AllowInto(ctx context.Context, req *Request, d *Decision) error {
	if l.cfg.OnDecision != nil {
		return l.allowTimed(ctx, req, d)
	}
	if err := l.allow(ctx, req, d); err != nil {
		return err
	}
	l.count(d)
	return nil
}

// allowTimed is AllowInto with a decision hook, which it times. The clock
// is read only for a hook (on some machines a read costs as much as an
// in-process decision), and out of line: the hook's copy of the decision
// made AllowInto's frame some 600 bytes, spilled to on every call.
func (l *StoreLimiter) allowTimed(ctx context.Context, req *Request, d *Decision) error {
	start := l.cfg.Clock.Now()
	if err := l.allow(ctx, req, d); err != nil {
		return err
	}
	l.count(d)
	l.cfg.OnDecision(*d, l.cfg.Clock.Now().Sub(start))
	return nil
}

// count counts a decision made.
func (l *StoreLimiter) count(d *Decision) {
	l.stats.decisions.Add(1)
	if !d.Allowed {
		l.stats.denied.Add(1)
	}
}

// allow decides req into d, which it overwrites whole: the decision is
// some 300 bytes, and filling it in place saves copying it at each return,
// as reading the request in place saves copying its 100.
func (l *StoreLimiter) allow(ctx context.Context, req *Request, d *Decision) error {
	*d = Decision{}
	if req.Cost < 0 {
		return fmt.Errorf("%w: cost=%d must be ≥ 0", ErrInvalidRequest, req.Cost)
	}
	if err := l.cfg.Bounds.check(req); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("limiter: %w", err)
	}
	rs := l.cfg.Rules.Current()
	d.RulesVersion = rs.Version()
	var r *rules.Rule
	if req.Rule != "" {
		var ok bool
		if r, ok = rs.Rule(req.Rule); !ok {
			return fmt.Errorf("%w: %q is not in rules version %s", ErrUnknownRule, req.Rule, rs.Version())
		}
	} else {
		var ok bool
		if r, ok = rs.Match(req.Descriptor); !ok {
			d.Allowed, d.Reason = true, ReasonNoRule
			return nil
		}
	}
	d.Rule, d.Shadow = r.Name, r.Shadow
	// What the common way out passes on is kept in locals as well as in
	// d: reading it back from d costs a load per word, after a store.
	cost := req.Cost
	if cost == 0 {
		cost = r.CostOf(req.Descriptor)
	}
	d.Cost = cost

	// A fixed rule's limit is the same on every plan: its plan is not
	// looked up.
	plan := req.Plan
	if plan == "" && r.Source == rules.FromPlan {
		plan, _ = req.Descriptor.Get(rs.PlanKey())
	}
	subject, ok := r.SubjectOf(req.Descriptor, req.Subject)
	if !ok {
		ni := rs.NoIdentity()
		l.event(Event{Kind: EventNoIdentity, Rule: r.Name, RulesVersion: d.RulesVersion})
		l.stats.noIdentity.Add(1)
		if ni.Action == rules.DenyNoIdentity {
			d.Reason, d.Status = ReasonNoIdentity, ni.Status
			l.deny(d)
			return nil
		}
		subject, plan = rules.AnonymousSubject, ""
	}

	res := rs.Resolve(r, plan)
	// d.Limit is the quota too until a store says otherwise: it is written
	// below only on the ways out that no store's answer overwrites, not
	// on the common one.
	d.Plan, d.Quota = res.Plan, res.Limit
	policy := r.Name
	if r.Source == rules.FromPlan {
		policy = res.Plan
	}
	d.Policy = policy
	if res.Unknown {
		l.stats.unknownPlan.Add(1)
		l.event(Event{Kind: EventUnknownPlan, Rule: r.Name, Plan: res.Plan, Subject: subject, RulesVersion: d.RulesVersion})
		switch res.Action {
		case rules.UnknownPlanAllow:
			d.Allowed, d.Reason, d.Limit, d.Quota = true, ReasonUnknownPlan, bucket.Limit{}, bucket.Limit{}
			return nil
		case rules.UnknownPlanDeny:
			d.Reason, d.Limit, d.Quota = ReasonUnknownPlan, bucket.Limit{}, bucket.Limit{}
			l.deny(d)
			return nil
		default:
			// The default plan's quota, in a bucket of its own.
			d.Policy = rs.DefaultPlan().Name
			subject = rules.UnknownPlanPrefix + subject
		}
	}
	key := bucket.Key{Rule: r.Name, Subject: subject}
	d.Key = key

	if !d.Quota.Fits(cost) {
		// Check says why, and Fits spares the limit's copy into it when
		// there is nothing to say.
		d.Limit = d.Quota
		err := bucket.Check(d.Limit, d.Cost)
		if errors.Is(err, bucket.ErrNeverFits) {
			l.neverFits(d)
			return nil
		}
		return fmt.Errorf("%w: rule %q: %w", ErrInvalidRequest, r.Name, err)
	}

	if l.admit != nil && req.AttemptID == "" && r.Scope != rules.ScopeLocal {
		// What Decide would answer from tokens the store holds, returned
		// in registers rather than copied through memory.
		if rem, lim := l.admit.Admit(key, d.Quota, cost); lim != nil {
			d.Remaining, d.Limit = rem, *lim
			d.Allowed, d.Reason = true, ReasonOK
			return nil
		}
	}
	d.Limit = d.Quota
	var bd bucket.Decision
	var err error
	switch {
	case r.Scope == rules.ScopeLocal:
		bd, err = l.local.Decide(ctx, d.Key, d.Limit, d.Cost, req.AttemptID)
	case l.admit != nil && req.AttemptID == "":
		bd, err = l.admit.Declined(ctx, d.Key, d.Limit, d.Cost)
	default:
		bd, err = l.cfg.Store.Decide(ctx, d.Key, d.Limit, d.Cost, req.AttemptID)
	}
	switch {
	case err == nil:
		l.fromBucket(d, &bd)
		return nil
	case errors.Is(err, bucket.ErrNeverFits):
		// A store may judge by a smaller limit than the rule's (an agent's
		// share of it).
		l.neverFits(d)
		return nil
	case errors.Is(err, bucket.ErrInvalidLimit) || errors.Is(err, bucket.ErrInvalidCost):
		return fmt.Errorf("%w: rule %q: %w", ErrInvalidRequest, r.Name, err)
	}
	if ctxErr := ctx.Err(); ctxErr != nil && !errors.Is(err, bucket.ErrUnavailable) {
		return fmt.Errorf("limiter: rule %q: %w", r.Name, err)
	}
	// Anything else the store could not answer is an outage: the failure
	// policy decides, never an error to the caller.
	l.stats.storeErrors.Add(1)
	l.event(Event{Kind: EventStoreError, Rule: r.Name, Plan: d.Plan, Subject: subject, Err: err, RulesVersion: d.RulesVersion})
	return l.fallback(ctx, r, d, req)
}

// fallback applies r's failure policy to a decision the store could not make.
func (l *StoreLimiter) fallback(ctx context.Context, r *rules.Rule, d *Decision, req *Request) error {
	d.Fallback = r.Failure.Policy
	switch r.Failure.Policy {
	case rules.FailOpen:
		l.stats.failOpen.Add(1)
		l.event(Event{Kind: EventFailOpen, Rule: r.Name, Plan: d.Plan, Subject: d.Key.Subject, Reason: ReasonUnavailable, RulesVersion: d.RulesVersion})
		d.Allowed, d.Reason = true, ReasonUnavailable
		return nil
	case rules.Emergency:
		el := l.cfg.EmergencyLimit(r, d.Key, d.Limit)
		l.stats.emergency.Add(1)
		l.event(Event{Kind: EventEmergency, Rule: r.Name, Plan: d.Plan, Subject: d.Key.Subject, RulesVersion: d.RulesVersion})
		d.Limit = el
		bd, err := l.local.Decide(ctx, d.Key, el, d.Cost, req.AttemptID)
		switch {
		case err == nil:
			l.fromBucket(d, &bd)
			return nil
		case errors.Is(err, bucket.ErrNeverFits):
			l.neverFits(d)
			return nil
		}
		// An unusable emergency limit (a zero share) fails closed.
		l.event(Event{Kind: EventStoreError, Rule: r.Name, Plan: d.Plan, Subject: d.Key.Subject, Err: err, RulesVersion: d.RulesVersion})
	}
	d.Reason = ReasonUnavailable
	d.RetryAfter = time.Second
	l.deny(d)
	return nil
}

// fromBucket fills d from the store's decision, whose Limit is the limit
// in force: the rule's, or the share of it the store enforces.
func (l *StoreLimiter) fromBucket(d *Decision, bd *bucket.Decision) {
	d.Remaining, d.RetryAfter, d.ResetAfter, d.Limit = bd.Remaining, bd.RetryAfter, bd.ResetAfter, bd.Limit
	if bd.Allowed {
		d.Allowed, d.Reason = true, ReasonOK
		return
	}
	d.Reason = ReasonOverLimit
	l.deny(d)
}

func (l *StoreLimiter) neverFits(d *Decision) {
	l.stats.neverFits.Add(1)
	l.event(Event{Kind: EventNeverFits, Rule: d.Rule, Plan: d.Plan, Subject: d.Key.Subject, RulesVersion: d.RulesVersion})
	d.Reason, d.RetryAfter = ReasonNeverFits, 0
	l.deny(d)
}

// deny makes d a denial, or an admission by a shadow rule.
func (l *StoreLimiter) deny(d *Decision) {
	d.Allowed = false
	if d.Shadow {
		l.stats.shadowDenied.Add(1)
		l.event(Event{Kind: EventShadowDeny, Rule: d.Rule, Plan: d.Plan, Subject: d.Key.Subject, Reason: d.Reason, RulesVersion: d.RulesVersion})
		d.Allowed = true
	}
}

// event sends e to the hook and, at most once per LogEvery per kind, to the
// log.
func (l *StoreLimiter) event(e Event) {
	e.Time = l.cfg.Clock.Now()
	if l.cfg.OnEvent != nil {
		l.cfg.OnEvent(e)
	}
	l.logMu.Lock()
	st := l.logs[e.Kind]
	if st == nil {
		st = &logState{}
		l.logs[e.Kind] = st
	}
	if !st.last.IsZero() && e.Time.Sub(st.last) < l.cfg.LogEvery && e.Time.Sub(st.last) >= 0 {
		st.folded++
		l.logMu.Unlock()
		return
	}
	folded := st.folded
	st.last, st.folded = e.Time, 0
	l.logMu.Unlock()

	level := slog.LevelInfo
	switch e.Kind {
	case EventStoreError, EventFailOpen, EventEmergency:
		level = slog.LevelWarn
	case EventNoIdentity, EventNeverFits:
		level = slog.LevelDebug
	}
	attrs := []slog.Attr{
		slog.String("event", string(e.Kind)),
		slog.String("rule", e.Rule),
		slog.String("rules_version", e.RulesVersion),
	}
	if e.Plan != "" {
		attrs = append(attrs, slog.String("plan", e.Plan))
	}
	if e.Reason != "" {
		attrs = append(attrs, slog.String("reason", string(e.Reason)))
	}
	if e.Err != nil {
		attrs = append(attrs, slog.String("err", e.Err.Error()))
	}
	if folded > 0 {
		attrs = append(attrs, slog.Int("folded", folded))
	}
	l.cfg.Logger.LogAttrs(context.Background(), level, "limiter: "+string(e.Kind), attrs...)
}
