package deploy

import (
	"bufio"
	"context"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// units are the systemd units, each with the binary it runs, as installed
// (the unit's ExecStart path) and as built here, and its example
// environment file.
var units = []struct {
	file, installed, binary, env string
	sub                          []string // the subcommand ExecStart runs
}{
	{"allot-coordinator.service", "/usr/local/bin/allot-coordinator", "coordinator", "coordinator.env", []string{"serve"}},
	{"allot-agent.service", "/usr/local/bin/allot-agent", "agent", "agent.env", nil},
}

// unit is a parsed unit file: each section's keys, in order, with every
// value a key was given.
type unit map[string]map[string][]string

func parseUnit(t *testing.T, path string) unit {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	u := unit{}
	section := ""
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		l := strings.TrimSpace(sc.Text())
		switch {
		case l == "" || strings.HasPrefix(l, "#") || strings.HasPrefix(l, ";"):
		case strings.HasPrefix(l, "[") && strings.HasSuffix(l, "]"):
			section = l[1 : len(l)-1]
			u[section] = map[string][]string{}
		case section == "":
			t.Fatalf("%s:%d: outside a section", path, n)
		default:
			k, v, ok := strings.Cut(l, "=")
			if !ok {
				t.Fatalf("%s:%d: not key=value", path, n)
			}
			u[section][k] = append(u[section][k], v)
		}
	}
	return u
}

// envFile reads KEY=VALUE lines; with commented, "#KEY=VALUE" lines too
// (the examples' optional settings).
func envFile(t *testing.T, path string, commented bool) [][2]string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out [][2]string
	for _, l := range strings.Split(string(b), "\n") {
		l = strings.TrimSpace(l)
		if commented {
			l = strings.TrimPrefix(l, "#")
		}
		if m := regexp.MustCompile(`^([A-Z_][A-Z0-9_]*)=(.*)$`).FindStringSubmatch(l); m != nil {
			out = append(out, [2]string{m[1], m[2]})
		}
	}
	return out
}

// execStart expands a unit's ExecStart as systemd does: ${VAR} is one
// word, $VAR splits on white space; then words split on white space.
func execStart(line string, env map[string]string) []string {
	var out []string
	for _, w := range strings.Fields(line) {
		if m := regexp.MustCompile(`^\$([A-Z_][A-Z0-9_]*)$`).FindStringSubmatch(w); m != nil {
			out = append(out, strings.Fields(env[m[1]])...)
			continue
		}
		out = append(out, regexp.MustCompile(`\$\{([A-Z_][A-Z0-9_]*)\}`).ReplaceAllStringFunc(w, func(r string) string {
			return env[r[2:len(r)-1]]
		}))
	}
	return out
}

