package chaos

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/allot-dev/allot/sim"
)

// ErrScenario wraps every error about a scenario's chaos settings or about a
// part of the simulator's scenario the harness cannot reproduce.
var ErrScenario = errors.New("chaos: invalid scenario")

// Scenario is one scenario file: the simulator's scenario, read by the
// simulator's own parser, and the harness's block.
type Scenario struct {
	// Path is the file the scenario was read from.
	Path string
	// Sim is the simulator's scenario (its chaos block is Block).
	Sim *sim.Scenario
	// Block is the chaos block with its defaults filled in.
	Block Block
	// Faults is every fault the harness injects, sorted by At: the
	// simulator's (Sim true) and the harness's own.
	Faults []Fault
}

// Block is the chaos block of a scenario file.
type Block struct {
	// Expect is the verdict expected today: "pass" (default) or "fail",
	// a known failure, with Reason saying which.
	Expect string `yaml:"expect"`
	Reason string `yaml:"reason"`
	// Coordinators is 3 (HA on a real etcd, the default) or 1
	// (standalone, budgets from a file).
	Coordinators int `yaml:"coordinators"`
	// Sentinel lists regions whose Redis has a replica and three
	// sentinels; their agents use Sentinel.
	Sentinel []string `yaml:"sentinel"`
	// LeaderRestart restarts a coordinator killed by leader_failover this
	// long after the kill (0: it stays down, as in the simulator).
	LeaderRestart time.Duration `yaml:"leader_restart"`
	// WAN applies the scenario's latency matrix (one way, with its jitter)
	// to every agent's coordinator links through the proxies. Default true.
	WAN *bool `yaml:"wan"`
	// Faults are faults only the harness injects; the simulator does not
	// see them.
	Faults []Fault `yaml:"faults"`
	// Checks adds checks to those every run makes: "no_false_outage" (no
	// breaker opens outside a Redis fault) and "convergence" (every demand
	// shift converges within ConvergeWithin).
	Checks []string `yaml:"checks"`
	// RecoverWithin bounds the time from the end of a Redis fault until the
	// region's allocation is back at 95% of its fair share (default one
	// second plus three refresh intervals).
	RecoverWithin time.Duration `yaml:"recover_within"`
	// EmergencyStopWithin bounds the time from the end of a Redis fault
	// until the region's agents stop admitting on the emergency path
	// (default one second).
	EmergencyStopWithin time.Duration `yaml:"emergency_stop_within"`
	// ConvergeWithin is the convergence target (default three refresh
	// intervals).
	ConvergeWithin time.Duration `yaml:"converge_within"`
}

// Fault is one fault on the run's timeline, active from At for For.
type Fault struct {
	// Kind is one of the simulator's (coordinator_cut, region_cut,
	// redis_cut, redis_failover, leader_failover, agent_crash,
	// coordinator_delay, coordinator_oneway) or one of the harness's own:
	//
	//	coordinator_kill    kill -9 the coordinator leader (standalone too); restart after For (0: never)
	//	redis_kill          kill -9 the region's Redis primary; restart it after For (standalone: empty)
	//	speaker_kill        kill -9 the region's speaking agent; restart after For (0: never)
	//	redis_delay         add Delay (+ up to Jitter) each way on the links of the region's agents (or Agent) to Redis;
	//	                    the simulator's redis_slow with loss 0 is the same fault, and both run it
	//	coordinator_delay   the same on the region's links to every coordinator; in the
	//	                    scenario's faults rather than the chaos block, the simulator runs it too
	//	coordinator_oneway  drop the bytes of one Direction ("to" or "from" the coordinators) on the region's links;
	//	                    in the scenario's faults rather than the chaos block, the simulator runs it too
	//	gossip_split        the region's agents do not see each other from the start (At 0) for For
	Kind   string        `yaml:"kind"`
	At     time.Duration `yaml:"at"`
	For    time.Duration `yaml:"for"`
	Region string        `yaml:"region"`
	Agent  *int          `yaml:"agent"`
	Delay  time.Duration `yaml:"delay"`
	Jitter time.Duration `yaml:"jitter"`
	// Direction is "to" (agents' reports and acknowledgements lost) or
	// "from" (grants lost), for coordinator_oneway.
	Direction string `yaml:"direction"`

	// Sim is true for a fault from the simulator's timeline.
	Sim bool `yaml:"-"`
	// loss is a simulator's redis_slow's share of failed calls, which the
	// harness refuses (its proxies delay bytes; they cannot fail a call).
	loss float64
	// Index is the fault's place in Scenario.Faults.
	Index int `yaml:"-"`
}

// End is when the fault is healed (At for an instantaneous fault that is
// never undone).
func (f Fault) End() time.Duration { return f.At + f.For }

