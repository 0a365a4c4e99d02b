package auth

import (
	"context"
	"net/http"
	"slices"
	"strings"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// Callers decides who may call an API: a caller with a bearer token listed
// in Tokens, or with a verified client certificate whose name is in
// CertNames. With neither set every caller is let through (Open), as an
// API reachable only from inside its trust boundary may be. Callers is
// safe for concurrent use once made.
type Callers struct {
	api       string
	tokens    *Tokens
	certNames []string
	// rejected counts refused calls: [0] over gRPC, [1] over HTTP.
	rejected [2]atomic.Int64
}

// NewCallers returns the Callers of the API named api (in metrics and
// errors); tokens may be nil and certNames empty.
func NewCallers(api string, tokens *Tokens, certNames []string) *Callers {
	return &Callers{api: api, tokens: tokens, certNames: slices.Clone(certNames)}
}

// Open reports whether every caller is let through.
func (c *Callers) Open() bool { return c.tokens == nil && len(c.certNames) == 0 }

// Mode names how callers prove who they are: none, token, cert or
// token+cert.
func (c *Callers) Mode() string {
	switch {
	case c.tokens != nil && len(c.certNames) > 0:
		return "token+cert"
	case c.tokens != nil:
		return "token"
	case len(c.certNames) > 0:
		return "cert"
	}
	return "none"
}

// allow returns the caller's proven name ("" for an open API) and whether
// it may call.
func (c *Callers) allow(token, certName string) (string, bool) {
	if c.Open() {
		return "", true
	}
	if certName != "" && slices.Contains(c.certNames, certName) {
		return certName, true
	}
	if name, ok := c.tokens.Lookup(token); ok {
		return name, true
	}
	return "", false
}

// UnaryServerInterceptor refuses calls to methods of the named gRPC
// services (all methods when none is named) from callers that prove no
// allowed name, with UNAUTHENTICATED. Other services pass untouched, so
// one server can carry an authenticated API beside an open one.
func (c *Callers) UnaryServerInterceptor(services ...string) grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if !c.covers(info.FullMethod, services) {
			return handler(ctx, req)
		}
		if _, ok := c.allow(TokenFromContext(ctx), PeerName(ctx)); !ok {
			c.rejected[0].Add(1)
			return nil, status.Errorf(codes.Unauthenticated, "auth: %s: a bearer token or an allowed client certificate is required", c.api)
		}
		return handler(ctx, req)
	}
}

func (c *Callers) covers(method string, services []string) bool {
	if len(services) == 0 {
		return true
	}
	for _, s := range services {
		if strings.HasPrefix(method, "/"+s+"/") {
			return true
		}
	}
	return false
}

// Middleware refuses HTTP requests from callers that prove no allowed name
// with 401 and a Bearer challenge.
func (c *Callers) Middleware(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var cert string
		if r.TLS != nil && len(r.TLS.VerifiedChains) > 0 && len(r.TLS.VerifiedChains[0]) > 0 {
			cert = CertName(r.TLS.VerifiedChains[0][0])
		}
		if _, ok := c.allow(BearerToken(r.Header.Get(AuthorizationHeader)), cert); !ok {
			c.rejected[1].Add(1)
			w.Header().Set("WWW-Authenticate", `Bearer realm="allot"`)
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"error":"a bearer token or an allowed client certificate is required"}` + "\n"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

var (
	descAuthInfo = prometheus.NewDesc("allot_auth_info", "1 for how callers of an API prove who they are (mode: none, token, cert, token+cert).", []string{"api", "mode"}, nil)
	descRejected = prometheus.NewDesc("allot_auth_rejected_total", "Calls refused for want of an allowed token or client certificate, by API and transport.", []string{"api", "transport"}, nil)
)

// Describe implements prometheus.Collector.
func (c *Callers) Describe(ch chan<- *prometheus.Desc) {
	ch <- descAuthInfo
	ch <- descRejected
}

// Collect implements prometheus.Collector.
func (c *Callers) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descAuthInfo, prometheus.GaugeValue, 1, c.api, c.Mode())
	ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(c.rejected[0].Load()), c.api, "grpc")
	ch <- prometheus.MustNewConstMetric(descRejected, prometheus.CounterValue, float64(c.rejected[1].Load()), c.api, "http")
}
