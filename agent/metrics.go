package agent

import (
	"sync"
	"time"

	"github.com/allot-dev/allot/region"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics exports an agent's metrics to Prometheus. Counters the hot path
// moves live in the region.Core as atomics and are read at scrape time, so a
// decision costs no metric lookups; only the latency histogram is observed
// per decision. Create one per agent with NewMetrics and pass it in
// Deps.
type Metrics struct {
	latency *prometheus.HistogramVec

	mu     sync.Mutex
	agents []*Agent
}

// NewMetrics registers the agent metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "allot_region_decision_seconds",
			Help:    "Decision latency by path (batch: local; store: one regional Redis round trip; emergency, fail-open, fail-closed: without the store).",
			Buckets: []float64{1e-7, 1e-6, 1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.25},
		}, []string{"agent", "path"}),
	}
	reg.MustRegister(m.latency, (*metricsCollector)(m))
	return m
}

// attach exports a's metrics and returns the function that observes its
// decisions' latency, with a's name as the agent label like the region's
// other metrics; the observers are looked up once, not per decision.
func (m *Metrics) attach(a *Agent) func(region.Result, time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.agents = append(m.agents, a)
	var byPath []prometheus.Observer // by region.Path
	for _, p := range region.Paths() {
		byPath = append(byPath, m.latency.WithLabelValues(a.Name(), p.String()))
	}
	return func(r region.Result, d time.Duration) {
		if int(r.Path) < len(byPath) {
			byPath[r.Path].Observe(d.Seconds())
		}
	}
}

type metricsCollector Metrics

var (
	descDecisions   = prometheus.NewDesc("allot_region_decisions_total", "Decisions by rule (budget), path and result.", []string{"agent", "rule", "path", "result"}, nil)
	descPolicy      = prometheus.NewDesc("allot_region_rule_policy", "The failure policy in force per rule (1 for the active policy).", []string{"agent", "rule", "policy"}, nil)
	descStoreOps    = prometheus.NewDesc("allot_region_store_operations_total", "Calls to the regional store (Redis scripts).", []string{"agent"}, nil)
	descStoreErrors = prometheus.NewDesc("allot_region_store_errors_total", "Calls to the regional store that failed.", []string{"agent"}, nil)
	descRefills     = prometheus.NewDesc("allot_region_batch_refills_total", "Token batches taken from the regional bucket.", []string{"agent"}, nil)
	descReturned    = prometheus.NewDesc("allot_region_batch_returned_tokens_total", "Unused batch tokens given back to the regional bucket.", []string{"agent"}, nil)
	descBreakerOpen = prometheus.NewDesc("allot_region_breaker_opened_total", "Times the circuit breaker on the regional store opened.", []string{"agent"}, nil)
	descBreaker     = prometheus.NewDesc("allot_region_breaker_state", "Circuit breaker state: 0 closed, 1 open, 2 half-open.", []string{"agent"}, nil)
	descFailovers   = prometheus.NewDesc("allot_region_redis_failovers_total", "Detected failovers or restarts of the regional Redis.", []string{"agent"}, nil)
	descDrained     = prometheus.NewDesc("allot_region_failover_drained_tokens_total", "Tokens removed from buckets started empty after a failover.", []string{"agent"}, nil)
	descKeys        = prometheus.NewDesc("allot_region_keys", "Keys with local state (in recent use).", []string{"agent"}, nil)
	descMembers     = prometheus.NewDesc("allot_region_members", "Live agents in the region, as this agent sees them.", []string{"agent", "region"}, nil)
	descSpeaker     = prometheus.NewDesc("allot_region_speaker", "1 when this agent speaks to the coordinator for the region.", []string{"agent", "region"}, nil)
	descLeaseLive   = prometheus.NewDesc("allot_region_lease_live", "1 while the region's lease lives (else keys are at their floors).", []string{"agent", "region"}, nil)
	descLeaseLeft   = prometheus.NewDesc("allot_region_lease_remaining_seconds", "Time until the region's lease expires (negative: expired that long ago).", []string{"agent", "region"}, nil)
	descTableAge    = prometheus.NewDesc("allot_region_table_age_seconds", "Time since the speaking agent wrote the allocation table.", []string{"agent", "region"}, nil)
	descHotKeys     = prometheus.NewDesc("allot_region_hot_keys", "Keys with a coordinator allocation in the region's table.", []string{"agent", "region"}, nil)
	descAllocation  = prometheus.NewDesc("allot_region_allocation_tokens", "Sum of the region's coordinator allocations per rule (tokens per the budget's period).", []string{"agent", "region", "rule"}, nil)
)

