// Package httplimit is net/http middleware that admits each request through
// a limiter.Limiter and answers for it when it is not admitted.
//
// Identity (who is asking, on which plan) comes from an IdentityFunc: a
// header set by a trusted proxy, or an API key looked up by a function. Cost
// comes from the rules' cost table for the request's path and method, or
// from a CostFunc. The middleware works with http.ServeMux and any router
// built on net/http.
//
// Responses, with the quota headers of draft-ietf-httpapi-ratelimit-headers-10
// (RateLimit-Policy, RateLimit) and the common X-RateLimit-Limit,
// X-RateLimit-Remaining and X-RateLimit-Reset:
//
//	admitted            the handler's response, with the quota headers
//	over the limit      429, quota headers, Retry-After (whole seconds,
//	                    rounded up, at least 1), JSON {"error","policy","retry_after"}
//	cost never fits     403, no Retry-After; no store was touched
//	unknown plan denied 403
//	no identity         the rules' no_identity status (401 unless set)
//	limiter unavailable 503 with Retry-After when the rule fails closed; a
//	                    rule that fails open admits and the limiter counts it
//
// Shadow rules never reject and add no headers, so a new quota can be
// rolled out unseen by clients.
//
// A request whose fields exceed the limiter's Bounds is refused before the
// limiter is asked, with a JSON error naming the field: 431 when the field
// came from a request header (the identity, the plan, a header-derived
// descriptor value, the attempt header), 414 for a path, 400 otherwise.
package httplimit

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// Identity is who a request is from.
type Identity struct {
	// Subject identifies the caller (tenant, API key id, user); empty means
	// the request has no identity.
	Subject string
	// Plan is the caller's plan; empty means the default plan.
	Plan string
}

// IdentityFunc finds the identity of a request. A zero Identity with a nil
// error means the request has none; an error means it could not be found out
// (a lookup service down), which is answered 503.
type IdentityFunc func(r *http.Request) (Identity, error)

// TrustedHeader takes the subject and plan from request headers that a
// trusted proxy in front of this server sets (and strips from clients).
// planHeader may be empty.
func TrustedHeader(subjectHeader, planHeader string) IdentityFunc {
	return func(r *http.Request) (Identity, error) {
		id := Identity{Subject: strings.TrimSpace(r.Header.Get(subjectHeader))}
		if id.Subject == "" {
			return Identity{}, nil
		}
		if planHeader != "" {
			id.Plan = strings.TrimSpace(r.Header.Get(planHeader))
		}
		return id, nil
	}
}

// KeyLookup resolves an API key. found is false for an unknown key.
type KeyLookup func(ctx context.Context, key string) (id Identity, found bool, err error)

// APIKey reads an API key from header (for "Authorization", the token after
// "Bearer ") and resolves it with lookup. A missing or unknown key is no
// identity.
func APIKey(header string, lookup KeyLookup) IdentityFunc {
	return func(r *http.Request) (Identity, error) {
		key := strings.TrimSpace(r.Header.Get(header))
		if strings.EqualFold(header, "Authorization") {
			scheme, token, ok := strings.Cut(key, " ")
			if !ok || !strings.EqualFold(scheme, "Bearer") {
				return Identity{}, nil
			}
			key = strings.TrimSpace(token)
		}
		if key == "" {
			return Identity{}, nil
		}
		id, found, err := lookup(r.Context(), key)
		if err != nil {
			return Identity{}, fmt.Errorf("httplimit: API key lookup: %w", err)
		}
		if !found {
			return Identity{}, nil
		}
		return id, nil
	}
}

// StaticKeys is a KeyLookup over a fixed map of keys, for examples and tests.
func StaticKeys(keys map[string]Identity) KeyLookup {
	return func(_ context.Context, key string) (Identity, bool, error) {
		id, ok := keys[key]
		return id, ok, nil
	}
}

// CostFunc returns the cost of a request; 0 means the rules' cost for its
// path and method. An error is answered 400.
type CostFunc func(r *http.Request) (bucket.Tokens, error)

