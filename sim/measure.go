package sim

import (
	"math"
	"math/bits"
)

// meter measures one system's admissions against every budget.
//
// Overshoot is exact over all windows. For a budget of rate R = c/p tokens
// per µs and burst B, with A(t) the tokens admitted up to and including t,
// the excess of a window [s,e] is A(e) − A(s⁻) − B − R·(e−s). Scaled by p
// it is V(e) − V(s⁻) − B·p with V(t) = A(t)·p − c·t, an integer. Between
// admissions V only falls, so the largest excess over all windows ending at
// e is V(e) minus the running minimum of V just before each admission so
// far; keeping that minimum and the largest difference is O(1) per
// admission and linear in the run.
type meter struct {
	b         []budgetMeter // per budget
	cold      []budgetCold  // per budget
	tokens    int64         // all tokens admitted
	requests  int64
	rejected  int64
	falseRej  int64
	unavail   int64 // decisions the system could not make (reported as rejects)
	redisOps  int64
	bins      *series
	touched   []int32 // budgets with win > 0, so a utilization window closes in time proportional to its traffic
	lat       [numPaths]histogram
	pathCount [numPaths]int64
}

// budgetMeter is the part of one budget's figures that every decision
// touches, in one cache line: the overshoot's running values and the
// budget's utilization counts (usage.go). A decision touched two lines
// when these were two structs, and with allot's key states about the
// level-2 cache's size, each line a decision touches is likely a miss.
type budgetMeter struct {
	admitted int64  // A(now), tokens
	minV     int64  // running min of V(s⁻), scaled
	lastT    Micros // time of the last admission
	lastEx   int64  // excess (V − min − B·p) right after the last admission, scaled
	peak     int64  // largest excess seen, scaled
	win      int64  // tokens admitted in the current utilization window
	requests int64
	rej      int64 // false rejects; for the ideal bucket, its rejects
}

// budgetCold is the rest of one budget's figures, touched only while an
// excess lasts, at a new peak, or when a utilization window closes.
type budgetCold struct {
	area   float64 // ∫ max(excess,0) dt, scaled·µs
	peakAt Micros
	capped int64 // Σ over closed utilization windows of min(win, the ideal's win)
	clear  int64 // the same over the clear windows (clearWindow) alone
}

func newMeter(nb int, bins *series) *meter {
	return &meter{b: make([]budgetMeter, nb), cold: make([]budgetCold, nb), bins: bins}
}

// path is how a decision was made, for the latency figures.
type path uint8

const (
	pathLocal     path = iota // from a batch or a local bucket, no I/O
	pathRedis                 // one regional Redis round trip
	pathEmergency             // Redis unreachable, emergency or open policy
	pathWAN                   // across regions (central Redis baseline)
	pathClosed                // Redis unreachable, rule fails closed
	numPaths
)

var pathNames = [numPaths]string{"local", "redis", "emergency", "wan", "closed"}

// admit records cost tokens admitted for budget b, of rule r, at virtual
// time t.
func (m *meter) admit(r *ruleRT, b, region int, cost int64, t Micros) {
	p, c := r.p, r.c
	bm := &m.b[b]
	a := bm.admitted
	// V just before this admission.
	vBefore := a*p - c*t
	// The minimum starts at V(0⁻) = 0; since V only falls while nothing
	// is admitted, V(t⁻) is the only new candidate.
	m.accrue(b, r, t)
	if vBefore < bm.minV {
		bm.minV = vBefore
	}
	a += cost
	bm.admitted = a
	ex := a*p - c*t - bm.minV - r.bp
	bm.lastEx = ex
	bm.lastT = t
	if ex > bm.peak {
		bm.peak = ex
		m.cold[b].peakAt = t
	}
	if ex > 0 && m.bins != nil {
		m.bins.over(t, float64(ex)/float64(p))
	}
	m.tokens += cost
	m.use(b, cost)
	if m.bins != nil {
		m.bins.add(t, r.idx, region, cost)
	}
}

// accrue adds the area under the excess from the last admission to t: the
// excess falls with slope c while nothing is admitted.
func (m *meter) accrue(b int, r *ruleRT, t Micros) {
	bm := &m.b[b]
	ex := bm.lastEx
	if ex <= 0 {
		return
	}
	d := float64(t - bm.lastT)
	if cut := float64(ex) / float64(r.c); d > cut {
		d = cut
	}
	m.cold[b].area += float64(ex)*d - float64(r.c)*d*d/2
}