// Describe implements prometheus.Collector.
func (c *metricsCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descDecisions, descPolicy, descStoreOps, descStoreErrors, descRefills, descReturned,
		descBreakerOpen, descBreaker, descFailovers, descDrained, descKeys, descMembers, descSpeaker, descLeaseLive,
		descLeaseLeft, descTableAge, descHotKeys, descAllocation} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *metricsCollector) Collect(ch chan<- prometheus.Metric) {
	c.mu.Lock()
	agents := append([]*Agent(nil), c.agents...)
	c.mu.Unlock()
	for _, a := range agents {
		name, rg := a.Name(), a.Region()
		st := a.core.Stats()
		for _, r := range st.Rules {
			for _, p := range region.Paths() {
				if v := r.Admitted[p]; v > 0 {
					ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(v), name, r.Rule, p.String(), "admitted")
				}
				if v := r.Denied[p]; v > 0 {
					ch <- prometheus.MustNewConstMetric(descDecisions, prometheus.CounterValue, float64(v), name, r.Rule, p.String(), "denied")
				}
			}
			ch <- prometheus.MustNewConstMetric(descPolicy, prometheus.GaugeValue, 1, name, r.Rule, string(r.Policy))
		}
		counter := func(d *prometheus.Desc, v int64) {
			ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), name)
		}
		counter(descStoreOps, st.StoreOps)
		counter(descStoreErrors, st.StoreErrors)
		counter(descRefills, st.Refills)
		counter(descReturned, st.Returned)
		counter(descBreakerOpen, st.BreakerOpened)
		counter(descFailovers, st.Failovers)
		counter(descDrained, st.Drained)
		ch <- prometheus.MustNewConstMetric(descKeys, prometheus.GaugeValue, float64(st.Keys), name)

		as := a.Status()
		now := a.deps.Clock.Now()
		ch <- prometheus.MustNewConstMetric(descBreaker, prometheus.GaugeValue, float64(as.Breaker), name)
		ch <- prometheus.MustNewConstMetric(descMembers, prometheus.GaugeValue, float64(len(as.Members)), name, rg)
		ch <- prometheus.MustNewConstMetric(descSpeaker, prometheus.GaugeValue, b2f(as.Speaking), name, rg)
		ch <- prometheus.MustNewConstMetric(descLeaseLive, prometheus.GaugeValue, b2f(as.LeaseLive), name, rg)
		if t := as.Table; t != nil {
			ch <- prometheus.MustNewConstMetric(descLeaseLeft, prometheus.GaugeValue, t.LeaseEnd.Sub(now).Seconds(), name, rg)
			ch <- prometheus.MustNewConstMetric(descTableAge, prometheus.GaugeValue, now.Sub(t.Written).Seconds(), name, rg)
			ch <- prometheus.MustNewConstMetric(descHotKeys, prometheus.GaugeValue, float64(len(t.Entries)), name, rg)
			sums := map[string]float64{}
			for _, e := range t.Entries {
				sums[e.Key.Rule] += float64(e.Count)
			}
			for rule, v := range sums {
				ch <- prometheus.MustNewConstMetric(descAllocation, prometheus.GaugeValue, v, name, rg, rule)
			}
		}
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
