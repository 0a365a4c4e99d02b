package region

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/lease"
)

var spkKey = bucket.Key{Rule: "api", Subject: "x"}

// speakerFixture is the Speaker of agent a-0 in region a, sharing a
// budget of 300/s with region b (no reserve: floor 150/s), at t0.
func speakerFixture(t *testing.T) (*Speaker, []lease.Budget) {
	t.Helper()
	budgets := []lease.Budget{{Rule: "api", Limit: bucket.PerSecond(300), Regions: []string{"a", "b"}}}
	cfg := DefaultSpeakerConfig()
	cfg.Region, cfg.Agent, cfg.Budgets = "a", "a-0", budgets
	s, err := NewSpeaker(cfg, 7, t0)
	if err != nil {
		t.Fatal(err)
	}
	return s, budgets
}

// hello connects s at now and returns the hello of its Ready.
func hello(t *testing.T, s *Speaker, now time.Time) lease.Message {
	t.Helper()
	s.Connected(now)
	rd := s.Ready()
	s.Advance(Outcome{})
	for _, m := range rd.Send {
		if m.Type == lease.MsgHello {
			return m
		}
	}
	t.Fatalf("no hello in %+v", rd.Send)
	return lease.Message{}
}

// grant is the leader's full grant number n answering h, giving count of
// spkKey.
func grant(h lease.Message, n uint64, count bucket.Tokens) lease.Message {
	return lease.Message{Type: lease.MsgGrant, Region: "a", Session: h.Session, Term: 1, Seq: h.Seq, Grant: n,
		Version: n, Full: true, Renew: true, TTL: 10 * time.Second, Hold: 20 * time.Second, Refresh: time.Second,
		Entries: []lease.Entry{{Key: spkKey, Count: count, Burst: count}}}
}

// lastReport is the last report among ms.
func lastReport(ms []lease.Message) (lease.Message, bool) {
	for i := len(ms) - 1; i >= 0; i-- {
		if ms[i].Type == lease.MsgReport {
			return ms[i], true
		}
	}
	return lease.Message{}, false
}

func count(ms []lease.Message, typ lease.MsgType) int {
	n := 0
	for _, m := range ms {
		if m.Type == typ {
			n++
		}
	}
	return n
}

// TestSpeakerAckWaitsForEveryAgent: a grant is acknowledged only once
// every live agent reports deciding with this speaker's table that
// carries it; until then another agent may still use the allocation the
// grant took away. The grant's table is settled and published in the same
// Ready, settle first.
func TestSpeakerAckWaitsForEveryAgent(t *testing.T) {
	s, budgets := speakerFixture(t)
	live := []string{"a-0", "a-1"}
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 50)); err != nil {
		t.Fatal(err)
	}
	rd := s.Ready()
	s.Advance(Outcome{})
	want := Change{Key: spkKey, From: budgets[0].Floor("a").Limit, To: budgets[0].LimitOf(50)}
	if len(rd.Settle) != 1 || rd.Settle[0] != want {
		t.Fatalf("settle %+v, want %+v", rd.Settle, want)
	}
	if rd.Publish == nil || len(rd.Publish.Entries) != 1 || rd.Publish.Entries[0].Count != 50 {
		t.Fatalf("publish %+v, want the table of the grant", rd.Publish)
	}
	pub := rd.Publish.Pub
	// No Tick has said who is live yet: the ack is held.
	if count(rd.Send, lease.MsgAck) != 0 || s.PendingAcks() != 1 {
		t.Fatalf("sent %d acks, %d pending, before the other agent adopted the table", count(rd.Send, lease.MsgAck), s.PendingAcks())
	}
	s.Tick(t0, nil, live)
	for _, st := range adoptionSteps(pub, t0) {
		s.Tick(t0, []DemandReport{st.report}, live)
		rd := s.Ready()
		s.Advance(Outcome{})
		if got := count(rd.Send, lease.MsgAck); got != st.acks {
			t.Fatalf("%s: %d acks, want %d", st.why, got, st.acks)
		}
	}
	// A region whose only live agent is the speaker acknowledges at once.
	if err := s.Step(t0, grant(h, 2, 60)); err != nil {
		t.Fatal(err)
	}
	s.Tick(t0, nil, []string{"a-0"})
	if got := count(s.Ready().Send, lease.MsgAck); got != 1 {
		t.Fatalf("alone: %d acks, want 1", got)
	}
}

