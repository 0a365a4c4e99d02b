package region

import "slices"

// SpeakerOf returns the agent that speaks to the coordinator for a region
// whose live agents are members: the lowest name. Every agent computes the
// same answer from the same membership, so at most one speaks once
// membership has converged, and another takes over when it dies.
func SpeakerOf(members []string) string {
	if len(members) == 0 {
		return ""
	}
	return slices.Min(members)
}

