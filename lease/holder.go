package lease

import (
	"cmp"
	"fmt"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// HolderConfig configures a region's end of the protocol.
type HolderConfig struct {
	// Region is this region's name, as the budgets list it.
	Region string
	// Session identifies this Holder's incarnation: nonzero, and different
	// from every earlier incarnation of the region (drivers draw it from
	// their seeded random source or the start time).
	Session uint64
	// Budgets are the budgets whose floors this region may use with no
	// lease. They must match the coordinator's.
	Budgets []Budget
	// Drift is this end's margin for clock drift over one TTL (see
	// Config.Drift); the larger of it and the coordinator's is used.
	Drift time.Duration
	// Refresh is how often to report until the first grant names the
	// coordinator's interval.
	Refresh time.Duration
}

// DefaultHolderConfig returns a HolderConfig with the defaults matching
// DefaultConfig; Region, Session and Budgets are left to the caller.
func DefaultHolderConfig() HolderConfig {
	d := DefaultConfig()
	return HolderConfig{Drift: d.Drift, Refresh: d.Refresh}
}

// Validate reports the first problem with c, naming the field and value.
func (c HolderConfig) Validate() error {
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: holder region is empty", ErrInvalidConfig)
	case c.Session == 0:
		return fmt.Errorf("%w: holder session=0 must be nonzero", ErrInvalidConfig)
	case c.Drift < 0:
		return fmt.Errorf("%w: holder drift=%s must be ≥ 0", ErrInvalidConfig, c.Drift)
	case c.Refresh <= 0:
		return fmt.Errorf("%w: holder refresh=%s must be > 0", ErrInvalidConfig, c.Refresh)
	}
	return validateBudgets(c.Budgets)
}

// Holder is a region's end of the lease protocol: it holds the region's
// allocation table and lease, reports demand, applies and acknowledges grants
// and answers "what may this region use for this key now" (Allocation).
//
// A Holder measures its lease from when it sent the request a grant answers,
// minus the drift margin (invariant I4), and without a live lease falls back
// to its floors (I5), keeping any floor it lent below the floor until the
// lend's hold ends, plus the drift margin in proportion to the hold. It
// ignores grants from an older leader term.
//
// A Holder is not safe for concurrent use; its driver serializes calls.
type Holder struct {
	cfg     HolderConfig
	budgets map[string]*holderBudget

	term      uint64
	version   uint64
	table     map[bucket.Key]Entry
	leaseEnd  time.Time
	holdUntil time.Time
	released  bool

	ttl, hold, refresh, drift time.Duration

	seq  uint64
	sent [64]sentAt // ring of request send times, by seq

	wantHello  bool
	lastHello  time.Time
	lastReport time.Time
	demand     map[bucket.Key]*holderDemand
	// fedAt is the latest time the region's whole demand was given (Fed).
	fedAt  time.Time
	urgent bool
	// credits are the stored reserve tokens of adopted grants not yet
	// taken (TakeCredits). They are not part of a Snapshot: a new
	// speaking agent does not put them in the buckets again.
	credits map[bucket.Key]bucket.Tokens
	// ahead are renewals of versions the Holder has not reached: their
	// delta is still on its way (messages reordered), or lost. Each
	// extends the lease once the Holder reaches its version, as it would
	// have arriving in order.
	ahead [aheadKept]aheadRenewal
	// early are deltas of the current term that arrived before the grant
	// they build on (messages reordered), kept until it arrives, at most
	// aheadKept of them.
	early []Message
	// expired is the number of the term's latest expiry: a grant numbered
	// at most that was sent before it and is void.
	expired uint64

	out []Message
}

// aheadKept is how many renewals ahead of the table a Holder keeps: the
// latest few versions, enough for the reordering of one round trip.
const aheadKept = 4

// aheadRenewal is a renewal of version ver, which extends the lease to end.
type aheadRenewal struct {
	ver uint64
	end time.Time
}

type holderBudget struct {
	b      Budget
	floor  bucket.Tokens
	burst  bucket.Tokens
	limit  bucket.Limit // the floor as a Limit, built once
	period time.Duration
}

