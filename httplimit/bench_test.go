package httplimit_test

import (
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/httplimit"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// BenchmarkMiddleware compares a bare handler with the same handler behind
// the middleware on an in-process store, side by side: the cost of
// identity, descriptor, decision and the five quota headers.
func BenchmarkMiddleware(b *testing.B) {
	ok := http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	reqs := make([]*http.Request, 256)
	for i := range reqs {
		reqs[i] = httptest.NewRequest(http.MethodGet, "/items", nil)
		reqs[i].Header.Set("X-Tenant", "tenant-"+strconv.Itoa(i))
		reqs[i].Header.Set("X-Plan", "pro")
	}
	b.Run("bare", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			ok.ServeHTTP(httptest.NewRecorder(), reqs[i&255])
		}
	})
	src := `
default_plan: pro
plans: {pro: "1073741824 per second"}
rules:
  - name: api
    match: {path: "/*"}
    costs:
      - {path: /report, cost: 5}
`
	rs, err := rules.Parse([]byte(src), "bench.yaml")
	if err != nil {
		b.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: rs, Store: bucket.NewMemory(bucket.MemoryOptions{Clock: clock.Real{}}), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	mw, err := httplimit.Middleware(httplimit.Config{Limiter: lim, Identity: httplimit.TrustedHeader("X-Tenant", "X-Plan"), Logger: quiet})
	if err != nil {
		b.Fatal(err)
	}
	h := mw(ok)
	b.Run("middleware", func(b *testing.B) {
		for i := 0; b.Loop(); i++ {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, reqs[i&255])
			if rec.Code != http.StatusNoContent {
				b.Fatalf("status %d", rec.Code)
			}
		}
	})
}
