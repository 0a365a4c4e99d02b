package deploy

import (
	"context"
	"encoding/json"
	"fmt"
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

	"sigs.k8s.io/yaml"
)

// pendingMetrics are metrics the alerts and the dashboard use that no
// binary exports yet; their queries are expected to find nothing. When one
// appears, the test fails so that it moves out of this list.
var pendingMetrics = []string{"allot_rules_reload_failures_total"}

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
// it queries is one a binary exports (or a pending one).
func TestGrafanaDashboard(t *testing.T) {
	exported := exportedMetrics(t)
	for _, q := range dashboardQueries(t) {
		for _, name := range metricNames(q.expr) {
			if !exported[name] && !slices.Contains(pendingMetrics, name) {
				t.Errorf("panel %q: metric %s is exported by no allot binary", q.panel, name)
			}
		}
	}
	for _, a := range loadAlerts(t) {
		for _, name := range metricNames(a.Expr) {
			if !exported[name] && !slices.Contains(pendingMetrics, name) {
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
// and NewDesc calls in the packages that export metrics.
func exportedMetrics(t *testing.T) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	re := regexp.MustCompile(`(?:Name:\s*|NewDesc\()"(allot_[a-z0-9_]+)"`)
	for _, f := range []string{"coordinator/metrics.go", "agent/metrics.go", "limiter/metrics.go"} {
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

// alerts returns the state (pending, firing) of each active alert.
func (p promAPI) alerts() (map[string]string, error) {
	var d struct {
		Alerts []struct {
			Labels map[string]string `json:"labels"`
			State  string            `json:"state"`
		} `json:"alerts"`
	}
	if err := p.get("/api/v1/alerts", &d); err != nil {
		return nil, err
	}
	out := map[string]string{}
	for _, a := range d.Alerts {
		if out[a.Labels["alertname"]] != "firing" {
			out[a.Labels["alertname"]] = a.State
		}
	}
	return out, nil
}

// grafanaExpr makes a panel query a Prometheus query: Grafana's
// $__rate_interval becomes a window of a few scrapes.
func grafanaExpr(e string) string { return strings.ReplaceAll(e, "$__rate_interval", "10s") }

// TestPrometheusLive runs a coordinator, three agents in two regions (eu
// on a Redis the test kills), a gateway and traffic, with a real
// Prometheus scraping them every second and evaluating alerts.yml. Every
// dashboard query must return data, every metric selector of every alert
// must find data, and two faults must fire their alerts through
// Prometheus: killing eu's Redis opens the breaker and sends decisions
// around the exact bucket (AllotBreakerOpen, AllotBudgetOvershootRisk);
// killing the coordinator leaves no leader and lets the leases lapse
// (AllotNoCoordinatorLeader firing after its 30 s, AllotLeaseLapsed,
// AllotRegionOnFloors). It takes under two minutes.
func TestPrometheusLive(t *testing.T) {
	if testing.Short() {
		t.Skip("runs Prometheus and seven processes for a minute")
	}
	prom := need(t, "prometheus", "prometheus")
	promtool := need(t, "promtool", "prometheus")
	bin := binaries(t)
	ctx, cancel := context.WithTimeout(context.Background(), 110*time.Second)
	defer cancel()
	dir := t.TempDir()

	// Budgets: the Kubernetes example's rules, two regions, short leases so
	// a lapse shows within seconds.
	rulesFile, err := filepath.Abs("kubernetes/base/rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	budgets := filepath.Join(dir, "budgets.yaml")
	writeFile(t, budgets, fmt.Sprintf("regions: [eu, us]\nrules_file: %s\nlease: {ttl: 3s, refresh: 1s, drift: 100ms, hold: 6s, demand_ttl: 2500ms}\n", rulesFile))

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
	coord := run("coordinator", "serve", "-budgets", budgets, "-listen", coordGRPC, "-http", coordHTTP)
	redisEU := startRedis(t)
	agentHTTP := map[string]string{}
	gossip := map[string]string{"eu-a": addr(), "eu-b": addr()}
	for _, a := range []struct{ name, region, redis, join string }{
		{"eu-a", "eu", redisEU.Addr, "eu-b"}, {"eu-b", "eu", redisEU.Addr, "eu-a"}, {"us-a", "us", "", ""},
	} {
		agentHTTP[a.name] = addr()
		args := []string{"-name", a.name, "-region", a.region, "-regions", "eu,us", "-rules", rulesFile,
			"-coordinators", coordGRPC, "-http-listen", agentHTTP[a.name], "-grpc-listen", addr(),
			"-redis", a.redis, "-redis-timeout", "50ms", "-breaker-failures", "2", "-log-level", "warn"}
		if a.join != "" {
			args = append(args, "-gossip-bind", gossip[a.name], "-gossip-join", gossip[a.join])
		}
		run("agent", args...)
	}
	gatewayHTTP := addr()
	run("gateway", "-http", gatewayHTTP, "-grpc", "", "-rules", rulesFile, "-log-level", "warn")
	for _, a := range append(slices.Collect(mapsValues(agentHTTP)), coordHTTP, gatewayHTTP) {
		waitListening(t, a, 20*time.Second)
	}

	// Prometheus, on a configuration made here.
	cfg := filepath.Join(dir, "prometheus.yml")
	alertsFile, _ := filepath.Abs("prometheus/alerts.yml")
	writeFile(t, cfg, fmt.Sprintf(`global: {scrape_interval: 1s, evaluation_interval: 1s, scrape_timeout: 900ms}
rule_files: [%q]
scrape_configs:
  - job_name: allot-coordinator
    static_configs: [{targets: [%q]}]
  - job_name: allot-agent
    static_configs: [{targets: [%q, %q, %q]}]
  - job_name: allot-gateway
    static_configs: [{targets: [%q]}]
`, alertsFile, coordHTTP, agentHTTP["eu-a"], agentHTTP["eu-b"], agentHTTP["us-a"], gatewayHTTP))
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

	// Traffic: a hot tenant in eu above eu's floor, a cold one in us.
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
				res, err := http.Post("http://"+agentHTTP[name]+"/v1/allow", "application/json", strings.NewReader(body))
				if err == nil {
					res.Body.Close()
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

	// Every panel query returns data while the system runs.
	for _, q := range dashboardQueries(t) {
		expr := grafanaExpr(q.expr)
		if pending(expr) {
			continue
		}
		waitFor(t, ctx, fmt.Sprintf("panel %q: %s", q.panel, expr), func() error {
			r, err := api.query(expr)
			if err == nil && len(r) == 0 {
				err = fmt.Errorf("no data")
			}
			return err
		})
	}

	// Faults: eu's Redis and the coordinator die.
	redisEU.Kill()
	coord.Kill()
	want := map[string]string{
		"AllotNoCoordinatorLeader": "firing", "AllotLeaseLapsed": "firing", "AllotBreakerOpen": "firing",
		"AllotBudgetOvershootRisk": "pending", "AllotRegionOnFloors": "pending",
	}
	waitFor(t, ctx, "the faults' alerts", func() error {
		got, err := api.alerts()
		if err != nil {
			return err
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
			case pending(sel) && len(r) > 0:
				t.Errorf("alert %s: %s is exported now: remove it from pendingMetrics", a.Alert, sel)
			case !pending(sel) && len(r) == 0:
				t.Errorf("alert %s: %s found no data during the run", a.Alert, sel)
			}
		}
	}
	for _, m := range pendingMetrics {
		if r, err := api.query("count(last_over_time(" + m + "[5m]))"); err != nil || len(r) > 0 {
			t.Errorf("%s: exported now, or the query failed (%v): remove it from pendingMetrics", m, err)
		}
	}
}

// selectorRE finds an allot metric with its label matchers.
var selectorRE = regexp.MustCompile(`\ballot_[a-z0-9_]+(\{[^}]*\})?`)

func pending(expr string) bool {
	return slices.ContainsFunc(pendingMetrics, func(m string) bool { return strings.Contains(expr, m) })
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
