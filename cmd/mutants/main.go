// Command mutants shows that the simulator's scenario library catches
// known bugs. Each mutant is a small source patch under mutants/ (see its
// README) modelling one plausible bug in the lease protocol or the
// speaking agent. For each, mutants copies the tree to a temporary
// directory, applies the patch there with git apply, builds cmd/sim and
// runs the library — every scenario, by default in its tight form (every
// burst at most 0.1 s of rate), at full scale — on a fixed set of seeds.
// A mutant is caught when some run FAILs: allot's overshoot above the
// bound for the scenario's faults, or an expectation of the scenario
// missed. It prints the catch table (which scenarios caught each mutant,
// and the worst overshoot against its bound), also as JSON, and exits 1
// when a mutant is not caught, or when the unmutated tree itself FAILs
// (then nothing it says would mean anything).
//
//	mutants                         # every mutant (make mutants)
//	mutants -only 04                # those whose name matches
//	mutants -subset 3 -failfast     # three, chosen by the commit
//	mutants -json mutants.json
//
// A mutant the library is known not to catch yet is listed, with why, in
// mutants/survivors.txt: it shows as a known survivor and does not fail the
// run (-skip-survivors leaves it out), and once the library catches it the
// run fails until it is taken off the list, so the list cannot go stale.
//
// Patches are applied to a copy, never to the tree: production code has no
// switch for any of them. A refactor that stops a patch from applying
// fails TestPatchesApply.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"hash/fnv"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/allot-dev/allot/sim"
)

func main() {
	if err := run(context.Background(), os.Args[1:], os.Stdout, os.Stderr); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}

// errMissed is returned when some mutant was not caught.
var errMissed = errors.New("mutants: some mutants were not caught")

// options are the command's flags.
type options struct {
	root      string
	dir       string
	scenarios string
	seeds     string
	scale     float64
	forms     string
	only      string
	subset    int
	parallel  int
	failFast  bool
	skipSurv  bool
	jsonOut   string
	keep      bool
}

// Outcome is one mutant's result.
type Outcome struct {
	Mutant string `json:"mutant"`
	// What says what bug the patch models (its first comment line).
	What   string `json:"what"`
	Caught bool   `json:"caught"`
	// Survivor is the reason mutants/survivors.txt gives for a mutant the
	// library is known not to catch.
	Survivor string `json:"survivor,omitempty"`
	// CaughtBy lists the runs that FAILed, "scenario seed=N".
	CaughtBy []string `json:"caught_by"`
	// Worst is the FAILed run with the largest overshoot over its bound.
	Worst *Catch `json:"worst,omitempty"`
	// Missed is the first expectation of a scenario (sim.Result.Missed)
	// the mutant missed, for a mutant caught that way.
	Missed string `json:"missed,omitempty"`
	// Violation is the first protocol violation (sim.Result.Violations)
	// of a run the mutant made, for a mutant caught that way.
	Violation string `json:"violation,omitempty"`
	// Runs is how many runs of the library it took.
	Runs    int     `json:"runs"`
	Seconds float64 `json:"seconds"`
	Error   string  `json:"error,omitempty"`
}

