package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/internal/testenv"
)

// shortConfig is the short form: every system, small counts, a few
// seconds of load. The peers run when installed (`make bench-peers`
// installs them), and must when ALLOT_BENCH_PEERS=1.
func shortConfig() Config {
	cfg := DefaultConfig()
	cfg.Callers = []int{1, 8}
	cfg.Keys = []int{1, 100}
	cfg.Duration = 300 * time.Millisecond
	cfg.Warmup = 100 * time.Millisecond
	cfg.Rounds = 1
	cfg.MemoryKeys, cfg.HotKeys, cfg.HotFor = 500, 100, 500*time.Millisecond
	cfg.RequirePeers = os.Getenv("ALLOT_BENCH_PEERS") == "1"
	return cfg
}

func needRedis(t *testing.T) {
	if _, err := exec.LookPath("redis-server"); err != nil {
		if testenv.CI() {
			t.Fatalf("redis-server not installed: %v", err)
		}
		t.Skipf("redis-server not installed: %v", err)
	}
}

// The short form starts every system, and every system decides in every
// cell; the memory table has each system's keys.
func TestShortRun(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the agent and starts servers")
	}
	needRedis(t)
	cfg := shortConfig()
	var out strings.Builder
	rep, err := Run(context.Background(), cfg, &out)
	t.Log(out.String())
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"allot-region", "allot-local"} {
		if !strings.Contains(strings.Join(rep.Systems, ","), name) {
			t.Fatalf("systems run = %v, want %s among them", rep.Systems, name)
		}
	}
	cells := len(cfg.Callers) * len(cfg.Keys) * cfg.Rounds
	for _, name := range rep.Systems {
		n := 0
		for _, r := range rep.Results {
			if r.System != name {
				continue
			}
			n++
			if r.Decisions == 0 || r.Failed != 0 {
				t.Errorf("%s callers %d keys %d: %d decisions, %d failed", name, r.Callers, r.Keys, r.Decisions, r.Failed)
			}
			if r.ServiceCPU <= 0 {
				t.Errorf("%s callers %d keys %d: no service CPU read from /proc", name, r.Callers, r.Keys)
			}
			if name == "allot-region" && r.RedisCalls == 0 {
				t.Errorf("allot-region callers %d keys %d: its Redis ran no command: the region scope did not reach Redis", r.Callers, r.Keys)
			}
			if name == "allot-local" && r.RedisCalls != 0 {
				t.Errorf("allot-local has a Redis that ran %d commands", r.RedisCalls)
			}
		}
		if n != cells {
			t.Errorf("%s has %d results, want %d", name, n, cells)
		}
	}
	// Each subject's idle state is one key in Redis for allot (and for the
	// fixed window's single window, envoyproxy/ratelimit); the agent also
	// writes back its region's table and demand report after the flush.
	seen := map[string]bool{}
	for _, m := range rep.Memory {
		seen[m.System+"/"+m.Where+"/"+m.Kind] = true
		if m.BytesPerKey <= 0 || m.BytesPerKey > 2000 {
			t.Errorf("%s %s %s: %.0f bytes per key, want a plausible figure", m.System, m.Where, m.Kind, m.BytesPerKey)
		}
		if m.Where == "Redis" && m.Kind == "idle" && (m.StoredKeys < int64(m.Keys) || m.StoredKeys > int64(m.Keys)+2) {
			t.Errorf("%s: %d Redis keys for %d idle subjects, want one each (and at most the agent's two)", m.System, m.StoredKeys, m.Keys)
		}
	}
	for _, want := range []string{"allot (bucket.Memory)/in process/idle", "allot (bucket.Memory)/in process/hot", "allot-region/Redis/idle", "allot-region/Redis/hot"} {
		if !seen[want] {
			t.Errorf("memory table lacks %s: %v", want, rep.Memory)
		}
	}
	for _, want := range []string{"| callers | keys | system |", "allot-region", "load average"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("report lacks %q", want)
		}
	}
}

