package agent

import (
	"slices"
	"testing"
)

// An agent alone owns its whole budget; any other takes the coordinator's
// split, whether or not the coordinator is reachable.
func TestFloors(t *testing.T) {
	for _, c := range []struct {
		name        string
		regions     []string
		coordinated bool
		alone       bool
		want        []string
	}{
		{"no regions, no coordinator", nil, false, true, []string{"eu"}},
		{"only its own region", []string{"eu"}, false, true, []string{"eu"}},
		{"other regions, no coordinator", []string{"eu", "us"}, false, false, []string{"eu", "us"}},
		{"a coordinator", []string{"eu", "us"}, true, false, []string{"eu", "us"}},
	} {
		spec, alone := Floors("eu", c.regions, []int64{2, 1}, 0.1, c.coordinated)
		if alone != c.alone || !slices.Equal(spec.Regions, c.want) {
			t.Errorf("%s: regions %v alone %v, want %v alone %v", c.name, spec.Regions, alone, c.want, c.alone)
		}
		if alone && (spec.Reserve != 0 || spec.Weights != nil) {
			t.Errorf("%s: alone with reserve %v weights %v, want the whole budget", c.name, spec.Reserve, spec.Weights)
		}
		if !alone && (spec.Reserve != 0.1 || len(spec.Weights) != 2) {
			t.Errorf("%s: reserve %v weights %v, want the configured split", c.name, spec.Reserve, spec.Weights)
		}
	}
}

func TestHostPort(t *testing.T) {
	if h, p, err := HostPort("127.0.0.1:7946"); err != nil || h != "127.0.0.1" || p != 7946 {
		t.Fatalf("HostPort = %q %d %v", h, p, err)
	}
	for _, bad := range []string{"7946", "host:port", ""} {
		if _, _, err := HostPort(bad); err == nil {
			t.Errorf("HostPort(%q) took it", bad)
		}
	}
}
