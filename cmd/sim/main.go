// Command sim runs allot's deterministic simulator: one scenario file or a
// directory of them, each against allot and the baselines on the same
// arrivals. It prints a table, and writes the results as JSON and a
// self-contained HTML report with charts.
//
//	sim [flags] sim/scenarios            # the whole library
//	sim -seed 7 sim/scenarios/03-flash-crowd.yaml
//	sim -unsafe-skip-escrow sim/scenarios/16-escrow-cut.yaml   # a broken allocator, caught
//	sim sweep -lease-ttl 5s,10s -reserve 0.2,0.33 -html sweep.html my.yaml   # what-if over settings
//
// The exit status is 1 when any run FAILs (allot's overshoot above the
// bound for the scenario's faults), and every failing run prints the
// command that replays it exactly.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/sim"
)

func main() {
	if err := run(os.Args[1:], os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, errFailed) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
}

var errFailed = errors.New("sim: some runs failed")

func run(args []string, stdout, stderr io.Writer) error {
	if len(args) > 0 && args[0] == "sweep" {
		return sweep(args[1:], stdout, stderr)
	}
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	fs.SetOutput(stderr)
	seeds := fs.String("seeds", "", "comma-separated seeds to run (default: each scenario's first seed)")
	seed := fs.Uint64("seed", 0, "run this one seed (overrides -seeds)")
	allSeeds := fs.Bool("all-seeds", false, "run every seed the scenario lists")
	scale := fs.Float64("scale", 1, "multiply every traffic rate and budget by this factor")
	maxKeys := fs.Int("max-keys", 0, "cap the keys of every rule (0: as the scenario says)")
	systems := fs.String("systems", "", "comma-separated systems to run (default all: "+strings.Join(sim.Systems, ",")+")")
	jsonOut := fs.String("json", "", "write the results as JSON to this file")
	htmlOut := fs.String("html", "", "write the HTML report to this file")
	quiet := fs.Bool("q", false, "print no table")
	failFast := fs.Bool("failfast", false, "stop at the first run that FAILs")
	forms := fs.String("forms", "normal", "which forms of each scenario to run: normal, tight (every burst cut to at most 0.1 s of rate) or both")
	unsafeSkipEscrow := fs.Bool("unsafe-skip-escrow", false, "run allot's allocator with its escrow check off, to watch the simulator catch it (escrow-cut FAILs); never for figures")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: sim [flags] scenario.yaml|dir ...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	var tightForms []bool
	switch *forms {
	case "normal":
		tightForms = []bool{false}
	case "tight":
		tightForms = []bool{true}
	case "both":
		tightForms = []bool{false, true}
	default:
		return fmt.Errorf("sim: -forms=%q must be normal, tight or both", *forms)
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return fmt.Errorf("sim: no scenario given")
	}
	var scs []*sim.Scenario
	var paths []string
	for _, arg := range fs.Args() {
		st, err := os.Stat(arg)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		if st.IsDir() {
			list, err := sim.LoadDir(arg)
			if err != nil {
				return err
			}
			names, _ := filepath.Glob(filepath.Join(arg, "*.yaml"))
			scs = append(scs, list...)
			paths = append(paths, sortedCopy(names)...)
			continue
		}
		sc, err := sim.LoadScenario(arg)
		if err != nil {
			return err
		}
		scs = append(scs, sc)
		paths = append(paths, arg)
	}
	opts := sim.Options{UnsafeSkipEscrow: *unsafeSkipEscrow}
	if *systems != "" {
		opts.Systems = strings.Split(*systems, ",")
	}
	var fixed []uint64
	switch {
	case *seed != 0:
		fixed = []uint64{*seed}
	case *seeds != "":
		for _, s := range strings.Split(*seeds, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return fmt.Errorf("sim: -seeds: %q is not a seed: %w", s, err)
			}
			fixed = append(fixed, v)
		}
	}
	tty := isTTY(stderr)
	var results []*sim.Result
	failed := false
	start := time.Now()
	var arrivals int64
	runOne := func(i int, sc *sim.Scenario, tight bool) error {
		if *scale != 1 {
			s, err := sc.Scaled(*scale)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i], err)
			}
			sc = s
		}
		if *maxKeys > 0 {
			s, err := sc.WithMaxKeys(*maxKeys)
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i], err)
			}
			sc = s
		}
		form := ""
		if tight {
			s, err := sc.Tight()
			if err != nil {
				return fmt.Errorf("%s: %w", paths[i], err)
			}
			sc, form = s, " -forms tight"
		}
		runSeeds := fixed
		if runSeeds == nil {
			runSeeds = sc.Seeds[:1]
			if *allSeeds {
				runSeeds = sc.Seeds
			}
		}
		for _, sd := range runSeeds {
			if *failFast && failed {
				return nil
			}
			o := opts
			began := time.Now()
			if tty {
				name := sc.Name
				o.Progress = func(now, end time.Duration) {
					if time.Since(began) < 500*time.Millisecond {
						return // short runs need no bar
					}
					const width = 30
					done := int(width * now / max(end, 1))
					fmt.Fprintf(stderr, "\r%-24s seed %-6d [%s%s] %3.0f%%", name, sd,
						strings.Repeat("#", done), strings.Repeat(".", width-done), 100*float64(now)/float64(max(end, 1)))
				}
			}
			res, err := sim.Run(sc, sd, o)
			if tty {
				fmt.Fprintf(stderr, "\r%s\r", strings.Repeat(" ", 80))
			}
			if err != nil {
				return fmt.Errorf("%s seed %d: %w", paths[i], sd, err)
			}
			arrivals += res.Arrivals
			results = append(results, res)
			replay := fmt.Sprintf("go run ./cmd/sim -seed %d -scale %v -max-keys %d%s", sd, *scale, *maxKeys, form)
			if *unsafeSkipEscrow {
				replay += " -unsafe-skip-escrow"
			}
			switch res.Verdict {
			case sim.Fail:
				failed = true
				fmt.Fprintf(stderr, "FAIL %s seed=%d; replay: %s %s\n", sc.Name, sd, replay, paths[i])
				for _, m := range res.Missed {
					fmt.Fprintf(stderr, "  expectation missed: %s\n", m)
				}
				for _, v := range res.Violations {
					fmt.Fprintf(stderr, "  protocol violation: %s\n", v)
				}
				if n := res.ViolationCount - int64(len(res.Violations)); n > 0 {
					fmt.Fprintf(stderr, "  and %d more protocol violations\n", n)
				}
			case sim.Beyond:
				for _, ro := range res.Systems[0].Rules {
					if b := ro.Beyond; b != nil {
						fmt.Fprintf(stderr, "BEYOND %s seed=%d rule %s: %s; measured %.1f tokens above the bound, the design's estimate ≈ %.1f; replay: %s %s\n",
							sc.Name, sd, ro.Rule, b.Reason, b.ExcessTokens, b.EstimateTokens, replay, paths[i])
					}
				}
			}
		}
		return nil
	}
	for i, sc := range scs {
		for _, tight := range tightForms {
			if err := runOne(i, sc, tight); err != nil {
				return err
			}
		}
	}
	elapsed := time.Since(start)
	if !*quiet {
		if err := sim.WriteTable(stdout, results); err != nil {
			return err
		}
		fmt.Fprintf(stdout, "\n%d runs, %d arrivals in %.2fs wall\n", len(results), arrivals, elapsed.Seconds())
		if err := sim.WriteBehindStatic(stdout, results); err != nil {
			return err
		}
	}
	if *jsonOut != "" {
		if err := writeFile(*jsonOut, func(w io.Writer) error { return sim.WriteJSON(w, results) }); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, func(w io.Writer) error { return sim.WriteHTML(w, results) }); err != nil {
			return err
		}
	}
	if failed {
		return errFailed
	}
	return nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	if err := write(f); err != nil {
		_ = f.Close() // the write error is the one to report
		return err
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sim: close %s: %w", path, err)
	}
	return nil
}

func isTTY(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	st, err := f.Stat()
	return err == nil && st.Mode()&os.ModeCharDevice != 0
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := 1; i < len(out); i++ {
		for j := i; j > 0 && out[j] < out[j-1]; j-- {
			out[j], out[j-1] = out[j-1], out[j]
		}
	}
	return out
}
