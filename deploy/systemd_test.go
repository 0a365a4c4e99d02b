package deploy

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
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
// (systemd-analyze verify, and security with an exposure threshold), and
// that every variable the example environment files set, or show
// commented out, is one the binary reads and every file they name is one
// an operator makes. Then it runs each one's ExecStart as systemd would,
// with its example environment file (addresses and /etc/allot made
// local), in both ways a region can prove itself: as the examples are
// (the region's token over TLS), and with their commented mutual-TLS
// lines in place of the tokens. Each time the coordinator serves the
// Kubernetes base's budgets, the agent leases from it in that mode, both
// answer /healthz and /readyz, and the agent's allow API refuses a caller
// without a listed token and serves one with it.
func TestSystemdUnits(t *testing.T) {
	bin := binaries(t)
	analyze := need(t, "systemd-analyze", "systemd")
	dir := t.TempDir()
	etc, allowToken := systemdEtc(t)
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

		// Every variable is read, every file named is made.
		flags, help := flagsOf(t, append([]string{filepath.Join(bin, u.binary)}, u.sub...)...)
		for _, kv := range envFile(t, filepath.Join("systemd", u.env), true) {
			k := kv[0]
			switch {
			case u.binary == "agent" && strings.HasPrefix(k, "ALLOT_"):
				if f := strings.ToLower(strings.ReplaceAll(strings.TrimPrefix(k, "ALLOT_"), "_", "-")); !flags[f] {
					t.Errorf("%s: %s names no agent flag -%s", u.env, k, f)
				}
			case !strings.Contains(svc["ExecStart"][0], "${"+k+"}") && !strings.Contains(help, "$"+k):
				t.Errorf("%s: %s is neither in %s's ExecStart nor read by %s", u.env, k, u.file, u.binary)
			}
			for _, path := range regexp.MustCompile(`/etc/allot/[^\s,]+`).FindAllString(kv[1], -1) {
				if _, err := os.Stat(filepath.Join(etc, strings.TrimPrefix(path, "/etc/allot/"))); err != nil {
					t.Errorf("%s: %s=%s: not a file this test makes as an operator would", u.env, k, path)
				}
			}
		}
	}
	if t.Failed() {
		return
	}
	for _, mode := range []authMode{
		{name: "token"},
		{name: "mtls", enable: []string{"ALLOT_TLS_CLIENT_CA", "ALLOT_TLS_CERT", "ALLOT_TLS_KEY"},
			disable: []string{"ALLOT_REGION_TOKENS", "ALLOT_COORDINATOR_TOKEN_FILE"}},
	} {
		t.Run(mode.name, func(t *testing.T) { runUnits(t, bin, dir, etc, allowToken, mode) })
	}
}

// authMode is a way the units prove a region: the variables the examples
// show commented out that it sets, and those they set that it empties.
type authMode struct {
	name            string
	enable, disable []string
}

// systemdEtc makes, in a directory standing for /etc/allot, every file the
// example environment files name, as an operator would: certificates from
// certs.sh (the coordinator's for 127.0.0.1, the region eu's), a fresh
// token for the region and one for a caller of the allow API, and the
// Kubernetes base's budgets and rules. It returns the directory and the
// caller's token.
func systemdEtc(t *testing.T) (etc, allowToken string) {
	t.Helper()
	secrets := certSecrets(t, "eu", "allot")
	etc = t.TempDir()
	if err := os.Mkdir(filepath.Join(etc, "tls"), 0o700); err != nil {
		t.Fatal(err)
	}
	regionToken, allowToken := randomToken(t), randomToken(t)
	for dst, src := range map[string]string{
		"tls/ca.crt":          filepath.Join(secrets["allot-coordinator-tls"], "ca.crt"),
		"tls/coordinator.crt": filepath.Join(secrets["allot-coordinator-tls"], "tls.crt"),
		"tls/coordinator.key": filepath.Join(secrets["allot-coordinator-tls"], "tls.key"),
		"tls/eu.crt":          filepath.Join(secrets["allot-agent-tls"], "tls.crt"),
		"tls/eu.key":          filepath.Join(secrets["allot-agent-tls"], "tls.key"),
		"budgets.yaml":        "kubernetes/base/budgets.yaml",
		"rules.yaml":          "kubernetes/base/rules.yaml",
	} {
		b, err := os.ReadFile(src)
		if err != nil {
			t.Fatal(err)
		}
		writeFile(t, filepath.Join(etc, dst), string(b))
	}
	writeFile(t, filepath.Join(etc, "region.token"), regionToken+"\n")
	writeFile(t, filepath.Join(etc, "region-tokens"), "eu "+regionToken+"\n")
	writeFile(t, filepath.Join(etc, "allow-callers"), "gateway "+allowToken+"\n")
	return etc, allowToken
}

