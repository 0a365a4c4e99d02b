package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestSweepCommand sweeps the operator's example (its own budgets file)
// over two reserves and two failure policies, and checks the table, the
// JSON and the report's chart.
func TestSweepCommand(t *testing.T) {
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "s.json"), filepath.Join(dir, "s.html")
	var out, errOut bytes.Buffer
	err := run([]string{"sweep", "-reserve", "0.1,0.33", "-policy", "closed,open", "-seeds", "1", "-scale", "0.1", "-max-keys", "20",
		"-json", jsonPath, "-html", htmlPath, "../../sim/testdata/ops/whatif.yaml"}, &out, &errOut)
	if err != nil {
		t.Fatalf("sweep: %v\n%s", err, errOut.String())
	}
	table := out.String()
	for _, want := range []string{"sweep of ops-whatif over reserve × policy", "UNBOUNDED", "breaks", "best: #", "4 points × 1 seeds"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res struct {
		Points []struct {
			Settings struct {
				Reserve float64
				Policy  string
			}
			Keeps bool `json:"keeps_bounds"`
			Best  bool
		}
		Best int
	}
	if err := json.Unmarshal(b, &res); err != nil || len(res.Points) != 4 {
		t.Fatalf("json: %v, %d points", err, len(res.Points))
	}
	if res.Best < 0 || res.Points[res.Best].Settings.Policy != "closed" || !res.Points[res.Best].Keeps {
		t.Errorf("best %d %+v, want a fail-closed point (open breaks its bound under the Redis cut)", res.Best, res.Points)
	}
	h, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(h), "Sweep: utilization and worst overshoot") || strings.Contains(string(h), "https://") {
		t.Error("sweep report lacks its chart or refers to the network")
	}
}

func TestSweepCommandRejectsBadInput(t *testing.T) {
	var out, errOut bytes.Buffer
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"sweep", "-lease-ttl", "10s,soon", "../../sim/testdata/ops/whatif.yaml"}, `-lease-ttl="10s,soon": "soon" is not a positive duration`},
		{[]string{"sweep", "-reserve", "a", "../../sim/testdata/ops/whatif.yaml"}, `-reserve="a": "a" is not a number`},
		{[]string{"sweep", "-policy", "maybe", "../../sim/testdata/ops/whatif.yaml"}, `policy[0]="maybe"`},
		{[]string{"sweep"}, "want one scenario file"},
	} {
		if err := run(tc.args, &out, &errOut); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err = %v, want %q", tc.args, err, tc.want)
		}
	}
}