// adoptionStep is a report of agent a-1 and the acks it releases.
type adoptionStep struct {
	report DemandReport
	acks   int
	why    string
}

// adoptionSteps are a-1's reports at at, in turn, while an ack waits for
// a-0's publication pub: only the last releases it. Its want, far above
// any allocation, would make a Tick report at once.
func adoptionSteps(pub uint64, at time.Time) []adoptionStep {
	return []adoptionStep{
		{DemandReport{Agent: "a-1", At: at, Pub: pub - 1, Speaker: "a-0"}, 0, "the other agent decides with an older table"},
		{DemandReport{Agent: "a-1", At: at, Pub: pub + 5, Speaker: "a-9"}, 0, "the other agent decides with another speaker's table"},
		{DemandReport{Agent: "a-1", At: at.Add(-time.Minute), Pub: pub, Speaker: "a-0"}, 0, "the report adopting it is stale"},
		{DemandReport{Agent: "a-1", At: at, Pub: pub, Speaker: "a-0",
			Keys: []DemandItem{{Rule: spkKey.Rule, Subject: spkKey.Subject, Want: 1_000_000}}}, 1, "every agent adopted the table"},
	}
}

// TestSpeakerAdoptedReleasesAcksBetweenTicks: an agent's report of the
// table it adopted, taken between ticks (the agent was told of the
// publication), releases the acknowledgement waiting for it at the next
// Ready, under the same rules as a Tick's; it moves no demand.
func TestSpeakerAdoptedReleasesAcksBetweenTicks(t *testing.T) {
	s, _ := speakerFixture(t)
	live := []string{"a-0", "a-1"}
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 50)); err != nil {
		t.Fatal(err)
	}
	s.Tick(t0, nil, live)
	rd := s.Ready()
	s.Advance(Outcome{})
	if rd.Publish == nil || s.PendingAcks() != 1 {
		t.Fatalf("published %v with %d acks pending, want the grant's table and its ack held", rd.Publish, s.PendingAcks())
	}
	at := t0.Add(10 * time.Millisecond)
	for _, st := range adoptionSteps(rd.Publish.Pub, at) {
		s.Adopted(at, []DemandReport{st.report})
		rd := s.Ready()
		s.Advance(Outcome{})
		if got := count(rd.Send, lease.MsgAck); got != st.acks {
			t.Fatalf("%s: %d acks, want %d", st.why, got, st.acks)
		}
		if got := count(rd.Send, lease.MsgReport); got != 0 {
			t.Fatalf("%s: %d reports sent; Adopted moves no demand", st.why, got)
		}
	}
}

// TestSpeakerConnectedDropsPendingAcks: a new stream's hello answers for
// the acknowledgements held for the old one.
func TestSpeakerConnectedDropsPendingAcks(t *testing.T) {
	s, _ := speakerFixture(t)
	s.Tick(t0, nil, []string{"a-0", "a-1"})
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 50)); err != nil {
		t.Fatal(err)
	}
	s.Ready()
	if s.PendingAcks() != 1 {
		t.Fatalf("pending %d, want 1", s.PendingAcks())
	}
	hello(t, s, t0.Add(time.Second))
	if s.PendingAcks() != 0 {
		t.Fatalf("pending %d after a reconnect, want 0", s.PendingAcks())
	}
}