// Catch is one FAILed rule of one run.
type Catch struct {
	Scenario  string  `json:"scenario"`
	Seed      uint64  `json:"seed"`
	Rule      string  `json:"rule"`
	Overshoot float64 `json:"overshoot_tokens"`
	Bound     float64 `json:"bound_tokens"`
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	var o options
	fs := flag.NewFlagSet("mutants", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&o.root, "root", ".", "the tree to copy (a git work tree)")
	fs.StringVar(&o.dir, "dir", "mutants", "the patches, relative to -root")
	fs.StringVar(&o.scenarios, "scenarios", "sim/scenarios", "the scenario library, relative to -root")
	fs.StringVar(&o.seeds, "seeds", "1", "comma-separated seeds every scenario runs on")
	fs.Float64Var(&o.scale, "scale", 1, "the library's load factor (cmd/sim -scale)")
	fs.StringVar(&o.forms, "forms", "tight", "the scenarios' forms: normal, tight or both")
	fs.StringVar(&o.only, "only", "", "run only the mutants whose name matches this regular expression")
	fs.IntVar(&o.subset, "subset", 0, "run only this many mutants, chosen by the tree's commit hash (0: all)")
	fs.IntVar(&o.parallel, "parallel", 2, "mutants run at once")
	fs.BoolVar(&o.failFast, "failfast", false, "stop each mutant's library at its first FAIL (faster; the table then names one catching run)")
	fs.BoolVar(&o.skipSurv, "skip-survivors", false, "leave out the mutants mutants/survivors.txt lists")
	fs.StringVar(&o.jsonOut, "json", "", "write the outcomes as JSON to this file")
	fs.BoolVar(&o.keep, "keep", false, "keep the temporary trees")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("mutants: unexpected arguments %q", fs.Args())
	}
	if o.parallel < 1 {
		return fmt.Errorf("mutants: -parallel=%d must be ≥ 1", o.parallel)
	}
	root, err := filepath.Abs(o.root)
	if err != nil {
		return fmt.Errorf("mutants: %w", err)
	}
	o.root = root
	patches, err := listPatches(filepath.Join(root, o.dir))
	if err != nil {
		return err
	}
	if o.only != "" {
		re, err := regexp.Compile(o.only)
		if err != nil {
			return fmt.Errorf("mutants: -only=%q: %w", o.only, err)
		}
		patches = slices.DeleteFunc(patches, func(p string) bool { return !re.MatchString(name(p)) })
	}
	survivors, err := readSurvivors(filepath.Join(root, o.dir, "survivors.txt"))
	if err != nil {
		return err
	}
	for s := range survivors {
		if !slices.ContainsFunc(patches, func(p string) bool { return name(p) == s }) && o.only == "" {
			return fmt.Errorf("mutants: survivors.txt lists %q, which is not a patch in %s", s, o.dir)
		}
	}
	if o.skipSurv {
		patches = slices.DeleteFunc(patches, func(p string) bool { return survivors[name(p)] != "" })
	}
	if o.subset > 0 && o.subset < len(patches) {
		commit, err := git(ctx, root, "rev-parse", "HEAD")
		if err != nil {
			return err
		}
		patches = pick(patches, o.subset, strings.TrimSpace(commit))
		fmt.Fprintf(stderr, "mutants: subset of %d chosen by commit %.12s\n", o.subset, strings.TrimSpace(commit))
	}
	if len(patches) == 0 {
		return fmt.Errorf("mutants: no patches to run in %s", filepath.Join(root, o.dir))
	}
	work, err := os.MkdirTemp("", "allot-mutants-")
	if err != nil {
		return fmt.Errorf("mutants: %w", err)
	}
	if o.keep {
		fmt.Fprintf(stderr, "mutants: trees kept in %s\n", work)
	} else {
		defer os.RemoveAll(work)
	}
	files, err := git(ctx, root, "ls-files", "-z", "--cached", "--others", "--exclude-standard")
	if err != nil {
		return err
	}
	list := strings.Split(strings.TrimRight(files, "\x00"), "\x00")

	// The unmutated tree first: a library that FAILs as it is proves
	// nothing about the mutants.
	begun := time.Now()
	base, err := runMutant(ctx, o, work, list, "")
	if err != nil {
		return err
	}
	if base.Caught || base.Error != "" {
		return fmt.Errorf("mutants: the unmutated tree does not pass its own library (%s%v): fix that first", base.Error, base.CaughtBy)
	}
	fmt.Fprintf(stderr, "mutants: the unmutated tree passes (%d runs, %.0fs)\n", base.Runs, time.Since(begun).Seconds())

	outs := make([]Outcome, len(patches))
	var wg sync.WaitGroup
	var logMu sync.Mutex // stderr may be any writer (a test's buffer): one line at a time
	sem := make(chan struct{}, o.parallel)
	for i, p := range patches {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sem <- struct{}{}
			defer func() { <-sem }()
			out, err := runMutant(ctx, o, work, list, p)
			if err != nil {
				out = Outcome{Mutant: name(p), Error: err.Error()}
			}
			out.Survivor = survivors[out.Mutant]
			outs[i] = out
			logMu.Lock()
			fmt.Fprintf(stderr, "mutants: %s: caught=%v (%.0fs)\n", out.Mutant, out.Caught, out.Seconds)
			logMu.Unlock()
		}()
	}
	wg.Wait()
	if err := writeTable(stdout, outs); err != nil {
		return err
	}
	if o.jsonOut != "" {
		b, err := json.MarshalIndent(outs, "", "  ")
		if err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
		if err := os.WriteFile(o.jsonOut, append(b, '\n'), 0o600); err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
	}
	for _, out := range outs {
		switch {
		case out.Caught && out.Survivor != "":
			return fmt.Errorf("%w: %s is caught now: take it off %s", errStale, out.Mutant, filepath.Join(o.dir, "survivors.txt"))
		case !out.Caught && (out.Survivor == "" || out.Error != ""):
			return errMissed
		}
	}
	return nil
}

