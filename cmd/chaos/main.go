// Command chaos runs allot's real binaries under real faults (package
// chaos): for every scenario file, the processes on loopback, the fault
// proxies, the load over Envoy RLS and the checker; then the simulator on
// the same file, and the two side by side.
//
//	chaos chaos/scenarios                      # every scenario (make chaos)
//	chaos chaos/scenarios/short                # the short form (make chaos-short)
//	chaos -run 'redis' -keep chaos/scenarios   # some, keeping logs and histories
//	chaos -run '^healthy$' -keep -trace-lease chaos/scenarios  # every lease message in the processes' logs
//	chaos -sim=false -seeds 1,2,3 -run '^coordinator-slow$' chaos/scenarios  # one file at three seeds
//	chaos -judge /tmp/allot-chaos-…/healthy    # judge a kept run again
//
// The exit status is 1 when any run's verdict differs from the one its
// file expects (a known failure is expected to FAIL) or a run could not be
// made.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/allot-dev/allot/chaos"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		if !errors.Is(err, errUnexpected) {
			fmt.Fprintln(os.Stderr, err)
		}
		os.Exit(1)
	}
}

var errUnexpected = errors.New("chaos: some runs did not end as their files expect")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	fs.SetOutput(stderr)
	jsonOut := fs.String("json", "", "write the results as JSON to this file")
	pattern := fs.String("run", "", "run only scenarios whose name matches this regular expression")
	withSim := fs.Bool("sim", true, "also run the simulator on each file and print both side by side")
	keep := fs.Bool("keep", false, "keep every run's directory (configuration, logs, history.json)")
	dir := fs.String("dir", "", "parent directory for the runs' directories (default: a temporary one)")
	quiet := fs.Bool("q", false, "no progress lines")
	judge := fs.Bool("judge", false, "judge again runs kept with -keep: the arguments are their directories")
	seed := fs.Uint64("seed", 0, "the arrivals' seed for every file, the simulator's beside it too (default: each file's first seed)")
	seedList := fs.String("seeds", "", "run every file once at each of these seeds (comma-separated, e.g. 1,2,3), in place of -seed; the summary counts the moves over every run")
	traceLease := fs.Bool("trace-lease", false, "the coordinators and the speaking agents log every lease message with its keys (-log-level debug); with -keep, in coordinator-N.log and <region>-N.log")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: chaos [flags] scenario.yaml|dir ...\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() == 0 {
		fs.Usage()
		return errors.New("chaos: no scenario given")
	}
	if *judge {
		var results []*chaos.Result
		for _, d := range fs.Args() {
			res, err := chaos.Judge(d)
			if err != nil {
				return err
			}
			chaos.PrintDetail(stdout, res)
			results = append(results, res)
		}
		fmt.Fprintln(stdout)
		chaos.PrintSummary(stdout, results)
		if *jsonOut != "" {
			return chaos.WriteJSON(*jsonOut, results)
		}
		return nil
	}
	seeds := []uint64{*seed}
	if *seedList != "" {
		if *seed != 0 {
			return errors.New("chaos: -seed and -seeds: give one of them")
		}
		var err error
		if seeds, err = parseSeeds(*seedList); err != nil {
			return err
		}
	}
	var re *regexp.Regexp
	if *pattern != "" {
		var err error
		if re, err = regexp.Compile(*pattern); err != nil {
			return fmt.Errorf("chaos: -run: %w", err)
		}
	}
	var scs []*chaos.Scenario
	for _, arg := range fs.Args() {
		st, err := os.Stat(arg)
		if err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		var list []*chaos.Scenario
		if st.IsDir() {
			if list, err = chaos.LoadDir(arg); err != nil {
				return err
			}
		} else {
			sc, err := chaos.Load(arg)
			if err != nil {
				return err
			}
			list = []*chaos.Scenario{sc}
		}
		for _, sc := range list {
			if re != nil && !re.MatchString(sc.Name()) {
				continue
			}
			scs = append(scs, sc)
		}
	}
	if len(scs) == 0 {
		return errors.New("chaos: no scenario selected")
	}
	logf := func(format string, a ...any) {
		if !*quiet {
			fmt.Fprintf(stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, a...)...)
		}
	}
	base := *dir
	if base == "" {
		var err error
		if base, err = os.MkdirTemp("", "allot-chaos-"); err != nil {
			return fmt.Errorf("chaos: %w", err)
		}
		if !*keep {
			defer os.RemoveAll(base)
		}
	}
	logf("building the binaries")
	bins, err := chaos.Build(ctx, base)
	if err != nil {
		return err
	}
	var results []*chaos.Result
	failed := false
	for _, sc := range scs {
		for _, sd := range seeds {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			name := sc.Name()
			if len(seeds) > 1 {
				name = fmt.Sprintf("%s-seed%d", name, sd)
			}
			opts := chaos.Options{Dir: filepath.Join(base, name), Keep: *keep, Bins: bins, Seed: sd, Logf: logf, TraceLease: *traceLease}
			res, err := chaos.Run(ctx, sc, opts)
			if err != nil {
				if ctx.Err() != nil {
					return ctx.Err()
				}
				fmt.Fprintf(stderr, "%s: %v\n", name, err)
				failed = true
				continue
			}
			if !*keep {
				res.Dir = ""
				_ = os.RemoveAll(opts.Dir) // a run directory left behind costs only disk
			}
			if *withSim {
				logf("%s: the simulator on the same file", name)
				res.Sim = chaos.RunSim(sc, res.Seed)
			}
			chaos.PrintDetail(stdout, res)
			results = append(results, res)
			if res.Outcome != "as expected" {
				failed = true
			}
		}
	}
	fmt.Fprintln(stdout)
	chaos.PrintSummary(stdout, results)
	if *withSim {
		fmt.Fprintln(stdout)
		chaos.PrintSideBySide(stdout, results)
	}
	if *jsonOut != "" {
		if err := chaos.WriteJSON(*jsonOut, results); err != nil {
			return err
		}
	}
	if failed {
		return errUnexpected
	}
	return nil
}

// parseSeeds reads -seeds: positive seeds, comma-separated, none twice.
func parseSeeds(list string) ([]uint64, error) {
	var out []uint64
	for _, f := range strings.Split(list, ",") {
		v, err := strconv.ParseUint(strings.TrimSpace(f), 10, 64)
		if err != nil || v == 0 {
			return nil, fmt.Errorf("chaos: -seeds=%q: %q is not a seed (want positive integers, comma-separated)", list, f)
		}
		if slices.Contains(out, v) {
			return nil, fmt.Errorf("chaos: -seeds=%q: seed %d twice", list, v)
		}
		out = append(out, v)
	}
	return out, nil
}
