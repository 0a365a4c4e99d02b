package lease

import (
	"testing"
	"time"
)

// TestLapseCountedOnce: a region whose last message is an acknowledgement,
// sent well after its last request, stays grantable (heard within a TTL)
// after its lease, measured from that request, has run out. The round that
// then renews it cannot extend the lease and un-caps it until the next Tick
// caps it again; the lease ran out once and is counted once.
func TestLapseCountedOnce(t *testing.T) {
	cfg := testConfig() // TTL 10 s, Drift 500 ms, Refresh 3 s
	a, err := NewAllocator(cfg, 1, t0)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.Step(t0, Message{Type: MsgHello, Region: "a", Session: 1, Seq: 1}); err != nil {
		t.Fatal(err)
	}
	// Heard 2.5 s after the request: grantable until 12.5 s, while the
	// lease ends at 10.5 s; the round at 12 s falls in between.
	if err := a.Step(t0.Add(2500*time.Millisecond), Message{Type: MsgAck, Region: "a", Session: 1, Seq: 1, Term: 1}); err != nil {
		t.Fatal(err)
	}
	var renewedAfterLapse bool
	for now := t0; now.Before(t0.Add(15 * time.Second)); now = now.Add(100 * time.Millisecond) {
		a.Tick(now)
		for _, m := range a.Ready() {
			if m.Type == MsgGrant && m.Renew && now.After(t0.Add(cfg.TTL+cfg.Drift)) {
				renewedAfterLapse = true
			}
		}
	}
	if !renewedAfterLapse {
		t.Fatal("no renewal after the lease ran out: the test no longer covers the case")
	}
	if got := a.Stats(t0.Add(15 * time.Second)).Expired; got != 1 {
		t.Fatalf("Expired = %d, want 1: one lease ran out", got)
	}
}
