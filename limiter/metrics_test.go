package limiter_test

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/rules"
)

func TestMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := limiter.NewMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	rs := parse(t, testRules)
	m.SetRules(rs)
	e := newEnv(t, testRules, func(c *limiter.Config) { c.OnDecision = m.Decision; c.OnEvent = m.Event })
	for range 11 {
		e.allow(t, limiter.Request{Subject: "a", Descriptor: path("/x")})
	}
	e.allow(t, limiter.Request{Descriptor: path("/x")})
	rs2 := parse(t, strings.Replace(testRules, "test-1", "test-2", 1))
	m.SetRules(rs2)
	want := `allot_decisions_total{reason="no-identity",result="denied",rule="api"} 1
allot_decisions_total{reason="ok",result="allowed",rule="api"} 10
allot_decisions_total{reason="over-limit",result="denied",rule="api"} 1
allot_limiter_events_total{kind="no-identity",rule="api"} 1
allot_rules_info{digest="sha256:` + rs2.Digest()[:12] + `",version="test-2"} 1`
	if got := gather(t, reg, "allot_decisions_total", "allot_limiter_events_total", "allot_rules_info"); got != want {
		t.Errorf("metrics:\n%s\nwant:\n%s", got, want)
	}
}

// gather renders the named counters and gauges as sorted
// name{labels} value lines.
func gather(t *testing.T, reg *prometheus.Registry, names ...string) string {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, mf := range mfs {
		if !slices.Contains(names, mf.GetName()) {
			continue
		}
		for _, m := range mf.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetCounter().GetValue() + m.GetGauge().GetValue()
			lines = append(lines, fmt.Sprintf("%s{%s} %g", mf.GetName(), strings.Join(labels, ","), v))
		}
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

// TestRulesMetrics: a changed file under the same version shows a new
// digest beside it, and rejected reloads are counted while the rules in
// force stay reported.
func TestRulesMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	m, err := limiter.NewRulesMetrics(reg)
	if err != nil {
		t.Fatal(err)
	}
	a := parse(t, testRules)
	b := parse(t, testRules+"\n# an edit under the same version\n")
	if a.Version() != b.Version() || a.Digest() == b.Digest() {
		t.Fatalf("test setup: versions %q %q, digests equal %v", a.Version(), b.Version(), a.Digest() == b.Digest())
	}
	h := rules.NewReloader(a, quiet, m.Reload)
	m.SetRules(a)
	h.Apply([]byte("plans: [this is not a plan"), "bad.yaml")
	h.Apply([]byte("plans: [this is not a plan"), "bad.yaml")
	h.Apply([]byte(testRules+"\n# an edit under the same version\n"), "test.yaml")
	want := `allot_rules_info{digest="sha256:` + b.Digest()[:12] + `",version="test-1"} 1
allot_rules_reload_failures_total{} 2`
	if got := gather(t, reg, "allot_rules_info", "allot_rules_reload_failures_total"); got != want {
		t.Errorf("metrics:\n%s\nwant:\n%s", got, want)
	}
}

// TestMemoryCollector: the in-process store's keys, bound and refusals.
func TestMemoryCollector(t *testing.T) {
	clk := clock.NewManual(t0)
	mem := bucket.NewMemory(bucket.MemoryOptions{Clock: clk, MaxKeys: 2})
	reg := prometheus.NewRegistry()
	reg.MustRegister(limiter.NewMemoryCollector(map[string]*bucket.Memory{"buckets": mem}))
	for i := range 3 {
		_, _ = mem.Decide(context.Background(), bucket.Key{Rule: "r", Subject: fmt.Sprint(i)}, bucket.PerMinute(1), 1, "")
	}
	want := `allot_memory_store_keys{store="buckets"} 2
allot_memory_store_max_keys{store="buckets"} 2
allot_memory_store_refused_total{store="buckets"} 1`
	if got := gather(t, reg, "allot_memory_store_keys", "allot_memory_store_max_keys", "allot_memory_store_refused_total"); got != want {
		t.Errorf("metrics:\n%s\nwant:\n%s", got, want)
	}
}
