package main

import (
	"bytes"
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestDemoStaysWithinTheBudget runs a short demo: a coordinator over gRPC,
// three regions of two agents on memberlist, traffic moving between them.
func TestDemoStaysWithinTheBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10 s of real time")
	}
	var buf bytes.Buffer
	out = &buf
	o := options{duration: 6 * time.Second, budget: 1000, regions: []string{"eu", "us", "ap"}, agents: 2, heavy: 1.3, light: 0.1, gossip: true}
	if err := demo(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	for _, want := range []string{"within the budget", "allocation of the hot key per region", "api/tenant-42: allocation"} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "OVER the budget") {
		t.Errorf("the demo went over the budget:\n%s", s)
	}
	// Some region held a lease entry (the coordinator moved the budget).
	if !regexp.MustCompile(`\d+ lease`).MatchString(s) {
		t.Errorf("no region ever held a lease entry:\n%s", s)
	}
}
