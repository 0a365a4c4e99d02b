package limiter

import (
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/rules"
)

// Metrics exports a limiter's decisions, events and rules version to
// Prometheus. Wire it with Config.OnDecision = m.Decision and
// Config.OnEvent = m.Event, and m.Reload as the rules' Notify (or call
// m.SetRules on every reload).
type Metrics struct {
	*RulesMetrics
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	events    *prometheus.CounterVec
}

// RulesMetrics exports the rules in force, allot_rules_info{version,digest},
// and allot_rules_reload_failures_total, the reloads rejected (an invalid
// or unreadable file). It is safe for concurrent use.
type RulesMetrics struct {
	info     *prometheus.GaugeVec
	failures prometheus.Counter

	mu     sync.Mutex
	labels []string // the labels of the info series set, nil before SetRules
}

// NewRulesMetrics registers the rules metrics on reg.
func NewRulesMetrics(reg prometheus.Registerer) (*RulesMetrics, error) {
	m := &RulesMetrics{
		info: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_rules_info",
			Help: "1 for the rules in force: their version and the digest of their content (sha256: and 12 hex digits).",
		}, []string{"version", "digest"}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "allot_rules_reload_failures_total",
			Help: "Rules reloads rejected (invalid or unreadable); the last good rules stay in force.",
		}),
	}
	for _, c := range []prometheus.Collector{m.info, m.failures} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// SetRules makes s the rules reported in force.
func (m *RulesMetrics) SetRules(s *rules.Set) {
	digest := s.Digest()
	if len(digest) > 12 {
		digest = digest[:12]
	}
	labels := []string{s.Version(), "sha256:" + digest}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.labels != nil {
		m.info.DeleteLabelValues(m.labels...)
	}
	m.labels = labels
	m.info.WithLabelValues(labels...).Set(1)
}

// Reload records one reload attempt; it fits rules.WatchConfig.Notify and
// rules.NewReloader's notify.
func (m *RulesMetrics) Reload(u rules.Update) {
	switch {
	case u.Err != nil:
		m.failures.Inc()
	case u.Changed:
		m.SetRules(u.New)
	}
}

// NewMetrics registers the limiter's metrics on reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	m := &Metrics{
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_decisions_total",
			Help: "Decisions by rule, result (allowed, denied, shadow_denied) and reason.",
		}, []string{"rule", "result", "reason"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "allot_decision_seconds",
			Help:    "Time to decide one request, store round trip included.",
			Buckets: []float64{1e-6, 1e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 0.1, 0.5},
		}),
		events: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "allot_limiter_events_total",
			Help: "Limiter events: unknown-plan, no-identity, store-error, fail-open, emergency, shadow-deny, can-never-fit.",
		}, []string{"kind", "rule"}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.events} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	rm, err := NewRulesMetrics(reg)
	if err != nil {
		return nil, err
	}
	m.RulesMetrics = rm
	return m, nil
}

// Decision counts one decision; it fits Config.OnDecision.
func (m *Metrics) Decision(d Decision, took time.Duration) {
	result := "allowed"
	switch {
	case !d.Allowed:
		result = "denied"
	case d.Shadow && d.Reason != ReasonOK:
		result = "shadow_denied"
	}
	m.decisions.WithLabelValues(d.Rule, result, string(d.Reason)).Inc()
	m.latency.Observe(took.Seconds())
}

// Event counts one event; it fits Config.OnEvent.
func (m *Metrics) Event(e Event) { m.events.WithLabelValues(string(e.Kind), e.Rule).Inc() }

// MemoryCollector exports an in-process store's counts at scrape time:
// allot_memory_store_keys, _max_keys, _attempts (gauges),
// allot_memory_store_refused_total (new keys refused at the bound) and
// allot_memory_store_unrecorded_attempts_total, each with the label store.
type MemoryCollector struct {
	stores map[string]*bucket.Memory
}

// NewMemoryCollector returns a collector of the stores, named by the label
// store (such as "buckets" and "local").
func NewMemoryCollector(stores map[string]*bucket.Memory) *MemoryCollector {
	return &MemoryCollector{stores: stores}
}

var (
	descMemKeys       = prometheus.NewDesc("allot_memory_store_keys", "Buckets an in-process store holds.", []string{"store"}, nil)
	descMemMaxKeys    = prometheus.NewDesc("allot_memory_store_max_keys", "The bound on the buckets an in-process store holds (0: none).", []string{"store"}, nil)
	descMemAttempts   = prometheus.NewDesc("allot_memory_store_attempts", "Attempt records an in-process store holds.", []string{"store"}, nil)
	descMemRefused    = prometheus.NewDesc("allot_memory_store_refused_total", "New keys refused because an in-process store held its bound of buckets in debt (the rule's failure policy applied).", []string{"store"}, nil)
	descMemUnrecorded = prometheus.NewDesc("allot_memory_store_unrecorded_attempts_total", "Attempt ids not remembered because an in-process store held its bound of attempt records.", []string{"store"}, nil)
)

// Describe implements prometheus.Collector.
func (c *MemoryCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descMemKeys, descMemMaxKeys, descMemAttempts, descMemRefused, descMemUnrecorded} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *MemoryCollector) Collect(ch chan<- prometheus.Metric) {
	for name, m := range c.stores {
		st := m.Stats()
		ch <- prometheus.MustNewConstMetric(descMemKeys, prometheus.GaugeValue, float64(st.Keys), name)
		ch <- prometheus.MustNewConstMetric(descMemMaxKeys, prometheus.GaugeValue, float64(st.MaxKeys), name)
		ch <- prometheus.MustNewConstMetric(descMemAttempts, prometheus.GaugeValue, float64(st.Attempts), name)
		ch <- prometheus.MustNewConstMetric(descMemRefused, prometheus.CounterValue, float64(st.Refused), name)
		ch <- prometheus.MustNewConstMetric(descMemUnrecorded, prometheus.CounterValue, float64(st.Unrecorded), name)
	}
}
