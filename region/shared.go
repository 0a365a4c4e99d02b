package region

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// Shared is the state the agents of a region share: the allocation table
// the speaking agent publishes, and each agent's demand report, which the
// speaking agent sums for the coordinator. RedisShared keeps it in the
// regional Redis; MemShared in process.
type Shared interface {
	// PublishTable stores t unless the stored table has a Pub ≥ t.Pub, and
	// reports whether it stored it.
	PublishTable(ctx context.Context, t *Table) (bool, error)
	// LoadTable returns the stored table, nil if there is none.
	LoadTable(ctx context.Context) (*Table, error)
	// PutDemand stores agent's demand report.
	PutDemand(ctx context.Context, r DemandReport) error
	// Demands returns every agent's latest report, sorted by agent.
	Demands(ctx context.Context) ([]DemandReport, error)
}

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

// MemShared is Shared in process: for a region whose agents share one
// process, or one agent on the in-process store. It is safe for concurrent
// use.
type MemShared struct {
	mu     sync.Mutex
	table  *Table
	demand map[string]DemandReport
}

var _ Shared = (*MemShared)(nil)

// NewMemShared returns an empty MemShared.
func NewMemShared() *MemShared { return &MemShared{demand: map[string]DemandReport{}} }

// PublishTable implements Shared.
func (m *MemShared) PublishTable(_ context.Context, t *Table) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.table != nil && m.table.Pub >= t.Pub {
		return false, nil
	}
	m.table = t
	return true, nil
}

// LoadTable implements Shared.
func (m *MemShared) LoadTable(context.Context) (*Table, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.table, nil
}

// PutDemand implements Shared.
func (m *MemShared) PutDemand(_ context.Context, r DemandReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demand[r.Agent] = r
	return nil
}

// Demands implements Shared.
func (m *MemShared) Demands(context.Context) ([]DemandReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]DemandReport, 0, len(m.demand))
	for _, r := range m.demand {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b DemandReport) int { return cmpString(a.Agent, b.Agent) })
	return out, nil
}

func cmpString(a, b string) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// RedisShared is Shared in the regional Redis: the table in one hash and
// the demand reports in another, both hash-tagged by region so Cluster
// keeps each in one slot. The table is replaced by one script that
// compares publication numbers, so a stale speaker never overwrites a newer
// table.
type RedisShared struct {
	c        redis.UniversalClient
	tableKey string
	demKey   string
	timeout  time.Duration
	ttl      time.Duration
}

var _ Shared = (*RedisShared)(nil)

// NewRedisShared returns region's shared state in c under prefix. Keys
// expire after ttl without writes (a region whose agents are all gone
// leaves nothing behind).
func NewRedisShared(c redis.UniversalClient, prefix, region string, timeout, ttl time.Duration) *RedisShared {
	if prefix == "" {
		prefix = "allot:"
	}
	base := prefix + "region:{" + region + "}:"
	return &RedisShared{c: c, tableKey: base + "table", demKey: base + "demand", timeout: timeout, ttl: ttl}
}

var publishScript = redis.NewScript(`
local cur = redis.call('HGET', KEYS[1], 'pub')
if cur and tonumber(cur) >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'pub', ARGV[1], 'body', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ARGV[3])
return 1`)

type tableJSON struct {
	Region    string        `json:"region"`
	Speaker   string        `json:"speaker"`
	Pub       uint64        `json:"pub"`
	Term      uint64        `json:"term"`
	Version   uint64        `json:"version"`
	LeaseEnd  time.Time     `json:"lease_end"`
	HoldUntil time.Time     `json:"hold_until"`
	Released  bool          `json:"released"`
	Written   time.Time     `json:"written"`
	Entries   []lease.Entry `json:"entries"`
}

// MarshalTable encodes t as JSON.
func MarshalTable(t *Table) ([]byte, error) {
	return json.Marshal(tableJSON{Region: t.Region, Speaker: t.Speaker, Pub: t.Pub, Term: t.Term, Version: t.Version,
		LeaseEnd: t.LeaseEnd, HoldUntil: t.HoldUntil, Released: t.Released, Written: t.Written, Entries: t.Entries})
}

// UnmarshalTable decodes a table MarshalTable wrote.
func UnmarshalTable(b []byte) (*Table, error) {
	var j tableJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return nil, fmt.Errorf("region: decode table: %w", err)
	}
	t := &Table{Region: j.Region, Speaker: j.Speaker, Pub: j.Pub, Term: j.Term, Version: j.Version,
		LeaseEnd: j.LeaseEnd, HoldUntil: j.HoldUntil, Released: j.Released, Written: j.Written, Entries: j.Entries}
	t.build()
	return t, nil
}

func (r *RedisShared) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// PublishTable implements Shared.
func (r *RedisShared) PublishTable(ctx context.Context, t *Table) (bool, error) {
	body, err := MarshalTable(t)
	if err != nil {
		return false, err
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	n, err := publishScript.Run(ctx, r.c, []string{r.tableKey}, strconv.FormatUint(t.Pub, 10), body, r.ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: region: publish table to %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	return n == 1, nil
}

// LoadTable implements Shared.
func (r *RedisShared) LoadTable(ctx context.Context) (*Table, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	b, err := r.c.HGet(ctx, r.tableKey, "body").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: region: load table from %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	return UnmarshalTable(b)
}

// PutDemand implements Shared.
func (r *RedisShared) PutDemand(ctx context.Context, d DemandReport) error {
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("region: encode demand: %w", err)
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, r.demKey, d.Agent, b)
		p.PExpire(ctx, r.demKey, r.ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: region: put demand to %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	return nil
}

// Demands implements Shared.
func (r *RedisShared) Demands(ctx context.Context) ([]DemandReport, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	m, err := r.c.HGetAll(ctx, r.demKey).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: region: read demand from %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	out := make([]DemandReport, 0, len(m))
	for agent, s := range m {
		var d DemandReport
		if json.Unmarshal([]byte(s), &d) != nil {
			continue // a report this version cannot read counts as none
		}
		d.Agent = agent
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b DemandReport) int { return cmpString(a.Agent, b.Agent) })
	return out, nil
}
