package httplimit_test

import (
	"strings"
	"testing"

	"github.com/allot-dev/allot/httplimit"
)

// TestBounds: a request with a field over the limiter's bounds is refused
// before the limiter is asked, with a status saying where the field came
// from and a JSON error naming it; a request at the bounds is served.
func TestBounds(t *testing.T) {
	f := newFixture(t, gatewayRules, nil, func(c *httplimit.Config) {
		c.Headers = map[string]string{"region": "X-Region"}
		c.AttemptHeader = "Idempotency-Key"
	})
	for _, c := range []struct {
		name         string
		path, tenant string
		extra        []string
		status       int
		want         string
	}{
		{"subject", "/items", strings.Repeat("t", 257), nil, 431, `"httplimit: subject has 257 bytes, more than the 256 allowed"`},
		{"plan", "/items", "acme", []string{"X-Plan", strings.Repeat("p", 513)}, 431, `"httplimit: plan has 513 bytes, more than the 512 allowed"`},
		{"path", "/" + strings.Repeat("p", 512), "acme", nil, 414, `"httplimit: descriptor[0].value (key \"path\") has 513 bytes, more than the 512 allowed"`},
		{"header", "/items", "acme", []string{"X-Region", strings.Repeat("r", 600)}, 431, `has 600 bytes, more than the 512 allowed (header X-Region)`},
		{"attempt", "/items", "acme", []string{"Idempotency-Key", strings.Repeat("k", 800)}, 431, `"httplimit: attempt_id has 805 bytes, more than the 769 allowed"`},
	} {
		r := f.get(t, c.path, c.tenant, "", c.extra...)
		if r.status != c.status || !strings.Contains(r.body, c.want) || !strings.HasPrefix(r.header.Get("Content-Type"), "application/json") {
			t.Errorf("%s: %d %s; want %d with %s", c.name, r.status, r.body, c.status, c.want)
		}
	}
	if n := f.store.Calls.Load(); n != 0 {
		t.Errorf("requests over a bound reached the store %d times", n)
	}
	if r := f.get(t, "/items", strings.Repeat("t", 256), "free"); r.status != 200 {
		t.Errorf("a 256-byte tenant: %d %s", r.status, r.body)
	}
}
