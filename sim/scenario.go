package sim

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/lease"
)

// ErrScenario wraps every error about a scenario file's content.
var ErrScenario = errors.New("sim: invalid scenario")

// Scenario is one simulated setup: regions and the latencies between them,
// the rules (global budgets), the traffic, and a timeline of faults. It is
// read from YAML; see the files in sim/scenarios for examples.
type Scenario struct {
	Name        string        `yaml:"name"`
	Description string        `yaml:"description"`
	Duration    time.Duration `yaml:"duration"`
	// Seeds are the seeds the tool and the tests run by default.
	Seeds []uint64 `yaml:"seeds"`
	// Bins is the number of time bins in the charts and series.
	Bins int `yaml:"bins"`

	Regions []RegionSpec `yaml:"regions"`
	// Latency is the one-way latency between regions; a missing entry
	// takes the reverse direction's value. The diagonal is the latency
	// inside a region (agent to regional Redis, agent to agent).
	Latency map[string]map[string]time.Duration `yaml:"latency"`
	// Jitter adds a uniform random delay of up to Jitter × the latency.
	Jitter float64 `yaml:"jitter"`
	// Loss is the probability that any one message is lost.
	Loss float64 `yaml:"loss"`

	Coordinator CoordinatorSpec `yaml:"coordinator"`
	Redis       RedisSpec       `yaml:"redis"`
	Agent       AgentSpec       `yaml:"agent"`
	Baselines   BaselineSpec    `yaml:"baselines"`

	Rules   []RuleSpec    `yaml:"rules"`
	Traffic []TrafficSpec `yaml:"traffic"`
	Faults  []FaultSpec   `yaml:"faults"`
	// Expect states what allot must achieve beyond its bound: a liveness
	// property the design promises for the scenario's faults. A run that
	// misses it FAILs.
	Expect ExpectSpec `yaml:"expect"`

	// Config names the deployment's budgets and rules files, which then
	// give the rules (config.go); Replay replays recorded traffic
	// (replay.go) beside or instead of Traffic.
	Config *ConfigSpec  `yaml:"config"`
	Replay []ReplaySpec `yaml:"replay"`

	// Chaos is the block the chaos harness (package chaos) reads, so that
	// one file drives both the simulator and the harness's real processes.
	// The simulator ignores it; the harness parses and validates it.
	Chaos yaml.Node `yaml:"chaos"`
}

// ExpectSpec is a scenario's liveness expectations of allot.
type ExpectSpec struct {
	// Shares are regions that must get a share of a rule's budget in time.
	Shares []ShareExpect `yaml:"shares"`
}

// ShareExpect says that from After, within Within, Region must admit at
// least AtLeast of Rule's rate (in one bin of the admitted-rate series):
// capacity the design says is free by then reaches the region that wants
// it.
type ShareExpect struct {
	Region  string        `yaml:"region"`
	Rule    string        `yaml:"rule"` // default: the first rule
	After   time.Duration `yaml:"after"`
	Within  time.Duration `yaml:"within"`
	AtLeast float64       `yaml:"at_least"`
}

// RegionSpec is one region: its agents and the clocks of its nodes.
type RegionSpec struct {
	Name   string `yaml:"name"`
	Agents int    `yaml:"agents"`
	// Skew is the agents' clock offset from true time; Drift their rate
	// error (1e-4 gains 100 µs a second). The region's coordinator, when it
	// leads, runs on the same clock.
	Skew  time.Duration `yaml:"skew"`
	Drift float64       `yaml:"drift"`
	// RedisSkew and RedisDrift are the regional Redis primary's clock;
	// ReplicaSkew is its replica's, which takes over on a failover.
	RedisSkew   time.Duration `yaml:"redis_skew"`
	RedisDrift  float64       `yaml:"redis_drift"`
	ReplicaSkew time.Duration `yaml:"replica_skew"`
}

// CoordinatorSpec places the coordinators and sets the lease timings.
type CoordinatorSpec struct {
	// Regions lists where the coordinator replicas run; the first is the
	// initial leader.
	Regions  []string      `yaml:"regions"`
	LeaseTTL time.Duration `yaml:"lease_ttl"`
	Refresh  time.Duration `yaml:"refresh"`
	// Drift is the relative clock drift the lease protocol's margin covers
	// (ρ): between the leading coordinator's clock and every region's, as
	// lease.RelativeDrift measures it. The protocol's Drift is
	// lease.DriftFor(LeaseTTL, ρ). A run whose clocks drift apart by more
	// is outside the design's assumptions (verdict BEYOND).
	Drift float64 `yaml:"drift"`
	// Election is how long a leader failover leaves no leader.
	Election time.Duration `yaml:"election"`
}

