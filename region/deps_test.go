package region

import (
	"os/exec"
	"strings"
	"testing"
)

// TestDependencies: the deterministic core and the simulator that runs it
// import the standard library and allot's own packages, and no
// third-party module but the YAML parser the rules are read with: no Redis
// client, memberlist, gRPC, Prometheus or etcd, which the drivers (package
// agent) bring.
func TestDependencies(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	out, err := exec.Command("go", "list", "-deps", "github.com/allot-dev/allot/region", "github.com/allot-dev/allot/sim").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	for _, p := range strings.Fields(string(out)) {
		first := p
		if i := strings.IndexByte(p, '/'); i >= 0 {
			first = p[:i]
		}
		if !strings.Contains(first, ".") || strings.HasPrefix(p, "github.com/allot-dev/allot/") || strings.HasPrefix(p, "go.yaml.in/yaml/") {
			continue // the standard library (its first element has no dot), allot, the rules' YAML parser
		}
		t.Errorf("region or sim depends on %s", p)
	}
}
