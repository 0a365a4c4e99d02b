package lease

import (
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

func newTestHolder(t *testing.T) *Holder {
	t.Helper()
	hc := DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 7, testConfig().Budgets
	h, err := NewHolder(hc, t0)
	if err != nil {
		t.Fatal(err)
	}
	return h
}

// grantedTestHolder is newTestHolder after its first grant, a full table
// of es, and its acknowledgement.
func grantedTestHolder(t *testing.T, es ...Entry) *Holder {
	t.Helper()
	h := newTestHolder(t)
	hello := h.Ready()[0]
	if err := h.Step(t0, grantMsg(1, 1, 0, hello.Seq, true, true, es...)); err != nil {
		t.Fatal(err)
	}
	h.Ready() // the acknowledgement
	return h
}

var hk = bucket.Key{Rule: "api", Subject: "t"}

func grantMsg(term, ver, base, seq uint64, full, renew bool, es ...Entry) Message {
	d := DefaultConfig()
	return Message{Type: MsgGrant, Region: "a", Session: 7, Term: term, Seq: seq, Grant: ver, Version: ver, Base: base,
		Full: full, Renew: renew, TTL: d.TTL, Hold: d.Hold, Refresh: d.Refresh, Drift: d.Drift, Entries: es}
}

func count(t *testing.T, h *Holder, at time.Time) bucket.Tokens {
	t.Helper()
	l, ok := h.Allocation(at, hk)
	if !ok {
		t.Fatal("no budget for api")
	}
	return l.Count()
}

// TestHolderLeaseFromSendTime: the lease is measured from when the request
// the grant answers was sent, less the drift margin (I4), not from when the
// grant arrived; after it, the region is back on its floor (I5).
func TestHolderLeaseFromSendTime(t *testing.T) {
	h := newTestHolder(t)
	hello := h.Ready()[0] // sent at t0
	if hello.Type != MsgHello || hello.Seq != 1 {
		t.Fatalf("first message %v, want hello seq 1", hello)
	}
	arrive := t0.Add(4 * time.Second) // a slow grant
	if err := h.Step(arrive, grantMsg(1, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 300, Burst: 30})); err != nil {
		t.Fatal(err)
	}
	// TTL 10 s − drift 0.5 s from t0, although the grant arrived at 4 s.
	if got := count(t, h, t0.Add(9499*time.Millisecond)); got != 300 {
		t.Fatalf("at 9.499 s: %d, want the leased 300", got)
	}
	if got := count(t, h, t0.Add(9500*time.Millisecond)); got != 133 {
		t.Fatalf("at 9.5 s: %d, want the floor 133", got)
	}
	// A grant answering an unknown request does not renew.
	_ = h.Step(arrive, grantMsg(1, 1, 1, 999, false, true))
	if got := count(t, h, t0.Add(9500*time.Millisecond)); got != 133 {
		t.Fatalf("renewed by a grant for a request never sent: %d", got)
	}
}

// TestHolderLentFloorHolds: an entry below the floor stays lent after the
// lease ends, until Hold after the grant was received plus the drift
// margin in proportion to Hold (Drift×Hold/TTL: 0.5 s × 20 s / 10 s).
func TestHolderLentFloorHolds(t *testing.T) {
	h := grantedTestHolder(t, Entry{Key: hk, Count: 20, Burst: 2})
	if got := count(t, h, t0.Add(15*time.Second)); got != 20 {
		t.Fatalf("lease over, hold on: %d, want the lent 20", got)
	}
	if got := count(t, h, t0.Add(20999*time.Millisecond)); got != 20 {
		t.Fatalf("just before hold+margin: %d, want 20", got)
	}
	if got := count(t, h, t0.Add(21*time.Second)); got != 133 {
		t.Fatalf("after hold+margin: %d, want the floor 133", got)
	}
}