// TestSpeakerPublishesAboveARefusal: a table another speaker wrote with a
// higher number (while membership was split) makes this speaker publish
// its own above it, the same allocations.
func TestSpeakerPublishesAboveARefusal(t *testing.T) {
	s, _ := speakerFixture(t)
	rd := s.Ready()
	if rd.Publish == nil {
		t.Fatal("a new speaker published nothing")
	}
	first := rd.Publish
	stored := first.Pub + 1_000_000
	s.Advance(Outcome{Refused: true, StoredPub: stored})
	rd = s.Ready()
	s.Advance(Outcome{})
	if rd.Publish == nil || rd.Publish.Pub != stored+1 || !rd.Publish.Same(first) || rd.Publish.Speaker != "a-0" {
		t.Fatalf("after the refusal published %+v, want a-0's table at %d", rd.Publish, stored+1)
	}
	if rd := s.Ready(); rd.Publish != nil {
		t.Fatalf("published %d again with nothing changed", rd.Publish.Pub)
	}
}

// TestSpeakerRetriesUnsettled: a change the store did not take is listed
// again at the next Ready.
func TestSpeakerRetriesUnsettled(t *testing.T) {
	s, _ := speakerFixture(t)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 200)); err != nil {
		t.Fatal(err)
	}
	rd := s.Ready()
	if len(rd.Settle) != 1 {
		t.Fatalf("settle %+v, want one change", rd.Settle)
	}
	s.Advance(Outcome{Unsettled: rd.Settle})
	s.Tick(t0.Add(100*time.Millisecond), nil, []string{"a-0"})
	again := s.Ready()
	want := rd.Settle[0]
	want.Again = true
	if len(again.Settle) != 1 || again.Settle[0] != want {
		t.Fatalf("next settle %+v, want %+v", again.Settle, want)
	}
}

// TestSpeakerSumsFreshDemandOfLiveAgents: the report the Holder sends
// carries the region's demand: the live agents' fresh reports summed per
// key.
func TestSpeakerSumsFreshDemandOfLiveAgents(t *testing.T) {
	s, _ := speakerFixture(t)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 150)); err != nil {
		t.Fatal(err)
	}
	s.Ready()
	s.Advance(Outcome{})
	y := bucket.Key{Rule: "api", Subject: "y"}
	at := t0.Add(2 * time.Second)
	reports := []DemandReport{
		{Agent: "a-0", At: at, Keys: []DemandItem{{Rule: "api", Subject: "x", Want: 10}, {Rule: "api", Subject: "y", Want: 1}}},
		{Agent: "a-1", At: at, Keys: []DemandItem{{Rule: "api", Subject: "y", Want: 2}, {Rule: "api", Subject: "x", Want: 20}}}, // unsorted
		{Agent: "a-2", At: at, Keys: []DemandItem{{Rule: "api", Subject: "x", Want: 1000}}},                                     // not live
		{Agent: "a-3", At: at.Add(-time.Minute), Keys: []DemandItem{{Rule: "api", Subject: "x", Want: 1000}}},                   // stale
	}
	s.Tick(at, reports, []string{"a-0", "a-1", "a-3"})
	rep, _ := lastReport(s.Ready().Send)
	want := []lease.Demand{{Key: spkKey, Want: 30}, {Key: y, Want: 3}}
	if !slices.Equal(rep.Demand, want) {
		t.Fatalf("reported %+v, want %+v", rep.Demand, want)
	}
	if got := SumDemand(reports, []string{"a-0", "a-1", "a-3"}, at, time.Second); !slices.Equal(got, want) {
		t.Fatalf("SumDemand %+v, want %+v", got, want)
	}
}

