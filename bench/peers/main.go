// Command peers drives allot's agent and its peers side by side: it starts
// every system it compares (each service with its own redis-server on
// loopback), drives them with one closed-loop generator over Envoy RLS v3
// (Gubernator, which has no RLS, over its own gRPC API) in interleaved
// rounds, and prints decisions/s, latency percentiles and CPU µs per
// decision — the service's plus its Redis's, read from /proc — for every
// number of callers and keys asked for. It then measures bytes per key in
// process and in Redis. `make bench-peers` runs the full form; the test in
// this directory runs a short one.
//
// The peers are installed with `go install` through the Go module proxy,
// pinned, into a cache directory (-install does it); a peer that is not
// installed is left out and said so, unless ALLOT_BENCH_PEERS=1, which
// makes a missing peer an error.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	cfg := DefaultConfig()
	var callers, keys, systems string
	flag.StringVar(&callers, "callers", "1,32,256", "closed-loop callers, comma-separated")
	flag.StringVar(&keys, "keys", "1,1000,1000000", "distinct keys the callers spread over, comma-separated")
	flag.StringVar(&systems, "systems", strings.Join(cfg.Systems, ","), "systems to compare, comma-separated: "+strings.Join(allSystems, ", "))
	flag.DurationVar(&cfg.Duration, "duration", cfg.Duration, "length of one measured round of one system")
	flag.IntVar(&cfg.Rounds, "rounds", cfg.Rounds, "interleaved rounds per cell")
	flag.IntVar(&cfg.MemoryKeys, "memory-keys", cfg.MemoryKeys, "keys for the bytes-per-idle-key measurement (0: skip the memory table)")
	flag.IntVar(&cfg.HotKeys, "hot-keys", cfg.HotKeys, "keys for the bytes-per-hot-key measurement")
	flag.BoolVar(&cfg.Install, "install", false, "go install the peers, pinned, into the cache directory when missing")
	flag.StringVar(&cfg.BinDir, "bin", cfg.BinDir, "directory holding the peers' binaries")
	flag.StringVar(&cfg.JSON, "json", "", "also write the results as JSON to this file")
	flag.StringVar(&cfg.BaseAgent, "base-agent", "", "an agent binary built from another commit: each allot system also runs from it, as <system>-base, in the same rounds")
	flag.Parse()
	var err error
	if cfg.Callers, err = ints(callers); err != nil {
		fail(fmt.Errorf("-callers=%q: %w", callers, err))
	}
	if cfg.Keys, err = ints(keys); err != nil {
		fail(fmt.Errorf("-keys=%q: %w", keys, err))
	}
	cfg.Systems = strings.Split(systems, ",")
	cfg.RequirePeers = os.Getenv("ALLOT_BENCH_PEERS") == "1"
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := Run(ctx, cfg, os.Stdout); err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "peers:", err)
	os.Exit(1)
}

func ints(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

// Config is one run of the comparison.
type Config struct {
	Systems      []string      // names from allSystems
	Callers      []int         // closed-loop callers per cell
	Keys         []int         // distinct keys per cell
	Duration     time.Duration // one measured round of one system
	Warmup       time.Duration // unmeasured load before each round
	Rounds       int           // interleaved rounds per cell
	MemoryKeys   int           // keys for bytes per idle key; 0 skips the memory table
	HotKeys      int           // keys for bytes per hot key
	HotFor       time.Duration // how long the hot keys are kept busy before measuring
	Install      bool          // go install missing peers
	RequirePeers bool          // a peer that is not installed is an error
	BinDir       string        // where the peers' binaries are
	JSON         string        // optional JSON output
	// BaseAgent, when set, is an agent binary built from another commit
	// (the baseline of a change): every allot system also runs from it,
	// named with the suffix -base, interleaved in the same rounds, so a
	// change is measured against its baseline under the same load.
	BaseAgent string
}

// DefaultConfig is the full form that `make bench-peers` runs.
func DefaultConfig() Config {
	return Config{
		Systems:    allSystems,
		Callers:    []int{1, 32, 256},
		Keys:       []int{1, 1000, 1_000_000},
		Duration:   5 * time.Second,        // ~75k decisions at 15k/s: percentiles to p999 are stable
		Warmup:     500 * time.Millisecond, // connections dialled, caches warm
		Rounds:     2,                      // each system measured twice per cell, in rotated order
		MemoryKeys: 100_000,
		HotKeys:    1_000,           // each decided several times a second at the rates seen here
		HotFor:     3 * time.Second, // three 1 s windows, so fixed-window keys roll over
		BinDir:     defaultBinDir(),
	}
}

func defaultBinDir() string {
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	return dir + "/allot-bench-peers/bin"
}
