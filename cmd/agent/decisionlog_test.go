package main

import (
	"context"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestAgentWritesDecisionLog runs the agent with -decision-log, decides
// through its allow API, and reads the records back after it stops.
func TestAgentWritesDecisionLog(t *testing.T) {
	logPath := filepath.Join(t.TempDir(), "decisions.jsonl")
	p := launchAgent(t, testRules, "-decision-log", logPath, "-decision-log-sample", "1")
	waitHealthy(t, p)
	for i := 0; i < 12; i++ {
		allow(t, p.httpAddr, "alice")
	}
	// The log is flushed every second and at the end; poll for the
	// records instead of stopping the agent, which the cleanup does.
	deadline := time.Now().Add(10 * time.Second)
	var lines []string
	for {
		b, _ := os.ReadFile(logPath)
		lines = strings.Split(strings.TrimSpace(string(b)), "\n")
		if len(b) > 0 && len(lines) >= 12 || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond) // waiting for the flush goroutine's ticker
	}
	if len(lines) != 12 {
		t.Fatalf("%d records, want 12:\n%s", len(lines), strings.Join(lines, "\n"))
	}
	allowed := 0
	for _, l := range lines {
		var r struct {
			Region, Rule, Subject string
			Cost                  int64
			Allowed               bool
		}
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("record %q: %v", l, err)
		}
		if r.Region != "eu" || r.Rule != "api" || len(r.Subject) != 16 || r.Cost != 1 {
			t.Errorf("record %q: want region eu, rule api, a 16-digit subject hash, cost 1", l)
		}
		if r.Allowed {
			allowed++
		}
	}
	if allowed != 10 {
		t.Errorf("%d records allowed, want the 10 of a budget this region owns alone", allowed)
	}
}

// TestAgentDecisionLogFlags: a bad sample is refused naming it, and the log
// is off by default.
func TestAgentDecisionLogFlags(t *testing.T) {
	dir := t.TempDir()
	rulesFile := filepath.Join(dir, "rules.yaml")
	if err := os.WriteFile(rulesFile, []byte(testRules), 0o600); err != nil {
		t.Fatal(err)
	}
	err := run(context.Background(), []string{"-region", "eu", "-name", "eu-1", "-rules", rulesFile, "-http-listen", "127.0.0.1:0", "-grpc-listen", "127.0.0.1:0",
		"-decision-log", filepath.Join(dir, "d.jsonl"), "-decision-log-sample", "2"}, func(string) string { return "" }, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "sample=2 must be in (0, 1]") {
		t.Fatalf("run = %v, want the sample refused", err)
	}
	o, err := parse([]string{"-region", "eu", "-rules", rulesFile}, func(string) string { return "" }, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.dl.path != "" {
		t.Errorf("decision log on by default: %q", o.dl.path)
	}
}
