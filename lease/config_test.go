package lease

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// TestSplitFloor: floors follow the weights, round down so they never sum
// above the budget less its reserve, carry their share of the burst, and
// are zero for a region that does not share the budget; a Budget's floors
// are its Split's.
func TestSplitFloor(t *testing.T) {
	global := bucket.Per(1000, time.Minute).WithBurst(100)
	s := Split{Regions: []string{"a", "b", "c"}, Weights: []int64{2, 1, 1}, Reserve: 0.3}
	want := map[string]Floor{
		"a": {Count: 350, Burst: 35, Limit: bucket.Per(350, time.Minute).WithBurst(35)},
		"b": {Count: 175, Burst: 17, Limit: bucket.Per(175, time.Minute).WithBurst(17)},
		"c": {Count: 175, Burst: 17, Limit: bucket.Per(175, time.Minute).WithBurst(17)},
		"z": {},
	}
	b := Budget{Rule: "api", Limit: global, Regions: s.Regions, Weights: s.Weights, Reserve: s.Reserve}
	var sum bucket.Tokens
	for r, w := range want {
		if got := s.Floor(r, global); got != w {
			t.Errorf("Split.Floor(%s) = %+v, want %+v", r, got, w)
		}
		if got := b.Floor(r); got != w {
			t.Errorf("Budget.Floor(%s) = %+v, want %+v", r, got, w)
		}
		sum += w.Count
	}
	if sum > global.Count()-b.ReserveCount() {
		t.Errorf("floors sum to %d, above the budget less its reserve %d", sum, global.Count()-b.ReserveCount())
	}
	// Equal weights, a floor too small for a burst of one: admit nothing.
	tiny := Split{Regions: []string{"a", "b", "c"}}.Floor("a", bucket.PerSecond(3).WithBurst(1))
	if tiny.Count != 1 || tiny.Burst != 0 || !tiny.Limit.IsZero() {
		t.Errorf("tiny floor = %+v, want count 1, burst 0 and the zero Limit", tiny)
	}
}

// TestConfigRejectsABadNoiseHeadroom: the error names the field and the
// value, and the default passes.
func TestConfigRejectsABadNoiseHeadroom(t *testing.T) {
	for _, v := range []float64{-1, math.NaN(), 1001} {
		cfg := DefaultConfig()
		cfg.NoiseHeadroom = v
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), fmt.Sprintf("noise_headroom=%v", v)) {
			t.Fatalf("noise_headroom=%v: %v, want ErrInvalidConfig naming it", v, err)
		}
	}
	if err := DefaultConfig().Validate(); err != nil {
		t.Fatal(err)
	}
}