// RedisSpec configures the regional Redis model.
type RedisSpec struct {
	// Lag is the replica's replication lag: writes younger than Lag are
	// lost when the primary fails.
	Lag time.Duration `yaml:"lag"`
	// Failover is how long a failover leaves the region without a primary.
	Failover time.Duration `yaml:"failover"`
	// OnFailover is "keep" (accept the lost writes) or "empty" (start every
	// bucket empty after a detected failover).
	OnFailover string `yaml:"on_failover"`
}

// AgentSpec configures the agents' decision path.
type AgentSpec struct {
	// Timeout is how long an agent first waits for Redis before applying
	// the rule's failure policy (the agent's -redis-timeout); slow answers
	// raise the deadline up to the agent's longest (500 ms, or Timeout
	// when longer). Not given, it is the agent's: 100 ms.
	Timeout time.Duration `yaml:"timeout"`
	// BreakerFailures consecutive failures open the circuit breaker for
	// BreakerBackoff, during which the agent decides locally at once;
	// each failed probe doubles it up to the agent's BreakerMaxBackoff.
	// Not given, they are the agent's (region.DefaultConfig): 5 and 250 ms.
	BreakerFailures int           `yaml:"breaker_failures"`
	BreakerBackoff  time.Duration `yaml:"breaker_backoff"`
	// BatchWindow is how much of the agent's local demand a hot-key batch
	// covers; BatchMaxFraction caps a batch at that fraction of the
	// region's burst. BatchTTL bounds how long an agent keeps batch tokens.
	BatchWindow      time.Duration `yaml:"batch_window"`
	BatchMaxFraction float64       `yaml:"batch_max_fraction"`
	BatchTTL         time.Duration `yaml:"batch_ttl"`
}

// BaselineSpec configures the alternatives measured beside allot.
type BaselineSpec struct {
	// Central is the region holding the one central Redis.
	Central string `yaml:"central"`
	// AsyncSync is how often the asynchronous global counter forwards hits
	// to the owner and the owner broadcasts its state.
	AsyncSync time.Duration `yaml:"async_sync"`
	// AsyncOwner is the region owning every budget in that baseline.
	AsyncOwner string `yaml:"async_owner"`
}

// RuleSpec is one rule: every one of its Keys subjects has its own global
// budget of Count tokens per Period with a burst of Burst.
type RuleSpec struct {
	Name   string        `yaml:"name"`
	Count  int64         `yaml:"count"`
	Period time.Duration `yaml:"period"`
	Burst  int64         `yaml:"burst"`
	Keys   int           `yaml:"keys"`
	// Policy is what an agent does when Redis is unreachable: "closed",
	// "open" or "emergency".
	Policy string `yaml:"policy"`
	// Reserve is the share of the budget the coordinator holds back from
	// the floors.
	Reserve float64 `yaml:"reserve"`
	// Weights are the regions' floor weights, in the order of the
	// scenario's regions; empty means equal floors.
	Weights []int64 `yaml:"weights"`
	// Allocation is the coordinator's allocation policy: "max-min" (the
	// default), "proportional" or "static".
	Allocation string `yaml:"allocation"`

	// defaultKeys is Keys when a config leaves it to the replayed logs
	// and they name no subject of the rule.
	defaultKeys int
}

// TrafficSpec is one stream of arrivals into a region for a rule.
type TrafficSpec struct {
	Region string `yaml:"region"`
	Rule   string `yaml:"rule"`
	// Rate is the mean arrival rate in requests per second.
	Rate float64 `yaml:"rate"`
	// Kind is "poisson" or "bursty" (on/off: Rate×BurstFactor during bursts
	// of mean length BurstOn, silence of mean length BurstOff between them;
	// Rate is the rate while on divided by BurstFactor).
	Kind        string        `yaml:"kind"`
	BurstFactor float64       `yaml:"burst_factor"`
	BurstOn     time.Duration `yaml:"burst_on"`
	BurstOff    time.Duration `yaml:"burst_off"`
	// Zipf is the exponent s > 1 of the key distribution; 0 spreads keys
	// uniformly.
	Zipf float64 `yaml:"zipf"`
	// Key, when set, sends every request to that one key (a flash crowd).
	Key *int `yaml:"key"`
	// Start and Stop bound the stream in time; Stop 0 runs to the end.
	Start time.Duration `yaml:"start"`
	Stop  time.Duration `yaml:"stop"`
	// Diurnal modulates the rate: Rate×(1 + Amplitude·sin(2π(t/Period + Phase))).
	Diurnal *DiurnalSpec `yaml:"diurnal"`
	// Cycle switches the stream on and off on a fixed schedule (demand that
	// rotates between regions, a crowd that moves).
	Cycle *CycleSpec `yaml:"cycle"`
	// Cost is the distribution of request costs; empty means cost 1.
	Cost []CostSpec `yaml:"cost"`
	// Shift marks the stream's start as a demand shift, for the
	// convergence figure.
	Shift bool `yaml:"shift"`
}

