package bucket

import (
	"errors"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

var t0 = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)

func TestLimitConstructors(t *testing.T) {
	for _, tc := range []struct {
		l        Limit
		interval time.Duration
		burst    Tokens
		rate     float64
	}{
		{PerMinute(10), 6 * time.Second, 10, 10.0 / 60},
		{PerSecond(100).WithBurst(300), 10 * time.Millisecond, 300, 100},
		{PerHour(3600), time.Second, 3600, 1},
		{PerSecond(3), 333334 * time.Microsecond, 3, 3},
		{Per(6000, time.Minute), 10 * time.Millisecond, 6000, 100},
	} {
		if err := tc.l.Validate(); err != nil {
			t.Fatalf("%s: %v", tc.l, err)
		}
		if tc.l.Interval() != tc.interval || tc.l.Burst() != tc.burst || tc.l.Rate() != tc.rate {
			t.Fatalf("%s: interval %s burst %d rate %v, want %s %d %v", tc.l, tc.l.Interval(), tc.l.Burst(), tc.l.Rate(), tc.interval, tc.burst, tc.rate)
		}
	}
}

func TestInvalidInputNamesValue(t *testing.T) {
	for _, tc := range []struct {
		l    Limit
		cost Tokens
		is   error
		says string
	}{
		{PerMinute(0), 1, ErrInvalidLimit, "count=0"},
		{PerMinute(-5), 1, ErrInvalidLimit, "count=-5"},
		{Per(10, 0), 1, ErrInvalidLimit, "period=0s"},
		{Per(10, time.Nanosecond*1500), 1, ErrInvalidLimit, "period=1.5µs"},
		{PerMinute(10).WithBurst(0), 1, ErrInvalidLimit, "burst=0"},
		{Limit{}, 1, ErrInvalidLimit, "count=0"},
		{PerHour(1 << 40), 1, ErrInvalidLimit, "exact range"},
		{Per(4294967311, time.Second), 1, ErrInvalidLimit, "count=4294967311 per period=1s needs an interval of 1000000/4294967311 µs, whose denominator exceeds 2^32"},
		{PerMinute(10), 0, ErrInvalidCost, "cost=0"},
		{PerMinute(10), -2, ErrInvalidCost, "cost=-2"},
		{PerMinute(10), 11, ErrNeverFits, "cost=11 exceeds burst=10"},
	} {
		_, _, err := Decide(State{}, t0, tc.l, tc.cost)
		if !errors.Is(err, tc.is) || !strings.Contains(err.Error(), tc.says) {
			t.Errorf("Decide(%s, cost %d): err = %v, want %v naming %q", tc.l, tc.cost, err, tc.is, tc.says)
		}
	}
	for _, f := range []float64{math.NaN(), math.Inf(1), 0, -1, 1.5} {
		if _, err := CostOf(f); !errors.Is(err, ErrInvalidCost) || !strings.Contains(err.Error(), "cost=") {
			t.Errorf("CostOf(%v): err = %v, want ErrInvalidCost naming the value", f, err)
		}
	}
	if c, err := CostOf(5); c != 5 || err != nil {
		t.Errorf("CostOf(5) = %d, %v", c, err)
	}
}

func TestRetryAfterSeconds(t *testing.T) {
	for _, tc := range []struct {
		d    Decision
		want int64
	}{
		{Decision{Allowed: true}, 0},
		{Decision{RetryAfter: 0}, 1},
		{Decision{RetryAfter: time.Microsecond}, 1},
		{Decision{RetryAfter: time.Second}, 1},
		{Decision{RetryAfter: time.Second + time.Microsecond}, 2},
		{Decision{RetryAfter: 6 * time.Second}, 6},
	} {
		if got := tc.d.RetryAfterSeconds(); got != tc.want {
			t.Errorf("RetryAfterSeconds(%+v) = %d, want %d", tc.d, got, tc.want)
		}
	}
}

// For any sequence of requests, what is admitted in any window [s, e] is at
// most B + r·(e − s). Checked over every pair of admitted requests.
func TestWindowBound(t *testing.T) {
	limits := []Limit{PerSecond(10).WithBurst(100), PerMinute(10), PerSecond(3), Per(7, 3*time.Second).WithBurst(2)}
	for seed := range 40 {
		rng := rand.New(rand.NewPCG(uint64(seed), 7))
		l := limits[seed%len(limits)]
		var st State
		now := t0
		type adm struct {
			at   time.Time
			cost Tokens
		}
		var admitted []adm
		for range 400 {
			if rng.IntN(3) == 0 {
				now = now.Add(time.Duration(rng.Int64N(int64(2 * l.Interval()))))
			}
			cost := Tokens(1 + rng.IntN(int(l.Burst())))
			d, ns, err := Decide(st, now, l, cost)
			if err != nil {
				t.Fatal(err)
			}
			st = ns
			if d.Allowed {
				admitted = append(admitted, adm{now, cost})
			}
		}
		for i := range admitted {
			var sum Tokens
			for j := i; j < len(admitted); j++ {
				sum += admitted[j].cost
				window := admitted[j].at.Sub(admitted[i].at)
				bound := float64(l.Burst()) + l.Rate()*window.Seconds()
				if float64(sum) > bound+1e-9 {
					t.Fatalf("seed %d %s: %d admitted in %s > B + r·t = %.3f", seed, l, sum, window, bound)
				}
			}
		}
	}
}

