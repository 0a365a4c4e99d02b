package sim

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestZipfMatchesStdlib draws from zipf and from rand.Zipf with the same
// parameters and identically seeded sources, and requires the same
// variates in the same order, and the sources left in the same state.
func TestZipfMatchesStdlib(t *testing.T) {
	draws := 300_000
	if testing.Short() || raceEnabled {
		draws = 30_000
	}
	for _, c := range []struct {
		s    float64
		imax uint64
	}{
		{1.01, 9}, {1.05, 999}, {1.1, 1}, {1.1, 999}, {1.2, 49}, {1.2, 99_999}, {1.3, 499},
		{1.4, 4}, {1.4, 999}, {2, 10_000}, {3.5, 200}, {1.3, 1_000_000},
	} {
		seed := uint64(c.imax)*31 + uint64(c.s*1000)
		ra := rand.New(rand.NewPCG(seed, 7))
		rb := rand.New(rand.NewPCG(seed, 7))
		got := newZipf(ra, c.s, 1, c.imax)
		want := rand.NewZipf(rb, c.s, 1, c.imax)
		if _, ok := got.(*zipf); !ok && c.imax < zipfMaxKeys {
			t.Errorf("s=%v imax=%d: no table built", c.s, c.imax)
		}
		for i := 0; i < draws; i++ {
			if g, w := got.Uint64(), want.Uint64(); g != w {
				t.Fatalf("s=%v imax=%d draw %d: got %d, rand.Zipf %d", c.s, c.imax, i, g, w)
			}
		}
		if ra.Uint64() != rb.Uint64() {
			t.Fatalf("s=%v imax=%d: the sources diverged", c.s, c.imax)
		}
	}
	if newZipf(rand.New(rand.NewPCG(1, 1)), 1, 1, 10) != nil {
		t.Error("s=1 accepted; rand.NewZipf rejects it")
	}
}

// TestZipfTableMatchesExact compares one round from the table with one
// round of rand.Zipf's arithmetic at ur values on and around every
// boundary's band (where a wrong table would show first) and spread over
// the whole range of ur.
func TestZipfTableMatchesExact(t *testing.T) {
	for _, c := range []struct {
		s    float64
		imax uint64
	}{{1.1, 999}, {1.3, 49}, {2.5, 300}} {
		z := newZipf(rand.New(rand.NewPCG(1, 2)), c.s, 1, c.imax).(*zipf)
		// ur runs over [hxm + hx0minusHxm, hxm] as r runs over [0, 1].
		low, high := z.hxm+z.hx0minusHxm, z.hxm
		check := func(ur float64) {
			if ur < low || ur > high {
				return
			}
			gk, gok := z.round(ur)
			wk, wok := z.exact(ur)
			if gk != wk && (gok || wok) || gok != wok {
				t.Fatalf("s=%v imax=%d ur=%v: table (%d, %v), rand.Zipf's arithmetic (%d, %v)", c.s, c.imax, ur, gk, gok, wk, wok)
			}
		}
		for j := range z.lo {
			lo, hi := z.lo[j], z.hi[j]
			for _, ur := range []float64{math.Nextafter(lo, -1), lo, (lo + hi) / 2, hi, math.Nextafter(hi, 1)} {
				check(ur)
			}
			if j+1 < len(z.lo) {
				check((hi + z.lo[j+1]) / 2)
			}
		}
		rng := rand.New(rand.NewPCG(3, 4))
		for i := 0; i < 100_000; i++ {
			check(low + rng.Float64()*(high-low))
		}
	}
}
