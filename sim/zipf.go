package sim

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
)

// zipf draws exactly the variates math/rand/v2's Zipf draws from the same
// random source, in the same order, consuming the same random numbers, but
// mostly without its two transcendental calls per draw.
//
// rand.Zipf (rejection-inversion, Hörmann and Derflinger) maps a uniform r
// to ur = hxm + r·(hx0 − hxm), computes x = hinv(ur) with Exp and Log,
// takes k = ⌊x + ½⌋, accepts when k − x ≤ s, and otherwise accepts only
// when ur ≥ h(k+½) − (k+v)^−q, drawing again if not. Since hinv is
// increasing, which of those happens depends only on where ur falls among
// the images under h of the points k − ½ and k − s. zipf keeps those
// images sorted and finds ur among them; within a tiny band around each
// (a relative 1e-9 in x, some five orders of magnitude wider than the
// rounding error of hinv), and outside the table's range, it computes
// exactly what rand.Zipf computes, with the same expressions. The second
// test's threshold per k is computed once with rand.Zipf's own expression,
// so it is bit for bit the same. TestZipfMatchesStdlib checks the draws
// against rand.Zipf.
type zipf struct {
	r *rand.Rand
	// rand.Zipf's constants, computed by its expressions.
	imax, v, q, s                float64
	oneminusQ, oneminusQinv      float64
	hxm, hx0minusHxm             float64
	lo, hi                       []float64 // per boundary, ascending: the band of ur around its image
	accept2                      []float64 // per k: ur at or above it accepts k in the second test
	cell                         []uint32  // per cell of ur: the interval it lies in, or where to search
	cellBase, cellScale, cellTop float64
}

// zipfBand is the half-width of the band around each boundary, relative
// to the boundary (at least 1 in absolute terms).
const zipfBand = 1e-9

// zipfMaxKeys bounds the table (about 50 bytes a key); larger key spaces
// use rand.Zipf itself.
const zipfMaxKeys = 1 << 17

// uint64er is a source of variates: a *zipf or a *rand.Zipf.
type uint64er interface{ Uint64() uint64 }

// newZipf returns a sampler of the variates rand.NewZipf(r, s, v, imax)
// would draw: a table-driven one where the table is cheap and safe, else
// rand.Zipf itself; nil when rand.NewZipf rejects the parameters.
func newZipf(r *rand.Rand, s, v float64, imax uint64) uint64er {
	std := rand.NewZipf(r, s, v, imax)
	if std == nil {
		return nil
	}
	if imax >= zipfMaxKeys || s < 1.01 || s > 20 || v != 1 {
		return std
	}
	z := &zipf{r: r, imax: float64(imax), v: v, q: s}
	z.oneminusQ = 1.0 - z.q
	z.oneminusQinv = 1.0 / z.oneminusQ
	z.hxm = z.h(z.imax + 0.5)
	z.hx0minusHxm = z.h(0.5) - math.Exp(math.Log(z.v)*(-z.q)) - z.hxm
	z.s = 1 - z.hinv(z.h(1.5)-math.Exp(-z.q*math.Log(z.v+1.0)))
	if !(z.s > 0 && z.s < 0.5) || !z.build() {
		return std
	}
	return z
}

func (z *zipf) h(x float64) float64 {
	return math.Exp(z.oneminusQ*math.Log(z.v+x)) * z.oneminusQinv
}

func (z *zipf) hinv(x float64) float64 {
	return math.Exp(z.oneminusQinv*math.Log(z.oneminusQ*x)) - z.v
}