// TestSpeakerLateFeedIsNoStop: a Tick whose reports come late, or not at
// all (the store did not answer), says nothing about the demand: the
// report it sends carries the demand of the latest reports read, for up
// to four refresh intervals, where it used to read a refresh interval
// without them as a stop. A key the latest reports lack has stopped.
func TestSpeakerLateFeedIsNoStop(t *testing.T) {
	s, _ := speakerFixture(t)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 150)); err != nil { // refresh 1 s
		t.Fatal(err)
	}
	s.Ready()
	s.Advance(Outcome{})
	y := bucket.Key{Rule: "api", Subject: "y"}
	live := []string{"a-0"}
	report := func(at time.Time, reports []DemandReport) []lease.Demand {
		t.Helper()
		s.Tick(at, reports, live)
		rd := s.Ready()
		s.Advance(Outcome{})
		rep, ok := lastReport(rd.Send)
		if !ok {
			t.Fatalf("no report at %s", at.Sub(t0))
		}
		return rep.Demand
	}
	t1 := t0.Add(2 * time.Second)
	fed := []DemandReport{{Agent: "a-0", At: t1, Keys: []DemandItem{{Rule: "api", Subject: "x", Want: 100}, {Rule: "api", Subject: "y", Want: 5}}}}
	if got, want := report(t1, fed), []lease.Demand{{Key: spkKey, Want: 100}, {Key: y, Want: 5}}; !slices.Equal(got, want) {
		t.Fatalf("fed: reported %+v, want %+v", got, want)
	}
	// 1.5 s later, the reports could not be read.
	t2 := t1.Add(1500 * time.Millisecond)
	if got, want := report(t2, nil), []lease.Demand{{Key: spkKey, Want: 100}, {Key: y, Want: 5}}; !slices.Equal(got, want) {
		t.Fatalf("a feed 1.5 refresh intervals old: reported %+v, want %+v (the demand read last)", got, want)
	}
	// Reports without y, then none for 1.2 s.
	t3 := t2.Add(200 * time.Millisecond)
	s.Tick(t3, []DemandReport{{Agent: "a-0", At: t3, Keys: []DemandItem{{Rule: "api", Subject: "x", Want: 120}}}}, live)
	s.Ready()
	s.Advance(Outcome{})
	if got, want := report(t3.Add(1200*time.Millisecond), nil), []lease.Demand{{Key: spkKey, Want: 120}, {Key: y, Want: 0}}; !slices.Equal(got, want) {
		t.Fatalf("after a feed without y: reported %+v, want %+v", got, want)
	}
	// Past four refresh intervals without a feed, the demand has gone.
	if got, want := report(t3.Add(4100*time.Millisecond), nil), []lease.Demand{{Key: spkKey, Want: 0}}; !slices.Equal(got, want) {
		t.Fatalf("4.1 s after the last feed: reported %+v, want %+v", got, want)
	}
}

// TestRestoreSpeakerResumesTheLease: a new speaker restored from the
// shared table holds its lease at once under a new session, counts its
// allocations as settled, publishes above it and says hello with what it
// holds.
func TestRestoreSpeakerResumesTheLease(t *testing.T) {
	s, _ := speakerFixture(t)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 200)); err != nil {
		t.Fatal(err)
	}
	rd := s.Ready()
	s.Advance(Outcome{})
	shared := rd.Publish
	now := t0.Add(3 * time.Second)
	cfg := s.Config()
	cfg.Agent = "a-1"
	r, err := RestoreSpeaker(cfg, 99, shared, now)
	if err != nil {
		t.Fatal(err)
	}
	st := r.Status(now)
	if !st.Live || st.Session != 99 || st.Entries != 1 {
		t.Fatalf("restored status %+v, want a live lease of one entry under session 99", st)
	}
	rd = r.Ready()
	if len(rd.Settle) != 0 {
		t.Fatalf("restored speaker settles %+v again", rd.Settle)
	}
	if rd.Publish != nil {
		t.Fatalf("restored speaker republished an unchanged table (pub %d)", rd.Publish.Pub)
	}
	r.Connected(now)
	rd = r.Ready()
	var hi lease.Message
	for _, m := range rd.Send {
		if m.Type == lease.MsgHello {
			hi = m
		}
	}
	if hi.Session != 99 || len(hi.Entries) != 1 || hi.Entries[0].Count != 200 {
		t.Fatalf("hello %+v, want session 99 holding 200", hi)
	}
	r.Release(now)
	rd = r.Ready()
	if rd.Publish == nil || rd.Publish.Pub <= shared.Pub || rd.Publish.Speaker != "a-1" || !rd.Publish.Released {
		t.Fatalf("after release published %+v, want a-1's released table above %d", rd.Publish, shared.Pub)
	}
	if len(rd.Settle) != 1 || rd.Settle[0].To != cfg.Budgets[0].Floor("a").Limit {
		t.Fatalf("release settles %+v, want the key back to its floor", rd.Settle)
	}
	if count(rd.Send, lease.MsgRelease) != 1 {
		t.Fatalf("release sent %+v", rd.Send)
	}
}