// TestHolderFencing: a grant from an older term is ignored; a newer term
// is accepted only as a full table; a learning leader's grant never raises.
func TestHolderFencing(t *testing.T) {
	h := newTestHolder(t)
	hello := h.Ready()[0]
	_ = h.Step(t0, grantMsg(5, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 300, Burst: 30}))
	h.Ready()
	_ = h.Step(t0, grantMsg(4, 9, 0, hello.Seq, true, true, Entry{Key: hk, Count: 600, Burst: 60}))
	if got := count(t, h, t0); got != 300 || h.Status(t0).Term != 5 {
		t.Fatalf("after a term-4 grant: %d at term %d, want 300 at term 5", got, h.Status(t0).Term)
	}
	// A delta from term 6 cannot apply: the Holder asks for a full table.
	_ = h.Step(t0, grantMsg(6, 2, 1, hello.Seq, false, true, Entry{Key: hk, Count: 500, Burst: 50}))
	if got := count(t, h, t0); got != 300 {
		t.Fatalf("a term-6 delta applied: %d", got)
	}
	h.Tick(t0)
	if out := h.Ready(); len(out) == 0 || out[0].Type != MsgHello {
		t.Fatalf("after a delta from a new term: %v, want a hello", out)
	}
	learning := grantMsg(6, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 500, Burst: 50})
	learning.Learning = true
	_ = h.Step(t0, learning)
	if got := count(t, h, t0); got != 300 || h.Status(t0).Term != 6 {
		t.Fatalf("a learning leader's full table: %d at term %d, want 300 (never raised) at term 6", got, h.Status(t0).Term)
	}
}

// TestHolderVersions: duplicates and reordered grants are harmless; a gap
// asks for a full table at once, and a delta ahead of it applies if the
// missing version arrives first.
func TestHolderVersions(t *testing.T) {
	h := newTestHolder(t)
	hello := h.Ready()[0]
	g1 := grantMsg(1, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 300, Burst: 30})
	g2 := grantMsg(1, 2, 1, hello.Seq, false, false, Entry{Key: hk, Count: 200, Burst: 20})
	_ = h.Step(t0, g1)
	_ = h.Step(t0, g2)
	_ = h.Step(t0, g1) // late duplicate of an older version
	if got := count(t, h, t0); got != 200 {
		t.Fatalf("after g1 g2 g1: %d, want 200", got)
	}
	h.Ready()
	_ = h.Step(t0, grantMsg(1, 4, 3, hello.Seq, false, false, Entry{Key: hk, Count: 400, Burst: 40}))
	if got := count(t, h, t0); got != 200 {
		t.Fatalf("a delta over a missing version applied: %d", got)
	}
	h.Tick(t0)
	out := h.Ready()
	if len(out) == 0 || out[len(out)-1].Type != MsgHello {
		t.Fatalf("after a gap: %v, want a hello", out)
	}
	// The missing version was only late: it applies, and the delta kept
	// ahead of it after it.
	_ = h.Step(t0, grantMsg(1, 3, 2, hello.Seq, false, false, Entry{Key: hk, Count: 250, Burst: 25}))
	if got := count(t, h, t0); got != 400 {
		t.Fatalf("after the late version 3: %d, want 400 (version 4 kept and applied after it)", got)
	}
}

// reportedHolder returns a Holder granted v1 (300, renewing) at t0, the
// lease end that gave it, and the report it sent a refresh interval later
// (at), for the grants that answer it.
func reportedHolder(t *testing.T) (h *Holder, end1, at time.Time, rep []Message) {
	t.Helper()
	h = grantedTestHolder(t, Entry{Key: hk, Count: 300, Burst: 30})
	end1 = h.Status(t0).LeaseEnd
	at = t0.Add(DefaultConfig().Refresh)
	h.Tick(at)
	rep = h.Ready()
	if len(rep) != 1 || rep[0].Type != MsgReport {
		t.Fatalf("a refresh later: %v, want a report", rep)
	}
	return h, end1, at, rep
}

