// Package rls serves Envoy's rate limit service v3
// (envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit) on a
// limiter.Limiter, so that Envoy, Istio and Envoy Gateway use allot as
// they would any external rate limit service.
//
// Each descriptor of a request is one limiter request: its entries are the
// rules' descriptor, matched to a rule as usual; the value of the subject
// key (Config.SubjectKey) is the identity unless the rule builds its subject
// from other keys; hits_addend — the descriptor's, else the request's — is
// the cost, and when neither is set the rules' cost applies. Statuses come
// back in request order with current_limit, limit_remaining and
// duration_until_reset. overall_code is OVER_LIMIT when any descriptor is
// denied and OK otherwise, never UNKNOWN. response_headers_to_add carries
// RateLimit-Policy and RateLimit (draft-ietf-httpapi-ratelimit-headers-10)
// for every limited descriptor, and X-RateLimit-* and Retry-After for the
// most restrictive one, so Envoy forwards them to the client. When over the
// limit, raw_body carries the same JSON as the HTTP middleware's 429
// ({"error","policy","retry_after"}). Envoy answers every denial with its
// own over-limit status (429 unless configured), so the finer statuses of
// the HTTP middleware (403, 401, 503) are not available through it.
//
// Descriptors are charged in order and a later denial does not refund an
// earlier admission, as in Envoy's own reference service. A descriptor
// limit override (descriptor.limit) is ignored: the rules decide limits.
// Negative hits (is_negative_hits) charge nothing and report OK.
//
// A request for a domain the rules do not serve (another one, or none) is
// logged once per domain and counted in allot_rls_unmatched_domain_total
// with a bounded label set; Config.UnknownDomain says whether it is admitted
// without limits (the default) or denied. Requests over the limiter's Bounds
// or with more than MaxDescriptors descriptors are INVALID_ARGUMENT naming
// the descriptor, the entry and the field.
package rls

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// ServiceName is the gRPC service name, as health checks know it.
const ServiceName = "envoy.service.ratelimit.v3.RateLimitService"

// MaxDescriptors is the default bound on the descriptors of one request.
const MaxDescriptors = 64

// DomainAction says what happens to a request for a domain the rules do not
// serve.
type DomainAction string

// Domain actions.
const (
	// AllowUnknownDomain answers OK without limits: no rule covers the
	// request.
	AllowUnknownDomain DomainAction = "allow"
	// DenyUnknownDomain answers OVER_LIMIT for every descriptor, so a
	// mistyped domain in Envoy's configuration cannot switch limiting off.
	DenyUnknownDomain DomainAction = "deny"
)

// ParseDomainAction reads "allow" or "deny".
func ParseDomainAction(s string) (DomainAction, error) {
	switch a := DomainAction(s); a {
	case AllowUnknownDomain, DenyUnknownDomain:
		return a, nil
	}
	return "", fmt.Errorf("rls: unknown-domain action %q: want allow or deny", s)
}

// Config configures a Server.
type Config struct {
	// Limiter decides. Required.
	Limiter limiter.Limiter
	// Rules, when set, restricts the server to the rules' domain: a request
	// for another domain (or none) is unmatched, and UnknownDomain decides
	// it. Rules without a domain serve every domain.
	Rules rules.Source
	// UnknownDomain is what an unmatched domain gets; empty means
	// AllowUnknownDomain.
	UnknownDomain DomainAction
	// SubjectKey is the descriptor key whose value is the request's
	// identity.
	SubjectKey string
	// Bounds limits each descriptor as the limiter does; zero means
	// limiter.DefaultBounds.
	Bounds limiter.Bounds
	// MaxDescriptors bounds the descriptors of one request; 0 means
	// MaxDescriptors.
	MaxDescriptors int
	// Logger records requests that cannot be decided and unmatched
	// domains; nil means slog.Default().
	Logger *slog.Logger
	// Clock times the logging of unmatched domains; nil means clock.Real{}.
	Clock clock.Clock
}

// DefaultConfig returns the defaults; Limiter must still be set.
func DefaultConfig() Config {
	return Config{
		SubjectKey: rules.KeySubject, Logger: slog.Default(), Clock: clock.Real{},
		UnknownDomain:  AllowUnknownDomain, // as before: an unmatched domain is logged and counted, not refused
		Bounds:         limiter.DefaultBounds(),
		MaxDescriptors: MaxDescriptors,
	}
}