type holderDemand struct {
	want     bucket.Tokens
	at       time.Time
	reported time.Time     // last urgent report
	sent     bucket.Tokens // want carried by the last report or hello
	// cooling: the last urgent report was of a fall, and the demand has
	// not risen back to what it said since.
	cooling bool
}

// urgentEvery is the fraction of the refresh interval that must pass
// between two urgent reports of one key, and urgentSoon the fraction for a
// key whose demand grew by half while pressing (soonNum/soonDen) or halved
// while cooling since it was last reported: a region's demand estimate
// takes a level its use has held for a moment at once, so a change that
// large is a new level another region waits on (the region that heated,
// for what this one gives back; or this one, for what it asks), not
// noise, and a quarter of a refresh interval between such reports was
// most of a move's time in rotating-hot. A sixteenth (125 ms at refresh
// 2 s) still put the second report of a region that cooled (its estimate
// takes a fall in one or two steps) two of its speaker's 100 ms ticks
// after the first instead of one; a thirty-second gained rotating-hot
// 0.005 at seeds 1–3.
//
// A rise by half, not a doubling: the region's demand is the sum of each
// agent's last report to the speaker, so the first urgent report of a rise
// can carry the new level from one agent and the old from another, and
// the whole level then arrives as a rise of less than double, which waited
// a quarter of a refresh interval (in rotating-failovers, a hot region
// reported 3,367 and then 6,178 a quarter-second later, granted meanwhile
// what the first said). Over seeds 1–10, both forms, this gained
// ten-regions-moving-crowd 0.004 and rotating-hot-dup-reorder-tight 0.008
// on the worst budget and left the static split ahead at every seed on 49
// budgets instead of 52 (bursty-diurnal 5 → 2), at 13.9 steady lease
// messages a second on average instead of 13.6, at most 14.9 as before.
const (
	urgentEvery      = 4
	urgentSoon       = 32
	soonNum, soonDen = 3, 2
)

// Demand changes that are reported at once, between refreshes: a key
// pressing on its allocation whose demand grew by a quarter beyond both
// its allocation and what it last reported (it is still ramping up:
// waiting a refresh interval would leave it granted what its first urgent
// report said; a key whose demand crosses its allocation by less is within
// the noise its headroom allows for, and the periodic report carries it —
// reporting each such crossing at once took steady-skewed's lease messages
// from 14.5 to 33 a second), and a key holding
// an allocation above its floor whose demand fell below it and by half
// since it was last reported (it is cooling: what it no longer uses is
// another region's to take, and its estimate may reach its new use in more
// than one step), or holding a granted part of its floor (the rest lent)
// when its use stopped: a first reading of a fall can leave the region
// granted less than its floor, and the second, to nothing, which the
// coordinator answers by lending the rest at once, then waited for the
// periodic report (once: a stop the coordinator was told of is not told
// again while a hold keeps the share). A mere halving below the floor is
// not reported at once:
// the light regions of contested budgets in steady state hold such shares,
// and reporting their halvings raised steady-skewed's lease messages to 15
// a second at seeds 2 and 3.
const (
	rampNum, rampDen = 5, 4
	dropNum, dropDen = 1, 2
	// A fall reported at once is often read in steps: the region's demand
	// sums each agent's estimate, and an agent takes a fall first from a
	// window that began before it (region/demand.go), so the first report can
	// carry a level between the old and the new, from one agent or all; the
	// next readings, a window or two later, are the level. While cooling
	// (since a fall by half, until the demand is back at what was last
	// reported), each further fall by a third (stepNum/stepDen) below the
	// allocation is reported at once too, above the floor or below it (a
	// floor its owner does not use is lent). Waiting for a fall by half, it
	// waited for the periodic report: in the chaos harness's healthy run a
	// region falling from 900 to 150 a second reported 282 at once and then
	// 150 (53%) half a second later, and the region the demand had moved to
	// reached 95% of its fair share 1.6 s after the move, against 0.4–1.0 s
	// for the other moves. By a quarter or an eighth the library lost more
	// than it gained (docs/design.md, "Since: a cooling region's steps
	// reported at once"). Steady noise does not start it: only a fall by half
	// does.
	stepNum, stepDen = 2, 3
)

