package region

import (
	"context"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

const storeTestRules = `version: store-test
rules:
  - name: closed
    match: {path: "/closed"}
    limit: "300 per second"
    on_unavailable: fail_closed
  - name: open
    match: {path: "/open"}
    limit: "300 per second"
    on_unavailable: fail_open
  - name: emergency
    match: {path: "/emergency"}
    limit: "300 per second"
    on_unavailable: {policy: emergency}
`

// TestLimiterOnTheRegionStore plugs the agent's Store into the edge's
// limiter unchanged and checks what the edge reports for each policy when
// the regional store is down, and that the bucket.Store methods act on the
// region's allocation.
func TestLimiterOnTheRegionStore(t *testing.T) {
	set, err := rules.Parse([]byte(storeTestRules), "store-test.yaml")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(c *Config) {
		c.Rules = RuleConfigs(set, nil)
		c.BreakerFailures = 100
		c.BreakerMaxBackoff = time.Minute
	})
	f.core.SetLive(2)
	st := NewStore(f.core, f.clk, NewNamer(set), nil)
	lim, err := limiter.New(limiter.Config{Rules: set, Store: st, Clock: f.clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	req := func(path string) limiter.Decision {
		d, err := lim.Allow(ctx, limiter.Request{Subject: "s", Descriptor: rules.Descriptor{{Key: rules.KeyPath, Value: path}}})
		if err != nil {
			t.Fatal(err)
		}
		return d
	}
	// Up: the floor (a third of 300/s) is what the region enforces.
	if d := req("/closed"); !d.Allowed || d.Remaining != 99 {
		t.Fatalf("store up: %+v, want admitted with 99 of the floor's 100 left", d)
	}
	k := bucket.Key{Rule: "closed", Subject: "s"}
	if p, err := st.Peek(ctx, k, bucket.PerSecond(300)); err != nil || p.Remaining != 99 || p.Limit != bucket.PerSecond(100) {
		t.Fatalf("Peek: %+v %v, want the region's bucket at its floor", p, err)
	}
	if n, err := st.TakeUpTo(ctx, k, bucket.PerSecond(300), 1000); err != nil || n != 99 {
		t.Fatalf("TakeUpTo: %d %v, want the 99 the region's bucket holds", n, err)
	}
	if err := st.Return(ctx, k, bucket.PerSecond(300), 1000); err != nil {
		t.Fatal(err)
	}
	if p, _ := st.Peek(ctx, k, bucket.PerSecond(300)); p.Remaining != 100 {
		t.Fatalf("after Return: %d, want the floor's burst 100 (never more)", p.Remaining)
	}

	f.store.setDown(true)
	if d := req("/closed"); d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailClosed {
		t.Fatalf("fail closed at the edge: %+v", d)
	}
	if d := req("/open"); !d.Allowed || d.Reason != limiter.ReasonUnavailable || d.Fallback != rules.FailOpen {
		t.Fatalf("fail open at the edge: %+v", d)
	}
	if lim.Stats().FailOpen != 1 {
		t.Fatalf("edge fail-open count %d, want 1", lim.Stats().FailOpen)
	}
	// Emergency is decided by the agent: the floor halved between 2
	// agents, in a bucket that starts empty when the breaker opens.
	if d := req("/emergency"); d.Allowed || d.Reason != limiter.ReasonOverLimit {
		t.Fatalf("emergency with the breaker closed: %+v, want denied by the empty emergency bucket", d)
	}
	for f.core.Breaker().State(f.clk.Now()) == BreakerClosed {
		req("/closed")
	}
	f.clk.Advance(time.Second)
	admitted := 0
	for i := 0; i < 100; i++ {
		if d := req("/emergency"); d.Allowed {
			admitted++
		}
	}
	if admitted != 50 {
		t.Fatalf("emergency admitted %d, want 50 (floor burst 100 ÷ 2 live agents)", admitted)
	}
}
