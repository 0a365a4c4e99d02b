// Package grpclimit puts the limiter on gRPC, both ways: AllowServer serves
// the project's own allow API (allot.allot.v1.AllowService) on a
// limiter.Limiter, Remote is a limiter.Limiter that calls such a server, and
// UnaryServerInterceptor and StreamServerInterceptor admit the calls of any
// Go gRPC service, answering RESOURCE_EXHAUSTED with RetryInfo when over
// the limit.
package grpclimit

import (
	"context"
	"errors"
	"fmt"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	allotv1 "github.com/allot-dev/allot/api/allot/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// AllowServiceName is the allow API's gRPC service name.
const AllowServiceName = "allot.allot.v1.AllowService"

// MaxDescriptorEntries is the default bound on the descriptor of one Allow
// call (limiter.DefaultBounds' MaxEntries).
const MaxDescriptorEntries = 64

// AllowServer serves the allow API on a Limiter.
type AllowServer struct {
	allotv1.UnimplementedAllowServiceServer
	lim    limiter.Limiter
	bounds limiter.Bounds
}

// AllowOption configures an AllowServer.
type AllowOption func(*AllowServer)

// WithBounds bounds the requests an AllowServer accepts; a request over
// them is INVALID_ARGUMENT naming the field. The default is
// limiter.DefaultBounds.
func WithBounds(b limiter.Bounds) AllowOption {
	return func(s *AllowServer) { s.bounds = b.OrDefault() }
}

// NewAllowServer returns an AllowServer on lim.
func NewAllowServer(lim limiter.Limiter, opts ...AllowOption) (*AllowServer, error) {
	if lim == nil {
		return nil, errors.New("grpclimit: NewAllowServer with a nil Limiter")
	}
	s := &AllowServer{lim: lim, bounds: limiter.DefaultBounds()}
	for _, o := range opts {
		o(s)
	}
	if err := s.bounds.Validate(); err != nil {
		return nil, fmt.Errorf("grpclimit: %w", err)
	}
	return s, nil
}

// RegisterAllow registers s on g and marks it serving in hs, when non-nil.
func RegisterAllow(g *grpc.Server, s *AllowServer, hs *health.Server) {
	allotv1.RegisterAllowServiceServer(g, s)
	if hs != nil {
		hs.SetServingStatus(AllowServiceName, healthpb.HealthCheckResponse_SERVING)
	}
}

// Allow implements allotv1.AllowServiceServer.
func (s *AllowServer) Allow(ctx context.Context, in *allotv1.AllowRequest) (*allotv1.AllowResponse, error) {
	req, err := RequestFromProtoBounded(in, s.bounds)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	d, err := s.lim.Allow(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, status.FromContextError(ctx.Err()).Err()
		}
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	return DecisionToProto(d), nil
}

// RequestFromProto converts an AllowRequest, checking its fields against
// limiter.DefaultBounds.
func RequestFromProto(in *allotv1.AllowRequest) (limiter.Request, error) {
	return RequestFromProtoBounded(in, limiter.DefaultBounds())
}

// RequestFromProtoBounded converts an AllowRequest, checking its fields
// against b. A field over its bound is an error wrapping
// limiter.ErrTooLarge that names the field.
func RequestFromProtoBounded(in *allotv1.AllowRequest, b limiter.Bounds) (limiter.Request, error) {
	b = b.OrDefault()
	if n := len(in.GetDescriptor_()); n > b.MaxEntries {
		return limiter.Request{}, fmt.Errorf("grpclimit: %w", &limiter.BoundError{Field: "descriptor", Size: n, Max: b.MaxEntries})
	}
	if in.GetCost() < 0 {
		return limiter.Request{}, fmt.Errorf("grpclimit: cost=%d must be ≥ 0", in.GetCost())
	}
	req := limiter.Request{
		Subject: in.GetSubject(), Plan: in.GetPlan(), Rule: in.GetRule(),
		Cost: bucket.Tokens(in.GetCost()), AttemptID: in.GetAttemptId(),
	}
	if n := len(in.GetDescriptor_()); n > 0 {
		req.Descriptor = make(rules.Descriptor, 0, n) // one allocation, not one per doubling
	}
	for i, e := range in.GetDescriptor_() {
		if e.GetKey() == "" {
			return limiter.Request{}, fmt.Errorf("grpclimit: descriptor entry %d has an empty key", i)
		}
		req.Descriptor = append(req.Descriptor, rules.Entry{Key: e.GetKey(), Value: e.GetValue()})
	}
	if err := b.Check(req); err != nil {
		return limiter.Request{}, fmt.Errorf("grpclimit: %w", err)
	}
	return req, nil
}

// RequestToProto converts a Request.
func RequestToProto(r limiter.Request) *allotv1.AllowRequest {
	out := &allotv1.AllowRequest{
		Subject: r.Subject, Plan: r.Plan, Rule: r.Rule, Cost: int64(r.Cost), AttemptId: r.AttemptID,
	}
	for _, e := range r.Descriptor {
		out.Descriptor_ = append(out.Descriptor_, &allotv1.Entry{Key: e.Key, Value: e.Value})
	}
	return out
}

var reasons = map[limiter.Reason]allotv1.Reason{
	limiter.ReasonOK:          allotv1.Reason_REASON_OK,
	limiter.ReasonOverLimit:   allotv1.Reason_REASON_OVER_LIMIT,
	limiter.ReasonNeverFits:   allotv1.Reason_REASON_CAN_NEVER_FIT,
	limiter.ReasonUnknownPlan: allotv1.Reason_REASON_UNKNOWN_PLAN,
	limiter.ReasonNoIdentity:  allotv1.Reason_REASON_NO_IDENTITY,
	limiter.ReasonUnavailable: allotv1.Reason_REASON_UNAVAILABLE,
	limiter.ReasonNoRule:      allotv1.Reason_REASON_NO_RULE,
}

// DecisionToProto converts a Decision.
func DecisionToProto(d limiter.Decision) *allotv1.AllowResponse {
	out := &allotv1.AllowResponse{
		Allowed: d.Allowed, Reason: reasons[d.Reason], Remaining: int64(d.Remaining),
		RetryAfter: durationpb.New(d.RetryAfter), ResetAfter: durationpb.New(d.ResetAfter),
		Policy: d.Policy, Rule: d.Rule, Plan: d.Plan, Cost: int64(d.Cost), Shadow: d.Shadow,
		Fallback: string(d.Fallback), HttpStatus: int32(d.Status), RulesVersion: d.RulesVersion,
		RetryAfterSeconds: d.RetryAfterSeconds(),
	}
	if d.Limited() {
		// The limit in force; one the region may admit nothing under is
		// count and burst 0 over the quota's period.
		p := d.Limit.Period()
		if d.Limit.IsZero() {
			p = d.Quota.Period()
		}
		out.Limit = &allotv1.Limit{Count: int64(d.Limit.Count()), Period: durationpb.New(p), Burst: int64(d.Limit.Burst())}
	}
	return out
}

// DecisionFromProto converts an AllowResponse. The bucket key is not part of
// the API and stays empty. The response carries the limit in force, not the
// rules' quota: Quota is set to it, and a limit of count and burst 0 (a
// region that may admit nothing now) reads as no quota.
func DecisionFromProto(in *allotv1.AllowResponse) (limiter.Decision, error) {
	d := limiter.Decision{
		Allowed: in.GetAllowed(), Remaining: bucket.Tokens(in.GetRemaining()),
		RetryAfter: in.GetRetryAfter().AsDuration(), ResetAfter: in.GetResetAfter().AsDuration(),
		Policy: in.GetPolicy(), Rule: in.GetRule(), Plan: in.GetPlan(), Cost: bucket.Tokens(in.GetCost()),
		Shadow: in.GetShadow(), Fallback: rules.FailurePolicy(in.GetFallback()), Status: int(in.GetHttpStatus()),
		RulesVersion: in.GetRulesVersion(),
	}
	for r, p := range reasons {
		if p == in.GetReason() {
			d.Reason = r
		}
	}
	if d.Reason == "" {
		return d, fmt.Errorf("grpclimit: response reason %v is not known", in.GetReason())
	}
	if l := in.GetLimit(); l != nil && (l.GetCount() != 0 || l.GetBurst() != 0) {
		d.Limit = bucket.Per(bucket.Tokens(l.GetCount()), l.GetPeriod().AsDuration()).WithBurst(bucket.Tokens(l.GetBurst()))
		if err := d.Limit.Validate(); err != nil {
			return d, fmt.Errorf("grpclimit: response limit: %w", err)
		}
		d.Quota = d.Limit
	}
	return d, nil
}

// Remote is a limiter.Limiter that asks an allow API server. A call that
// fails (the server down, a deadline) is a Decision with
// ReasonUnavailable, never admitted: the caller is cut off from its
// limiter, and the server side holds the rules' failure policies.
type Remote struct {
	c       allotv1.AllowServiceClient
	timeout time.Duration
}

// NewRemote returns a Remote on conn; each call is bounded by timeout.
func NewRemote(conn grpc.ClientConnInterface, timeout time.Duration) (*Remote, error) {
	if timeout <= 0 {
		return nil, fmt.Errorf("grpclimit: NewRemote timeout=%s must be > 0", timeout)
	}
	return &Remote{c: allotv1.NewAllowServiceClient(conn), timeout: timeout}, nil
}

var _ limiter.Limiter = (*Remote)(nil)

// Allow implements limiter.Limiter.
func (r *Remote) Allow(ctx context.Context, req limiter.Request) (limiter.Decision, error) {
	cctx, cancel := context.WithTimeout(ctx, r.timeout)
	defer cancel()
	resp, err := r.c.Allow(cctx, RequestToProto(req))
	if err != nil {
		if ctx.Err() != nil {
			return limiter.Decision{}, fmt.Errorf("grpclimit: %w", ctx.Err())
		}
		if status.Code(err) == codes.InvalidArgument {
			return limiter.Decision{}, fmt.Errorf("%w: %s", limiter.ErrInvalidRequest, status.Convert(err).Message())
		}
		return limiter.Decision{Reason: limiter.ReasonUnavailable, RetryAfter: time.Second}, nil
	}
	return DecisionFromProto(resp)
}