type sentAt struct {
	seq uint64
	at  time.Time
}

// HolderState is what a Holder must keep across a restart of its driver so
// lent floors stay lent: a region that restarts without it may overshoot by
// the floors it had lent, until their hold would have ended.
type HolderState struct {
	Session   uint64
	Term      uint64
	Version   uint64
	Seq       uint64
	LeaseEnd  time.Time
	HoldUntil time.Time
	Released  bool
	Entries   []Entry
	// Floors are the region's floors of the Holder's budgets, by rule: the
	// coordinator's once a full grant brought its budgets (Snapshot fills
	// them; RestoreHolder takes its floors from the config instead).
	Floors []BudgetFloor
}

// BudgetFloor is a budget's floor in a region, with the global limit it
// was computed from: Floor tokens per Period with a burst of Burst, of a
// budget of Count per Period with a burst of GlobalBurst.
type BudgetFloor struct {
	Rule        string        `json:"rule"`
	Count       bucket.Tokens `json:"count"`
	Period      time.Duration `json:"period"`
	GlobalBurst bucket.Tokens `json:"global_burst"`
	Floor       bucket.Tokens `json:"floor"`
	Burst       bucket.Tokens `json:"burst"`
}

// NewHolder returns a Holder with no lease: every key is at its floor, and
// the first Ready holds a hello.
func NewHolder(cfg HolderConfig, now time.Time) (*Holder, error) {
	return RestoreHolder(cfg, HolderState{Session: cfg.Session}, now)
}