// TestSpeakerSettlesBeforeItPublishes drives a Speaker as its drivers do
// (settle, publish, send, in Ready's order) on an in-process store: a
// grant's increase arrives spent, and the table is published with the
// bucket already at its new limit; a decrease rewrites the bucket at once
// under the smaller rate.
func TestSpeakerSettlesBeforeItPublishes(t *testing.T) {
	s, budgets := speakerFixture(t)
	clk := clock.NewManual(t0)
	st := bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
	ctx := context.Background()
	floor, big, small := budgets[0].Floor("a").Limit, budgets[0].LimitOf(250), budgets[0].LimitOf(50)
	// published records the bucket's limit at each publication: settled
	// first, it is the table's.
	var published []bucket.Limit
	carry := func() {
		rd := s.Ready()
		for _, c := range rd.Settle {
			if _, err := c.Apply(ctx, st); err != nil {
				t.Fatal(err)
			}
		}
		if rd.Publish != nil && len(rd.Publish.Entries) == 1 {
			e := rd.Publish.Entries[0]
			if l, ok := s.settler.Applied(e.Key); ok {
				published = append(published, l)
			}
		}
		s.Advance(Outcome{})
	}
	h := hello(t, s, clk.Now())
	// The region spends 40 of its floor's 150.
	if n, _ := st.TakeUpTo(ctx, spkKey, floor, 40); n != 40 {
		t.Fatalf("setup took %d", n)
	}
	if err := s.Step(clk.Now(), grant(h, 1, 250)); err != nil {
		t.Fatal(err)
	}
	carry()
	if d, _ := st.Peek(ctx, spkKey, big); d.Remaining != 110 {
		t.Fatalf("after the increase the bucket holds %d, want the 110 it held (the increase arrives spent)", d.Remaining)
	}
	// Empty the bucket, let it refill 100 ms at 250/s (25 tokens), then
	// shrink to 50/s: 200 ms later it holds 25 + 10, not the 75 that 300 ms
	// at the old rate would give.
	if n, _ := st.TakeUpTo(ctx, spkKey, big, 1000); n != 110 {
		t.Fatalf("took %d, want 110", n)
	}
	clk.Advance(100 * time.Millisecond)
	if err := s.Step(clk.Now(), grant(h, 2, 50)); err != nil {
		t.Fatal(err)
	}
	carry()
	clk.Advance(200 * time.Millisecond)
	if d, _ := st.Peek(ctx, spkKey, small); d.Remaining != 35 {
		t.Fatalf("after the decrease: %d, want 35 (25 refilled before it, 10 at 50/s after)", d.Remaining)
	}
	if !slices.Equal(published, []bucket.Limit{big, small}) {
		t.Fatalf("tables published with the buckets at %v, want %v", published, []bucket.Limit{big, small})
	}
}

// TestSpeakerSettlesTheLeaseEnd: with nothing received, the tick after the
// lease ends settles the key back to its floor and publishes the table
// whose lease has passed; ticks with nothing new list nothing.
func TestSpeakerSettlesTheLeaseEnd(t *testing.T) {
	s, budgets := speakerFixture(t)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 200)); err != nil {
		t.Fatal(err)
	}
	s.Ready()
	s.Advance(Outcome{})
	end := s.Status(t0).LeaseEnd
	s.Tick(end.Add(-time.Millisecond), nil, []string{"a-0"})
	if rd := s.Ready(); len(rd.Settle) != 0 || rd.Publish != nil {
		t.Fatalf("before the lease ends: %+v", rd)
	}
	s.Tick(end, nil, []string{"a-0"})
	rd := s.Ready()
	// Listed again (Lapsed): the agents may have decided past the end.
	want := Change{Key: spkKey, From: budgets[0].LimitOf(200), To: budgets[0].Floor("a").Limit, Again: true}
	if len(rd.Settle) != 1 || rd.Settle[0] != want {
		t.Fatalf("at the lease's end settle %+v, want %+v", rd.Settle, want)
	}
	s.Tick(end.Add(time.Second), nil, []string{"a-0"})
	if rd := s.Ready(); len(rd.Settle) != 0 {
		t.Fatalf("after the lease ended, settle again %+v", rd.Settle)
	}
}

