package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/region"
)

// Shared is the state the agents of a region share: the allocation table
// the speaking agent publishes, and each agent's demand report, which the
// speaking agent sums for the coordinator. RedisShared keeps it in the
// regional Redis; MemShared in process.
type Shared interface {
	// PublishTable stores t unless the stored table has a Pub ≥ t.Pub, and
	// reports whether it stored it.
	PublishTable(ctx context.Context, t *region.Table) (bool, error)
	// LoadTable returns the stored table, nil if there is none.
	LoadTable(ctx context.Context) (*region.Table, error)
	// PutDemand stores agent's demand report.
	PutDemand(ctx context.Context, r region.DemandReport) error
	// Demands returns every agent's latest report, sorted by agent.
	Demands(ctx context.Context) ([]region.DemandReport, error)
}

// MemShared is Shared in process: for a region whose agents share one
// process, or one agent on the in-process store. It is safe for concurrent
// use.
type MemShared struct {
	mu     sync.Mutex
	table  *region.Table
	demand map[string]region.DemandReport
}

var _ Shared = (*MemShared)(nil)

// NewMemShared returns an empty MemShared.
func NewMemShared() *MemShared { return &MemShared{demand: map[string]region.DemandReport{}} }

// PublishTable implements Shared.
func (m *MemShared) PublishTable(_ context.Context, t *region.Table) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.table != nil && m.table.Pub >= t.Pub {
		return false, nil
	}
	m.table = t
	return true, nil
}

// LoadTable implements Shared.
func (m *MemShared) LoadTable(context.Context) (*region.Table, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.table, nil
}

// PutDemand implements Shared.
func (m *MemShared) PutDemand(_ context.Context, r region.DemandReport) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.demand[r.Agent] = r
	return nil
}

// Demands implements Shared.
func (m *MemShared) Demands(context.Context) ([]region.DemandReport, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]region.DemandReport, 0, len(m.demand))
	for _, r := range m.demand {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b region.DemandReport) int { return strings.Compare(a.Agent, b.Agent) })
	return out, nil
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

func (r *RedisShared) ctx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, r.timeout)
}

// PublishTable implements Shared.
func (r *RedisShared) PublishTable(ctx context.Context, t *region.Table) (bool, error) {
	body, err := json.Marshal(t)
	if err != nil {
		return false, fmt.Errorf("agent: encode table: %w", err)
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	n, err := publishScript.Run(ctx, r.c, []string{r.tableKey}, strconv.FormatUint(t.Pub, 10), body, r.ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("%w: agent: publish table to %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	return n == 1, nil
}

// LoadTable implements Shared.
func (r *RedisShared) LoadTable(ctx context.Context) (*region.Table, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	b, err := r.c.HGet(ctx, r.tableKey, "body").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: agent: load table from %s: %w", bucket.ErrUnavailable, r.tableKey, err)
	}
	t := &region.Table{}
	if err := json.Unmarshal(b, t); err != nil {
		return nil, fmt.Errorf("agent: decode table from %s: %w", r.tableKey, err)
	}
	return t, nil
}

// PutDemand implements Shared.
func (r *RedisShared) PutDemand(ctx context.Context, d region.DemandReport) error {
	b, err := json.Marshal(d)
	if err != nil {
		return fmt.Errorf("agent: encode demand: %w", err)
	}
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	_, err = r.c.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, r.demKey, d.Agent, b)
		p.PExpire(ctx, r.demKey, r.ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("%w: agent: put demand to %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	return nil
}

// Demands implements Shared.
func (r *RedisShared) Demands(ctx context.Context) ([]region.DemandReport, error) {
	ctx, cancel := r.ctx(ctx)
	defer cancel()
	m, err := r.c.HGetAll(ctx, r.demKey).Result()
	if err != nil {
		return nil, fmt.Errorf("%w: agent: read demand from %s: %w", bucket.ErrUnavailable, r.demKey, err)
	}
	out := make([]region.DemandReport, 0, len(m))
	for agent, s := range m {
		var d region.DemandReport
		if json.Unmarshal([]byte(s), &d) != nil {
			continue // a report this version cannot read counts as none
		}
		d.Agent = agent
		out = append(out, d)
	}
	slices.SortFunc(out, func(a, b region.DemandReport) int { return strings.Compare(a.Agent, b.Agent) })
	return out, nil
}
