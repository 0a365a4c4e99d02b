package sim

import (
	"math"
	"math/rand/v2"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// Event kinds handled by the world itself; systems get evSystem events.
const (
	evArrival eventKind = iota
	evFaultStart
	evFaultEnd
	evSystem
	evFlap // a coordinator_flap fault's link goes down or up
)

// ruleRT is a rule as the run uses it.
type ruleRT struct {
	idx   int
	spec  RuleSpec
	limit bucket.Limit
	// c/p is the rate in tokens per µs, reduced; bp is B·p, the burst in
	// the meter's scaled units. p/c is also the limit's emission interval
	// in µs, and bp its tolerance in units of 1/c µs, the ideal bucket's
	// units (idealDecide).
	c, p, bp int64
	base     int // first budget index
	keys     int
}

// regionRT is a region's nodes' clocks.
type regionRT struct {
	name    string
	agents  int
	agent   nodeClock
	redis   nodeClock
	replica nodeClock
}

// system is one limiter under measurement, fed the same arrivals as the
// others. Events it schedules (world.at) carry its index in event.i; the
// world routes them back through handle.
type system interface {
	name() string
	// arrive decides (or starts deciding) one request.
	arrive(w *world, t Micros, region, budget int, cost int64, idealOK bool)
	// handle runs one of the system's own events.
	handle(w *world, e *event)
	// fault tells the system a fault starts or ends.
	fault(w *world, f *FaultSpec, start bool)
	// finish ends the run: flush what is pending into the report.
	finish(w *world) map[string]any
}

// world is one run: the scenario, the engine, the network and the systems.
type world struct {
	sc       *Scenario
	seed     uint64
	eng      *engine
	trng     *rand.Rand // traffic only, so arrivals do not depend on the systems
	net      *network
	rules    []ruleRT
	ruleIdx  []uint16 // budget → rule
	nb       int
	regions  []regionRT
	sources  []*source
	systems  []system
	meters   []*meter
	sysRng   []*rand.Rand
	ideal    []int64 // per budget: the ideal bucket's theoretical arrival time, in 1/c µs of its rule (idealDecide)
	idealM   *meter
	end      Micros
	arrivals int64
	// decisions counts bucket decisions made by every system, for the speed
	// figure.
	decisions int64
	faults    []FaultRecord
	// progress, when set, is called every so often with the virtual time
	// reached.
	progress func(now, end Micros)
	// opts may configure deliberate bugs, for the tests that prove the
	// simulator catches them.
	opts Options
	cur  event
	// flapDown says, per coordinator_flap fault, whether its link is down.
	flapDown map[int]bool
	// winEnd is the end of the current utilization window (utilWindow).
	winEnd Micros
	// trace, when set by a test, sees every admission.
	trace func(si, region, b int, cost int64, t Micros, p path)
}

func (w *world) ruleOf(b int) *ruleRT { return &w.rules[w.ruleIdx[b]] }

// share returns l scaled by num/den (rate and burst), exact in rate; the
// burst is rounded down, so that the shares' bursts sum within l's. A share
// whose burst rounds to 0 admits nothing (every cost exceeds it): a split
// of a global burst smaller than its regions cannot give each of them a
// token without overshooting it.
func share(l bucket.Limit, num, den int64) bucket.Limit {
	s := bucket.Per(l.Count()*bucket.Tokens(num), l.Period()*time.Duration(den))
	return s.WithBurst(bucket.Tokens(int64(l.Burst()) * num / den))
}

func gcd64(a, b int64) int64 {
	for b != 0 {
		a, b = b, a%b
	}
	return a
}

func newWorld(sc *Scenario, seed uint64, opts Options) (*world, error) {
	w := &world{sc: sc, seed: seed, eng: newEngine(seed), opts: opts}
	w.trng = rand.New(rand.NewPCG(seed, 0x7472616666696300)) // "traffic"
	w.end = us(sc.Duration)
	n := len(sc.Regions)
	w.net = &network{jitter: sc.Jitter, loss: sc.Loss, lat: make([][]Micros, n)}
	for i, a := range sc.Regions {
		w.net.lat[i] = make([]Micros, n)
		for j, b := range sc.Regions {
			d, _ := sc.oneWay(a.Name, b.Name)
			w.net.lat[i][j] = us(d)
		}
		w.regions = append(w.regions, regionRT{
			name:    a.Name,
			agents:  a.Agents,
			agent:   nodeClock{offset: us(a.Skew), drift: a.Drift},
			redis:   nodeClock{offset: us(a.RedisSkew), drift: a.RedisDrift},
			replica: nodeClock{offset: us(a.ReplicaSkew), drift: a.RedisDrift},
		})
	}
	base := make([]int, len(sc.Rules))
	for i, r := range sc.Rules {
		l := bucket.Per(bucket.Tokens(r.Count), r.Period).WithBurst(bucket.Tokens(r.Burst))
		if err := l.Validate(); err != nil {
			return nil, bad("rules[%d]: %w", i, err)
		}
		p := us(r.Period)
		g := gcd64(r.Count, p)
		rt := ruleRT{idx: i, spec: r, limit: l, c: r.Count / g, p: p / g, base: w.nb, keys: r.Keys}
		rt.bp = r.Burst * rt.p
		// The meter's scaled values are A·p and c·t; keep them in int64
		// even if every region admitted the full rate (the N× baseline).
		if float64(rt.c)*float64(w.end)*float64(n+1)*4 > math.MaxInt64/2 {
			return nil, bad("rules[%d]: count=%d per %s over duration=%s is beyond the meter's exact range", i, r.Count, r.Period, sc.Duration)
		}
		base[i] = w.nb
		w.rules = append(w.rules, rt)
		w.nb += r.Keys
	}
	if w.nb > 20_000_000 {
		return nil, bad("rules hold %d budgets in all, at most 20000000", w.nb)
	}
	w.ruleIdx = make([]uint16, w.nb)
	for i, r := range w.rules {
		for k := 0; k < r.keys; k++ {
			w.ruleIdx[r.base+k] = uint16(i)
		}
	}
	w.ideal = make([]int64, w.nb)
	for _, ts := range sc.Traffic {
		w.sources = append(w.sources, newSource(sc, ts, w.trng, base))
	}
	shareZipfs(w.sources)
	w.sources = append(w.sources, replaySources(sc, w.trng, base, w.end)...)
	return w, nil
}

func (w *world) newSeries() *series {
	return newSeries(w.end, w.sc.Bins, len(w.rules), len(w.regions))
}

// addSystem registers s with its own meter and random source.
func (w *world) addSystem(s system) int {
	i := len(w.systems)
	w.systems = append(w.systems, s)
	w.meters = append(w.meters, newMeter(w.nb, w.newSeries()))
	w.sysRng = append(w.sysRng, rand.New(rand.NewPCG(w.seed, uint64(i+1)*0x51afd7ed558ccd)))
	return i
}

// admit records an admission by system si.
func (w *world) admit(si, region, b int, cost int64, t Micros, p path, lat Micros) {
	m := w.meters[si]
	m.requests++
	m.b[b].requests++
	if w.trace != nil {
		w.trace(si, region, b, cost, t, p)
	}
	m.admit(w.ruleOf(b), b, region, cost, t)
	m.pathCount[p]++
	m.lat[p].record(lat)
}

// reject records a rejection by system si of a request for budget b;
// unavailable marks a request the system could not decide (a timeout or a
// closed policy).
func (w *world) reject(si, b int, idealOK bool, p path, lat Micros, unavailable bool) {
	m := w.meters[si]
	m.requests++
	m.rejected++
	bu := &m.b[b]
	bu.requests++
	if idealOK {
		m.falseRej++
		bu.rej++
	}
	if unavailable {
		m.unavail++
	}
	m.pathCount[p]++
	m.lat[p].record(lat)
}

// at schedules a system event.
func (w *world) at(t Micros, si int, e event) {
	e.at = t
	e.kind = evSystem
	e.i = int32(si) // #nosec G115 -- an index into the run's systems; 2^31 would not fit in memory
	w.eng.schedule(e)
}

// run executes the scenario to its end.
func (w *world) run() {
	g := w.eng
	for i, s := range w.sources {
		if t := s.next(w.trng, -1); t >= 0 {
			g.schedule(event{at: t, kind: evArrival, i: int32(i)})
		}
	}
	for i, f := range w.sc.Faults {
		g.schedule(event{at: us(f.At), kind: evFaultStart, i: int32(i)})
		if f.For > 0 {
			g.schedule(event{at: us(f.At + f.For), kind: evFaultEnd, i: int32(i)})
		}
	}
	nextProgress := Micros(0)
	w.winEnd = utilWindow
	for {
		at, ok := g.peekAt()
		if !ok || at > w.end {
			break
		}
		for at >= w.winEnd {
			w.closeWindow()
		}
		if g.arrivalFirst() {
			// An arrival stays at the top of its heap while it is decided
			// (whatever the systems schedule meanwhile comes later) and is
			// then moved to the source's next arrival.
			w.arrival(g.topArrival())
		} else {
			// The event lives in w.cur so that handing its address to a
			// system does not move every event to the heap.
			w.cur = *g.top()
			g.drop()
			e := &w.cur
			switch e.kind {
			case evFaultStart, evFaultEnd:
				w.fault(int(e.i), e.kind == evFaultStart)
			case evFlap:
				w.flap(int(e.i))
			case evSystem:
				w.systems[e.i].handle(w, e)
			}
		}
		if w.progress != nil && at >= nextProgress {
			w.progress(at, w.end)
			nextProgress = at + w.end/200
		}
	}
	g.now = w.end
	w.closeWindow()
	w.idealM.finish(w, w.end)
	for _, m := range w.meters {
		m.finish(w, w.end)
	}
}

// arrival decides source i's arrival at t, the earliest event, on every
// system, and moves the event to the source's next arrival or drops it.
func (w *world) arrival(i int32, t Micros) {
	s := w.sources[i]
	b, cost := s.draw(w.trng)
	w.arrivals++
	// The ideal global bucket: one exact bucket per budget at true time.
	r := &w.rules[s.rule]
	idealOK := w.idealDecide(r, b, t, cost)
	w.idealM.requests++
	w.idealM.b[b].requests++
	if idealOK {
		w.idealM.admit(r, b, s.region, cost, t)
	} else {
		w.idealM.rejected++
		w.idealM.b[b].rej++
	}
	w.decisions++
	for _, sys := range w.systems {
		sys.arrive(w, t, s.region, b, cost, idealOK)
	}
	if nt := s.next(w.trng, t); nt >= 0 {
		w.eng.retimeArrival(nt)
	} else {
		w.eng.dropArrival()
	}
}

// idealDecide is the ideal global bucket's decision on cost tokens of
// budget b, of rule r, at true time t: the GCRA of bucket.Decide under the
// rule's limit, which the ideal never changes, at a time that never runs
// backwards, so none of bucket's carrying or capping arises. In units of
// 1/c µs the emission interval is p and the tolerance bp; the bucket is
// spent by tat − t·c, at least 0, and admits when that plus cost·p is
// within bp. It is integer arithmetic on one word per budget instead of a
// bucket.Decide with its Decision and time.Time, which was a tenth of an
// arrival. newWorld keeps t·c within int64 (the meter's range check) and
// cost ≤ burst keeps cost·p within bp < 2^52. TestIdealMatchesBucket
// checks it against bucket.Decide.
func (w *world) idealDecide(r *ruleRT, b int, t Micros, cost int64) bool {
	if cost <= 0 || cost > r.spec.Burst {
		return false // bucket.Decide's ErrInvalidCost and ErrNeverFits
	}
	now := t * r.c
	used := max(w.ideal[b]-now, 0)
	if used+cost*r.p > r.bp {
		return false
	}
	w.ideal[b] = now + used + cost*r.p
	return true
}

// faultIndex returns f's index in the scenario's faults.
func (w *world) faultIndex(f *FaultSpec) int {
	for i := range w.sc.Faults {
		if &w.sc.Faults[i] == f {
			return i
		}
	}
	panic("sim: fault not in the scenario")
}

// flap toggles coordinator_flap fault i's cut, while the fault lasts.
func (w *world) flap(i int) {
	f := &w.sc.Faults[i]
	if w.eng.now >= us(f.At+f.For) {
		return // the fault's end lifts the cut
	}
	c := cut{kind: f.Kind, region: w.sc.regionIndex(f.Region), agent: -1}
	next := f.Up
	if w.flapDown[i] {
		w.net.removeCut(c)
	} else {
		w.net.addCut(c)
		next = f.Down
	}
	w.flapDown[i] = !w.flapDown[i]
	w.eng.schedule(event{at: w.eng.now + us(next), kind: evFlap, i: int32(i)}) // #nosec G115 -- an index into the scenario's faults
}

// FaultRecord is one fault as it happened, for the report's timeline.
type FaultRecord struct {
	Kind   string  `json:"kind"`
	Region string  `json:"region,omitempty"`
	Agent  *int    `json:"agent,omitempty"`
	Start  float64 `json:"start_s"`
	End    float64 `json:"end_s"`
}

func (w *world) fault(i int, start bool) {
	f := &w.sc.Faults[i]
	ri := w.sc.regionIndex(f.Region)
	c := cut{kind: f.Kind, region: ri, agent: -1, dir: f.Direction}
	if f.Agent != nil {
		c.agent = *f.Agent
	}
	switch f.Kind {
	case FaultCoordinatorCut, FaultCoordinatorOneway, FaultRegionCut, FaultRedisCut:
		if start {
			w.net.addCut(c)
		} else {
			w.net.removeCut(c)
		}
	case FaultCoordinatorFlap:
		// Down first, then up, until the fault ends (evFlap toggles).
		if w.flapDown == nil {
			w.flapDown = map[int]bool{}
		}
		if start {
			w.net.addCut(c)
			w.flapDown[i] = true
			w.eng.schedule(event{at: w.eng.now + us(f.Down), kind: evFlap, i: int32(i)}) // #nosec G115 -- an index into the scenario's faults
		} else if w.flapDown[i] {
			w.net.removeCut(c)
			w.flapDown[i] = false
		}
	case FaultDuplicate, FaultReorder, FaultCoordinatorDelay:
		lf := linkFault{kind: f.Kind, region: ri, prob: f.Prob, delay: us(f.Delay), jitter: us(f.Jitter)}
		if start {
			w.net.addFault(lf)
		} else {
			w.net.removeFault(lf)
		}
	case FaultLoss:
		v := 0.0
		if start {
			v = f.Loss
		}
		if f.Links != LinksRedis {
			w.net.extraWAN = v
		}
		if f.Links != LinksWAN {
			w.net.extraRedis = v
		}
	}
	if start {
		end := f.At + f.For
		w.faults = append(w.faults, FaultRecord{Kind: f.Kind, Region: f.Region, Agent: f.Agent,
			Start: f.At.Seconds(), End: end.Seconds()})
	}
	for _, s := range w.systems {
		s.fault(w, f, start)
	}
}