// build fills the table: boundaries k − ½ and k − s for k = 0..imax, then
// imax + ½, ascending in x and so in ur. It reports false when bands would
// overlap or fail to ascend, and the caller then keeps rand.Zipf.
func (z *zipf) build() bool {
	n := int(z.imax) + 1
	nb := 2*n + 1
	z.lo = make([]float64, nb)
	z.hi = make([]float64, nb)
	z.accept2 = make([]float64, n)
	for k := 0; k < n; k++ {
		kf := float64(k)
		z.setBoundary(2*k, kf-0.5)
		z.setBoundary(2*k+1, kf-z.s)
		z.accept2[k] = z.h(kf+0.5) - math.Exp(-math.Log(kf+z.v)*z.q)
	}
	z.setBoundary(nb-1, z.imax+0.5)
	for j := 0; j < nb; j++ {
		if !(z.lo[j] < z.hi[j]) || j > 0 && !(z.hi[j-1] < z.lo[j]) {
			return false
		}
	}
	// Cells of equal width in ur. A cell that no band comes within a
	// quarter of a cell of lies inside one interval between boundaries and
	// holds it (j ≥ 1, the number of boundaries below); the others hold
	// cellSearch | the first boundary to search from. ur is uniform, so a
	// draw mostly reads one cell.
	cells := min(max(4*nb, 1024), 1<<18)
	z.cellBase, z.cellTop = z.lo[0], z.hi[nb-1]
	z.cellScale = float64(cells) / (z.cellTop - z.cellBase)
	z.cell = make([]uint32, cells)
	count := func(ur float64) int { // boundaries whose band starts at or below ur
		return sort.Search(nb, func(j int) bool { return z.lo[j] > ur })
	}
	q := 0.25 / z.cellScale
	for c := range z.cell {
		start := z.cellBase + float64(c)/z.cellScale
		end := z.cellBase + float64(c+1)/z.cellScale
		j1, j2 := count(start-q), count(end+q)
		if j1 == j2 && j1 >= 1 && j1 < nb && z.hi[j1-1] < start-q {
			z.cell[c] = uint32(j1) // #nosec G115 -- j1 < nb = 2(imax+1)+1, with imax below 10^7 keys
		} else {
			z.cell[c] = cellSearch | uint32(j1) // #nosec G115 -- as above
		}
	}
	return true
}

// cellSearch marks a cell that a band comes near: its low bits are where
// to start searching the boundaries.
const cellSearch = 1 << 31

func (z *zipf) setBoundary(j int, b float64) {
	d := zipfBand * math.Max(1, math.Abs(b))
	z.lo[j], z.hi[j] = z.h(b-d), z.h(b+d)
}

// Uint64 returns the next variate, as rand.Zipf.Uint64 would.
func (z *zipf) Uint64() uint64 {
	for {
		r := z.r.Float64() // r on [0,1]
		ur := z.hxm + r*z.hx0minusHxm
		if k, ok := z.round(ur); ok {
			return k
		}
	}
}

// round is one round of rand.Zipf.Uint64 for ur, from the table where it
// can: the variate and whether it was accepted.
func (z *zipf) round(ur float64) (uint64, bool) {
	// j is the number of boundaries whose band starts at or below ur.
	j := -1
	if ur >= z.cellBase && ur < z.cellTop {
		c := int((ur - z.cellBase) * z.cellScale)
		if c >= 0 && c < len(z.cell) {
			v := z.cell[c]
			if v&cellSearch == 0 {
				k := (int(v) - 1) / 2
				return uint64(k), v%2 == 0 || ur >= z.accept2[k] // #nosec G115 -- k >= 0: (v-1)/2 truncates toward 0
			}
			a := int(v &^ cellSearch)
			for a < len(z.lo) && z.lo[a] <= ur {
				a++
			}
			if a == 0 || z.lo[a-1] <= ur {
				j = a
			}
		}
	}
	// Inside a band, below the first boundary (k − ½ for k = 0) or from the
	// last (imax + ½) on, or where the cell arithmetic and the table
	// disagree: decide as rand.Zipf does.
	if j <= 0 || j >= len(z.lo) || ur <= z.hi[j-1] {
		return z.exact(ur)
	}
	// Between boundaries j−1 and j: j = 2k+1 is [k−½, k−s), where the
	// second test decides; j = 2k+2 is [k−s, k+½), accepted.
	k := (j - 1) / 2
	return uint64(k), j%2 == 0 || ur >= z.accept2[k]
}

// exact is one round of rand.Zipf.Uint64 for ur: the variate and whether
// it was accepted.
func (z *zipf) exact(ur float64) (uint64, bool) {
	x := z.hinv(ur)
	k := math.Floor(x + 0.5)
	if k-x <= z.s {
		return uint64(k), true
	}
	if ur >= z.h(k+0.5)-math.Exp(-math.Log(k+z.v)*z.q) {
		return uint64(k), true
	}
	return 0, false
}

// shareZipfs gives sources that draw from the same Zipf distribution with
// the same random source one table between them: a table holds no state
// but its random source, so the draws are unchanged, and one table instead
// of one per region keeps the arrival loop in cache.
func shareZipfs(srcs []*source) {
	var seen []*zipf
	for _, s := range srcs {
		z, ok := s.zipf.(*zipf)
		if !ok {
			continue
		}
		i := slices.IndexFunc(seen, func(o *zipf) bool { return o.r == z.r && o.q == z.q && o.v == z.v && o.imax == z.imax })
		if i >= 0 {
			s.zipf = seen[i]
		} else {
			seen = append(seen, z)
		}
	}
}
