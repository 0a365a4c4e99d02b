package deploy

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/protobuf/encoding/protowire"
	"sigs.k8s.io/yaml"
)

type alertRule struct {
	Alert string `json:"alert"`
	Expr  string `json:"expr"`
	For   string `json:"for"`
}

func loadAlerts(t *testing.T) []alertRule {
	t.Helper()
	b, err := os.ReadFile("prometheus/alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Groups []struct {
			Name  string      `json:"name"`
			Rules []alertRule `json:"rules"`
		} `json:"groups"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	if len(f.Groups) == 0 {
		t.Fatal("prometheus/alerts.yml has no groups")
	}
	var out []alertRule
	for _, g := range f.Groups {
		out = append(out, g.Rules...)
	}
	return out
}

type panelQuery struct{ panel, expr string }

// dashboardQueries returns every panel query of the dashboard, after
// checking its shape: unique ids, a Prometheus datasource, a query per
// target.
func dashboardQueries(t *testing.T) []panelQuery {
	t.Helper()
	b, err := os.ReadFile("grafana/allot.json")
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct{ Name, Type, Query string } `json:"list"`
		} `json:"templating"`
		Panels []struct {
			ID         int    `json:"id"`
			Type       string `json:"type"`
			Title      string `json:"title"`
			Datasource *struct {
				Type, UID string
			} `json:"datasource"`
			Targets []struct {
				RefID string `json:"refId"`
				Expr  string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || d.Title == "" {
		t.Error("dashboard without uid or title")
	}
	if !slices.ContainsFunc(d.Templating.List, func(v struct{ Name, Type, Query string }) bool {
		return v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus"
	}) {
		t.Error("dashboard has no Prometheus datasource variable")
	}
	ids := map[int]bool{}
	var out []panelQuery
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type == "row" {
			continue
		}
		if p.Datasource == nil || p.Datasource.Type != "prometheus" || p.Datasource.UID != "${datasource}" {
			t.Errorf("panel %q: datasource %v, want the ${datasource} variable", p.Title, p.Datasource)
		}
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, panelQuery{p.Title, tg.Expr})
		}
	}
	return out
}

// TestGrafanaDashboard checks the dashboard's shape, and that every metric
// it queries is one a binary exports.
func TestGrafanaDashboard(t *testing.T) {
	exported := exportedMetrics(t)
	for _, q := range dashboardQueries(t) {
		for _, name := range metricNames(q.expr) {
			if !exported[name] {
				t.Errorf("panel %q: metric %s is exported by no allot binary", q.panel, name)
			}
		}
	}
	for _, a := range loadAlerts(t) {
		for _, name := range metricNames(a.Expr) {
			if !exported[name] {
				t.Errorf("alert %s: metric %s is exported by no allot binary", a.Alert, name)
			}
		}
	}
}

var metricNameRE = regexp.MustCompile(`\ballot_[a-z0-9_]+\b`)

// metricNames lists the allot metrics an expression reads (a histogram's
// _bucket series as the histogram).
func metricNames(expr string) []string {
	var out []string
	for _, n := range metricNameRE.FindAllString(expr, -1) {
		if !slices.Contains(out, n) {
			out = append(out, n)
		}
	}
	return out
}

// exportedMetrics reads the metric names the sources declare: Name fields
// and NewDesc calls in the files that export metrics.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(allot_[a-z0-9_]+)"`)
	for _, f := range []string{"coordinator/metrics.go", "agent/metrics.go", "limiter/metrics.go", "auth/callers.go",
		"httpserver/httpserver.go", "rls/rls.go", "cmd/agent/boundary.go"} {
		b, err := os.ReadFile(filepath.Join(repoRoot, f))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range re.FindAllStringSubmatch(string(b), -1) {
			out[m[1]] = true
			if strings.HasSuffix(m[1], "_seconds") {
				out[m[1]+"_bucket"] = true
			}
		}
	}
	if len(out) < 30 {
		t.Fatalf("found only %d metrics in the sources", len(out))
	}
	return out
}