// HeaderCost reads the cost from a request header (as a gateway that knows a
// request's weight might set it); an absent header means the rules' cost.
func HeaderCost(header string) CostFunc {
	return func(r *http.Request) (bucket.Tokens, error) {
		v := r.Header.Get(header)
		if v == "" {
			return 0, nil
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil {
			return 0, fmt.Errorf("httplimit: %s=%q is not a number", header, v)
		}
		c, err := bucket.CostOf(f)
		if err != nil {
			return 0, fmt.Errorf("httplimit: %s=%q: %w", header, v, err)
		}
		return c, nil
	}
}

// Config configures the middleware.
type Config struct {
	// Limiter decides. Required.
	Limiter limiter.Limiter
	// Identity finds who a request is from; nil means no request has
	// identity (the rules then need shared or descriptor subjects, or
	// no_identity: default_plan).
	Identity IdentityFunc
	// Cost overrides the rules' cost; nil means the rules decide.
	Cost CostFunc
	// Rule names the rule to charge; empty means match the descriptor.
	Rule string
	// Headers adds descriptor entries from request headers: descriptor key
	// → header name.
	Headers map[string]string
	// Descriptor, when set, builds the whole descriptor instead of the
	// default (path, method, plan and Headers).
	Descriptor func(r *http.Request, id Identity) rules.Descriptor
	// AttemptHeader names a request header (such as Idempotency-Key) whose
	// value makes a client's retries of one request cost once.
	AttemptHeader string
	// NoIdentityStatus answers a request without identity when the rules
	// do not say; 401 by default.
	NoIdentityStatus int
	// Challenge is the WWW-Authenticate value sent with a 401.
	Challenge string
	// Logger records failures to decide; nil means slog.Default().
	Logger *slog.Logger
	// Bounds limits the fields of a request; zero means
	// limiter.DefaultBounds.
	Bounds limiter.Bounds
}

// DefaultConfig returns the defaults; Limiter must still be set.
func DefaultConfig() Config {
	return Config{
		NoIdentityStatus: http.StatusUnauthorized, // the conventional answer to "who are you?"
		Challenge:        `Bearer realm="api"`,    // a 401 must carry a challenge (RFC 9110 §15.5.2)
		Logger:           slog.Default(),
		Bounds:           limiter.DefaultBounds(),
	}
}

// Validate reports a missing or unusable field.
func (c Config) Validate() error {
	if c.Limiter == nil {
		return errors.New("httplimit: Config.Limiter is nil")
	}
	if c.NoIdentityStatus < 400 || c.NoIdentityStatus > 599 {
		return fmt.Errorf("httplimit: Config.NoIdentityStatus=%d must be a 4xx or 5xx status", c.NoIdentityStatus)
	}
	for k, h := range c.Headers {
		if k == "" || h == "" {
			return fmt.Errorf("httplimit: Config.Headers has an empty key or header (%q: %q)", k, h)
		}
	}
	return c.Bounds.OrDefault().Validate()
}

// Middleware returns the middleware for cfg; zero optional fields take
// DefaultConfig's values.
func Middleware(cfg Config) (func(http.Handler) http.Handler, error) {
	def := DefaultConfig()
	if cfg.NoIdentityStatus == 0 {
		cfg.NoIdentityStatus = def.NoIdentityStatus
	}
	if cfg.Challenge == "" {
		cfg.Challenge = def.Challenge
	}
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	cfg.Bounds = cfg.Bounds.OrDefault()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &middleware{cfg: cfg, headerKeys: slices.Sorted(maps.Keys(cfg.Headers))}
	m.store, _ = cfg.Limiter.(*limiter.StoreLimiter)
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { m.serve(w, r, next) })
	}, nil
}

type middleware struct {
	cfg Config
	// store is cfg.Limiter when it is a *limiter.StoreLimiter, which
	// decides in place (AllowInto) without copying the request and the
	// decision in and out; nil otherwise.
	store      *limiter.StoreLimiter
	headerKeys []string     // cfg.Headers' keys, sorted
	policies   sync.Map     // policyKey → rendered RateLimit-Policy value
	cached     atomic.Int64 // entries in policies, bounded by maxCachedPolicies
}

// maxCachedPolicies bounds the policy cache; rules define few policies, but
// reloads may change their limits.
const maxCachedPolicies = 4096

type policyKey struct {
	name         string
	limit, quota bucket.Limit
}

// policy renders the RateLimit-Policy value of d, once per policy, limit
// and quota.
func (m *middleware) policy(d *limiter.Decision) string {
	k := policyKey{d.Policy, d.Limit, d.Quota}
	if v, ok := m.policies.Load(k); ok {
		return v.(string)
	}
	v := PolicyHeader(d.Policy, d.Limit, d.Quota)
	if m.cached.Add(1) <= maxCachedPolicies {
		m.policies.Store(k, v)
	}
	return v
}

