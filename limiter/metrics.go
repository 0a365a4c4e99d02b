package limiter

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/rules"
)

// Metrics exports a limiter's decisions, events and rules version to
// Prometheus. Wire it with Config.OnDecision = m.Decision and
// Config.OnEvent = m.Event, and call m.SetRules on every reload.
type Metrics struct {
	decisions *prometheus.CounterVec
	latency   prometheus.Histogram
	events    *prometheus.CounterVec
	rulesInfo *prometheus.GaugeVec
	version   string
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
		rulesInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "allot_rules_info",
			Help: "1 for the version of the rules in force.",
		}, []string{"version"}),
	}
	for _, c := range []prometheus.Collector{m.decisions, m.latency, m.events, m.rulesInfo} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
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

// SetRules makes s's version the one reported in force. It is not safe for
// concurrent use with itself; call it from the one goroutine that reloads.
func (m *Metrics) SetRules(s *rules.Set) {
	if m.version != "" {
		m.rulesInfo.DeleteLabelValues(m.version)
	}
	m.version = s.Version()
	m.rulesInfo.WithLabelValues(m.version).Set(1)
}