// Name is a short label: kind, region, agent.
func (f Fault) Name() string {
	s := f.Kind
	if f.Region != "" {
		s += " " + f.Region
	}
	if f.Agent != nil {
		s += fmt.Sprintf("/%d", *f.Agent)
	}
	return s
}

// Fault kinds the harness adds to the simulator's.
const (
	FaultCoordinatorKill   = "coordinator_kill"
	FaultRedisKill         = "redis_kill"
	FaultSpeakerKill       = "speaker_kill"
	FaultRedisDelay        = "redis_delay"
	FaultCoordinatorDelay  = sim.FaultCoordinatorDelay
	FaultCoordinatorOneway = sim.FaultCoordinatorOneway
	FaultGossipSplit       = "gossip_split"
)

// Check names a scenario may add.
const (
	CheckNoFalseOutage = "no_false_outage"
	CheckConvergence   = "convergence"
)

// Expectations.
const (
	ExpectPass = "pass"
	ExpectFail = "fail"
)

func bad(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrScenario}, args...)...)
}

// Load reads one scenario file: the simulator's parser reads the scenario
// (so the simulator accepts every file the harness runs), then the chaos
// block is decoded with unknown fields rejected and validated.
func Load(path string) (*Scenario, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("chaos: read scenario: %w", err)
	}
	sc, err := parse(b, filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	sc.Path = path
	return sc, nil
}

// LoadDir reads every *.yaml file in dir, sorted by name.
func LoadDir(dir string) ([]*Scenario, error) {
	names, err := sim.ScenarioFiles(dir)
	if err != nil {
		return nil, fmt.Errorf("chaos: %w", err)
	}
	var out []*Scenario
	for _, n := range names {
		sc, err := Load(n)
		if err != nil {
			return nil, err
		}
		out = append(out, sc)
	}
	return out, nil
}

// Parse decodes and validates a scenario file's content; the files it
// names are read relative to the working directory.
func Parse(b []byte) (*Scenario, error) {
	return parse(b, "")
}

// parse is Parse with the files the scenario names read relative to dir.
func parse(b []byte, dir string) (*Scenario, error) {
	ss, err := sim.ParseScenarioIn(b, dir)
	if err != nil {
		return nil, err
	}
	sc := &Scenario{Sim: ss}
	if ss.Chaos.Kind != 0 {
		// The block is re-encoded and decoded strictly: yaml.Node.Decode
		// does not reject unknown fields. Line numbers in errors count
		// from the block's first line.
		raw, err := yaml.Marshal(&ss.Chaos)
		if err != nil {
			return nil, fmt.Errorf("%w: chaos: %w", ErrScenario, err)
		}
		dec := yaml.NewDecoder(bytes.NewReader(raw))
		dec.KnownFields(true)
		if err := dec.Decode(&sc.Block); err != nil {
			return nil, fmt.Errorf("%w: chaos block (from line %d): %w", ErrScenario, ss.Chaos.Line, err)
		}
	}
	sc.setDefaults()
	if err := sc.validate(); err != nil {
		return nil, err
	}
	return sc, nil
}

func (sc *Scenario) setDefaults() {
	b := &sc.Block
	if b.Expect == "" {
		b.Expect = ExpectPass
	}
	if b.Coordinators == 0 {
		b.Coordinators = 3
	}
	if b.WAN == nil {
		t := true
		b.WAN = &t
	}
	refresh := sc.Sim.Coordinator.Refresh
	if b.RecoverWithin == 0 {
		b.RecoverWithin = time.Second + 3*refresh
	}
	if b.EmergencyStopWithin == 0 {
		b.EmergencyStopWithin = time.Second
	}
	if b.ConvergeWithin == 0 {
		b.ConvergeWithin = 3 * refresh
	}
	sc.Faults = sc.Faults[:0]
	for _, f := range sc.Sim.Faults {
		sc.Faults = append(sc.Faults, Fault{Kind: f.Kind, At: f.At, For: f.For, Region: f.Region, Agent: f.Agent, Delay: f.Delay, Jitter: f.Jitter, Direction: f.Direction, loss: f.Loss, Sim: true})
	}
	sc.Faults = append(sc.Faults, b.Faults...)
	sort.SliceStable(sc.Faults, func(i, j int) bool { return sc.Faults[i].At < sc.Faults[j].At })
	for i := range sc.Faults {
		sc.Faults[i].Index = i
	}
}