// TestHolderReorderedDeltas: deltas that overtake the grant they build on
// are kept and applied, in order, when it arrives, each acknowledged then
// (not before), a renewal among them extending the lease as it would have
// in order; an expiry voids them, and any grant sent before it.
func TestHolderReorderedDeltas(t *testing.T) {
	h, end1, at, rep := reportedHolder(t)
	// The leader answers with v2, then v3 (a delta that also renews), and
	// v4; v4 and v3 arrive first, v3 twice.
	v2 := grantMsg(1, 2, 1, rep[0].Seq, false, false, Entry{Key: hk, Count: 200, Burst: 20})
	v3 := grantMsg(1, 3, 2, rep[0].Seq, false, true, Entry{Key: hk, Count: 250, Burst: 25})
	v4 := grantMsg(1, 4, 3, rep[0].Seq, false, false, Entry{Key: hk, Count: 260, Burst: 26})
	at = at.Add(50 * time.Millisecond)
	for _, m := range []Message{v4, v3, v3} {
		_ = h.Step(at, m)
	}
	if got := count(t, h, at); got != 300 || !h.Status(at).LeaseEnd.Equal(end1) {
		t.Fatalf("deltas ahead of the table applied: count %d, lease to %v (was %v)", got, h.Status(at).LeaseEnd.Sub(t0), end1.Sub(t0))
	}
	for _, m := range h.Ready() {
		if m.Type == MsgAck {
			t.Fatalf("a delta ahead of the table acknowledged: %+v", m)
		}
	}
	_ = h.Step(at.Add(time.Millisecond), v2)
	want := at.Add(-50*time.Millisecond + DefaultConfig().TTL - DefaultConfig().Drift)
	if got := h.Status(at).LeaseEnd; !got.Equal(want) || count(t, h, at) != 260 {
		t.Fatalf("after v2: lease to %v, count %d; want %v (v3's renewal) and 260 (v4)", got.Sub(t0), count(t, h, at), want.Sub(t0))
	}
	var acked []uint64
	for _, m := range h.Ready() {
		if m.Type == MsgAck {
			acked = append(acked, m.Version)
		}
	}
	if !slices.Equal(acked, []uint64{2, 3, 4}) {
		t.Fatalf("acknowledged versions %v, want [2 3 4]", acked)
	}

	// A delta kept ahead, then an expiry: grants sent before it (numbered
	// at most its number) are void after it, kept or late; one sent
	// after it applies.
	at = at.Add(time.Second)
	_ = h.Step(at, grantMsg(1, 6, 5, rep[0].Seq, false, false, Entry{Key: hk, Count: 500, Burst: 50}))
	_ = h.Step(at, Message{Type: MsgExpire, Region: "a", Session: 7, Term: 1, Grant: 7})
	_ = h.Step(at, grantMsg(1, 5, 4, rep[0].Seq, false, true, Entry{Key: hk, Count: 270, Burst: 27}))
	if tb := h.Table(); len(tb) != 0 || h.Status(at).LeaseEnd.After(at) {
		t.Fatalf("after an expiry, v5 (renewing) and v6 sent before it: table %+v, lease to %v; want none and ended", tb, h.Status(at).LeaseEnd.Sub(t0))
	}
	after := grantMsg(1, 7, 0, rep[0].Seq, true, false, Entry{Key: hk, Count: 280, Burst: 28})
	after.Grant = 8
	_ = h.Step(at, after)
	if tb := h.Table(); len(tb) != 1 || tb[0].Count != 280 {
		t.Fatalf("a full table sent after the expiry: table %+v, want 280", tb)
	}
	// A new term's expiry starts its grant numbers again: its first
	// grant after the expiry applies, however high term 1's numbers went.
	_ = h.Step(at, Message{Type: MsgExpire, Region: "a", Session: 7, Term: 2, Grant: 1})
	next := grantMsg(2, 1, 0, rep[0].Seq, true, false, Entry{Key: hk, Count: 290, Burst: 29})
	next.Grant = 2
	_ = h.Step(at, next)
	if tb := h.Table(); len(tb) != 1 || tb[0].Count != 290 {
		t.Fatalf("term 2's first grant after its expiry: table %+v, want 290", tb)
	}
}

