// Package auth proves who is calling across allot's trust boundaries: a
// region on the coordinator's lease stream, a gateway on an agent's allow
// API. A caller proves a name with a client certificate verified by TLS
// (the certificate's common name, else its first DNS name) or with a bearer
// token that a tokens file lists for that name.
//
// A tokens file has one entry a line, "<name> <token>" or
// "<name> sha256:<64 hex digits>" (the SHA-256 of the token, so the file
// need not hold the secret); blank lines and lines starting with '#' are
// skipped. A name may have several lines, so a token can be rotated by
// listing the old and the new one until every caller has the new one.
// Tokens are compared by their SHA-256 digests in constant time, every
// entry being compared on every check.
package auth

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"

	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
)

// MinTokenBytes is the shortest token a tokens file may hold in clear: a
// token is a random secret, not a password.
const MinTokenBytes = 16

// ErrInvalidTokens: a tokens file cannot be used.
var ErrInvalidTokens = errors.New("auth: invalid tokens file")

// Tokens holds the accepted tokens by name. It is safe for concurrent use
// (it does not change after it is made).
type Tokens struct {
	entries []entry
}

type entry struct {
	name   string
	digest [sha256.Size]byte
}

// ParseTokens reads a tokens file's content; source names it in errors,
// which give the line of every problem.
func ParseTokens(data []byte, source string) (*Tokens, error) {
	t := &Tokens{}
	var errs []error
	for i, line := range bytes.Split(data, []byte("\n")) {
		l := strings.TrimSpace(string(line))
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		f := strings.Fields(l)
		if len(f) != 2 {
			errs = append(errs, fmt.Errorf("%s:%d: want \"<name> <token>\" or \"<name> sha256:<hex>\", got %d fields", source, i+1, len(f)))
			continue
		}
		e := entry{name: f[0]}
		if hexDigest, ok := strings.CutPrefix(f[1], "sha256:"); ok {
			d, err := hex.DecodeString(hexDigest)
			if err != nil || len(d) != sha256.Size {
				errs = append(errs, fmt.Errorf("%s:%d: name %q: sha256: wants %d hex digits", source, i+1, f[0], 2*sha256.Size))
				continue
			}
			copy(e.digest[:], d)
		} else {
			if len(f[1]) < MinTokenBytes {
				errs = append(errs, fmt.Errorf("%s:%d: name %q: token has %d bytes, fewer than the %d required", source, i+1, f[0], len(f[1]), MinTokenBytes))
				continue
			}
			e.digest = sha256.Sum256([]byte(f[1]))
		}
		t.entries = append(t.entries, e)
	}
	if len(errs) == 0 && len(t.entries) == 0 {
		errs = append(errs, fmt.Errorf("%s: no token", source))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInvalidTokens, errors.Join(errs...))
	}
	return t, nil
}

// LoadTokens reads and parses a tokens file.
func LoadTokens(path string) (*Tokens, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("auth: tokens file: %w", err)
	}
	return ParseTokens(data, path)
}

// Verify reports whether token is one of name's.
func (t *Tokens) Verify(name, token string) bool {
	got, ok := t.Lookup(token)
	return ok && subtle.ConstantTimeCompare([]byte(got), []byte(name)) == 1
}

// Lookup returns the name token belongs to. Every entry is compared, so the
// time taken does not depend on which one matches.
func (t *Tokens) Lookup(token string) (name string, ok bool) {
	if t == nil || token == "" {
		return "", false
	}
	d := sha256.Sum256([]byte(token))
	found := -1
	for i := range t.entries {
		if subtle.ConstantTimeCompare(d[:], t.entries[i].digest[:]) == 1 && found < 0 {
			found = i
		}
	}
	if found < 0 {
		return "", false
	}
	return t.entries[found].name, true
}

// Names returns the names with a token, sorted, each once.
func (t *Tokens) Names() []string {
	var out []string
	for _, e := range t.entries {
		out = append(out, e.name)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ReadToken reads one token from a file (the whole file, surrounding space
// trimmed), as a caller holds its own.
func ReadToken(path string) (string, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("auth: token file: %w", err)
	}
	tok := strings.TrimSpace(string(data))
	if len(tok) < MinTokenBytes || strings.ContainsAny(tok, " \t\r\n") {
		return "", fmt.Errorf("auth: token file %s: want one token of at least %d bytes and no spaces", path, MinTokenBytes)
	}
	return tok, nil
}

// AuthorizationHeader is the gRPC metadata key and HTTP header a bearer
// token travels in.
const AuthorizationHeader = "authorization"

// BearerToken returns the token of an "authorization: Bearer <token>"
// value, "" when v is not one.
func BearerToken(v string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(v), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// TokenFromContext returns the bearer token of an incoming gRPC call, ""
// without one.
func TokenFromContext(ctx context.Context) string {
	md, ok := metadata.FromIncomingContext(ctx)
	if !ok {
		return ""
	}
	for _, v := range md.Get(AuthorizationHeader) {
		if t := BearerToken(v); t != "" {
			return t
		}
	}
	return ""
}

// PeerName is the name of the verified client certificate of an incoming
// gRPC call, "" without one.
func PeerName(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.AuthInfo == nil {
		return ""
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok || len(ti.State.VerifiedChains) == 0 || len(ti.State.VerifiedChains[0]) == 0 {
		return ""
	}
	return CertName(ti.State.VerifiedChains[0][0])
}

// CertName is the name a certificate proves: its common name, else its
// first DNS name.
func CertName(c *x509.Certificate) string {
	if c.Subject.CommonName != "" {
		return c.Subject.CommonName
	}
	if len(c.DNSNames) > 0 {
		return c.DNSNames[0]
	}
	return ""
}

// Bearer returns per-call gRPC credentials sending token as
// "authorization: Bearer <token>". They refuse a connection without TLS,
// where the token could be read on the wire, unless allowInsecure is set.
func Bearer(token string, allowInsecure bool) credentials.PerRPCCredentials {
	return bearer{token: token, insecure: allowInsecure}
}

type bearer struct {
	token    string
	insecure bool
}

func (b bearer) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{AuthorizationHeader: "Bearer " + b.token}, nil
}

func (b bearer) RequireTransportSecurity() bool { return !b.insecure }
