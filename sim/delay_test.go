package sim

import (
	"math/rand/v2"
	"strings"
	"testing"
)

// TestCoordinatorDelayHoldsInOrder sends a lease message every
// millisecond from one region's speaker under coordinator_delay (200 ms
// plus up to 100 ms), and one from another region beside each: every
// delayed message arrives at least the delay after its latency and at
// most the delay and jitter after it, never before one sent earlier (a
// jitter of 100 ms against 1 ms apart would reorder most of them, as
// reorder does), and the other region's are not delayed.
func TestCoordinatorDelayHoldsInOrder(t *testing.T) {
	const ms = Micros(1000)
	n := &network{lat: [][]Micros{{1 * ms, 20 * ms}, {20 * ms, 1 * ms}}, jitter: 0.1}
	n.addFault(linkFault{kind: FaultCoordinatorDelay, region: 0, delay: 200 * ms, jitter: 100 * ms})
	rng := rand.New(rand.NewPCG(1, 2))
	coord := node{kind: kindCoordinator, region: 1}
	var last, other Micros
	var prev Micros
	held := 0
	for i := range 1000 {
		t0 := Micros(i) * ms
		at, copies := n.sendLease(rng, node{kind: kindAgent, region: 0}, coord, t0, &last)
		if copies != 1 {
			t.Fatalf("message %d: %d copies", i, copies)
		}
		d := at[0] - t0
		if d < 220*ms || d > 20*ms+2*ms+300*ms {
			t.Fatalf("message %d held %d µs, want 20–22 ms of latency plus 200–300 ms", i, d)
		}
		if at[0] < prev {
			t.Fatalf("message %d arrives at %d, before message %d (%d): order lost", i, at[0], i-1, prev)
		}
		if at[0] == prev {
			held++ // waited behind an earlier one
		}
		prev = at[0]
		at, _ = n.sendLease(rng, node{kind: kindAgent, region: 1}, coord, t0, &other)
		if d := at[0] - t0; d > 2*ms {
			t.Fatalf("region 1's message %d held %d µs: the fault is region 0's", i, d)
		}
	}
	if held == 0 {
		t.Fatal("no message waited behind an earlier one: the test does not reach the order rule")
	}
	n.removeFault(linkFault{kind: FaultCoordinatorDelay, region: 0, delay: 200 * ms, jitter: 100 * ms})
	if at, _ := n.sendLease(rng, node{kind: kindAgent, region: 0}, coord, 2000*ms, &last); at[0]-2000*ms > 22*ms {
		t.Fatalf("held %d µs after the fault ended", at[0]-2000*ms)
	}
}

// threeRegions is the chaos harness's common setup in small: three
// regions, a budget of 1000/s under policy whose heavy demand moves from
// a to b at 10 s.
func threeRegions(name, policy string) string {
	return `name: ` + name + `
duration: 20s
regions: [{name: a}, {name: b}, {name: c}]
latency:
  a: {a: 500us, b: 20ms, c: 30ms}
  b: {b: 500us, c: 25ms}
  c: {c: 500us}
jitter: 0.1
coordinator: {lease_ttl: 5s, refresh: 500ms}
agent: {timeout: 100ms}
rules:
  - {name: api, count: 1000, period: 1s, burst: 200, keys: 1, reserve: 0.333, policy: ` + policy + `}
traffic:
  - {region: a, rule: api, rate: 150}
  - {region: b, rule: api, rate: 150}
  - {region: c, rule: api, rate: 150}
  - {region: a, rule: api, rate: 750, stop: 10s}
  - {region: b, rule: api, rate: 750, start: 10s, shift: true}
`
}

// delayed is the chaos harness's coordinator-slow in small.
var delayed = threeRegions("delayed", "closed")

// TestCoordinatorDelayReachesTheProtocol runs a move of the demand with
// and without every region's lease messages delayed 200–300 ms each way:
// a move is a report, a decrease, its acknowledgement and the raise, four
// delayed trips, so the delayed run converges later by more than half a
// second, and neither run overshoots the budget at all (the delay's own
// bound term is 0: leases are measured from their send).
func TestCoordinatorDelayReachesTheProtocol(t *testing.T) {
	conv := func(extra string) float64 {
		t.Helper()
		sc, err := ParseScenario([]byte(delayed + extra))
		if err != nil {
			t.Fatal(err)
		}
		res, err := Run(sc, 1, Options{Systems: []string{"allot"}})
		if err != nil {
			t.Fatal(err)
		}
		s := res.Systems[0]
		for _, r := range s.Rules {
			if r.Verdict != Pass || r.PeakTokens > 0 {
				t.Fatalf("%s: %s, overshoot %.1f", r.Rule, r.Verdict, r.PeakTokens)
			}
		}
		if s.ConvergenceS == nil || *s.ConvergenceS < 0 {
			t.Fatalf("no convergence (%v)", s.ConvergenceS)
		}
		return *s.ConvergenceS
	}
	plain := conv("")
	var faults strings.Builder
	faults.WriteString("faults:\n")
	for _, r := range []string{"a", "b", "c"} {
		faults.WriteString("  - {kind: coordinator_delay, region: " + r + ", at: 5s, for: 10s, delay: 200ms, jitter: 100ms}\n")
	}
	slow := conv(faults.String())
	t.Logf("converged %.2f s after the move, %.2f s with lease messages delayed", plain, slow)
	if slow < plain+0.5 {
		t.Fatalf("converged %.2f s after the move with lease messages delayed 200–300 ms each way, %.2f s without: the delay does not reach the protocol", slow, plain)
	}
}