// validate reports the first thing the harness cannot do with the
// scenario, naming the field and its value.
func (sc *Scenario) validate() error {
	s, b := sc.Sim, sc.Block
	switch {
	case b.Expect != ExpectPass && b.Expect != ExpectFail:
		return bad("chaos.expect=%q must be pass or fail", b.Expect)
	case b.Expect == ExpectFail && strings.TrimSpace(b.Reason) == "":
		return bad("chaos.reason is empty: a known failure says which")
	case b.Coordinators != 1 && b.Coordinators != 3:
		return bad("chaos.coordinators=%d must be 1 (standalone) or 3 (HA on etcd)", b.Coordinators)
	case b.LeaderRestart < 0:
		return bad("chaos.leader_restart=%s must be ≥ 0", b.LeaderRestart)
	case b.RecoverWithin < 0 || b.EmergencyStopWithin < 0 || b.ConvergeWithin < 0:
		return bad("chaos: recover_within=%s, emergency_stop_within=%s and converge_within=%s must be ≥ 0",
			b.RecoverWithin, b.EmergencyStopWithin, b.ConvergeWithin)
	case s.Duration > 10*time.Minute:
		return bad("duration=%s: the harness runs at most 10m of real time", s.Duration)
	case s.Loss > 0:
		return bad("loss=%v: a TCP proxy cannot lose single messages inside a stream", s.Loss)
	case len(s.Regions) > 5:
		return bad("regions has %d entries: the harness starts at most 5 on one machine", len(s.Regions))
	case len(s.Rules) > math.MaxInt16+1:
		return bad("rules has %d entries: the history records a rule's index in 16 bits, at most %d", len(s.Rules), math.MaxInt16+1)
	}
	for _, c := range b.Checks {
		if c != CheckNoFalseOutage && c != CheckConvergence {
			return bad("chaos.checks: %q is not a check (want %s or %s)", c, CheckNoFalseOutage, CheckConvergence)
		}
	}
	regions := map[string]int{}
	for i, r := range s.Regions {
		regions[r.Name] = i
		switch {
		case r.Agents > 4:
			return bad("regions[%d].agents=%d: the harness starts at most 4 agents a region", i, r.Agents)
		case r.Skew != 0 || r.Drift != 0 || r.RedisSkew != 0 || r.RedisDrift != 0 || r.ReplicaSkew != 0:
			return bad("regions[%d] (%s): clock skew and drift cannot be given to real processes sharing one clock", i, r.Name)
		}
	}
	for i, r := range b.Sentinel {
		if _, ok := regions[r]; !ok {
			return bad("chaos.sentinel[%d]=%q is not a region", i, r)
		}
	}
	reserve := s.Rules[0].Reserve
	for i, r := range s.Rules {
		switch {
		case r.Reserve != reserve:
			return bad("rules[%d].reserve=%v: every rule must have the same reserve (%v), as agents take one -reserve", i, r.Reserve, reserve)
		case r.Period%time.Millisecond != 0:
			return bad("rules[%d].period=%s must be whole milliseconds (the rules file's quota syntax)", i, r.Period)
		case r.Keys > 1000:
			return bad("rules[%d].keys=%d: the harness drives at most 1000 keys a rule", i, r.Keys)
		}
	}
	var offered float64
	for i, t := range s.Traffic {
		switch {
		case t.Kind != "poisson":
			return bad("traffic[%d].kind=%q: the harness sends poisson streams only", i, t.Kind)
		case t.Diurnal != nil:
			return bad("traffic[%d].diurnal: the harness sends streams at a constant rate", i)
		}
		offered += t.Rate
	}
	if offered > 5000 {
		return bad("traffic: %.0f requests a second in all: the harness offers at most 5000 (real processes on one machine)", offered)
	}
	if s.Agent.BatchTTL != agentBatchTTL {
		return bad("agent.batch_ttl=%s: the agent binary has no flag for it and uses %s", s.Agent.BatchTTL, agentBatchTTL)
	}
	for _, f := range sc.Faults {
		where := fmt.Sprintf("faults (%s at %s)", f.Kind, f.At)
		if !f.Sim {
			where = fmt.Sprintf("chaos.faults (%s at %s)", f.Kind, f.At)
		}
		ri, regionOK := regions[f.Region]
		if f.At < 0 || f.For < 0 || f.Delay < 0 || f.Jitter < 0 {
			return bad("%s: at=%s, for=%s, delay=%s and jitter=%s must be ≥ 0", where, f.At, f.For, f.Delay, f.Jitter)
		}
		if f.End() > s.Duration {
			return bad("%s: ends at %s, after duration=%s", where, f.End(), s.Duration)
		}
		if f.Agent != nil && (!regionOK || *f.Agent < 0 || *f.Agent >= s.Regions[ri].Agents) {
			return bad("%s: agent=%d is not an agent of region %q", where, *f.Agent, f.Region)
		}
		needRegion := true
		switch f.Kind {
		case sim.FaultCoordinatorCut, sim.FaultRegionCut, sim.FaultAgentCrash:
		case sim.FaultRedisCut:
			if slices.Contains(b.Sentinel, f.Region) {
				return bad("%s: redis_cut in a Sentinel region is not supported (the proxies also carry the sentinels' links)", where)
			}
		case sim.FaultRedisFailover:
			if !slices.Contains(b.Sentinel, f.Region) {
				return bad("%s: redis_failover needs region %q in chaos.sentinel (a replica to promote)", where, f.Region)
			}
		case sim.FaultLeaderFailover:
			needRegion = false
			if b.Coordinators < 2 {
				return bad("%s: leader_failover needs chaos.coordinators=3", where)
			}
		case FaultCoordinatorKill:
			needRegion = false
		case FaultRedisKill, FaultSpeakerKill:
		case FaultRedisDelay, FaultCoordinatorDelay, sim.FaultRedisSlow:
			if f.Delay <= 0 || f.For <= 0 {
				return bad("%s: delay=%s and for=%s must be > 0", where, f.Delay, f.For)
			}
			if f.Kind != FaultCoordinatorDelay && slices.Contains(b.Sentinel, f.Region) {
				return bad("%s: %s in a Sentinel region is not supported", where, f.Kind)
			}
			if f.loss != 0 {
				return bad("%s: loss=%v: a TCP proxy delays a call's bytes but cannot fail the call; the harness runs redis_slow with loss 0", where, f.loss)
			}
		case FaultCoordinatorOneway:
			if f.Direction != "to" && f.Direction != "from" {
				return bad("%s: direction=%q must be to or from", where, f.Direction)
			}
			if f.For <= 0 {
				return bad("%s: for=%s must be > 0", where, f.For)
			}
		case FaultGossipSplit:
			if f.At != 0 || f.For <= 0 {
				return bad("%s: at=%s must be 0 and for > 0: memberlist talks to the address a peer advertises, so the harness can split a region only from its start", where, f.At)
			}
			if s.Regions[ri].Agents < 2 {
				return bad("%s: region %q has one agent", where, f.Region)
			}
		case sim.FaultLoss:
			return bad("%s: a TCP proxy cannot lose single messages inside a stream", where)
		default:
			return bad("%s: kind=%q is not a fault the harness knows", where, f.Kind)
		}
		if needRegion && !regionOK {
			return bad("%s: region=%q is not a region", where, f.Region)
		}
		if f.Kind == sim.FaultCoordinatorCut || f.Kind == sim.FaultRegionCut || f.Kind == sim.FaultRedisCut ||
			f.Kind == sim.FaultAgentCrash {
			if f.For <= 0 {
				return bad("%s: for=%s must be > 0", where, f.For)
			}
		}
	}
	return nil
}