// TestPromtool runs Prometheus's own checks of the rules and their unit
// tests.
func TestPromtool(t *testing.T) {
	promtool := need(t, "promtool", "prometheus")
	for _, args := range [][]string{{"check", "rules", "prometheus/alerts.yml"}, {"test", "rules", "prometheus/alerts_test.yml"}} {
		if out, err := exec.Command(promtool, args...).CombinedOutput(); err != nil {
			t.Errorf("promtool %s: %v\n%s", strings.Join(args, " "), err, out)
		}
	}
}

// promAPI queries a Prometheus HTTP API.
type promAPI struct{ base string }

type promResult struct {
	Metric map[string]string `json:"metric"`
	Value  []any             `json:"value"`
}

func (p promAPI) get(path string, v any) error {
	res, err := http.Get(p.base + path)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	var body struct {
		Status string          `json:"status"`
		Error  string          `json:"error"`
		Data   json.RawMessage `json:"data"`
	}
	if err := json.NewDecoder(res.Body).Decode(&body); err != nil {
		return err
	}
	if body.Status != "success" {
		return fmt.Errorf("%s: %s", path, body.Error)
	}
	return json.Unmarshal(body.Data, v)
}

// query evaluates an instant query.
func (p promAPI) query(q string) ([]promResult, error) {
	var d struct {
		ResultType string          `json:"resultType"`
		Result     json.RawMessage `json:"result"`
	}
	if err := p.get("/api/v1/query?query="+url.QueryEscape(q), &d); err != nil {
		return nil, err
	}
	if d.ResultType != "vector" {
		return nil, fmt.Errorf("%s: result type %s", q, d.ResultType)
	}
	var r []promResult
	return r, json.Unmarshal(d.Result, &r)
}

// activeAlert is an alert Prometheus holds: its labels and its state
// (pending or firing).
type activeAlert struct {
	Labels map[string]string `json:"labels"`
	State  string            `json:"state"`
}

// alerts returns the active alerts.
func (p promAPI) alerts() ([]activeAlert, error) {
	var d struct {
		Alerts []activeAlert `json:"alerts"`
	}
	return d.Alerts, p.get("/api/v1/alerts", &d)
}

// grafanaExpr makes a panel query a Prometheus query: Grafana's
// $__rate_interval becomes a window of a few scrapes.
func grafanaExpr(e string) string { return strings.ReplaceAll(e, "$__rate_interval", "10s") }

