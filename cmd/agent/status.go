package main

import (
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/limiter"
	"github.com/allot-dev/allot/region"
)

// allowJSON is the HTTP allow API's answer (POST /v1/allow): the gRPC
// API's AllowResponse as a JSON API reads, every field present, numbers as
// numbers, snake_case keys. Durations are whole milliseconds, rounded up.
type allowJSON struct {
	Allowed bool `json:"allowed"`
	// Reason is limiter.Reason with '_' for '-': ok, over_limit,
	// can_never_fit, unknown_plan, no_identity, unavailable, no_rule (the
	// gRPC enum's names, lower case, without REASON_).
	Reason            string `json:"reason"`
	Remaining         int64  `json:"remaining"`
	RetryAfterMS      int64  `json:"retry_after_ms"`
	RetryAfterSeconds int64  `json:"retry_after_seconds"`
	ResetAfterMS      int64  `json:"reset_after_ms"`
	// Limit is the limit in force; Quota the rules' quota. Both are null
	// when no quota applied.
	Limit        *limitJSON `json:"limit"`
	Quota        *limitJSON `json:"quota"`
	Policy       string     `json:"policy"`
	Rule         string     `json:"rule"`
	Plan         string     `json:"plan"`
	Cost         int64      `json:"cost"`
	Shadow       bool       `json:"shadow"`
	Fallback     string     `json:"fallback"`
	HTTPStatus   int        `json:"http_status"`
	RulesVersion string     `json:"rules_version"`
}

// limitJSON is a limit: count tokens per period_ms, burst at once.
type limitJSON struct {
	Count    int64 `json:"count"`
	PeriodMS int64 `json:"period_ms"`
	Burst    int64 `json:"burst"`
}

