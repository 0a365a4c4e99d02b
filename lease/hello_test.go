package lease

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestHelloWithoutDemandIsNotAReport: a region whose speaking agent
// changes restores its Holder from the region's table and says hello at
// once, before it has read any agent's demand, so the hello carries none.
// Unreported is not unused: until the region's first report the Allocator
// keeps its floor of every key. Counted as a report, the empty hello made
// the region's keys unused, and the next round lent its floor just as it
// came back (redis-cut-emergency: us-east granted 0 of a key it pressed
// on, for 1.4 s after its Redis returned).
func TestHelloWithoutDemandIsNotAReport(t *testing.T) {
	cfg := testConfig() // 600 a minute over a, b, c: floors 133
	a, err := NewAllocator(cfg, 1, t0)
	if err != nil {
		t.Fatal(err)
	}
	k := bucket.Key{Rule: "api", Subject: "t1"}
	session := map[string]uint64{"a": 1, "b": 2, "c": 3}
	seq := map[string]uint64{}
	send := func(now time.Time, m Message) {
		t.Helper()
		seq[m.Region]++
		m.Session, m.Seq = session[m.Region], seq[m.Region]
		if err := a.Step(now, m); err != nil {
			t.Fatal(err)
		}
	}
	// Every grant is acknowledged at once, in the session it names.
	ack := func(now time.Time) {
		for _, m := range a.Ready() {
			if m.Type == MsgGrant && m.Session == session[m.Region] {
				send(now, Message{Type: MsgAck, Region: m.Region, Term: m.Term, Grant: m.Grant, Version: m.Version})
			}
		}
	}
	report := func(now time.Time, r string, want bucket.Tokens) {
		var d []Demand
		if want > 0 {
			d = []Demand{{Key: k, Want: want}}
		}
		send(now, Message{Type: MsgReport, Region: r, Term: 1, Demand: d})
	}
	for _, r := range []string{"a", "b", "c"} {
		send(t0, Message{Type: MsgHello, Region: r})
	}
	now := t0
	step := func(d time.Duration, reportB bool) {
		for end := now.Add(d); now.Before(end); now = now.Add(100 * time.Millisecond) {
			if now.Sub(t0)%cfg.Refresh == 0 {
				report(now, "a", 1000)
				if reportB {
					report(now, "b", 1000)
				}
				report(now, "c", 0)
			}
			a.Tick(now)
			ack(now)
		}
	}
	slot := func(r string) int64 {
		j, ok := a.keyIdx[k]
		if !ok {
			t.Fatal("the key is not hot")
		}
		return a.keys[j].slots[slices.Index(a.keys[j].bud.regions, a.byName[r])].cur
	}
	step(20*time.Second, true)
	if a0, b0 := slot("a"), slot("b"); a0 != 300 || b0 != 300 {
		t.Fatalf("before the hello a=%d b=%d, want 300 each", a0, b0)
	}
	// b's new speaking agent: a new session, a hello holding its entry and
	// no demand, then no report for a whole refresh interval and more.
	session["b"], seq["b"] = 20, 0
	send(now, Message{Type: MsgHello, Region: "b", Term: 1, Entries: []Entry{{Key: k, Count: 300, Burst: 30}}})
	ack(now)
	step(cfg.Refresh+cfg.Refresh/2, false)
	if b := slot("b"); b < 133 {
		t.Fatalf("after a hello without demand b holds %d: its floor (133) was lent before it reported", b)
	}
	report(now, "b", 1000)
	step(cfg.Refresh, true)
	if a1, b1 := slot("a"), slot("b"); a1 != 300 || b1 != 300 {
		t.Fatalf("after b reported a=%d b=%d, want 300 each", a1, b1)
	}
}