// DiurnalSpec is a sinusoidal modulation of a stream's rate.
type DiurnalSpec struct {
	Amplitude float64       `yaml:"amplitude"`
	Period    time.Duration `yaml:"period"`
	Phase     float64       `yaml:"phase"`
}

// CycleSpec turns a stream on for On out of every Period, the first
// on-window starting Phase after the stream's start.
type CycleSpec struct {
	Period time.Duration `yaml:"period"`
	On     time.Duration `yaml:"on"`
	Phase  time.Duration `yaml:"phase"`
}

// CostSpec is one cost and its relative weight.
type CostSpec struct {
	Value  int64   `yaml:"value"`
	Weight float64 `yaml:"weight"`
}

// FaultSpec is one fault on the timeline, active from At for For.
type FaultSpec struct {
	// Kind is one of:
	//   coordinator_cut     the region's agents cannot reach any coordinator
	//   coordinator_oneway  one direction of that link is cut: Direction
	//                       "to" loses the region's messages to the
	//                       coordinators (hellos, reports, acks), "from"
	//                       the coordinators' messages to it (grants)
	//   coordinator_flap    the region's link to the coordinators is cut
	//                       for Down, then up for Up, over and over
	//   region_cut          the region cannot reach any other region
	//   redis_cut           agents (Agent, or all) cannot reach the regional Redis
	//   redis_failover      the regional primary dies; the replica takes over
	//   leader_failover     the coordinator leader dies; the next one takes over
	//   agent_crash         an agent stops (and restarts after For)
	//   loss                message loss rises to Loss during the window, on
	//                       Links: "all" (the default), "wan" (lease
	//                       messages) or "redis" (agents' calls to Redis)
	//   duplicate           every lease message of Region (or of every
	//                       region) is delivered twice with probability Prob
	//   reorder             every lease message of Region (or of every
	//                       region) is held up to Delay more, uniformly, so
	//                       later messages overtake earlier ones
	//   coordinator_delay   every lease message of Region (or of every
	//                       region) is held Delay more, plus up to Jitter,
	//                       uniformly, each way; order is kept, as on the
	//                       chaos harness's delayed TCP streams
	//   redis_slow          Redis answers agents (Agent, or all) Delay later
	//                       each way, plus up to Jitter, and fails Loss of
	//                       their calls (slowredis.go)
	Kind   string        `yaml:"kind"`
	At     time.Duration `yaml:"at"`
	For    time.Duration `yaml:"for"`
	Region string        `yaml:"region"`
	Agent  *int          `yaml:"agent"`
	Loss   float64       `yaml:"loss"`
	Links  string        `yaml:"links"`
	// Direction is coordinator_oneway's: "to" or "from" the coordinators.
	Direction string `yaml:"direction"`
	// Down and Up are coordinator_flap's phases.
	Down time.Duration `yaml:"down"`
	Up   time.Duration `yaml:"up"`
	// Prob is duplicate's probability, Delay reorder's largest hold,
	// coordinator_delay's and redis_slow's added delay each way, Jitter
	// their largest extra hold on top of Delay.
	Prob   float64       `yaml:"prob"`
	Delay  time.Duration `yaml:"delay"`
	Jitter time.Duration `yaml:"jitter"`
}

// Fault kinds.
const (
	FaultCoordinatorCut    = "coordinator_cut"
	FaultCoordinatorOneway = "coordinator_oneway"
	FaultCoordinatorFlap   = "coordinator_flap"
	FaultRegionCut         = "region_cut"
	FaultRedisCut          = "redis_cut"
	FaultRedisFailover     = "redis_failover"
	FaultLeaderFailover    = "leader_failover"
	FaultAgentCrash        = "agent_crash"
	FaultLoss              = "loss"
	FaultDuplicate         = "duplicate"
	FaultReorder           = "reorder"
	FaultCoordinatorDelay  = "coordinator_delay"
)

// Links a loss fault applies to.
const (
	LinksAll   = "all"
	LinksWAN   = "wan"
	LinksRedis = "redis"
)

// Failure policies.
const (
	PolicyClosed    = "closed"
	PolicyOpen      = "open"
	PolicyEmergency = "emergency"
)

// LoadScenario reads and validates one scenario file.
func LoadScenario(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sim: read scenario: %w", err)
	}
	sc, err := parseScenario(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return sc, nil
}

