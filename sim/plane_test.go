package sim

import (
	"slices"
	"testing"
	"time"
)

// smallWorld builds the world of scenario path at scale of its load,
// seed 1, with allot alone.
func smallWorld(t *testing.T, path string, scale float64) (*world, *allot) {
	t.Helper()
	sc, err := LoadScenario(path)
	if err != nil {
		t.Fatal(err)
	}
	small, err := sc.Scaled(scale)
	if err != nil {
		t.Fatal(err)
	}
	w, err := newWorld(small, 1, Options{Systems: []string{"allot"}})
	if err != nil {
		t.Fatal(err)
	}
	if err := newAllot(w); err != nil {
		t.Fatal(err)
	}
	return w, w.systems[0].(*allot)
}

// runScenario runs scenario path at a twentieth of its load until end.
func runScenario(t *testing.T, path string, end time.Duration) (*world, *allot) {
	t.Helper()
	w, a := smallWorld(t, path, 0.05)
	w.idealM = newMeter(w.nb, w.newSeries())
	w.end = us(end)
	w.run()
	return w, a
}

// runUntil runs the agent-crash scenario (us-east's speaking agent 0
// crashes at 15 s for 10 s) until end.
func runUntil(t *testing.T, end time.Duration) (*world, *allot) {
	t.Helper()
	return runScenario(t, "scenarios/14-agent-crash.yaml", end)
}

// nobodySpeaks fails t unless, at the end of w, no agent speaks for
// us-east while its lease, as its last table has it, still lives.
func nobodySpeaks(t *testing.T, w *world, a *allot, while string) {
	t.Helper()
	rp := a.plane.regions[0]
	if rp.speaker != -1 || rp.sp != nil {
		t.Fatalf("%s, agent %d speaks", while, rp.speaker)
	}
	if tb := rp.view.Table(); !tb.Live(w.regions[0].agent.at(w.end)) {
		t.Fatalf("%s, the lease lapsed", while)
	}
}

// TestSpeakerTakeoverKeepsTheLease: when the speaking agent crashes,
// another live agent stands to speak, and speaks once the crashed agent's
// speaker lease has ended in the store (within speakerLease of the crash,
// as agent.holdSpeaker has it): it restores a Speaker from the shared
// table under a new session; the lease does not lapse, and the other
// agents decide with the new speaker's tables. When the crashed agent
// comes back, it decides with the new speaker's table, and the new speaker,
// live, goes on speaking under the same session, through the returning
// agent's wait and after it (region.SpeakerOf: the lowest name does not
// take over from a live speaker).
func TestSpeakerTakeoverKeepsTheLease(t *testing.T) {
	w, before := runUntil(t, 14*time.Second)
	rp := before.plane.regions[0]
	if rp.speaker != 0 || rp.sp == nil {
		t.Fatalf("before the crash agent %d speaks, want 0", rp.speaker)
	}
	first := rp.sp.Status(w.regions[0].agent.at(w.end)).Session

	w, a := runUntil(t, 16*time.Second)
	nobodySpeaks(t, w, a, "while the crashed agent's speaker lease lives")

	w, a = runUntil(t, 17500*time.Millisecond)
	rp = a.plane.regions[0]
	now := w.regions[0].agent.at(w.end)
	if rp.speaker != 1 || rp.sp == nil {
		t.Fatalf("after the crash agent %d speaks, want 1", rp.speaker)
	}
	st := rp.sp.Status(now)
	if !st.Live || st.Session == first {
		t.Fatalf("new speaker's lease %+v: want live, under a session other than %d", st, first)
	}
	for i, ag := range a.agents[0] {
		tb := ag.view.Table()
		if !ag.alive {
			continue
		}
		if tb == nil || !tb.Live(now) || tb.Speaker != a.agents[0][1].name {
			t.Fatalf("agent %d decides with %+v, want a live table of %s", i, tb, a.agents[0][1].name)
		}
	}

	second := st.Session
	// Agent 0 is back at 25 s and may stand from 26.5 s.
	for _, end := range []time.Duration{26 * time.Second, 27 * time.Second, 30 * time.Second} {
		w, a = runUntil(t, end)
		rp = a.plane.regions[0]
		if rp.speaker != 1 || rp.sp == nil {
			t.Fatalf("at %s, after agent 0 came back, agent %d speaks, want 1 still", end, rp.speaker)
		}
		if st := rp.sp.Status(w.regions[0].agent.at(w.end)); !st.Live || st.Session != second {
			t.Fatalf("at %s agent 1's lease %+v: want live, under its session %d", end, st, second)
		}
	}
}