// Validate reports a missing field.
func (c Config) Validate() error {
	if c.Limiter == nil {
		return errors.New("rls: Config.Limiter is nil")
	}
	if c.SubjectKey == "" {
		return errors.New("rls: Config.SubjectKey is empty")
	}
	if _, err := ParseDomainAction(string(c.UnknownDomain)); err != nil {
		return err
	}
	if c.MaxDescriptors <= 0 {
		return fmt.Errorf("rls: Config.MaxDescriptors=%d must be > 0", c.MaxDescriptors)
	}
	return c.Bounds.Validate()
}

// Server implements rlsv3.RateLimitServiceServer.
type Server struct {
	rlsv3.UnimplementedRateLimitServiceServer
	cfg     Config
	domains domainLog
	// policies holds rendered RateLimit-Policy values by policyKey;
	// cached counts them, bounded by maxCachedPolicies.
	policies sync.Map
	cached   atomic.Int64
	// unmatched counts requests for unmatched domains by kind (0 empty, 1
	// unknown) and action (0 allowed, 1 denied).
	unmatched [2][2]atomic.Int64
}

var _ rlsv3.RateLimitServiceServer = (*Server)(nil)

// New returns a Server; zero optional fields take DefaultConfig's values.
func New(cfg Config) (*Server, error) {
	def := DefaultConfig()
	if cfg.SubjectKey == "" {
		cfg.SubjectKey = def.SubjectKey
	}
	if cfg.Logger == nil {
		cfg.Logger = def.Logger
	}
	if cfg.Clock == nil {
		cfg.Clock = def.Clock
	}
	if cfg.UnknownDomain == "" {
		cfg.UnknownDomain = def.UnknownDomain
	}
	if cfg.MaxDescriptors == 0 {
		cfg.MaxDescriptors = def.MaxDescriptors
	}
	cfg.Bounds = cfg.Bounds.OrDefault()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Server{cfg: cfg, domains: domainLog{seen: map[string]bool{}}}, nil
}

// Register registers s on g and marks it serving in hs, when hs is non-nil.
func Register(g grpc.ServiceRegistrar, s *Server, hs *health.Server) {
	rlsv3.RegisterRateLimitServiceServer(g, s)
	if hs != nil {
		hs.SetServingStatus(ServiceName, healthpb.HealthCheckResponse_SERVING)
	}
}

// ShouldRateLimit implements the Envoy rate limit service.
func (s *Server) ShouldRateLimit(ctx context.Context, req *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	if n := len(req.GetDescriptors()); n > s.cfg.MaxDescriptors {
		return nil, status.Errorf(codes.InvalidArgument, "rls: descriptors has %d entries, more than the %d allowed", n, s.cfg.MaxDescriptors)
	}
	otherDomain := false
	if s.cfg.Rules != nil {
		if d := s.cfg.Rules.Current().Domain(); d != "" && d != req.GetDomain() {
			otherDomain = true
			if s.unmatchedDomain(d, req.GetDomain()) {
				return denyAll(req), nil
			}
		}
	}
	// The answer is allocated in one piece (its statuses too, for a request
	// of one descriptor), and the limiter's request is filled in one
	// descriptor at a time.
	n := len(req.GetDescriptors())
	a := &answer{}
	resp := &a.resp
	resp.OverallCode = rlsv3.RateLimitResponse_OK
	parts := a.one[:]
	resp.Statuses = a.onePtr[:]
	if n != 1 {
		parts = make([]statusParts, n)
		resp.Statuses = make([]*rlsv3.RateLimitResponse_DescriptorStatus, n)
	}
	var dbuf [4]limiter.Decision
	decisions := dbuf[:0]
	var lr limiter.Request
	for i, desc := range req.GetDescriptors() {
		st := &parts[i].status
		st.Code = rlsv3.RateLimitResponse_OK
		resp.Statuses[i] = st
		if otherDomain || desc.GetIsNegativeHits() {
			continue
		}
		if err := s.request(i, req, desc, &lr); err != nil {
			return nil, err
		}
		d, err := s.cfg.Limiter.Allow(ctx, lr)
		if err != nil {
			if ctx.Err() != nil {
				return nil, status.FromContextError(ctx.Err()).Err()
			}
			s.cfg.Logger.Error("rls: cannot decide", "domain", req.GetDomain(), "descriptor", i, "err", err)
			return nil, status.Errorf(codes.InvalidArgument, "rls: descriptor %d (%s): %v", i, lr.Descriptor, err)
		}
		decisions = append(decisions, d)
		fill(&parts[i], d)
		if st.Code == rlsv3.RateLimitResponse_OVER_LIMIT {
			resp.OverallCode = rlsv3.RateLimitResponse_OVER_LIMIT
		}
	}
	resp.ResponseHeadersToAdd = s.headers(a, decisions, resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT)
	if resp.OverallCode == rlsv3.RateLimitResponse_OVER_LIMIT {
		resp.RawBody = body(decisions)
	}
	return resp, nil
}

