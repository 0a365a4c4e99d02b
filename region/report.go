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
	// Level is set on a report the agent stored between its rounds
	// because a key's demand took a new level (Core.Leveled): the
	// speaking agent ticks its Speaker with such a report as its notice
	// arrives, and leaves the others to its next read of the store.
	Level bool `json:"level,omitempty"`
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
	return AppendReport(nil, agent, now, ds)
}

// AppendReport is ReportOf with the report's keys appended to keys, for a
// driver that reuses its buffers.
func AppendReport(keys []DemandItem, agent string, now time.Time, ds []KeyDemand) DemandReport {
	keys = slices.Grow(keys[:0], len(ds))
	for _, d := range ds {
		keys = append(keys, DemandItem{Rule: d.Key.Rule, Subject: d.Key.Subject, Want: d.Want})
	}
	return DemandReport{Agent: agent, At: now, Keys: keys}
}

// SumDemand adds up the reports of live agents not older than maxAge at
// now: the region's demand per key, sorted by key.
func SumDemand(reports []DemandReport, live []string, now time.Time, maxAge time.Duration) []lease.Demand {
	sum, _ := sumDemand(nil, nil, reports, live, now, maxAge)
	return sum
}

// sumDemand is SumDemand into dst, with tmp as a second buffer; it returns
// both for reuse. Each report lists its keys sorted (Core.Demand keeps
// them so), so the sum is a merge of sorted lists; a report that is not
// sorted is sorted first.
func sumDemand(dst, tmp []lease.Demand, reports []DemandReport, live []string, now time.Time, maxAge time.Duration) (sum, buf []lease.Demand) {
	sum = dst[:0]
	for _, r := range reports {
		if !slices.Contains(live, r.Agent) || now.Sub(r.At) > maxAge {
			continue
		}
		keys := r.Keys
		if !slices.IsSortedFunc(keys, cmpItem) {
			keys = slices.SortedFunc(slices.Values(keys), cmpItem)
		}
		tmp = mergeDemand(tmp[:0], sum, keys)
		sum, tmp = tmp, sum
	}
	return sum, tmp
}

func cmpItem(a, b DemandItem) int {
	return cmpKey(bucket.Key{Rule: a.Rule, Subject: a.Subject}, bucket.Key{Rule: b.Rule, Subject: b.Subject})
}

// mergeDemand appends to dst the merge of acc and items, both sorted by
// key, adding the wants of a key in both.
func mergeDemand(dst, acc []lease.Demand, items []DemandItem) []lease.Demand {
	i, j := 0, 0
	for i < len(acc) && j < len(items) {
		k := bucket.Key{Rule: items[j].Rule, Subject: items[j].Subject}
		switch c := cmpKey(acc[i].Key, k); {
		case c < 0:
			dst = append(dst, acc[i])
			i++
		case c > 0:
			dst = append(dst, lease.Demand{Key: k, Want: items[j].Want})
			j++
		default:
			dst = append(dst, lease.Demand{Key: k, Want: acc[i].Want + items[j].Want})
			i++
			j++
		}
	}
	dst = append(dst, acc[i:]...)
	for ; j < len(items); j++ {
		dst = append(dst, lease.Demand{Key: bucket.Key{Rule: items[j].Rule, Subject: items[j].Subject}, Want: items[j].Want})
	}
	return dst
}