// RestoreHolder returns a Holder resuming st (from Snapshot). The session
// is st.Session when nonzero. It says hello at once.
func RestoreHolder(cfg HolderConfig, st HolderState, now time.Time) (*Holder, error) {
	if st.Session != 0 {
		cfg.Session = st.Session
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	h := &Holder{
		cfg:       cfg,
		term:      st.Term,
		version:   st.Version,
		seq:       st.Seq,
		leaseEnd:  st.LeaseEnd,
		holdUntil: st.HoldUntil,
		released:  st.Released,
		table:     make(map[bucket.Key]Entry, len(st.Entries)),
		demand:    make(map[bucket.Key]*holderDemand),
		refresh:   cfg.Refresh,
		drift:     cfg.Drift,
		wantHello: true,
	}
	h.setBudgets(cfg.Budgets)
	for _, e := range st.Entries {
		h.table[e.Key] = e
	}
	h.Tick(now)
	return h, nil
}

// SetBudgets replaces the budgets (after a rules change). Floors change at
// once; allocations for rules no longer served are dropped.
func (h *Holder) SetBudgets(bs []Budget) error {
	if err := validateBudgets(bs); err != nil {
		return err
	}
	h.setBudgets(bs)
	for k := range h.table {
		if h.budgets[k.Rule] == nil {
			delete(h.table, k)
		}
	}
	return nil
}

func (h *Holder) setBudgets(bs []Budget) {
	h.budgets = make(map[string]*holderBudget, len(bs))
	for _, b := range bs {
		f := b.Floor(h.cfg.Region)
		h.budgets[b.Rule] = &holderBudget{b: b, floor: f.Count, burst: f.Burst, limit: f.Limit, period: b.Limit.Period()}
	}
}

// Budgets returns the budgets the Holder serves: its configured ones until
// a coordinator's full table brings the coordinator's.
func (h *Holder) Budgets() []Budget {
	out := make([]Budget, 0, len(h.budgets))
	for _, hb := range h.budgets {
		out = append(out, hb.b)
	}
	slices.SortFunc(out, func(x, y Budget) int { return cmp.Compare(x.Rule, y.Rule) })
	return out
}

// Allocation returns what this region may use of key at now: its leased
// allocation while the lease lives, its floor otherwise (a lent floor stays
// lent until its hold ends). ok is false when no budget covers key.Rule. A
// zero Limit with ok true means the region may admit nothing for the key.
func (h *Holder) Allocation(now time.Time, key bucket.Key) (l bucket.Limit, ok bool) {
	hb := h.budgets[key.Rule]
	if hb == nil {
		return bucket.Limit{}, false
	}
	c, b := h.allocation(now, key, hb)
	if c == hb.floor && b == hb.burst {
		return hb.limit, true
	}
	return limitOf(hb.period, c, b), true
}

// allocation is Allocation as a count and burst.
func (h *Holder) allocation(now time.Time, key bucket.Key, hb *holderBudget) (bucket.Tokens, bucket.Tokens) {
	e, ok := h.table[key]
	if !ok {
		return hb.floor, hb.burst
	}
	if !h.released && now.Before(h.leaseEnd) {
		return e.Count, e.Burst
	}
	if e.Count < hb.floor && now.Before(h.holdUntil) {
		return e.Count, min(e.Burst, hb.burst)
	}
	return hb.floor, hb.burst
}

// Demand records that the region would use want tokens per the budget's
// period of key (admitted plus denied, over recent arrivals). Call it, at
// least once every refresh interval, for every key the region uses or holds
// an entry for, however little it uses: every report carries all demand
// recorded within the last refresh interval or at the latest feed (Fed),
// and a key missing from a report counts as unused, so its floor may be
// lent to a region pressing on the budget. (The Allocator keeps state only
// for keys some region presses on, so reporting light use costs it no
// memory.) A key pressing on its allocation is reported at once; the
// others ride on the next periodic report. Keys of unknown rules are
// ignored. A want above the budget's count is sent as the count (demands).
func (h *Holder) Demand(now time.Time, key bucket.Key, want bucket.Tokens) {
	hb := h.budgets[key.Rule]
	if hb == nil || want < 0 {
		return
	}
	d := h.demand[key]
	if d == nil {
		d = &holderDemand{}
		h.demand[key] = d
	}
	d.want, d.at = want, now
	if h.released {
		return
	}
	c, _ := h.allocation(now, key, hb)
	since := now.Sub(d.reported)
	// base is what the demand must grow beyond to be worth a report of its
	// own: the allocation, which the region already has, and what the
	// coordinator was last told.
	base := max(c, d.sent)
	soon := d.reported.IsZero() || since >= h.refresh/urgentSoon
	switch {
	case want > c && (d.reported.IsZero() ||
		since >= h.refresh/urgentEvery && want*rampDen >= base*rampNum ||
		soon && want*soonDen >= base*soonNum):
		d.cooling = false
	case want < c && soon && ((c > hb.floor || want == 0 && d.sent > 0 && h.granted(key)) && want*dropDen <= d.sent*dropNum ||
		d.cooling && d.sent > 0 && want*stepDen <= d.sent*stepNum):
		d.cooling = true
	default:
		if want >= d.sent {
			d.cooling = false
		}
		return
	}
	d.reported = now
	h.urgent = true
}

// Fed records that every key the region uses was given to Demand at now,
// the time of those calls. A key given then keeps its demand until a later
// feed, however late that comes, for up to feedKeep refresh intervals: a
// feed that comes late (a speaker slowed by its store reads the agents'
// reports late) says nothing about the demand, and reading it as gone
// lent the region's floor and took it back at every late feed. Without
// feeds a demand counts for one refresh interval (Demand).
func (h *Holder) Fed(now time.Time) {
	h.fedAt = now
}

// feedKeep is how many refresh intervals the demand of the latest feed
// counts while no later feed comes: a few late reads of the agents'
// reports, as long as the speaker keeps an agent's report (DemandMaxAge).
const feedKeep = 4

// granted reports whether the coordinator's table gives the region an
// entry for key.
func (h *Holder) granted(key bucket.Key) bool {
	_, ok := h.table[key]
	return ok
}

// Step applies a message from the coordinator. Messages for another
// session, from an older term, sent before an expiry, or duplicated are
// ignored or answered idempotently; deltas ahead of the table are kept
// until it reaches them, and a renewal behind it renews it. The error is
// only for a message type a Holder does not accept.
func (h *Holder) Step(now time.Time, m Message) error {
	switch m.Type {
	case MsgGrant, MsgExpire, MsgResync:
	case MsgRedirect:
		return nil
	default:
		return fmt.Errorf("%w: holder got %s", ErrBadMessage, m.Type)
	}
	if m.Session != h.cfg.Session || m.Term < h.term {
		return nil
	}
	switch m.Type {
	case MsgResync:
		h.wantHello = true
		h.lastHello = time.Time{}
	case MsgExpire:
		if m.Term > h.term {
			h.term, h.version, h.expired = m.Term, 0, 0
			h.wantHello = true
		}
		h.leaseEnd = minTime(h.leaseEnd, now)
		// Renewals and deltas kept ahead were sent before the expiry,
		// which ends them (and a new term's versions start again), as
		// it ends any that arrive after it.
		h.forgetAhead()
		h.expired = max(h.expired, m.Grant)
		h.capToFloors()
		h.ack(m)
	case MsgGrant:
		h.grant(now, m)
	}
	h.Tick(now)
	return nil
}

func (h *Holder) grant(now time.Time, m Message) {
	if h.released || m.Term == h.term && m.Grant <= h.expired {
		return // or sent before an expiry, which ends it
	}
	apply, renew := false, false
	switch { // Step dropped older terms: past the first case, m.Term == h.term
	case m.Term > h.term:
		if !m.Full {
			h.wantHello = true
			h.lastHello = time.Time{}
			return
		}
		h.term, h.version, h.expired = m.Term, 0, 0
		h.forgetAhead() // versions and grant numbers start again in a new term
		apply = true
	case m.Version > h.version && (m.Full || m.Base == h.version):
		apply = true
	case m.Version == h.version:
		renew = true // a duplicate or a renewal of the table we have
	case m.Version < h.version && m.Renew:
		// A renewal that later deltas overtook. In order it would have
		// extended the lease before they changed the table, which they
		// do not undo (the Allocator measured each of them against a
		// window that covers every renewal it had sent): the same
		// lease and table as in order.
		renew = true
	case m.Version > h.version:
		// A delta on a version we never saw: a grant was lost, or is
		// still on its way. A renewal extends the lease once the Holder
		// reaches its version (renewAhead), and a delta applies once
		// the grant it builds on arrives (keepEarly); a hello meanwhile
		// asks for the whole table in case it was lost.
		if m.Renew {
			h.renewAhead(m)
		}
		h.keepEarly(m)
		h.wantHello = true
		h.lastHello = time.Time{}
		return
	default:
		return // older than our table
	}
	if apply {
		h.apply(now, m)
		h.version = m.Version
		h.wantHello = false
		h.renewReached()
	}
	if m.TTL > 0 {
		h.ttl, h.hold, h.drift = m.TTL, m.Hold, max(h.cfg.Drift, m.Drift)
	}
	if m.Refresh > 0 {
		h.refresh = m.Refresh
	}
	// A lent floor stays lent Hold after this grant, plus the drift margin
	// in proportion to Hold: the Allocator relies on it for Hold less as
	// much, measured from when it sent the grant.
	h.holdUntil = maxTime(h.holdUntil, now.Add(h.hold+marginOver(h.drift, h.ttl, h.hold)))
	if m.Renew && (apply || renew) {
		if end, ok := h.renewalEnd(m); ok {
			h.leaseEnd = maxTime(h.leaseEnd, end)
		}
	}
	if !m.Quiet {
		h.ack(m) // a grant that only raises asks for none (Message.Quiet)
	}
	if apply {
		h.applyEarly(now)
	}
}

// keepEarly keeps delta m, which builds on a version the Holder has not
// reached, until that version arrives (applyEarly). Without room, or for a
// renewal of a version with no change (nothing to apply: renewAhead kept
// it), it keeps nothing.
func (h *Holder) keepEarly(m Message) {
	if m.Base == m.Version {
		return
	}
	for _, e := range h.early {
		if e.Version == m.Version {
			return // a duplicate
		}
	}
	if len(h.early) < aheadKept {
		h.early = append(h.early, m)
	}
}

// applyEarly forgets the kept deltas the Holder's version has passed and
// applies the one that now builds on it, if any; grant, applying it, comes
// back here for the next, so they apply in order.
func (h *Holder) applyEarly(now time.Time) {
	h.early = slices.DeleteFunc(h.early, func(e Message) bool { return e.Version <= h.version })
	if i := slices.IndexFunc(h.early, func(e Message) bool { return e.Base == h.version }); i >= 0 {
		m := h.early[i]
		h.early = slices.Delete(h.early, i, i+1)
		h.grant(now, m)
	}
}

// forgetAhead drops every renewal and delta kept ahead of the table.
func (h *Holder) forgetAhead() {
	clear(h.ahead[:])
	h.early = nil
}

// renewAhead keeps renewal m of a version the Holder has not reached. Its
// lease is measured as any renewal's: from when the request it answers was
// sent (I4). It was sent after every grant up to its version, so taken
// once the Holder has that version (or a later one) it extends the lease
// exactly as it would have arriving after them.
func (h *Holder) renewAhead(m Message) {
	end, ok := h.renewalEnd(m)
	if !ok {
		return
	}
	r := aheadRenewal{ver: m.Version, end: end}
	// Replace the slot of the same version, else the one ending first.
	j := 0
	for i, a := range h.ahead {
		if a.ver == r.ver {
			if a.end.Before(r.end) {
				h.ahead[i] = r
			}
			return
		}
		if a.end.Before(h.ahead[j].end) {
			j = i
		}
	}
	if h.ahead[j].end.Before(r.end) {
		h.ahead[j] = r
	}
}

// renewalEnd is where renewal m extends the lease: TTL less the drift
// margin (m's when it carries them) from when the request it answers was
// sent (I4); false when that request is not one this Holder sent lately.
func (h *Holder) renewalEnd(m Message) (time.Time, bool) {
	at, ok := h.sentTime(m.Seq)
	if !ok {
		return time.Time{}, false
	}
	ttl, drift := h.ttl, h.drift
	if m.TTL > 0 {
		ttl, drift = m.TTL, max(h.cfg.Drift, m.Drift)
	}
	return at.Add(ttl - drift), true
}

// renewReached extends the lease by every kept renewal of a version the
// Holder has now reached, and forgets them.
func (h *Holder) renewReached() {
	for i, a := range h.ahead {
		if a.ver != 0 && a.ver <= h.version {
			h.leaseEnd = maxTime(h.leaseEnd, a.end)
			h.ahead[i] = aheadRenewal{}
		}
	}
}

// apply changes the table by m's entries. A learning leader's grant only
// ever lowers what the region may use now.
func (h *Holder) apply(now time.Time, m Message) {
	var was map[bucket.Key]Entry
	if m.Learning {
		was = make(map[bucket.Key]Entry, len(h.table)+len(m.Entries))
		for k := range h.table {
			c, b := h.allocation(now, k, h.budgets[k.Rule])
			was[k] = Entry{Key: k, Count: c, Burst: b}
		}
	}
	if m.Full {
		clear(h.table)
		if m.Budgets != nil && validateBudgets(m.Budgets) == nil {
			h.setBudgets(m.Budgets)
		}
	}
	for _, e := range m.Entries {
		if e.Credit > 0 && !m.Learning && h.budgets[e.Key.Rule] != nil {
			if h.credits == nil {
				h.credits = make(map[bucket.Key]bucket.Tokens)
			}
			h.credits[e.Key] += e.Credit
		}
		e.Credit = 0
		if e.Drop {
			delete(h.table, e.Key)
		} else if h.budgets[e.Key.Rule] != nil {
			h.table[e.Key] = e
		}
	}
	if !m.Learning {
		return
	}
	// Keys whose entry went away now sit at their floor; keys that gained
	// one were at their floor before.
	for _, e := range m.Entries {
		if _, ok := was[e.Key]; !ok && h.budgets[e.Key.Rule] != nil {
			hb := h.budgets[e.Key.Rule]
			was[e.Key] = Entry{Key: e.Key, Count: hb.floor, Burst: hb.burst}
		}
	}
	for k, old := range was {
		hb := h.budgets[k.Rule]
		if hb == nil {
			continue
		}
		e, ok := h.table[k]
		if !ok {
			e = Entry{Key: k, Count: hb.floor, Burst: hb.burst}
		}
		if old.Count < e.Count {
			e = old
		}
		if e.Count == hb.floor {
			delete(h.table, k)
		} else {
			h.table[k] = e
		}
	}
}

func (h *Holder) ack(m Message) {
	h.send(Message{Type: MsgAck, Term: h.term, Grant: m.Grant, Version: h.version}, time.Time{})
}

// capToFloors drops every entry at or above its floor, keeping lent ones.
func (h *Holder) capToFloors() {
	for k, e := range h.table {
		if hb := h.budgets[k.Rule]; hb == nil || e.Count >= hb.floor {
			delete(h.table, k)
		}
	}
}

// Tick moves the Holder to now: it says hello until a leader answers and
// reports every refresh interval (the report renews the lease).
func (h *Holder) Tick(now time.Time) {
	if h.released {
		return
	}
	if h.wantHello {
		if h.lastHello.IsZero() || now.Sub(h.lastHello) >= h.refresh {
			h.hello(now)
		}
		return
	}
	if h.urgent || h.lastReport.IsZero() || now.Sub(h.lastReport) >= h.refresh {
		h.report(now)
	}
}

// Reconnect tells the Holder its transport opened a new stream (perhaps to
// another coordinator): it says hello at once.
func (h *Holder) Reconnect(now time.Time) {
	if h.released {
		return
	}
	h.wantHello = true
	h.hello(now)
}

func (h *Holder) hello(now time.Time) {
	h.lastHello = now
	h.lastReport = now
	// Only what the Holder may use now: entries of a lapsed lease are not
	// held, and a new leader must not renew them as if they were.
	var entries []Entry
	for _, e := range h.Table() {
		hb := h.budgets[e.Key.Rule]
		if hb == nil {
			continue
		}
		if c, b := h.allocation(now, e.Key, hb); c != hb.floor {
			entries = append(entries, Entry{Key: e.Key, Count: c, Burst: b})
		}
	}
	h.send(Message{Type: MsgHello, Term: h.term, Version: h.version, Entries: entries, Demand: h.demands(now)}, now)
}

func (h *Holder) report(now time.Time) {
	h.lastReport = now
	h.urgent = false
	h.send(Message{Type: MsgReport, Term: h.term, Version: h.version, Demand: h.demands(now)}, now)
}

// demands lists the demand recorded within the last refresh interval or
// at the latest feed (Fed), and once more with Want 0 a key whose demand
// has gone. A want above the budget's count is sent as the count: no
// region can use more than the whole budget, and the coordinator cuts
// every want to it, counting each cut as a sign of a broken or hostile
// region, so an honest region never sends one above it. (Demand's urgency
// rules still read the whole want: a rise beyond the budget is reported
// at once as before, which renews the lease sooner after a lost grant.)
func (h *Holder) demands(now time.Time) []Demand {
	var ds []Demand
	fed := !h.fedAt.IsZero() && now.Sub(h.fedAt) <= feedKeep*h.refresh
	for k, d := range h.demand {
		if now.Sub(d.at) > h.refresh && !(fed && d.at.Equal(h.fedAt)) {
			if d.want == 0 {
				delete(h.demand, k)
				continue
			}
			d.want = 0 // say once that the demand has gone
		}
		want := d.want
		if hb := h.budgets[k.Rule]; hb != nil {
			want = min(want, hb.b.Limit.Count())
		}
		ds = append(ds, Demand{Key: k, Want: want})
		d.sent = d.want
	}
	slices.SortFunc(ds, func(a, b Demand) int { return cmpKey(a.Key, b.Key) })
	return ds
}

// send queues m; a nonzero at records it as a request the lease may be
// measured from.
func (h *Holder) send(m Message, at time.Time) {
	h.seq++
	m.Seq = h.seq
	m.Region = h.cfg.Region
	m.Session = h.cfg.Session
	if !at.IsZero() {
		h.sent[h.seq%uint64(len(h.sent))] = sentAt{seq: h.seq, at: at}
	}
	h.out = append(h.out, m)
}

func (h *Holder) sentTime(seq uint64) (time.Time, bool) {
	s := h.sent[seq%uint64(len(h.sent))]
	return s.at, s.seq == seq && seq != 0
}

// Release gives back everything above the floors, for a clean shutdown:
// the Holder stops using its lease at once and tells the coordinator.
func (h *Holder) Release(now time.Time) {
	if h.released {
		return
	}
	h.leaseEnd = minTime(h.leaseEnd, now)
	h.capToFloors()
	h.send(Message{Type: MsgRelease, Term: h.term, Version: h.version}, time.Time{})
	h.released = true
}

// Ready returns the messages to send, in order, and forgets them.
func (h *Holder) Ready() []Message {
	out := h.out
	h.out = nil
	return out
}

// ReadyReports returns the reports and hellos Ready would return, in
// order, and forgets them; the other messages (acknowledgements, and a
// release) stay for Ready. A driver that carries out a region's grants on
// a goroutine of its own (agent.LeaseClient) sends these at once, while a
// carry is under way: a report needs nothing settled or published first,
// and the coordinator takes a report overtaking an acknowledgement, or an
// acknowledgement overtaking a report, as it takes them reordered by the
// network.
func (h *Holder) ReadyReports() []Message {
	var out []Message
	keep := h.out[:0]
	for _, m := range h.out {
		if m.Type == MsgReport || m.Type == MsgHello {
			out = append(out, m)
		} else {
			keep = append(keep, m)
		}
	}
	clear(h.out[len(keep):])
	h.out = keep
	return out
}

// HasReady reports whether Ready would return messages.
func (h *Holder) HasReady() bool { return len(h.out) > 0 }

// TakeCredits returns the stored reserve tokens, by key, that the grants
// adopted since the last call carried (Entry.Credit), and forgets them: the
// caller puts each in its key's regional bucket once, after the bucket
// took the key's allocation (region.Settler). Tokens the caller cannot put
// in are lost, which only lowers what the region admits.
func (h *Holder) TakeCredits() map[bucket.Key]bucket.Tokens {
	c := h.credits
	h.credits = nil
	return c
}

// Table returns the allocation entries the Holder holds, sorted by key.
func (h *Holder) Table() []Entry {
	es := make([]Entry, 0, len(h.table))
	for _, e := range h.table {
		es = append(es, e)
	}
	slices.SortFunc(es, func(a, b Entry) int { return cmpKey(a.Key, b.Key) })
	return es
}

// HolderStatus describes a Holder's lease for metrics and tests.
type HolderStatus struct {
	Region    string
	Session   uint64
	Term      uint64
	Version   uint64
	Live      bool      // the lease lives at the time asked
	LeaseEnd  time.Time // when the lease ends (Holder's clock)
	HoldUntil time.Time // when lent floors return
	Entries   int
	Released  bool
}

// Status reports the Holder's lease at now.
func (h *Holder) Status(now time.Time) HolderStatus {
	return HolderStatus{
		Region: h.cfg.Region, Session: h.cfg.Session, Term: h.term, Version: h.version,
		Live: !h.released && now.Before(h.leaseEnd), LeaseEnd: h.leaseEnd, HoldUntil: h.holdUntil,
		Entries: len(h.table), Released: h.released,
	}
}

// Snapshot returns the state to persist for RestoreHolder.
func (h *Holder) Snapshot() HolderState {
	return HolderState{
		Session: h.cfg.Session, Term: h.term, Version: h.version, Seq: h.seq,
		LeaseEnd: h.leaseEnd, HoldUntil: h.holdUntil, Released: h.released, Entries: h.Table(),
		Floors: h.floors(),
	}
}

// floors returns the region's floor of each budget, sorted by rule.
func (h *Holder) floors() []BudgetFloor {
	out := make([]BudgetFloor, 0, len(h.budgets))
	for rule, hb := range h.budgets {
		out = append(out, BudgetFloor{Rule: rule, Count: hb.b.Limit.Count(), Period: hb.period,
			GlobalBurst: hb.b.Limit.Burst(), Floor: hb.floor, Burst: hb.burst})
	}
	slices.SortFunc(out, func(a, b BudgetFloor) int { return cmp.Compare(a.Rule, b.Rule) })
	return out
}

func cmpKey(a, b bucket.Key) int {
	if c := cmp.Compare(a.Rule, b.Rule); c != 0 {
		return c
	}
	return cmp.Compare(a.Subject, b.Subject)
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}
