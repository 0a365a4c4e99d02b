package lease

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
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

// TestRegionBackAfterItsLeaseIsRenewedAtOnce: a region cut off past its
// lease comes back (a new stream, and so a hello) just after a round. The
// hello's answer is a round run at once: a full table with a renewal, so
// the raise that follows, once the others' decreases are acknowledged, is
// used as it arrives. Before, the answer was a full table without one, and
// the raise waited unused for the next periodic round, a Refresh (2 s)
// later.
func TestRegionBackAfterItsLeaseIsRenewedAtOnce(t *testing.T) {
	c, _, count, run := pressingOnSixHundred(t)
	c.cut["c"] = true
	run(15 * time.Second) // past c's lease: TTL + Drift after its last request
	if got := []bucket.Tokens{count("a"), count("b"), count("c")}; !slices.Equal(got, []bucket.Tokens{230, 230, 140}) {
		t.Fatalf("in the cut: %v, want a and b 230, c at its floor of 140", got)
	}
	rounds := c.alloc.Stats(c.now).Rounds
	for c.alloc.Stats(c.now).Rounds == rounds {
		run(100 * time.Millisecond)
	}
	delete(c.cut, "c")
	c.holders["c"].Reconnect(c.hnow("c"))
	c.collect()
	back := c.now
	for count("c") < 200 && c.now.Sub(back) < 3*time.Second {
		run(100 * time.Millisecond)
	}
	if took := c.now.Sub(back); count("c") != 200 || took > time.Second {
		t.Fatalf("c holds %d %v after it came back, want 200 within 1 s (a %d, b %d)", count("c"), took, count("a"), count("b"))
	} else {
		t.Logf("c back at 200 after %v", took)
	}
	if st := c.holders["c"].Status(c.hnow("c")); !st.LeaseEnd.After(c.hnow("c")) {
		t.Fatalf("c has no lease: it ended at %v", st.LeaseEnd)
	}
}

// TestRegionWhoseRenewalsAreLostIsRenewedWhenHeard: every message to c is
// lost for 12 s while c's own get through, as on a link that fails one
// way or flaps. The coordinator hears c, so it goes on renewing a lease
// it counts as live, but c's ran out and c fell to its floor. The link
// recovers just after a round whose renewal it lost; 1.1 s on, c's demand
// rises and it reports at once. Its last renewal unacknowledged for over
// half a refresh interval, a round runs at once: c is renewed and back at
// its share within half a second, not at the next periodic round, 2 s
// after the last.
func TestRegionWhoseRenewalsAreLostIsRenewedWhenHeard(t *testing.T) {
	c, k, count, run := pressingOnSixHundred(t)
	c.dropTo["c"] = 1 << 30
	run(12 * time.Second)
	if got := count("c"); got != 140 {
		t.Fatalf("c holds %d after 12 s without a message, want its floor of 140", got)
	}
	if c.alloc.byName["c"].lapsed {
		t.Fatal("the coordinator counts c's lease as lapsed: the test no longer covers a lease it counts as live")
	}
	rounds := c.alloc.Stats(c.now).Rounds
	for c.alloc.Stats(c.now).Rounds == rounds {
		run(100 * time.Millisecond)
	}
	c.dropTo["c"] = 0
	run(1100 * time.Millisecond)
	if got := count("c"); got != 140 {
		t.Fatalf("c holds %d before its demand rises, want 140: the test no longer covers the case", got)
	}
	c.demand["c"][k] = 4000 // a rise by half: c reports at once
	rose := c.now
	for count("c") < 200 && c.now.Sub(rose) < 3*time.Second {
		run(100 * time.Millisecond)
	}
	if took := c.now.Sub(rose); count("c") != 200 || took > 500*time.Millisecond {
		t.Fatalf("c holds %d %v after its demand rose, want 200 within 500ms", count("c"), took)
	} else {
		t.Logf("c back at 200 %v after its demand rose", took)
	}
}

// pressingOnSixHundred starts a cluster of three regions, a, b and c,
// each pressing far beyond its share of 600 a second (floors of 140), on
// the simulator's lease timings (TTL 10 s, Refresh 2 s, Drift 500 ms) and
// the coordinator driver's 200 ms ticks, and runs it 5 s: each holds 200.
// count gives a region's allocation of the key k; run steps the cluster
// 100 ms at a time, checking the escrow at each step.
func pressingOnSixHundred(t *testing.T) (c *cluster, k bucket.Key, count func(string) bucket.Tokens, run func(time.Duration)) {
	t.Helper()
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	c = newCluster(t, cfg)
	c.tickEvery = 200 * time.Millisecond
	k = bucket.Key{Rule: "api", Subject: "t1"}
	for _, r := range c.regions {
		c.demand[r] = map[bucket.Key]bucket.Tokens{k: 2000}
	}
	count = func(r string) bucket.Tokens {
		l, _ := c.holders[r].Allocation(c.hnow(r), k)
		return l.Count()
	}
	run = func(d time.Duration) {
		for end := c.now.Add(d); c.now.Before(end); {
			c.step(100 * time.Millisecond)
			if err := c.checkI1(); err != nil {
				t.Fatal(err)
			}
		}
	}
	run(5 * time.Second)
	if got := []bucket.Tokens{count("a"), count("b"), count("c")}; !slices.Equal(got, []bucket.Tokens{200, 200, 200}) {
		t.Fatalf("after 5 s: %v, want 200 each", got)
	}
	return c, k, count, run
}

