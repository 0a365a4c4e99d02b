package agent

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/rules"
)

type logLine struct {
	T       string `json:"t"`
	Region  string `json:"region"`
	Rule    string `json:"rule"`
	Subject string `json:"subject"`
	Cost    int64  `json:"cost"`
	Allowed bool   `json:"allowed"`
}

func readLog(t *testing.T, path string) []logLine {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []logLine
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var l logLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil {
			t.Fatalf("%s: line %q: %v", path, sc.Text(), err)
		}
		out = append(out, l)
	}
	return out
}

// TestDecisionLogStoreRecordsBudgets: every decision through the logged
// store is recorded (sample 1) under the budget it charges, with the
// subject hashed, its cost, the clock's time and the outcome.
func TestDecisionLogStoreRecordsBudgets(t *testing.T) {
	set, err := rules.Parse([]byte(`version: t
default_plan: free
plans: {free: "2 per minute", pro: "100 per second"}
rules:
  - {name: api, match: {path: "/*"}, limit: plan, scope: global}
`), "t.yaml")
	if err != nil {
		t.Fatal(err)
	}
	clk := clock.NewManual(time.Date(2026, 12, 2, 1, 2, 3, 456789000, time.UTC))
	path := filepath.Join(t.TempDir(), "d.jsonl")
	cfg := DefaultDecisionLogConfig()
	cfg.Path, cfg.Sample, cfg.Region, cfg.Clock = path, 1, "eu", clk
	lg, err := OpenDecisionLog(cfg)
	if err != nil {
		t.Fatal(err)
	}
	st := LogDecisions(bucket.NewMemory(bucket.MemoryOptions{Clock: clk}), lg, set)
	ctx := context.Background()
	free, _ := set.Plan("free")
	pro, _ := set.Plan("pro")
	for i := 0; i < 3; i++ {
		if _, err := st.Decide(ctx, bucket.Key{Rule: "api", Subject: "alice"}, free.Limit, 1, ""); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := st.Decide(ctx, bucket.Key{Rule: "api", Subject: "bob"}, pro.Limit, 3, ""); err != nil {
		t.Fatal(err)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	got := readLog(t, path)
	if len(got) != 4 {
		t.Fatalf("%d records, want 4", len(got))
	}
	hash := func(s string) string { h := sha256.Sum256([]byte(s)); return hex.EncodeToString(h[:8]) }
	want := []logLine{
		{"2026-12-02T01:02:03.456789Z", "eu", "api/free", hash("alice"), 1, true},
		{"2026-12-02T01:02:03.456789Z", "eu", "api/free", hash("alice"), 1, true},
		{"2026-12-02T01:02:03.456789Z", "eu", "api/free", hash("alice"), 1, false}, // the burst of 2 is spent
		{"2026-12-02T01:02:03.456789Z", "eu", "api/pro", hash("bob"), 3, true},
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("record %d = %+v, want %+v", i, got[i], want[i])
		}
	}
	if strings.Contains(readFile(t, path), "alice") {
		t.Error("the log holds a subject in clear")
	}
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// TestDecisionLogBounded: the log rotates before passing MaxBytes, keeps
// one previous file, and so never holds more than 2 × MaxBytes.
func TestDecisionLogBounded(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "d.jsonl")
	clk := clock.NewManual(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	lg, err := OpenDecisionLog(DecisionLogConfig{Path: path, Sample: 1, MaxBytes: 4096, Region: "us", Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	const n = 500 // ~120 bytes each: several rotations
	for i := 0; i < n; i++ {
		lg.Record(clk.Now(), "api", "s", 1, true)
		clk.Advance(time.Millisecond)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	st := lg.Stats()
	if st.Records != n || st.Rotations < 5 {
		t.Fatalf("stats %+v, want %d records and ≥ 5 rotations", st, n)
	}
	var total int
	for _, p := range []string{path, path + ".1"} {
		fi, err := os.Stat(p)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Size() > 4096 {
			t.Errorf("%s is %d bytes, above max_bytes 4096", p, fi.Size())
		}
		total += len(readLog(t, p))
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 2 {
		t.Errorf("%d files in the log's directory, want 2", len(entries))
	}
	// The newest records survive: the current file ends with the last one.
	recs := readLog(t, path)
	if last := recs[len(recs)-1].T; last != "2026-12-02T00:00:00.499000Z" {
		t.Errorf("last record at %s, want the 500th decision's time", last)
	}
	if total >= n {
		t.Errorf("%d records on disk after %d rotations, want fewer than the %d written", total, st.Rotations, n)
	}
}

// TestDecisionLogSamples: a sample of 0.1 records about a tenth of the
// decisions.
func TestDecisionLogSamples(t *testing.T) {
	path := filepath.Join(t.TempDir(), "d.jsonl")
	lg, err := OpenDecisionLog(DecisionLogConfig{Path: path, Sample: 0.1, MaxBytes: 1 << 30, Region: "us"})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 20000; i++ {
		lg.Record(time.Unix(0, 0), "api", "s", 1, true)
	}
	if err := lg.Close(); err != nil {
		t.Fatal(err)
	}
	// Binomial(20000, 0.1): mean 2000, sd 42; ±5 sd.
	if n := len(readLog(t, path)); n < 1790 || n > 2210 {
		t.Errorf("%d records of 20000 at sample 0.1, want 2000 ± 210", n)
	}
}

func TestDecisionLogConfigErrors(t *testing.T) {
	base := DecisionLogConfig{Path: "x", Sample: 0.5, MaxBytes: 1 << 20, Region: "eu"}
	for _, tc := range []struct {
		mod  func(*DecisionLogConfig)
		want string
	}{
		{func(c *DecisionLogConfig) { c.Path = "" }, "path is empty"},
		{func(c *DecisionLogConfig) { c.Sample = 0 }, "sample=0 must be in (0, 1]"},
		{func(c *DecisionLogConfig) { c.Sample = 1.5 }, "sample=1.5"},
		{func(c *DecisionLogConfig) { c.MaxBytes = 10 }, "max_bytes=10"},
		{func(c *DecisionLogConfig) { c.Region = "" }, "region is empty"},
	} {
		c := base
		tc.mod(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate() = %v, want %q", err, tc.want)
		}
	}
}