// HarnessOnly lists the faults the simulator does not run.
func (sc *Scenario) HarnessOnly() []Fault {
	var out []Fault
	for _, f := range sc.Faults {
		if !f.Sim {
			out = append(out, f)
		}
	}
	return out
}

// Has reports whether the scenario asks for check c.
func (sc *Scenario) Has(c string) bool { return slices.Contains(sc.Block.Checks, c) }

// Name is the scenario's name.
func (sc *Scenario) Name() string { return sc.Sim.Name }

// Reserve is the share of every budget kept out of floors.
func (sc *Scenario) Reserve() float64 { return sc.Sim.Rules[0].Reserve }

// rate returns rule r's rate in tokens per second and its burst.
func ruleRate(r sim.RuleSpec) (rate, burst float64) {
	return float64(r.Count) / r.Period.Seconds(), float64(r.Burst)
}

// quota writes rule r's limit in the rules file's syntax.
func quota(r sim.RuleSpec) string {
	ms := r.Period.Milliseconds()
	if ms%1000 == 0 {
		return fmt.Sprintf("%d per %d seconds, burst %d", r.Count, ms/1000, r.Burst)
	}
	return fmt.Sprintf("%d per %d ms, burst %d", r.Count, ms, r.Burst)
}

// leaseTimings derives the lease configuration from the scenario exactly as
// the simulator does (sim/leaseplane.go), so both run the same protocol
// timings.
func leaseTimings(s *sim.Scenario) (ttl, refresh, drift, hold, demandTTL time.Duration) {
	c := s.LeaseConfig()
	return c.TTL, c.Refresh, c.Drift, c.Hold, c.DemandTTL
}

// sessionTTL is the coordinators' etcd session TTL in whole seconds: the
// simulator's election time, at least one second.
func sessionTTL(s *sim.Scenario) int {
	return max(1, int(math.Ceil(s.Coordinator.Election.Seconds())))
}
