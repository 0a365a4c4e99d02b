package coordinator

import (
	"fmt"
	"log/slog"
	"math"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

// harness runs a leading Server in process with a hostile region a, whose
// messages a test or the fuzzer writes, and honest regions b and c, whose
// Holders exchange messages with the Server through the same path a
// stream's messages take (step, and the stream's out channel). b and c
// always want keyB, b more than its floor, together more than the budget.
type harness struct {
	s       *Server
	clk     *clock.Manual
	budget  lease.Budget
	hostile *conn
	honest  map[string]*lease.Holder
	conns   map[string]*conn
	keys    map[bucket.Key]bool // every key the Allocator or b has used
	grants  int                 // grants sent to a
	wantB   bucket.Tokens       // b's demand at every tick
}

var keyB = bucket.Key{Rule: "api", Subject: "shared-tenant"}

func newHarness(tb testing.TB, lim Limits) *harness {
	tb.Helper()
	clk := clock.NewManual(t0)
	cfg := DefaultConfig()
	cfg.Lease.Budgets = testBudgets()
	cfg.Clock, cfg.Logger, cfg.Insecure, cfg.Limits = clk, slog.New(slog.DiscardHandler), true, lim
	cfg.SendBuffer = 1 << 16
	s, err := NewServer(cfg)
	if err != nil {
		tb.Fatal(err)
	}
	if err := s.BecomeLeader(1); err != nil {
		tb.Fatal(err)
	}
	h := &harness{s: s, clk: clk, budget: testBudgets()[0], honest: map[string]*lease.Holder{}, conns: map[string]*conn{},
		keys: map[bucket.Key]bool{keyB: true}, wantB: 450}
	for _, r := range []string{"a", "b", "c"} {
		c := &conn{region: r, out: make(chan *leasev1.Message, cfg.SendBuffer), done: make(chan struct{})}
		s.streams[r], h.conns[r] = c, c
	}
	h.hostile = h.conns["a"]
	for i, r := range []string{"b", "c"} {
		hc := lease.DefaultHolderConfig()
		hc.Region, hc.Session, hc.Budgets = r, uint64(10+i), testBudgets()
		hd, err := lease.NewHolder(hc, clk.Now())
		if err != nil {
			tb.Fatal(err)
		}
		h.honest[r] = hd
	}
	h.deliver()
	return h
}

// send is a message from the hostile region, as its stream carries it.
func (h *harness) send(m lease.Message) error { return h.s.step(h.hostile, m) }

// deliver carries messages both ways until the honest Holders and the
// Server have nothing more to say, and checks what a is sent.
func (h *harness) deliver() error {
	for range 100 {
		moved := false
		for _, r := range []string{"b", "c"} {
			hd, c := h.honest[r], h.conns[r]
			for len(c.out) > 0 {
				m := FromProto(<-c.out)
				_ = hd.Step(h.clk.Now(), m)
				moved = true
			}
			for _, m := range hd.Ready() {
				if err := h.s.step(c, FromProto(ToProto(m))); err != nil {
					return fmt.Errorf("honest %s refused: %w", r, err)
				}
				moved = true
			}
		}
		for len(h.hostile.out) > 0 {
			m := FromProto(<-h.hostile.out)
			if m.Type == lease.MsgGrant {
				h.grants++
			}
			for _, e := range m.Entries {
				if e.Count < 0 || e.Count > h.budget.Limit.Count() || e.Burst < 0 || e.Burst > h.budget.Limit.Burst() {
					return fmt.Errorf("a was granted %v, outside [0, %d]/[0, %d]", e, h.budget.Limit.Count(), h.budget.Limit.Burst())
				}
			}
		}
		if !moved {
			return nil
		}
	}
	return fmt.Errorf("messages still moving after 100 rounds")
}

// tick moves time by d, with b's demand kept up, and delivers.
func (h *harness) tick(d time.Duration) error {
	h.clk.Advance(d)
	now := h.clk.Now()
	h.honest["b"].Demand(now, keyB, h.wantB)
	h.honest["c"].Demand(now, keyB, 200)
	for _, r := range []string{"b", "c"} {
		h.honest[r].Tick(now)
	}
	h.s.Tick()
	return h.deliver()
}

// check verifies, on the honest Holders' side, that whatever a sent cannot
// have made the coordinator give b and c more of any key than the budget
// (I1 among the regions that use what they are granted), nor take from b
// the floor it uses; and on the coordinator's side that every allocation is
// within [0, the budget].
func (h *harness) check() error {
	now := h.clk.Now()
	cnt, burst := h.budget.Limit.Count(), h.budget.Limit.Burst()
	for _, k := range h.s.alloc.Keys(0) {
		h.keys[k.Key] = true
		for i, c := range k.Counts {
			if c < 0 || c > cnt {
				return fmt.Errorf("key %v: %s's allocation %d outside [0, %d]", k.Key, k.Regions[i], c, cnt)
			}
		}
	}
	for k := range h.keys {
		var sc, sb bucket.Tokens
		for _, r := range []string{"b", "c"} {
			l, _ := h.honest[r].Allocation(now, k)
			if l.Count() < 0 || l.Burst() < 0 {
				return fmt.Errorf("key %v: %s holds %v", k, r, l)
			}
			sc, sb = sc+l.Count(), sb+l.Burst()
		}
		if sc > cnt || sb > burst {
			return fmt.Errorf("key %v: b and c hold %d (burst %d) of %d (burst %d)", k, sc, sb, cnt, burst)
		}
	}
	if l, _ := h.honest["b"].Allocation(now, keyB); l.Count() < h.budget.Floor("b").Count {
		return fmt.Errorf("b holds %d of the key it uses, below its floor %d", l.Count(), h.budget.Floor("b").Count)
	}
	return nil
}

// garbage returns messages no honest region sends: values outside every
// range, keys of unknown rules and of great length, types that only flow
// down, another region's name, more keys than a message may carry.
func garbage(session uint64) []lease.Message {
	k := func(s string) bucket.Key { return bucket.Key{Rule: "api", Subject: s} }
	many := make([]lease.Demand, 1200)
	for i := range many {
		many[i] = lease.Demand{Key: k(fmt.Sprint("many-", i)), Want: bucket.Tokens(i)}
	}
	return []lease.Message{
		{Type: lease.MsgHello, Session: session, Seq: 1, Entries: []lease.Entry{
			{Key: keyB, Count: -5, Burst: -1}, {Key: k("x"), Count: math.MinInt64, Burst: math.MinInt64},
			{Key: bucket.Key{Rule: "nope", Subject: "y"}, Count: 10}, {Key: k(strings.Repeat("s", 1<<16)), Count: 10},
		}},
		{Type: lease.MsgReport, Session: session, Seq: 2, Demand: []lease.Demand{
			{Key: keyB, Want: math.MinInt64}, {Key: k("x"), Want: -1}, {Key: k("y"), Want: math.MinInt64 + 1},
		}},
		{Type: lease.MsgReport, Session: session, Seq: 3, Demand: many},
		{Type: lease.MsgAck, Session: session, Term: math.MaxUint64, Grant: math.MaxUint64, Version: math.MaxUint64},
		{Type: lease.MsgAck, Session: session, Seq: 4, Term: 1, Returns: []lease.Return{
			{Key: keyB, Tokens: math.MaxInt64}, {Key: k("x"), Tokens: math.MinInt64},
			{Key: bucket.Key{Rule: "nope", Subject: "y"}, Tokens: 10}, {Key: k(strings.Repeat("s", 1<<16)), Tokens: 10},
		}},
		{Type: lease.MsgGrant, Session: session, Entries: []lease.Entry{{Key: keyB, Count: math.MaxInt64}}},
		{Type: lease.MsgType(200), Session: session},
		{Type: lease.MsgReport, Region: "b", Session: 10, Seq: 99, Demand: []lease.Demand{{Key: keyB, Want: 0}}},
		{Type: lease.MsgRelease, Session: session + 1},
		{Type: lease.MsgHello, Session: 0, Seq: math.MaxUint64},
	}
}

// TestHostileRegion: an authenticated region that sends garbage — values
// outside every range, unknown rules, huge keys, more keys than allowed,
// messages of the wrong type or for another region — neither stops the
// coordinator nor corrupts b's allocation: b reaches its share of the key
// it uses while a sends garbage, never drops below its floor, and b and c
// never hold more than the budget. Then a lies in a well-formed way
// (claims to hold the whole budget, wants everything): b keeps its floor
// and I1 holds.
func TestHostileRegion(t *testing.T) {
	h := newHarness(t, Limits{MaxMessageBytes: MaxMessageSize, MaxReportKeys: 1000, MaxKeyBytes: 1024})
	step := func(i int) {
		t.Helper()
		if err := h.tick(100 * time.Millisecond); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := h.check(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	for i := range 200 {
		for _, m := range garbage(uint64(1 + i%3)) {
			_ = h.send(m) // the stream of a real region would end on some; the test goes on
		}
		step(i)
	}
	// b wants 450 + 5%, c 200 + 5%, a's clamped garbage at most the
	// budget: b gets at least its max-min share of the 600, 200.
	if l, _ := h.honest["b"].Allocation(h.clk.Now(), keyB); l.Count() < 200 {
		t.Fatalf("after 20 s of garbage from a, b holds %d of the key it uses; want ≥ 200", l.Count())
	}
	h.s.mu.Lock()
	san := h.s.counts.sanitized
	h.s.mu.Unlock()
	if san[0] == 0 || san[1] == 0 || san[2] == 0 {
		t.Errorf("sanitized clipped/dropped/clamped = %v; want each > 0", san)
	}
	// Well-formed lies: a claims the whole budget of b's key and wants it.
	for i := range 200 {
		_ = h.send(lease.Message{Type: lease.MsgHello, Session: uint64(100 + i), Seq: 1, Entries: []lease.Entry{{Key: keyB, Count: math.MaxInt64, Burst: math.MaxInt64}},
			Demand: []lease.Demand{{Key: keyB, Want: math.MaxInt64}}})
		step(200 + i)
	}
}

// TestHonestRegionIsNeverCutToBounds: a region whose demand is five times
// the budget sends nothing the coordinator must cut (its sanitized counts
// stay 0, so they flag only broken or hostile regions), and still gets what
// the others leave.
func TestHonestRegionIsNeverCutToBounds(t *testing.T) {
	h := newHarness(t, Limits{MaxMessageBytes: MaxMessageSize, MaxReportKeys: 1000, MaxKeyBytes: 1024})
	h.wantB = 5 * h.budget.Limit.Count()
	// 15 s: a never says hello, so the leader learns for a lease TTL
	// before it raises anyone.
	for i := range 150 {
		if err := h.tick(100 * time.Millisecond); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
		if err := h.check(); err != nil {
			t.Fatalf("step %d: %v", i, err)
		}
	}
	h.s.mu.Lock()
	san := h.s.counts.sanitized
	h.s.mu.Unlock()
	if san != [3]uint64{} {
		t.Errorf("sanitized clipped/dropped/clamped = %v for honest regions; want none", san)
	}
	// c wants 200 and a, never heard, keeps its floor: b gets the rest.
	floorA := h.budget.Floor("a").Count
	if l, _ := h.honest["b"].Allocation(h.clk.Now(), keyB); l.Count() < h.budget.Limit.Count()-floorA-210 {
		t.Errorf("b holds %d wanting five times the budget; want at least %d", l.Count(), h.budget.Limit.Count()-floorA-210)
	}
}

// FuzzRegionMessages feeds arbitrary bytes, as a sequence of wire messages
// from an authenticated region a and clock steps, through the wire
// conversion, sanitize and the Allocator, beside honest regions b and c:
// no panic, every allocation within [0, the budget], b and c never above
// the budget together, b never below its floor.
//
// Input: records of [op, len lo, len hi, bytes…]; an even op steps the
// clock by op×5 ms, an odd one sends the bytes as a leasev1.Message.
func FuzzRegionMessages(f *testing.F) {
	rec := func(op byte, b []byte) []byte { return append([]byte{op, byte(len(b)), byte(len(b) >> 8)}, b...) }
	for i, m := range garbage(1) {
		if len(m.Demand) > 50 {
			m.Demand = m.Demand[:50]
		}
		if len(m.Entries) > 3 {
			m.Entries = m.Entries[:3]
		}
		b, err := proto.Marshal(ToProto(m))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(append(append(rec(1, b), rec(20, nil)...), rec(byte(2*i), nil)...))
	}
	hello, _ := proto.Marshal(ToProto(lease.Message{Type: lease.MsgHello, Session: 7, Seq: 1, Demand: []lease.Demand{{Key: keyB, Want: 500}}}))
	f.Add(append(rec(1, hello), rec(200, nil)...))
	f.Fuzz(func(t *testing.T, data []byte) {
		h := newHarness(t, Limits{MaxMessageBytes: MaxMessageSize, MaxReportKeys: 64, MaxKeyBytes: 256})
		for steps := 0; len(data) >= 3 && steps < 200; steps++ {
			op, n := data[0], int(data[1])|int(data[2])<<8
			data = data[3:]
			n = min(n, len(data))
			body := data[:n]
			data = data[n:]
			if op%2 == 0 {
				if err := h.tick(time.Duration(op) * 5 * time.Millisecond); err != nil {
					t.Fatal(err)
				}
			} else {
				var p leasev1.Message
				if proto.Unmarshal(body, &p) != nil {
					continue
				}
				_ = h.send(FromProto(&p))
				if err := h.deliver(); err != nil {
					t.Fatal(err)
				}
			}
			if err := h.check(); err != nil {
				t.Fatal(err)
			}
		}
	})
}
