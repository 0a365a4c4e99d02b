package main

import (
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/allot-dev/allot/auth"
	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/grpclimit"
	"github.com/allot-dev/allot/httpserver"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rls"
)

// boundary holds the agent's settings for what crosses its boundaries: how
// it proves its region to the coordinator, who may call its allow API, how
// large a request may be, and how long a client may hold a connection.
type boundary struct {
	insecure          bool
	coordTokenFile    string
	coordCA           string
	allowTokensFile   string
	allowCertNames    string
	bounds            limiter.Bounds
	maxBody           int64
	rlsUnknownDomain  string
	rlsMaxDescriptors int
	memoryMaxKeys     int
	http              httpserver.Config
}

func (b *boundary) register(fs *flag.FlagSet) {
	fs.BoolVar(&b.insecure, "insecure", false, "talk to the coordinator without proving the region (no client certificate, no token), or send the token without TLS")
	fs.StringVar(&b.coordTokenFile, "coordinator-token-file", "", "file holding this region's token for the coordinator (sent over TLS: with -coordinator-tls)")
	fs.StringVar(&b.coordCA, "coordinator-ca", "", "CA (PEM) the coordinators' certificate must chain to (with -coordinator-tls); default -tls-ca, else the system roots. Unlike -tls-ca it asks no certificate of the agent's own clients")
	fs.StringVar(&b.allowTokensFile, "allow-tokens", "", "tokens file of the callers allowed to use the allow API (HTTP /v1/allow and gRPC); empty: any caller that reaches it")
	fs.StringVar(&b.allowCertNames, "allow-cert-names", "", "client certificate names (verified against -tls-ca) allowed to use the allow API, comma-separated")
	b.bounds = limiter.DefaultBounds()
	b.bounds.RegisterFlags(fs)
	fs.Int64Var(&b.maxBody, "max-body-bytes", 256<<10, "largest /v1/allow body; beyond it 413")
	fs.StringVar(&b.rlsUnknownDomain, "rls-unknown-domain", string(rls.AllowUnknownDomain), "RLS requests for a domain the rules do not serve: allow (logged and counted) or deny (over the limit)")
	fs.IntVar(&b.rlsMaxDescriptors, "rls-max-descriptors", rls.MaxDescriptors, "most descriptors in one RLS request")
	fs.IntVar(&b.memoryMaxKeys, "memory-max-keys", 1_000_000, "most buckets the in-process store holds (without -redis); at the bound new keys get the rule's failure policy; < 0: no bound")
	b.http = httpserver.DefaultConfig()
	b.http.RegisterFlags(fs)
}

// validate checks the settings against the rest of the options.
func (b *boundary) validate(o options) error {
	if _, err := rls.ParseDomainAction(b.rlsUnknownDomain); err != nil {
		return fmt.Errorf("-rls-unknown-domain: %w", err)
	}
	if err := b.bounds.Validate(); err != nil {
		return err
	}
	if b.memoryMaxKeys == 0 {
		return fmt.Errorf("-memory-max-keys=0: give the most buckets (> 0), or < 0 for no bound")
	}
	if b.maxBody <= 0 {
		return fmt.Errorf("-max-body-bytes=%d must be > 0", b.maxBody)
	}
	if b.coordCA != "" && !o.coordTLS {
		return fmt.Errorf("-coordinator-ca=%q needs -coordinator-tls", b.coordCA)
	}
	if o.coordinators == "" {
		return nil
	}
	switch {
	case !b.insecure && !o.coordTLS:
		return errors.New("-coordinators needs -coordinator-tls (with -tls-cert for mutual TLS, or -coordinator-token-file), or -insecure to speak for the region without proving it")
	case !b.insecure && o.tlsCert == "" && b.coordTokenFile == "":
		return errors.New("-coordinator-tls needs -tls-cert and -tls-key (mutual TLS) or -coordinator-token-file, or -insecure")
	}
	return nil
}

// coordinatorAuth sets how cc proves the region and names the mode: mtls,
// token, mtls+token or insecure.
func (b *boundary) coordinatorAuth(o options, cc *coordinator.ClientConfig, clientTLS *tls.Config) (string, error) {
	if o.coordTLS {
		tc, err := redisTLSConfig(clientTLS, o.tlsCA) // the client certificate when there is one, -tls-ca
		if err != nil {
			return "", err
		}
		if b.coordCA != "" {
			// Only the coordinator link trusts this CA: the agent's servers
			// keep serving clients without certificates (kubelet probes,
			// Prometheus), as they do without -tls-ca.
			if tc.RootCAs, err = certPool("-coordinator-ca", b.coordCA); err != nil {
				return "", err
			}
		}
		cc.TLS = tc
	}
	if b.coordTokenFile != "" {
		tok, err := auth.ReadToken(b.coordTokenFile)
		if err != nil {
			return "", fmt.Errorf("-coordinator-token-file: %w", err)
		}
		cc.Credentials = auth.Bearer(tok, b.insecure)
	}
	cert := cc.TLS != nil && len(cc.TLS.Certificates) > 0
	switch {
	case b.insecure && !(cert || cc.Credentials != nil && cc.TLS != nil):
		return "insecure", nil
	case cert && cc.Credentials != nil:
		return "mtls+token", nil
	case cert:
		return "mtls", nil
	}
	return "token", nil
}

// callers returns who may use the allow API.
func (b *boundary) callers() (*auth.Callers, error) {
	var tk *auth.Tokens
	if b.allowTokensFile != "" {
		var err error
		if tk, err = auth.LoadTokens(b.allowTokensFile); err != nil {
			return nil, fmt.Errorf("-allow-tokens: %w", err)
		}
	}
	return auth.NewCallers("allow", tk, split(b.allowCertNames)), nil
}

// grpcGuard returns the gRPC server options guarding the allow API.
func grpcGuard(c *auth.Callers) []grpc.ServerOption {
	if c.Open() {
		return nil
	}
	return []grpc.ServerOption{grpc.UnaryInterceptor(c.UnaryServerInterceptor(grpclimit.AllowServiceName))}
}

// readBody reads at most limit bytes of r's body; a larger body is
// errBodyTooLarge, answered 413.
func readBody(w http.ResponseWriter, r *http.Request, limit int64) ([]byte, error) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, limit))
	var mb *http.MaxBytesError
	if errors.As(err, &mb) {
		return nil, fmt.Errorf("%w: more than %d bytes", errBodyTooLarge, mb.Limit)
	}
	return body, err
}

var errBodyTooLarge = errors.New("agent: /v1/allow: body too large")

// authInfo exports allot_agent_coordinator_auth_info{mode}.
func authInfo(reg prometheus.Registerer, mode string) {
	g := prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "allot_agent_coordinator_auth_info",
		Help: "1 for how this agent proves its region to the coordinator: mtls, token, mtls+token, insecure, or none (no coordinator)."}, []string{"mode"})
	g.WithLabelValues(mode).Set(1)
	reg.MustRegister(g)
}

// warnInsecure logs what -insecure gives up.
func warnInsecure(log *slog.Logger, mode string, addrs []string) {
	if mode == "insecure" {
		log.Warn("agent: speaking for the region to the coordinator without proving it (insecure): a coordinator that accepts this accepts anyone naming the region",
			"coordinators", strings.Join(addrs, ","))
	}
}
