package lease

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// cluster drives one Allocator and a Holder per region over a simulated
// network with latency, loss, duplication and reordering, on a manual
// timeline. It is the harness for scenario and property tests.
type cluster struct {
	t        testing.TB
	now      time.Time
	cfg      Config
	term     uint64
	alloc    *Allocator
	regions  []string
	holders  map[string]*Holder
	demand   map[string]map[bucket.Key]bucket.Tokens
	net      []envelope
	seq      uint64
	latency  time.Duration
	rng      *rand.Rand // nil: no faults
	loss     float64
	dup      float64
	jitter   time.Duration
	cut      map[string]bool // partitioned regions
	dropTo   map[string]int  // drop the next n messages to a region
	dropUp   map[string]int  // drop the next n messages from a region
	log      []string
	prev     *Allocator
	rate     map[string]float64 // holder clock rates (drift); 1 when absent
	sessions uint64
	// tickEvery, when set, ticks the Allocator only every tickEvery of the
	// timeline, as a coordinator's driver does (200 ms), instead of at
	// every step.
	tickEvery time.Duration
	lastTick  time.Time
	// stepped, when set, is called after the Allocator steps a message and
	// before its output is collected.
	stepped func(m Message)
	// sent, when set, is called with every message the Allocator sends.
	sent func(m Message)
}

type envelope struct {
	at  time.Time
	seq uint64
	to  string // "" is the coordinator
	m   Message
}

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// scenarioConfig is DefaultConfig with leases of 10 s refreshed every 2 s,
// a drift margin of 0.5 s, a hold just above its minimum (the tightest the
// protocol allows; the simulator runs twice the TTL) and demand kept for
// two refresh intervals and a third.
func scenarioConfig() Config {
	cfg := DefaultConfig()
	cfg.TTL, cfg.Refresh, cfg.Drift = 10*time.Second, 2*time.Second, 500*time.Millisecond
	cfg.Hold = cfg.TTL + 2*cfg.Drift + cfg.Refresh + cfg.Refresh/2
	cfg.DemandTTL = 2*cfg.Refresh + cfg.Refresh/3
	return cfg
}

func newCluster(t testing.TB, cfg Config) *cluster {
	t.Helper()
	c := &cluster{
		t: t, now: t0, cfg: cfg, term: 1,
		holders: map[string]*Holder{},
		demand:  map[string]map[bucket.Key]bucket.Tokens{},
		latency: 50 * time.Millisecond,
		cut:     map[string]bool{}, dropTo: map[string]int{}, dropUp: map[string]int{},
	}
	set := map[string]bool{}
	for _, b := range cfg.Budgets {
		for _, r := range b.Regions {
			set[r] = true
		}
	}
	for r := range set {
		c.regions = append(c.regions, r)
	}
	sort.Strings(c.regions)
	a, err := NewAllocator(cfg, c.term, c.now)
	if err != nil {
		t.Fatal(err)
	}
	c.alloc = a
	for _, r := range c.regions {
		c.startHolder(r)
	}
	return c
}

// hnow is region r's clock: it runs at rate[r] of the coordinator's.
func (c *cluster) hnow(r string) time.Time {
	rate, ok := c.rate[r]
	if !ok {
		return c.now
	}
	return t0.Add(time.Duration(float64(c.now.Sub(t0)) * rate))
}

func (c *cluster) startHolder(r string) {
	c.sessions++
	hc := DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets, hc.Drift, hc.Refresh = r, c.sessions, c.cfg.Budgets, c.cfg.Drift, c.cfg.Refresh
	h, err := NewHolder(hc, c.hnow(r))
	if err != nil {
		c.t.Fatal(err)
	}
	c.holders[r] = h
	c.collect()
}

// leaderChange replaces the Allocator with a new one of the next term;
// messages already in flight from the old one are still delivered.
func (c *cluster) leaderChange() {
	c.term++
	c.prev = c.alloc
	a, err := NewAllocator(c.cfg, c.term, c.now)
	if err != nil {
		c.t.Fatal(err)
	}
	c.alloc = a
}