// The token bucket and GCRA agree on every sequence with a monotone clock.
func TestTokenBucketMatchesGCRA(t *testing.T) {
	limits := []Limit{PerSecond(3), PerMinute(10), PerSecond(1000).WithBurst(50), Per(7, 3*time.Second).WithBurst(20)}
	for seed := range 50 {
		rng := rand.New(rand.NewPCG(uint64(seed), 9))
		l := limits[seed%len(limits)]
		var g State
		var tb TokenState
		now := t0
		for i := range 500 {
			now = now.Add(time.Duration(rng.Int64N(int64(l.Interval() * 2)))).Truncate(time.Microsecond)
			cost := Tokens(1 + rng.IntN(int(min(l.Burst(), 10))))
			d1, ng, _ := Decide(g, now, l, cost)
			d2, ntb, _ := TokenBucket(tb, now, l, cost)
			if d1 != d2 {
				t.Fatalf("seed %d step %d %s cost %d: gcra %+v token bucket %+v", seed, i, l, cost, d1, d2)
			}
			g, tb = ng, ntb
		}
	}
}

// A token bucket whose clock steps back refills nothing when it returns.
func TestTokenBucketClockBack(t *testing.T) {
	l := PerSecond(1).WithBurst(1)
	_, s, _ := TokenBucket(TokenState{}, t0, l, 1)
	_, s, _ = TokenBucket(s, t0.Add(-time.Hour), l, 1)
	d, _, _ := TokenBucket(s, t0.Add(500*time.Millisecond), l, 1)
	if d.Allowed {
		t.Fatalf("token bucket granted a token after stepping back: %+v", d)
	}
}

// A denied request debits nothing, at any fill level.
func TestDeniedDebitsNothing(t *testing.T) {
	l := PerMinute(10)
	_, s, _ := Decide(State{}, t0, l, 7)
	d, s2, _ := Decide(s, t0, l, 4)
	if d.Allowed || s2 != s {
		t.Fatalf("denied cost 4 with 3 left: %+v, state %v -> %v", d, s, s2)
	}
	if d, _, _ := Decide(s2, t0, l, 3); !d.Allowed {
		t.Fatalf("3 left after a denial, but cost 3 was denied: %+v", d)
	}
}

// TestStateWrittenUnder: a state records the limit it was written under
// until a rebase or a decision under another limit moves it, and a full
// bucket is written under none.
func TestStateWrittenUnder(t *testing.T) {
	old, nu := PerSecond(100), PerSecond(40)
	var s State
	if !s.Full(t0) || s.WrittenUnder(old) {
		t.Fatalf("zero state: full %v, written under %s %v; want full, under none", s.Full(t0), old, s.WrittenUnder(old))
	}
	_, s, err := Decide(s, t0, old, 100)
	if err != nil {
		t.Fatal(err)
	}
	if s.Full(t0) || !s.WrittenUnder(old) || s.WrittenUnder(nu) {
		t.Fatalf("after a decision under %s: full %v, under it %v, under %s %v", old, s.Full(t0), s.WrittenUnder(old), nu, s.WrittenUnder(nu))
	}
	at := t0.Add(100 * time.Millisecond)
	r, _, err := Rebase(s, at, old, nu)
	if err != nil {
		t.Fatal(err)
	}
	if !r.WrittenUnder(nu) || r.WrittenUnder(old) {
		t.Fatalf("after a rebase to %s: under it %v, under %s %v", nu, r.WrittenUnder(nu), old, r.WrittenUnder(old))
	}
	if !s.Full(t0.Add(time.Second)) {
		t.Fatal("a bucket 100 tokens down at 100/s is not full a second later")
	}
}

// TestEmptyHoldsNothingThenRefills: Empty(now, l) admits nothing at now,
// one token an interval later, and is full a burst's worth of intervals
// after; an invalid limit gives the zero state.
func TestEmptyHoldsNothingThenRefills(t *testing.T) {
	l := PerSecond(10).WithBurst(5)
	now := time.Unix(100, 0)
	s := Empty(now, l)
	if d, _ := Peek(s, now, l); d.Remaining != 0 {
		t.Fatalf("at now: %d remaining, want 0", d.Remaining)
	}
	if d, _ := Peek(s, now.Add(100*time.Millisecond), l); d.Remaining != 1 {
		t.Fatalf("an interval later: %d remaining, want 1", d.Remaining)
	}
	if !s.Full(now.Add(500 * time.Millisecond)) {
		t.Fatal("not full five intervals later")
	}
	if s := Empty(now, Limit{}); s != (State{}) {
		t.Fatalf("an invalid limit: %+v, want the zero state", s)
	}
}
