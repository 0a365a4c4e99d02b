package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRunRefusesBadInvocations(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(bad, []byte("name: x\nregions: [{name: a}]\nrules: [{name: r, count: 1, period: 1s}]\nchaos: {expect: fail}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{nil, "no scenario given"},
		{[]string{"-run", "(", "../../chaos/scenarios"}, "-run"},
		{[]string{"-run", "nothing-matches-this", "../../chaos/scenarios"}, "no scenario selected"},
		{[]string{bad}, "chaos.reason is empty"},
		{[]string{filepath.Join(dir, "missing.yaml")}, "no such file"},
		{[]string{"-judge", dir}, "scenario.yaml"},
		{[]string{"-seed", "x", "../../chaos/scenarios"}, "-seed"},
		{[]string{"-seeds", "1,x", "../../chaos/scenarios"}, `-seeds="1,x": "x" is not a seed`},
		{[]string{"-seeds", "1,0", "../../chaos/scenarios"}, `"0" is not a seed`},
		{[]string{"-seeds", "2,2", "../../chaos/scenarios"}, "seed 2 twice"},
		{[]string{"-seed", "1", "-seeds", "2,3", "../../chaos/scenarios"}, "give one of them"},
	} {
		var out, errb bytes.Buffer
		err := run(context.Background(), c.args, &out, &errb)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("chaos %q: %v, want an error naming %q", c.args, err, c.want)
		}
	}
}
