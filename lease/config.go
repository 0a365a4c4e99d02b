package lease

import (
	"errors"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"strings"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// AllocationPolicy chooses how a budget is split among regions that want it.
type AllocationPolicy uint8

const (
	// MaxMin is max-min fair share: no region gets more than it wants, and
	// the rest is split so that the smallest shares are as large as
	// possible (by weight). A contested budget (the demands do not fit) is
	// shared by the demands less the headroom (Config.Headroom), so a
	// region whose demand is met gets 95% of it by default.
	MaxMin AllocationPolicy = iota
	// Proportional splits a contended budget in proportion to demand.
	Proportional
	// Static gives each region Count×weight/Σweight whatever the demand.
	Static
)

// String returns the policy's configuration name.
func (p AllocationPolicy) String() string {
	switch p {
	case MaxMin:
		return "max-min"
	case Proportional:
		return "proportional"
	case Static:
		return "static"
	}
	return fmt.Sprintf("policy(%d)", uint8(p))
}

// ParseAllocationPolicy parses "max-min" (or ""), "proportional" or "static".
func ParseAllocationPolicy(s string) (AllocationPolicy, error) {
	switch strings.ToLower(s) {
	case "", "max-min", "maxmin":
		return MaxMin, nil
	case "proportional":
		return Proportional, nil
	case "static":
		return Static, nil
	}
	return 0, fmt.Errorf("%w: policy=%q (want max-min, proportional or static)", ErrInvalidBudget, s)
}

// DefaultReserve is the share of a budget held back from floors so the
// coordinator can grant a newly hot key at once, without asking anyone.
const DefaultReserve = 1.0 / 3

// Split says how a global budget divides into floors: the budget minus a
// reserve, shared by Regions in proportion to Weights. A Budget carries one
// (Budget.Split); a region that knows only the split and a key's global
// limit (the agents' decision core) computes the same floors with it.
type Split struct {
	// Regions share the budget, each once.
	Regions []string
	// Weights are the regions' floor weights, in Regions order; nil means
	// equal weights.
	Weights []int64
	// Reserve is the fraction of the budget kept out of floors, in [0, 1).
	Reserve float64
}

// Floor is a region's static share of a budget: what it may use for every
// key with no lease (invariant I5).
type Floor struct {
	// Count is (Count − ⌈Count×Reserve⌉)×weight/Σweight of the budget,
	// rounded down so floors never sum above the budget.
	Count bucket.Tokens
	// Burst is Burst×Count/budget Count, rounded down likewise.
	Burst bucket.Tokens
	// Limit is Count per the budget's period with burst Burst; the zero
	// Limit, "admit nothing", when either is 0.
	Limit bucket.Limit
}

// Floor returns region's floor of a budget whose global limit is global:
// the one place the floor formula is written. It is the zero Floor for a
// region not in s.Regions.
func (s Split) Floor(region string, global bucket.Limit) Floor {
	i := slices.Index(s.Regions, region)
	if i < 0 {
		return Floor{}
	}
	c := bucket.Tokens(mulDiv(int64(global.Count()-reserveCount(global, s.Reserve)), s.weight(i), s.totalWeight()))
	b := burstOf(global, c)
	return Floor{Count: c, Burst: b, Limit: limitOf(global.Period(), c, b)}
}

// weight returns region i's weight.
func (s Split) weight(i int) int64 {
	if s.Weights == nil {
		return 1
	}
	return s.Weights[i]
}

func (s Split) totalWeight() int64 {
	if s.Weights == nil {
		return int64(len(s.Regions))
	}
	var t int64
	for _, w := range s.Weights {
		t += w
	}
	return t
}

// Budget is a global limit shared by regions. Every subject of Rule has its
// own bucket with this Limit; Regions split it.
type Budget struct {
	// Rule names the budget; keys with this Rule belong to it.
	Rule string
	// Limit is the global limit per subject.
	Limit bucket.Limit
	// Regions are the regions that share the budget, each once.
	Regions []string
	// Weights are the regions' floor weights, in Regions order; nil means
	// equal weights.
	Weights []int64
	// Reserve is the fraction of Count (and Burst) kept out of floors, in
	// [0, 1). DefaultReserve is a good start.
	Reserve float64
	// Policy splits the budget among regions that want it.
	Policy AllocationPolicy
}

// Validate reports the first problem with b, naming the field and value.
func (b Budget) Validate() error {
	if b.Rule == "" {
		return fmt.Errorf("%w: rule is empty", ErrInvalidBudget)
	}
	if err := b.Limit.Validate(); err != nil {
		return fmt.Errorf("%w: rule %q: limit: %w", ErrInvalidBudget, b.Rule, err)
	}
	if len(b.Regions) == 0 {
		return fmt.Errorf("%w: rule %q: regions is empty", ErrInvalidBudget, b.Rule)
	}
	seen := make(map[string]bool, len(b.Regions))
	for _, r := range b.Regions {
		if r == "" {
			return fmt.Errorf("%w: rule %q: empty region name", ErrInvalidBudget, b.Rule)
		}
		if seen[r] {
			return fmt.Errorf("%w: rule %q: region %q listed twice", ErrInvalidBudget, b.Rule, r)
		}
		seen[r] = true
	}
	if b.Weights != nil {
		if len(b.Weights) != len(b.Regions) {
			return fmt.Errorf("%w: rule %q: %d weights for %d regions", ErrInvalidBudget, b.Rule, len(b.Weights), len(b.Regions))
		}
		for i, w := range b.Weights {
			if w <= 0 || w > 1<<20 {
				return fmt.Errorf("%w: rule %q: weight=%d for region %q must be in [1, 2^20]", ErrInvalidBudget, b.Rule, w, b.Regions[i])
			}
		}
	}
	if math.IsNaN(b.Reserve) || b.Reserve < 0 || b.Reserve >= 1 {
		return fmt.Errorf("%w: rule %q: reserve=%v must be in [0, 1)", ErrInvalidBudget, b.Rule, b.Reserve)
	}
	if b.Policy > Static {
		return fmt.Errorf("%w: rule %q: policy=%d unknown", ErrInvalidBudget, b.Rule, b.Policy)
	}
	return nil
}

// Split returns how the budget divides into floors.
func (b Budget) Split() Split {
	return Split{Regions: b.Regions, Weights: b.Weights, Reserve: b.Reserve}
}

// ReserveCount is the part of the budget's Count kept out of floors:
// ⌈Count×Reserve⌉.
func (b Budget) ReserveCount() bucket.Tokens { return reserveCount(b.Limit, b.Reserve) }

func reserveCount(global bucket.Limit, reserve float64) bucket.Tokens {
	c := float64(global.Count())
	r := bucket.Tokens(math.Ceil(c * reserve))
	return min(max(r, 0), global.Count())
}

// Floor returns region's floor (Split.Floor); the zero Floor for a region
// not in the budget.
func (b Budget) Floor(region string) Floor { return b.Split().Floor(region, b.Limit) }

// BurstOf is the burst that goes with an allocation of count:
// Burst×count/Count rounded down, so bursts sum within the budget's burst
// whenever counts sum within its count.
func (b Budget) BurstOf(count bucket.Tokens) bucket.Tokens { return burstOf(b.Limit, count) }

func burstOf(global bucket.Limit, count bucket.Tokens) bucket.Tokens {
	if count <= 0 {
		return 0
	}
	return bucket.Tokens(mulDiv(int64(global.Burst()), int64(count), int64(global.Count())))
}

// Unit is the smallest allocation whose burst is at least 1,
// ⌈Count/Burst⌉: a region allocated less admits nothing. Where it is above
// 1 the Allocator raises regions that want a key to it, or gives them
// nothing (docs/design.md, "A burst smaller than its regions").
func (b Budget) Unit() bucket.Tokens {
	return bucket.Tokens(unitOf(int64(b.Limit.Count()), int64(b.Limit.Burst())))
}

// LimitOf is the bucket.Limit a region enforces for an allocation of count:
// count per the budget's Period with burst BurstOf(count). It is the zero
// Limit, meaning "admit nothing", when count or its burst is 0.
func (b Budget) LimitOf(count bucket.Tokens) bucket.Limit {
	return limitOf(b.Limit.Period(), count, b.BurstOf(count))
}

func limitOf(period time.Duration, count, burst bucket.Tokens) bucket.Limit {
	if count <= 0 || burst <= 0 {
		return bucket.Limit{}
	}
	return bucket.Per(count, period).WithBurst(burst)
}

// mulDiv returns ⌊a×b/c⌋ for a, b ≥ 0, c > 0 without overflow, saturating
// at MaxInt64.
func mulDiv(a, b, c int64) int64 {
	q, _ := mulDivRem(a, b, c)
	return q
}

// mulDivRem returns ⌊a×b/c⌋ and the remainder a×b mod c for a, b ≥ 0 and
// c > 0 without overflow; (0, 0) when any is not positive, (MaxInt64, 0)
// when the quotient does not fit.
func mulDivRem(a, b, c int64) (q, r int64) {
	if a <= 0 || b <= 0 || c <= 0 {
		return 0, 0
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi >= uint64(c) {
		return math.MaxInt64, 0
	}
	uq, ur := bits.Div64(hi, lo, uint64(c))
	if uq > math.MaxInt64 {
		return math.MaxInt64, 0
	}
	return int64(uq), int64(ur) // #nosec G115 -- uq ≤ MaxInt64 (checked above), ur < c, an int64
}

// Config holds the Allocator's timing and tuning and the budgets it serves.
// Build it with DefaultConfig and change what you need; NewAllocator calls
// Validate.
type Config struct {
	// TTL is how long a lease lasts after the Holder sent its request.
	TTL time.Duration
	// Refresh is how often Holders report and the Allocator rebalances every
	// hot key and renews every lease.
	Refresh time.Duration
	// Drift is the margin for clock drift over one TTL. Each end applies it
	// in proportion to every interval it measures on its own clock and the
	// other end relies on: Holders end leases Drift early and keep lent
	// floors Drift×Hold/TTL late, the Allocator counts leases Drift late and
	// relies on lent floors Drift×Hold/TTL less. So the escrow holds for a
	// relative drift between the coordinator's clock and any holder's of up
	// to MaxRelativeDrift, 2×Drift/(TTL−Drift): what two clocks each within
	// Drift/TTL of true time can differ by. DriftFor gives the Drift for a
	// relative drift.
	Drift time.Duration
	// Hold is how long a region keeps a lent floor lent after it received
	// the grant, whether or not its lease lives. Less its drift margin
	// (Drift×Hold/TTL) it must exceed TTL+Drift+Refresh, so that a lend
	// acknowledged at one round still covers the next round's window and
	// regions that refresh never lend and reclaim in the same breath. It
	// is also how long an uncontested budget keeps a region's raise
	// through a lull in its use (docs/design.md, "Allocation policy").
	Hold time.Duration
	// DemandTTL is how long a demand report counts; a key a region stops
	// reporting decays toward its floor after it.
	DemandTTL time.Duration
	// Headroom is added to reported demand (0.05 = 5% more), so a region
	// whose demand grows does not press on its allocation at once. It is
	// given only from capacity no region's demand needs: in a contested
	// budget the headroom of the regions whose demand is met is capacity
	// the region still pressing would use, and their noise leaves part of
	// it unused. Under MaxMin a contested budget is shared by the demands
	// less the headroom: what a met region is given above its use (the
	// estimate's noise, the hysteresis band) is lost, what it is not given
	// the pressing regions use. (With 10% for every region, the worst
	// contested budget of steady-skewed reached 0.902 of the ideal, with
	// 5% 0.925; with 5% given only from capacity nobody needs, 0.940 over
	// ten seeds; with the demands less it where contested, 0.950.)
	Headroom float64
	// NoiseHeadroom is a second headroom, for the noise a region's bucket
	// must absorb, in units of Count/(2·Burst) per period: a region using
	// a key wants at least its demand plus NoiseHeadroom×Count/(2·Burst)
	// (at most twice its demand), given like Headroom only from capacity
	// no region's demand needs. A bucket that refills at h above a demand
	// of w arriving at random, with a burst of Burst/Count of its rate,
	// overflows in a busy stretch about exp(−2·h·burst/w) of the time, so
	// a headroom of z·Count/(2·Burst) keeps that at exp(−z) whatever w. It
	// matters where the burst is small against the count: with a burst of
	// a tenth of it, 5·z per period; with a burst of all of it, z/2, under
	// the 5% of any demand above 10·z. Requests costing c tokens each need
	// c times as much, demand burstier than random more, and the estimate
	// lags a rising demand; 16 was chosen from 4, 6, 8, 16 and 32 by the
	// library (docs/design.md, "Since: a headroom for the bucket's noise").
	NoiseHeadroom float64
	// Hysteresis is the smallest change worth sending, as a fraction of the
	// budget's Count; smaller moves are skipped so allocations do not flap,
	// except an increase of a region pressing on its allocation that free
	// capacity covers whole (no other region is decreased for it), a move
	// back to a floor, and a decrease of a key over its budget.
	Hysteresis float64
	// Budgets are the budgets served.
	Budgets []Budget
	// UnsafeSkipEscrow grants every increase at once, without waiting for
	// capacity to be provably free elsewhere. It breaks I1 and exists only
	// so tests can show that the property test and the simulator catch a
	// broken allocator. Never set it in production.
	UnsafeSkipEscrow bool
}

// DefaultConfig returns a Config with production defaults and no budgets.
func DefaultConfig() Config {
	return Config{
		TTL:           10 * time.Second,       // long enough to ride out a coordinator failover
		Refresh:       3 * time.Second,        // three renewals per TTL
		Drift:         500 * time.Millisecond, // 5% of TTL: NTP-synced clocks do far better
		Hold:          20 * time.Second,       // 2×TTL: less its margin (1 s), > TTL+Drift+Refresh
		DemandTTL:     7 * time.Second,        // two missed reports
		Headroom:      0.05,                   // grow 5% before pressing again; given only from capacity nobody needs
		Hysteresis:    0.03,                   // 3% of the budget: smaller moves cost more than they gain
		NoiseHeadroom: 16,                     // exp(−4) for requests of 4 tokens; see the field
	}
}

// Validate reports the first problem with c, naming the field and value.
func (c Config) Validate() error {
	switch {
	case c.TTL <= 0:
		return fmt.Errorf("%w: ttl=%s must be > 0", ErrInvalidConfig, c.TTL)
	case c.Refresh <= 0 || c.Refresh >= c.TTL:
		return fmt.Errorf("%w: refresh=%s must be in (0, ttl=%s)", ErrInvalidConfig, c.Refresh, c.TTL)
	case c.Drift < 0 || c.Drift >= c.TTL-c.Refresh:
		return fmt.Errorf("%w: drift=%s must be in [0, ttl−refresh=%s)", ErrInvalidConfig, c.Drift, c.TTL-c.Refresh)
	case c.Hold-c.HoldMargin() <= c.TTL+c.Drift+c.Refresh:
		return fmt.Errorf("%w: hold=%s less its drift margin %s must exceed ttl+drift+refresh=%s",
			ErrInvalidConfig, c.Hold, c.HoldMargin(), c.TTL+c.Drift+c.Refresh)
	case c.DemandTTL <= c.Refresh:
		return fmt.Errorf("%w: demand_ttl=%s must exceed refresh=%s", ErrInvalidConfig, c.DemandTTL, c.Refresh)
	case math.IsNaN(c.Headroom) || c.Headroom < 0 || c.Headroom > 10:
		return fmt.Errorf("%w: headroom=%v must be in [0, 10]", ErrInvalidConfig, c.Headroom)
	case math.IsNaN(c.NoiseHeadroom) || c.NoiseHeadroom < 0 || c.NoiseHeadroom > 1000:
		return fmt.Errorf("%w: noise_headroom=%v must be in [0, 1000]", ErrInvalidConfig, c.NoiseHeadroom)
	case math.IsNaN(c.Hysteresis) || c.Hysteresis < 0 || c.Hysteresis >= 0.5:
		return fmt.Errorf("%w: hysteresis=%v must be in [0, 0.5)", ErrInvalidConfig, c.Hysteresis)
	}
	return validateBudgets(c.Budgets)
}

// MaxRelativeDrift is the relative drift between the coordinator's clock
// and a holder's that the escrow (I1) tolerates: 2×Drift/(TTL−Drift). Two
// clocks whose rates against true time are 1+ρa and 1+ρb have the relative
// drift RelativeDrift(ρa, ρb); within this bound a lease ends at its holder
// before the coordinator stops counting it, and a lent floor stays lent at
// its holder until after the coordinator stops relying on it. Beyond it,
// each of those intervals is off by about (ρ − MaxRelativeDrift) × its
// length, which the design does not cover.
func (c Config) MaxRelativeDrift() float64 { return maxRelativeDrift(c.Drift, c.TTL) }

// HoldMargin is the drift margin on a lent floor's hold: Drift×Hold/TTL,
// rounded up. The Holder keeps a lend that much beyond Hold and the
// Allocator relies on it that much less, so a hold is covered for the same
// relative drift as a lease, whatever its length.
func (c Config) HoldMargin() time.Duration { return marginOver(c.Drift, c.TTL, c.Hold) }

// maxRelativeDrift is 2×drift/(ttl−drift): a lease the holder measures as
// ttl−drift and the coordinator as ttl+drift stays ordered while the
// coordinator's clock runs at most (ttl+drift)/(ttl−drift) times the
// holder's, and a hold measured as hold+m and hold−m (m = drift×hold/ttl)
// while the holder's runs at most that many times the coordinator's.
func maxRelativeDrift(drift, ttl time.Duration) float64 {
	if ttl <= drift {
		return math.Inf(1)
	}
	return 2 * float64(drift) / float64(ttl-drift)
}

// marginOver is drift's share of an interval d measured across two clocks:
// ⌈drift×d/ttl⌉, so every interval gets the margin a TTL gets, in
// proportion.
func marginOver(drift, ttl, d time.Duration) time.Duration {
	if drift <= 0 || d <= 0 || ttl <= 0 {
		return 0
	}
	m := mulDiv(int64(drift), int64(d), int64(ttl))
	hi, lo := bits.Mul64(uint64(drift), uint64(d)) // #nosec G115 -- drift, d > 0 above
	// #nosec G115 -- m is a quotient of positives and ttl > 0 above
	if qhi, qlo := bits.Mul64(uint64(m), uint64(ttl)); m < math.MaxInt64 && (qhi != hi || qlo != lo) {
		m++ // round up: a margin never falls short
	}
	return time.Duration(m)
}

// DriftFor returns the Drift whose margin covers a relative drift rho
// (≥ 0) over a lease of ttl: ⌈rho×ttl/(2+rho)⌉, the inverse of
// MaxRelativeDrift.
func DriftFor(ttl time.Duration, rho float64) time.Duration {
	if rho <= 0 || math.IsNaN(rho) || ttl <= 0 {
		return 0
	}
	return time.Duration(math.Ceil(rho * float64(ttl) / (2 + rho)))
}

// RelativeDrift is the relative drift of two clocks whose rates against
// true time are 1+rhoA and 1+rhoB: max(k, 1/k) − 1 with k the ratio of
// their rates. It is what an interval measured on one clock can differ by
// on the other, as a fraction, and what MaxRelativeDrift bounds.
func RelativeDrift(rhoA, rhoB float64) float64 {
	k := (1 + rhoA) / (1 + rhoB)
	return max(k, 1/k) - 1
}

func validateBudgets(bs []Budget) error {
	seen := make(map[string]bool, len(bs))
	for _, b := range bs {
		if err := b.Validate(); err != nil {
			return err
		}
		if seen[b.Rule] {
			return fmt.Errorf("%w: rule %q has two budgets", ErrInvalidBudget, b.Rule)
		}
		seen[b.Rule] = true
	}
	return nil
}

// Errors callers branch on.
var (
	// ErrInvalidConfig: a Config or HolderConfig field is out of range.
	ErrInvalidConfig = errors.New("lease: invalid config")
	// ErrInvalidBudget: a Budget cannot be served.
	ErrInvalidBudget = errors.New("lease: invalid budget")
	// ErrUnknownRegion: a message came from a region no budget names.
	ErrUnknownRegion = errors.New("lease: unknown region")
	// ErrBadMessage: a message is malformed or of a type this end does not
	// accept.
	ErrBadMessage = errors.New("lease: bad message")
)