// TestSpeakerResettlesAfterALapse: the lease ends with no Ready between its
// end and a renewal, so the agents decided past the end under the floor and
// carried the key's bucket to it, while the Settler still has the renewed
// allocation as applied. The Ready after the renewal settles the key again,
// so the bucket stops refilling at the floor's rate.
func TestSpeakerResettlesAfterALapse(t *testing.T) {
	s, budgets := speakerFixture(t)
	clk := clock.NewManual(t0)
	st := bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
	ctx := context.Background()
	floor, alloc := budgets[0].Floor("a").Limit, budgets[0].LimitOf(200)
	h := hello(t, s, t0)
	if err := s.Step(t0, grant(h, 1, 200)); err != nil {
		t.Fatal(err)
	}
	rd := s.Ready()
	for _, c := range rd.Settle {
		if _, err := c.Apply(ctx, st); err != nil {
			t.Fatal(err)
		}
	}
	s.Advance(Outcome{})
	end := s.Status(t0).LeaseEnd
	// The last report before the end: the renewal answers it.
	s.Tick(end.Add(-time.Millisecond), nil, []string{"a-0"})
	rd = s.Ready()
	s.Advance(Outcome{})
	report, ok := lastReport(rd.Send)
	if !ok {
		t.Fatalf("no report before the lease's end: %+v", rd.Send)
	}
	// Past the end an agent decides under the floor: the bucket moves to it.
	clk.Set(end.Add(5 * time.Millisecond))
	if _, err := st.TakeUpTo(ctx, spkKey, floor, 1); err != nil {
		t.Fatal(err)
	}
	renew := grant(h, 2, 200)
	renew.Seq = report.Seq
	if err := s.Step(clk.Now(), renew); err != nil {
		t.Fatal(err)
	}
	rd = s.Ready()
	if !s.Status(clk.Now()).LeaseEnd.After(clk.Now()) {
		t.Fatal("the renewal did not renew the lease")
	}
	i := slices.IndexFunc(rd.Settle, func(c Change) bool { return c.Key == spkKey })
	if i < 0 || rd.Settle[i].To != alloc {
		t.Fatalf("after the lapse and the renewal settle %+v, want %s/%s back to %s", rd.Settle, spkKey.Rule, spkKey.Subject, alloc)
	}
}

// TestSpeakerConfigRefusesNegativeDrift: a negative drift margin would
// shorten the speaker's own margin below the coordinator's; it is refused,
// naming the field and value.
func TestSpeakerConfigRefusesNegativeDrift(t *testing.T) {
	cfg := DefaultSpeakerConfig()
	cfg.Region, cfg.Agent, cfg.Drift = "a", "a-0", -time.Second
	if err := cfg.Validate(); err == nil || !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "drift=-1s") {
		t.Fatalf("Validate() = %v, want drift=-1s refused", err)
	}
	cfg.Drift = 0
	if err := cfg.Validate(); err != nil {
		t.Fatalf("drift 0: %v", err)
	}
}