// TestPrometheusLive runs a coordinator, three agents in two regions (eu
// on a Redis the test kills), a gateway and traffic, authenticated as the
// Kubernetes manifests are (regions by mutual TLS with certs.sh's
// certificates, the allow API by token), with a real Prometheus scraping
// them every second and evaluating alerts.yml. An impostor (an agent with
// us's certificate speaking for eu), a caller without a token, an RLS
// request for a misspelt domain, a gateway at its connection cap and its
// in-process store's bound each show on their panel; every dashboard query
// must return data, and every metric selector of every alert must find
// data. Then faults fire their alerts through Prometheus: an invalid rules
// file under us's agent (AllotRulesReloadFailed, naming that agent);
// killing eu's Redis opens the breaker and sends decisions around the exact
// bucket (AllotBreakerOpen, AllotBudgetOvershootRisk); killing the
// coordinator leaves no leader and lets the leases lapse
// (AllotNoCoordinatorLeader firing after its 30 s, AllotLeaseLapsed,
// AllotRegionOnFloors). It takes under two minutes.
func TestPrometheusLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Prometheus and eight processes for a minute")
	}
	prom := need(t, "prometheus", "prometheus")
	promtool := need(t, "promtool", "prometheus")
	bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	dir := t.TempDir()

	// Budgets: the Kubernetes example's rules, two regions, short leases so
	// a lapse shows within seconds. us's agent watches a copy of the rules
	// that the test breaks later.
	rulesFile, err := filepath.Abs("kubernetes/base/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	rulesData, err := os.ReadFile(rulesFile)
	if err != nil {
		t.Fatal(err)
	}
	rulesUS := filepath.Join(dir, "rules-us.yaml")
	writeFile(t, rulesUS, string(rulesData))
	budgets := filepath.Join(dir, "budgets.yaml")
	writeFile(t, budgets, fmt.Sprintf("regions: [eu, us]\nrules_file: %s\nlease: {ttl: 3s, refresh: 1s, drift: 100ms, hold: 6s, demand_ttl: 2500ms}\n", rulesFile))

	// The Secrets certs.sh makes, for eu then us (one CA): each region's
	// certificate, the coordinators' (for 127.0.0.1), the allow API's
	// callers and the gateway's token.
	certs := filepath.Join(dir, "certs")
	regionCert := map[string][2]string{}
	var secrets map[string]string
	for _, r := range []string{"eu", "us"} {
		secrets = certSecretsIn(t, certs, r, "allot")
		crt, key := filepath.Join(dir, r+".crt"), filepath.Join(dir, r+".key")
		for dst, src := range map[string]string{crt: "tls.crt", key: "tls.key"} {
			b, err := os.ReadFile(filepath.Join(secrets["allot-agent-tls"], src))
			if err != nil {
				t.Fatal(err)
			}
			writeFile(t, dst, string(b))
		}
		regionCert[r] = [2]string{crt, key}
	}
	coordTLS, callers := secrets["allot-coordinator-tls"], filepath.Join(secrets["allot-allow-tokens"], "callers")
	ca := filepath.Join(coordTLS, "ca.crt")
	tokenData, err := os.ReadFile(filepath.Join(secrets["allot-allow-tokens"], "gateway.token"))
	if err != nil {
		t.Fatal(err)
	}
	token := strings.TrimSpace(string(tokenData))
	client := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: tlsFor(t, ca, ""), ForceAttemptHTTP2: true}}

	var procs []*server
	run := func(name string, args ...string) *server {
		cmd := exec.Command(filepath.Join(bin, name), args...)
		var out syncBuffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		s := &server{cmd: cmd}
		t.Cleanup(func() {
			s.Kill()
			if t.Failed() {
				t.Logf("%s %v:\n%s", name, args, tail(out.String(), 2000))
			}
		})
		procs = append(procs, s)
		return s
	}
	addr := func() string { return fmt.Sprintf("127.0.0.1:%d", freePort(t)) }
	coordGRPC, coordHTTP := addr(), addr()
	coord := run("coordinator", "serve", "-budgets", budgets, "-listen", coordGRPC, "-http", coordHTTP,
		"-tls-cert", filepath.Join(coordTLS, "tls.crt"), "-tls-key", filepath.Join(coordTLS, "tls.key"), "-tls-client-ca", ca)
	redisEU := startRedis(t)
	agentHTTP, agentGRPC := map[string]string{}, map[string]string{}
	gossip := map[string]string{"eu-a": addr(), "eu-b": addr()}
	agent := func(name, region, cert, redis, rules string, extra ...string) {
		agentHTTP[name], agentGRPC[name] = addr(), addr()
		args := []string{"-name", name, "-region", region, "-regions", "eu,us", "-rules", rules,
			"-coordinators", coordGRPC, "-coordinator-tls", "-coordinator-ca", ca,
			"-tls-cert", regionCert[cert][0], "-tls-key", regionCert[cert][1], "-allow-tokens", callers,
			"-http-listen", agentHTTP[name], "-grpc-listen", agentGRPC[name],
			"-redis", redis, "-redis-timeout", "50ms", "-breaker-failures", "2", "-log-level", "warn"}
		run("agent", append(args, extra...)...)
	}
	agent("eu-a", "eu", "eu", redisEU.Addr, rulesFile, "-gossip-bind", gossip["eu-a"], "-gossip-join", gossip["eu-b"])
	agent("eu-b", "eu", "eu", redisEU.Addr, rulesFile, "-gossip-bind", gossip["eu-b"], "-gossip-join", gossip["eu-a"])
	agent("us-a", "us", "us", "", rulesUS)
	// An impostor: an agent with us's certificate that speaks for eu. The
	// coordinator refuses its streams (wrong-region); Prometheus does not
	// scrape it.
	agent("impostor", "eu", "us", "", rulesFile)
	// The gateway decides in process; its store's bound and connection cap
	// are set low so the test can reach them.
	gatewayHTTP := addr()
	run("gateway", "-http", gatewayHTTP, "-grpc", "", "-rules", rulesFile, "-log-level", "warn",
		"-memory-max-keys", "20", "-http-max-conns", "4")
	for _, a := range append(slices.Collect(mapsValues(agentHTTP)), coordHTTP, gatewayHTTP) {
		waitListening(t, a, 20*time.Second)
	}

	// Prometheus, on a configuration made here: the agents over TLS,
	// verified against the CA, as the ServiceMonitors ask.
	cfg := filepath.Join(dir, "prometheus.yml")
	alertsFile, _ := filepath.Abs("prometheus/alerts.yml")
	writeFile(t, cfg, fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}