// TestEarlyRoundsAreRateLimited: a region whose grants are all lost, with
// twenty keys whose demand doubles in turn, one every 100 ms step, sends an
// urgent report at every step (each key's own urgent reports are a
// quarter of a refresh interval apart), each with its last renewal
// unacknowledged. A round runs early for it at most once per half refresh
// interval, not at every report: each round rebalances every key and sends
// every region a renewal.
func TestEarlyRoundsAreRateLimited(t *testing.T) {
	c, k, _, run := pressingOnSixHundred(t)
	var keys []bucket.Key
	for i := range 20 {
		k := bucket.Key{Rule: "api", Subject: fmt.Sprintf("u%d", i)}
		keys = append(keys, k)
		c.demand["c"][k] = 1000
	}
	run(3 * time.Second)
	// c's demand for k falls while its grants are lost: the decrease it is
	// sent goes unacknowledged while a and b wait for what it frees, so c
	// is not renewed (blocked) and its last renewal stays unacknowledged.
	c.dropTo["c"] = 1 << 30
	c.demand["c"][k] = 150
	run(2 * time.Second)
	var reports int
	c.stepped = func(m Message) {
		if m.Type == MsgReport && m.Region == "c" {
			reports++
		}
	}
	rounds, blocked := c.alloc.Stats(c.now).Rounds, c.alloc.Stats(c.now).Blocked
	for i := range 60 { // 6 s
		u := keys[i%len(keys)]
		c.demand["c"][u] = 3000 - c.demand["c"][u] // 1000 ↔ 2000
		run(100 * time.Millisecond)
	}
	// Periodic rounds every 2 s (3), early ones at most every second (6).
	got := c.alloc.Stats(c.now).Rounds - rounds
	if reports < 30 || c.alloc.Stats(c.now).Blocked == blocked {
		t.Fatalf("c sent %d reports in 6 s, blocked %d times: the test no longer covers a blocked region reporting often",
			reports, c.alloc.Stats(c.now).Blocked-blocked)
	}
	if got > 9 {
		t.Fatalf("%d rounds in 6 s for %d reports, want at most 9", got, reports)
	}
	t.Logf("%d rounds in 6 s for %d reports", got, reports)
}

// TestSlowAcknowledgementsAreNotTakenForLost: every message takes 1.2 s,
// so each grant is acknowledged 2.4 s after it was sent, past the 2 s
// refresh interval. The demand of region a moves every 3 s, so it is sent
// a delta each time. None is lost, and once the coordinator has timed the
// regions' acknowledgements it resends no whole table and runs no round
// early (15 rounds in 30 s); counting every grant unacknowledged after
// half a refresh interval as lost, it resent 10 whole tables and ran 20
// rounds.
func TestSlowAcknowledgementsAreNotTakenForLost(t *testing.T) {
	cfg := scenarioConfig()
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerSecond(600), Regions: []string{"a", "b", "c"}, Reserve: 0.3}}
	c := newCluster(t, cfg)
	c.tickEvery = 200 * time.Millisecond
	c.latency = 1200 * time.Millisecond
	k := bucket.Key{Rule: "api", Subject: "t1"}
	for _, r := range c.regions {
		c.demand[r] = map[bucket.Key]bucket.Tokens{k: 150}
	}
	full := 0
	c.sent = func(m Message) {
		if m.Type == MsgGrant && m.Full && c.now.Sub(t0) > 10*time.Second {
			full++
		}
	}
	var rounds uint64
	for i := range 400 { // 40 s
		if i%30 == 0 {
			c.demand["a"][k] = 150 + bucket.Tokens(i%60)*5 // 150 and 300 in turn
		}
		if i == 100 {
			rounds = c.alloc.Stats(c.now).Rounds
		}
		c.step(100 * time.Millisecond)
		if err := c.checkI1(); err != nil {
			t.Fatal(err)
		}
	}
	rounds = c.alloc.Stats(c.now).Rounds - rounds
	t.Logf("after 10 s: %d whole tables resent, %d rounds in 30 s", full, rounds)
	// A round every refresh interval: 15 in 30 s.
	if full > 0 || rounds > 17 {
		t.Fatalf("%d whole tables resent and %d rounds in 30 s, want none resent and about 15 rounds", full, rounds)
	}
}