// TestNoSpeakerWhileTheStoreIsOut: a region whose every agent is cut
// from its Redis has no agent that can renew the speaker lease (the
// redis-cut scenarios cut us-east's agents from it at 15 s for 10 s): its
// speaker stops once its own view of the lease ends, nobody speaks while
// the store is out, and the same agent speaks again, under a new session,
// once the store answers.
func TestNoSpeakerWhileTheStoreIsOut(t *testing.T) {
	run := func(end time.Duration) (*world, *allot) {
		return runScenario(t, "scenarios/08-redis-cut-closed.yaml", end)
	}
	w, a := run(14 * time.Second)
	rp := a.plane.regions[0]
	if rp.speaker != 0 || rp.sp == nil {
		t.Fatalf("before the cut agent %d speaks, want 0", rp.speaker)
	}
	first := rp.sp.Status(w.regions[0].agent.at(w.end)).Session
	for _, end := range []time.Duration{17 * time.Second, 20 * time.Second, 24900 * time.Millisecond} {
		_, a = run(end)
		if rp := a.plane.regions[0]; rp.speaker != -1 || rp.sp != nil {
			t.Fatalf("at %s, with the store out, agent %d speaks", end, rp.speaker)
		}
	}
	w, a = run(27 * time.Second)
	rp = a.plane.regions[0]
	if rp.speaker != 0 || rp.sp == nil {
		t.Fatalf("after the cut agent %d speaks, want 0", rp.speaker)
	}
	if s := rp.sp.Status(w.regions[0].agent.at(w.end)).Session; s == first {
		t.Fatalf("the speaker after the cut kept session %d: want a new one", s)
	}
}

// TestPublicationsAreNotRefused: with one speaker per region and no split
// membership, the shared store takes every table a speaker publishes. A
// publication taken for refused makes the Speaker publish again above it
// at every Ready, which the agents' adoption then chases.
func TestPublicationsAreNotRefused(t *testing.T) {
	w, a := smallWorld(t, "scenarios/02-demand-shift.yaml", 0.05)
	w.idealM = newMeter(w.nb, w.newSeries())
	w.end = us(20 * time.Second)
	w.run()
	if a.plane.published < 10 {
		t.Fatalf("%d tables published in 20 s, want some", a.plane.published)
	}
	if a.plane.refused != 0 {
		t.Fatalf("%d of %d publications refused, want none", a.plane.refused, a.plane.published)
	}
}

// TestALevelReachesTheSpeakerAtOnce: as the agent's driver does, an agent
// samples its batched keys between rounds and stores its report as soon
// as a key's demand takes a new level; the notice carries it whole, and
// the speaking agent ticks its Speaker with it on arrival (one one-way
// trip after the store took it) or, within half a tick of the last round
// a notice started, at that half tick's end, rather than at its next
// tick. A level the agent's round took is stored so too, just after the
// round's report. In rotating-hot, the hot region changes every 4 s: each
// region's demand rises twentyfold and falls back.
func TestALevelReachesTheSpeakerAtOnce(t *testing.T) {
	w, a := smallWorld(t, "scenarios/26-rotating-hot.yaml", 1)
	w.idealM = newMeter(w.nb, w.newSeries())
	w.end = us(40 * time.Second)
	var levels [][]Micros
	var rounds [][]Micros
	for r := range a.plane.regions {
		levels, rounds = append(levels, nil), append(rounds, nil)
		a.plane.regions[r].onRound = func(at Micros) { rounds[r] = append(rounds[r], at) }
	}
	byRound := 0
	a.onLevel = func(r, _ int, at Micros, round bool) {
		levels[r] = append(levels[r], at)
		if round {
			byRound++
		}
	}
	w.run()
	const eu = 1 // hot from 4 s to 8 s
	if i := slices.IndexFunc(levels[eu], func(at Micros) bool { return at >= us(4*time.Second) }); i < 0 || levels[eu][i] > us(4*time.Second+300*time.Millisecond) {
		t.Fatalf("eu-west's levels %v: want one within 300 ms of its rise at 4 s", levels[eu])
	}
	n := 0
	for r := range levels {
		trip := 2*w.net.lat[r][r] + speakerTick/2
		for _, at := range levels[r] {
			i := slices.IndexFunc(rounds[r], func(x Micros) bool { return x >= at })
			if i < 0 {
				continue // stored as the run ended, or while nobody spoke
			}
			if rounds[r][i]-at > trip {
				t.Errorf("%s: level stored at %.4f s, the Speaker's next round at %.4f s; want within %d µs", w.regions[r].name, float64(at)/1e6, float64(rounds[r][i])/1e6, trip)
			}
			n++
		}
		// At most one round a notice starts every half tick: three
		// rounds within half a tick are one too many.
		for j := 2; j < len(rounds[r]); j++ {
			if rounds[r][j]-rounds[r][j-2] < speakerTick/2 {
				t.Errorf("%s: three Speaker rounds within half a tick: %v", w.regions[r].name, rounds[r][j-2:j+1])
			}
		}
	}
	if n < 20 {
		t.Fatalf("%d levels stored in 40 s, want 20 or more", n)
	}
	// Some levels are taken by the agents' rounds (Tick samples every
	// key): those are stored again, marked, as the agent's reportLevels
	// does, and not left to the Speaker's next tick.
	if byRound == 0 {
		t.Fatalf("none of %d levels was taken by an agent's round", n)
	}
	t.Logf("%d levels, %d taken by rounds", n, byRound)
}