// A system that does not start fails the run: here a required peer whose
// binary is not where the run looks.
func TestMissingPeerFailsWhenRequired(t *testing.T) {
	cfg := shortConfig()
	cfg.Systems = []string{"envoyproxy-ratelimit"}
	cfg.BinDir = filepath.Join(t.TempDir(), "nothing-here")
	cfg.RequirePeers = true
	_, err := Run(context.Background(), cfg, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "not installed") {
		t.Fatalf("run with a required peer missing: err = %v, want one saying it is not installed", err)
	}
	// Not required, it is left out and said so.
	cfg.RequirePeers = false
	cfg.Systems = []string{"envoyproxy-ratelimit"}
	names, notes, err := installPeers(context.Background(), cfg)
	if err != nil || len(names) != 0 || len(notes) != 1 || !strings.Contains(notes[0], "left out") {
		t.Fatalf("installPeers = %v, %v, %v; want the peer left out with a note", names, notes, err)
	}
}

// A service that does not start (its process exits) fails the run with its
// output.
func TestServiceThatExitsFailsTheRun(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	needRedis(t)
	dir := t.TempDir()
	// A shell that exits at once stands in for an agent binary that cannot
	// start; the real agent's failure modes are the agent's tests' concern.
	bin := filepath.Join(dir, "agent")
	if err := os.WriteFile(bin, []byte("#!/bin/sh\necho cannot start >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := startSystem(context.Background(), shortConfig(), dir, "allot-region", bin, 10)
	if err == nil || !strings.Contains(err.Error(), "cannot start") {
		t.Fatalf("start of an exiting service: err = %v, want one carrying its output", err)
	}
}

// checkLimit refuses a system whose effective limit the load could reach,
// such as an agent on a floor below the rule's limit.
func TestCheckLimit(t *testing.T) {
	status := func(n uint32, unit rlsv3.RateLimitResponse_RateLimit_Unit, mult uint32) *rlsv3.RateLimitResponse {
		cl := &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: n, Unit: unit}
		if mult > 0 {
			cl.UnitMultiplier = wrapperspb.UInt32(mult)
		}
		return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
			Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OK, CurrentLimit: cl}}}
	}
	for _, tc := range []struct {
		resp *rlsv3.RateLimitResponse
		ok   bool
	}{
		{status(apiPerSecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 0), true},
		{status(60*apiPerSecond, rlsv3.RateLimitResponse_RateLimit_MINUTE, 0), true},
		{status(666_666, rlsv3.RateLimitResponse_RateLimit_SECOND, 0), false},       // a floor of two thirds
		{status(apiPerSecond, rlsv3.RateLimitResponse_RateLimit_SECOND, 10), false}, // per 10 s
		{&rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT}, false},
		{status(apiPerSecond, rlsv3.RateLimitResponse_RateLimit_UNKNOWN, 0), false},
	} {
		if err := checkLimit(tc.resp); (err == nil) != tc.ok {
			t.Errorf("checkLimit(%v) = %v, want ok=%v", tc.resp, err, tc.ok)
		}
	}
}

// A base agent runs from the binary -base-agent names, beside the tree's,
// under the name <system>-base: here a stand-in that exits with its own
// words, so its output in the error shows which binary ran.
func TestBaseAgentRunsTheGivenBinary(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a redis-server")
	}
	needRedis(t)
	dir := t.TempDir()
	base := filepath.Join(dir, "agent-base")
	if err := os.WriteFile(base, []byte("#!/bin/sh\necho the base binary ran >&2\nexit 3\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	cfg := shortConfig()
	cfg.BaseAgent = base
	_, err := startSystem(context.Background(), cfg, dir, "allot-region"+baseSuffix, "/nonexistent/agent", 10)
	if err == nil || !strings.Contains(err.Error(), "the base binary ran") {
		t.Fatalf("start of allot-region-base: err = %v, want the base binary's output", err)
	}
	cfg.BaseAgent = filepath.Join(dir, "missing")
	cfg.Systems = []string{"allot-local"}
	if _, err := Run(context.Background(), cfg, io.Discard); err == nil || !strings.Contains(err.Error(), "-base-agent") {
		t.Fatalf("run with a missing base agent: err = %v, want one naming -base-agent", err)
	}
}