func randomToken(t *testing.T) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(b)
}

// runUnits runs the coordinator's unit, then the agent's, with the example
// environment files changed for mode, and checks that the agent leases in
// that mode and guards its allow API.
func runUnits(t *testing.T, bin, dir, etc, allowToken string, mode authMode) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	coordGRPC := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	ca := filepath.Join(etc, "tls", "ca.crt")
	enabled := map[string]bool{}
	var coordHTTP, agentBase string
	for _, u := range units {
		svc := parseUnit(t, filepath.Join(dir, u.file))["Service"]
		env := map[string]string{}
		for _, l := range svc["Environment"] {
			for _, a := range strings.Fields(l) {
				k, v, _ := strings.Cut(a, "=")
				env[k] = v
			}
		}
		for _, kv := range envFile(t, filepath.Join("systemd", u.env), false) {
			env[kv[0]] = kv[1]
		}
		for _, kv := range envFile(t, filepath.Join("systemd", u.env), true) {
			if slices.Contains(mode.enable, kv[0]) {
				env[kv[0]], enabled[kv[0]] = kv[1], true
			}
		}
		for _, k := range mode.disable {
			if _, ok := env[k]; ok {
				env[k], enabled[k] = "", true
			}
		}
		httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
		for k, v := range map[string]string{
			"ALLOT_LISTEN": coordGRPC, "ALLOT_HTTP": httpAddr, "ALLOT_HTTP_LISTEN": httpAddr,
			"ALLOT_GRPC_LISTEN": fmt.Sprintf("127.0.0.1:%d", freePort(t)), "ALLOT_COORDINATORS": coordGRPC, "ALLOT_REDIS": "",
		} {
			if _, ok := env[k]; ok {
				env[k] = v
			}
		}
		for k, v := range env {
			env[k] = strings.ReplaceAll(v, "/etc/allot/", etc+"/")
		}
		argv := execStart(svc["ExecStart"][0], env)
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
		base := "http://" + httpAddr
		if u.binary == "agent" && env["ALLOT_TLS_CERT"] != "" {
			base = "https://" + httpAddr // the agent serves TLS with the region's certificate
		}
		for _, path := range []string{"/healthz", "/readyz"} {
			var err error
			for {
				var res *http.Response
				if res, err = unitClient(t, ca).Get(base + path); err == nil {
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
				t.Fatalf("%s: %s%s: %v", u.file, base, path, err)
			}
		}
		if u.binary == "agent" {
			agentBase = base
		} else {
			coordHTTP = base
		}
	}
	for _, k := range append(slices.Clone(mode.enable), mode.disable...) {
		if !enabled[k] {
			t.Errorf("mode %s: no example environment file shows %s", mode.name, k)
		}
	}

	// The agent leases, proving its region the mode's way.
	client := unitClient(t, ca)
	var st struct {
		LeaseLive       bool   `json:"lease_live"`
		CoordinatorAuth string `json:"coordinator_auth"`
		AllowAuth       string `json:"allow_auth"`
	}
	var err error
	for !st.LeaseLive && ctx.Err() == nil {
		err = getJSON(client, agentBase+"/status", &st)
		time.Sleep(100 * time.Millisecond)
	}
	if !st.LeaseLive || st.CoordinatorAuth != mode.name || st.AllowAuth != "token" {
		t.Errorf("agent unit: lease live %v, coordinator_auth %q, allow_auth %q (%v); want a lease, %s, token",
			st.LeaseLive, st.CoordinatorAuth, st.AllowAuth, err, mode.name)
	}
	res, err := client.Get(coordHTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(res.Body)
	res.Body.Close()
	if want := `allot_coordinator_auth_info{mode="` + mode.name + `"} 1`; !strings.Contains(string(b), want) {
		t.Errorf("coordinator unit: /metrics lacks %s", want)
	}

	// The allow API serves only the listed caller.
	for _, tc := range []struct {
		token string
		want  int
	}{{"", http.StatusUnauthorized}, {allowToken, http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodPost, agentBase+"/v1/allow", strings.NewReader(`{"subject":"acme","plan":"free","descriptor":[{"key":"path","value":"/items"}]}`))
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		res, err := client.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != tc.want {
			t.Errorf("agent unit: /v1/allow with token %q: %d, want %d", tc.token, res.StatusCode, tc.want)
		}
	}
}

// unitClient is an HTTP client that trusts the CA in caFile and presents
// no certificate, like a health check or a gateway on the host.
func unitClient(t *testing.T, caFile string) *http.Client {
	return &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsFor(t, caFile, "")}}
}