func (c *cluster) collect() {
	for _, m := range c.alloc.Ready() {
		c.trace("%s sent by term %d: %v %v", c.now.Sub(t0), c.alloc.term, m, m.Entries)
		if c.sent != nil {
			c.sent(m)
		}
		c.send(m.Region, m)
	}
	for _, r := range c.regions {
		if c.holders[r] == nil {
			continue
		}
		for _, m := range c.holders[r].Ready() {
			c.send("", m)
		}
	}
}

func (c *cluster) send(to string, m Message) {
	region := to
	if to == "" {
		region = m.Region
	}
	if c.cut[region] {
		return
	}
	if to == "" && c.dropUp[region] > 0 {
		c.dropUp[region]--
		return
	}
	if to != "" && c.dropTo[region] > 0 {
		c.dropTo[region]--
		return
	}
	n := 1
	if c.rng != nil {
		if c.rng.Float64() < c.loss {
			return
		}
		if c.rng.Float64() < c.dup {
			n = 2
		}
	}
	for range n {
		d := c.latency
		if c.rng != nil && c.jitter > 0 {
			d += time.Duration(c.rng.Int64N(int64(c.jitter)))
		}
		c.seq++
		c.net = append(c.net, envelope{at: c.now.Add(d), seq: c.seq, to: to, m: m})
	}
}

// deliver hands every message due by now to its receiver, in time order.
func (c *cluster) deliver() {
	for {
		slices.SortFunc(c.net, func(x, y envelope) int {
			if x.at.Equal(y.at) {
				return int(x.seq - y.seq)
			}
			return x.at.Compare(y.at)
		})
		if len(c.net) == 0 || c.net[0].at.After(c.now) {
			return
		}
		e := c.net[0]
		c.net = c.net[1:]
		if c.cut[e.m.Region] {
			continue
		}
		c.trace("%s deliver to %q: %v %v", c.now.Sub(t0), e.to, e.m, e.m.Entries)
		var err error
		if e.to == "" {
			err = c.alloc.Step(c.now, e.m)
			if c.stepped != nil && err == nil {
				c.stepped(e.m)
			}
		} else if h := c.holders[e.to]; h != nil {
			err = h.Step(c.hnow(e.to), e.m)
		}
		if err != nil {
			c.t.Fatalf("step %v: %v", e.m, err)
		}
		c.collect()
	}
}

func (c *cluster) trace(format string, args ...any) {
	c.log = append(c.log, fmt.Sprintf(format, args...))
	if len(c.log) > 400 {
		c.log = c.log[200:]
	}
}

// step advances the timeline by d: demands are refreshed, messages
// delivered and every state machine ticked.

func (c *cluster) step(d time.Duration) {
	c.now = c.now.Add(d)
	for _, r := range c.regions {
		h := c.holders[r]
		keys := make([]bucket.Key, 0, len(c.demand[r]))
		for k := range c.demand[r] {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, cmpKey)
		for _, k := range keys {
			h.Demand(c.hnow(r), k, c.demand[r][k])
		}
	}
	c.deliver()
	if c.tickEvery == 0 || c.now.Sub(c.lastTick) >= c.tickEvery {
		c.alloc.Tick(c.now)
		c.lastTick = c.now
	}
	for _, r := range c.regions {
		c.holders[r].Tick(c.hnow(r))
	}
	c.collect()
	c.deliver()
}

// keys returns every key any party knows about, sorted.
func (c *cluster) keys() []bucket.Key {
	set := map[bucket.Key]bool{}
	for _, k := range c.alloc.keys {
		set[k.key] = true
	}
	for _, h := range c.holders {
		for k := range h.table {
			set[k] = true
		}
	}
	for _, d := range c.demand {
		for k := range d {
			set[k] = true
		}
	}
	ks := make([]bucket.Key, 0, len(set))
	for k := range set {
		ks = append(ks, k)
	}
	slices.SortFunc(ks, cmpKey)
	return ks
}