func (m *middleware) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	var id Identity
	if m.cfg.Identity != nil {
		var err error
		if id, err = m.cfg.Identity(r); err != nil {
			m.cfg.Logger.Warn("httplimit: identity unavailable", "err", err)
			w.Header().Set("Retry-After", "1")
			writeJSON(w, http.StatusServiceUnavailable, body{Error: "identity lookup unavailable", RetryAfter: 1})
			return
		}
	}
	req := limiter.Request{Subject: id.Subject, Plan: id.Plan, Rule: m.cfg.Rule, Descriptor: m.descriptor(r, id)}
	if m.cfg.Cost != nil {
		c, err := m.cfg.Cost(r)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, body{Error: err.Error()})
			return
		}
		req.Cost = c
	}
	if m.cfg.AttemptHeader != "" {
		if a := r.Header.Get(m.cfg.AttemptHeader); a != "" {
			req.AttemptID = id.Subject + "\x00" + a
		}
	}
	if err := m.cfg.Bounds.Check(req); err != nil {
		m.tooLarge(w, err)
		return
	}
	var d limiter.Decision
	var err error
	if m.store != nil {
		err = m.store.AllowInto(r.Context(), &req, &d)
	} else {
		d, err = m.cfg.Limiter.Allow(r.Context(), req)
	}
	if err != nil {
		if r.Context().Err() != nil {
			return // the client is gone
		}
		m.cfg.Logger.Error("httplimit: cannot decide", "err", err, "path", r.URL.Path)
		writeJSON(w, http.StatusInternalServerError, body{Error: "rate limit rules cannot decide this request"})
		return
	}
	if d.Allowed {
		if !d.Shadow && d.Fallback == "" && d.Limited() {
			setQuotaHeaders(w.Header(), &d, m.policy(&d))
		}
		next.ServeHTTP(w, r)
		return
	}
	m.deny(w, &d)
}

func (m *middleware) descriptor(r *http.Request, id Identity) rules.Descriptor {
	if m.cfg.Descriptor != nil {
		return m.cfg.Descriptor(r, id)
	}
	d := make(rules.Descriptor, 0, 3+len(m.cfg.Headers))
	d = append(d, rules.Entry{Key: rules.KeyPath, Value: r.URL.Path}, rules.Entry{Key: rules.KeyMethod, Value: r.Method})
	if id.Plan != "" {
		d = append(d, rules.Entry{Key: rules.KeyPlan, Value: id.Plan})
	}
	for _, k := range m.headerKeys {
		if v := r.Header.Get(m.cfg.Headers[k]); v != "" {
			d = append(d, rules.Entry{Key: k, Value: v})
		}
	}
	return d
}

// tooLarge answers a request with a field over its bound: 431 for a field
// read from a header, 414 for the path, 400 for anything else.
func (m *middleware) tooLarge(w http.ResponseWriter, err error) {
	status, msg := http.StatusBadRequest, strings.TrimPrefix(err.Error(), "limiter: ")
	var be *limiter.BoundError
	if errors.As(err, &be) {
		switch {
		case be.Field == "subject" || be.Field == "plan" || be.Field == "attempt_id":
			status = http.StatusRequestHeaderFieldsTooLarge
		case m.cfg.Descriptor == nil && be.Key == rules.KeyPath:
			status = http.StatusRequestURITooLong
		case m.cfg.Descriptor == nil && m.cfg.Headers[be.Key] != "":
			status = http.StatusRequestHeaderFieldsTooLarge
			msg += fmt.Sprintf(" (header %s)", m.cfg.Headers[be.Key])
		}
	}
	writeJSON(w, status, body{Error: "httplimit: " + msg})
}

// body is the JSON of every denial.
type body struct {
	Error      string `json:"error"`
	Policy     string `json:"policy,omitempty"`
	RetryAfter int64  `json:"retry_after"`
}

func (m *middleware) deny(w http.ResponseWriter, d *limiter.Decision) {
	h := w.Header()
	switch d.Reason {
	case limiter.ReasonOverLimit:
		if d.Limited() {
			setQuotaHeaders(h, d, m.policy(d))
		}
		ra := d.RetryAfterSeconds()
		h.Set("Retry-After", strconv.FormatInt(ra, 10))
		writeJSON(w, http.StatusTooManyRequests, body{Error: "rate limit exceeded", Policy: d.Policy, RetryAfter: ra})
	case limiter.ReasonNeverFits:
		if d.Limited() {
			h[hdrPolicy] = []string{m.policy(d)}
		}
		writeJSON(w, http.StatusForbidden, body{
			Error:  fmt.Sprintf("request cost %d exceeds the quota's burst %d and can never be admitted", d.Cost, d.Limit.Burst()),
			Policy: d.Policy,
		})
	case limiter.ReasonUnknownPlan:
		writeJSON(w, http.StatusForbidden, body{Error: fmt.Sprintf("plan %q is not known", d.Plan)})
	case limiter.ReasonNoIdentity:
		status := d.Status
		if status == 0 {
			status = m.cfg.NoIdentityStatus
		}
		if status == http.StatusUnauthorized {
			h.Set("WWW-Authenticate", m.cfg.Challenge)
		}
		writeJSON(w, status, body{Error: "request has no identity"})
	default: // ReasonUnavailable, and anything a newer limiter adds
		ra := max(d.RetryAfterSeconds(), 1)
		h.Set("Retry-After", strconv.FormatInt(ra, 10))
		writeJSON(w, http.StatusServiceUnavailable, body{Error: "rate limiter unavailable", Policy: d.Policy, RetryAfter: ra})
	}
}

