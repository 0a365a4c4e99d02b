package chaos

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/agent"
	"github.com/allot-dev/allot/sim"
)

// TestScenarioFilesLoad reads every scenario file with the harness's
// parser and the simulator's (the same files drive both), and checks the
// known failures say why.
func TestScenarioFilesLoad(t *testing.T) {
	for _, dir := range []string{"scenarios", "scenarios/short"} {
		scs, err := LoadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, sc := range scs {
			if _, err := sim.LoadScenario(sc.Path); err != nil {
				t.Errorf("%s: the simulator rejects it: %v", sc.Path, err)
			}
			if sc.Block.Expect == ExpectFail && len(sc.Block.Reason) < 20 {
				t.Errorf("%s: a known failure with reason %q", sc.Path, sc.Block.Reason)
			}
		}
		if dir == "scenarios" && len(scs) < 10 {
			t.Errorf("%s holds %d scenarios; the long form runs at least 10", dir, len(scs))
		}
	}
}

const base = `name: t
duration: 30s
regions: [{name: a}, {name: b}]
latency: {a: {b: 10ms}}
coordinator: {regions: [a, b], lease_ttl: 5s, refresh: 500ms}
rules: [{name: api, count: 100, period: 1s, burst: 20}]
traffic: [{region: a, rule: api, rate: 50}]
`

func TestScenarioErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ extra, want string }{
		{"chaos: {expect: maybe}", `chaos.expect="maybe"`},
		{"chaos: {expect: fail}", "chaos.reason is empty"},
		{"chaos: {coordinators: 2}", "chaos.coordinators=2"},
		{"chaos: {bogus: 1}", "field bogus not found"},
		{"chaos: {sentinel: [zz]}", `chaos.sentinel[0]="zz"`},
		{"chaos: {checks: [nope]}", `"nope" is not a check`},
		{"chaos: {faults: [{kind: gossip_split, region: a, at: 1s, for: 5s}]}", "at=1s must be 0"},
		{"chaos: {faults: [{kind: redis_delay, region: a, at: 1s, for: 5s}]}", "delay=0s and for=5s must be > 0"},
		{"chaos: {faults: [{kind: coordinator_oneway, region: a, at: 1s, for: 5s, direction: up}]}", `direction="up"`},
		{"chaos: {faults: [{kind: warp, region: a}]}", `kind="warp"`},
		{"chaos: {faults: [{kind: redis_kill, region: a, at: 20s, for: 20s}]}", "after duration=30s"},
		{"faults: [{kind: redis_failover, region: a, at: 5s}]", "needs region \"a\" in chaos.sentinel"},
		{"faults: [{kind: loss, at: 5s, for: 5s, loss: 0.1}]", "cannot lose single messages"},
		{"loss: 0.01", "loss=0.01"},
	} {
		_, err := Parse([]byte(base + c.extra + "\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want it to name %q", c.extra, err, c.want)
		}
		if err != nil && !errors.Is(err, ErrScenario) && !errors.Is(err, sim.ErrScenario) {
			t.Errorf("%q: error %v wraps neither chaos.ErrScenario nor sim.ErrScenario", c.extra, err)
		}
	}
	sk := strings.Replace(base, "{name: a}", "{name: a, skew: 1s}", 1)
	if _, err := Parse([]byte(sk)); err == nil || !strings.Contains(err.Error(), "regions[0] (a): clock skew") {
		t.Errorf("a skewed region: %v", err)
	}
	sc, err := Parse([]byte(base + "faults: [{kind: coordinator_cut, region: b, at: 10s, for: 5s}]\nchaos: {faults: [{kind: redis_kill, region: a, at: 5s, for: 5s}]}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Faults) != 2 || sc.Faults[0].Kind != FaultRedisKill || sc.Faults[0].Sim || !sc.Faults[1].Sim {
		t.Fatalf("faults %+v: want the harness's redis_kill (5 s) before the simulator's cut (10 s)", sc.Faults)
	}
	if h := sc.HarnessOnly(); len(h) != 1 || h[0].Kind != FaultRedisKill {
		t.Fatalf("harness-only faults %+v", h)
	}
	if sc.Block.RecoverWithin != time.Second+3*500*time.Millisecond || sc.Block.Coordinators != 3 || !*sc.Block.WAN {
		t.Fatalf("defaults: %+v", sc.Block)
	}
}