// LoadDir reads every *.yaml file in dir, sorted by name.
func LoadDir(dir string) ([]*Scenario, error) {
	names, err := ScenarioFiles(dir)
	if err != nil {
		return nil, err
	}
	var out []*Scenario
	for _, n := range names {
		sc, err := LoadScenario(n)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

// ScenarioFiles lists the *.yaml files in dir, sorted by name; a directory
// with none is an error. The chaos harness reads the same directories.
func ScenarioFiles(dir string) ([]string, error) {
	names, err := filepath.Glob(filepath.Join(dir, "*.yaml"))
	if err != nil {
		return nil, fmt.Errorf("sim: list %s: %w", dir, err)
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("sim: no *.yaml scenarios in %s", dir)
	}
	sort.Strings(names)
	return names, nil
}

// ParseScenario decodes a scenario, rejecting unknown fields (with their
// line), reads the files it names (relative to the working directory),
// fills the defaults and validates it.
func ParseScenario(b []byte) (*Scenario, error) {
	return parseScenario(b, "")
}

// ParseScenarioIn is ParseScenario for a file in dir: the files the
// scenario names are read relative to dir, as LoadScenario reads them.
func ParseScenarioIn(b []byte, dir string) (*Scenario, error) {
	return parseScenario(b, dir)
}

func newDecoder(b []byte) *yaml.Decoder {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	return dec
}

func (sc *Scenario) setDefaults() {
	if sc.Duration == 0 {
		sc.Duration = 60 * time.Second
	}
	if len(sc.Seeds) == 0 {
		sc.Seeds = []uint64{1, 2, 3}
	}
	if sc.Bins == 0 {
		sc.Bins = 240 // enough resolution for a chart, fixed memory
	}
	for i := range sc.Regions {
		if sc.Regions[i].Agents == 0 {
			sc.Regions[i].Agents = 2 // the smallest region with a peer
		}
	}
	c := &sc.Coordinator
	if len(c.Regions) == 0 && len(sc.Regions) > 0 {
		c.Regions = []string{sc.Regions[0].Name}
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 10 * time.Second
	}
	if c.Refresh == 0 {
		c.Refresh = c.LeaseTTL / 5 // several refreshes per TTL survive a lost one
	}
	if c.Drift == 0 {
		c.Drift = 1e-3 // ten times a poor quartz's drift
	}
	if c.Election == 0 {
		c.Election = 2 * time.Second // an etcd election with default timings
	}
	r := &sc.Redis
	if r.Lag == 0 {
		r.Lag = 10 * time.Millisecond
	}
	if r.Failover == 0 {
		r.Failover = 3 * time.Second // Sentinel's detection plus promotion
	}
	if r.OnFailover == "" {
		r.OnFailover = "keep"
	}
	a := &sc.Agent
	bc := breaker.DefaultConfig() // the agent's: region.DefaultConfig takes its breaker from it
	if a.Timeout == 0 {
		a.Timeout = bc.Timeout
	}
	if a.BreakerFailures == 0 {
		a.BreakerFailures = bc.Failures
	}
	if a.BreakerBackoff == 0 {
		a.BreakerBackoff = bc.Backoff
	}
	if a.BatchWindow == 0 {
		a.BatchWindow = 20 * time.Millisecond // a few tens of ms of demand
	}
	if a.BatchMaxFraction == 0 {
		a.BatchMaxFraction = 0.1
	}
	if a.BatchTTL == 0 {
		a.BatchTTL = 100 * time.Millisecond
	}
	bl := &sc.Baselines
	if bl.Central == "" && len(sc.Regions) > 0 {
		bl.Central = sc.Regions[0].Name
	}
	if bl.AsyncOwner == "" && len(sc.Regions) > 0 {
		bl.AsyncOwner = sc.Regions[0].Name
	}
	if bl.AsyncSync == 0 {
		bl.AsyncSync = 100 * time.Millisecond // Gubernator's GlobalSyncWait order
	}
	for i := range sc.Rules {
		ru := &sc.Rules[i]
		if ru.Burst == 0 {
			ru.Burst = ru.Count
		}
		if ru.Keys == 0 {
			ru.Keys = 1
		}
		if ru.Policy == "" {
			ru.Policy = PolicyClosed
		}
	}
	for i := range sc.Faults {
		if f := &sc.Faults[i]; f.Kind == FaultLoss && f.Links == "" {
			f.Links = LinksAll
		}
	}
	for i := range sc.Traffic {
		t := &sc.Traffic[i]
		if t.Kind == "" {
			t.Kind = "poisson"
		}
		if t.Kind == "bursty" {
			if t.BurstFactor == 0 {
				t.BurstFactor = 5
			}
			if t.BurstOn == 0 {
				t.BurstOn = time.Second
			}
			if t.BurstOff == 0 {
				t.BurstOff = 4 * time.Second
			}
		}
		if t.Stop == 0 {
			t.Stop = sc.Duration
		}
	}
}

// regionIndex returns the index of the named region, or −1.
func (sc *Scenario) regionIndex(name string) int {
	for i, r := range sc.Regions {
		if r.Name == name {
			return i
		}
	}
	return -1
}

func (sc *Scenario) ruleIndex(name string) int {
	for i, r := range sc.Rules {
		if r.Name == name {
			return i
		}
	}
	return -1
}

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrScenario}, args...)...)
}