func TestCoordinatorDelayErrorsNameTheField(t *testing.T) {
	for _, c := range []struct{ fault, want string }{
		{"{kind: coordinator_delay, region: a, at: 1s, for: 5s}", "faults[0].delay=0s must be > 0 for coordinator_delay"},
		{"{kind: coordinator_delay, region: a, at: 1s, delay: 10ms}", "faults[0].for=0s must be > 0 for coordinator_delay"},
		{"{kind: coordinator_delay, region: a, at: 1s, for: 5s, delay: 10ms, jitter: -1ms}", "faults[0].jitter=-1ms must be ≥ 0"},
		{"{kind: coordinator_delay, region: zz, at: 1s, for: 5s, delay: 10ms}", `"zz"`},
		{"{kind: redis_slow, region: a, at: 1s, for: 5s, delay: 10ms, jitter: -2ms}", "faults[0].jitter=-2ms must be ≥ 0"},
	} {
		_, err := ParseScenario([]byte(delayed + "faults: [" + c.fault + "]\n"))
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: error %v, want it to name %q", c.fault, err, c.want)
		}
	}
	if _, err := ParseScenario([]byte(delayed + "faults: [{kind: coordinator_delay, at: 1s, for: 5s, delay: 10ms}]\n")); err != nil {
		t.Errorf("every region's lease messages delayed: %v", err)
	}
}

// slowEverywhere is chaos's redis-slow in small: every agent's Redis link
// 45–75 ms late each way against a deadline of 100 ms, Redis healthy.
var slowEverywhere = threeRegions("slow-everywhere", "emergency") + `faults:
  - {kind: redis_slow, region: a, at: 2s, for: 16s, delay: 45ms, jitter: 30ms}
  - {kind: redis_slow, region: b, at: 2s, for: 16s, delay: 45ms, jitter: 30ms}
  - {kind: redis_slow, region: c, at: 2s, for: 16s, delay: 45ms, jitter: 30ms}
`

// TestSlowRedisCreatesNoTokens runs every agent's Redis link slow with
// jitter, so calls of one region's agents would reach the primary out of
// the order they are made: the simulator makes each at its start, and a
// primary whose clock ran backwards between them capped the debt it read
// beyond the burst and dropped it, tokens no real store gives (1,086 of
// overshoot in chaos's redis-slow, whose real processes' excess was 0).
// Calls that answer within the deadline open no breaker, and nothing
// overshoots the budget: no emergency admissions, no tokens made up.
func TestSlowRedisCreatesNoTokens(t *testing.T) {
	sc, err := ParseScenario([]byte(slowEverywhere))
	if err != nil {
		t.Fatal(err)
	}
	for _, seed := range []uint64{1, 2} {
		res, err := Run(sc, seed, Options{Systems: []string{"allot", "static"}})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range res.Systems {
			if len(s.Latency) == 0 {
				t.Fatalf("seed %d, %s: no decisions", seed, s.Name)
			}
			var p99 float64
			for _, l := range s.Latency {
				if l.Path == "redis" {
					p99 = l.P99Us / 1000
				}
			}
			if s.Name == "allot" && p99 < 90 {
				t.Fatalf("seed %d: p99 of store decisions %.1f ms: the slow links did not reach the calls", seed, p99)
			}
			for _, r := range s.Rules {
				t.Logf("seed %d, %s, %s: overshoot %.1f tokens; p99 %.1f ms", seed, s.Name, r.Rule, r.PeakTokens, p99)
				if r.PeakTokens > 0 {
					t.Fatalf("seed %d, %s, %s: overshoot %.1f tokens on a slow but healthy Redis", seed, s.Name, r.Rule, r.PeakTokens)
				}
			}
		}
	}
}

// TestSlowLinkJitter draws a slow link's added delay within
// [delay, delay+jitter], both ends reached closely, and without jitter
// draws nothing from the stream (runs without jitter are as before).
func TestSlowLinkJitter(t *testing.T) {
	const ms = Micros(1000)
	s := &slowLink{delay: 45 * ms, jitter: 30 * ms}
	rng := rand.New(rand.NewPCG(3, 4))
	lo, hi := Micros(1<<62), Micros(0)
	for range 2000 {
		e := s.extra(rng)
		lo, hi = min(lo, e), max(hi, e)
	}
	if lo < 45*ms || hi > 75*ms || lo > 46*ms || hi < 74*ms {
		t.Fatalf("delays drawn in [%d, %d] µs, want [45, 75] ms covered", lo, hi)
	}
	a, b := rand.New(rand.NewPCG(5, 6)), rand.New(rand.NewPCG(5, 6))
	if e := (&slowLink{delay: 60 * ms}).extra(a); e != 60*ms || a.Uint64() != b.Uint64() {
		t.Fatalf("without jitter: %d µs, or a draw taken from the stream", e)
	}
}
