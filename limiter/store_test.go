package limiter_test

import (
	"context"
	"errors"
	"log/slog"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/bucket/storetest"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.DiscardHandler)

const testRules = `
version: test-1
default_plan: free
no_identity: {action: deny, status: 401}
plans:
  free: "10 per minute"
  pro: "100 per second, burst 300"
rules:
  - name: export
    match: {path: /export}
    cost: 50
  - name: api
    match: {path: "/*"}
    costs:
      - {path: /report, cost: 5}
  - name: login
    match: {endpoint: login}
    limit: "2 per minute"
    subject: [client_ip]
    scope: local
  - name: open
    match: {endpoint: open}
    limit: "1 per minute"
    subject: shared
    on_unavailable: fail_open
  - name: emergency
    match: {endpoint: emergency}
    limit: "100 per minute"
    on_unavailable: {policy: emergency, limit: "3 per minute"}
  - name: shadow
    match: {endpoint: shadow}
    limit: "1 per minute"
    shadow: true
`

func parse(t testing.TB, src string) *rules.Set {
	t.Helper()
	s, err := rules.Parse([]byte(src), "test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// env is a limiter on an in-process store, and its twin: the same rules
// and clock on a store of its own. allow decides each request with
// AllowInto on the one and Allow on the other, so that every test of the
// limiter checks that both give the same decisions, events and counts.
type env struct {
	clk    *clock.Manual
	store  *storetest.Counting
	lim    *limiter.StoreLimiter
	twin   *limiter.StoreLimiter
	mu     sync.Mutex
	events []limiter.Event
	twinEv []limiter.Event
}

func newEnv(t testing.TB, src string, mod func(*limiter.Config)) *env {
	t.Helper()
	e := &env{clk: clock.NewManual(t0)}
	e.store = &storetest.Counting{Store: bucket.NewMemory(bucket.MemoryOptions{Clock: e.clk})}
	cfg := limiter.Config{Rules: parse(t, src), Store: e.store, Clock: e.clk, Logger: quiet}
	if mod != nil {
		mod(&cfg)
	}
	hook := cfg.OnEvent
	cfg.OnEvent = func(ev limiter.Event) {
		e.mu.Lock()
		e.events = append(e.events, ev)
		e.mu.Unlock()
		if hook != nil {
			hook(ev)
		}
	}
	lim, err := limiter.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e.lim = lim
	// The twin logs and counts nowhere else, so that a test counting log
	// lines or metrics counts the limiter's alone.
	cfg.Store, cfg.Logger, cfg.OnDecision = bucket.NewMemory(bucket.MemoryOptions{Clock: e.clk}), quiet, nil
	cfg.OnEvent = func(ev limiter.Event) { e.mu.Lock(); e.twinEv = append(e.twinEv, ev); e.mu.Unlock() }
	if e.twin, err = limiter.New(cfg); err != nil {
		t.Fatal(err)
	}
	return e
}

// allow decides req with AllowInto, into a decision left over from
// another request, and with Allow on the twin, and fails unless both
// decide alike and AllowInto leaves req as it was.
func (e *env) allow(t testing.TB, req limiter.Request) limiter.Decision {
	t.Helper()
	ctx := context.Background()
	before := req
	before.Descriptor = slices.Clone(req.Descriptor)
	d := limiter.Decision{Allowed: true, Reason: limiter.ReasonUnavailable, Remaining: 7, RetryAfter: time.Hour,
		Limit: bucket.PerHour(1), Quota: bucket.PerHour(1), Policy: "stale", Rule: "stale", Plan: "stale",
		Key: bucket.Key{Rule: "stale", Subject: "stale"}, Cost: 9, Shadow: true, Fallback: rules.FailOpen, Status: 599, RulesVersion: "stale"}
	err := e.lim.AllowInto(ctx, &req, &d)
	if err != nil {
		t.Fatalf("AllowInto(%+v): %v", req, err)
	}
	want, err := e.twin.Allow(ctx, req)
	if err != nil {
		t.Fatalf("Allow(%+v): %v", req, err)
	}
	if d != want {
		t.Fatalf("AllowInto(%+v) = %+v, Allow = %+v", req, d, want)
	}
	if !reflect.DeepEqual(req, before) {
		t.Fatalf("AllowInto changed the request %+v to %+v", before, req)
	}
	if a, b := e.lim.Stats(), e.twin.Stats(); a != b {
		t.Fatalf("after %+v: AllowInto's limiter counts %+v, Allow's %+v", req, a, b)
	}
	e.mu.Lock()
	same := slices.EqualFunc(e.events, e.twinEv, func(a, b limiter.Event) bool { return a == b })
	e.mu.Unlock()
	if !same {
		t.Fatalf("after %+v: AllowInto's limiter sent other events than Allow's", req)
	}
	return d
}

func (e *env) kinds() []string {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []string
	for _, ev := range e.events {
		out = append(out, string(ev.Kind))
	}
	return out
}

func path(p string) rules.Descriptor { return rules.Descriptor{{Key: rules.KeyPath, Value: p}} }

func TestPlanQuotaAndCosts(t *testing.T) {
	e := newEnv(t, testRules, nil)
	req := func(p string) limiter.Request {
		return limiter.Request{Subject: "alice", Plan: "free", Descriptor: path(p)}
	}
	d := e.allow(t, req("/items"))
	if !d.Allowed || d.Reason != limiter.ReasonOK || d.Remaining != 9 || d.Cost != 1 ||
		d.Policy != "free" || d.Rule != "api" || d.Plan != "free" || d.Limit != bucket.PerMinute(10) ||
		d.Key != (bucket.Key{Rule: "api", Subject: "alice"}) || d.ResetAfter != 6*time.Second || d.RulesVersion != "test-1" {
		t.Fatalf("first request: %+v", d)
	}
	d = e.allow(t, req("/report"))
	if !d.Allowed || d.Remaining != 4 || d.Cost != 5 || d.ResetAfter != 36*time.Second {
		t.Fatalf("report (cost 5): %+v", d)
	}
	for i := range 4 {
		if d = e.allow(t, req("/items")); !d.Allowed || d.Remaining != bucket.Tokens(3-i) {
			t.Fatalf("request %d: %+v", i, d)
		}
	}
	d = e.allow(t, req("/items"))
	if d.Allowed || d.Reason != limiter.ReasonOverLimit || d.RetryAfter != 6*time.Second ||
		d.RetryAfterSeconds() != 6 || d.ResetSeconds() != 60 || d.Remaining != 0 {
		t.Fatalf("over limit: %+v", d)
	}
	// A request of cost 5 must wait for five tokens: 30 s.
	if d = e.allow(t, req("/report")); d.Allowed || d.RetryAfter != 30*time.Second {
		t.Fatalf("report over limit: %+v", d)
	}
	e.clk.Advance(6*time.Second - time.Millisecond)
	if d = e.allow(t, req("/items")); d.Allowed || d.RetryAfter != time.Millisecond || d.RetryAfterSeconds() != 1 {
		t.Fatalf("1 ms early: %+v (Retry-After must round up to 1)", d)
	}
	e.clk.Advance(time.Millisecond)
	if d = e.allow(t, req("/items")); !d.Allowed {
		t.Fatalf("after 6 s: %+v", d)
	}
	// Another subject has its own bucket; pro has its own quota.
	if d = e.allow(t, limiter.Request{Subject: "bob", Plan: "pro", Descriptor: path("/items")}); !d.Allowed ||
		d.Remaining != 299 || d.Policy != "pro" {
		t.Fatalf("bob on pro: %+v", d)
	}
	// The plan can come from the descriptor.
	d = e.allow(t, limiter.Request{Subject: "carol", Descriptor: rules.Descriptor{{Key: "plan", Value: "pro"}, {Key: "path", Value: "/x"}}})
	if d.Plan != "pro" {
		t.Fatalf("plan from descriptor: %+v", d)
	}
	// No plan at all is the default plan, not an unknown one.
	if d = e.allow(t, limiter.Request{Subject: "dave", Descriptor: path("/x")}); d.Plan != "free" || d.Reason != limiter.ReasonOK {
		t.Fatalf("no plan: %+v", d)
	}
	if len(e.kinds()) != 0 {
		t.Errorf("unexpected events %v", e.kinds())
	}
}

func TestNeverFitsTouchesNoStore(t *testing.T) {
	e := newEnv(t, testRules, nil)
	d := e.allow(t, limiter.Request{Subject: "alice", Plan: "free", Descriptor: path("/export")})
	if d.Allowed || d.Reason != limiter.ReasonNeverFits || d.RetryAfter != 0 || d.RetryAfterSeconds() != 0 || d.Cost != 50 {
		t.Fatalf("cost 50 on free: %+v", d)
	}
	if n := e.store.Calls.Load(); n != 0 {
		t.Errorf("store called %d times for a cost that can never fit", n)
	}
	if d = e.allow(t, limiter.Request{Subject: "alice", Plan: "pro", Descriptor: path("/export")}); !d.Allowed || d.Remaining != 250 {
		t.Fatalf("cost 50 on pro: %+v", d)
	}
	if got := e.kinds(); strings.Join(got, ",") != "can-never-fit" {
		t.Errorf("events %v", got)
	}
	// An explicit cost above the burst, by rule name.
	if d = e.allow(t, limiter.Request{Subject: "x", Rule: "api", Cost: 11}); d.Reason != limiter.ReasonNeverFits {
		t.Fatalf("explicit cost 11: %+v", d)
	}
}

func TestNoIdentity(t *testing.T) {
	e := newEnv(t, testRules, nil)
	d := e.allow(t, limiter.Request{Descriptor: path("/items")})
	if d.Allowed || d.Reason != limiter.ReasonNoIdentity || d.Status != 401 || d.Limited() {
		t.Fatalf("no identity: %+v", d)
	}
	// A subject from descriptor keys: missing key is no identity.
	if d = e.allow(t, limiter.Request{Subject: "alice", Descriptor: rules.Descriptor{{Key: "endpoint", Value: "login"}}}); d.Reason != limiter.ReasonNoIdentity {
		t.Fatalf("login without client_ip: %+v", d)
	}
	if e.store.Calls.Load() != 0 {
		t.Error("store called for a request without identity")
	}
	src := strings.Replace(testRules, "no_identity: {action: deny, status: 401}", "no_identity: default_plan", 1)
	e = newEnv(t, src, nil)
	for i := range 10 {
		if d = e.allow(t, limiter.Request{Descriptor: path("/items")}); !d.Allowed || d.Plan != "free" ||
			d.Key.Subject != rules.AnonymousSubject {
			t.Fatalf("anonymous %d: %+v", i, d)
		}
	}
	if d = e.allow(t, limiter.Request{Descriptor: path("/items")}); d.Allowed {
		t.Fatalf("anonymous requests share one default-plan bucket: %+v", d)
	}
	if got := e.lim.Stats().NoIdentity; got != 11 {
		t.Errorf("Stats().NoIdentity = %d, want 11", got)
	}
}

func TestUnknownPlan(t *testing.T) {
	for _, c := range []struct {
		action  string
		allowed bool
		reason  limiter.Reason
	}{
		{"default_plan", true, limiter.ReasonOK},
		{"deny", false, limiter.ReasonUnknownPlan},
		{"allow", true, limiter.ReasonUnknownPlan},
	} {
		t.Run(c.action, func(t *testing.T) {
			e := newEnv(t, "unknown_plan: "+c.action+"\n"+testRules, nil)
			d := e.allow(t, limiter.Request{Subject: "alice", Plan: "gold", Descriptor: path("/items")})
			if d.Allowed != c.allowed || d.Reason != c.reason || d.Plan != "gold" {
				t.Fatalf("unknown plan: %+v", d)
			}
			if got := e.kinds(); strings.Join(got, ",") != "unknown-plan" {
				t.Errorf("events %v", got)
			}
			if c.action != "default_plan" {
				if d.Limited() || e.store.Calls.Load() != 0 {
					t.Errorf("%s must not charge a bucket: %+v, %d store calls", c.action, d, e.store.Calls.Load())
				}
				return
			}
			if d.Limit != bucket.PerMinute(10) || d.Policy != "free" || d.Key.Subject != rules.UnknownPlanPrefix+"alice" || d.Remaining != 9 {
				t.Fatalf("default plan in its own bucket: %+v", d)
			}
			for range 9 {
				e.allow(t, limiter.Request{Subject: "alice", Plan: "gold", Descriptor: path("/items")})
			}
			if d = e.allow(t, limiter.Request{Subject: "alice", Plan: "gold", Descriptor: path("/items")}); d.Allowed {
				t.Fatalf("unknown plan is never unlimited: %+v", d)
			}
			// Alice's bucket under a known plan is untouched.
			if d = e.allow(t, limiter.Request{Subject: "alice", Plan: "free", Descriptor: path("/items")}); !d.Allowed || d.Remaining != 9 {
				t.Fatalf("alice on free after the unknown plan's bucket ran out: %+v", d)
			}
		})
	}
}

func TestNoRuleAndErrors(t *testing.T) {
	e := newEnv(t, testRules, nil)
	d := e.allow(t, limiter.Request{Subject: "a", Descriptor: rules.Descriptor{{Key: "endpoint", Value: "elsewhere"}}})
	if !d.Allowed || d.Reason != limiter.ReasonNoRule || d.Limited() {
		t.Fatalf("no rule: %+v", d)
	}
	ctx := context.Background()
	if _, err := e.lim.Allow(ctx, limiter.Request{Subject: "a", Rule: "nope"}); !errors.Is(err, limiter.ErrUnknownRule) || !strings.Contains(err.Error(), `"nope"`) {
		t.Errorf("unknown rule: %v", err)
	}
	if _, err := e.lim.Allow(ctx, limiter.Request{Subject: "a", Rule: "api", Cost: -1}); !errors.Is(err, limiter.ErrInvalidRequest) || !strings.Contains(err.Error(), "cost=-1") {
		t.Errorf("negative cost: %v", err)
	}
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := e.lim.Allow(canceled, limiter.Request{Subject: "a", Rule: "api"}); !errors.Is(err, context.Canceled) {
		t.Errorf("canceled context: %v", err)
	}
	if _, err := limiter.New(limiter.Config{Store: e.store}); err == nil || !strings.Contains(err.Error(), "Config.Rules") {
		t.Errorf("New without rules: %v", err)
	}
	if _, err := limiter.New(limiter.Config{Rules: parse(t, testRules)}); err == nil || !strings.Contains(err.Error(), "Config.Store") {
		t.Errorf("New without store: %v", err)
	}
}

// TestAllowIntoFailsAsAllow: a request that cannot be decided gets from
// AllowInto the error Allow gives, and the same partial decision.
func TestAllowIntoFailsAsAllow(t *testing.T) {
	e := newEnv(t, testRules, nil)
	canceled, cancel := context.WithCancel(context.Background())
	cancel()
	for _, c := range []struct {
		ctx context.Context
		req limiter.Request
	}{
		{context.Background(), limiter.Request{Subject: "a", Rule: "nope"}},
		{context.Background(), limiter.Request{Subject: "a", Rule: "api", Cost: -1}},
		{context.Background(), limiter.Request{Subject: strings.Repeat("s", 257), Rule: "api"}},
		{canceled, limiter.Request{Subject: "a", Rule: "api"}},
	} {
		want, werr := e.twin.Allow(c.ctx, c.req)
		d := limiter.Decision{Allowed: true, Rule: "stale", RulesVersion: "stale"}
		err := e.lim.AllowInto(c.ctx, &c.req, &d)
		if err == nil || werr == nil || err.Error() != werr.Error() || d != want {
			t.Errorf("%+v: AllowInto %+v, %v; Allow %+v, %v", c.req, d, err, want, werr)
		}
	}
}

func TestLocalScopeUsesLocalStore(t *testing.T) {
	e := newEnv(t, testRules, nil)
	login := rules.Descriptor{{Key: "endpoint", Value: "login"}, {Key: "client_ip", Value: "127.0.0.1"}}
	for i := range 2 {
		if d := e.allow(t, limiter.Request{Descriptor: login}); !d.Allowed {
			t.Fatalf("login %d: %+v", i, d)
		}
	}
	d := e.allow(t, limiter.Request{Descriptor: login})
	if d.Allowed || d.Key.Subject != "client_ip=127.0.0.1" || d.Policy != "login" {
		t.Fatalf("third login: %+v", d)
	}
	if n := e.store.Calls.Load(); n != 0 {
		t.Errorf("a local rule called the shared store %d times", n)
	}
}

func TestShadowNeverRejects(t *testing.T) {
	e := newEnv(t, testRules, nil)
	req := limiter.Request{Subject: "a", Descriptor: rules.Descriptor{{Key: "endpoint", Value: "shadow"}}}
	if d := e.allow(t, req); !d.Allowed || !d.Shadow || d.Reason != limiter.ReasonOK {
		t.Fatalf("first: %+v", d)
	}
	for i := range 3 {
		d := e.allow(t, req)
		if !d.Allowed || !d.Shadow || d.Reason != limiter.ReasonOverLimit || d.RetryAfter <= 0 {
			t.Fatalf("shadow denial %d: %+v", i, d)
		}
	}
	if s := e.lim.Stats(); s.ShadowDenied != 3 || s.Denied != 0 || s.Decisions != 4 {
		t.Errorf("stats %+v", s)
	}
	if got := e.kinds(); strings.Join(got, ",") != "shadow-deny,shadow-deny,shadow-deny" {
		t.Errorf("events %v", got)
	}
}

func TestAttemptIDIsIdempotent(t *testing.T) {
	e := newEnv(t, testRules, nil)
	req := limiter.Request{Subject: "a", Descriptor: path("/report"), AttemptID: "req-1"}
	d1 := e.allow(t, req)
	d2 := e.allow(t, req)
	if !d1.Allowed || d1.Remaining != 5 || d2.Remaining != 5 {
		t.Fatalf("retry with one attempt id debited twice: %+v then %+v", d1, d2)
	}
}

func TestReloadAppliesToNextDecision(t *testing.T) {
	h := rules.NewReloader(parse(t, testRules), quiet, nil)
	e := newEnv(t, testRules, func(c *limiter.Config) { c.Rules = h })
	if d := e.allow(t, limiter.Request{Subject: "a", Descriptor: path("/x")}); d.Limit != bucket.PerMinute(10) {
		t.Fatalf("before: %+v", d)
	}
	src := strings.Replace(strings.Replace(testRules, `free: "10 per minute"`, `free: "20 per minute"`, 1), "test-1", "test-2", 1)
	if u := h.Apply([]byte(src), "mem"); !u.Changed {
		t.Fatal(u.Err)
	}
	d := e.allow(t, limiter.Request{Subject: "a", Descriptor: path("/x")})
	if d.Limit != bucket.PerMinute(20) || d.RulesVersion != "test-2" {
		t.Fatalf("after reload: %+v", d)
	}
}

func TestEventsAreLoggedAtMostOncePerInterval(t *testing.T) {
	var mu sync.Mutex
	var buf strings.Builder
	logger := slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
	e := newEnv(t, testRules, func(c *limiter.Config) { c.Logger = logger })
	for range 5 {
		e.allow(t, limiter.Request{Descriptor: path("/x")})
	}
	e.clk.Advance(time.Second)
	e.allow(t, limiter.Request{Descriptor: path("/x")})
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	if n := strings.Count(out, "event=no-identity"); n != 2 {
		t.Errorf("logged %d no-identity lines, want 2:\n%s", n, out)
	}
	if !strings.Contains(out, "folded=4") || !strings.Contains(out, "rules_version=test-1") {
		t.Errorf("log does not say how many were folded or the rules version:\n%s", out)
	}
	if len(e.kinds()) != 6 {
		t.Errorf("hook saw %d events, want all 6", len(e.kinds()))
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	b  *strings.Builder
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.Write(p)
}

// TestFailurePolicies kills a real Redis under the limiter and checks each
// rule's failure policy: fail closed denies with a Retry-After, fail open
// admits and counts, emergency enforces its in-process limit, sized by the
// configured function.
func TestFailurePolicies(t *testing.T) {
	srv := testenv.StartRedis(t)
	rs, err := redisstore.New(srv.Client(t), redisstore.Options{Timeout: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(t0)
	var sized atomic.Int64
	var events []limiter.Event
	var mu sync.Mutex
	lim, err := limiter.New(limiter.Config{
		Rules: parse(t, testRules), Store: rs, Clock: clk, Logger: quiet,
		EmergencyLimit: func(r *rules.Rule, key bucket.Key, normal bucket.Limit) bucket.Limit {
			sized.Add(1)
			if normal != bucket.PerMinute(100) || key.Rule != "emergency" {
				t.Errorf("EmergencyLimit(%s, %v, %v)", r.Name, key, normal)
			}
			return limiter.RuleEmergencyLimit(r, key, normal) // 3 per minute
		},
		OnEvent: func(e limiter.Event) { mu.Lock(); events = append(events, e); mu.Unlock() },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	ep := func(name string) limiter.Request {
		return limiter.Request{Subject: "alice", Descriptor: rules.Descriptor{{Key: "endpoint", Value: name}}}
	}
	if d, err := lim.Allow(ctx, ep("emergency")); err != nil || !d.Allowed || d.Fallback != "" {
		t.Fatalf("with Redis up: %+v %v", d, err)
	}
	srv.Kill()

	d, err := lim.Allow(ctx, limiter.Request{Subject: "alice", Descriptor: path("/x")})
	if err != nil || d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailClosed || d.RetryAfterSeconds() != 1 {
		t.Fatalf("fail closed: %+v %v", d, err)
	}
	for i := range 3 {
		d, err = lim.Allow(ctx, ep("open"))
		if err != nil || !d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailOpen {
			t.Fatalf("fail open %d: %+v %v", i, d, err)
		}
	}
	for i := range 3 {
		d, err = lim.Allow(ctx, ep("emergency"))
		if err != nil || !d.Allowed || d.Fallback != rules.Emergency || d.Limit != bucket.PerMinute(3) || d.Remaining != bucket.Tokens(2-i) {
			t.Fatalf("emergency %d: %+v %v", i, d, err)
		}
	}
	d, err = lim.Allow(ctx, ep("emergency"))
	if err != nil || d.Allowed || d.Reason != limiter.ReasonOverLimit || d.Fallback != rules.Emergency || d.RetryAfter != 20*time.Second {
		t.Fatalf("emergency limit exhausted: %+v %v", d, err)
	}
	s := lim.Stats()
	if s.FailOpen != 3 || s.Emergency != 4 || s.StoreErrors != 8 || sized.Load() != 4 {
		t.Errorf("stats %+v, emergency sized %d times", s, sized.Load())
	}
	mu.Lock()
	defer mu.Unlock()
	var storeErrs int
	for _, e := range events {
		if e.Kind == limiter.EventStoreError {
			storeErrs++
			if !errors.Is(e.Err, bucket.ErrUnavailable) {
				t.Errorf("store error event without ErrUnavailable: %v", e.Err)
			}
		}
	}
	if storeErrs != 8 {
		t.Errorf("%d store-error events, want 8", storeErrs)
	}
}

// TestRedisBacked runs the same plan through the Redis store: 10 per minute
// admits exactly 10 of 11.
func TestRedisBacked(t *testing.T) {
	c := testenv.RedisClient(t)
	clk := clock.NewManual(t0)
	rs, err := redisstore.New(c, redisstore.Options{Prefix: "limiter-test:" + time.Now().Format("150405.000000000") + ":", Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	lim, err := limiter.New(limiter.Config{Rules: parse(t, testRules), Store: rs, Clock: clk, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	allowed := 0
	for range 11 {
		d, err := lim.Allow(context.Background(), limiter.Request{Subject: "alice", Descriptor: path("/x")})
		if err != nil {
			t.Fatal(err)
		}
		if d.Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("%d of 11 allowed, want 10", allowed)
	}
}

// TestConcurrentWithReloads admits from many goroutines while the rules are
// swapped underneath (same quota, new version each time): exactly the
// quota is admitted, and every decision names a version that was in force.
func TestConcurrentWithReloads(t *testing.T) {
	h := rules.NewReloader(parse(t, testRules), quiet, nil)
	e := newEnv(t, testRules, func(c *limiter.Config) { c.Rules = h })
	versions := map[string]bool{"test-1": true}
	var vmu sync.Mutex
	stop := make(chan struct{})
	reloaded := make(chan struct{})
	go func() {
		defer close(reloaded)
		for i := 2; i < 200; i++ {
			select {
			case <-stop:
				return
			default:
			}
			v := "test-" + strconv.Itoa(i)
			vmu.Lock()
			versions[v] = true
			vmu.Unlock()
			h.Apply([]byte(strings.Replace(testRules, "test-1", v, 1)), "mem")
		}
	}()
	var allowed atomic.Int64
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			for range 50 {
				d, err := e.lim.Allow(context.Background(), limiter.Request{Subject: "shared-tenant", Descriptor: path("/x")})
				if err != nil {
					t.Error(err)
					return
				}
				vmu.Lock()
				known := versions[d.RulesVersion]
				vmu.Unlock()
				if !known {
					t.Errorf("decision under unknown rules version %q", d.RulesVersion)
				}
				if d.Allowed {
					allowed.Add(1)
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	<-reloaded
	if got := allowed.Load(); got != 10 {
		t.Errorf("%d of 400 admitted on 10 per minute, want 10", got)
	}
}

func TestPlanPrecedenceAndPlanKey(t *testing.T) {
	e := newEnv(t, testRules, nil)
	d := e.allow(t, limiter.Request{Subject: "a", Plan: "pro", Descriptor: rules.Descriptor{{Key: "plan", Value: "free"}, {Key: "path", Value: "/x"}}})
	if d.Plan != "pro" {
		t.Errorf("Request.Plan must win over the descriptor's plan: %+v", d)
	}
	e = newEnv(t, "plan_key: tier\n"+testRules, nil)
	d = e.allow(t, limiter.Request{Subject: "a", Descriptor: rules.Descriptor{{Key: "plan", Value: "free"}, {Key: "tier", Value: "pro"}, {Key: "path", Value: "/x"}}})
	if d.Plan != "pro" || d.Limit != bucket.PerSecond(100).WithBurst(300) {
		t.Errorf("plan_key tier: %+v", d)
	}
}