func writeJSON(w http.ResponseWriter, status int, b body) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(b)
}

// Header names in canonical form, so setting them needs no canonicalizing.
const (
	hdrPolicy    = "Ratelimit-Policy"
	hdrRateLimit = "Ratelimit"
	hdrLimit     = "X-Ratelimit-Limit"
	hdrRemaining = "X-Ratelimit-Remaining"
	hdrReset     = "X-Ratelimit-Reset"
)

func setQuotaHeaders(h http.Header, d *limiter.Decision, policy string) {
	// The RateLimit item and the limit are written into one buffer and
	// made one string, which the remaining and reset values are cut from
	// too: two allocations a response (that string and the values' slice)
	// instead of one per value.
	var buf [96]byte
	b := appendSFString(buf[:0], d.Policy)
	b = append(b, ";r="...)
	r0 := len(b)
	b = strconv.AppendInt(b, int64(max(d.Remaining, 0)), 10)
	r1 := len(b)
	b = append(b, ";t="...)
	t0 := len(b)
	b = strconv.AppendInt(b, d.ResetSeconds(), 10)
	t1 := len(b)
	b = strconv.AppendInt(b, int64(d.Limit.Burst()), 10)
	all := string(b)
	v := make([]string, 5) // one allocation for the five values
	v[0], v[1], v[2], v[3], v[4] = policy, all[:t1], all[t1:], all[r0:r1], all[t0:t1]
	h[hdrPolicy], h[hdrRateLimit], h[hdrLimit], h[hdrRemaining], h[hdrReset] = v[0:1:1], v[1:2:2], v[2:3:3], v[3:4:4], v[4:5:5]
}

// RateLimitItem renders one RateLimit item: "name";r=<remaining>;t=<reset seconds>.
func RateLimitItem(d limiter.Decision) string {
	return string(AppendRateLimitItem(nil, d))
}

// AppendRateLimitItem appends RateLimitItem(d) to b, for a caller that
// builds a header value without allocating each part.
func AppendRateLimitItem(b []byte, d limiter.Decision) []byte {
	b = appendSFString(b, d.Policy)
	b = append(b, ";r="...)
	b = strconv.AppendInt(b, int64(max(d.Remaining, 0)), 10)
	b = append(b, ";t="...)
	return strconv.AppendInt(b, d.ResetSeconds(), 10)
}

// PolicyHeader renders one RateLimit-Policy item for a decision made
// under the limit in force l of the rules' quota: "name";q=<burst>;w=<seconds>
// of l. When l is a share of quota (a regional agent's allocation, or an
// emergency limit), the quota follows as the vendor parameters
// allot-global-q and allot-global-w (draft-ietf-httpapi-ratelimit-headers-10
// §3.1: other parameters are comments, prefixed by a vendor identifier):
// "name";q=6;w=60;allot-global-q=10;allot-global-w=60. A zero l (the region
// may admit nothing now) is q=0 over the quota's window.
func PolicyHeader(name string, l, quota bucket.Limit) string {
	w := l
	if l.IsZero() {
		w = quota
	}
	v := sfString(name) + ";q=" + strconv.FormatInt(int64(l.Burst()), 10) + ";w=" + strconv.FormatInt(Window(w), 10)
	if quota.IsZero() || quota == l {
		return v
	}
	return v + ";allot-global-q=" + strconv.FormatInt(int64(quota.Burst()), 10) + ";allot-global-w=" + strconv.FormatInt(Window(quota), 10)
}

// Window is the seconds a full burst takes to refill (burst × period ÷
// count), rounded up, at least 1.
func Window(l bucket.Limit) int64 {
	if l.Count() <= 0 {
		return 1
	}
	v := float64(l.Burst()) * l.Period().Seconds() / float64(l.Count())
	// Whole values computed through floats may land a hair above; do not
	// round those up a whole second.
	if r := math.Round(v); math.Abs(v-r) <= 1e-9*math.Max(1, v) {
		v = r
	}
	return max(int64(math.Ceil(v)), 1)
}

// sfString renders s as a Structured Field String (RFC 9651 §3.3.3):
// quoted, with '"' and '\' escaped; bytes outside printable ASCII become '?'.
func sfString(s string) string {
	return string(appendSFString(make([]byte, 0, len(s)+2), s))
}

// appendSFString appends sfString(s) to b.
func appendSFString(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			b = append(b, '\\', c)
		case c < 0x20 || c > 0x7e:
			b = append(b, '?')
		default:
			b = append(b, c)
		}
	}
	return append(b, '"')
}