// answer is a response and the messages it points to, allocated as one:
// the status of a request of one descriptor, and the headers.
type answer struct {
	resp    rlsv3.RateLimitResponse
	one     [1]statusParts
	onePtr  [1]*rlsv3.RateLimitResponse_DescriptorStatus
	headers [maxHeaders]corev3.HeaderValue
	hPtrs   [maxHeaders]*corev3.HeaderValue
}

// maxHeaders is the most headers an answer adds: RateLimit-Policy,
// RateLimit, X-RateLimit-Limit, -Remaining, -Reset, Retry-After and
// Content-Type.
const maxHeaders = 7

// statusParts is a descriptor's status and the messages it points to,
// allocated as one.
type statusParts struct {
	status rlsv3.RateLimitResponse_DescriptorStatus
	limit  rlsv3.RateLimitResponse_RateLimit
	reset  durationpb.Duration
}

// body is the JSON Envoy sends with its over-limit reply, the same shape as
// the HTTP middleware's: the first denial's policy and the longest wait.
func body(ds []limiter.Decision) []byte {
	var b struct {
		Error      string `json:"error"`
		Policy     string `json:"policy,omitempty"`
		RetryAfter int64  `json:"retry_after"`
	}
	for _, d := range ds {
		if d.Allowed {
			continue
		}
		if b.Error == "" {
			b.Error, b.Policy = reasonText[d.Reason], d.Policy
			if b.Error == "" {
				b.Error = string(d.Reason)
			}
		}
		b.RetryAfter = max(b.RetryAfter, d.RetryAfterSeconds())
	}
	out, _ := json.Marshal(b)
	return out
}

var reasonText = map[limiter.Reason]string{
	limiter.ReasonOverLimit:   "rate limit exceeded",
	limiter.ReasonNeverFits:   "request cost exceeds the quota's burst and can never be admitted",
	limiter.ReasonUnknownPlan: "plan is not known",
	limiter.ReasonNoIdentity:  "request has no identity",
	limiter.ReasonUnavailable: "rate limiter unavailable",
}

