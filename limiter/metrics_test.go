package limiter_test

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/limiter"
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
	m.SetRules(parse(t, strings.Replace(testRules, "test-1", "test-2", 1)))
	want := `allot_decisions_total{reason="no-identity",result="denied",rule="api"} 1
allot_decisions_total{reason="ok",result="allowed",rule="api"} 10
allot_decisions_total{reason="over-limit",result="denied",rule="api"} 1
allot_limiter_events_total{kind="no-identity",rule="api"} 1
allot_rules_info{version="test-2"} 1`
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