// TestSpeakerReturnsWhatADecreaseTookAway: the tokens a decrease's rebase
// took away from a full bucket go back with the acknowledgement of the
// grant, in the Send of the Ready that settled it (alone) or in the
// acknowledgement still waiting for the other agents; a change listed
// again, an increase, or a decrease settled past the lease's end returns
// nothing. Settled in a real in-process store.
func TestSpeakerReturnsWhatADecreaseTookAway(t *testing.T) {
	ctx := context.Background()
	returns := func(ms []lease.Message) []lease.Return {
		for _, m := range ms {
			if m.Type == lease.MsgAck {
				return m.Returns
			}
		}
		return nil
	}
	t.Run("alone", func(t *testing.T) {
		s, budgets := speakerFixture(t)
		clk := clock.NewManual(t0)
		st := bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
		h := hello(t, s, t0)
		s.Tick(t0, nil, []string{"a-0"})
		// 150 → 100: the full bucket holds 150, keeps 100, 50 taken away.
		if err := s.Step(t0, grant(h, 1, 100)); err != nil {
			t.Fatal(err)
		}
		rd := s.Ready()
		o := Settle(ctx, st, rd.Settle)
		if len(o.Lost) != 1 || o.Lost[0].Tokens != 50 {
			t.Fatalf("lost %+v, want 50 of %s", o.Lost, spkKey)
		}
		s.Advance(o)
		want := []lease.Return{{Key: spkKey, Tokens: 50}}
		if got := returns(rd.Send); !slices.Equal(got, want) {
			t.Fatalf("ack returns %+v, want %+v (sends %+v)", got, want, rd.Send)
		}
		// An increase takes nothing away and returns nothing.
		if err := s.Step(t0, grant(h, 2, 200)); err != nil {
			t.Fatal(err)
		}
		rd = s.Ready()
		o = Settle(ctx, st, rd.Settle)
		s.Advance(o)
		if got := returns(rd.Send); len(o.Lost) != 0 || got != nil {
			t.Fatalf("increase: lost %+v, returns %+v", o.Lost, got)
		}
		// A decrease listed again (it failed once) is not trusted.
		if err := s.Step(t0, grant(h, 3, 60)); err != nil {
			t.Fatal(err)
		}
		rd = s.Ready()
		s.Advance(Outcome{Unsettled: rd.Settle})
		if err := s.Step(t0, grant(h, 4, 60)); err != nil {
			t.Fatal(err)
		}
		rd = s.Ready()
		if len(rd.Settle) != 1 || !rd.Settle[0].Again {
			t.Fatalf("settle after a failure %+v, want the change again", rd.Settle)
		}
		o = Settle(ctx, st, rd.Settle)
		s.Advance(o)
		if got := returns(rd.Send); len(o.Lost) != 1 || got != nil {
			t.Fatalf("again: lost %+v, returns %+v; want one loss and no return", o.Lost, got)
		}
		// Past the lease's end the bucket moves to the floor: a decrease
		// from 200 to 150 that takes 50 away from the full bucket, settled
		// with the acknowledgement of a grant that does not renew the
		// lease. The agents may have decided past the end, so it is listed
		// again, and the coordinator no longer counts the region's
		// allocation: nothing is returned.
		if err := s.Step(t0, grant(h, 5, 200)); err != nil {
			t.Fatal(err)
		}
		rd = s.Ready()
		s.Advance(Settle(ctx, st, rd.Settle))
		end := t0.Add(11 * time.Second)
		clk.Set(end)
		g := grant(h, 6, 200)
		g.Renew, g.Full, g.Base, g.Entries = false, false, 5, nil
		if err := s.Step(end, g); err != nil {
			t.Fatal(err)
		}
		rd = s.Ready()
		o = Settle(ctx, st, rd.Settle)
		s.Advance(o)
		floor := budgets[0].Floor("a").Limit
		if len(o.Lost) != 1 || o.Lost[0].Change.To != floor || o.Lost[0].Tokens != 50 || !o.Lost[0].Change.Again {
			t.Fatalf("past the lease: lost %+v, want 50 moving to the floor %s", o.Lost, floor)
		}
		if count(rd.Send, lease.MsgAck) != 1 {
			t.Fatalf("past the lease: sends %+v, want the grant's ack", rd.Send)
		}
		if got := returns(rd.Send); got != nil {
			t.Fatalf("past the lease: returns %+v", got)
		}
	})
	t.Run("waiting for the other agent", func(t *testing.T) {
		s, _ := speakerFixture(t)
		st := bucket.NewMemory(bucket.MemoryOptions{Clock: clock.NewManual(t0)})
		live := []string{"a-0", "a-1"}
		h := hello(t, s, t0)
		s.Tick(t0, nil, live)
		if err := s.Step(t0, grant(h, 1, 100)); err != nil {
			t.Fatal(err)
		}
		rd := s.Ready()
		s.Advance(Settle(ctx, st, rd.Settle))
		if count(rd.Send, lease.MsgAck) != 0 || s.PendingAcks() != 1 {
			t.Fatalf("sent %d acks, %d pending", count(rd.Send, lease.MsgAck), s.PendingAcks())
		}
		var sent []lease.Message
		for _, a := range adoptionSteps(rd.Publish.Pub, t0) {
			s.Tick(t0, []DemandReport{a.report}, live)
			rd := s.Ready()
			s.Advance(Outcome{})
			sent = append(sent, rd.Send...)
		}
		want := []lease.Return{{Key: spkKey, Tokens: 50}}
		if got := returns(sent); !slices.Equal(got, want) {
			t.Fatalf("released ack returns %+v, want %+v", got, want)
		}
	})
}