// millis rounds d up to whole milliseconds, so a wait is never understated.
func millis(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

func limitOf(l bucket.Limit, period time.Duration) *limitJSON {
	return &limitJSON{Count: int64(l.Count()), PeriodMS: millis(period), Burst: int64(l.Burst())}
}

// allowOf encodes a decision for the HTTP allow API.
func allowOf(d limiter.Decision) allowJSON {
	out := allowJSON{
		Allowed: d.Allowed, Reason: strings.ReplaceAll(string(d.Reason), "-", "_"), Remaining: int64(max(d.Remaining, 0)),
		RetryAfterMS: millis(d.RetryAfter), RetryAfterSeconds: d.RetryAfterSeconds(), ResetAfterMS: millis(d.ResetAfter),
		Policy: d.Policy, Rule: d.Rule, Plan: d.Plan, Cost: int64(d.Cost), Shadow: d.Shadow,
		Fallback: string(d.Fallback), HTTPStatus: d.Status, RulesVersion: d.RulesVersion,
	}
	if d.Limited() {
		// A limit the region may admit nothing under is 0 over the
		// quota's period.
		p := d.Limit.Period()
		if d.Limit.IsZero() {
			p = d.Quota.Period()
		}
		out.Limit, out.Quota = limitOf(d.Limit, p), limitOf(d.Quota, d.Quota.Period())
	}
	return out
}

// statusJSON is an agent's GET /status.
type statusJSON struct {
	Region          string   `json:"region"`
	Agent           string   `json:"agent"`
	Members         []string `json:"members"`
	Speaking        bool     `json:"speaking"`
	LeaseLive       bool     `json:"lease_live"`
	CoordinatorAuth string   `json:"coordinator_auth"`
	AllowAuth       string   `json:"allow_auth"`
	Breaker         string   `json:"breaker"`
	RulesVersion    string   `json:"rules_version"`
	// LeaseEnd and Table are null until the agent has seen a table.
	LeaseEnd  *time.Time     `json:"lease_end"`
	Table     *tableJSON     `json:"table"`
	LastError *lastErrorJSON `json:"last_error"`
	Stats     statsJSON      `json:"stats"`
}

// tableJSON is the region's allocation table as the agent uses it.
type tableJSON struct {
	Pub     uint64    `json:"pub"`
	Term    uint64    `json:"term"`
	Version uint64    `json:"version"`
	Speaker string    `json:"speaker"`
	Written time.Time `json:"written"`
	// Adopted is when this agent began deciding with the table (its
	// clock); null when not known.
	Adopted *time.Time  `json:"adopted"`
	Entries []entryJSON `json:"entries"`
}

// entryJSON is one hot key's allocation: count tokens per the budget's
// period, burst at once.
type entryJSON struct {
	Rule    string `json:"rule"`
	Subject string `json:"subject"`
	Count   int64  `json:"count"`
	Burst   int64  `json:"burst"`
}

// lastErrorJSON is the last error the agent met with the region's shared
// state: when it happened, and whether it still holds (false once a later
// round reached the shared state).
type lastErrorJSON struct {
	Error   string    `json:"error"`
	At      time.Time `json:"at"`
	Current bool      `json:"current"`
}

// statsJSON is region.Stats.
type statsJSON struct {
	StoreOperations int64           `json:"store_operations"`
	StoreErrors     int64           `json:"store_errors"`
	BatchRefills    int64           `json:"batch_refills"`
	BatchReturns    int64           `json:"batch_returns"`
	ReturnedTokens  int64           `json:"returned_tokens"`
	FailoverDrains  int64           `json:"failover_drains"`
	DrainedTokens   int64           `json:"drained_tokens"`
	Failovers       int64           `json:"failovers"`
	BreakerOpened   int64           `json:"breaker_opened"`
	Keys            int64           `json:"keys"`
	Rules           []ruleStatsJSON `json:"rules"`
}

// ruleStatsJSON counts one budget's decisions by path (store, batch,
// deny_cache, no_allocation, emergency, fail_open, fail_closed).
type ruleStatsJSON struct {
	Rule          string           `json:"rule"`
	FailurePolicy string           `json:"failure_policy"`
	Admitted      map[string]int64 `json:"admitted"`
	Denied        map[string]int64 `json:"denied"`
}

// statusOf encodes an agent's status.
func statusOf(st agent.Status, stats region.Stats, rulesVersion string, info map[string]string) statusJSON {
	out := statusJSON{Region: st.Region, Agent: st.Agent, Members: st.Members, Speaking: st.Speaking, LeaseLive: st.LeaseLive,
		CoordinatorAuth: info["coordinator_auth"], AllowAuth: info["allow_auth"], Breaker: st.Breaker.String(), RulesVersion: rulesVersion,
		Stats: statsJSON{StoreOperations: stats.StoreOps, StoreErrors: stats.StoreErrors, BatchRefills: stats.Refills,
			BatchReturns: stats.Returns, ReturnedTokens: stats.Returned, FailoverDrains: stats.Drains, DrainedTokens: stats.Drained,
			Failovers: stats.Failovers, BreakerOpened: stats.BreakerOpened, Keys: stats.Keys, Rules: []ruleStatsJSON{}}}
	if out.Members == nil {
		out.Members = []string{}
	}
	if t := st.Table; t != nil {
		end := t.LeaseEnd
		out.LeaseEnd = &end
		out.Table = &tableJSON{Pub: t.Pub, Term: t.Term, Version: t.Version, Speaker: t.Speaker, Written: t.Written, Entries: []entryJSON{}}
		if !st.Adopted.IsZero() {
			at := st.Adopted
			out.Table.Adopted = &at
		}
		for _, e := range t.Entries {
			out.Table.Entries = append(out.Table.Entries, entryJSON{Rule: e.Key.Rule, Subject: e.Key.Subject, Count: int64(e.Count), Burst: int64(e.Burst)})
		}
	}
	if st.LastError != nil {
		out.LastError = &lastErrorJSON{Error: st.LastError.Error(), At: st.LastErrorAt, Current: st.LastErrorCurrent}
	}
	for _, r := range stats.Rules {
		rs := ruleStatsJSON{Rule: r.Rule, FailurePolicy: string(r.Policy), Admitted: map[string]int64{}, Denied: map[string]int64{}}
		for _, p := range region.Paths() {
			k := strings.ReplaceAll(p.String(), "-", "_")
			rs.Admitted[k], rs.Denied[k] = r.Admitted[p], r.Denied[p]
		}
		out.Stats.Rules = append(out.Stats.Rules, rs)
	}
	return out
}

// errorJSON is the body of an HTTP error from the allow API.
type errorJSON struct {
	Error string `json:"error"`
}

// writeJSON writes v as JSON with status, on one line, or indented for a
// person to read.
func writeJSON(w http.ResponseWriter, status int, v any, indent bool) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	if indent {
		enc.SetIndent("", "  ")
	}
	_ = enc.Encode(v)
}
