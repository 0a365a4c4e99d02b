package sim

import (
	"testing"

	"github.com/allot-dev/allot/agent"
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