// TestSystemdUnits checks the units with systemd's own tools
// (systemd-analyze verify, and security with an exposure threshold), then
// runs each one's ExecStart as systemd would with its example environment
// file (addresses and paths made local): the coordinator serves the
// Kubernetes base's budgets, the agent leases from it, and both answer
// /healthz and /readyz. Every variable the examples set, or show
// commented out, must be one the binary reads.
func TestSystemdUnits(t *testing.T) {
	bin := binaries(t)
	analyze := need(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	for _, u := range units {
		// verify checks that ExecStart's program exists: point it at the
		// binary built here.
		b, err := os.ReadFile(filepath.Join("systemd", u.file))
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "ExecStart="+u.installed) {
			t.Errorf("%s: ExecStart does not run %s", u.file, u.installed)
		}
		local := filepath.Join(dir, u.file)
		if err := os.WriteFile(local, []byte(strings.ReplaceAll(string(b), u.installed, filepath.Join(bin, u.binary))), 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(analyze, "verify", local).CombinedOutput(); err != nil || len(out) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", u.file, err, out)
		}
		// Exposure on systemd's 0–100 scale; 20 is "OK" (2.0 shown).
		if out, err := exec.Command(analyze, "security", "--offline=yes", "--threshold=20", local).CombinedOutput(); err != nil {
			t.Errorf("systemd-analyze security %s: exposure above 2.0: %v\n%s", u.file, err, tail(string(out), 2000))
		}
		unit := parseUnit(t, local)
		svc := unit["Service"]
		for k, want := range map[string]string{"NoNewPrivileges": "yes", "ProtectSystem": "strict", "ProtectHome": "yes", "PrivateTmp": "yes", "CapabilityBoundingSet": ""} {
			if got := svc[k]; len(got) != 1 || got[0] != want {
				t.Errorf("%s: %s=%v, want %q", u.file, k, got, want)
			}
		}
		if svc["User"] == nil && svc["DynamicUser"] == nil {
			t.Errorf("%s: runs as root", u.file)
		}
		if got := svc["EnvironmentFile"]; len(got) != 1 || got[0] != "/etc/allot/"+u.env {
			t.Errorf("%s: EnvironmentFile=%v, want /etc/allot/%s", u.file, got, u.env)
		}
	}

	// Run them: the coordinator first, the agent leasing from it.
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	budgets := filepath.Join("kubernetes", "base", "budgets.yaml")
	rulesFile := filepath.Join("kubernetes", "base", "rules.yaml")
	coordGRPC := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	var statusURLs []string
	for _, u := range units {
		unit := parseUnit(t, filepath.Join(dir, u.file))
		svc := unit["Service"]
		flags, help := flagsOf(t, append([]string{filepath.Join(bin, u.binary)}, u.sub...)...)
		env := map[string]string{}
		for _, l := range svc["Environment"] {
			for _, a := range strings.Fields(l) {
				k, v, _ := strings.Cut(a, "=")
				env[k] = v
			}
		}
		httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		local := map[string]string{
			"ALLOT_BUDGETS": budgets, "ALLOT_RULES": rulesFile, "ALLOT_LISTEN": coordGRPC, "ALLOT_HTTP": httpAddr,
			"ALLOT_HTTP_LISTEN": httpAddr, "ALLOT_GRPC_LISTEN": fmt.Sprintf("127.0.0.1:%d", freePort(t)),
			"ALLOT_COORDINATORS": coordGRPC, "ALLOT_REDIS": "",
		}
		for _, kv := range envFile(t, filepath.Join("systemd", u.env), true) {
			k := kv[0]
			switch {
			case k == "SSL_CERT_FILE":
			case u.binary == "agent" && strings.HasPrefix(k, "ALLOT_"):
				if f := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "ALLOT_"), "_", "-")); !flags[f] {
					t.Errorf("%s: %s names no agent flag -%s", u.env, k, f)
				}
			case !strings.Contains(svc["ExecStart"][0], "${"+k+"}") && !strings.Contains(help, "$"+k):
				t.Errorf("%s: %s is neither in %s's ExecStart nor read by %s", u.env, k, u.file, u.binary)
			}
		}
		for _, kv := range envFile(t, filepath.Join("systemd", u.env), false) {
			v, ok := local[kv[0]]
			if !ok {
				v = kv[1]
			}
			env[kv[0]] = v
		}
		argv := execStart(svc["ExecStart"][0], env)
		for _, a := range argv[1:] {
			if f, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); strings.HasPrefix(a, "-") && !flags[f] {
				t.Errorf("%s: ExecStart flag -%s does not exist", u.file, f)
			}
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		for k, v := range env {
			cmd.Env = append(cmd.Env, k+"="+v)
		}
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			_ = cmd.Process.Signal(os.Interrupt)
			_ = cmd.Wait()
			if t.Failed() {
				t.Logf("%s: %v\n%s", u.file, argv, tail(out.String(), 3000))
			}
		})
		for _, path := range []string{"/healthz", "/readyz"} {
			url := "http://" + httpAddr + path
			var err error
			for {
				var res *http.Response
				if res, err = http.Get(url); err == nil {
					res.Body.Close()
					if res.StatusCode != 200 {
						err = fmt.Errorf("status %d", res.StatusCode)
					}
				}
				if err == nil || ctx.Err() != nil {
					break
				}
				time.Sleep(100 * time.Millisecond)
			}
			if err != nil {
				t.Errorf("%s: %s: %v", u.file, url, err)
			}
		}
		if u.binary == "agent" {
			statusURLs = append(statusURLs, "http://"+httpAddr+"/status")
		}
	}
	for _, url := range statusURLs {
		var st struct {
			LeaseLive bool `json:"lease_live"`
		}
		var err error
		for !st.LeaseLive && ctx.Err() == nil {
			err = getJSON(http.DefaultClient, url, &st)
			time.Sleep(100 * time.Millisecond)
		}
		if !st.LeaseLive {
			t.Errorf("%s: no live lease from the coordinator unit (%v)", url, err)
		}
	}
}
