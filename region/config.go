package region

import (
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/rules"
)

// RuleConfig is how the core treats the keys of one rule (one budget).
type RuleConfig struct {
	// Scope says whether the rule's limit is split across regions
	// (rules.ScopeGlobal: the region uses its allocation) or enforced whole
	// in the region (rules.ScopeRegion, rules.ScopeLocal: the limit as
	// given).
	Scope rules.Scope
	// OnUnavailable is the failure policy when the store cannot decide.
	OnUnavailable rules.FailurePolicy
	// EmergencyLimit, when set, caps the emergency limit of each bucket
	// before it is divided among the region's live agents.
	EmergencyLimit bucket.Limit
	// EmptyOnFailover treats every bucket of the rule as empty at a detected
	// Redis failover, so writes lost by replication cannot grant twice.
	EmptyOnFailover bool
}

// Config configures a Core. Build it with DefaultConfig and change what you
// need; NewCore calls Validate.
type Config struct {
	// Region is this region's name.
	Region string
	// Floors splits every global budget into floors; a nil Regions means
	// this region alone (its floor is the whole budget minus the reserve).
	// It must match the coordinator's budgets so floors sum within them.
	Floors lease.Split
	// Rules holds per-rule settings by rule (budget) name; a rule not listed
	// gets DefaultRule.
	Rules map[string]RuleConfig
	// DefaultRule applies to rules not in Rules.
	DefaultRule RuleConfig

	// BatchWindow is how much of the agent's local demand one batch
	// covers, or of the allocation's rate when the demand exceeds it.
	BatchWindow time.Duration
	// BatchMaxFraction caps a batch at this fraction of the region's burst.
	BatchMaxFraction float64
	// BatchTTL bounds how long an agent keeps batch tokens before giving
	// them back: a batch is demand for the next moments, never a reserve.
	BatchTTL time.Duration
	// MinBatch is the smallest batch worth taking: a key whose demand over
	// BatchWindow is below it is decided exactly, one store call each.
	MinBatch bucket.Tokens

	// BreakerFailures store failures within BreakerWindow open the
	// circuit breaker, when they are at least BreakerRatio of the calls
	// that ended in it (see package breaker).
	BreakerFailures int
	BreakerRatio    float64
	BreakerWindow   time.Duration
	// BreakerBackoff is how long the breaker stays open before a probe;
	// each failed probe doubles it up to BreakerMaxBackoff.
	BreakerBackoff    time.Duration
	BreakerMaxBackoff time.Duration
	// Timeout and MaxTimeout bound the deadline of a store call, which
	// follows the store's latency between them; the driver applies it
	// (breaker.Timed) and the core counts the calls that outlive it.
	Timeout    time.Duration
	MaxTimeout time.Duration
	// Breaker, when set, is the breaker the core uses, shared with the
	// driver's store wrapper (breaker.Timed), which feeds it latencies;
	// nil makes one from the fields above.
	Breaker *breaker.Breaker

	// DemandHalfLife is the half-life of the demand estimate per key.
	DemandHalfLife time.Duration
	// DemandSustain is how long a key's use must hold a rise to at least
	// twice its demand estimate before the estimate takes that level at
	// once rather than as an average. A rise whose one window saw 256
	// tokens or more, and a fall to at most half, are taken after one
	// demand window (see demandEstimate).
	DemandSustain time.Duration
	// IdleAfter drops a key's local state after this long without requests.
	IdleAfter time.Duration
	// DenyRetry is the Retry-After of a request denied because the region
	// has no allocation that fits it: about one lease refresh.
	DenyRetry time.Duration
	// Shards splits the per-key state over independently locked maps.
	Shards int
}

// DefaultConfig returns a Config with production defaults; Region is left
// to the caller.
func DefaultConfig() Config {
	bc := breaker.DefaultConfig()
	return Config{
		DefaultRule:       RuleConfig{Scope: rules.ScopeGlobal, OnUnavailable: rules.FailClosed},
		BatchWindow:       20 * time.Millisecond,  // a few tens of ms of demand per store call
		BatchMaxFraction:  0.1,                    // ten agents' batches fit in one burst
		BatchTTL:          100 * time.Millisecond, // batch tokens are spent within moments or returned
		MinBatch:          4,                      // below 4 tokens per window a batch saves little
		BreakerFailures:   bc.Failures,            // see breaker.DefaultConfig for each reason
		BreakerRatio:      bc.Ratio,
		BreakerWindow:     bc.Window,
		BreakerBackoff:    bc.Backoff,
		BreakerMaxBackoff: bc.MaxBackoff,
		Timeout:           bc.Timeout,
		MaxTimeout:        bc.MaxTimeout,
		DemandHalfLife:    500 * time.Millisecond, // follows demand within a refresh interval
		DemandSustain:     200 * time.Millisecond, // two windows: a bunch within one is not a rise
		IdleAfter:         10 * time.Second,       // keep state for keys in recent use only (~600 B each)
		DenyRetry:         time.Second,            // about one lease refresh
		Shards:            64,                     // spread 2–64 cores' worth of callers
	}
}

