package region

import "github.com/allot-dev/allot/breaker"

// Breaker is the circuit breaker on the regional store (package breaker,
// which the gateway's Redis path shares): deadlines that follow the
// store's latency, opened by an error rate, probed back.
type Breaker = breaker.Breaker

// BreakerState is a circuit breaker's state.
type BreakerState = breaker.State

// Breaker states.
const (
	BreakerClosed   = breaker.Closed
	BreakerOpen     = breaker.Open
	BreakerHalfOpen = breaker.HalfOpen
)

// BreakerConfig returns the breaker settings of c.
func (c Config) BreakerConfig() breaker.Config {
	return breaker.Config{Failures: c.BreakerFailures, Ratio: c.BreakerRatio, Window: c.BreakerWindow,
		Backoff: c.BreakerBackoff, MaxBackoff: c.BreakerMaxBackoff, Timeout: c.Timeout, MaxTimeout: c.MaxTimeout}
}
