package coordinator

import (
	"slices"
	"testing"

	leasev1 "github.com/allot-dev/allot/api/lease/v1"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// TestFromProtoOutOfRange checks that a wire type or policy beyond the
// uint8 range is not wrapped onto a real one (257 would wrap to hello, 256
// to max-min).
func TestFromProtoOutOfRange(t *testing.T) {
	for _, tc := range []struct {
		typ  leasev1.Type
		want lease.MsgType
	}{
		{leasev1.Type_TYPE_HELLO, lease.MsgHello},
		{257, 0},
		{-255, 0},
	} {
		if got := FromProto(&leasev1.Message{Type: tc.typ}).Type; got != tc.want {
			t.Errorf("type %d: got %d, want %d", tc.typ, got, tc.want)
		}
	}
	for _, tc := range []struct {
		p    int32
		want lease.AllocationPolicy
	}{
		{int32(lease.Proportional), lease.Proportional},
		{256, 255},
		{-256, 255},
	} {
		m := FromProto(&leasev1.Message{Budgets: []*leasev1.Budget{{Rule: "r", Policy: tc.p}}})
		if got := m.Budgets[0].Policy; got != tc.want {
			t.Errorf("policy %d: got %d, want %d", tc.p, got, tc.want)
		}
	}
}

// TestReturnsCrossTheWireOnlyInAnAck: an acknowledgement's returns survive
// the wire; sanitize keeps them only in an acknowledgement, of budgets the
// coordinator serves, each within [0, the budget's burst].
func TestReturnsCrossTheWireOnlyInAnAck(t *testing.T) {
	k := bucket.Key{Rule: "api", Subject: "t"}
	rs := []lease.Return{{Key: k, Tokens: 40}, {Key: bucket.Key{Rule: "api", Subject: "u"}, Tokens: 1 << 40},
		{Key: bucket.Key{Rule: "api", Subject: "v"}, Tokens: -3}, {Key: bucket.Key{Rule: "nope", Subject: "t"}, Tokens: 1}}
	got := FromProto(ToProto(lease.Message{Type: lease.MsgAck, Returns: rs}))
	if !slices.Equal(got.Returns, rs) {
		t.Fatalf("after the wire: %+v, want %+v", got.Returns, rs)
	}
	bs := map[string]lease.Budget{"api": {Rule: "api", Limit: bucket.PerSecond(600).WithBurst(300), Regions: []string{"a", "b"}}}
	up, n := sanitize(lease.Message{Type: lease.MsgAck, Region: "a", Returns: rs}, bs, DefaultLimits())
	want := []lease.Return{{Key: k, Tokens: 40}, {Key: rs[1].Key, Tokens: 300}, {Key: rs[2].Key, Tokens: 0}}
	if !slices.Equal(up.Returns, want) || n.clamped != 2 || n.dropped != 1 {
		t.Fatalf("an ack's returns after sanitize: %+v (%+v), want %+v, 2 clamped, 1 dropped", up.Returns, n, want)
	}
	up, _ = sanitize(lease.Message{Type: lease.MsgReport, Region: "a", Returns: rs}, bs, DefaultLimits())
	if up.Returns != nil {
		t.Fatalf("a report's returns after sanitize: %+v, want none", up.Returns)
	}
}

// TestCreditCrossesTheWireAndNotUpward: a grant's credit survives the wire
// both ways; a region's message cannot carry one to the Allocator
// (sanitize builds its entries without it).
func TestCreditCrossesTheWireAndNotUpward(t *testing.T) {
	k := lease.Entry{Key: bucket.Key{Rule: "api", Subject: "t"}, Count: 200, Burst: 200, Credit: 60}
	m := lease.Message{Type: lease.MsgGrant, Entries: []lease.Entry{k, {Key: bucket.Key{Rule: "api", Subject: "u"}, Drop: true, Credit: 5}}}
	got := FromProto(ToProto(m))
	if got.Entries[0].Credit != 60 || got.Entries[1].Credit != 5 || !got.Entries[1].Drop {
		t.Fatalf("after the wire: %+v", got.Entries)
	}
	bs := map[string]lease.Budget{"api": {Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b"}}}
	up, _ := sanitize(lease.Message{Type: lease.MsgHello, Region: "a", Entries: []lease.Entry{k}}, bs, DefaultLimits())
	if len(up.Entries) != 1 || up.Entries[0].Credit != 0 {
		t.Fatalf("a hello's entries after sanitize: %+v, want one without credit", up.Entries)
	}
}

// TestGrantFlagsCrossTheWire: each of a grant's flags survives the wire on
// its own (a Quiet grant that arrived loud would be acknowledged, harmless;
// a loud one that arrived quiet would leave a decrease unacknowledged).
func TestGrantFlagsCrossTheWire(t *testing.T) {
	for _, m := range []lease.Message{
		{Type: lease.MsgGrant, Full: true},
		{Type: lease.MsgGrant, Renew: true},
		{Type: lease.MsgGrant, Learning: true},
		{Type: lease.MsgGrant, Quiet: true},
		{Type: lease.MsgGrant},
	} {
		got := FromProto(ToProto(m))
		if got.Full != m.Full || got.Renew != m.Renew || got.Learning != m.Learning || got.Quiet != m.Quiet {
			t.Errorf("%+v after the wire: full %v renew %v learning %v quiet %v", m, got.Full, got.Renew, got.Learning, got.Quiet)
		}
	}
}
