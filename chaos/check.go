package chaos

import (
	"math"
	"slices"
	"sort"
	"time"
)

// Span is one admission: it happened somewhere in [Send, Answer] and took
// Tokens.
type Span struct {
	Send, Answer time.Duration
	Tokens       float64
}

// Windows restricts the windows [a, b] the checker looks at: a in [ALo,
// AHi] and b in [BLo, BHi]. The zero value is every window (use All).
type Windows struct {
	ALo, AHi, BLo, BHi time.Duration
}

// All is every window.
var All = Windows{ALo: math.MinInt64, AHi: math.MaxInt64, BLo: math.MinInt64, BHi: math.MaxInt64}

// Meeting is every window that meets [u, v]: a ≤ v and b ≥ u.
func Meeting(u, v time.Duration) Windows {
	return Windows{ALo: math.MinInt64, AHi: v, BLo: u, BHi: math.MaxInt64}
}

// Inside is every window inside [u, v]: a ≥ u and b ≤ v.
func Inside(u, v time.Duration) Windows {
	return Windows{ALo: u, AHi: v, BLo: u, BHi: v}
}

// Excess is the largest excess found and the window it was found in.
type Excess struct {
	// Tokens is the largest value of (tokens certainly admitted in [a, b])
	// − B − R·(b − a); negative when every window stays that far inside.
	Tokens   float64
	From, To time.Duration
	// Found is false when no window with an admission meets the
	// restriction.
	Found bool
}

// MaxExcess returns the largest excess over B + R·t, over the windows w
// allows, of the tokens certainly admitted in each window: an admission
// counts in [a, b] only if it was sent at or after a and answered by b,
// since it happened somewhere in between. rate is in tokens per second.
//
// It runs in O(n log n). The best window starts at a send instant (moving
// a later up to the next send keeps the count and shortens the window) and
// ends at an answer instant (likewise). Sweeping b over answers in order,
// f(a) = tokens with send ≥ a and answer ≤ b, plus R·a, is kept for every
// candidate a in a segment tree: an answer adds its tokens to every a up
// to its send. The excess at b is max f(a) over allowed a ≤ b, less R·b and
// B.
func MaxExcess(adm []Span, rate, burst float64, w Windows) Excess {
	if len(adm) == 0 {
		return Excess{}
	}
	sends := make([]time.Duration, len(adm))
	for i, s := range adm {
		sends[i] = s.Send
	}
	slices.Sort(sends)
	sends = slices.Compact(sends)
	byAnswer := slices.Clone(adm)
	sort.Slice(byAnswer, func(i, j int) bool { return byAnswer[i].Answer < byAnswer[j].Answer })

	t := newMaxTree(len(sends))
	for j, s := range sends {
		t.init(j, rate*s.Seconds())
	}
	t.build()
	best := Excess{Tokens: math.Inf(-1)}
	for i := 0; i < len(byAnswer); {
		b := byAnswer[i].Answer
		for ; i < len(byAnswer) && byAnswer[i].Answer == b; i++ {
			k := sort.Search(len(sends), func(j int) bool { return sends[j] > byAnswer[i].Send }) - 1
			t.add(0, k, byAnswer[i].Tokens)
		}
		if b < w.BLo || b > w.BHi {
			continue
		}
		lo := sort.Search(len(sends), func(j int) bool { return sends[j] >= w.ALo })
		hi := sort.Search(len(sends), func(j int) bool { return sends[j] > min(w.AHi, b) }) - 1
		if lo > hi {
			continue
		}
		m, j := t.max(lo, hi)
		if x := m - rate*b.Seconds() - burst; x > best.Tokens {
			best = Excess{Tokens: x, From: sends[j], To: b, Found: true}
		}
	}
	if !best.Found {
		return Excess{}
	}
	return best
}

// maxTree is a segment tree over n values with range add and range
// maximum (with the index where it is reached).
type maxTree struct {
	n    int
	mx   []float64
	arg  []int
	lazy []float64
	leaf []float64
}

func newMaxTree(n int) *maxTree {
	return &maxTree{n: n, mx: make([]float64, 4*n), arg: make([]int, 4*n), lazy: make([]float64, 4*n), leaf: make([]float64, n)}
}