// TestSpeakerAcksBesideACarry: Acks releases, between a Ready and its
// Advance (a driver carrying it out on a goroutine of its own), the
// acknowledgements whose table every agent adopted, but not the one that
// carry's Advance puts its returns on: that one leaves after the Advance,
// with them. Settled in a real in-process store.
func TestSpeakerAcksBesideACarry(t *testing.T) {
	ctx := context.Background()
	s, _ := speakerFixture(t)
	st := bucket.NewMemory(bucket.MemoryOptions{Clock: clock.NewManual(t0)})
	live := []string{"a-0", "a-1"}
	h := hello(t, s, t0)
	s.Tick(t0, nil, live)
	adopt := func(pub uint64) {
		s.Adopted(t0, []DemandReport{{Agent: "a-1", At: t0, Pub: pub, Speaker: "a-0"}})
	}
	// 150 → 100, carried out and published; a-1 has not adopted it yet.
	if err := s.Step(t0, grant(h, 1, 100)); err != nil {
		t.Fatal(err)
	}
	rd1 := s.Ready()
	s.Advance(Settle(ctx, st, rd1.Settle))
	// 100 → 60: its carry is under way when a-1 adopts both tables.
	if err := s.Step(t0, grant(h, 2, 60)); err != nil {
		t.Fatal(err)
	}
	rd2 := s.Ready()
	o2 := Settle(ctx, st, rd2.Settle)
	adopt(rd1.Publish.Pub)
	first := s.Acks()
	if len(first) != 1 || first[0].Grant != 1 || len(first[0].Returns) != 1 || first[0].Returns[0].Tokens != 50 {
		t.Fatalf("acks with the first table adopted, the second carry under way: %+v, want grant 1's, returning 50", first)
	}
	adopt(rd2.Publish.Pub)
	if early := s.Acks(); len(early) != 0 {
		t.Fatalf("acks before the second carry's Advance: %+v, want none (its returns are not on it yet)", early)
	}
	s.Advance(o2)
	second := s.Acks()
	if len(second) != 1 || second[0].Grant != 2 || len(second[0].Returns) != 1 || second[0].Returns[0].Tokens != 40 {
		t.Fatalf("acks after the Advance: %+v, want grant 2's, returning 40", second)
	}
	if rd := s.Ready(); count(rd.Send, lease.MsgAck) != 0 {
		t.Fatalf("the next Ready sends %+v: acks Acks released again", rd.Send)
	}
}

// TestSpeakerOf: the agent that published the table stays while it is a
// member; otherwise, or with no table, the lowest name speaks.
func TestSpeakerOf(t *testing.T) {
	for _, c := range []struct {
		members []string
		current string
		want    string
	}{
		{nil, "", ""},
		{nil, "b", ""},
		{[]string{"b", "a", "c"}, "", "a"},
		{[]string{"b", "a", "c"}, "c", "c"}, // a lower agent joined: c stays
		{[]string{"b", "c"}, "a", "b"},      // the speaker left: the lowest
		{[]string{"b"}, "b", "b"},
	} {
		if got := SpeakerOf(c.members, c.current); got != c.want {
			t.Errorf("SpeakerOf(%v, %q) = %q, want %q", c.members, c.current, got, c.want)
		}
	}
}