// Validate reports the first thing wrong with the scenario, naming the field
// and its value.
func (sc *Scenario) Validate() error {
	if sc.Name == "" {
		return bad("name is empty")
	}
	if sc.Duration <= 0 || sc.Duration%time.Microsecond != 0 {
		return bad("duration=%s must be > 0 and whole microseconds", sc.Duration)
	}
	if sc.Bins < 1 || sc.Bins > 100000 {
		return bad("bins=%d must be in [1, 100000]", sc.Bins)
	}
	if len(sc.Regions) == 0 {
		return bad("regions is empty")
	}
	if len(sc.Regions) > 255 {
		return bad("regions has %d entries, at most 255", len(sc.Regions))
	}
	if len(sc.Rules) > 65535 {
		return bad("rules has %d entries, at most 65535", len(sc.Rules))
	}
	seen := map[string]bool{}
	for i, r := range sc.Regions {
		switch {
		case r.Name == "" || strings.ContainsAny(r.Name, " /"):
			return bad("regions[%d].name=%q must be non-empty without spaces or slashes", i, r.Name)
		case seen[r.Name]:
			return bad("regions[%d].name=%q is duplicated", i, r.Name)
		case r.Agents < 1 || r.Agents > 1000:
			return bad("regions[%d].agents=%d must be in [1, 1000]", i, r.Agents)
		case r.Drift <= -0.1 || r.Drift >= 0.1:
			return bad("regions[%d].drift=%v must be in (-0.1, 0.1)", i, r.Drift)
		case r.RedisDrift <= -0.1 || r.RedisDrift >= 0.1:
			return bad("regions[%d].redis_drift=%v must be in (-0.1, 0.1)", i, r.RedisDrift)
		}
		seen[r.Name] = true
	}
	for from, row := range sc.Latency {
		if !seen[from] {
			return bad("latency: unknown region %q", from)
		}
		for to, d := range row {
			if !seen[to] {
				return bad("latency.%s: unknown region %q", from, to)
			}
			if d < 0 {
				return bad("latency.%s.%s=%s must be ≥ 0", from, to, d)
			}
		}
	}
	for _, a := range sc.Regions {
		for _, b := range sc.Regions {
			if _, ok := sc.oneWay(a.Name, b.Name); !ok && a.Name != b.Name {
				return bad("latency: no entry for %s→%s or %s→%s", a.Name, b.Name, b.Name, a.Name)
			}
		}
	}
	if sc.Jitter < 0 || sc.Jitter > 10 {
		return bad("jitter=%v must be in [0, 10]", sc.Jitter)
	}
	if sc.Loss < 0 || sc.Loss >= 1 {
		return bad("loss=%v must be in [0, 1)", sc.Loss)
	}
	c := sc.Coordinator
	for i, r := range c.Regions {
		if !seen[r] {
			return bad("coordinator.regions[%d]=%q is not a region", i, r)
		}
	}
	if c.Refresh <= 0 || c.LeaseTTL <= c.Refresh {
		return bad("coordinator.refresh=%s must be > 0 and below lease_ttl=%s", c.Refresh, c.LeaseTTL)
	}
	if c.Drift < 0 || c.Drift >= 0.1 {
		return bad("coordinator.drift=%v must be in [0, 0.1)", c.Drift)
	}
	if err := sc.LeaseConfig().Validate(); err != nil {
		return bad("coordinator: lease_ttl=%s refresh=%s drift=%v: %w", c.LeaseTTL, c.Refresh, c.Drift, err)
	}
	for i, e := range sc.Expect.Shares {
		switch {
		case !seen[e.Region]:
			return bad("expect.shares[%d].region=%q is not a region", i, e.Region)
		case e.Rule != "" && sc.ruleIndex(e.Rule) < 0:
			return bad("expect.shares[%d].rule=%q is not a rule", i, e.Rule)
		case e.After < 0 || e.Within <= 0 || e.After+e.Within > sc.Duration:
			return bad("expect.shares[%d]: after=%s and within=%s must lie inside duration=%s", i, e.After, e.Within, sc.Duration)
		case e.AtLeast <= 0 || e.AtLeast > 1:
			return bad("expect.shares[%d].at_least=%v must be in (0, 1]", i, e.AtLeast)
		}
	}
	if sc.Redis.Lag < 0 {
		return bad("redis.lag=%s must be ≥ 0", sc.Redis.Lag)
	}
	if sc.Redis.OnFailover != "keep" && sc.Redis.OnFailover != "empty" {
		return bad("redis.on_failover=%q must be keep or empty", sc.Redis.OnFailover)
	}
	a := sc.Agent
	if a.Timeout <= 0 || a.BreakerFailures < 1 || a.BreakerBackoff <= 0 {
		return bad("agent: timeout=%s, breaker_failures=%d and breaker_backoff=%s must be > 0",
			a.Timeout, a.BreakerFailures, a.BreakerBackoff)
	}
	if a.BatchMaxFraction <= 0 || a.BatchMaxFraction > 1 {
		return bad("agent.batch_max_fraction=%v must be in (0, 1]", a.BatchMaxFraction)
	}
	if a.BatchWindow <= 0 || a.BatchTTL <= 0 {
		return bad("agent: batch_window=%s and batch_ttl=%s must be > 0", a.BatchWindow, a.BatchTTL)
	}
	if !seen[sc.Baselines.Central] {
		return bad("baselines.central=%q is not a region", sc.Baselines.Central)
	}
	if !seen[sc.Baselines.AsyncOwner] {
		return bad("baselines.async_owner=%q is not a region", sc.Baselines.AsyncOwner)
	}
	if sc.Baselines.AsyncSync <= 0 {
		return bad("baselines.async_sync=%s must be > 0", sc.Baselines.AsyncSync)
	}
	if len(sc.Rules) == 0 {
		return bad("rules is empty")
	}
	rules := map[string]bool{}
	for i, r := range sc.Rules {
		switch {
		case r.Name == "" || rules[r.Name]:
			return bad("rules[%d].name=%q must be non-empty and unique", i, r.Name)
		case r.Count <= 0:
			return bad("rules[%d].count=%d must be > 0", i, r.Count)
		case r.Period <= 0 || r.Period%time.Microsecond != 0:
			return bad("rules[%d].period=%s must be > 0 and whole microseconds", i, r.Period)
		case r.Burst <= 0:
			return bad("rules[%d].burst=%d must be > 0", i, r.Burst)
		case r.Keys < 1 || r.Keys > 10_000_000:
			return bad("rules[%d].keys=%d must be in [1, 10000000]", i, r.Keys)
		case r.Policy != PolicyClosed && r.Policy != PolicyOpen && r.Policy != PolicyEmergency:
			return bad("rules[%d].policy=%q must be closed, open or emergency", i, r.Policy)
		case r.Reserve < 0 || r.Reserve >= 1:
			return bad("rules[%d].reserve=%v must be in [0, 1)", i, r.Reserve)
		}
		if err := r.validateSplit(i, len(sc.Regions)); err != nil {
			return err
		}
		rules[r.Name] = true
	}
	for i, t := range sc.Traffic {
		switch {
		case !seen[t.Region]:
			return bad("traffic[%d].region=%q is not a region", i, t.Region)
		case !rules[t.Rule]:
			return bad("traffic[%d].rule=%q is not a rule", i, t.Rule)
		case t.Rate <= 0 || t.Rate > 1e8:
			return bad("traffic[%d].rate=%v must be in (0, 1e8]", i, t.Rate)
		case t.Kind != "poisson" && t.Kind != "bursty":
			return bad("traffic[%d].kind=%q must be poisson or bursty", i, t.Kind)
		case t.Kind == "bursty" && (t.BurstFactor < 1 || t.BurstOn <= 0 || t.BurstOff < 0):
			return bad("traffic[%d]: burst_factor=%v must be ≥ 1 and burst_on=%s > 0", i, t.BurstFactor, t.BurstOn)
		case t.Zipf != 0 && t.Zipf <= 1:
			return bad("traffic[%d].zipf=%v must be > 1 (or 0 for uniform)", i, t.Zipf)
		case t.Start < 0 || t.Stop <= t.Start:
			return bad("traffic[%d]: start=%s must be ≥ 0 and below stop=%s", i, t.Start, t.Stop)
		}
		ru := sc.Rules[sc.ruleIndex(t.Rule)]
		if t.Key != nil && (*t.Key < 0 || *t.Key >= ru.Keys) {
			return bad("traffic[%d].key=%d must be in [0, %d)", i, *t.Key, ru.Keys)
		}
		if c := t.Cycle; c != nil && (c.Period <= 0 || c.On <= 0 || c.On > c.Period || c.Phase < 0 ||
			c.Period%time.Microsecond != 0 || c.On%time.Microsecond != 0 || c.Phase%time.Microsecond != 0) {
			return bad("traffic[%d].cycle: period=%s, on=%s and phase=%s must be whole microseconds with 0 < on ≤ period and phase ≥ 0", i, c.Period, c.On, c.Phase)
		}
		if d := t.Diurnal; d != nil && (d.Amplitude < 0 || d.Amplitude > 1 || d.Period <= 0) {
			return bad("traffic[%d].diurnal: amplitude=%v must be in [0, 1] and period=%s > 0", i, d.Amplitude, d.Period)
		}
		for j, cs := range t.Cost {
			if cs.Value <= 0 || cs.Value > ru.Burst || cs.Weight <= 0 {
				return bad("traffic[%d].cost[%d]: value=%d must be in [1, burst=%d] and weight=%v > 0",
					i, j, cs.Value, ru.Burst, cs.Weight)
			}
		}
	}
	for i, f := range sc.Faults {
		if f.At < 0 || f.For < 0 {
			return bad("faults[%d]: at=%s and for=%s must be ≥ 0", i, f.At, f.For)
		}
		if f.Jitter < 0 {
			return bad("faults[%d].jitter=%s must be ≥ 0", i, f.Jitter)
		}
		needRegion := true
		switch f.Kind {
		case FaultCoordinatorCut, FaultRegionCut, FaultRedisCut, FaultAgentCrash:
			if f.For <= 0 {
				return bad("faults[%d].for=%s must be > 0 for %s", i, f.For, f.Kind)
			}
		case FaultRedisSlow:
			if f.For <= 0 || f.Delay < 0 || f.Loss < 0 || f.Loss >= 1 || (f.Delay == 0 && f.Loss == 0) {
				return bad("faults[%d]: redis_slow needs for > 0, delay=%s ≥ 0 and loss=%v in [0, 1), not both zero", i, f.Delay, f.Loss)
			}
		case FaultCoordinatorOneway:
			if f.Direction != "to" && f.Direction != "from" {
				return bad("faults[%d].direction=%q must be to or from", i, f.Direction)
			}
			if f.For <= 0 {
				return bad("faults[%d].for=%s must be > 0 for %s", i, f.For, f.Kind)
			}
		case FaultCoordinatorFlap:
			if f.For <= 0 || f.Down <= 0 || f.Up <= 0 {
				return bad("faults[%d]: for=%s, down=%s and up=%s must be > 0 for %s", i, f.For, f.Down, f.Up, f.Kind)
			}
		case FaultDuplicate, FaultReorder:
			needRegion = f.Region != ""
			if f.For <= 0 {
				return bad("faults[%d].for=%s must be > 0 for %s", i, f.For, f.Kind)
			}
			if f.Kind == FaultDuplicate && (f.Prob <= 0 || f.Prob > 1) {
				return bad("faults[%d].prob=%v must be in (0, 1]", i, f.Prob)
			}
			if f.Kind == FaultReorder && f.Delay <= 0 {
				return bad("faults[%d].delay=%s must be > 0", i, f.Delay)
			}
		case FaultCoordinatorDelay:
			needRegion = f.Region != ""
			if f.For <= 0 {
				return bad("faults[%d].for=%s must be > 0 for %s", i, f.For, f.Kind)
			}
			if f.Delay <= 0 {
				return bad("faults[%d].delay=%s must be > 0 for %s", i, f.Delay, f.Kind)
			}
		case FaultRedisFailover:
		case FaultLeaderFailover:
			needRegion = false
			if len(sc.Coordinator.Regions) < 2 {
				return bad("faults[%d]: leader_failover needs coordinator.regions with ≥ 2 entries", i)
			}
		case FaultLoss:
			needRegion = false
			if f.Loss <= 0 || f.Loss >= 1 || f.For <= 0 {
				return bad("faults[%d]: loss=%v must be in (0, 1) with for > 0", i, f.Loss)
			}
			if f.Links != LinksAll && f.Links != LinksWAN && f.Links != LinksRedis {
				return bad("faults[%d].links=%q must be all, wan or redis", i, f.Links)
			}
		default:
			return bad("faults[%d].kind=%q is not a known fault", i, f.Kind)
		}
		if needRegion && !seen[f.Region] {
			return bad("faults[%d].region=%q is not a region", i, f.Region)
		}
		if f.Agent != nil {
			ri := sc.regionIndex(f.Region)
			if ri < 0 || *f.Agent < 0 || *f.Agent >= sc.Regions[ri].Agents {
				return bad("faults[%d].agent=%d is not an agent of region %q", i, *f.Agent, f.Region)
			}
		}
	}
	return nil
}