// TestHolderRenewalOvertakenByDeltas: a renewal that a later delta
// overtakes still extends the lease when it arrives, as it would have
// before the delta, and leaves the delta's table.
func TestHolderRenewalOvertakenByDeltas(t *testing.T) {
	h, end1, at, rep := reportedHolder(t)
	// The leader renews v1 (grant 2), then sends v2 (grant 3), which
	// arrives first.
	renewal := grantMsg(1, 1, 1, rep[0].Seq, false, true)
	renewal.Grant = 2
	v2 := grantMsg(1, 2, 1, rep[0].Seq, false, false, Entry{Key: hk, Count: 200, Burst: 20})
	v2.Grant = 3
	_ = h.Step(at.Add(50*time.Millisecond), v2)
	if got := h.Status(at).LeaseEnd; !got.Equal(end1) {
		t.Fatalf("v2 moved the lease to %v", got.Sub(t0))
	}
	h.Ready()
	_ = h.Step(at.Add(51*time.Millisecond), renewal)
	want := at.Add(DefaultConfig().TTL - DefaultConfig().Drift)
	if got := h.Status(at).LeaseEnd; !got.Equal(want) || count(t, h, at) != 200 {
		t.Fatalf("after the overtaken renewal: lease to %v, count %d; want %v and v2's 200", got.Sub(t0), count(t, h, at), want.Sub(t0))
	}
	if out := h.Ready(); len(out) != 1 || out[0].Type != MsgAck || out[0].Grant != 2 || out[0].Version != 2 {
		t.Fatalf("after the overtaken renewal sent %v, want an ack of grant 2 at version 2", out)
	}
}

// TestHolderRelease: a released Holder uses at most its floors and
// ignores further grants.
func TestHolderRelease(t *testing.T) {
	h := newTestHolder(t)
	hello := h.Ready()[0]
	_ = h.Step(t0, grantMsg(1, 1, 0, hello.Seq, true, true, Entry{Key: hk, Count: 300, Burst: 30}))
	h.Release(t0)
	out := h.Ready()
	if out[len(out)-1].Type != MsgRelease {
		t.Fatalf("release sent %v", out)
	}
	_ = h.Step(t0, grantMsg(1, 2, 1, hello.Seq, false, true, Entry{Key: hk, Count: 500, Burst: 50}))
	if got := count(t, h, t0); got != 133 {
		t.Fatalf("after release: %d, want the floor 133", got)
	}
}

// TestHolderRenewalAheadOfItsDelta: a renewal of version 2 that overtakes
// the delta making version 2 does not renew the table the Holder has, but
// extends the lease once that delta arrives, as it would have in order; a
// renewal of a version never reached, or kept across a new term or an
// expiry, extends nothing.
func TestHolderRenewalAheadOfItsDelta(t *testing.T) {
	// The region reports a refresh later; the leader answers with a delta
	// (v2) and then a renewal of v2, which arrives first.
	h, end1, at, rep := reportedHolder(t)
	delta := grantMsg(1, 2, 1, rep[0].Seq, false, false, Entry{Key: hk, Count: 200, Burst: 20})
	renewal := grantMsg(1, 2, 2, rep[0].Seq, false, true)
	_ = h.Step(at.Add(50*time.Millisecond), renewal)
	if got := h.Status(at).LeaseEnd; !got.Equal(end1) {
		t.Fatalf("a renewal of a version not reached moved the lease to %v (was %v)", got.Sub(t0), end1.Sub(t0))
	}
	_ = h.Step(at.Add(60*time.Millisecond), delta)
	want := at.Add(DefaultConfig().TTL - DefaultConfig().Drift)
	if got := h.Status(at).LeaseEnd; !got.Equal(want) || count(t, h, at) != 200 {
		t.Fatalf("after the delta: lease to %v, count %d; want %v and 200", got.Sub(t0), count(t, h, at), want.Sub(t0))
	}

	// A renewal of v3, then an expiry: v3 arriving after extends nothing.
	h.Ready()
	seq := rep[0].Seq
	at = at.Add(time.Second)
	_ = h.Step(at, grantMsg(1, 3, 3, seq, false, true))
	_ = h.Step(at, Message{Type: MsgExpire, Region: "a", Session: 7, Term: 1, Grant: 99})
	ended := h.Status(at).LeaseEnd
	_ = h.Step(at, grantMsg(1, 3, 2, seq, false, false, Entry{Key: hk, Count: 100, Burst: 10}))
	if got := h.Status(at).LeaseEnd; !got.Equal(ended) {
		t.Fatalf("a renewal kept across an expiry moved the lease to %v (ended at %v)", got.Sub(t0), ended.Sub(t0))
	}

	// A renewal of v9 in term 1, then a new term whose versions start
	// again: its full table at v9 (not renewing) is not the version that
	// renewal renewed.
	_ = h.Step(at, grantMsg(1, 9, 9, seq, false, true))
	_ = h.Step(at, grantMsg(2, 9, 0, seq, true, false, Entry{Key: hk, Count: 100, Burst: 10}))
	if got := h.Status(at).LeaseEnd; !got.Equal(ended) {
		t.Fatalf("a renewal of term 1 extended term 2's lease to %v (ended at %v)", got.Sub(t0), ended.Sub(t0))
	}
}