// errStale is returned when a mutant listed as a survivor is caught.
var errStale = errors.New("mutants: survivors.txt is stale")

// readSurvivors reads the known survivors: one a line, the mutant's name,
// then why the library does not catch it; # starts a comment. A missing
// file lists none.
func readSurvivors(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return map[string]string{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("mutants: %w", err)
	}
	out := map[string]string{}
	for i, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		n, why, _ := strings.Cut(l, " ")
		if why = strings.TrimSpace(why); why == "" {
			return nil, fmt.Errorf("mutants: %s:%d: survivor %q gives no reason", path, i+1, n)
		}
		out[n] = why
	}
	return out, nil
}

// listPatches returns the *.patch files of dir, sorted.
func listPatches(dir string) ([]string, error) {
	ps, err := filepath.Glob(filepath.Join(dir, "*.patch"))
	if err != nil {
		return nil, fmt.Errorf("mutants: %w", err)
	}
	sort.Strings(ps)
	return ps, nil
}

// name is a patch's name without its directory and extension.
func name(patch string) string { return strings.TrimSuffix(filepath.Base(patch), ".patch") }

// pick chooses n of patches by commit, so every commit runs a different
// subset and every mutant runs often: the patches are ordered by a hash of
// the commit and their name, and the first n taken.
func pick(patches []string, n int, commit string) []string {
	h := func(p string) uint64 {
		f := fnv.New64a()
		_, _ = io.WriteString(f, commit+"/"+name(p)) // a hash's Write never fails
		return f.Sum64()
	}
	out := slices.Clone(patches)
	sort.Slice(out, func(i, j int) bool { return h(out[i]) < h(out[j]) })
	out = out[:n]
	sort.Strings(out)
	return out
}

// what returns the first comment line of a patch: what bug it models.
func what(patch string) string {
	b, err := os.ReadFile(patch)
	if err != nil {
		return ""
	}
	for _, l := range strings.Split(string(b), "\n") {
		if strings.HasPrefix(l, "# ") {
			return strings.TrimPrefix(l, "# ")
		}
		if strings.HasPrefix(l, "diff ") {
			break
		}
	}
	return ""
}

// runMutant copies the tree to a directory of its own under work, applies
// patch there (none for the unmutated tree), builds cmd/sim and runs the
// library.
func runMutant(ctx context.Context, o options, work string, files []string, patch string) (Outcome, error) {
	began := time.Now()
	out := Outcome{Mutant: "unmutated"}
	if patch != "" {
		out.Mutant, out.What = name(patch), what(patch)
	}
	dir := filepath.Join(work, out.Mutant)
	if err := copyTree(o.root, dir, files); err != nil {
		return out, err
	}
	if patch != "" {
		if _, err := git(ctx, dir, "apply", patch); err != nil {
			return out, err
		}
	}
	bin := filepath.Join(dir, "sim.bin")
	if err := command(ctx, dir, nil, "go", "build", "-o", bin, "./cmd/sim"); err != nil {
		return out, err
	}
	jsonPath := filepath.Join(dir, "results.json")
	args := []string{"-q", "-systems", "allot", "-forms", o.forms, "-seeds", o.seeds,
		"-scale", strconv.FormatFloat(o.scale, 'g', -1, 64), "-json", jsonPath}
	if o.failFast {
		args = append(args, "-failfast")
	}
	var stderr bytes.Buffer
	err := command(ctx, dir, &stderr, bin, append(args, o.scenarios)...)
	var exit *exec.ExitError
	if err != nil && !errors.As(err, &exit) {
		return out, err
	}
	b, rerr := os.ReadFile(jsonPath)
	if rerr != nil {
		return out, fmt.Errorf("mutants: %s: the library wrote no results (%v): %s", out.Mutant, err, stderr.String())
	}
	var results []*sim.Result
	if err := json.Unmarshal(b, &results); err != nil {
		return out, fmt.Errorf("mutants: %s: read results: %w", out.Mutant, err)
	}
	out.Runs = len(results)
	for _, r := range results {
		if r.Verdict != sim.Fail {
			continue
		}
		out.Caught = true
		out.CaughtBy = append(out.CaughtBy, fmt.Sprintf("%s seed=%d", r.Scenario, r.Seed))
		if len(r.Missed) > 0 && out.Missed == "" {
			out.Missed = fmt.Sprintf("%s seed=%d: %s", r.Scenario, r.Seed, r.Missed[0])
		}
		if len(r.Violations) > 0 && out.Violation == "" {
			out.Violation = fmt.Sprintf("%s seed=%d: %s", r.Scenario, r.Seed, r.Violations[0])
		}
		for _, s := range r.Systems {
			for _, ro := range s.Rules {
				if ro.Verdict != sim.Fail || ro.Bound == nil {
					continue
				}
				c := &Catch{Scenario: r.Scenario, Seed: r.Seed, Rule: ro.Rule, Overshoot: ro.PeakTokens, Bound: *ro.Bound}
				if out.Worst == nil || excess(c) > excess(out.Worst) {
					out.Worst = c
				}
			}
		}
	}
	if err != nil && !out.Caught {
		return out, fmt.Errorf("mutants: %s: the library failed without a FAIL: %v: %s", out.Mutant, err, stderr.String())
	}
	out.Seconds = round1(time.Since(began).Seconds())
	return out, nil
}

