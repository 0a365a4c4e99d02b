package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"github.com/allot-dev/allot/sim"
)

// Outcome is what became of one request.
type Outcome uint8

// Outcomes. Only Admitted counts as an admission; Failed (no answer, or an
// error) is uncertain and counted as nothing.
const (
	Admitted    Outcome = iota // OK
	Denied                     // OVER_LIMIT
	Unavailable                // OVER_LIMIT because the limiter is unavailable (fail closed)
	Failed                     // the call failed or timed out
	Skipped                    // not sent: too many calls in flight
)

var outcomeNames = [...]string{"admitted", "denied", "unavailable", "failed", "skipped"}

func (o Outcome) String() string { return outcomeNames[o] }

// MarshalText implements encoding.TextMarshaler.
func (o Outcome) MarshalText() ([]byte, error) { return []byte(o.String()), nil }

// UnmarshalText implements encoding.TextUnmarshaler.
func (o *Outcome) UnmarshalText(b []byte) error {
	for i, n := range outcomeNames {
		if n == string(b) {
			*o = Outcome(i)
			return nil
		}
	}
	return fmt.Errorf("chaos: outcome %q is not one of %v", b, outcomeNames)
}

// Decision is one request of the history.
type Decision struct {
	// Stream is the index of the traffic stream in the scenario; Rule and
	// Region index the scenario's rules and regions; Agent the region's
	// agent that was asked.
	Stream int32 `json:"stream"`
	Rule   int16 `json:"rule"`
	Region int16 `json:"region"`
	Agent  int16 `json:"agent"`
	Key    int32 `json:"key"`
	Cost   int64 `json:"cost"`
	// Send and Answer are instants since the run's start: the decision
	// happened somewhere between them.
	Send    time.Duration `json:"send_ns"`
	Answer  time.Duration `json:"answer_ns"`
	Outcome Outcome       `json:"outcome"`
}

// maxInFlight bounds the calls in flight; an arrival beyond it is recorded
// as Skipped rather than delayed, so the load stays open loop.
const maxInFlight = 2000

// callTimeout bounds one call; a decision takes milliseconds.
const callTimeout = 2 * time.Second

// Generator is the open-loop load generator: every traffic stream of the
// scenario sends Poisson arrivals over Envoy RLS v3 to the agents of its
// region (round robin over the agents the harness has not killed, as a
// load balancer with health checks would), without waiting for answers.
type Generator struct {
	sc      *Scenario
	c       *Cluster
	clients map[*Agent]rlsv3.RateLimitServiceClient
	conns   []*grpc.ClientConn
	down    sync.Map // *Agent → true while killed
	rr      []atomic.Uint64
	sem     chan struct{}
	wg      sync.WaitGroup

	mu   sync.Mutex
	hist []Decision
}

// NewGenerator dials every agent's gRPC port.
func NewGenerator(sc *Scenario, c *Cluster) (*Generator, error) {
	l := &Generator{sc: sc, c: c, clients: map[*Agent]rlsv3.RateLimitServiceClient{}, rr: make([]atomic.Uint64, len(c.regions)),
		sem: make(chan struct{}, maxInFlight)}
	for _, reg := range c.regions {
		for _, a := range reg.Agents {
			cc, err := grpc.NewClient(a.GRPC, grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				l.Close()
				return nil, fmt.Errorf("chaos: dial %s: %w", a.Name, err)
			}
			l.conns = append(l.conns, cc)
			l.clients[a] = rlsv3.NewRateLimitServiceClient(cc)
		}
	}
	return l, nil
}

// Close closes the connections.
func (l *Generator) Close() {
	for _, cc := range l.conns {
		_ = cc.Close() // the run is over; a close error changes nothing in its history
	}
}

// SetDown takes an agent out of (or back into) the rotation.
func (l *Generator) SetDown(a *Agent, down bool) {
	if down {
		l.down.Store(a, true)
	} else {
		l.down.Delete(a)
	}
}

// History returns the decisions recorded so far, in the order they were
// answered.
func (l *Generator) History() []Decision {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]Decision(nil), l.hist...)
}

// Run sends every stream's arrivals from t0 until the scenario's duration
// (or ctx's end), then waits for the calls in flight.
func (l *Generator) Run(ctx context.Context, t0 time.Time, seed uint64) {
	s := l.sc.Sim
	var streams sync.WaitGroup
	for i, t := range s.Traffic {
		streams.Add(1)
		go func() {
			defer streams.Done()
			l.stream(ctx, t0, int32(i), t, seed) // #nosec G115 -- a stream index; 2^31 streams could not run
		}()
	}
	streams.Wait()
	l.wg.Wait()
}

