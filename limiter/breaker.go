package limiter

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/clock"
)

var (
	descBreakerState = prometheus.NewDesc("allot_store_breaker_state",
		"Circuit breaker on the shared store: 0 closed, 1 open, 2 half-open.", nil, nil)
	descBreakerOpened = prometheus.NewDesc("allot_store_breaker_opened_total",
		"Times the circuit breaker on the shared store opened.", nil, nil)
	descBreakerDeadline = prometheus.NewDesc("allot_store_deadline_seconds",
		"The deadline a call to the shared store gets now (it follows the store's latency).", nil, nil)
)

// BreakerCollector exports a gateway's circuit breaker on its shared store
// (breaker.Guard): its state, its openings and the deadline calls get.
type BreakerCollector struct {
	b   *breaker.Breaker
	clk clock.Clock
}

// NewBreakerCollector returns the collector of b on clk (nil: the real
// clock).
func NewBreakerCollector(b *breaker.Breaker, clk clock.Clock) *BreakerCollector {
	if clk == nil {
		clk = clock.Real{}
	}
	return &BreakerCollector{b: b, clk: clk}
}

// Describe implements prometheus.Collector.
func (c *BreakerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descBreakerState
	ch <- descBreakerOpened
	ch <- descBreakerDeadline
}

// Collect implements prometheus.Collector.
func (c *BreakerCollector) Collect(ch chan<- prometheus.Metric) {
	ch <- prometheus.MustNewConstMetric(descBreakerState, prometheus.GaugeValue, float64(c.b.State(c.clk.Now())))
	ch <- prometheus.MustNewConstMetric(descBreakerOpened, prometheus.CounterValue, float64(c.b.Opened()))
	ch <- prometheus.MustNewConstMetric(descBreakerDeadline, prometheus.GaugeValue, c.b.Deadline().Seconds())
}