// request turns descriptor i into the limiter request lr, reusing its
// descriptor's memory.
func (s *Server) request(i int, req *rlsv3.RateLimitRequest, desc *rlcommon.RateLimitDescriptor, lr *limiter.Request) error {
	d := lr.Descriptor[:0]
	if n := len(desc.GetEntries()); cap(d) < n {
		d = make(rules.Descriptor, 0, n)
	}
	*lr = limiter.Request{Descriptor: d}
	for j, e := range desc.GetEntries() {
		if e.GetKey() == "" {
			return status.Errorf(codes.InvalidArgument, "rls: descriptor %d entry %d has an empty key", i, j)
		}
		lr.Descriptor = append(lr.Descriptor, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	lr.Subject, _ = lr.Descriptor.Get(s.cfg.SubjectKey)
	if err := s.cfg.Bounds.Check(*lr); err != nil {
		return status.Errorf(codes.InvalidArgument, "rls: descriptor %d: %s", i, strings.TrimPrefix(err.Error(), "limiter: "))
	}
	var hits uint64
	switch {
	case desc.GetHitsAddend() != nil:
		hits = desc.GetHitsAddend().GetValue()
	case req.GetHitsAddend() > 0:
		hits = uint64(req.GetHitsAddend())
	}
	if hits > 0 {
		c, err := bucket.CostOf(float64(hits))
		if err != nil || uint64(c) != hits {
			return status.Errorf(codes.InvalidArgument, "rls: descriptor %d (%s): hits_addend=%d is not a usable cost", i, lr.Descriptor, hits)
		}
		lr.Cost = c
	}
	return nil
}

// fill sets a descriptor status from a decision; its limit and reset are
// the status's own parts.
func fill(p *statusParts, d limiter.Decision) {
	st := &p.status
	if !d.Allowed {
		st.Code = rlsv3.RateLimitResponse_OVER_LIMIT
	}
	if !d.Limited() || d.Shadow || (d.Allowed && d.Fallback != "") {
		return
	}
	st.CurrentLimit = currentLimit(&p.limit, d.Policy, d.Limit, d.Quota)
	st.LimitRemaining = uint32(min(max(int64(d.Remaining), 0), math.MaxUint32))
	// durationpb.New's arithmetic, into the status's own Duration.
	p.reset.Seconds, p.reset.Nanos = int64(d.ResetAfter/time.Second), int32(d.ResetAfter%time.Second)
	st.DurationUntilReset = &p.reset
}

// currentLimit expresses the limit in force l in Envoy's units, in rl:
// count per unit, with a multiplier for periods such as 10 minutes. A zero l
// (a region that may admit nothing now) is 0 per the quota's period.
func currentLimit(rl *rlsv3.RateLimitResponse_RateLimit, name string, l, quota bucket.Limit) *rlsv3.RateLimitResponse_RateLimit {
	rl.Name = name
	rl.RequestsPerUnit = uint32(min(int64(l.Count()), math.MaxUint32))
	p := l.Period()
	if l.IsZero() {
		p = quota.Period()
	}
	for _, u := range [...]struct {
		d    time.Duration
		unit rlsv3.RateLimitResponse_RateLimit_Unit
	}{
		{24 * time.Hour, rlsv3.RateLimitResponse_RateLimit_DAY},
		{time.Hour, rlsv3.RateLimitResponse_RateLimit_HOUR},
		{time.Minute, rlsv3.RateLimitResponse_RateLimit_MINUTE},
		{time.Second, rlsv3.RateLimitResponse_RateLimit_SECOND},
	} {
		if p%u.d == 0 {
			rl.Unit = u.unit
			if m := p / u.d; m != 1 {
				rl.UnitMultiplier = wrapperspb.UInt32(uint32(min(int64(m), math.MaxUint32)))
			}
			return rl
		}
	}
	// A sub-second period: scale to a rate per second, rounded down.
	rl.Unit = rlsv3.RateLimitResponse_RateLimit_SECOND
	rl.RequestsPerUnit = uint32(min(l.Rate(), math.MaxUint32))
	return rl
}

// headers lists the quota of every limited descriptor in RateLimit-Policy
// and RateLimit, and the most restrictive one in X-RateLimit-* and
// Retry-After; an answer over the limit adds the body's Content-Type. The
// values are written into one string, the headers are a's own.
func (s *Server) headers(a *answer, ds []limiter.Decision, overLimit bool) []*corev3.HeaderValue {
	type header struct {
		key        string
		start, end int // of the value in buf
	}
	var (
		hs    [maxHeaders]header
		nh    int
		buf   = make([]byte, 0, 128)
		worst *limiter.Decision
		ibuf  [4]int
		items = ibuf[:0] // indexes of ds whose policy is listed, each policy once
	)
	for i := range ds {
		d := &ds[i]
		if !d.Limited() || d.Shadow || (d.Allowed && d.Fallback != "") {
			continue
		}
		if !slices.ContainsFunc(items, func(j int) bool { return ds[j].Policy == d.Policy }) {
			items = append(items, i)
		}
		if worst == nil || moreRestrictive(d, worst) {
			worst = d
		}
	}
	// end records that the value of key runs from start to the end of buf.
	end := func(key string, start int) {
		hs[nh] = header{key, start, len(buf)}
		nh++
	}
	if len(items) > 0 {
		for n, j := range items {
			if n > 0 {
				buf = append(buf, ", "...)
			}
			buf = append(buf, s.policy(&ds[j])...)
		}
		end("RateLimit-Policy", 0)
		start := len(buf)
		for n, j := range items {
			if n > 0 {
				buf = append(buf, ", "...)
			}
			buf = httplimit.AppendRateLimitItem(buf, ds[j])
		}
		end("RateLimit", start)
	}
	if worst != nil {
		start := len(buf)
		buf = strconv.AppendInt(buf, int64(worst.Limit.Burst()), 10)
		end("X-RateLimit-Limit", start)
		start = len(buf)
		buf = strconv.AppendInt(buf, int64(max(worst.Remaining, 0)), 10)
		end("X-RateLimit-Remaining", start)
		start = len(buf)
		buf = strconv.AppendInt(buf, worst.ResetSeconds(), 10)
		end("X-RateLimit-Reset", start)
	}
	var retry int64
	for i := range ds {
		retry = max(retry, ds[i].RetryAfterSeconds())
	}
	if retry > 0 {
		start := len(buf)
		buf = strconv.AppendInt(buf, retry, 10)
		end("Retry-After", start)
	}
	if overLimit {
		start := len(buf)
		buf = append(buf, "application/json"...)
		end("Content-Type", start)
	}
	if nh == 0 {
		return nil
	}
	values := string(buf)
	for i, h := range hs[:nh] {
		a.headers[i].Key, a.headers[i].Value = h.key, values[h.start:h.end]
		a.hPtrs[i] = &a.headers[i]
	}
	return a.hPtrs[:nh:nh]
}

// maxCachedPolicies bounds the policy cache; rules define few policies, but
// reloads may change their limits.
const maxCachedPolicies = 4096

type policyKey struct {
	name         string
	limit, quota bucket.Limit
}

// policy renders the RateLimit-Policy value of d, once per policy, limit in
// force and quota.
func (s *Server) policy(d *limiter.Decision) string {
	k := policyKey{d.Policy, d.Limit, d.Quota}
	if v, ok := s.policies.Load(k); ok {
		return v.(string)
	}
	v := httplimit.PolicyHeader(d.Policy, d.Limit, d.Quota)
	if s.cached.Add(1) <= maxCachedPolicies {
		s.policies.Store(k, v)
	}
	return v
}

// moreRestrictive prefers a denial, then the fewest tokens remaining.
func moreRestrictive(a, b *limiter.Decision) bool {
	if a.Allowed != b.Allowed {
		return !a.Allowed
	}
	return a.Remaining < b.Remaining
}

// unmatchedDomain logs and counts a request for domain got when the rules
// serve want, and reports whether to deny it.
func (s *Server) unmatchedDomain(want, got string) (deny bool) {
	kind := 1
	if got == "" {
		kind = 0
	}
	deny = s.cfg.UnknownDomain == DenyUnknownDomain
	action := 0
	if deny {
		action = 1
	}
	s.unmatched[kind][action].Add(1)
	s.domains.log(s.cfg.Logger, s.cfg.Clock.Now(), want, got, s.cfg.UnknownDomain)
	return deny
}

// denyAll answers every descriptor of req OVER_LIMIT, with a body saying
// why and no quota headers (no quota applied).
func denyAll(req *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	resp := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		RawBody:              []byte(`{"error":"rate limit domain is not served","retry_after":0}`),
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "Content-Type", Value: "application/json"}}}
	for range req.GetDescriptors() {
		resp.Statuses = append(resp.Statuses, &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OVER_LIMIT})
	}
	return resp
}

