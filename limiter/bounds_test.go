package limiter_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

// TestBounds: a request with a field over its bound is refused before any
// store is touched, with an error naming the field and its size; a request
// exactly at every bound is decided.
func TestBounds(t *testing.T) {
	b := limiter.Bounds{MaxSubject: 8, MaxValue: 6, MaxEntries: 3}
	e := newEnv(t, testRules, func(c *limiter.Config) { c.Bounds = b })
	at := limiter.Request{Subject: strings.Repeat("s", 8), Plan: "free", AttemptID: strings.Repeat("a", 15),
		Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: "/items"}, {Key: "k", Value: strings.Repeat("v", 6)}, {Key: "kkkkkk", Value: ""}}}
	if d := e.allow(t, at); !d.Allowed || d.Reason != limiter.ReasonOK {
		t.Fatalf("request at every bound: %+v", d)
	}
	ops := e.store.Calls.Load()
	over := func(mod func(*limiter.Request)) limiter.Request {
		r := at
		r.Descriptor = append(rules.Descriptor(nil), at.Descriptor...)
		mod(&r)
		return r
	}
	for _, tc := range []struct {
		name string
		req  limiter.Request
		want string
	}{
		{"subject", over(func(r *limiter.Request) { r.Subject += "s" }), "subject has 9 bytes, more than the 8 allowed"},
		{"plan", over(func(r *limiter.Request) { r.Plan = "premium" }), "plan has 7 bytes, more than the 6 allowed"},
		{"rule", over(func(r *limiter.Request) { r.Rule = "1234567" }), "rule has 7 bytes"},
		{"attempt", over(func(r *limiter.Request) { r.AttemptID += "a" }), "attempt_id has 16 bytes, more than the 15 allowed"},
		{"entries", over(func(r *limiter.Request) { r.Descriptor = append(r.Descriptor, rules.Entry{Key: "x"}) }), "descriptor has 4 entries, more than the 3 allowed"},
		{"key", over(func(r *limiter.Request) { r.Descriptor[2].Key += "k" }), "descriptor[2].key has 7 bytes"},
		{"value", over(func(r *limiter.Request) { r.Descriptor[1].Value += "v" }), `descriptor[1].value (key "k") has 7 bytes, more than the 6 allowed`},
	} {
		_, err := e.lim.Allow(context.Background(), tc.req)
		var be *limiter.BoundError
		if !errors.Is(err, limiter.ErrTooLarge) || !errors.Is(err, limiter.ErrInvalidRequest) || !errors.As(err, &be) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: err = %v; want ErrTooLarge naming %q", tc.name, err, tc.want)
		}
	}
	if got := e.store.Calls.Load(); got != ops {
		t.Errorf("requests over a bound touched the store: %d operations", got-ops)
	}
	if err := (limiter.Bounds{MaxSubject: 1, MaxValue: 0, MaxEntries: 1}).Validate(); err == nil || !strings.Contains(err.Error(), "max_value=0") {
		t.Errorf("Validate of a zero bound: %v", err)
	}
	if _, err := limiter.New(limiter.Config{Rules: parse(t, testRules), Store: e.store, Bounds: limiter.Bounds{MaxSubject: -1}}); err == nil {
		t.Error("New accepted a negative bound")
	}
}
