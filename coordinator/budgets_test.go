package coordinator

import (
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

func TestDocument(t *testing.T) {
	d, err := ParseDocument([]byte(`
regions: [us, eu, ap]
reserve: 0.25
budgets:
  - rule: api
    limit: "6000 per minute, burst 100"
  - rule: search
    limit: "100 per second"
    regions: [us, eu]
    weights: [3, 1]
    policy: proportional
lease: {ttl: 4s, refresh: 1s}
`), "doc")
	if err != nil {
		t.Fatal(err)
	}
	bs, err := d.Resolve(nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(bs) != 2 || bs[0].Limit != bucket.PerMinute(6000).WithBurst(100) || bs[0].Reserve != 0.25 ||
		len(bs[0].Regions) != 3 || bs[1].Policy != lease.Proportional || bs[1].Weights[0] != 3 {
		t.Fatalf("budgets = %+v", bs)
	}
	if c := d.LeaseConfig(lease.DefaultConfig()); c.TTL != 4*time.Second || c.Refresh != time.Second || c.Drift != lease.DefaultConfig().Drift {
		t.Fatalf("lease config = %+v", c)
	}
}

func TestDocumentErrors(t *testing.T) {
	for _, tc := range []struct{ doc, want string }{
		{"regions: [a]\nbudgets: [{rule: x, limit: \"lots\"}]", `budgets[0] (rule "x"): limit`},
		{"regions: [a]\nbudgets: [{rule: x, limit: \"1 per second\", policy: fair}]", `policy="fair"`},
		{"budgets: [{rule: x, limit: \"1 per second\"}]", "regions is empty"},
		{"regions: [a]\nbogus: 1", "field bogus not found"},
		{"regions: [a]\nrules: \"plans: {}\"", "cannot read rules"},
		{"regions: [a, a]\nbudgets: [{rule: x, limit: \"1 per second\"}]", `region "a" listed twice`},
	} {
		d, err := ParseDocument([]byte(tc.doc), "doc")
		if err == nil {
			_, err = d.Resolve(nil)
		}
		if !errors.Is(err, ErrInvalidDocument) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: error %v, want one containing %q", tc.doc, err, tc.want)
		}
	}
}

func TestDocumentRules(t *testing.T) {
	d, err := ParseDocument([]byte(`
regions: [us, eu]
rules: |
  plans: {free: "10 per minute"}
  default_plan: free
  rules:
    - {name: api, match: {path: "/*"}, limit: "600 per minute", scope: global}
`), "doc")
	if err != nil {
		t.Fatal(err)
	}
	var got *rules.Set
	bs, err := d.Resolve(func(set *rules.Set, regions []string, weights []int64, reserve float64, p lease.AllocationPolicy) []lease.Budget {
		got = set
		return []lease.Budget{{Rule: "api", Limit: bucket.PerMinute(600), Regions: regions, Reserve: reserve, Policy: p}}
	})
	if err != nil || got == nil || len(bs) != 1 {
		t.Fatalf("Resolve = %v, %v (rules parsed: %v)", bs, err, got != nil)
	}
}

// TestConvertRoundTrip: every field survives the wire.
func TestConvertRoundTrip(t *testing.T) {
	m := lease.Message{Type: lease.MsgGrant, Region: "eu", Session: 3, Term: 9, Seq: 4, Grant: 5, Version: 6, Base: 5,
		Full: true, Renew: true, Learning: true, TTL: 10 * time.Second, Hold: 20 * time.Second, Refresh: 3 * time.Second,
		Drift: 500 * time.Millisecond, Leader: "x:1",
		Entries: []lease.Entry{{Key: bucket.Key{Rule: "api", Subject: "t"}, Count: 10, Burst: 2}, {Key: bucket.Key{Rule: "api", Subject: "u"}, Drop: true}},
		Demand:  []lease.Demand{{Key: bucket.Key{Rule: "api", Subject: "t"}, Want: 99}},
		Budgets: []lease.Budget{{Rule: "api", Limit: bucket.PerMinute(600).WithBurst(60), Regions: []string{"eu", "us"},
			Weights: []int64{2, 1}, Reserve: 0.25, Policy: lease.Static}},
	}
	got := FromProto(ToProto(m))
	if !reflect.DeepEqual(got, m) {
		t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
	}
}
