package main

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestPatchesApply checks that every mutant still applies cleanly to the
// current tree, so that a refactor of the code a mutant patches fails here
// rather than silently shrinking the set `make mutants` runs.
func TestPatchesApply(t *testing.T) {
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	patches, err := listPatches(filepath.Join(root, "mutants"))
	if err != nil {
		t.Fatal(err)
	}
	if len(patches) < 9 {
		t.Fatalf("mutants/ holds %d patches, want at least 9", len(patches))
	}
	for _, p := range patches {
		if what(p) == "" {
			t.Errorf("%s: no first comment line saying what bug it models", name(p))
		}
		cmd := exec.Command("git", "apply", "--check", p)
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s does not apply to the tree: %v: %s", name(p), err, out)
		}
	}
}

// TestPickRotates checks that the subset CI runs depends on the commit
// and that, over commits, every mutant is picked.
func TestPickRotates(t *testing.T) {
	patches := []string{"a.patch", "b.patch", "c.patch", "d.patch", "e.patch"}
	seen := map[string]bool{}
	var subsets []string
	for _, commit := range []string{"0a1b", "1c2d", "2e3f", "3a4b", "4c5d", "5e6f", "6a7b", "7c8d"} {
		got := pick(patches, 2, commit)
		if len(got) != 2 || !slices.IsSorted(got) {
			t.Fatalf("pick(%s) = %v, want 2 patches, sorted", commit, got)
		}
		if !slices.Equal(got, pick(patches, 2, commit)) {
			t.Fatalf("pick(%s) is not deterministic", commit)
		}
		for _, p := range got {
			seen[p] = true
		}
		subsets = append(subsets, strings.Join(got, ","))
	}
	if len(seen) != len(patches) {
		t.Errorf("over 8 commits only %v were picked", seen)
	}
	slices.Sort(subsets)
	if len(slices.Compact(subsets)) < 2 {
		t.Errorf("every commit picked the same subset %v", subsets[0])
	}
}

// TestMutantsAreCaught runs the mutants against the scenario library, as
// `make mutants -failfast` does, and fails when one is not caught (or a
// known survivor is). It takes minutes, so it runs in CI (CI=true) or when
// ALLOT_MUTANTS=1, and is skipped otherwise. ALLOT_MUTANTS_SUBSET=n runs
// n of them, chosen by the commit, for a CI that cannot afford the set.
func TestMutantsAreCaught(t *testing.T) {
	if os.Getenv("CI") != "true" && os.Getenv("ALLOT_MUTANTS") != "1" {
		t.Skip("the mutant set takes minutes: set ALLOT_MUTANTS=1 (CI=true runs it)")
	}
	args := []string{"-root", "../..", "-failfast"}
	if n := os.Getenv("ALLOT_MUTANTS_SUBSET"); n != "" {
		if _, err := strconv.Atoi(n); err != nil {
			t.Fatalf("ALLOT_MUTANTS_SUBSET=%q: %v", n, err)
		}
		args = append(args, "-subset", n)
	}
	var out, log bytes.Buffer
	began := time.Now()
	err := run(context.Background(), args, &out, &log)
	t.Logf("%s\n%s(%.0f s)", log.String(), out.String(), time.Since(began).Seconds())
	if err != nil {
		t.Fatal(err)
	}
}
