package grpclimit

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// Identity is who a call is from.
type Identity struct {
	Subject string // empty: no identity
	Plan    string // empty: the default plan
}

// IdentityFunc finds the identity of a call from its context (metadata,
// peer certificate). An error is answered UNAVAILABLE.
type IdentityFunc func(ctx context.Context, fullMethod string) (Identity, error)

// MetadataIdentity takes the subject and plan from incoming metadata keys
// that a trusted proxy sets; planKey may be empty.
func MetadataIdentity(subjectKey, planKey string) IdentityFunc {
	return func(ctx context.Context, _ string) (Identity, error) {
		md, _ := metadata.FromIncomingContext(ctx)
		first := func(k string) string {
			if v := md.Get(k); len(v) > 0 {
				return strings.TrimSpace(v[0])
			}
			return ""
		}
		id := Identity{Subject: first(subjectKey)}
		if id.Subject != "" && planKey != "" {
			id.Plan = first(planKey)
		}
		return id, nil
	}
}

// InterceptorConfig configures the server interceptors.
type InterceptorConfig struct {
	// Limiter decides. Required.
	Limiter limiter.Limiter
	// Identity finds who a call is from; nil means no call has identity.
	Identity IdentityFunc
	// Cost overrides the rules' cost for a method; nil or 0 means the rules
	// decide.
	Cost func(ctx context.Context, fullMethod string) bucket.Tokens
	// Rule names the rule to charge; empty means match the descriptor
	// {path: full method, method: POST}, so one rules file can cover HTTP
	// routes and gRPC methods.
	Rule string
	// Logger records calls that cannot be decided; nil means slog.Default().
	Logger *slog.Logger
}

// Validate reports a missing field.
func (c InterceptorConfig) Validate() error {
	if c.Limiter == nil {
		return errors.New("grpclimit: InterceptorConfig.Limiter is nil")
	}
	return nil
}

type interceptor struct{ cfg InterceptorConfig }

func newInterceptor(cfg InterceptorConfig) (*interceptor, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &interceptor{cfg: cfg}, nil
}

// UnaryServerInterceptor admits each unary call through the limiter.
func UnaryServerInterceptor(cfg InterceptorConfig) (grpc.UnaryServerInterceptor, error) {
	ic, err := newInterceptor(cfg)
	if err != nil {
		return nil, err
	}
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := ic.admit(ctx, info.FullMethod); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}, nil
}

// StreamServerInterceptor admits each stream once, when it opens.
func StreamServerInterceptor(cfg InterceptorConfig) (grpc.StreamServerInterceptor, error) {
	ic, err := newInterceptor(cfg)
	if err != nil {
		return nil, err
	}
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := ic.admit(ss.Context(), info.FullMethod); err != nil {
			return err
		}
		return handler(srv, ss)
	}, nil
}

// admit returns nil to let the call through, or the status error to answer.
func (ic *interceptor) admit(ctx context.Context, method string) error {
	var id Identity
	if ic.cfg.Identity != nil {
		var err error
		if id, err = ic.cfg.Identity(ctx, method); err != nil {
			return status.Errorf(codes.Unavailable, "grpclimit: identity unavailable: %v", err)
		}
	}
	req := limiter.Request{
		Subject: id.Subject, Plan: id.Plan, Rule: ic.cfg.Rule,
		Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: method}, {Key: rules.KeyMethod, Value: "POST"}},
	}
	if id.Plan != "" {
		req.Descriptor = append(req.Descriptor, rules.Entry{Key: rules.KeyPlan, Value: id.Plan})
	}
	if ic.cfg.Cost != nil {
		req.Cost = ic.cfg.Cost(ctx, method)
	}
	d, err := ic.cfg.Limiter.Allow(ctx, req)
	if err != nil {
		if ctx.Err() != nil {
			return status.FromContextError(ctx.Err()).Err()
		}
		ic.cfg.Logger.Error("grpclimit: cannot decide", "method", method, "err", err)
		return status.Errorf(codes.Internal, "grpclimit: cannot decide %s: %v", method, err)
	}
	if d.Limited() && !d.Shadow && d.Fallback == "" {
		_ = grpc.SetHeader(ctx, QuotaMetadata(d))
	}
	if d.Allowed {
		return nil
	}
	return DenialStatus(d).Err()
}

// QuotaMetadata is the quota of a decision as response header metadata,
// named as the HTTP headers are.
func QuotaMetadata(d limiter.Decision) metadata.MD {
	md := metadata.Pairs(
		"ratelimit-policy", httplimit.PolicyHeader(d.Policy, d.Limit, d.Quota),
		"ratelimit", httplimit.RateLimitItem(d),
	)
	if ra := d.RetryAfterSeconds(); ra > 0 {
		md.Set("retry-after", strconv.FormatInt(ra, 10))
	}
	return md
}

// DenialStatus is the gRPC status of a denial: RESOURCE_EXHAUSTED with
// RetryInfo and QuotaFailure when over the limit, PERMISSION_DENIED when the
// cost can never fit or the plan is refused, UNAUTHENTICATED without
// identity, UNAVAILABLE with RetryInfo when the limiter is unavailable.
func DenialStatus(d limiter.Decision) *status.Status {
	quota := &errdetails.QuotaFailure{Violations: []*errdetails.QuotaFailure_Violation{{
		Subject: d.Policy, Description: string(d.Reason),
	}}}
	retry := &errdetails.RetryInfo{RetryDelay: durationpb.New(d.RetryAfter)}
	var st *status.Status
	var details []protoadapt.MessageV1
	switch d.Reason {
	case limiter.ReasonOverLimit:
		st = status.Newf(codes.ResourceExhausted, "rate limit exceeded for %s; retry after %s", d.Policy, d.RetryAfter)
		details = []protoadapt.MessageV1{protoadapt.MessageV1Of(retry), protoadapt.MessageV1Of(quota)}
	case limiter.ReasonNeverFits:
		st = status.Newf(codes.PermissionDenied, "cost %d exceeds the burst %d of %s and can never be admitted", d.Cost, d.Limit.Burst(), d.Policy)
		details = []protoadapt.MessageV1{protoadapt.MessageV1Of(quota)}
	case limiter.ReasonUnknownPlan:
		st = status.Newf(codes.PermissionDenied, "plan %q is not known", d.Plan)
	case limiter.ReasonNoIdentity:
		st = status.New(codes.Unauthenticated, "call has no identity")
	default:
		st = status.New(codes.Unavailable, "rate limiter unavailable")
		details = []protoadapt.MessageV1{protoadapt.MessageV1Of(retry)}
	}
	if len(details) > 0 {
		if withDetails, err := st.WithDetails(details...); err == nil {
			st = withDetails
		}
	}
	return st
}