// LeaseConfig is the lease protocol's configuration for the scenario,
// without budgets: the TTL and refresh it gives, the Drift whose margin
// covers its relative drift (lease.DriftFor), a hold of twice the TTL as
// in lease.DefaultConfig (and at least half a refresh interval above the
// least the protocol allows), and a demand TTL of two refresh intervals
// and a third. The simulator and the chaos harness both run the protocol
// with it. A lend stays committed only while acknowledgements come back
// within the hold's slack over that least (docs/design.md, "redis-slow
// traced").
func (sc *Scenario) LeaseConfig() lease.Config {
	c := sc.Coordinator
	cfg := lease.DefaultConfig()
	cfg.TTL, cfg.Refresh = c.LeaseTTL, c.Refresh
	cfg.Drift = lease.DriftFor(c.LeaseTTL, c.Drift)
	// Hold less its margin (Drift×Hold/TTL) must exceed TTL+Drift+Refresh.
	need := float64(cfg.TTL+cfg.Drift+cfg.Refresh+cfg.Refresh/2) / (1 - float64(cfg.Drift)/float64(max(cfg.TTL, 1)))
	cfg.Hold = max(2*cfg.TTL, time.Duration(math.Ceil(need/float64(time.Millisecond)))*time.Millisecond)
	cfg.DemandTTL = 2*cfg.Refresh + cfg.Refresh/3
	return cfg
}