// TestAgentDefaults keeps the harness's copy of the agent's settings that
// have no flag equal to the agent's.
func TestAgentDefaults(t *testing.T) {
	ac := agent.DefaultConfig()
	if ac.Core.BatchTTL != agentBatchTTL || ac.Tick != agentTick || ac.FailoverPoll != agentFailoverPoll {
		t.Fatalf("agent defaults batch TTL %s, tick %s, failover poll %s; the harness assumes %s, %s, %s",
			ac.Core.BatchTTL, ac.Tick, ac.FailoverPoll, agentBatchTTL, agentTick, agentFailoverPoll)
	}
}

func TestBoundTerms(t *testing.T) {
	sc, err := Parse([]byte(base))
	if err != nil {
		t.Fatal(err)
	}
	s := sc.Sim
	rule := s.Rules[0] // 100/s, burst 20; 4 agents
	if bt := batchTerm(s, rule); bt.Tokens != math.Min(100*0.2, 4*2) {
		t.Fatalf("batch term %+v, want min(100×0.2, 4×2) = 8", bt)
	}
	cut := Fault{Kind: sim.FaultRedisCut, Region: "a"}
	rule.Policy = sim.PolicyEmergency
	// The agent's breaker: 100 ms deadlines up to 500 ms, a 250 ms
	// back-off doubling to 500 ms, which 10 s of failed probes reach.
	if tm := faultTerm(s, cut, rule, 60, 12, 10*time.Second); math.Abs(tm.Tokens-(12+60*(10+0.5+0.5))) > 1e-9 {
		t.Fatalf("emergency term %+v, want 12 + 60×(10 + 0.5 + 0.5)", tm)
	}
	rule.Policy = sim.PolicyClosed
	if tm := faultTerm(s, cut, rule, 60, 12, 10*time.Second); tm.Tokens != 0 {
		t.Fatalf("closed term %+v, want 0", tm)
	}
	rule.Policy = sim.PolicyOpen
	if tm := faultTerm(s, cut, rule, 60, 12, 10*time.Second); !tm.Unbounded() {
		t.Fatalf("open term %+v, want unbounded", tm)
	}
	rule.Policy = sim.PolicyClosed
	kill := Fault{Kind: FaultRedisKill, Region: "a"}
	s.Redis.OnFailover = "keep"
	if tm := faultTerm(s, kill, rule, 60, 12, 10*time.Second); tm.Tokens != 12 {
		t.Fatalf("restart, keep: %+v, want one region burst (12)", tm)
	}
	s.Redis.OnFailover = "empty"
	if tm := faultTerm(s, kill, rule, 60, 12, 10*time.Second); tm.Tokens != 60*0.5 {
		t.Fatalf("restart, empty: %+v, want poll 0.5 s × 60/s", tm)
	}
	if tm := faultTerm(s, Fault{Kind: sim.FaultCoordinatorCut, Region: "a"}, rule, 60, 12, 0); tm.Tokens != 0 {
		t.Fatalf("coordinator cut: %+v, want 0", tm)
	}
}