// finish accrues the excess up to the end of the run.
func (m *meter) finish(w *world, end Micros) {
	for b := range m.b {
		if m.b[b].admitted > 0 {
			m.accrue(b, w.ruleOf(b), end)
		}
	}
}

// histogram is a fixed-size log-scale latency histogram: memory does not
// grow with the length of the run.
type histogram struct {
	counts [64 * 4]int64
	n      int64
	max    Micros
	sum    float64
}

// record adds one latency of d µs. Buckets are a quarter of a power of two
// wide, so quantiles are within 19% of the true value.
func (h *histogram) record(d Micros) {
	if d < 0 {
		d = 0
	}
	h.counts[histIndex(d)]++
	h.n++
	h.sum += float64(d)
	if d > h.max {
		h.max = d
	}
}

func histIndex(d Micros) int {
	if d < 4 {
		return int(d)
	}
	lz := 63 - bits.LeadingZeros64(uint64(d)) // floor(log2 d) ≥ 2
	sub := int((uint64(d) >> (lz - 2)) & 3)
	return lz*4 + sub
}

// histUpper is the upper edge of bucket i in µs.
func histUpper(i int) float64 {
	if i < 4 {
		return float64(i)
	}
	lz, sub := i/4, i%4
	return float64(uint64(4+sub+1) << (lz - 2))
}

// quantile returns the q-quantile in µs, the upper edge of its bucket
// capped at the largest value seen.
func (h *histogram) quantile(q float64) float64 {
	if h.n == 0 {
		return 0
	}
	want := int64(math.Ceil(q * float64(h.n)))
	var seen int64
	for i, c := range h.counts {
		seen += c
		if seen >= want && c > 0 {
			return math.Min(histUpper(i), float64(h.max))
		}
	}
	return float64(h.max)
}

// series holds the time-binned figures for the charts and for convergence:
// a fixed number of bins, so memory does not grow with the run's length.
type series struct {
	width   Micros
	nbins   int
	nrules  int
	nreg    int
	byRule  []int64   // [bin][rule] tokens admitted
	byReg   []int64   // [bin][rule][region] tokens admitted
	overMax []float64 // [bin] largest excess (tokens) over any budget
	// from, to and at are the times [from, to) the last bin looked up
	// holds and its index: admissions come in time order, mostly within
	// one bin, and the division that finds a bin was a measurable part
	// of every admission.
	from, to Micros
	at       int
}

func newSeries(duration Micros, nbins, nrules, nreg int) *series {
	w := duration / Micros(nbins)
	if w <= 0 {
		w = 1
	}
	return &series{
		width: w, nbins: nbins, nrules: nrules, nreg: nreg, from: 1, to: 0, // no bin yet
		byRule:  make([]int64, nbins*nrules),
		byReg:   make([]int64, nbins*nrules*nreg),
		overMax: make([]float64, nbins),
	}
}

func (s *series) bin(t Micros) int {
	if t < s.from || t >= s.to {
		s.move(t)
	}
	return s.at
}

// move makes the bin that holds t the current one.
func (s *series) move(t Micros) {
	i := int(t / s.width)
	if i >= s.nbins {
		i = s.nbins - 1
	}
	if i < 0 {
		i = 0
	}
	// The times bin i holds: the first bin also holds those before 0,
	// the last those after the end.
	s.at, s.from, s.to = i, Micros(i)*s.width, Micros(i+1)*s.width
	if i == 0 {
		s.from = math.MinInt64
	}
	if i == s.nbins-1 {
		s.to = math.MaxInt64
	}
}

func (s *series) add(t Micros, rule, region int, cost int64) {
	i := s.bin(t)
	s.byRule[i*s.nrules+rule] += cost
	if region >= 0 {
		s.byReg[(i*s.nrules+rule)*s.nreg+region] += cost
	}
}

func (s *series) over(t Micros, tokens float64) {
	i := s.bin(t)
	if tokens > s.overMax[i] {
		s.overMax[i] = tokens
	}
}