func (t *maxTree) init(i int, v float64) { t.leaf[i] = v }

func (t *maxTree) build() { t.buildAt(1, 0, t.n-1) }

func (t *maxTree) buildAt(node, l, r int) {
	if l == r {
		t.mx[node], t.arg[node] = t.leaf[l], l
		return
	}
	m := (l + r) / 2
	t.buildAt(2*node, l, m)
	t.buildAt(2*node+1, m+1, r)
	t.pull(node)
}

func (t *maxTree) pull(node int) {
	a, b := 2*node, 2*node+1
	if t.mx[a] >= t.mx[b] {
		t.mx[node], t.arg[node] = t.mx[a], t.arg[a]
	} else {
		t.mx[node], t.arg[node] = t.mx[b], t.arg[b]
	}
	t.mx[node] += t.lazy[node]
}

// add adds v to every value in [l, r].
func (t *maxTree) add(l, r int, v float64) {
	if l > r {
		return
	}
	t.addAt(1, 0, t.n-1, l, r, v)
}

func (t *maxTree) addAt(node, nl, nr, l, r int, v float64) {
	if r < nl || nr < l {
		return
	}
	if l <= nl && nr <= r {
		t.mx[node] += v
		t.lazy[node] += v
		return
	}
	m := (nl + nr) / 2
	t.addAt(2*node, nl, m, l, r, v)
	t.addAt(2*node+1, m+1, nr, l, r, v)
	t.pull(node)
}

// max returns the largest value in [l, r] and its index.
func (t *maxTree) max(l, r int) (float64, int) { return t.maxAt(1, 0, t.n-1, l, r) }

func (t *maxTree) maxAt(node, nl, nr, l, r int) (float64, int) {
	if l <= nl && nr <= r {
		return t.mx[node], t.arg[node]
	}
	m := (nl + nr) / 2
	var v float64
	var at int
	switch {
	case r <= m:
		v, at = t.maxAt(2*node, nl, m, l, r)
	case l > m:
		v, at = t.maxAt(2*node+1, m+1, nr, l, r)
	default:
		v1, a1 := t.maxAt(2*node, nl, m, l, r)
		v2, a2 := t.maxAt(2*node+1, m+1, nr, l, r)
		v, at = v1, a1
		if v2 > v1 {
			v, at = v2, a2
		}
	}
	return v + t.lazy[node], at
}

// Arrival is one offered request for the ideal bucket.
type Arrival struct {
	At     time.Duration
	Tokens float64
}

// IdealAdmits runs one exact global token bucket (rate tokens a second,
// burst, full at the start) over arrivals in order of At and returns, for
// each arrival, whether it would have admitted it. It is the reference for
// utilization and convergence, as the simulator's ideal system is.
func IdealAdmits(arr []Arrival, rate, burst float64) []bool {
	out := make([]bool, len(arr))
	idx := make([]int, len(arr))
	for i := range idx {
		idx[i] = i
	}
	sort.SliceStable(idx, func(a, b int) bool { return arr[idx[a]].At < arr[idx[b]].At })
	tokens, last := burst, time.Duration(0)
	for n, i := range idx {
		a := arr[i]
		if n > 0 {
			tokens = math.Min(burst, tokens+rate*(a.At-last).Seconds())
		}
		last = a.At
		if a.Tokens <= tokens {
			tokens -= a.Tokens
			out[i] = true
		}
	}
	return out
}

// FairShares splits capacity among demands max-min fairly (water-filling):
// every demand below the level gets what it asks, the rest share what is
// left equally.
func FairShares(capacity float64, demand []float64) []float64 {
	out := make([]float64, len(demand))
	idx := make([]int, len(demand))
	for i := range idx {
		idx[i] = i
	}
	sort.Slice(idx, func(a, b int) bool { return demand[idx[a]] < demand[idx[b]] })
	left := capacity
	for n, i := range idx {
		share := left / float64(len(idx)-n)
		out[i] = math.Min(demand[i], share)
		left -= out[i]
	}
	return out
}
