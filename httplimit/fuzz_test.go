package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/httplimit"
)

// FuzzHeaders sends arbitrary identity, plan, path and cost header values
// through the middleware: no panic, only the documented statuses, JSON on
// every denial, and a 400 for a bad cost that names the header and value.
func FuzzHeaders(f *testing.F) {
	f.Add("alice", "free", "/items", "")
	f.Add("bob", "pro", "/export", "50")
	f.Add("", "", "/", "x")
	f.Add("e\x00ve", "gold", "/report", "-1")
	f.Add("m", "free", "/items", "1e300")
	f.Add("m", "free", "/items", "NaN")
	fx := newFixture(f, gatewayRules, nil, func(c *httplimit.Config) { c.Cost = httplimit.HeaderCost("X-Cost") })
	// Requests go to the handler directly, so header values that a client
	// library would refuse still reach it.
	h := fx.srv.Config.Handler
	f.Fuzz(func(t *testing.T, tenant, plan, path, cost string) {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req.URL.Path = "/" + strings.TrimPrefix(path, "/")
		req.Header["X-Tenant"] = []string{tenant}
		req.Header["X-Plan"] = []string{plan}
		if cost != "" {
			req.Header["X-Cost"] = []string{cost}
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		switch rec.Code {
		case 200:
		case 400:
			if !strings.Contains(rec.Body.String(), "X-Cost") {
				t.Fatalf("400 does not name the header: %s", rec.Body.String())
			}
		case 401, 403, 429:
			if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
				t.Fatalf("status %d with Content-Type %q", rec.Code, ct)
			}
		default:
			t.Fatalf("status %d: %s", rec.Code, rec.Body.String())
		}
		if rec.Code == 429 && (rec.Header().Get("Retry-After") == "" || rec.Header().Get("Retry-After") == "0") {
			t.Fatalf("429 with Retry-After %q", rec.Header().Get("Retry-After"))
		}
	})
}

// FuzzPolicyHeader checks that any policy name renders as a valid
// Structured Field String that reads back to the name (bytes outside
// printable ASCII become '?').
func FuzzPolicyHeader(f *testing.F) {
	f.Add("free")
	f.Add(`a"b\c`)
	f.Add("é\n")
	f.Fuzz(func(t *testing.T, name string) {
		v := httplimit.PolicyHeader(name, bucket.PerMinute(10), bucket.PerMinute(10))
		str, params, ok := strings.Cut(v, `";q=`)
		if !ok || params != "10;w=60" || !strings.HasPrefix(str, `"`) {
			t.Fatalf("PolicyHeader(%q) = %q", name, v)
		}
		var back strings.Builder
		body := str[1:]
		for i := 0; i < len(body); i++ {
			c := body[i]
			if c < 0x20 || c > 0x7e {
				t.Fatalf("PolicyHeader(%q) = %q has byte %#x", name, v, c)
			}
			if c == '"' {
				t.Fatalf("PolicyHeader(%q) = %q has an unescaped quote", name, v)
			}
			if c == '\\' {
				i++
				if i == len(body) || (body[i] != '"' && body[i] != '\\') {
					t.Fatalf("PolicyHeader(%q) = %q has a bad escape", name, v)
				}
				c = body[i]
			}
			back.WriteByte(c)
		}
		want := []byte(name)
		for i, c := range want {
			if c < 0x20 || c > 0x7e {
				want[i] = '?'
			}
		}
		if back.String() != string(want) {
			t.Fatalf("PolicyHeader(%q) reads back as %q", name, back.String())
		}
	})
}
