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

// delayed is the chaos harness's coordinator-slow in small: a budget of
// 1000/s over three regions whose heavy demand moves from a to b at 10 s.
const delayed = `name: delayed
duration: 20s
regions: [{name: a}, {name: b}, {name: c}]
latency:
  a: {a: 500us, b: 20ms, c: 30ms}
  b: {b: 500us, c: 25ms}
  c: {c: 500us}
jitter: 0.1
coordinator: {lease_ttl: 5s, refresh: 500ms}
rules:
  - {name: api, count: 1000, period: 1s, burst: 200, keys: 1, reserve: 0.333}
traffic:
  - {region: a, rule: api, rate: 150}
  - {region: b, rule: api, rate: 150}
  - {region: c, rule: api, rate: 150}
  - {region: a, rule: api, rate: 750, stop: 10s}
  - {region: b, rule: api, rate: 750, start: 10s, shift: true}
`

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
