package sim

import (
	"math"
	"math/rand/v2"
	"sort"
)

// source generates one traffic stream's arrivals, one at a time: only the
// next arrival of each source is ever in the event heap.
type source struct {
	region  int
	rule    int
	base    int // first budget of the rule
	keys    int
	fixed   int // −1, or the one key every request goes to
	zipf    uint64er
	rate    float64 // mean requests per µs while on
	maxRate float64 // rate bound used for thinning
	start   Micros
	stop    Micros
	// bursty on/off state
	bursty   bool
	on       bool
	phaseEnd Micros
	onMean   float64 // µs
	offMean  float64 // µs
	// diurnal modulation
	amp, period, phase float64
	// cycle: on for cycOn of every cycPeriod, from start+cycPhase
	cycPeriod, cycOn, cycPhase Micros
	// costs: cumulative weights, values
	cumW  []float64
	costs []int64
	shift bool
	// replay, when set, gives the arrivals instead (replay.go).
	replay *replayStream
}

func newSource(sc *Scenario, ts TrafficSpec, rng *rand.Rand, ruleBase []int) *source {
	ri := sc.ruleIndex(ts.Rule)
	s := &source{
		region: sc.regionIndex(ts.Region),
		rule:   ri,
		base:   ruleBase[ri],
		keys:   sc.Rules[ri].Keys,
		fixed:  -1,
		rate:   ts.Rate / 1e6,
		start:  us(ts.Start),
		stop:   us(ts.Stop),
		shift:  ts.Shift,
	}
	if ts.Key != nil {
		s.fixed = *ts.Key
	} else if ts.Zipf > 1 && s.keys > 1 {
		s.zipf = newZipf(rng, ts.Zipf, 1, uint64(s.keys-1))
	}
	s.maxRate = s.rate
	if ts.Kind == "bursty" {
		s.bursty = true
		s.rate *= ts.BurstFactor
		s.maxRate = s.rate
		s.onMean = float64(us(ts.BurstOn))
		s.offMean = float64(us(ts.BurstOff))
		s.on = true
		s.phaseEnd = s.start + Micros(rng.ExpFloat64()*s.onMean) + 1
	}
	if c := ts.Cycle; c != nil {
		s.cycPeriod, s.cycOn, s.cycPhase = us(c.Period), us(c.On), us(c.Phase)
	}
	if d := ts.Diurnal; d != nil {
		s.amp = d.Amplitude
		s.period = float64(us(d.Period))
		s.phase = d.Phase
		s.maxRate *= 1 + s.amp
	}
	if len(ts.Cost) == 0 {
		s.costs = []int64{1}
		s.cumW = []float64{1}
	} else {
		var sum float64
		for _, c := range ts.Cost {
			sum += c.Weight
			s.cumW = append(s.cumW, sum)
			s.costs = append(s.costs, c.Value)
		}
	}
	return s
}

// next returns the first arrival after t, or −1 when the stream has ended.
// Arrivals follow a Poisson process of rate λ(t), drawn by thinning a
// process of rate maxRate; bursty streams switch on and off at
// exponentially distributed times.
func (s *source) next(rng *rand.Rand, t Micros) Micros {
	if s.replay != nil {
		return s.replay.next()
	}
	if t < s.start {
		t = s.start
	}
	for guard := 0; guard < 1_000_000; guard++ {
		if s.bursty && !s.on {
			t = max(t, s.phaseEnd)
			s.on = true
			s.phaseEnd = t + Micros(rng.ExpFloat64()*s.onMean) + 1
		}
		dt := rng.ExpFloat64() / s.maxRate
		if dt > 1e15 {
			return -1
		}
		c := t + Micros(math.Ceil(dt))
		if s.bursty && c >= s.phaseEnd {
			t = s.phaseEnd
			s.on = false
			s.phaseEnd = t + Micros(rng.ExpFloat64()*s.offMean) + 1
			continue
		}
		if c >= s.stop {
			return -1
		}
		if s.cycPeriod > 0 {
			// Off between on-windows: jump to the next one's start.
			pos := ((c-s.start-s.cycPhase)%s.cycPeriod + s.cycPeriod) % s.cycPeriod
			if pos >= s.cycOn {
				t = c + s.cycPeriod - pos
				continue
			}
		}
		t = c
		if s.amp > 0 {
			lam := s.rate * (1 + s.amp*math.Sin(2*math.Pi*(float64(t)/s.period+s.phase)))
			if rng.Float64()*s.maxRate > lam {
				continue
			}
		}
		return t
	}
	return -1
}

// draw picks the key (as a budget index) and the cost of one request.
func (s *source) draw(rng *rand.Rand) (budget int, cost int64) {
	if s.replay != nil {
		k, c := s.replay.draw()
		return s.base + k, c
	}
	switch {
	case s.fixed >= 0:
		budget = s.base + s.fixed
	case s.zipf != nil:
		budget = s.base + int(s.zipf.Uint64()) // #nosec G115 -- below the rule's keys, at most 10^7
	case s.keys > 1:
		budget = s.base + rng.IntN(s.keys)
	default:
		budget = s.base
	}
	if len(s.costs) == 1 {
		return budget, s.costs[0]
	}
	x := rng.Float64() * s.cumW[len(s.cumW)-1]
	i := sort.SearchFloat64s(s.cumW, x)
	if i >= len(s.costs) {
		i = len(s.costs) - 1
	}
	return budget, s.costs[i]
}
