package region

import (
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// DemandReport is one agent's demand for the keys it should report.
type DemandReport struct {
	Agent string    `json:"agent"`
	At    time.Time `json:"at"`
	// Pub is the publication of the allocation table the agent decides
	// with: the speaking agent acknowledges a grant to the coordinator only
	// once every live agent has adopted the table that carries it.
	Pub uint64 `json:"pub"`
	// Speaker is the agent that wrote that table.
	Speaker string       `json:"speaker"`
	Keys    []DemandItem `json:"keys"`
}

// DemandItem is one key's demand in a report: Want tokens per the budget's
// period.
type DemandItem struct {
	Rule    string        `json:"r"`
	Subject string        `json:"s"`
	Want    bucket.Tokens `json:"w"`
}

// ReportOf builds agent's report from its core's demand.
func ReportOf(agent string, now time.Time, ds []KeyDemand) DemandReport {
	r := DemandReport{Agent: agent, At: now, Keys: make([]DemandItem, len(ds))}
	for i, d := range ds {
		r.Keys[i] = DemandItem{Rule: d.Key.Rule, Subject: d.Key.Subject, Want: d.Want}
	}
	return r
}

// SumDemand adds up the reports of live agents not older than maxAge at
// now: the region's demand per key, sorted by key.
func SumDemand(reports []DemandReport, live []string, now time.Time, maxAge time.Duration) []lease.Demand {
	sum := map[bucket.Key]bucket.Tokens{}
	for _, r := range reports {
		if !slices.Contains(live, r.Agent) || now.Sub(r.At) > maxAge {
			continue
		}
		for _, it := range r.Keys {
			sum[bucket.Key{Rule: it.Rule, Subject: it.Subject}] += it.Want
		}
	}
	out := make([]lease.Demand, 0, len(sum))
	for k, w := range sum {
		out = append(out, lease.Demand{Key: k, Want: w})
	}
	slices.SortFunc(out, func(a, b lease.Demand) int { return cmpKey(a.Key, b.Key) })
	return out
}
