package sim

import (
	"encoding/json"
	"math"
	"strconv"
	"testing"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// TestSpeakerTimingsAreTheAgents: the simulator's speaking agent waits and
// holds its speaker lease as agent.DefaultConfig has the agent do.
func TestSpeakerTimingsAreTheAgents(t *testing.T) {
	cfg := agent.DefaultConfig()
	if got, want := Micros(speakerWait), us(cfg.SpeakerWait); got != want {
		t.Errorf("speakerWait %d µs, the agent's SpeakerWait %d µs", got, want)
	}
	if got, want := Micros(speakerLease), us(cfg.SpeakerLease); got != want {
		t.Errorf("speakerLease %d µs, the agent's SpeakerLease %d µs", got, want)
	}
}

// TestNoticeBodyMaxIsTheAgents: the simulator's agents carry in a notice
// the tables agent.RedisShared's notices carry, and a table of 256
// entries fits (tooLargeForNotice does not encode those).
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
	if !tooLargeForNotice(tb) {
		t.Fatal("a table of 2,256 long entries fits a notice")
	}
}
