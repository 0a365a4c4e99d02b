package chaos

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/allot-dev/allot/internal/testenv"
)

// TestShortScenarios is the harness's short form (CI): every scenario in
// scenarios/short on real processes — a healthy run, a region cut from the
// coordinators, the speaking agent killed, the HA leader killed and the
// standalone coordinator killed — each judged by the checker: every fault's
// excess within its stated bound, one speaker per region, and the verdict
// the file expects.
func TestShortScenarios(t *testing.T) {
	if testing.Short() {
		t.Skip("starts real processes for about three minutes")
	}
	for _, bin := range []string{"redis-server", "etcd"} {
		if _, err := exec.LookPath(bin); err != nil {
			if testenv.CI() {
				t.Fatalf("%s not installed (make test installs it): %v", bin, err)
			}
			t.Skipf("%s not installed: %v", bin, err)
		}
	}
	scs, err := LoadDir("scenarios/short")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	dir := t.TempDir()
	bins, err := Build(ctx, dir)
	if err != nil {
		t.Fatal(err)
	}
	var results []*Result
	for _, sc := range scs {
		t.Run(sc.Name(), func(t *testing.T) {
			runDir := filepath.Join(dir, sc.Name())
			res, err := Run(ctx, sc, Options{Dir: runDir, Bins: bins, Logf: t.Logf})
			if err != nil {
				t.Fatal(err)
			}
			results = append(results, res)
			PrintDetail(testWriter{t}, res)
			for _, f := range res.Faults {
				if f.Verdict == Fail {
					t.Errorf("%s: excess %.1f over bound %.1f (%s)", f.Fault, f.Excess, f.Bound, f.Term.Formula)
				}
				if f.Err != "" {
					t.Errorf("%s was not injected as asked: %s", f.Fault, f.Err)
				}
			}
			for _, c := range res.Checks {
				if c.Name == "one speaker" && !c.Pass {
					t.Errorf("%s: %s", c.Subject, c.Value)
				}
			}
			if res.Outcome != "as expected" {
				t.Errorf("verdict %s, the file expects %s: %v", res.Verdict, res.Expect, res.Failures)
			}
			if t.Failed() {
				t.Logf("logs kept in %s", keepLogs(t, runDir))
			}
		})
	}
	PrintSummary(testWriter{t}, results)
}

// testWriter writes to the test log.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(string(p))
	return len(p), nil
}

// keepLogs copies a failed run's directory out of the test's temporary
// directory, which is removed when the test ends.
func keepLogs(t *testing.T, dir string) string {
	dst, err := os.MkdirTemp("", "allot-chaos-failed-")
	if err != nil {
		return dir + " (removed at the end of the test)"
	}
	if out, err := exec.Command("cp", "-r", dir, dst).CombinedOutput(); err != nil {
		t.Logf("copy logs: %v %s", err, out)
	}
	return dst
}