func excess(c *Catch) float64 { return c.Overshoot - c.Bound }

func round1(x float64) float64 { return float64(int64(x*10+0.5)) / 10 }

// copyTree copies files (paths relative to from) to to.
func copyTree(from, to string, files []string) error {
	for _, f := range files {
		if f == "" {
			continue
		}
		src, dst := filepath.Join(from, f), filepath.Join(to, f)
		st, err := os.Lstat(src)
		if errors.Is(err, os.ErrNotExist) {
			continue // deleted in the work tree, not yet in the index
		}
		if err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
		if !st.Mode().IsRegular() {
			continue
		}
		b, err := os.ReadFile(src)
		if err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
		if err := os.MkdirAll(filepath.Dir(dst), 0o750); err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
		// #nosec G703 -- dst is the project's own tree, walked from -root, under the run's temporary directory
		if err := os.WriteFile(dst, b, st.Mode().Perm()); err != nil {
			return fmt.Errorf("mutants: %w", err)
		}
	}
	return nil
}

// git runs git in dir and returns its output.
func git(ctx context.Context, dir string, args ...string) (string, error) {
	var out bytes.Buffer
	if err := command(ctx, dir, &out, "git", args...); err != nil {
		return "", err
	}
	return out.String(), nil
}

// command runs name in dir; stdout goes to out when set. Its error
// carries what the command said on stderr.
func command(ctx context.Context, dir string, out io.Writer, name string, args ...string) error {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = out, &stderr
	if out == nil {
		cmd.Stdout = &stderr
	}
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("mutants: %s %s in %s: %w: %s", name, strings.Join(args, " "), dir, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// writeTable prints the catch table.
func writeTable(w io.Writer, outs []Outcome) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "mutant\tcaught\tworst run\tovershoot / bound\tcaught by")
	for _, o := range outs {
		caught, worst, ratio := "NO", "-", "-"
		switch {
		case o.Error != "":
			caught = "ERROR: " + o.Error
		case o.Caught:
			caught = "yes"
		case o.Survivor != "":
			caught = "NO (known survivor)"
		}
		if c := o.Worst; c != nil {
			worst = fmt.Sprintf("%s seed=%d %s", c.Scenario, c.Seed, c.Rule)
			ratio = fmt.Sprintf("%.1f / %.1f", c.Overshoot, c.Bound)
		} else if o.Missed != "" {
			worst, ratio = o.Missed, "(expectation missed)"
		} else if o.Violation != "" {
			worst, ratio = o.Violation, "(protocol violation)"
		}
		by := strings.Join(o.CaughtBy, ", ")
		if len(o.CaughtBy) > 6 {
			by = strings.Join(o.CaughtBy[:6], ", ") + fmt.Sprintf(" (+%d)", len(o.CaughtBy)-6)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", o.Mutant, caught, worst, ratio, by)
	}
	return tw.Flush()
}