// Validate reports the first problem with c, naming the field and value.
func (c Config) Validate() error {
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: region is empty", ErrInvalidConfig)
	case c.BatchWindow <= 0:
		return fmt.Errorf("%w: batch_window=%s must be > 0", ErrInvalidConfig, c.BatchWindow)
	case math.IsNaN(c.BatchMaxFraction) || c.BatchMaxFraction <= 0 || c.BatchMaxFraction > 1:
		return fmt.Errorf("%w: batch_max_fraction=%v must be in (0, 1]", ErrInvalidConfig, c.BatchMaxFraction)
	case c.BatchTTL <= 0:
		return fmt.Errorf("%w: batch_ttl=%s must be > 0", ErrInvalidConfig, c.BatchTTL)
	case c.MinBatch < 1:
		return fmt.Errorf("%w: min_batch=%d must be ≥ 1", ErrInvalidConfig, c.MinBatch)
	case c.DemandHalfLife <= 0:
		return fmt.Errorf("%w: demand_half_life=%s must be > 0", ErrInvalidConfig, c.DemandHalfLife)
	case c.DemandSustain < demandWindow:
		return fmt.Errorf("%w: demand_sustain=%s must be ≥ the demand window %s", ErrInvalidConfig, c.DemandSustain, demandWindow)
	case c.IdleAfter <= c.BatchTTL:
		return fmt.Errorf("%w: idle_after=%s must exceed batch_ttl=%s", ErrInvalidConfig, c.IdleAfter, c.BatchTTL)
	case c.DenyRetry <= 0:
		return fmt.Errorf("%w: deny_retry=%s must be > 0", ErrInvalidConfig, c.DenyRetry)
	case c.Shards < 1:
		return fmt.Errorf("%w: shards=%d must be ≥ 1", ErrInvalidConfig, c.Shards)
	}
	if c.Breaker == nil {
		if err := c.BreakerConfig().Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidConfig, err)
		}
	}
	if err := ValidateFloors(c.Floors, c.Region); err != nil {
		return err
	}
	if err := c.DefaultRule.validate("default"); err != nil {
		return err
	}
	for name, rc := range c.Rules {
		if err := rc.validate(name); err != nil {
			return err
		}
	}
	return nil
}

// ValidateFloors reports the first problem with split f as region's
// Config would (Config.Validate).
func ValidateFloors(f lease.Split, region string) error {
	if math.IsNaN(f.Reserve) || f.Reserve < 0 || f.Reserve >= 1 {
		return fmt.Errorf("%w: floors reserve=%v must be in [0, 1)", ErrInvalidConfig, f.Reserve)
	}
	if f.Regions == nil {
		return nil
	}
	found := false
	seen := map[string]bool{}
	for _, r := range f.Regions {
		if r == "" || seen[r] {
			return fmt.Errorf("%w: floors regions=%q must be distinct non-empty names", ErrInvalidConfig, f.Regions)
		}
		seen[r] = true
		found = found || r == region
	}
	if !found {
		return fmt.Errorf("%w: floors regions=%q do not include this region %q", ErrInvalidConfig, f.Regions, region)
	}
	if f.Weights != nil && len(f.Weights) != len(f.Regions) {
		return fmt.Errorf("%w: floors has %d weights for %d regions", ErrInvalidConfig, len(f.Weights), len(f.Regions))
	}
	for i, w := range f.Weights {
		if w <= 0 || w > 1<<20 {
			return fmt.Errorf("%w: floors weight=%d for region %q must be in [1, 2^20]", ErrInvalidConfig, w, f.Regions[i])
		}
	}
	return nil
}

func (rc RuleConfig) validate(name string) error {
	switch rc.Scope {
	case "", rules.ScopeGlobal, rules.ScopeRegion, rules.ScopeLocal:
	default:
		return fmt.Errorf("%w: rule %q: scope=%q unknown", ErrInvalidConfig, name, rc.Scope)
	}
	switch rc.OnUnavailable {
	case "", rules.FailClosed, rules.FailOpen, rules.Emergency:
	default:
		return fmt.Errorf("%w: rule %q: on_unavailable=%q unknown", ErrInvalidConfig, name, rc.OnUnavailable)
	}
	if !rc.EmergencyLimit.IsZero() {
		if err := rc.EmergencyLimit.Validate(); err != nil {
			return fmt.Errorf("%w: rule %q: emergency limit: %w", ErrInvalidConfig, name, err)
		}
	}
	return nil
}

// Errors callers branch on.
var (
	// ErrInvalidConfig: a Config field is out of range.
	ErrInvalidConfig = errors.New("region: invalid config")
	// ErrFailClosed wraps bucket.ErrUnavailable: the store could not decide
	// and the rule fails closed.
	ErrFailClosed = fmt.Errorf("region: store unavailable, rule fails closed: %w", bucket.ErrUnavailable)
	// ErrFailOpen wraps bucket.ErrUnavailable: the store could not decide
	// and the rule fails open; the edge admits and counts.
	ErrFailOpen = fmt.Errorf("region: store unavailable, rule fails open: %w", bucket.ErrUnavailable)
)

// RuleConfigs derives per-rule settings from a rules set: scope, failure
// policy and emergency limit of every rule, under the rule's name and the
// name of each of its budgets (rules.Set.Budgets). emptyOnFailover lists
// rules (or "*" for all) that start buckets empty after a detected Redis
// failover.
func RuleConfigs(set *rules.Set, emptyOnFailover []string) map[string]RuleConfig {
	all := false
	empty := map[string]bool{}
	for _, n := range emptyOnFailover {
		all = all || n == "*"
		empty[n] = true
	}
	out := map[string]RuleConfig{}
	for _, r := range set.Rules() {
		rc := RuleConfig{Scope: r.Scope, OnUnavailable: r.Failure.Policy, EmergencyLimit: r.Failure.Limit,
			EmptyOnFailover: all || empty[r.Name]}
		if rc.Scope == "" {
			rc.Scope = rules.ScopeGlobal
		}
		if rc.OnUnavailable == "" {
			rc.OnUnavailable = rules.FailClosed
		}
		out[r.Name] = rc
	}
	for _, b := range set.Budgets() {
		out[b.Name] = out[b.Rule]
	}
	return out
}