func (l *Generator) stream(ctx context.Context, t0 time.Time, idx int32, t sim.TrafficSpec, seed uint64) {
	s := l.sc.Sim
	rng := rand.New(rand.NewPCG(seed, uint64(idx)+1)) // #nosec G115 -- idx >= 0
	ri := int16(indexOfRegion(s, t.Region))           // #nosec G115 -- Validate allows at most 5 regions
	ruleI := indexOfRule(s, t.Rule)
	rule := s.Rules[ruleI]
	var zipf *rand.Zipf
	if t.Zipf > 1 && rule.Keys > 1 {
		zipf = rand.NewZipf(rng, t.Zipf, 1, uint64(rule.Keys-1))
	}
	var costW float64
	for _, cw := range t.Cost {
		costW += cw.Weight
	}
	next := t.Start + time.Duration(rng.ExpFloat64()/t.Rate*float64(time.Second))
	for next < t.Stop {
		if d := time.Until(t0.Add(next)); d > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(d): // the next arrival's instant: open-loop load runs on the real clock
			}
		} else if ctx.Err() != nil {
			return
		}
		key := 0
		switch {
		case t.Key != nil:
			key = *t.Key
		case zipf != nil:
			key = int(zipf.Uint64()) // #nosec G115 -- below rule.Keys, at most 1000
		case rule.Keys > 1:
			key = rng.IntN(rule.Keys)
		}
		cost := int64(1)
		if costW > 0 {
			x := rng.Float64() * costW
			for _, cw := range t.Cost {
				if x < cw.Weight {
					cost = cw.Value
					break
				}
				x -= cw.Weight
			}
		}
		l.fire(ctx, t0, Decision{Stream: idx, Rule: int16(ruleI), Region: ri, Key: int32(key), Cost: cost}) // #nosec G115 -- Validate bounds rules to MaxInt16+1 and keys to 1000
		next += time.Duration(rng.ExpFloat64() / t.Rate * float64(time.Second))
	}
}

// pick returns the next agent of region ri in the rotation.
func (l *Generator) pick(ri int16) (*Agent, int16) {
	reg := l.c.regions[ri]
	n := uint64(len(reg.Agents))
	start := l.rr[ri].Add(1)
	for i := range n {
		a := reg.Agents[(start+i)%n]
		if _, down := l.down.Load(a); !down {
			return a, int16(a.Index) // #nosec G115 -- at most 4 agents a region
		}
	}
	a := reg.Agents[start%n]
	return a, int16(a.Index) // #nosec G115 -- as above
}

func (l *Generator) record(d Decision) {
	l.mu.Lock()
	l.hist = append(l.hist, d)
	l.mu.Unlock()
}

func (l *Generator) fire(ctx context.Context, t0 time.Time, d Decision) {
	a, ai := l.pick(d.Region)
	d.Agent = ai
	select {
	case l.sem <- struct{}{}:
	default:
		d.Send = time.Since(t0)
		d.Answer, d.Outcome = d.Send, Skipped
		l.record(d)
		return
	}
	s := l.sc.Sim
	req := &rlsv3.RateLimitRequest{Domain: "chaos", Descriptors: []*rlcommon.RateLimitDescriptor{{
		Entries: []*rlcommon.RateLimitDescriptor_Entry{
			{Key: "path", Value: "/" + s.Rules[d.Rule].Name + "/x"},
			{Key: "subject", Value: keyName(int(d.Key))},
		},
		HitsAddend: wrapperspb.UInt64(uint64(d.Cost)), // #nosec G115 -- costs are validated >= 1
	}}}
	client := l.clients[a]
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		defer func() { <-l.sem }()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), callTimeout)
		defer cancel()
		d.Send = time.Since(t0)
		resp, err := client.ShouldRateLimit(cctx, req)
		d.Answer = time.Since(t0)
		switch {
		case err != nil:
			d.Outcome = Failed
		case resp.GetOverallCode() == rlsv3.RateLimitResponse_OK:
			d.Outcome = Admitted
		case unavailable(resp.GetRawBody()):
			d.Outcome = Unavailable
		default:
			d.Outcome = Denied
		}
		l.record(d)
	}()
}

// unavailable reads the over-limit body the agent sends: a fail-closed
// denial says the limiter is unavailable.
func unavailable(body []byte) bool {
	var b struct {
		Error string `json:"error"`
	}
	return json.Unmarshal(body, &b) == nil && b.Error == "rate limiter unavailable"
}

// keyName is the subject of key i.
func keyName(i int) string { return fmt.Sprintf("k%d", i) }

func indexOfRegion(s *sim.Scenario, name string) int {
	for i, r := range s.Regions {
		if r.Name == name {
			return i
		}
	}
	return -1
}

func indexOfRule(s *sim.Scenario, name string) int {
	for i, r := range s.Rules {
		if r.Name == name {
			return i
		}
	}
	return -1
}
