package lease

import (
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestReturnsGoBackToTheReserve: the tokens a region's acknowledgement says
// its decreases took away from its buckets (Message.Returns) go to the
// key's stored reserve, at most the burst this Allocator's decreases took
// from the region (a region claiming more gets that much), once (a
// duplicate adds nothing), for a version it sent, and not from a region
// whose lease lapsed.
func TestReturnsGoBackToTheReserve(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	c := newCluster(t, cfg)
	k := bucket.Key{Rule: "api", Subject: "t1"}
	ack := func(r string, seq uint64, n bucket.Tokens) Message {
		rr := c.alloc.byName[r]
		return Message{Type: MsgAck, Region: r, Session: rr.session, Term: c.alloc.term, Seq: seq,
			Version: rr.acked, Returns: []Return{{Key: k, Tokens: n}}}
	}
	returned := func() uint64 { return c.alloc.Stats(c.now).Returned }

	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 300}
	c.step(100 * time.Millisecond)
	c.step(100 * time.Millisecond)
	// a wants most of the budget; b and c lend down to what they use.
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 40}
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
	for range 60 {
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	hk := c.alloc.keys[c.alloc.keyIdx[k]]
	sb := &hk.slots[1]
	// room sums the bursts b's decreases took (b first rose above its
	// floor for its demand of 300, then fell to lend it).
	room := sb.room
	lent := int64(hk.bud.b.BurstOf(140) - hk.bud.b.BurstOf(bucket.Tokens(sb.cur)))
	if sb.cur >= 140 || room < lent || room > 600 {
		t.Fatalf("b holds %d with room %d, want below its floor of 140 and room in [%d, 600]", sb.cur, room, lent)
	}
	res := hk.res
	// b claims far more than its decreases could have taken: it gets room.
	if err := c.alloc.Step(c.now, ack("b", 1001, 10_000)); err != nil {
		t.Fatal(err)
	}
	if got := returned(); got != uint64(room) || sb.room != 0 || hk.res != res+float64(room) {
		t.Fatalf("returned %d (room left %d, reserve %.1f → %.1f), want %d", got, sb.room, res, hk.res, room)
	}
	// The same acknowledgement again, or an older one, gives nothing.
	sb.room = 30
	for _, seq := range []uint64{1001, 1000} {
		if err := c.alloc.Step(c.now, ack("b", seq, 30)); err != nil {
			t.Fatal(err)
		}
	}
	if got := returned(); got != uint64(room) {
		t.Fatalf("a duplicate gave back %d more", got-uint64(room))
	}
	// An acknowledgement of a version never sent gives nothing.
	m := ack("b", 1002, 30)
	m.Version = c.alloc.byName["b"].version + 5
	if err := c.alloc.Step(c.now, m); err != nil {
		t.Fatal(err)
	}
	if got := returned(); got != uint64(room) {
		t.Fatalf("an acknowledgement of version %d gave back %d", m.Version, got-uint64(room))
	}
	// A region whose lease lapsed gives back nothing: its decreases'
	// room is gone with it.
	c.cut["b"] = true
	for range 130 {
		c.step(100 * time.Millisecond)
	}
	if !c.alloc.byName["b"].lapsed || sb.room != 0 {
		t.Fatalf("b lapsed %v, room %d; want lapsed with no room", c.alloc.byName["b"].lapsed, sb.room)
	}
	if err := c.alloc.Step(c.now, ack("b", 1003, 30)); err != nil {
		t.Fatal(err)
	}
	if got := returned(); got != uint64(room) {
		t.Fatalf("a lapsed region gave back %d", got-uint64(room))
	}
}
