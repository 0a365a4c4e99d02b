package coordinator

import (
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
