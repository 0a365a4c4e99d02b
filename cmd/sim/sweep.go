package main

import (
	"flag"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/sim"
)

// sweep runs "sim sweep": one scenario over a grid of settings.
func sweep(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("sim sweep", flag.ContinueOnError)
	fs.SetOutput(stderr)
	ttl := fs.String("lease-ttl", "", "lease TTLs to try, comma-separated (e.g. 5s,10s,20s)")
	refresh := fs.String("refresh", "", "lease refresh intervals to try")
	reserve := fs.String("reserve", "", "reserves to try, as a share of each budget (e.g. 0.2,0.33)")
	batch := fs.String("batch-window", "", "agents' batch windows to try (e.g. 10ms,50ms)")
	policy := fs.String("policy", "", "failure policies to try on every rule: closed, open, emergency")
	drift := fs.String("drift", "", "drift margins ρ to try (e.g. 0.001,0.01)")
	seeds := fs.String("seeds", "", "comma-separated seeds (default: every seed the scenario lists)")
	scale := fs.Float64("scale", 1, "multiply every traffic rate and budget by this factor")
	maxKeys := fs.Int("max-keys", 0, "cap the keys of every rule (0: as the scenario says)")
	jsonOut := fs.String("json", "", "write the sweep as JSON to this file")
	htmlOut := fs.String("html", "", "write the sweep report (chart, table, the best point's detail) to this file")
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: sim sweep [flags] scenario.yaml\n\nEvery combination of the values given is run on every seed; an axis not given keeps the scenario's value.\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		fs.Usage()
		return fmt.Errorf("sim: sweep: want one scenario file, got %d arguments", fs.NArg())
	}
	path := fs.Arg(0)
	sc, err := sim.LoadScenario(path)
	if err != nil {
		return err
	}
	if *scale != 1 {
		if sc, err = sc.Scaled(*scale); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	if *maxKeys > 0 {
		if sc, err = sc.WithMaxKeys(*maxKeys); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
	}
	var g sim.Grid
	if g.LeaseTTL, err = durations("-lease-ttl", *ttl); err != nil {
		return err
	}
	if g.Refresh, err = durations("-refresh", *refresh); err != nil {
		return err
	}
	if g.BatchWindow, err = durations("-batch-window", *batch); err != nil {
		return err
	}
	if g.Reserve, err = floats("-reserve", *reserve); err != nil {
		return err
	}
	if g.Drift, err = floats("-drift", *drift); err != nil {
		return err
	}
	if *policy != "" {
		g.Policy = strings.Split(*policy, ",")
	}
	runSeeds := sc.Seeds
	if *seeds != "" {
		runSeeds = nil
		for _, s := range strings.Split(*seeds, ",") {
			v, err := strconv.ParseUint(strings.TrimSpace(s), 10, 64)
			if err != nil {
				return fmt.Errorf("sim: sweep: -seeds: %q is not a seed: %w", s, err)
			}
			runSeeds = append(runSeeds, v)
		}
	}
	tty := isTTY(stderr)
	start := time.Now()
	res, err := sim.Sweep(sc, g, runSeeds, sim.SweepOptions{Progress: func(i, n int, s sim.Settings) {
		if tty {
			fmt.Fprintf(stderr, "\r%-100s\r[%d/%d] %s", "", i+1, n, s)
		}
	}})
	if tty {
		fmt.Fprintf(stderr, "\r%-100s\r", "")
	}
	if err != nil {
		return err
	}
	if err := sim.WriteSweepTable(stdout, res); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "%d points × %d seeds in %.1fs wall\n", len(res.Points), len(runSeeds), time.Since(start).Seconds())
	if *jsonOut != "" {
		if err := writeFile(*jsonOut, func(w io.Writer) error { return sim.WriteSweepJSON(w, res) }); err != nil {
			return err
		}
	}
	if *htmlOut != "" {
		if err := writeFile(*htmlOut, func(w io.Writer) error { return sim.WriteSweepHTML(w, res) }); err != nil {
			return err
		}
	}
	return nil
}

func durations(flagName, v string) ([]time.Duration, error) {
	if v == "" {
		return nil, nil
	}
	var out []time.Duration
	for _, s := range strings.Split(v, ",") {
		d, err := time.ParseDuration(strings.TrimSpace(s))
		if err != nil || d <= 0 {
			return nil, fmt.Errorf("sim: sweep: %s=%q: %q is not a positive duration such as 10s", flagName, v, s)
		}
		out = append(out, d)
	}
	return out, nil
}

func floats(flagName, v string) ([]float64, error) {
	if v == "" {
		return nil, nil
	}
	var out []float64
	for _, s := range strings.Split(v, ",") {
		f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return nil, fmt.Errorf("sim: sweep: %s=%q: %q is not a number", flagName, v, s)
		}
		out = append(out, f)
	}
	return out, nil
}
