package region

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// TestTableFloorsCapTheAgentsFloor: an agent configured with a smaller
// reserve than the coordinator's budget would decide a key with no entry
// at a floor larger than the one the coordinator counts for the region.
// The table carries the floors its Holder counts (the coordinator's, after
// a full grant), and an agent decides at the smaller of the two; a table
// floor for another global limit, or a larger one, leaves the agent's own.
func TestTableFloorsCapTheAgentsFloor(t *testing.T) {
	global := bucket.PerSecond(900)
	regions := []string{"a", "b", "c"}
	agents := lease.Split{Regions: regions, Reserve: 0.1}                             // the agent's flags
	coord := lease.Budget{Rule: "api", Limit: global, Regions: regions, Reserve: 0.5} // the coordinator's budget
	own, theirs := agents.Floor("a", global), coord.Floor("a")
	if own.Count <= theirs.Count {
		t.Fatalf("setup: agent floor %d not above the coordinator's %d", own.Count, theirs.Count)
	}
	hc := lease.DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 1, []lease.Budget{coord}
	h, err := lease.NewHolder(hc, t0)
	if err != nil {
		t.Fatal(err)
	}
	key := bucket.Key{Rule: "api", Subject: "s"}
	v := NewTableView("a", agents)
	if l, _, _ := v.Allocation(t0, key, global); l != own.Limit {
		t.Fatalf("no table: %s, want the agent's own floor %s", l, own.Limit)
	}
	tb := TableOf("a", "a-0", 1, h.Snapshot(), t0)
	if len(tb.Floors) != 1 || tb.Floors[0].Floor != theirs.Count {
		t.Fatalf("table floors %+v, want the Holder's %d for api", tb.Floors, theirs.Count)
	}
	v.Set(tb)
	if l, hot, _ := v.Allocation(t0, key, global); l != theirs.Limit || hot {
		t.Fatalf("with the table: %s (hot %v), want the coordinator's floor %s", l, hot, theirs.Limit)
	}
	// The table survives the shared store's encoding.
	b, err := json.Marshal(tb)
	if err != nil {
		t.Fatal(err)
	}
	var back Table
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatal(err)
	}
	if !back.Same(tb) {
		t.Fatalf("decoded table %+v differs from %+v", back.Floors, tb.Floors)
	}
	// Another global limit (a rules change on its way): the agent's own.
	other := bucket.PerSecond(600)
	if l, _, _ := v.Allocation(t0, key, other); l != agents.Floor("a", other).Limit {
		t.Fatalf("table floor for 900/s applied to %s: %s", other, l)
	}
	// A larger table floor never raises the agent's own.
	small := NewTableView("a", lease.Split{Regions: regions, Reserve: 0.8})
	small.Set(tb)
	if l, _, _ := small.Allocation(t0.Add(time.Second), key, global); l != (lease.Split{Regions: regions, Reserve: 0.8}).Floor("a", global).Limit {
		t.Fatalf("agent floor raised to %s by the table's", l)
	}
	// A table with other floors is not the same table, and replacing it moves
	// the epoch.
	tb2 := *tb
	tb2.Floors = []lease.BudgetFloor{{Rule: "api", Count: global.Count(), Period: global.Period(), GlobalBurst: global.Burst(), Floor: own.Count, Burst: own.Burst}}
	tb2.Pub = 2
	if tb2.Same(tb) {
		t.Fatal("tables with other floors read as the same")
	}
	e := v.Epoch()
	tb2.build()
	v.Set(&tb2)
	if v.Epoch() == e {
		t.Fatal("the epoch did not move when the floors changed")
	}
}

// TestTableViewSaysWhenItAdopted: SetAt records when the view began
// deciding with a table; a table it does not take (not newer) leaves the
// record, and one installed by Set (no time given) reads no time rather
// than the time of the table before it.
func TestTableViewSaysWhenItAdopted(t *testing.T) {
	v := NewTableView("a", lease.Split{Regions: []string{"a"}})
	if tb, at := v.Installed(); tb != nil || !at.IsZero() {
		t.Fatalf("empty view: %v at %v", tb, at)
	}
	t1 := &Table{Region: "a", Pub: 1, LeaseEnd: t0.Add(time.Minute)}
	if !v.SetAt(t1, t0.Add(time.Second)) {
		t.Fatal("the first table not taken")
	}
	if tb, at := v.Installed(); tb != t1 || !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("after SetAt: %v at %v, want pub 1 at t0+1s", tb, at.Sub(t0))
	}
	if v.SetAt(&Table{Region: "a", Pub: 1, LeaseEnd: t0.Add(time.Minute)}, t0.Add(2*time.Second)) {
		t.Fatal("a table no newer taken")
	}
	if _, at := v.Installed(); !at.Equal(t0.Add(time.Second)) {
		t.Fatalf("a table not taken moved the adoption to %v", at.Sub(t0))
	}
	t2 := &Table{Region: "a", Pub: 2, LeaseEnd: t0.Add(time.Minute)}
	if !v.Set(t2) {
		t.Fatal("a newer table not taken")
	}
	if tb, at := v.Installed(); tb != t2 || !at.IsZero() {
		t.Fatalf("after Set: %v at %v, want pub 2 and no time", tb, at.Sub(t0))
	}
}
