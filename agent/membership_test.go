package agent

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/region"
)

// waitFor polls cond until it holds or the deadline passes. It waits for
// gossip over real sockets, not for time to pass.
func waitFor(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within %s: %s", within, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fastGossip(name, region string, join []string) GossipConfig {
	c := DefaultGossipConfig()
	c.Name, c.Region, c.Join = name, region, join
	c.ProbeInterval, c.ProbeTimeout, c.SuspicionMult = 200*time.Millisecond, 100*time.Millisecond, 2
	c.GossipInterval = 50 * time.Millisecond
	return c
}

func TestGossipElectsOneSpeakerAndFailsOver(t *testing.T) {
	var gs []*Gossip
	for i, name := range []string{"agent-b", "agent-a", "agent-c"} {
		var join []string
		if i > 0 {
			join = []string{gs[0].Addr()}
		}
		g, err := StartGossip(fastGossip(name, "eu", join))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Shutdown() })
		gs = append(gs, g)
	}
	// An agent of another region on the same host never merges.
	other, err := StartGossip(fastGossip("agent-0", "us", []string{gs[0].Addr()}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Shutdown() })

	all := []string{"agent-a", "agent-b", "agent-c"}
	waitFor(t, 5*time.Second, "three agents see each other", func() bool {
		for _, g := range gs {
			if !slices.Equal(g.Members(), all) {
				return false
			}
		}
		return true
	})
	for _, g := range gs {
		if s := region.SpeakerOf(g.Members(), ""); s != "agent-a" {
			t.Fatalf("%s elects %s, want agent-a", g.Self(), s)
		}
	}
	if m := other.Members(); !slices.Equal(m, []string{"agent-0"}) {
		t.Fatalf("region us sees %v", m)
	}
	// The speaker crashes: the others elect agent-b.
	gs[1].Shutdown()
	rest := []*Gossip{gs[0], gs[2]}
	waitFor(t, 5*time.Second, "the crashed speaker is declared dead", func() bool {
		for _, g := range rest {
			if !slices.Equal(g.Members(), []string{"agent-b", "agent-c"}) {
				return false
			}
		}
		return true
	})
	for _, g := range rest {
		if s := region.SpeakerOf(g.Members(), ""); s != "agent-b" {
			t.Fatalf("%s elects %s after the crash, want agent-b", g.Self(), s)
		}
	}
	// A clean leave is seen at once.
	if err := gs[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "the leaver is gone", func() bool {
		return slices.Equal(gs[0].Members(), []string{"agent-b"})
	})
}

func TestSpeakerAndStatic(t *testing.T) {
	if s := region.SpeakerOf(nil, ""); s != "" {
		t.Fatalf("speaker of nobody: %q", s)
	}
	m := NewStaticMembership("b", "c", "a", "a")
	if got := fmt.Sprint(m.Members()); got != "[a b c]" {
		t.Fatalf("members %s", got)
	}
	if region.SpeakerOf(m.Members(), "") != "a" {
		t.Fatal("speaker is not the lowest name")
	}
	if err := (GossipConfig{Name: "x", Region: "r", BindAddr: "nope"}).Validate(); err == nil {
		t.Fatal("bad bind address accepted")
	}
}

func TestGossipJoinsAPeerThatStartsLater(t *testing.T) {
	port := testenv.FreePort(t)
	late := fmt.Sprintf("127.0.0.1:%d", port)
	c := fastGossip("agent-2", "eu", []string{late})
	c.JoinRetry = 100 * time.Millisecond
	g2, err := StartGossip(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g2.Shutdown() })
	c1 := fastGossip("agent-1", "eu", nil)
	c1.BindPort = port
	g1, err := StartGossip(c1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g1.Shutdown() })
	waitFor(t, 5*time.Second, "the early agent joins the late one", func() bool {
		return len(g1.Members()) == 2 && len(g2.Members()) == 2
	})
}

// TestGossipCarriesCuts: an agent that announces a cut from the store is
// listed by the others (memberlist's node metadata, no store needed), and
// no longer once it announces the store is back; an agent that leaves is
// not listed.
func TestGossipCarriesCuts(t *testing.T) {
	var gs []*Gossip
	for i, name := range []string{"eu-0", "eu-1", "eu-2"} {
		var join []string
		if i > 0 {
			join = []string{gs[0].Addr()}
		}
		g, err := StartGossip(fastGossip(name, "eu", join))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Shutdown() })
		gs = append(gs, g)
	}
	waitFor(t, 5*time.Second, "three agents see each other", func() bool {
		for _, g := range gs {
			if len(g.Members()) != 3 {
				return false
			}
		}
		return true
	})
	gs[1].SetCut(true)
	waitFor(t, 3*time.Second, "eu-1's cut reaches the others", func() bool {
		return slices.Equal(gs[0].Cut(), []string{"eu-1"}) && slices.Equal(gs[2].Cut(), []string{"eu-1"})
	})
	if c := gs[1].Cut(); len(c) != 0 {
		t.Fatalf("eu-1 lists %v, want none: Cut lists the others", c)
	}
	gs[1].SetCut(false)
	waitFor(t, 3*time.Second, "eu-1's return reaches the others", func() bool {
		return len(gs[0].Cut()) == 0 && len(gs[2].Cut()) == 0
	})
	gs[2].SetCut(true)
	waitFor(t, 3*time.Second, "eu-2's cut reaches eu-0", func() bool { return slices.Equal(gs[0].Cut(), []string{"eu-2"}) })
	if err := gs[2].Leave(time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 3*time.Second, "eu-2's leave clears its cut", func() bool { return len(gs[0].Cut()) == 0 })
}