// checkI1 verifies on the Holders' side that what regions may use of every
// key sums within its budget's count and burst.
func (c *cluster) checkI1() error {
	for _, k := range c.keys() {
		var b *Budget
		for i := range c.cfg.Budgets {
			if c.cfg.Budgets[i].Rule == k.Rule {
				b = &c.cfg.Budgets[i]
			}
		}
		if b == nil {
			continue
		}
		var cnt, burst bucket.Tokens
		var parts []string
		for _, r := range c.regions {
			h := c.holders[r]
			l, ok := h.Allocation(c.hnow(r), k)
			if !ok {
				continue
			}
			cnt += l.Count()
			burst += l.Burst()
			parts = append(parts, fmt.Sprintf("%s=%d/%d", r, l.Count(), l.Burst()))
		}
		if cnt > b.Limit.Count() || burst > b.Limit.Burst() {
			return fmt.Errorf("I1 broken at %s for %s/%s: sum %d/%d > budget %d/%d (%s)",
				c.now.Sub(t0), k.Rule, k.Subject, cnt, burst, b.Limit.Count(), b.Limit.Burst(), strings.Join(parts, " "))
		}
	}
	return nil
}

// show renders each key's allocation per region as Holders see it, with
// the coordinator's figure in brackets when it differs.
func (c *cluster) show() string {
	var sb strings.Builder
	for _, k := range c.keys() {
		fmt.Fprintf(&sb, "%s/%s:", k.Rule, k.Subject)
		var sum bucket.Tokens
		for _, r := range c.regions {
			l, _ := c.holders[r].Allocation(c.hnow(r), k)
			sum += l.Count()
			fmt.Fprintf(&sb, " %s=%d", r, l.Count())
			if j, ok := c.alloc.keyIdx[k]; ok {
				kk := c.alloc.keys[j]
				if i := slices.Index(kk.bud.regions, c.alloc.byName[r]); i >= 0 && bucket.Tokens(kk.slots[i].cur) != l.Count() {
					fmt.Fprintf(&sb, "[%d]", kk.slots[i].cur)
				}
			}
		}
		fmt.Fprintf(&sb, " sum=%d\n", sum)
	}
	for _, r := range c.regions {
		st := c.holders[r].Status(c.hnow(r))
		live := "floors"
		if st.Live {
			live = "leased " + st.LeaseEnd.Sub(c.now).Round(time.Millisecond).String()
		}
		fmt.Fprintf(&sb, "%s: term=%d ver=%d %s\n", r, st.Term, st.Version, live)
	}
	return sb.String()
}

// checkClaims verifies, outside learning, that the Allocator's claim for
// every region and key bounds what the region's Holder may use now, and
// that the claims sum within the budget: the coordinator-side half of I1.
func (c *cluster) checkClaims() error {
	if err := c.checkClaimsOf(c.alloc); err != nil {
		return err
	}
	if c.prev != nil {
		return c.checkClaimsOf(c.prev)
	}
	return nil
}

func (c *cluster) checkClaimsOf(a *Allocator) error {
	if a.Learning(c.now) {
		return nil
	}
	for _, k := range a.keys {
		var sum int64
		for i, r := range k.bud.regions {
			s := &k.slots[i]
			cl := a.claim(c.now, c.now, r, s, k.bud.floors[i])
			sum += cl
			if h := c.holders[r.name]; h != nil && h.term == a.term && h.cfg.Session == r.session {
				l, _ := h.Allocation(c.hnow(r.name), k.key)
				if int64(l.Count()) > cl {
					return fmt.Errorf("claim for %s on %s/%s is %d but its holder may use %d (cur %d hist %v acked %d ver %d lease %s commit %s)",
						r.name, k.key.Rule, k.key.Subject, cl, l.Count(), s.cur, s.hist[:s.n], r.acked, r.version,
						r.leaseEnd.Sub(c.now), r.commitEnd.Sub(c.now))
				}
			}
		}
		_ = sum // may exceed the budget while acknowledgements are awaited
	}
	return nil
}
