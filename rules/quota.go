package rules

import (
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/bucket"
)

var quotaRE = regexp.MustCompile(`^(\d+)\s*(?:per|/)\s*(\d+)?\s*([a-z]+)\s*(?:,\s*burst\s+(\d+))?$`)

var units = map[string]time.Duration{
	"ms": time.Millisecond, "millisecond": time.Millisecond, "milliseconds": time.Millisecond,
	"s": time.Second, "sec": time.Second, "second": time.Second, "seconds": time.Second,
	"m": time.Minute, "min": time.Minute, "minute": time.Minute, "minutes": time.Minute,
	"h": time.Hour, "hour": time.Hour, "hours": time.Hour,
	"d": 24 * time.Hour, "day": 24 * time.Hour, "days": 24 * time.Hour,
}

// maxQuotaNumber bounds the numbers in a quota so that products stay exact.
const maxQuotaNumber = 1 << 40

// ParseQuota parses a quota as an operator writes it: "10 per minute",
// "100 per second, burst 300", "5/s", "1000 per 10 minutes". The burst is
// the count unless given. The limit is validated.
func ParseQuota(s string) (bucket.Limit, error) {
	in := strings.ToLower(strings.TrimSpace(s))
	m := quotaRE.FindStringSubmatch(in)
	if m == nil {
		return bucket.Limit{}, fmt.Errorf("quota %q: want \"<count> per <unit>[, burst <n>]\", e.g. \"10 per minute\"", s)
	}
	count, err := parseNumber(m[1])
	if err != nil {
		return bucket.Limit{}, fmt.Errorf("quota %q: count: %w", s, err)
	}
	unit, ok := units[m[3]]
	if !ok {
		return bucket.Limit{}, fmt.Errorf("quota %q: unknown unit %q (want second, minute, hour or day)", s, m[3])
	}
	mult := int64(1)
	if m[2] != "" {
		if mult, err = parseNumber(m[2]); err != nil {
			return bucket.Limit{}, fmt.Errorf("quota %q: period: %w", s, err)
		}
	}
	if mult > int64(365*24*time.Hour/unit) {
		return bucket.Limit{}, fmt.Errorf("quota %q: period longer than a year", s)
	}
	period := time.Duration(mult) * unit
	if count == 0 {
		return bucket.Limit{}, fmt.Errorf("quota %q: rate count=0 must be > 0", s)
	}
	if period == 0 {
		return bucket.Limit{}, fmt.Errorf("quota %q: period=0 must be > 0", s)
	}
	l := bucket.Per(bucket.Tokens(count), period)
	if m[4] != "" {
		b, err := parseNumber(m[4])
		if err != nil {
			return bucket.Limit{}, fmt.Errorf("quota %q: burst: %w", s, err)
		}
		if b == 0 {
			return bucket.Limit{}, fmt.Errorf("quota %q: burst=0 must be > 0", s)
		}
		l = l.WithBurst(bucket.Tokens(b))
	}
	if err := l.Validate(); err != nil {
		return bucket.Limit{}, fmt.Errorf("quota %q: %w", s, err)
	}
	return l, nil
}

func parseNumber(s string) (int64, error) {
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n > maxQuotaNumber {
		return 0, fmt.Errorf("number %q out of range (max %d)", s, int64(maxQuotaNumber))
	}
	return n, nil
}

// FormatQuota renders l the way ParseQuota reads it.
func FormatQuota(l bucket.Limit) string {
	var unit string
	p := l.Period()
	switch {
	case p%(24*time.Hour) == 0:
		unit = plural(int64(p/(24*time.Hour)), "day")
	case p%time.Hour == 0:
		unit = plural(int64(p/time.Hour), "hour")
	case p%time.Minute == 0:
		unit = plural(int64(p/time.Minute), "minute")
	case p%time.Second == 0:
		unit = plural(int64(p/time.Second), "second")
	default:
		unit = plural(int64(p/time.Millisecond), "millisecond")
	}
	s := strconv.FormatInt(int64(l.Count()), 10) + " per " + unit
	if l.Burst() != l.Count() {
		s += ", burst " + strconv.FormatInt(int64(l.Burst()), 10)
	}
	return s
}

func plural(n int64, unit string) string {
	if n == 1 {
		return unit
	}
	return strconv.FormatInt(n, 10) + " " + unit + "s"
}
