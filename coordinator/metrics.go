package coordinator

import (
	"github.com/prometheus/client_golang/prometheus"
)

// Collector exposes a Server's state as Prometheus metrics. Register it
// with a prometheus.Registerer; it reads the Server at scrape time.
type Collector struct{ s *Server }

// NewCollector returns a Collector for s.
func NewCollector(s *Server) *Collector { return &Collector{s: s} }

var (
	descLeader     = prometheus.NewDesc("allot_coordinator_leader", "1 while this coordinator leads.", nil, nil)
	descTerm       = prometheus.NewDesc("allot_coordinator_term", "The leader term this coordinator serves (0 when following).", nil, nil)
	descLearning   = prometheus.NewDesc("allot_coordinator_learning", "1 while the leader learns what regions hold: it grants no increase (the first leader none above a static split's share).", nil, nil)
	descHotKeys    = prometheus.NewDesc("allot_coordinator_hot_keys", "Keys with allocations, by budget.", []string{"budget"}, nil)
	descAlloc      = prometheus.NewDesc("allot_coordinator_allocation", "Sum over hot keys of each region's allocation (tokens per period), by budget and region.", []string{"budget", "region"}, nil)
	descHeadroom   = prometheus.NewDesc("allot_coordinator_escrow_headroom", "Smallest budget minus escrowed allocations among the budget's hot keys (tokens per period).", []string{"budget"}, nil)
	descConnected  = prometheus.NewDesc("allot_coordinator_regions_connected", "Regions with an open lease stream.", nil, nil)
	descMessages   = prometheus.NewDesc("allot_coordinator_messages_total", "Lease messages, by direction (up, down) and fate (ok, dropped, rejected).", []string{"direction", "fate"}, nil)
	descGrants     = prometheus.NewDesc("allot_coordinator_grants_total", "Grant messages sent.", nil, nil)
	descRenewals   = prometheus.NewDesc("allot_coordinator_renewals_total", "Lease renewals sent.", nil, nil)
	descIncreases  = prometheus.NewDesc("allot_coordinator_increases_total", "Allocation increases granted.", nil, nil)
	descReclaims   = prometheus.NewDesc("allot_coordinator_reclaims_total", "Allocation decreases sent (capacity taken back).", nil, nil)
	descBlocked    = prometheus.NewDesc("allot_coordinator_blocked_renewals_total", "Renewals withheld until a decrease was acknowledged.", nil, nil)
	descExpired    = prometheus.NewDesc("allot_coordinator_lapsed_leases_total", "Region leases that ran out at the coordinator.", nil, nil)
	descUrgent     = prometheus.NewDesc("allot_coordinator_urgent_rebalances_total", "Keys rebalanced on a report between rounds.", nil, nil)
	descCarried    = prometheus.NewDesc("allot_coordinator_reserve_tokens_carried_total", "Stored reserve tokens sent with the grants that raised a claim (lease.Entry.Credit).", nil, nil)
	descReturned   = prometheus.NewDesc("allot_coordinator_reserve_tokens_returned_total", "Tokens regions' decreases took away from their buckets, put back in stored reserves (lease.Message.Returns).", nil, nil)
	descRounds     = prometheus.NewDesc("allot_coordinator_rounds_total", "Allocation rounds run.", nil, nil)
	descLeaderTerm = prometheus.NewDesc("allot_coordinator_leaderships_total", "Times this coordinator became leader.", nil, nil)
	descRoundTime  = prometheus.NewDesc("allot_coordinator_round_seconds", "How long the last allocation round (every hot key, every lease) took to compute.", nil, nil)
	descAuth       = prometheus.NewDesc("allot_coordinator_auth_info", "1 for how regions prove who they are: mtls, token, mtls+token, or insecure (a name alone).", []string{"mode"}, nil)
	descRefused    = prometheus.NewDesc("allot_coordinator_stream_refusals_total", "Streams or messages refused, by reason: unauthenticated, wrong-region, held (the region has a live stream), unknown-region, too-large.", []string{"reason"}, nil)
	descTakeovers  = prometheus.NewDesc("allot_coordinator_stream_takeovers_total", "Streams that took their region's place from an older one, by cause: same-session (the same Holder reconnecting), silent (the older one had been silent for the takeover interval).", []string{"cause"}, nil)
	descSanitized  = prometheus.NewDesc("allot_coordinator_sanitized_entries_total", "Entries of regions' messages cut to their bounds, by action: clipped (beyond the keys per message), dropped (unknown rule or key too long), clamped (value outside [0, the budget]).", []string{"action"}, nil)
)

// refusalReasons and takeoverCauses are every label value, so that each
// series exists from the start.
var (
	refusalReasons = []string{"unauthenticated", "wrong-region", "held", "unknown-region", "too-large"}
	takeoverCauses = []string{"same-session", "silent"}
)

// Describe implements prometheus.Collector.
func (c *Collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descLeader, descTerm, descLearning, descHotKeys, descAlloc, descHeadroom,
		descConnected, descMessages, descGrants, descRenewals, descIncreases, descReclaims, descBlocked, descExpired,
		descUrgent, descCarried, descReturned, descRounds, descLeaderTerm, descRoundTime, descAuth, descRefused, descTakeovers, descSanitized} {
		ch <- d
	}
}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	s := c.s
	s.mu.Lock()
	defer s.mu.Unlock()
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter := func(d *prometheus.Desc, v uint64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, float64(v), labels...)
	}
	leading := s.alloc != nil
	gauge(descLeader, b2f(leading))
	if leading {
		gauge(descTerm, float64(s.term))
		gauge(descLearning, b2f(s.alloc.Learning(s.cfg.Clock.Now())))
		for _, t := range s.alloc.Totals() {
			gauge(descHotKeys, float64(t.HotKeys), t.Rule)
			gauge(descHeadroom, float64(t.Headroom), t.Rule)
			for i, r := range t.Regions {
				gauge(descAlloc, float64(t.Counts[i]), t.Rule, r)
			}
		}
	} else {
		gauge(descTerm, 0)
		gauge(descLearning, 0)
	}
	gauge(descConnected, float64(len(s.streams)))
	gauge(descRoundTime, s.lastRound.Seconds())
	n := s.counts
	counter(descMessages, n.up, "up", "ok")
	counter(descMessages, n.rejected, "up", "rejected")
	counter(descMessages, n.down, "down", "ok")
	counter(descMessages, n.dropped, "down", "dropped")
	counter(descGrants, n.grants)
	counter(descRenewals, n.renewals)
	counter(descIncreases, n.increases)
	counter(descReclaims, n.decreases)
	counter(descBlocked, n.blocked)
	counter(descExpired, n.expired)
	counter(descUrgent, n.urgent)
	counter(descCarried, n.carried)
	counter(descReturned, n.returned)
	counter(descRounds, n.rounds)
	counter(descLeaderTerm, n.leaderChanges)
	gauge(descAuth, 1, s.AuthMode())
	for _, r := range refusalReasons {
		counter(descRefused, n.refused[r], r)
	}
	for _, c := range takeoverCauses {
		counter(descTakeovers, n.takeovers[c], c)
	}
	for i, a := range []string{"clipped", "dropped", "clamped"} {
		counter(descSanitized, n.sanitized[i], a)
	}
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}