rule_files: [%q]
scrape_configs:
  - job_name: allot-coordinator
    static_configs: [{targets: [%q]}]
  - job_name: allot-agent
    scheme: https
    tls_config: {ca_file: %q}
    static_configs: [{targets: [%q, %q, %q]}]
  - job_name: allot-gateway
    static_configs: [{targets: [%q]}]
`, alertsFile, coordHTTP, ca, agentHTTP["eu-a"], agentHTTP["eu-b"], agentHTTP["us-a"], gatewayHTTP))
	if out, err := exec.Command(promtool, "check", "config", cfg).CombinedOutput(); err != nil {
		t.Fatalf("promtool check config: %v\n%s", err, out)
	}
	promAddr := addr()
	pcmd := exec.Command(prom, "--config.file="+cfg, "--storage.tsdb.path="+filepath.Join(dir, "tsdb"),
		"--web.listen-address="+promAddr, "--log.level=warn")
	var pout syncBuffer
	pcmd.Stdout, pcmd.Stderr = &pout, &pout
	if err := pcmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = pcmd.Process.Kill()
		_ = pcmd.Wait()
		if t.Failed() {
			t.Logf("prometheus:\n%s", tail(pout.String(), 2000))
		}
	})
	api := promAPI{"http://" + promAddr}
	waitListening(t, promAddr, 20*time.Second)

	// Traffic, from a caller with the gateway's token: a hot tenant in eu
	// above eu's floor, a cold one in us.
	var wg sync.WaitGroup
	defer wg.Wait()
	trafficCtx, stopTraffic := context.WithCancel(ctx)
	defer stopTraffic()
	for name, every := range map[string]time.Duration{"eu-a": 15 * time.Millisecond, "eu-b": 15 * time.Millisecond, "us-a": 100 * time.Millisecond} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			tick := time.NewTicker(every)
			defer tick.Stop()
			body := `{"subject":"hot-` + name[:2] + `","plan":"pro","descriptor":[{"key":"path","value":"/items"}]}`
			for {
				select {
				case <-trafficCtx.Done():
					return
				case <-tick.C:
				}
				if code, err := allowCall(client, agentHTTP[name], token, body); err == nil && code == http.StatusUnauthorized {
					t.Errorf("%s refused the gateway's token", name)
					return
				}
			}
		}()
	}

	// Every target is up.
	waitFor(t, ctx, "every target up", func() error {
		r, err := api.query(`up`)
		if err != nil {
			return err
		}
		for _, s := range r {
			if s.Value[1] != "1" {
				return fmt.Errorf("%s is down", s.Metric["instance"])
			}
		}
		if len(r) != 5 {
			return fmt.Errorf("%d targets", len(r))
		}
		return nil
	})

	// What crosses the boundaries: refused callers and requests at the
	// bounds, each on its panel.
	if code, err := allowCall(client, agentHTTP["eu-a"], "", `{"subject":"mallory","descriptor":[{"key":"path","value":"/items"}]}`); err != nil || code != http.StatusUnauthorized {
		t.Errorf("/v1/allow without a token: %d, %v; want 401", code, err)
	}
	if code, err := shouldRateLimit(client, agentGRPC["us-a"], "egde", "path", "/items"); err != nil || code != rlsOK {
		t.Errorf("RLS for a misspelt domain: overall code %d, %v; want OK (the default: allowed, counted)", code, err)
	}
	for i := range 30 {
		req, _ := http.NewRequest(http.MethodGet, "http://"+gatewayHTTP+"/items", nil)
		req.Header.Set("X-Tenant", fmt.Sprintf("tenant-%d", i))
		req.Header.Set("X-Plan", "free")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
	}
	holdIdle(t, gatewayHTTP, 6)
	for _, c := range []struct{ panel, check string }{
		{"Authentication modes", `count(allot_coordinator_auth_info{mode="mtls"}) == 1`},
		{"Authentication modes", `count(allot_agent_coordinator_auth_info{mode="mtls"}) == 3`},
		{"Authentication modes", `count(allot_auth_info{api="allow",mode="token"}) == 3`},
		{"Region streams refused and taken over", `sum(allot_coordinator_stream_refusals_total{reason="wrong-region"}) > 0`},
		{"Allow API callers refused", `sum(allot_auth_rejected_total{api="allow",transport="http"}) > 0`},
		{"RLS requests for domains the rules do not serve", `sum(allot_rls_unmatched_domain_total{kind="unknown",action="allowed"}) > 0`},
		{"In-process store refusals", `sum(allot_memory_store_refused_total{job="allot-gateway"}) > 0`},
		{"In-process store fill", `max(allot_memory_store_keys{job="allot-gateway"} / allot_memory_store_max_keys) == 1`},
		{"HTTP connection cap", `sum(allot_http_connections_evicted_total{server="gateway"}) > 0`},
	} {
		if !slices.ContainsFunc(dashboardQueries(t), func(q panelQuery) bool {
			return q.panel == c.panel && strings.Contains(q.expr, metricNames(c.check)[0])
		}) {
			t.Errorf("no panel %q showing %s", c.panel, metricNames(c.check)[0])
		}
		waitFor(t, ctx, c.check, func() error {
			r, err := api.query(c.check)
			if err == nil && len(r) == 0 {
				err = fmt.Errorf("false")
			}
			return err
		})
	}

	// Every panel query returns data while the system runs.
	for _, q := range dashboardQueries(t) {
		expr := grafanaExpr(q.expr)
		waitFor(t, ctx, fmt.Sprintf("panel %q: %s", q.panel, expr), func() error {
			r, err := api.query(expr)
			if err == nil && len(r) == 0 {
				err = fmt.Errorf("no data")
			}
			return err
		})
	}

	// Faults: us's rules file turns invalid; eu's Redis and the
	// coordinator die.
	writeFile(t, rulesUS, string(rulesData)+"\n  - {name: broken, match: {path: [\n")
	redisEU.Kill()
	coord.Kill()
	want := map[string]string{
		"AllotNoCoordinatorLeader": "firing", "AllotLeaseLapsed": "firing", "AllotBreakerOpen": "firing",
		"AllotRulesReloadFailed":   "firing",
		"AllotBudgetOvershootRisk": "pending", "AllotRegionOnFloors": "pending",
	}
	waitFor(t, ctx, "the faults' alerts", func() error {
		active, err := api.alerts()
		if err != nil {
			return err
		}
		got := map[string]string{}
		for _, a := range active {
			name := a.Labels["alertname"]
			if name == "AllotRulesReloadFailed" && a.Labels["instance"] != agentHTTP["us-a"] {
				return fmt.Errorf("AllotRulesReloadFailed for %s, whose rules are valid", a.Labels["instance"])
			}
			if got[name] != "firing" {
				got[name] = a.State
			}
		}
		var missing []string
		for a, state := range want {
			if got[a] == "" || state == "firing" && got[a] != "firing" {
				missing = append(missing, fmt.Sprintf("%s (want %s, is %q)", a, state, got[a]))
			}
		}
		if len(missing) > 0 {
			slices.Sort(missing)
			return fmt.Errorf("%s", strings.Join(missing, ", "))
		}
		return nil
	})
	stopTraffic()

	// Every alert's expression evaluates, and each metric selector in it
	// found data during the run.
	for _, a := range loadAlerts(t) {
		if _, err := api.query(a.Expr); err != nil {
			t.Errorf("alert %s: %v", a.Alert, err)
		}
		for _, sel := range selectorRE.FindAllString(a.Expr, -1) {
			r, err := api.query("count(last_over_time(" + sel + "[5m]))")
			switch {
			case err != nil:
				t.Errorf("alert %s: %s: %v", a.Alert, sel, err)
			case len(r) == 0:
				t.Errorf("alert %s: %s found no data during the run", a.Alert, sel)
			}
		}
	}
}

// selectorRE finds an allot metric with its label matchers.
var selectorRE = regexp.MustCompile(`\ballot_[a-z0-9_]+(\{[^}]*\})?`)

// allowCall posts body to an agent's /v1/allow over TLS, with token as a
// bearer token when it is not empty, and returns the status.
func allowCall(client *http.Client, addr, token, body string) (int, error) {
	req, err := http.NewRequest(http.MethodPost, "https://"+addr+"/v1/allow", strings.NewReader(body))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return res.StatusCode, nil
}

// rlsOK is Envoy's RateLimitResponse.Code OK.
const rlsOK = 1

// shouldRateLimit makes one Envoy RLS v3 call (ShouldRateLimit, with one
// descriptor of one entry) to the gRPC server at addr, over HTTP/2 on TLS
// as gRPC frames it, and returns the response's overall code. The request
// is encoded by hand (envoy.service.ratelimit.v3.RateLimitRequest: domain
// = 1, descriptors = 2; a descriptor's entries = 1; an entry's key = 1,
// value = 2), so this module needs neither gRPC nor Envoy's types.
func shouldRateLimit(client *http.Client, addr, domain, key, value string) (int, error) {
	var entry, desc, msg []byte
	entry = protowire.AppendTag(entry, 1, protowire.BytesType)
	entry = protowire.AppendString(entry, key)
	entry = protowire.AppendTag(entry, 2, protowire.BytesType)
	entry = protowire.AppendString(entry, value)
	desc = protowire.AppendTag(desc, 1, protowire.BytesType)
	desc = protowire.AppendBytes(desc, entry)
	msg = protowire.AppendTag(msg, 1, protowire.BytesType)
	msg = protowire.AppendString(msg, domain)
	msg = protowire.AppendTag(msg, 2, protowire.BytesType)
	msg = protowire.AppendBytes(msg, desc)
	frame := binary.BigEndian.AppendUint32([]byte{0}, uint32(len(msg)))
	req, err := http.NewRequest(http.MethodPost, "https://"+addr+"/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit",
		bytes.NewReader(append(frame, msg...)))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/grpc")
	req.Header.Set("TE", "trailers")
	res, err := client.Do(req)
	if err != nil {
		return 0, err
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		return 0, err
	}
	st := res.Trailer.Get("Grpc-Status")
	if st == "" {
		st = res.Header.Get("Grpc-Status") // a trailers-only answer
	}
	if res.ProtoMajor != 2 || st != "0" {
		return 0, fmt.Errorf("%s: HTTP/%d %d, grpc-status %q %s", req.URL, res.ProtoMajor, res.StatusCode, st,
			res.Trailer.Get("Grpc-Message")+res.Header.Get("Grpc-Message"))
	}
	if len(body) < 5 || int(binary.BigEndian.Uint32(body[1:5])) != len(body)-5 {
		return 0, fmt.Errorf("%s: a response of %d bytes is not one gRPC message", req.URL, len(body))
	}
	// RateLimitResponse: overall_code = 1 (an enum; absent is UNKNOWN, 0).
	for b := body[5:]; len(b) > 0; {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
		if num == 1 && typ == protowire.VarintType {
			v, n := protowire.ConsumeVarint(b)
			if n < 0 {
				return 0, protowire.ParseError(n)
			}
			return int(v), nil
		}
		if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
			return 0, protowire.ParseError(n)
		}
		b = b[n:]
	}
	return 0, nil
}

// holdIdle opens n keep-alive connections to the HTTP server at addr, one
// after another, each left idle after one request (a keep-alive client
// that went quiet), and closes them at the end of the test. Beyond the
// server's connection cap each new one makes it close the longest idle.
func holdIdle(t *testing.T, addr string, n int) {
	t.Helper()
	for range n {
		c, err := net.DialTimeout("tcp", addr, 2*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		_ = c.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: gateway\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		res, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, res.Body)
		res.Body.Close()
	}
}

func waitFor(t *testing.T, ctx context.Context, what string, f func() error) {
	t.Helper()
	var err error
	for {
		if err = f(); err == nil {
			return
		}
		if ctx.Err() != nil {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func mapsValues[K comparable, V any](m map[K]V) func(func(V) bool) {
	return func(yield func(V) bool) {
		for _, v := range m {
			if !yield(v) {
				return
			}
		}
	}
}
