package lease

import (
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// Allocator is the coordinator's end of the lease protocol: it splits every
// hot key's budget among regions and leases each region its allocation
// table, keeping invariant I1 (see the package documentation).
//
// An Allocator serves one leader term. A coordinator that becomes leader
// builds a new Allocator with the term from its election; it learns what
// regions hold before it grants any increase: until every region has
// acknowledged a grant of its term, for at most TTL+2×Drift.
//
// Rounds run from Tick every Refresh: every hot key is rebalanced and every
// region's lease renewed. Between rounds, a report of a key pressing on its
// allocation is answered at once from capacity that is provably free (the
// reserve, or what regions have given back).
//
// An Allocator is not safe for concurrent use; its driver serializes calls.
type Allocator struct {
	cfg        Config
	term       uint64
	learnUntil time.Time
	learnFrom  time.Time // when learning began: grants sent since are in the new term and budgets
	lastRound  time.Time
	lastFeed   time.Time // the last Tick between rounds to feed every key waiting
	lastNear   time.Time // the last Tick between rounds to feed the keys waiting for 1/nearShare of their budget or more
	roundNow   bool      // run a round at the next Tick
	expiring   bool
	// first: no leader served these regions before this one
	// (NewFirstAllocator), so every key's stored reserve starts full.
	first bool

	regions []*region // sorted by name
	byName  map[string]*region
	budgets map[string]*budget

	keys   []*hotKey
	keyIdx map[bucket.Key]int

	out   []Message
	stats Stats

	// starved lists keys where a region got less than its target because
	// capacity was not yet provably free; an ack may free it.
	starved, starvedSpare []*hotKey
	recheck               bool // an ack arrived while keys were starved
	// heldUntil is the earliest end (Unix ns, 0 none) of a hold that keeps
	// a floor in a region that no longer wants it (its peak over the fill
	// time), in a key where another region waits for capacity: the keys
	// waiting are rebalanced then, not at the next report or round, which
	// may be a refresh interval later.
	heldUntil int64

	// Scratch space for allocate, sized to the largest budget.
	tgt, lb, want, bare, base, demand, keep []int64
	dist, rem                               []int64 // apportion's
	order, free                             []int
	small, tried                            []bool
}

// Stats are cumulative counters and current gauges, for metrics.
type Stats struct {
	Grants      uint64 // grant messages sent
	Renewals    uint64 // grants that renewed a lease
	Increases   uint64 // entry increases sent
	Decreases   uint64 // entry decreases sent (reclaims)
	Blocked     uint64 // renewals withheld until a decrease is acknowledged
	Expired     uint64 // region leases that lapsed at the coordinator
	Urgent      uint64 // keys rebalanced between rounds on a report
	Fed         uint64 // Ticks between rounds that rebalanced every key waiting on acknowledgements (not on capacity a lease, lend or hold freed)
	FedNear     uint64 // Ticks between rounds that rebalanced only the keys waiting for 1/nearShare of their budget or more
	Rounds      uint64
	HotKeys     int    // keys with allocations now
	Learning    bool   // no increases yet
	Overcounted int    // keys whose escrow sum exceeds the budget (awaiting acks)
	Carried     uint64 // stored reserve tokens sent with grants (Entry.Credit)
	Returned    uint64 // tokens regions' decreases took away, put back in stored reserves (Message.Returns)
}

type budget struct {
	b     Budget
	count int64
	// fill is how long an empty bucket of the budget takes to fill
	// (Burst/Count × Period), in ns. A floor is lent only down to the most
	// its region wanted over that time: a bucket whose allocation moves
	// faster than it fills loses burst at every move (an increase arrives
	// spent), so a lull between bursts must not lend the floor the next
	// burst needs.
	fill int64
	// unit is the smallest allocation whose burst is at least 1
	// (BurstOf): below it a region admits nothing.
	unit int64
	// noise is the headroom a region's bucket needs against its demand's
	// noise, whatever the demand (Config.NoiseHeadroom).
	noise int64
	// reserveCount and reserveBurst are what the floors leave of the count
	// and of the burst: the stored reserve's rate and size while every
	// region is at its floor; reserveFill (ns) is at least the time that
	// rate takes to fill that size.
	reserveCount, reserveBurst, reserveFill int64
	regions                                 []*region // in b.Regions order
	floors                                  []int64
	weights                                 []int64
	// static is each region's share of a static split: Count × weight ÷
	// Σ weights.
	static []int64
}

type hotKey struct {
	key   bucket.Key
	bud   *budget
	slots []slot // one per bud.regions
	sum   int64  // escrow sum at the last allocation
	// born is when the key became hot, Unix ns: a region that has not
	// reported since may be using its floor of the key without having said
	// so (regions report every key they use, hot or not, but the Allocator
	// keeps only hot ones), so its floor stays with it until its next report.
	born int64
	// starved is set while the key is in Allocator.starved.
	starved bool
	// res is the reserve's stored tokens: what one bucket would hold that
	// refills at the rate no claim covers (Count − Σ claims) and holds at
	// most the burst no claim covers (Burst − Σ BurstOf(claim)). A grant
	// that raises a region's claim carries up to what its burst grows by
	// (Entry.Credit), drawn from res; so the regional buckets and res
	// together never hold more than Burst, and refill at most at Count.
	// resAt is when res was brought up to date (Unix ns); from then until
	// resEnd the claims summed to at most resSum (they are maxima over
	// the window allocate checked).
	res           float64
	resAt, resEnd int64
	resSum        int64
	// short is the largest amount a region got below its target at the
	// key's last allocation, while starved.
	short int64
}

// slot is one region's allocation for one key. hist lists the values the
// region may hold: hist[0] from the version it acknowledged, later entries
// from versions sent since, each (ver, count) meaning "count from version
// ver on".
type slot struct {
	cur    int64
	want   int64
	wantAt int64 // when want was reported, Unix ns (a time.Time is 24 bytes)
	// peak is the largest want reported within the budget's fill time of
	// peakAt (see budget.fill).
	peak, peakAt int64
	// top is the largest want reported since topAt, when the region last
	// reported at least half of it, if that is within Config.Hold: what an
	// uncontested budget keeps for the region through a lull (share).
	top, topAt int64
	// shortAt is when the region's target, which meets its demand, came to
	// stand the hysteresis or more above its allocation; 0 once the target
	// is at or below the allocation, or no longer meets the demand.
	shortAt int64
	hist    [4]hval
	n       uint8
	queued  bool
	// credit is the stored reserve tokens the next grant to the region
	// carries for this key (Entry.Credit), sent once.
	credit int64
	// room is the burst this Allocator's decreases of the slot took away
	// (BurstOf before less after) that no return has matched: the most the
	// region's acknowledgements may give back (Message.Returns).
	room int64
	// claim is what the last allocation counted the region may use within
	// its window (Allocator.claim, and at least cur), for KeyStatus.
	claim int64
}

type hval struct {
	ver   uint64
	count int64
}

type region struct {
	name    string
	session uint64
	known   bool // said hello in this term
	// synced is set once the region acknowledged a grant sent since
	// learning began: it has the term (and ignores older leaders) and the
	// budgets, and holds no more than the Allocator counts.
	synced   bool
	released bool
	blocked  bool
	needFull bool
	lastSeq  uint64 // latest message seen from the session
	lastReq  uint64 // latest request (hello or report): leases are measured from it
	// reqAt is when lastReq arrived. The Holder sent it earlier, so a lease
	// measured from it ends at the Holder first.
	reqAt time.Time
	heard time.Time
	// lastReport is when the latest report arrived: each report carries all
	// of the region's demand, so a key not in it wants nothing. A hello
	// counts as one only when it carries demand: a Holder just restored
	// (a new speaking agent) says hello before it has read any.
	lastReport time.Time
	// helloAt is when the latest hello arrived: until a report follows
	// it, the region keeps its floors (unreported is not unused).
	helloAt time.Time

	version uint64 // latest version sent
	acked   uint64
	// ackTo is the latest version sent that asks for an acknowledgement;
	// the versions after it only raise (Message.Quiet), so once ackTo is
	// acknowledged they all count as acknowledged. lowered says a change
	// queued since the last grant lowers a slot.
	ackTo   uint64
	lowered bool
	// unackedSince is when the oldest version not yet acknowledged was
	// sent (approximately: reset on each partial acknowledgement).
	unackedSince time.Time
	changed      []*slotRef

	leaseEnd  time.Time // until when it may use anything above its floors
	commitEnd time.Time // until when its lent floors stay lent
	lapsed    bool      // leaseEnd passed, slots capped at floors
	floored   bool      // lapsed and commitEnd passed, slots at floors
	// lapsedEnd is the end of the last lease counted as lapsed: a grant
	// that does not extend the lease un-caps the region until the next
	// Tick caps it again, and the same lease is not counted twice.
	lapsedEnd time.Time

	grant  uint64
	grants [32]grantRec
	// renewal is the last renewal sent (its grant number), at renewalAt,
	// until the region acknowledges it (0 then). One left unacknowledged
	// past lostAfter was lost, or its acknowledgement was (back).
	renewal   uint64
	renewalAt time.Time
	// backAt is when a round last ran early for the region (back), and
	// backAcked the version it had acknowledged then.
	backAt    time.Time
	backAcked uint64
	// ackWait is how long the region takes to acknowledge a grant,
	// smoothed over the first acknowledgement of each as TCP smooths its
	// round-trip time, and ackDev its mean deviation; zero before the
	// first (lostAfter).
	ackWait, ackDev time.Duration

	// retSeq is the latest acknowledgement whose returns were taken: a
	// duplicate gives nothing back twice.
	retSeq uint64
}

type slotRef struct {
	k *hotKey
	i int
}

type grantRec struct {
	id     uint64
	at     time.Time
	expire bool
	acked  bool // its first acknowledgement was timed (region.ackWait)
}

// NewAllocator returns an Allocator for leader term (≥ 1), starting at now
// in learning mode.
func NewAllocator(cfg Config, term uint64, now time.Time) (*Allocator, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if term == 0 {
		return nil, fmt.Errorf("%w: term=0 must be ≥ 1", ErrInvalidConfig)
	}
	a := &Allocator{
		cfg:        cfg,
		term:       term,
		learnUntil: now.Add(cfg.TTL + 2*cfg.Drift),
		learnFrom:  now,
		lastRound:  now,
		byName:     make(map[string]*region),
		keyIdx:     make(map[bucket.Key]int),
	}
	a.setBudgets(cfg.Budgets)
	return a, nil
}

// NewFirstAllocator is NewAllocator for the first leader that ever serves
// cfg's regions. No region has held more than its floors, so none has
// spent beyond them: the reserve, which no region ever drew from, is full,
// and every key's stored reserve starts at the burst the floors leave
// instead of counting from the end of learning. A region that says hello
// holding more than its floor of a key (an earlier leader did exist) still
// empties that key's stored reserve, as under NewAllocator.
//
// Its caller must know that no earlier leader served the regions: a
// coordinator that could have been restarted (one without etcd) cannot,
// and uses NewAllocator. Learning runs as under NewAllocator. A budget
// change (SetBudgets) ends it: the keys of a changed budget are dropped,
// and regions may have spent this leader's raises of them.
func NewFirstAllocator(cfg Config, term uint64, now time.Time) (*Allocator, error) {
	a, err := NewAllocator(cfg, term, now)
	if err != nil {
		return nil, err
	}
	a.first = true
	return a, nil
}

// First reports whether a was built by NewFirstAllocator and has had no
// budget change since.
func (a *Allocator) First() bool { return a.first }

// Term returns the Allocator's leader term.
func (a *Allocator) Term() uint64 { return a.term }

// Learning reports whether the Allocator is still learning at now: it
// withholds increases, or, as the first leader, raises no region above its
// share of a static split.
func (a *Allocator) Learning(now time.Time) bool { return now.Before(a.learnUntil) }

// withholding reports whether the Allocator withholds every increase at
// now: while it learns, unless it is the first leader, which has no
// earlier leader's grants to learn. Its grants say so (Message.Learning).
func (a *Allocator) withholding(now time.Time) bool { return a.Learning(now) && !a.first }

func (a *Allocator) setBudgets(bs []Budget) {
	a.budgets = make(map[string]*budget, len(bs))
	maxN := 0
	for _, b := range bs {
		bud := &budget{b: b, count: int64(b.Limit.Count())}
		bud.fill = mulDiv(int64(b.Limit.Period()), int64(b.Limit.Burst()), bud.count)
		bud.unit = int64(b.Unit())
		bud.noise = int64(math.Ceil(a.cfg.NoiseHeadroom * float64(bud.count) / float64(2*max(b.Limit.Burst(), 1))))
		for i, name := range b.Regions {
			bud.regions = append(bud.regions, a.region(name))
			bud.floors = append(bud.floors, int64(b.Floor(name).Count))
			bud.weights = append(bud.weights, b.Split().weight(i))
		}
		bud.static = make([]int64, len(b.Regions))
		all := make([]int, len(b.Regions))
		for i := range all {
			all[i] = i
		}
		apportion(all, bud.count, b.Split().totalWeight(), bud.weights, bud.static, make([]int64, len(all)))
		bud.reserveCount = bud.count
		for _, f := range bud.floors {
			bud.reserveCount -= f
		}
		bud.reserveBurst = bud.unclaimedBurst(bud.floors)
		bud.reserveFill = mulDiv(int64(b.Limit.Period()), bud.reserveBurst, bud.reserveCount) + 1
		a.budgets[b.Rule] = bud
		maxN = max(maxN, len(b.Regions))
	}
	a.tgt = make([]int64, maxN)
	a.lb = make([]int64, maxN)
	a.want = make([]int64, maxN)
	a.bare = make([]int64, maxN)
	a.base = make([]int64, maxN)
	a.order = make([]int, maxN)
	a.small = make([]bool, maxN)
	a.demand = make([]int64, maxN)
	a.keep = make([]int64, maxN)
	a.free = make([]int, maxN)
	a.tried = make([]bool, maxN)
	a.rem = make([]int64, maxN)
	a.dist = make([]int64, maxN)
}

// unitOf returns the smallest count whose burst ⌊burst×c/count⌋ is at
// least 1: ⌈count/burst⌉.
func unitOf(count, burst int64) int64 {
	if burst <= 0 {
		return count
	}
	return count/burst + min(count%burst, 1)
}

func (a *Allocator) region(name string) *region {
	if r := a.byName[name]; r != nil {
		return r
	}
	r := &region{name: name}
	a.byName[name] = r
	a.regions = append(a.regions, r)
	slices.SortFunc(a.regions, func(x, y *region) int {
		if x.name < y.name {
			return -1
		}
		if x.name > y.name {
			return 1
		}
		return 0
	})
	return r
}

// SetBudgets replaces the budgets (a rules change). Keys of a budget whose
// limit or regions changed are dropped and rebuilt from what regions hold,
// with increases withheld as after a leader change (until every region has
// acknowledged the new budgets, for at most TTL+2×Drift), so a
// shrunk budget is never overgranted by the old split. Regions must receive
// the same budgets for their floors.
func (a *Allocator) SetBudgets(now time.Time, bs []Budget) error {
	if err := validateBudgets(bs); err != nil {
		return err
	}
	changed := false
	old := a.budgets
	for _, b := range bs {
		if ob := old[b.Rule]; ob == nil || !sameBudget(ob.b, b) {
			changed = true
		}
	}
	if len(bs) != len(old) {
		changed = true
	}
	a.cfg.Budgets = slices.Clone(bs)
	a.setBudgets(bs)
	kept := a.keys[:0]
	clear(a.keyIdx)
	for _, k := range a.keys {
		nb := a.budgets[k.key.Rule]
		if nb != nil && sameBudget(nb.b, k.bud.b) {
			k.bud = nb
			a.keyIdx[k.key] = len(kept)
			kept = append(kept, k)
		}
	}
	clear(a.keys[len(kept):])
	a.keys = kept
	if changed {
		// A changed budget's keys were dropped above; regions may have
		// spent this leader's raises of them, so a key made known again
		// must not start with its reserve full: from here on this leader
		// counts reserves as a later one does.
		a.first = false
		a.learnUntil = maxTime(a.learnUntil, now.Add(a.cfg.TTL+2*a.cfg.Drift))
		a.learnFrom = now
		for _, r := range a.regions {
			r.synced = false
			r.needFull = true
			r.changed = r.changed[:0]
		}
		a.flush(now)
	}
	return nil
}

func sameBudget(x, y Budget) bool {
	return x.Rule == y.Rule && x.Limit == y.Limit && slices.Equal(x.Regions, y.Regions) &&
		slices.Equal(x.Weights, y.Weights) && x.Reserve == y.Reserve && x.Policy == y.Policy
}

// Step applies a message from a region. The message's Region must be set by
// the transport from the authenticated peer. Duplicated, reordered and stale
// messages are handled idempotently.
func (a *Allocator) Step(now time.Time, m Message) error {
	r := a.byName[m.Region]
	if r == nil {
		return fmt.Errorf("%w: %q", ErrUnknownRegion, m.Region)
	}
	switch m.Type {
	case MsgHello:
		back := a.back(now, r, true)
		a.hello(now, r, m)
		if back {
			a.round(now)
		}
	case MsgReport:
		if !a.current(r, m) {
			return nil
		}
		back := a.back(now, r, false)
		a.report(now, r, m, !back)
		if back {
			a.round(now)
		}
	case MsgAck:
		if !a.current(r, m) || m.Term != a.term {
			return nil
		}
		a.ackGrant(now, r, m)
	case MsgRelease:
		if !a.current(r, m) {
			return nil
		}
		a.release(now, r)
	default:
		return fmt.Errorf("%w: allocator got %s from %q", ErrBadMessage, m.Type, m.Region)
	}
	a.flush(now)
	return nil
}

// current reports whether m belongs to r's current session, asking for a
// hello otherwise.
func (a *Allocator) current(r *region, m Message) bool {
	if r.known && m.Session == r.session {
		r.lastSeq = max(r.lastSeq, m.Seq)
		return true
	}
	if m.Type != MsgRelease {
		a.out = append(a.out, Message{Type: MsgResync, Region: r.name, Session: m.Session, Term: a.term})
	}
	return false
}

func (a *Allocator) hello(now time.Time, r *region, m Message) {
	if m.Session == r.session && r.known && m.Seq <= r.lastSeq {
		return // a duplicate or a hello overtaken by later messages
	}
	first := !r.known
	if m.Session != r.session || m.Term < a.term {
		r.synced = false // it must acknowledge this term again
	}
	if m.Session != r.session {
		// A new incarnation: what it committed to is gone with it.
		r.commitEnd = time.Time{}
		r.session = m.Session
		r.lastSeq, r.lastReq, r.retSeq = 0, 0, 0
		a.dropReturns(r)
	}
	r.known, r.released = true, false
	r.lastSeq = max(r.lastSeq, m.Seq)
	if m.Seq >= r.lastReq {
		r.lastReq, r.reqAt = m.Seq, now
	}
	r.heard = now
	r.needFull = true
	// The hello's entries are held until at most TTL after it was sent.
	r.leaseEnd = maxTime(r.leaseEnd, now.Add(a.cfg.TTL+a.cfg.Drift))
	r.lapsed, r.floored = false, false
	for _, e := range m.Entries {
		k, i := a.slotFor(now, e.Key, r, -1)
		if k == nil {
			continue
		}
		s := &k.slots[i]
		c := int64(e.Count)
		if first {
			s.cur = c
		}
		if c > s.max() {
			k.res = 0 // it may have held more than counted: nothing is known stored
		}
		s.holdAtLeast(c)
	}
	if !first && m.Term < a.term && now.Before(a.learnUntil) {
		// A later hello from a region still on the old leader's lease: it
		// may have been decreased since; grant no more than it now holds.
		held := make(map[bucket.Key]int64, len(m.Entries))
		for _, e := range m.Entries {
			held[e.Key] = int64(e.Count)
		}
		for _, k := range a.keys {
			if i := slices.Index(k.bud.regions, r); i >= 0 {
				v, ok := held[k.key]
				if !ok {
					v = k.bud.floors[i]
				}
				k.slots[i].cur = min(k.slots[i].cur, v)
			}
		}
	}
	r.helloAt = now
	if len(m.Demand) > 0 {
		r.lastReport = now
	}
	for _, d := range m.Demand {
		if k, i := a.slotFor(now, d.Key, r, int64(d.Want)); k != nil {
			k.slots[i].setWant(now.UnixNano(), int64(d.Want), k.bud.fill, int64(a.cfg.Hold))
		}
	}
}

// back reports whether a round should run at once for r, about to be heard
// from at now (and notes that one does), since r may be without a lease:
// its lease lapsed here (cut off, or its link down, past its lease), or
// the last renewal it was sent went unacknowledged for lostAfter (lost,
// as a flapping link loses every renewal of the rounds that fall while it
// is down). The round, the periodic one with its escrow
// checks run early, gives the region a table it can apply and a lease to
// use its raises with, where the next round may be a refresh interval
// away: what it was sent meanwhile was lost, a delta on top of that is
// refused, and a raise without a lease is not used. A round that cannot
// renew the region (blocked until a decrease it was sent is acknowledged)
// leaves it as it was, so a report runs another within half a refresh
// interval only once the region has acknowledged a later version; a hello
// always does, the Holder saying hello at most once a refresh interval
// (docs/design.md, "The protocol").
func (a *Allocator) back(now time.Time, r *region, hello bool) bool {
	if !r.known || r.released || a.expiring ||
		!hello && now.Sub(r.backAt) < a.cfg.Refresh/2 && r.acked == r.backAcked {
		return false
	}
	if r.lapsed || !now.Before(r.leaseEnd) ||
		r.renewal != 0 && now.Sub(r.renewalAt) >= a.lostAfter(r) {
		r.backAt, r.backAcked = now, r.acked
		return true
	}
	return false
}

// report takes r's demand; with urgent, the keys it presses on (and those
// it stopped using) are rebalanced at once (a round about to run does it
// for every key).
func (a *Allocator) report(now time.Time, r *region, m Message, urgent bool) {
	r.heard = now
	if m.Seq < r.lastReq {
		return // overtaken by a later report, which carries all demand
	}
	r.lastReq, r.reqAt = m.Seq, now
	r.lastReport = now
	for _, d := range m.Demand {
		k, i := a.slotFor(now, d.Key, r, int64(d.Want))
		if k == nil {
			continue
		}
		s := &k.slots[i]
		prev := s.want
		s.setWant(now.UnixNano(), int64(d.Want), k.bud.fill, int64(a.cfg.Hold))
		// A key pressing on its allocation, one a region stopped using or
		// uses under half of an allocation above its floor, and one whose
		// demand fell in one region while another waits for capacity are
		// rebalanced at once rather than at the next round.
		if urgent && !a.expiring && (s.want > s.cur || s.cur > k.bud.floors[i] && 2*s.want < s.cur ||
			s.want < prev && k.starved) {
			a.stats.Urgent++
			a.allocate(now, k)
		}
	}
}

// returned puts in their keys' stored reserves the tokens acknowledgement
// m says the decreases it acknowledges took away from r's buckets
// (Message.Returns): each at most what this Allocator's decreases of the
// key could have taken (slot.room), once (a duplicate, or an
// acknowledgement overtaken by a later one, gives nothing), from a region
// whose lease lives, for a version this Allocator sent (acknowledgements of
// an earlier leader's grants carry its term and are not taken; the room
// counts only this Allocator's decreases). An acknowledgement leaves the
// region only once every agent decides with the table that carries the
// decrease (region.Speaker), so no agent still reads the bucket under the
// larger allocation, which could count those tokens as held still. The
// reserve caps them at the burst no claim covers when it next allocates
// the key, as it does every stored token. Tokens not taken are lost,
// which only lowers what the budget admits.
func (a *Allocator) returned(r *region, m Message) {
	if m.Seq <= r.retSeq || r.lapsed || m.Version > r.acked {
		return
	}
	r.retSeq = m.Seq
	for _, ret := range m.Returns {
		j, ok := a.keyIdx[ret.Key]
		if !ok || ret.Tokens <= 0 {
			continue
		}
		k := a.keys[j]
		i := slices.Index(k.bud.regions, r)
		if i < 0 {
			continue
		}
		s := &k.slots[i]
		n := min(int64(ret.Tokens), s.room)
		if n <= 0 {
			continue
		}
		s.room -= n
		k.res += float64(n)
		a.stats.Returned += uint64(n) // #nosec G115 -- n > 0
	}
}

// dropReturns forgets what r's decreases took away: its lease lapsed, or a
// new incarnation speaks for it, and its buckets are moved without a
// return.
func (a *Allocator) dropReturns(r *region) {
	for _, k := range a.keys {
		if i := slices.Index(k.bud.regions, r); i >= 0 {
			k.slots[i].room = 0
		}
	}
}

func (a *Allocator) ackGrant(now time.Time, r *region, m Message) {
	r.heard = now
	acked := r.acked
	if m.Version <= r.version {
		r.acked = max(r.acked, m.Version)
		r.ackQuiet()
		if r.acked < r.version {
			r.unackedSince = now // the rest were sent after what was acked
		}
	}
	if len(m.Returns) > 0 {
		a.returned(r, m)
	}
	g := &r.grants[m.Grant%uint64(len(r.grants))]
	if g.id != m.Grant || m.Grant == 0 {
		return
	}
	if m.Grant == r.renewal {
		r.renewal = 0
	}
	if !g.acked {
		g.acked = true
		r.timeAck(now.Sub(g.at))
	}
	if g.expire {
		r.leaseEnd = minTime(r.leaseEnd, now)
		return
	}
	// The region keeps its lends Hold after it received g, plus the margin;
	// on this clock, from when g was sent, they are relied on Hold less the
	// margin (Config.HoldMargin), so a holder clock running fast within the
	// margin still returns them after this counts them returned.
	r.commitEnd = maxTime(r.commitEnd, g.at.Add(a.cfg.Hold-a.cfg.HoldMargin()))
	if !r.synced && !g.at.Before(a.learnFrom) {
		r.synced = true
		a.learned(now)
	}
	// An acknowledged decrease may free what another region waits for; the
	// next Tick rebalances the keys waiting, once for all acks since. A key
	// whose waiting region is short by a quarter of the budget or more (the
	// demand moved) is rebalanced at once when the ack acknowledges a new
	// version: the region waiting has no other way to get it before the
	// next Tick (up to the driver's tick interval, 200 ms, later), while
	// small shortfalls (a contested budget in steady state) keep waiting for
	// the Tick, which answers every ack since in one grant per region.
	a.recheck = len(a.starved) > 0
	if a.recheck && r.acked > acked {
		a.feed(now, moveShare)
	}
}

// timeAck takes d, how long the region took to acknowledge a grant, into
// ackWait and ackDev (RFC 6298's gains: 1/8 and 1/4).
func (r *region) timeAck(d time.Duration) {
	if r.ackWait == 0 {
		r.ackWait, r.ackDev = d, d/2
		return
	}
	r.ackDev += (max(d-r.ackWait, r.ackWait-d) - r.ackDev) / 4
	r.ackWait += (d - r.ackWait) / 8
}

// lostAfter is how long a grant to r goes unacknowledged before it counts
// as lost (its whole table is resent, a renewal runs a round early, and a
// decrease stops the region's renewal while another region waits): half a
// refresh interval, or, for a region that acknowledges slower than that,
// its smoothed wait and four deviations, up to two refresh intervals. A
// region whose regional Redis answers slowly acknowledges each grant a
// settle, a publication and its agents' adoptions later: 300–600 ms under
// chaos's redis-slow, where half a refresh interval resent whole tables
// and renewed every lease that were only late, and each of those cost the
// region's speaking agent a settle and a publication more.
func (a *Allocator) lostAfter(r *region) time.Duration {
	return min(max(a.cfg.Refresh/2, r.ackWait+4*r.ackDev), 2*a.cfg.Refresh)
}

// ackQuiet counts the quiet versions after ackTo acknowledged once ackTo
// is: each only raises, so the last bounds them all.
func (r *region) ackQuiet() {
	if r.acked >= r.ackTo {
		r.acked = r.version
	}
}

// quietHeard: a raise is sent Quiet only to a region heard from within
// Refresh/quietHeard.
const quietHeard = 4

// moveShare: a region short by at least 1/moveShare of a budget is waiting
// for a move of demand, not for noise within a contested budget.
const moveShare = 4

// Between rounds, acknowledgements make a Tick rebalance the keys waiting
// by less than a move (moveShare) at most once per Refresh/nearFeed when a
// region waits for 1/nearShare of the budget or more, and every key
// waiting at most once per Refresh/feedShare; in between it feeds only
// moves. Capacity freed otherwise (a lease or a hold that ended) is fed at
// the Tick that finds it, and that feed starts neither wait.
//
// Acknowledgements arrive within a few milliseconds of their grants once
// the region's agents adopt tables on notice, and a feed at every Tick
// after each one split a contested budget's steady churn into more,
// smaller grants. That churn is mostly moves of a few times the
// hysteresis band (3% of the budget): fed at most every Refresh/8 (every
// other Tick of the driver's at refresh 2 s), steady-skewed sent up to
// 16.0 lease messages a second over seeds 1–40, over its target of 15.
// Shortfalls under 1/16 of the budget now wait for every third Tick, and
// it sends at most 14.5; larger ones, the end of a move, are still fed
// every other Tick (docs/design.md, "Since: small shortfalls fed every
// third tick").
const (
	nearShare = 16
	nearFeed  = 8
	feedShare = 4
)

// learned ends learning at now once every region of every budget has
// acknowledged a grant sent since learning began (or released its share).
// Each such region has taken the Allocator's term, so it ignores whatever
// a previous leader may still send; and it has applied a table sent as a
// learning grant, which only lowers, so it holds no more than the
// Allocator counts. Nothing is left to learn: waiting for every lease of
// the previous leader to run out would only strand capacity. A region that
// never answers keeps learning going for its full length.
func (a *Allocator) learned(now time.Time) {
	if !now.Before(a.learnUntil) {
		return
	}
	for _, bud := range a.budgets {
		for _, r := range bud.regions {
			if !r.known || !r.synced && !r.released {
				return
			}
		}
	}
	a.learnUntil = now
	a.roundNow = true // renew every lease now rather than a Refresh later
}

// feed rebalances the keys where a region got less than its target; with
// share > 0, only those short by 1/share of their budget or more, the
// others staying listed for a later Tick's feed.
func (a *Allocator) feed(now time.Time, share int64) {
	a.recheck = false
	if a.expiring {
		return
	}
	keys := a.starved
	a.starved = a.starvedSpare[:0]
	for _, k := range keys {
		if share > 0 && k.short*share < k.bud.count {
			a.starved = append(a.starved, k) // still starved
			a.recheck = true
			continue
		}
		k.starved = false // allocate lists it again if a region still waits
		if j, ok := a.keyIdx[k.key]; ok && a.keys[j] == k {
			a.allocate(now, k)
		}
	}
	clear(keys)
	a.starvedSpare = keys[:0]
}

func (a *Allocator) release(now time.Time, r *region) {
	r.released = true
	r.leaseEnd = minTime(r.leaseEnd, now)
	a.lapse(now, r)
}

// slotFor finds key's slot for region r. It creates the hot key for a held
// entry (want < 0) or for demand pressing on the region's floor; demand within
// the floor does not make a key hot, so coordinator memory follows hot keys
// although regions report every key they use.
func (a *Allocator) slotFor(now time.Time, key bucket.Key, r *region, want int64) (*hotKey, int) {
	bud := a.budgets[key.Rule]
	if bud == nil {
		return nil, 0
	}
	i := slices.Index(bud.regions, r)
	if i < 0 {
		return nil, 0
	}
	if j, ok := a.keyIdx[key]; ok {
		return a.keys[j], i
	}
	if want >= 0 && !a.pressing(want, bud, i) {
		return nil, 0
	}
	k := &hotKey{key: key, bud: bud, slots: make([]slot, len(bud.regions)), born: now.UnixNano()}
	for j := range k.slots {
		f := bud.floors[j]
		k.slots[j].cur = f
		k.slots[j].hist[0] = hval{ver: 0, count: f}
		k.slots[j].n = 1
	}
	// The reserve's stored tokens. A key this Allocator does not know has
	// every region at its floor or below since learning ended (a region
	// holding more said so in its hello, which made the key known, and
	// leases of earlier leaders have ended), and a known key is forgotten
	// only with its reserve full (idle): so the reserve has refilled at
	// least at Count − Σ floors since then (knownFrom: under the first
	// leader, since long before anything it sees, so it starts full).
	// Before that nothing is known, and it starts empty.
	// It refills as any key's does, from no further back than it takes
	// to fill (which keeps the first leader's "always" finite).
	t := now.UnixNano()
	k.resSum, k.resAt, k.resEnd = bud.count-bud.reserveCount, max(a.knownFrom(), t-bud.reserveFill), t
	k.refill(t, a.knownFrom())
	k.res = min(k.res, float64(bud.reserveBurst))
	k.resAt = t
	a.keyIdx[key] = len(a.keys)
	a.keys = append(a.keys, k)
	return k, i
}

// Tick moves the Allocator to now and runs a round when Refresh has passed
// since the last one.
func (a *Allocator) Tick(now time.Time) {
	// freed: capacity came free here (a lease, a lend or a hold ended),
	// not by an acknowledgement; the keys waiting for it are fed now.
	freed := false
	for _, r := range a.regions {
		if !r.lapsed && !now.Before(r.leaseEnd) {
			a.lapse(now, r)
			freed = true
		}
		if r.lapsed && !r.floored && !now.Before(r.commitEnd) {
			a.restoreFloors(r)
			freed = true
		}
	}
	if a.heldUntil != 0 && now.UnixNano() >= a.heldUntil {
		a.heldUntil = 0
		freed = true
	}
	if freed {
		a.recheck = len(a.starved) > 0
		freed = a.recheck
	}
	if now.Sub(a.lastRound) < a.cfg.Refresh && !a.roundNow {
		switch {
		case !a.recheck:
		case freed:
			a.feed(now, 0)
		case now.Sub(a.lastFeed) >= a.cfg.Refresh/feedShare:
			a.lastFeed, a.lastNear = now, now
			a.stats.Fed++
			a.feed(now, 0)
		case now.Sub(a.lastNear) >= a.cfg.Refresh/nearFeed:
			a.lastNear = now
			a.stats.FedNear++
			a.feed(now, nearShare)
		default:
			a.feed(now, moveShare) // smaller shortfalls wait for their feed
		}
		a.flush(now)
		return
	}
	a.round(now)
}

// round rebalances every key and renews every lease it can: what Tick runs
// every Refresh, and Step at once for a region that may be without a lease
// (back).
func (a *Allocator) round(now time.Time) {
	a.recheck, a.roundNow = false, false
	for _, k := range a.starved {
		k.starved = false
	}
	clear(a.starved)
	a.starved = a.starved[:0]
	a.lastRound = now
	a.stats.Rounds++
	for _, r := range a.regions {
		r.blocked = false
		// A change still unacknowledged after lostAfter was lost, or a
		// later one was: resend the whole table (a region that
		// missed a delta cannot apply the next one, and a blocked region
		// gets no renewal to notice the gap by).
		if r.acked < r.version && now.Sub(r.unackedSince) >= a.lostAfter(r) && a.canGrant(now, r) {
			r.needFull = true
		}
	}
	over := 0
	for i := 0; i < len(a.keys); {
		k := a.keys[i]
		a.allocate(now, k)
		if k.sum > k.bud.count {
			over++
		}
		if a.idle(now, k) {
			a.dropKey(i)
			continue
		}
		i++
	}
	a.stats.Overcounted = over
	if !a.expiring {
		for _, r := range a.regions {
			if !a.canGrant(now, r) {
				continue
			}
			if r.blocked {
				a.stats.Blocked++
				continue
			}
			a.sendGrant(now, r, true)
		}
	}
	a.flush(now)
}

// canGrant reports whether r can be sent grants: it said hello in this
// term, did not release, and was heard from within a TTL.
func (a *Allocator) canGrant(now time.Time, r *region) bool {
	return r.known && !r.released && now.Sub(r.heard) < a.cfg.TTL
}

// lapse caps r's slots once its lease may have expired everywhere: the
// region now uses at most min(floor, what it held) while its lends hold, and
// its floor after.
func (a *Allocator) lapse(now time.Time, r *region) {
	if r.lapsed {
		return
	}
	r.lapsed = true
	if !r.leaseEnd.IsZero() && !r.leaseEnd.Equal(r.lapsedEnd) {
		// Only a lease this Allocator gave or heard of lapses: a region it
		// never heard from (in this term) had none here to lose.
		a.stats.Expired++
		r.lapsedEnd = r.leaseEnd
	}
	committed := now.Before(r.commitEnd)
	for _, k := range a.keys {
		i := slices.Index(k.bud.regions, r)
		if i < 0 {
			continue
		}
		s := &k.slots[i]
		f := k.bud.floors[i]
		s.prune(r.acked)
		s.room = 0 // its buckets move to the floors without a return
		m := min(s.max(), f)
		if !committed {
			m = f
		}
		if s.cur > m {
			s.cur = m
			r.needFull = true // tell the region what it holds now
		}
		s.hist[0] = hval{ver: r.version, count: m}
		s.n = 1
	}
}

// restoreFloors returns a lapsed region's slots to its floors once its
// lends have ended: that is all it may use now.
func (a *Allocator) restoreFloors(r *region) {
	r.floored = true
	for _, k := range a.keys {
		if i := slices.Index(k.bud.regions, r); i >= 0 {
			s := &k.slots[i]
			if s.cur != k.bud.floors[i] {
				s.cur = k.bud.floors[i]
				r.needFull = true
			}
			s.hist[0] = hval{ver: r.version, count: s.cur}
			s.n = 1
		}
	}
}

// pressing reports whether region i's demand of want, with headroom,
// exceeds its floor of bud, or wants anything of a floor that admits nothing
// (below the budget's unit).
func (a *Allocator) pressing(want int64, bud *budget, i int) bool {
	floor := bud.floors[i]
	return want > 0 && (want+a.headroom(want) > floor || floor < bud.unit)
}

// using reports whether region r still uses the key of slot s at now: its
// latest report, within DemandTTL, wanted some of it.
func (a *Allocator) using(now time.Time, r *region, s *slot) bool {
	return s.want > 0 && (r.lastReport.IsZero() || s.wantAt >= r.lastReport.UnixNano()) &&
		now.UnixNano()-s.wantAt <= int64(a.cfg.DemandTTL)
}

// idle reports whether k can be forgotten: every region at its floor with
// nothing outstanding, none pressing on it, and none still using it whose
// peak within the fill time pressed (that peak holds its floor in
// allocate; a key forgotten and hot again would start without it).
func (a *Allocator) idle(now time.Time, k *hotKey) bool {
	// A key is forgotten only with its reserve full: a key made known again
	// counts it full (slotFor).
	if k.res < float64(k.bud.reserveBurst) {
		return false
	}
	for i := range k.slots {
		s := &k.slots[i]
		if s.n != 1 || s.cur != k.bud.floors[i] || s.hist[0].count != s.cur || s.queued ||
			(a.pressing(s.want, k.bud, i) && now.UnixNano()-s.wantAt <= int64(a.cfg.DemandTTL)) ||
			(a.using(now, k.bud.regions[i], s) && a.pressing(s.peak, k.bud, i) && now.UnixNano()-s.peakAt <= k.bud.fill) {
			return false
		}
	}
	return true
}

func (a *Allocator) dropKey(i int) {
	k := a.keys[i]
	last := len(a.keys) - 1
	a.keys[i] = a.keys[last]
	a.keyIdx[a.keys[i].key] = i
	a.keys[last] = nil
	a.keys = a.keys[:last]
	delete(a.keyIdx, k.key)
}

// claim is the most region r may use of slot s at any time in [now, end],
// assuming its lease is renewed through the window.
func (a *Allocator) claim(now, end time.Time, r *region, s *slot, floor int64) int64 {
	s.prune(r.acked)
	m := s.max()
	var c int64
	if now.Before(r.leaseEnd) || a.canGrant(now, r) && !a.expiring {
		c = m // a region that may be renewed may use its table through the window
	}
	if r.commitEnd.After(end) {
		return max(c, min(floor, m))
	}
	return max(c, floor)
}

// allocate rebalances one key: targets by policy, decreases at once,
// increases only from capacity that is provably free over the next lease
// window. It blocks the renewal of regions whose old, larger allocation must
// lapse or be acknowledged before the key fits its budget.
func (a *Allocator) allocate(now time.Time, k *hotKey) {
	bud := k.bud
	n := len(k.slots)
	C := bud.count
	// The window is the longest lease a grant made now can carry: TTL+Drift
	// on this clock. Leases are extended only by the renewals of a round,
	// and every round checks again, with its own window, before renewing;
	// a lend acknowledged at one round (Hold−HoldMargin > TTL+Drift+Refresh) still
	// covers the next round's window, so lent floors stay counted as lent
	// from round to round instead of returning at every round.
	end := now.Add(a.cfg.TTL + a.cfg.Drift)
	learning := now.Before(a.learnUntil)
	// While learning, regions the Allocator has not heard from may hold
	// more than it counts, so nothing rises at all (hold), except under the
	// first leader, whose claims bound every region from the start.
	hold := a.withholding(now)
	tgt, lb, want, bare, base, demand, keep := a.tgt[:n], a.lb[:n], a.want[:n], a.bare[:n], a.base[:n], a.demand[:n], a.keep[:n]
	var heldUntil int64 // the earliest end of a peak's hold on a floor
	k.refill(now.UnixNano(), a.knownFrom())

	// Fixed claims of regions we cannot send to; lower bounds and wants of
	// the others.
	var fixed, sum int64
	for i := range k.slots {
		r, s := bud.regions[i], &k.slots[i]
		base[i] = a.claim(now, end, r, s, bud.floors[i])
		sum += base[i]
		tgt[i] = -1
		demand[i], keep[i] = 0, 0
		if !a.canGrant(now, r) || a.expiring {
			fixed += base[i]
			tgt[i] = s.cur
			continue
		}
		lb[i] = 0
		if !r.commitEnd.After(end) {
			lb[i] = bud.floors[i] // its floor returns within the window
		}
		if learning {
			// Nothing taken now could be granted to anyone before learning
			// ends: a floor lent now would only be lost.
			lb[i] = max(lb[i], min(s.cur, bud.floors[i]))
		}
		if s.wantAt == 0 && r.lastReport.UnixNano() <= k.born || r.lastReport.Before(r.helloAt) {
			// No report since the key became hot, or since the region's
			// last hello (a new speaking agent that has read no demand
			// yet): the region may use its floor of it. Unreported is not
			// the same as unused.
			lb[i] = max(lb[i], bud.floors[i])
		}
		w, w0 := int64(0), int64(0)
		if a.using(now, r, s) {
			w0 = s.want
			// The headroom: 5% of the demand, or what the bucket's noise
			// needs (Config.NoiseHeadroom) up to the demand itself.
			w = a.padded(bud, s.want)
			if now.UnixNano()-s.topAt <= int64(a.cfg.Hold) {
				keep[i] = a.padded(bud, s.top) // share: what an uncontested budget keeps
			}
			if now.UnixNano()-s.peakAt <= bud.fill {
				// A region still using the key lends its floor only down
				// to what it wanted over the bucket's fill time; one that
				// stopped (no demand reported) lends it at once, and what
				// it borrowed above its floor goes back at once either way.
				p := s.peak + a.headroom(s.peak)
				h := min(p, bud.floors[i])
				if h > w {
					w = h
					if u := s.peakAt + bud.fill; heldUntil == 0 || u < heldUntil {
						heldUntil = u
					}
				}
				w0 = max(w0, min(s.peak, bud.floors[i]))
			}
		}
		want[i] = max(w, lb[i])
		bare[i] = max(w0, lb[i])
		demand[i] = w
	}
	a.targets(k, C-fixed, tgt, lb, want, bare, demand, keep)
	if learning && !hold {
		// The first leader raises while learning, from what the floors
		// leave; but a region not yet heard from may want its share, so no
		// region rises above its share of a static split until learning
		// ends.
		for i := range tgt {
			if s := &k.slots[i]; tgt[i] > s.cur {
				tgt[i] = max(s.cur, min(tgt[i], bud.static[i]))
			}
		}
	}

	// Hysteresis: a move smaller than h is not worth its cost (a rebase at
	// the region, a grant and its acknowledgement, and for an increase the
	// burst it adds arriving spent), so it is skipped, unless the key is
	// over its budget or the move returns the region to its floor. A small
	// increase of a region pressing on its allocation is still made when
	// free capacity covers it whole (below): no other region is decreased
	// for it, and it stops the region pressing. So while every region's
	// demand stays within h of what it was allocated for, no allocation
	// moves.
	//
	// A decrease that funds an increase worth its cost is part of that
	// move, however small: the increase is made from what the others give
	// back, and with each of them under h it would wait, the budget full,
	// for as long as the demands held (TestRaiseWorthItsCostTakesSmallDecreases).
	// Only the raise of a met region counts, once short for a refresh
	// interval: a heavy region's target rises whenever the light ones'
	// fall, and a light one's estimate crosses h by chance.
	h := int64(float64(C) * a.cfg.Hysteresis)
	sliver := min(h, C/sliverDiv)
	small := a.small[:n]
	raise, nowNS := false, now.UnixNano()
	for i := range k.slots {
		s := &k.slots[i]
		switch d := tgt[i] - s.cur; {
		case d <= 0 || s.want-a.headroom(s.want) > tgt[i]:
			s.shortAt = 0
		case d >= h && s.shortAt == 0:
			s.shortAt = nowNS
		}
		if s.shortAt != 0 && nowNS-s.shortAt >= int64(a.cfg.Refresh) && !bud.regions[i].blocked && !hold {
			raise = true
		}
	}
	for i := range k.slots {
		s := &k.slots[i]
		small[i] = false
		if d := tgt[i] - s.cur; tgt[i] != bud.floors[i] && d != 0 && abs(d) < h && !(d < 0 && (sum > C || raise)) {
			if d > 0 && s.want > s.cur {
				small[i] = true
				continue
			}
			tgt[i] = s.cur
		}
	}
	// Decreases go out at once; the old value stays counted until acked.
	for i := range k.slots {
		if tgt[i] < k.slots[i].cur {
			a.set(k, i, tgt[i])
			a.stats.Decreases++
		}
	}
	// Increases: free up to the region's present claim, and beyond it only
	// from what the budget has left over the window.
	sum = 0
	var need int64
	for i := range k.slots {
		r, s := bud.regions[i], &k.slots[i]
		base[i] = a.claim(now, end, r, s, bud.floors[i])
		sum += base[i]
		if tgt[i] > s.cur && !r.blocked {
			need += max(0, tgt[i]-max(s.cur, base[i]))
		}
	}
	avail := C - sum
	if hold || avail < 0 {
		avail = 0
	}
	k.res = min(k.res, float64(bud.unclaimedBurst(base)))
	if a.cfg.UnsafeSkipEscrow {
		avail, sum, hold = need, min(sum, C), false
	}
	for i := range k.slots {
		r, s := bud.regions[i], &k.slots[i]
		// Raising a region up to its present claim costs nothing only while
		// the claims fit: above the budget, some claim must stay unrealized.
		if tgt[i] <= s.cur || r.blocked || sum > C || hold {
			continue
		}
		v := min(tgt[i], max(s.cur, base[i]))
		if cost := tgt[i] - max(s.cur, base[i]); cost > 0 && need > 0 {
			g := cost
			if need > avail {
				g = mulDiv(avail, cost, need)
			}
			// A sliver short of the target waits for more to free up, so
			// allocations do not creep up one acknowledgement at a time;
			// a small move waits until it can be made whole.
			if g < cost && (g < sliver || small[i]) {
				g = 0
			}
			v += g
			sum += g
		}
		if v > s.cur {
			a.set(k, i, v)
			a.stats.Increases++
			// The burst the claim grows by was the reserve's: its stored
			// tokens go with it, up to that much.
			if grow := int64(bud.b.BurstOf(bucket.Tokens(max(base[i], v)))) - int64(bud.b.BurstOf(bucket.Tokens(base[i]))); grow > 0 && k.res >= 1 {
				c := min(grow, int64(k.res))
				k.res -= float64(c)
				s.credit += c
			}
		}
	}
	// What the claims leave from now to the end of the window, after this
	// allocation's increases.
	for i := range k.slots {
		base[i] = max(base[i], k.slots[i].cur)
		k.slots[i].claim = base[i]
	}
	k.res = max(0, min(k.res, float64(bud.unclaimedBurst(base))))
	k.resSum, k.resAt, k.resEnd = sum, now.UnixNano(), end.UnixNano()
	waiting := false
	k.short = 0
	for i := range k.slots {
		if tgt[i] > k.slots[i].cur {
			waiting = true
			k.short = max(k.short, tgt[i]-k.slots[i].cur)
			if !k.starved {
				k.starved = true
				a.starved = append(a.starved, k)
			}
		}
	}
	for i := range k.slots {
		if heldUntil == 0 || bare[i] <= tgt[i] {
			continue
		}
		// Another region would take what the hold keeps: rebalance the key
		// when the hold ends.
		if a.heldUntil == 0 || heldUntil < a.heldUntil {
			a.heldUntil = heldUntil
		}
		if !k.starved {
			k.starved = true
			a.starved = append(a.starved, k)
		}
		break
	}
	k.sum = sum
	// Renewing a region that may still use more than it is now granted
	// would carry the excess past the window; let it lapse or be acked. That
	// is needed when the key is over its budget, and worth it when another
	// region waits for the capacity: a region that does not acknowledge a
	// decrease within lostAfter (cut off, or its messages lost: the same
	// test that resends its whole table) must not keep the
	// capacity for as long as it was last heard from. A region that
	// acknowledges is renewed again at the next round. Only a region
	// holding more than its floor gains anything from a renewal: below it,
	// its claim after the lease is at least as large.
	for i := range k.slots {
		r := bud.regions[i]
		if m := k.slots[i].max(); m > bud.floors[i] && (sum > C ||
			waiting && m > k.slots[i].cur && r.acked < r.version && now.Sub(r.unackedSince) >= a.lostAfter(r)) {
			r.blocked = true
		}
	}
}

// knownFrom is when the claims came to bound the regions (Unix ns): the
// end of learning, or always (math.MinInt64) for the first leader, whose
// regions hold no earlier leader's grant.
func (a *Allocator) knownFrom() int64 {
	if a.first {
		return math.MinInt64
	}
	return a.learnUntil.UnixNano()
}

// refill adds to k's stored reserve what it refilled from resAt to now
// (Unix ns): what the claims left of the count, for as long as those claims
// were known to bound the regions (resEnd, and not before known, the
// Allocator's knownFrom: until learning ends, a region not heard from may
// hold an earlier leader's grant); beyond that, nothing. allocate caps it
// at the burst the claims leave and records the new resAt.
func (k *hotKey) refill(now, known int64) {
	if from, to := max(k.resAt, known), min(now, k.resEnd); to > from && k.resSum < k.bud.count {
		k.res += float64(k.bud.count-k.resSum) * float64(to-from) / float64(k.bud.b.Limit.Period())
	}
}

// unclaimedBurst is what claims (one per region, in regions order) leave
// of the budget's burst: Burst − Σ BurstOf(claim), the most the stored
// reserve may hold beside them.
func (b *budget) unclaimedBurst(claims []int64) int64 {
	left := int64(b.b.Limit.Burst())
	for _, c := range claims {
		left -= int64(b.b.BurstOf(bucket.Tokens(c)))
	}
	return left
}

// targets fills tgt for the regions with tgt[i] < 0, sharing capacity by the
// budget's policy, then moves what would admit nothing to where it admits
// (concentrate).
func (a *Allocator) targets(k *hotKey, capacity int64, tgt, lb, want, bare, demand, keep []int64) {
	bud := k.bud
	if bud.b.Policy == Static {
		for i := range tgt {
			if tgt[i] < 0 {
				tgt[i] = bud.static[i]
			}
		}
		return
	}
	free := a.free[:0]
	for i := range tgt {
		if tgt[i] < 0 {
			free = append(free, i)
		}
	}
	a.share(k, capacity, tgt, lb, want, bare, keep)
	if bud.unit > 1 {
		spare := capacity
		for _, i := range free {
			spare -= tgt[i]
		}
		a.concentrate(k, free, max(spare, 0), tgt, lb, demand)
	}
}

// concentrate raises every region that wants the key to at least the
// budget's unit where it can. A region's burst is ⌊Burst×count/Count⌋, so an
// allocation below unit admits nothing; where the budget's burst is small
// beside its count (fewer burst tokens than regions that want the key), a
// split by demand can leave every region below unit and the whole budget
// unused. A region below unit is raised to it from capacity nobody holds,
// then from the other regions below unit (which admit nothing with it),
// those that want least giving first, down to their lower bounds. Those
// that want most are raised first, but a region holding at least unit now
// keeps its place until another wants more than twice what it wants, so
// that demand moving within that band does not move the budget.
// Only targets change: the escrow still decides what can be granted when.
func (a *Allocator) concentrate(k *hotKey, free []int, spare int64, tgt, lb, demand []int64) {
	u := k.bud.unit
	tried := a.tried[:len(tgt)]
	clear(tried)
	better := func(i, j int) bool { // i is raised before j
		switch hi, hj := k.slots[i].cur >= u, k.slots[j].cur >= u; {
		case hi && !hj:
			return demand[j] <= 2*demand[i]
		case hj && !hi:
			return demand[i] > 2*demand[j]
		}
		return demand[i] > demand[j] || demand[i] == demand[j] && i < j
	}
	for {
		r := -1
		for _, i := range free {
			if !tried[i] && tgt[i] < u && demand[i] > 0 && (r < 0 || better(i, r)) {
				r = i
			}
		}
		if r < 0 {
			return
		}
		tried[r] = true
		need := u - tgt[r]
		avail := spare
		for _, j := range free {
			if j != r && tgt[j] < u {
				avail += max(tgt[j]-lb[j], 0)
			}
		}
		if avail < need {
			continue
		}
		g := min(spare, need)
		spare -= g
		tgt[r] += g
		need -= g
		for need > 0 {
			d := -1
			for _, j := range free {
				if j != r && tgt[j] < u && tgt[j] > lb[j] && (d < 0 || better(d, j)) {
					d = j
				}
			}
			g := min(tgt[d]-lb[d], need)
			tgt[d] -= g
			tgt[r] += g
			need -= g
		}
	}
}

// share fills tgt for the regions with tgt[i] < 0 by the budget's policy
// (not Static). want is each region's demand with headroom, bare the same
// without it. Headroom is only given from capacity no region's demand
// needs: when the wants with headroom do not fit, the budget is shared by
// the bare wants, and what is left after all of them goes to headroom in
// proportion to it. In a contested budget the headroom of a region whose
// demand is met is capacity the region still pressing would use, and the
// met region's noise leaves part of it unused; under max-min such a budget
// is shared by the demands less the headroom (below), which share writes
// into want: the caller's scratch, not read after.
func (a *Allocator) share(k *hotKey, capacity int64, tgt, lb, want, bare, keep []int64) {
	bud := k.bud
	var extra, extra0 int64
	for i := range tgt {
		if tgt[i] < 0 {
			capacity -= lb[i]
			extra += want[i] - lb[i]
			extra0 += bare[i] - lb[i]
		}
	}
	capacity = max(capacity, 0)
	if extra > capacity && extra0 <= capacity {
		a.fillToward(tgt, bare, want, capacity-extra0, extra-extra0)
		return
	}
	if extra > capacity && bud.b.Policy != Proportional {
		// Max-min shares a contested budget by the demands less the
		// margin (the headroom, taken off): a region whose demand is met
		// leaves unused what it is given above its use (the estimate's
		// noise, and the hysteresis band its allocation may drift in),
		// while what it is not given the regions still pressing use
		// whole. Taken off every demand, it keeps the split monotone in
		// demand. Where the demands less the margin fit, what is left
		// goes back toward the demands in proportion to the margin.
		var net int64
		for i := range tgt {
			if tgt[i] < 0 {
				want[i] = max(lb[i], bare[i]-a.headroom(bare[i]))
				net += want[i] - lb[i]
			}
		}
		if net <= capacity {
			a.fillToward(tgt, want, bare, capacity-net, extra0-net)
			return
		}
		extra = net
	} else if extra > capacity {
		want, extra = bare, extra0
	}
	if extra <= capacity {
		left := capacity - extra
		// An uncontested budget keeps for a region still using the key
		// what it last pressed for within Hold (slot.top), so that demand
		// coming in bursts with lulls between them finds its raise at the
		// next burst instead of pressing from its floor again — while
		// the keeps leave half of the reserve free, so a region that
		// starts pressing elsewhere still rises at once, and where the
		// burst holds a token per region (below that concentrate moves
		// the budget in units, and a unit kept is all another could use).
		var more int64
		for i := range tgt {
			if tgt[i] < 0 {
				more += max(0, keep[i]-want[i])
			}
		}
		kept := more > 0 && int(bud.b.Limit.Burst()) >= len(tgt) && extra+more <= capacity-bud.reserveCount/2
		if kept {
			left -= more
		}
		for i := range tgt {
			if tgt[i] < 0 {
				tgt[i] = want[i]
				if kept {
					tgt[i] = max(want[i], keep[i])
				}
			}
		}
		// What nobody wants returns to floors, in proportion to what each
		// lent, and the rest stays in reserve.
		var lent int64
		for i := range tgt {
			lent += max(0, bud.floors[i]-tgt[i])
		}
		for i := range tgt {
			if d := bud.floors[i] - tgt[i]; d > 0 {
				if lent > left {
					d = mulDiv(left, d, lent)
				}
				tgt[i] += d
			}
		}
		return
	}
	if bud.b.Policy == Proportional {
		a.fillToward(tgt, lb, want, capacity, extra)
		return
	}
	// Max-min fair by weight: water-fill the budget, each region's share
	// at least its lower bound and at most its want. A region held at its
	// lower bound (its floor returning within the window) is not given an
	// equal part of the rest on top of it: the level passes it only once
	// the others reach it. Water-fill without the lower bounds; a region
	// left below its own is set to it and the rest filled again, the level
	// only falling, so no region set at its lower bound would have got more.
	ord := a.order[:0]
	for i := range tgt {
		if tgt[i] < 0 {
			ord = append(ord, i)
			capacity += lb[i]
		}
	}
	slices.SortFunc(ord, func(x, y int) int { return cmpRatio(want[x], bud.weights[x], want[y], bud.weights[y]) })
	for n := -1; n != len(ord); {
		n = len(ord)
		waterFill(ord, capacity, tgt, want, bud.weights, a.rem)
		ord = slices.DeleteFunc(ord, func(i int) bool {
			if tgt[i] >= lb[i] {
				return false
			}
			tgt[i] = lb[i]
			capacity -= lb[i]
			return true
		})
	}
}

// waterFill shares capacity among the regions ord, sorted by want per
// weight, max-min by weight: a region wanting less than its part gets its
// want, and the rest share what it leaves (apportion: to the token). It
// sets tgt for each of them; rem is scratch.
func waterFill(ord []int, capacity int64, tgt, want, weights, rem []int64) {
	capacity = max(capacity, 0)
	var wsum int64
	for _, i := range ord {
		wsum += weights[i]
	}
	left := capacity
	for j, i := range ord {
		// want(i)/w(i) ≤ left/wsum: region i is satisfied.
		if cmpRatio(want[i], weights[i], left, wsum) <= 0 {
			tgt[i] = want[i]
			left -= want[i]
			wsum -= weights[i]
			continue
		}
		for _, i := range ord[j:] {
			tgt[i] = 0
		}
		apportion(ord[j:], left, wsum, weights, tgt, rem)
		break
	}
}

// padded is a demand of w with the headroom a region using a key is given:
// Headroom of it, or NoiseHeadroom's share of the budget where larger, at
// most w itself.
func (a *Allocator) padded(bud *budget, w int64) int64 {
	return w + max(a.headroom(w), min(bud.noise, w))
}

// headroom is the headroom on a demand of w: Config.Headroom of it,
// rounded up.
func (a *Allocator) headroom(w int64) int64 {
	return int64(math.Ceil(float64(w) * a.cfg.Headroom))
}

// fillToward sets tgt[i] for the regions with tgt[i] < 0 to from[i] plus
// their part of left, in proportion to how far each is from to[i]
// (apportion: to the token); room, the sum of those distances, is more
// than left.
func (a *Allocator) fillToward(tgt, from, to []int64, left, room int64) {
	idx, dist := a.order[:0], a.dist[:len(tgt)]
	for i := range tgt {
		if tgt[i] < 0 {
			idx = append(idx, i)
			tgt[i], dist[i] = from[i], to[i]-from[i]
		}
	}
	apportion(idx, left, room, dist, tgt, a.rem)
}

// apportion adds left to tgt over the regions idx, in proportion to w[i] of
// total (w's sum over idx) by largest remainder: each region's part is
// ⌊left×w[i]/total⌋, and the tokens those leave, fewer than len(idx), go
// one each to the regions with the largest remainders, ties to the lowest
// index; rem is scratch. The parts sum to left exactly, and none exceeds
// ⌈left×w[i]/total⌉. Parts rounded down alone leave up to a token per
// region unused every period, which a static split's fractional shares
// admit: a budget of 500 a second over three regions was granted 166 each,
// 2 tokens a second short of it.
func apportion(idx []int, left, total int64, w, tgt, rem []int64) {
	given := int64(0)
	for _, i := range idx {
		q, r := mulDivRem(left, w[i], total)
		tgt[i] += q
		rem[i] = r
		given += q
	}
	for ; given < left; given++ {
		best := -1
		for _, i := range idx {
			if rem[i] > 0 && (best < 0 || rem[i] > rem[best] || rem[i] == rem[best] && i < best) {
				best = i
			}
		}
		if best < 0 {
			return
		}
		tgt[best]++
		rem[best] = 0
	}
}

// sliverDiv sets the smallest part of an increase granted while the rest
// waits for capacity to free up: 1/sliverDiv of the budget's count, or the
// hysteresis if smaller. It is not the hysteresis: a region waiting for
// capacity another region is giving back should get each part that frees
// up once it is worth a grant, not only once it is worth a move.
const sliverDiv = 100

// cmpRatio compares a/b with c/d for a, c >= 0 and b, d > 0 without
// overflow. Its callers pass wants above lower bounds (want = max(w, lb))
// and capacity left, which never drops below 0, over positive weights.
func cmpRatio(a, b, c, d int64) int {
	h1, l1 := bits.Mul64(uint64(a), uint64(d)) // #nosec G115 -- non-negative by the precondition above
	h2, l2 := bits.Mul64(uint64(c), uint64(b)) // #nosec G115 -- as above
	switch {
	case h1 < h2 || h1 == h2 && l1 < l2:
		return -1
	case h1 == h2 && l1 == l2:
		return 0
	}
	return 1
}

func abs(x int64) int64 {
	if x < 0 {
		return -x
	}
	return x
}

// set changes region i's allocation of k to v in the region's next version.
func (a *Allocator) set(k *hotKey, i int, v int64) {
	r, s := k.bud.regions[i], &k.slots[i]
	s.prune(r.acked)
	if v < s.cur {
		r.lowered = true
		b := k.bud.b
		s.room = min(s.room+int64(b.BurstOf(bucket.Tokens(s.cur))-b.BurstOf(bucket.Tokens(v))), int64(b.Limit.Burst()))
	}
	s.cur = v
	s.push(r.version+1, v)
	if !s.queued {
		s.queued = true
		r.changed = append(r.changed, &slotRef{k: k, i: i})
	}
}

// setWant records a demand reported at t (Unix ns), the largest one
// reported within hold (peak), and the largest one reported since the
// region last reported half of it or more, within keep (top). A reading
// lower than the one before it, once the last peak's hold has ended,
// starts no hold of its own (peak): the region is
// coming down from a level it reported longer ago than the fill time (its
// demand moved away), not pausing within a burst, and a hold from its
// first reading of the fall kept its floor from the region the demand
// moved to for the whole fill time.
func (s *slot) setWant(t, want, hold, keep int64) {
	prev := s.want
	s.want, s.wantAt = want, t
	switch {
	case t-s.peakAt > hold && want < prev:
		s.peak = want // the hold stays ended
	case want >= s.peak || t-s.peakAt > hold:
		s.peak, s.peakAt = want, t
	}
	switch {
	case t-s.topAt > keep:
		s.top, s.topAt = want, t
	case 2*want >= s.top:
		s.top, s.topAt = max(s.top, want), t
	}
}

// push records that the region may hold count from version ver on.
func (s *slot) push(ver uint64, count int64) {
	if s.n > 0 && s.hist[s.n-1].ver == ver {
		s.hist[s.n-1].count = count // replaced before it was sent
		return
	}
	if int(s.n) == len(s.hist) {
		// Merge the two oldest, keeping the larger value: conservative.
		s.hist[0].count = max(s.hist[0].count, s.hist[1].count)
		copy(s.hist[1:], s.hist[2:])
		s.n--
	}
	s.hist[s.n] = hval{ver: ver, count: count}
	s.n++
}

// holdAtLeast records that the region said it holds count at version ver or
// earlier (a hello).
func (s *slot) holdAtLeast(count int64) {
	// The last entry lives longest: it goes only when a later version is
	// acknowledged, which replaces whatever the hello reported.
	s.hist[s.n-1].count = max(s.hist[s.n-1].count, count)
}

// prune forgets values superseded by the acknowledged version acked.
func (s *slot) prune(acked uint64) {
	j := 0
	for j+1 < int(s.n) && s.hist[j+1].ver <= acked {
		j++
	}
	if j > 0 {
		copy(s.hist[:], s.hist[j:s.n])
		s.n -= uint8(j)
	}
}

func (s *slot) max() int64 {
	m := s.hist[0].count
	for j := 1; j < int(s.n); j++ {
		m = max(m, s.hist[j].count)
	}
	return m
}

// sendGrant queues a grant to r with its changes (or full table).
func (a *Allocator) sendGrant(now time.Time, r *region, renew bool) {
	m := Message{
		Type: MsgGrant, Region: r.name, Session: r.session, Term: a.term, Seq: r.lastReq,
		TTL: a.cfg.TTL, Hold: a.cfg.Hold, Refresh: a.cfg.Refresh, Drift: a.cfg.Drift,
		Renew: renew, Base: r.version, Version: r.version, Learning: a.withholding(now),
	}
	if r.needFull {
		m.Full, m.Base = true, 0
		m.Version = r.version + 1
		m.Budgets = slices.Clone(a.cfg.Budgets)
		for _, k := range a.keys {
			i := slices.Index(k.bud.regions, r)
			if i < 0 {
				continue
			}
			s := &k.slots[i]
			s.queued = false
			switch {
			case s.cur != k.bud.floors[i]:
				m.Entries = append(m.Entries, Entry{Key: k.key, Count: bucket.Tokens(s.cur), Burst: k.bud.b.BurstOf(bucket.Tokens(s.cur)), Credit: a.carry(s)})
			case s.credit > 0:
				m.Entries = append(m.Entries, Entry{Key: k.key, Drop: true, Credit: a.carry(s)})
			}
			s.push(m.Version, s.cur)
		}
		r.changed = r.changed[:0]
		r.needFull = false
	} else if len(r.changed) > 0 {
		m.Version = r.version + 1
		for _, ref := range r.changed {
			s := &ref.k.slots[ref.i]
			s.queued = false
			e := Entry{Key: ref.k.key, Count: bucket.Tokens(s.cur), Burst: ref.k.bud.b.BurstOf(bucket.Tokens(s.cur))}
			if s.cur == ref.k.bud.floors[ref.i] {
				e = Entry{Key: ref.k.key, Drop: true}
			}
			e.Credit = a.carry(s)
			m.Entries = append(m.Entries, e)
		}
		clear(r.changed)
		r.changed = r.changed[:0]
		slices.SortFunc(m.Entries, func(x, y Entry) int { return cmpKey(x.Key, y.Key) })
	}
	// A delta that only raises needs no acknowledgement: the claims count
	// every value sent since the last one acknowledged at its largest, and
	// for a key the values after ackTo only rise, so the last is the
	// largest, whichever of them the region holds. Whatever else a grant
	// tells (a renewal, a full table, a learning grant, a decrease) is
	// acknowledged, and so is a raise to a region not heard from within a
	// quarter of a refresh interval: its link may be down, and only a
	// missing acknowledgement makes the next round resend a lost grant.
	m.Quiet = m.Version > r.version && !m.Full && !renew && !m.Learning && !r.lowered &&
		now.Sub(r.heard) < a.cfg.Refresh/quietHeard
	r.lowered = false
	if m.Version > r.version && !m.Quiet {
		if r.acked == r.version {
			r.unackedSince = now
		}
		r.ackTo = m.Version
	}
	r.version = m.Version
	r.ackQuiet()
	// Whatever this grant carries must be capped again if the lease has
	// run out: the next Tick caps it at the floors before any renewal.
	if len(m.Entries) > 0 || renew {
		r.lapsed, r.floored = false, false
	}
	r.grant++
	m.Grant = r.grant
	r.grants[r.grant%uint64(len(r.grants))] = grantRec{id: r.grant, at: now}
	if renew {
		// The Holder measures the lease from when it sent request Seq, which
		// arrived at reqAt: the lease cannot outlive reqAt+TTL+Drift here,
		// however late this grant arrives (or whether it arrives at all).
		from := r.reqAt
		if from.IsZero() || from.After(now) {
			from = now
		}
		r.leaseEnd = maxTime(r.leaseEnd, from.Add(a.cfg.TTL+a.cfg.Drift))
		r.renewal, r.renewalAt = r.grant, now
		a.stats.Renewals++
	}
	a.stats.Grants++
	a.out = append(a.out, m)
}

// carry returns the stored reserve tokens s's next grant carries, once.
func (a *Allocator) carry(s *slot) bucket.Tokens {
	c := s.credit
	s.credit = 0
	a.stats.Carried += uint64(c) // #nosec G115 -- a credit is never negative: min of a burst's growth and the stored reserve, both > 0
	return bucket.Tokens(c)
}

// flush sends the changes made outside a round as grants that do not
// renew, but for the first leader's while it learns: it raises then, and a
// leader's first round runs before any hello, so until the round at
// learning's end its regions would hold no lease to use a raise under.
func (a *Allocator) flush(now time.Time) {
	renew := a.first && a.Learning(now)
	for _, r := range a.regions {
		if (r.needFull || len(r.changed) > 0) && r.known && !r.released {
			a.sendGrant(now, r, renew)
		}
	}
}

// ExpireAll ends every region's lease now, for a coordinator about to stop
// on purpose: regions drop to their floors at once instead of running their
// leases out, and the Allocator grants nothing more.
func (a *Allocator) ExpireAll(now time.Time) {
	a.expiring = true
	for _, r := range a.regions {
		if !r.known || r.released {
			continue
		}
		r.grant++
		r.grants[r.grant%uint64(len(r.grants))] = grantRec{id: r.grant, at: now, expire: true}
		a.out = append(a.out, Message{Type: MsgExpire, Region: r.name, Session: r.session, Term: a.term, Grant: r.grant, Version: r.version})
	}
}

// Ready returns the messages to send, in order, and forgets them. Messages
// to one region must be delivered in order for best effect, but any loss,
// duplication or reordering is safe.
func (a *Allocator) Ready() []Message {
	out := a.out
	a.out = nil
	return out
}

// HasReady reports whether Ready would return messages.
func (a *Allocator) HasReady() bool { return len(a.out) > 0 }

// Stats returns the counters and gauges.
func (a *Allocator) Stats(now time.Time) Stats {
	s := a.stats
	s.HotKeys = len(a.keys)
	s.Learning = a.Learning(now)
	return s
}