// TestRaiseAsksNoAcknowledgement: a delta that only raises is Quiet and
// the Holder does not acknowledge it; a decrease, a renewal, a full table
// and a raise to a region not heard from lately are acknowledged; a quiet
// grant never leaves the Allocator waiting (no full table resent for it),
// and the claims bound the holders at every step.
func TestRaiseAsksNoAcknowledgement(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	k := bucket.Key{Rule: "api", Subject: "t1"}
	c := newCluster(t, cfg)
	type sentGrant struct {
		m     Message
		acked bool
	}
	grants := map[uint64]*sentGrant{} // region a's, by grant number
	last := map[bucket.Key]bucket.Tokens{}
	floor := cfg.Budgets[0].Floor("a").Count
	loudRaises := 0
	c.sent = func(m Message) {
		if m.Region != "a" || m.Type != MsgGrant {
			return
		}
		grants[m.Grant] = &sentGrant{m: m}
		if m.Full {
			clear(last) // a key it leaves out is at its floor
		}
		lowers := false
		for _, e := range m.Entries {
			v := e.Count
			if e.Drop {
				v = floor
			}
			was, ok := last[e.Key]
			if !ok {
				was = floor
			}
			lowers = lowers || v < was
			last[e.Key] = v
		}
		raise := !m.Full && !m.Renew && !m.Learning && !lowers
		heard := c.now.Sub(c.alloc.byName["a"].heard) < cfg.Refresh/quietHeard
		if want := raise && heard; m.Quiet != want {
			t.Fatalf("grant %v %v (a heard %v ago): quiet %v, want %v", m, m.Entries, c.now.Sub(c.alloc.byName["a"].heard), m.Quiet, want)
		}
		if raise && !heard {
			loudRaises++
		}
	}
	c.stepped = func(m Message) {
		if m.Region == "a" && m.Type == MsgAck {
			if g := grants[m.Grant]; g != nil {
				g.acked = true
			}
		}
	}
	run := func(d time.Duration) {
		for range int(d / (100 * time.Millisecond)) {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
		}
	}
	// a presses alone: it is raised, between rounds too, as b and c lend.
	c.demand["a"] = map[bucket.Key]bucket.Tokens{k: 2000}
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 10}
	c.demand["c"] = map[bucket.Key]bucket.Tokens{k: 10}
	run(6 * time.Second)
	if l, _ := c.holders["a"].Allocation(c.now, k); l.Count() < 400 {
		t.Fatalf("a holds %d, want most of the budget", l.Count())
	}
	// b presses too: a is decreased.
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 2000}
	run(6 * time.Second)
	if l, _ := c.holders["a"].Allocation(c.now, k); l.Count() > 320 {
		t.Fatalf("a holds %d after b pressed, want about half", l.Count())
	}
	var quiet, loud, full int
	for _, g := range grants {
		switch {
		case g.m.Quiet && g.acked:
			t.Fatalf("quiet grant %v was acknowledged", g.m)
		case g.m.Quiet:
			quiet++
		case !g.acked:
			t.Fatalf("grant %v was not acknowledged", g.m)
		default:
			loud++
		}
		if g.m.Full {
			full++
		}
	}
	if quiet == 0 || loud == 0 {
		t.Fatalf("%d quiet and %d acknowledged grants to a, want some of each", quiet, loud)
	}
	if full != 1 {
		t.Fatalf("%d full tables sent to a, want only the first: a quiet grant must not leave the Allocator resending", full)
	}
	if r := c.alloc.byName["a"]; r.acked != r.version {
		t.Fatalf("a's versions acknowledged up to %d of %d", r.acked, r.version)
	}

	// a's messages up are lost (its link may be down) as b stops: the raise
	// a gets asks for an acknowledgement, whose absence resends it.
	c.dropUp["a"] = 1 << 20
	c.demand["b"] = map[bucket.Key]bucket.Tokens{k: 10}
	run(3 * time.Second)
	if loudRaises == 0 {
		t.Fatal("no raise sent to a while it was not heard from, or every one quiet")
	}
}
