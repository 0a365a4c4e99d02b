package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRunWritesReports runs one scenario at a small scale and checks the
// table, the JSON and the self-contained HTML.
func TestRunWritesReports(t *testing.T) {
	dir := t.TempDir()
	jsonPath, htmlPath := filepath.Join(dir, "r.json"), filepath.Join(dir, "r.html")
	var out, errOut bytes.Buffer
	err := run([]string{"-seed", "3", "-scale", "0.02", "-max-keys", "50", "-json", jsonPath, "-html", htmlPath,
		"../../sim/scenarios/03-flash-crowd.yaml"}, &out, &errOut)
	if err != nil {
		t.Fatalf("run: %v\n%s", err, errOut.String())
	}
	if !strings.Contains(out.String(), "flash-crowd") || !strings.Contains(out.String(), "PASS") {
		t.Fatalf("table lacks the scenario or its verdict:\n%s", out.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var res []map[string]any
	if err := json.Unmarshal(b, &res); err != nil || len(res) != 1 || res[0]["seed"] != float64(3) {
		t.Fatalf("json: %v, %d results", err, len(res))
	}
	h, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	html := string(h)
	for _, want := range []string{"<svg", "allocation per region", "Fault timeline", "overshoot over time"} {
		if !strings.Contains(html, want) {
			t.Errorf("html lacks %q", want)
		}
	}
	for _, banned := range []string{"<script src", "<link ", "https://"} {
		if strings.Contains(html, banned) {
			t.Errorf("html refers to the network: %q", banned)
		}
	}
}

func TestRunRejectsBadInput(t *testing.T) {
	var out, errOut bytes.Buffer
	if err := run([]string{"-seeds", "x", "../../sim/scenarios"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), `"x"`) {
		t.Fatalf("bad seed: err = %v", err)
	}
	if err := run([]string{"-systems", "nope", "../../sim/scenarios/01-steady-skewed.yaml"}, &out, &errOut); err == nil || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("bad system: err = %v", err)
	}
	if err := run(nil, &out, &errOut); err == nil {
		t.Fatal("no scenario: want an error")
	}
}

// TestUnsafeSkipEscrowFails runs escrow-cut with the allocator's escrow
// check off and expects the exit error and a FAIL line that replays it,
// and the same run with the escrow to pass.
func TestUnsafeSkipEscrowFails(t *testing.T) {
	var out, errOut bytes.Buffer
	args := []string{"-q", "-seed", "2", "-scale", "0.05", "-systems", "allot", "../../sim/scenarios/16-escrow-cut.yaml"}
	if err := run(args, &out, &errOut); err != nil {
		t.Fatalf("with the escrow: %v\n%s", err, errOut.String())
	}
	errOut.Reset()
	err := run(append([]string{"-unsafe-skip-escrow"}, args...), &out, &errOut)
	if !errors.Is(err, errFailed) {
		t.Fatalf("without the escrow: err = %v, want %v", err, errFailed)
	}
	if want := "FAIL escrow-cut seed=2; replay: go run ./cmd/sim -seed 2 -scale 0.05 -max-keys 0 -unsafe-skip-escrow"; !strings.Contains(errOut.String(), want) {
		t.Fatalf("stderr lacks %q:\n%s", want, errOut.String())
	}
}