// TestRunSimRunsTheSeedItIsGiven: the simulator beside a run uses the real
// run's seed (`chaos -seed`), and the file's first seed when given none.
func TestRunSimRunsTheSeedItIsGiven(t *testing.T) {
	sc, err := Load("scenarios/short/01-healthy.yaml")
	if err != nil {
		t.Fatal(err)
	}
	first := RunSim(sc, 0)
	if first.Err != "" || first.Seed != sc.Sim.Seeds[0] {
		t.Fatalf("no seed given: ran seed %d (%s), want the file's first, %d", first.Seed, first.Err, sc.Sim.Seeds[0])
	}
	other := sc.Sim.Seeds[0] + 1
	got := RunSim(sc, other)
	if got.Err != "" || got.Seed != other {
		t.Fatalf("seed %d given: ran seed %d (%s)", other, got.Seed, got.Err)
	}
	want, err := sim.Run(sc.Sim, other, sim.Options{Systems: []string{"allot"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range want.Systems {
		if s.Name == "allot" && s.Utilization != got.Utilization {
			t.Errorf("seed %d: utilization %v beside the run, %v from the simulator at that seed", other, got.Utilization, s.Utilization)
		}
	}
	t.Logf("seed %d: %.4f; seed %d: %.4f", first.Seed, first.Utilization, got.Seed, got.Utilization)
	if got.Utilization == first.Utilization {
		t.Errorf("seeds %d and %d both read utilization %v: the seed did not reach the arrivals", sc.Sim.Seeds[0], other, got.Utilization)
	}
}

// TestSimFaultsTheHarnessInjects reads a coordinator_delay, a
// coordinator_oneway and a redis_slow from the scenario's faults (the
// simulator's timeline): the harness injects them with their delay,
// jitter and direction, and they are no harness-only faults, so the
// simulator's side of the table ran them too. A redis_slow that fails
// calls is refused: a proxy delays bytes, it cannot fail a call.
func TestSimFaultsTheHarnessInjects(t *testing.T) {
	sc, err := Parse([]byte(base + "faults: [{kind: coordinator_delay, region: b, at: 10s, for: 5s, delay: 200ms, jitter: 100ms}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Faults) != 1 {
		t.Fatalf("faults %+v", sc.Faults)
	}
	f := sc.Faults[0]
	if f.Kind != FaultCoordinatorDelay || !f.Sim || f.Delay != 200*time.Millisecond || f.Jitter != 100*time.Millisecond {
		t.Fatalf("fault %+v: want the simulator's coordinator_delay with delay 200ms and jitter 100ms", f)
	}
	if h := sc.HarnessOnly(); len(h) != 0 {
		t.Fatalf("harness-only faults %+v: the simulator runs this one", h)
	}
	if _, err := Parse([]byte(base + "faults: [{kind: coordinator_delay, region: b, at: 10s, for: 5s}]\n")); err == nil || !strings.Contains(err.Error(), "delay=0s") {
		t.Fatalf("no delay: %v", err)
	}
	sc, err = Parse([]byte(base + "faults: [{kind: coordinator_oneway, region: b, at: 10s, for: 5s, direction: from}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f := sc.Faults[0]; f.Kind != FaultCoordinatorOneway || !f.Sim || f.Direction != "from" || len(sc.HarnessOnly()) != 0 {
		t.Fatalf("fault %+v, harness-only %+v: want the simulator's coordinator_oneway from the coordinators", f, sc.HarnessOnly())
	}
	sc, err = Parse([]byte(base + "faults: [{kind: redis_slow, region: a, at: 10s, for: 5s, delay: 45ms, jitter: 30ms}]\n"))
	if err != nil {
		t.Fatal(err)
	}
	if f := sc.Faults[0]; f.Kind != sim.FaultRedisSlow || !f.Sim || f.Delay != 45*time.Millisecond || f.Jitter != 30*time.Millisecond || len(sc.HarnessOnly()) != 0 {
		t.Fatalf("fault %+v, harness-only %+v: want the simulator's redis_slow, 45ms and 30ms", f, sc.HarnessOnly())
	}
	if _, err := Parse([]byte(base + "faults: [{kind: redis_slow, region: a, at: 10s, for: 5s, delay: 45ms, loss: 0.5}]\n")); err == nil || !strings.Contains(err.Error(), "loss=0.5") {
		t.Fatalf("a redis_slow that fails calls: %v, want it refused naming loss=0.5", err)
	}
}
