package bucket

import (
	"testing"
	"time"
)

// TestSameAndFitsAsTheirValueForms: Same is == and Fits is Check without
// an error, on valid, zero and invalid limits and on costs around each
// burst.
func TestSameAndFitsAsTheirValueForms(t *testing.T) {
	limits := []Limit{
		{}, PerSecond(10), PerSecond(10).WithBurst(20), PerMinute(10), Per(10, time.Minute), PerSecond(11),
		Per(0, time.Second), Per(10, 0), Per(-1, time.Second), PerSecond(10).WithBurst(0), PerSecond(1 << 40).WithBurst(1 << 60),
	}
	for i := range limits {
		a := &limits[i]
		for j := range limits {
			if got, want := a.Same(&limits[j]), limits[i] == limits[j]; got != want {
				t.Errorf("(%v).Same(%v) = %v, want %v", limits[i], limits[j], got, want)
			}
		}
		for _, cost := range []Tokens{-1, 0, 1, a.Burst() - 1, a.Burst(), a.Burst() + 1} {
			if got, want := a.Fits(cost), Check(limits[i], cost) == nil; got != want {
				t.Errorf("(%v).Fits(%d) = %v, Check says %v", limits[i], cost, got, want)
			}
		}
	}
}
