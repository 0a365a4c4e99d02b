package sim

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// TestSpeakerTimingsAreTheAgents: the simulator's agents tick, and
// (speaking) wait, hold their speaker lease and tick the Speaker, as
// agent.DefaultConfig and agent.DefaultSpeakerConfig have the agent do.
func TestSpeakerTimingsAreTheAgents(t *testing.T) {
	cfg := agent.DefaultConfig()
	if got, want := Micros(coreTick), us(cfg.Tick); got != want {
		t.Errorf("coreTick %d µs, the agent's Tick %d µs", got, want)
	}
	if got, want := Micros(speakerTick), us(agent.DefaultSpeakerConfig().Tick); got != want {
		t.Errorf("speakerTick %d µs, the speaking agent's Tick %d µs", got, want)
	}
	if got, want := Micros(speakerWait), us(cfg.SpeakerWait); got != want {
		t.Errorf("speakerWait %d µs, the agent's SpeakerWait %d µs", got, want)
	}
	if got, want := Micros(speakerLease), us(cfg.SpeakerLease); got != want {
		t.Errorf("speakerLease %d µs, the agent's SpeakerLease %d µs", got, want)
	}
}

// TestNoticeBodyMaxIsTheAgents: the simulator's agents carry in a notice
// the tables and reports agent.RedisShared's notices carry, and a table
// of 256 entries, or a report of 256 keys, fits (overNotice does not
// encode those).
func TestNoticeBodyMaxIsTheAgents(t *testing.T) {
	if noticeBodyMax != agent.NoticeBodyMax {
		t.Errorf("noticeBodyMax %d, the agent's NoticeBodyMax %d", noticeBodyMax, agent.NoticeBodyMax)
	}
	tb := &region.Table{Region: "ap-south-1", Speaker: "ap-south-1-agent-0", Pub: math.MaxUint64}
	for i := range 256 {
		tb.Entries = append(tb.Entries, lease.Entry{Key: bucket.Key{Rule: "tenant-report-rule", Subject: "tenant-" + strconv.Itoa(1_000_000+i)},
			Count: math.MaxInt64, Burst: math.MaxInt64, Drop: true, Credit: math.MaxInt64})
	}
	if b, err := json.Marshal(tb); err != nil || len(b) > noticeBodyMax {
		t.Fatalf("256 long entries encode to %d bytes (%v), more than a notice carries", len(b), err)
	}
	for range 2000 {
		tb.Entries = append(tb.Entries, tb.Entries[0])
	}
	if !overNotice(tb, len(tb.Entries), 0) {
		t.Fatal("a table of 2,256 long entries fits a notice")
	}
	rep := region.DemandReport{Agent: "ap-south-1-agent-0", At: time.Date(2026, 12, 31, 23, 59, 59, 999_999_999, time.FixedZone("", -12*3600)), Pub: math.MaxUint64, Speaker: "ap-south-1-agent-0", Level: true}
	for i := range 256 {
		rep.Keys = append(rep.Keys, region.DemandItem{Rule: "tenant-report-rule", Subject: "tenant-" + strconv.Itoa(1_000_000+i), Want: math.MaxInt64})
	}
	if b, err := json.Marshal(rep); err != nil || len(b)+len(`,"whole":true`) > noticeBodyMax {
		t.Fatalf("a report of 256 long keys encodes to %d bytes (%v), more than a notice carries", len(b), err)
	}
	for range 2000 {
		rep.Keys = append(rep.Keys, rep.Keys[0])
	}
	if !overNotice(rep, len(rep.Keys), 0) {
		t.Fatal("a report of 2,256 long keys fits a notice")
	}
}

// TestBreakerDefaultsAreTheAgents: a scenario that sets no breaker runs
// the agent's (region.DefaultConfig): its deadline and longest deadline,
// failures, back-off and longest back-off.
func TestBreakerDefaultsAreTheAgents(t *testing.T) {
	sc, err := ParseScenario([]byte("name: b\nduration: 1s\nregions: [{name: a}]\nrules: [{name: r, count: 10, period: 1s}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	want := region.DefaultConfig()
	got := region.DefaultConfig()
	got.BreakerFailures, got.BreakerBackoff, got.Timeout = 0, 0, 0
	setBreaker(&got, sc.Agent)
	if got.BreakerFailures != want.BreakerFailures || got.BreakerBackoff != want.BreakerBackoff || got.BreakerMaxBackoff != want.BreakerMaxBackoff {
		t.Fatalf("breaker failures %d, back-off %s up to %s; the agent's %d, %s up to %s",
			got.BreakerFailures, got.BreakerBackoff, got.BreakerMaxBackoff, want.BreakerFailures, want.BreakerBackoff, want.BreakerMaxBackoff)
	}
	if got.Timeout != want.Timeout || got.MaxTimeout != want.MaxTimeout || sc.Agent.Timeout != want.Timeout {
		t.Fatalf("deadline %s up to %s (charged %s); the agent's %s up to %s",
			got.Timeout, got.MaxTimeout, sc.Agent.Timeout, want.Timeout, want.MaxTimeout)
	}
}
