package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"
)

// TestDemoRecordsDecisions runs a short demo with -decision-log at a
// sample of 1: each region's log holds one record per request the region
// was decided, allowed exactly when the demo admitted it.
func TestDemoRecordsDecisions(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 7 s of real time")
	}
	var buf bytes.Buffer
	out = &buf
	dir := t.TempDir()
	o := options{duration: 3 * time.Second, budget: 100, regions: []string{"eu", "us", "ap"}, agents: 1, heavy: 1.3, light: 0.1,
		decisionLog: filepath.Join(dir, "d.jsonl"), sample: 1}
	if err := demo(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	for _, r := range o.regions {
		m := regexp.MustCompile(`(?m)^` + r + `\s+(\d+)\s+(\d+)`).FindStringSubmatch(buf.String())
		if m == nil {
			t.Fatalf("report has no line for %s:\n%s", r, buf.String())
		}
		offered, _ := strconv.Atoi(m[1])
		admitted, _ := strconv.Atoi(m[2])
		f, err := os.Open(filepath.Join(dir, "d-"+r+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		records, allowed := 0, 0
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			var rec struct {
				Region, Rule string
				Allowed      bool
			}
			if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
				t.Fatalf("%s: %q: %v", r, sc.Text(), err)
			}
			if rec.Region != r || rec.Rule != "api" {
				t.Errorf("%s's log holds %+v", r, rec)
			}
			records++
			if rec.Allowed {
				allowed++
			}
		}
		f.Close()
		// A request the demo counts as offered in the last slot may meet
		// the run's end before it reaches the store: at most one slot of
		// the busy rate.
		inFlight := int(o.heavy*float64(o.budget)*slot.Seconds()) + 1
		if records > offered || records < offered-inFlight || allowed != admitted || offered == 0 {
			t.Errorf("%s: %d records (%d allowed), the demo offered %d (up to %d cut at the end) and admitted %d", r, records, allowed, offered, inFlight, admitted)
		}
	}
}