// oneWay returns the one-way latency from a to b.
func (sc *Scenario) oneWay(a, b string) (time.Duration, bool) {
	if d, ok := sc.Latency[a][b]; ok {
		return d, true
	}
	if d, ok := sc.Latency[b][a]; ok {
		return d, true
	}
	if a == b {
		return 500 * time.Microsecond, true // same-zone round trip is ~1 ms
	}
	return 0, false
}

// Scaled returns a copy of sc with every traffic rate and every budget
// (count and burst) multiplied by f, keeping the timeline: the same
// scenario with f times the load, for quick runs under the race detector.
// Costs are capped at the scaled burst.
func (sc *Scenario) Scaled(f float64) (*Scenario, error) {
	if f <= 0 || f > 1000 {
		return nil, bad("scale=%v must be in (0, 1000]", f)
	}
	c := *sc
	c.Rules = append([]RuleSpec(nil), sc.Rules...)
	c.Traffic = append([]TrafficSpec(nil), sc.Traffic...)
	c.Faults = append([]FaultSpec(nil), sc.Faults...)
	c.Replay = append([]ReplaySpec(nil), sc.Replay...)
	for i := range c.Replay {
		c.Replay[i].Scale *= f
	}
	for i := range c.Rules {
		r := &c.Rules[i]
		r.Count = max(int64(float64(r.Count)*f), 1)
		r.Burst = max(int64(float64(r.Burst)*f), 1)
	}
	for i := range c.Traffic {
		t := &c.Traffic[i]
		t.Rate *= f
		burst := c.Rules[c.ruleIndex(t.Rule)].Burst
		t.Cost = append([]CostSpec(nil), t.Cost...)
		for j := range t.Cost {
			t.Cost[j].Value = min(t.Cost[j].Value, burst)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// TightBurst is the largest burst, in seconds of rate, of a scenario's
// tight form.
const TightBurst = 100 * time.Millisecond

// Tight returns sc's tight form, named with a "-tight" suffix: every
// rule's burst cut to at most TightBurst of its rate (at least one token),
// costs capped at it, the rest unchanged. A burst of a second of rate
// absorbs any leak shorter than a second; the tight form shows leaks a
// tenth as long.
func (sc *Scenario) Tight() (*Scenario, error) {
	c := *sc
	c.Name = sc.Name + "-tight"
	c.Rules = append([]RuleSpec(nil), sc.Rules...)
	c.Traffic = append([]TrafficSpec(nil), sc.Traffic...)
	for i := range c.Rules {
		r := &c.Rules[i]
		b := int64(float64(r.Count) * TightBurst.Seconds() / r.Period.Seconds())
		r.Burst = max(min(r.Burst, b), 1)
	}
	for i := range c.Traffic {
		t := &c.Traffic[i]
		burst := c.Rules[c.ruleIndex(t.Rule)].Burst
		t.Cost = append([]CostSpec(nil), t.Cost...)
		for j := range t.Cost {
			t.Cost[j].Value = min(t.Cost[j].Value, burst)
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// WithMaxKeys returns a copy of sc with at most n keys per rule, for quick
// runs: an agent's periodic work grows with the keys it tracks. Traffic
// pinned to a key beyond n is pinned to key n−1.
func (sc *Scenario) WithMaxKeys(n int) (*Scenario, error) {
	if n < 1 {
		return nil, bad("max keys=%d must be ≥ 1", n)
	}
	c := *sc
	c.Rules = append([]RuleSpec(nil), sc.Rules...)
	c.Traffic = append([]TrafficSpec(nil), sc.Traffic...)
	for i := range c.Rules {
		c.Rules[i].Keys = min(c.Rules[i].Keys, n)
	}
	for i := range c.Traffic {
		if k := c.Traffic[i].Key; k != nil && *k >= n {
			v := n - 1
			c.Traffic[i].Key = &v
		}
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}