// maxLoggedDomains bounds the distinct unmatched domains logged one by one;
// beyond it a summary is logged at most once per domainSummaryEvery, so
// requests naming ever new domains cannot flood the log or grow memory.
const (
	maxLoggedDomains    = 64
	domainSummaryEvery  = time.Minute
	maxLoggedDomainSize = 64 // bytes of a domain kept and logged
)

// domainLog logs each unmatched domain once. It is safe for concurrent use.
type domainLog struct {
	mu      sync.Mutex
	seen    map[string]bool
	more    int // unmatched requests for domains beyond maxLoggedDomains since the last summary
	summary time.Time
}

func (l *domainLog) log(logger *slog.Logger, now time.Time, want, got string, action DomainAction) {
	if len(got) > maxLoggedDomainSize {
		got = got[:maxLoggedDomainSize]
	}
	l.mu.Lock()
	switch {
	case l.seen[got]:
		l.mu.Unlock()
		return
	case len(l.seen) < maxLoggedDomains:
		l.seen[got] = true
		l.mu.Unlock()
		logger.Warn("rls: request for a domain the rules do not serve", "domain", got, "served", want, "action", string(action))
		return
	}
	l.more++
	if !l.summary.IsZero() && now.Sub(l.summary) < domainSummaryEvery && now.Sub(l.summary) >= 0 {
		l.mu.Unlock()
		return
	}
	more := l.more
	l.more, l.summary = 0, now
	l.mu.Unlock()
	logger.Warn("rls: requests for more domains the rules do not serve", "requests", more, "served", want,
		"action", string(action), "domains_logged", maxLoggedDomains)
}

var descUnmatched = prometheus.NewDesc("allot_rls_unmatched_domain_total",
	"RLS requests for a domain the rules do not serve, by kind (empty, unknown) and action (allowed, denied).",
	[]string{"kind", "action"}, nil)

// Describe implements prometheus.Collector: a Server exports its counts.
func (s *Server) Describe(ch chan<- *prometheus.Desc) { ch <- descUnmatched }

// Collect implements prometheus.Collector.
func (s *Server) Collect(ch chan<- prometheus.Metric) {
	for k, kind := range []string{"empty", "unknown"} {
		for a, action := range []string{"allowed", "denied"} {
			ch <- prometheus.MustNewConstMetric(descUnmatched, prometheus.CounterValue, float64(s.unmatched[k][a].Load()), kind, action)
		}
	}
}
