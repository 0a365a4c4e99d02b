package main

import (
	"bytes"
	"context"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestDemoStaysWithinTheBudget runs a short demo: a coordinator over gRPC,
// three regions of two agents on memberlist, traffic moving between them.
// The report stays within the budget and reads as its legend says: every
// cell names its allocation as floor, lent or grant, and the name matches
// the number against the floor the legend states; rows marked learning
// show every region on its floor; one region a row is busy; the term is a
// time of day.
func TestDemoStaysWithinTheBudget(t *testing.T) {
	if testing.Short() {
		t.Skip("runs for about 10 s of real time")
	}
	var buf bytes.Buffer
	out = &buf
	regions := []string{"eu", "us", "ap"}
	o := options{duration: 6 * time.Second, budget: 1000, regions: regions, agents: 2, heavy: 1.3, light: 0.1, gossip: true}
	if err := demo(context.Background(), o); err != nil {
		t.Fatal(err)
	}
	s := buf.String()
	for _, want := range []string{
		"within the budget",
		"floor  the region's floor (222/s)", "lent   a lease entry below the floor", "grant  a lease entry above the floor",
		"*      the busy region", "\"learning\" marks",
		"share of all admitted", "the most an exact global limiter\ncould have admitted in the run",
		"allocation of the tenant per region", "api/tenant-42, tokens per 1s:",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("report lacks %q:\n%s", want, s)
		}
	}
	if strings.Contains(s, "OVER the budget") {
		t.Errorf("the demo went over the budget:\n%s", s)
	}
	if !regexp.MustCompile(`leader since \d\d:\d\d:\d\d\.\d{3} \(its term, \d+, is that instant`).MatchString(s) {
		t.Errorf("the coordinator's term is not given as a time of day:\n%s", s)
	}

	m := regexp.MustCompile(`floor, what it may use with no lease, is (\d+)/s`).FindStringSubmatch(s)
	if m == nil {
		t.Fatalf("the report states no floor:\n%s", s)
	}
	floor, _ := strconv.Atoi(m[1])
	rowRe := regexp.MustCompile(`(?m)^ *\d+s (\|.*)\| +\d+ [#.!]+( learning)?$`)
	cellRe := regexp.MustCompile(`^\|([ *]) +(\d+) +(\d+) (floor|lent|grant) +$`)
	rows := rowRe.FindAllStringSubmatch(s, -1)
	if len(rows) < 5 {
		t.Fatalf("%d rows, want one a second:\n%s", len(rows), s)
	}
	kinds, learning := map[string]int{}, 0
	for _, row := range rows {
		if row[2] != "" {
			learning++
		}
		cells := strings.Split(row[1], "|")[1:]
		if len(cells) != len(regions) {
			t.Errorf("row %q has %d cells, want %d", row[0], len(cells), len(regions))
			continue
		}
		busy := 0
		for _, c := range cells {
			cm := cellRe.FindStringSubmatch("|" + c)
			if cm == nil {
				t.Errorf("cell %q of row %q is not `[*]admitted allocation floor|lent|grant`", c, row[0])
				continue
			}
			if cm[1] == "*" {
				busy++
			}
			n, _ := strconv.Atoi(cm[3])
			kind := cm[4]
			kinds[kind]++
			if kind == "floor" && n != floor || kind == "lent" && n >= floor || kind == "grant" && n <= floor {
				t.Errorf("row %q: an allocation of %d is marked %s against a floor of %d", row[0], n, kind, floor)
			}
			if row[2] != "" && kind != "floor" {
				t.Errorf("row %q is marked learning, but a region is not on its floor", row[0])
			}
		}
		if busy != 1 {
			t.Errorf("row %q marks %d busy regions, want 1", row[0], busy)
		}
	}
	if kinds["grant"] == 0 || kinds["lent"] == 0 {
		t.Errorf("no region was granted above its floor, or none lent (%v):\n%s", kinds, s)
	}
	t.Logf("cells %v, %d rows of %d while learning", kinds, learning, len(rows))
}

// TestAllocKind: an allocation without a lease entry is the floor; an entry
// is lent below it, a grant above it and the floor at it.
func TestAllocKind(t *testing.T) {
	for _, c := range []struct {
		entry        bool
		count, floor bucket.Tokens
		want         string
	}{
		{false, 222, 222, "floor"},
		{true, 117, 222, "lent"},
		{true, 766, 222, "grant"},
		{true, 222, 222, "floor"},
	} {
		if got := allocKind(c.entry, c.count, c.floor); got != c.want {
			t.Errorf("allocKind(%v, %d, %d) = %s, want %s", c.entry, c.count, c.floor, got, c.want)
		}
	}
}
