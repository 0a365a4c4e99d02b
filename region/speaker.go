package region

import (
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/allot-dev/allot/lease"
)

// SpeakerOf returns the agent that speaks to the coordinator for a region
// whose live agents are members, given current, the agent that published
// the table the caller decides with (empty when it has none): current while
// it is among members, else the lowest name. Every agent computes the same
// answer from the same membership and table, so at most one stands once
// both have converged (and the speaker lease admits one meanwhile), and
// another takes over when the speaker dies or loses the store.
//
// The speaker stays while it lives: an agent with a lower name that joins
// (one restarted) does not take over. Chosen by the lowest name alone, the
// speaker stood down as soon as it saw the newcomer, which stands only
// once it has waited SpeakerWait (agent.Config) since it started: in
// chaos's speaker-killed (seed 3, the harness's status samples) eu-0 was
// back at 30.2 s, eu-1 stopped speaking at 30.6 s and eu-0 spoke from
// 31.8 s, so eu reported and acknowledged nothing for 1.2 s just as the
// demand left it and another region waited for its decrease; a hand-over
// also restores a Speaker from the stored table and opens a new stream.
func SpeakerOf(members []string, current string) string {
	if len(members) == 0 {
		return ""
	}
	if current != "" && slices.Contains(members, current) {
		return current
	}
	return slices.Min(members)
}

// SpeakerConfig configures a region's Speaker.
type SpeakerConfig struct {
	// Region is the region, Agent the agent that speaks for it.
	Region string
	Agent  string
	// Budgets are the leased budgets (Budgets of the rules).
	Budgets []lease.Budget
	// Drift and Refresh are the Holder's (lease.HolderConfig).
	Drift   time.Duration
	Refresh time.Duration
	// DemandMaxAge drops agents' demand reports older than this: neither
	// their demand nor the table they say they decide with counts.
	DemandMaxAge time.Duration
}

// DefaultSpeakerConfig returns a SpeakerConfig with the defaults matching
// lease.DefaultConfig; Region, Agent and Budgets are left to the caller.
func DefaultSpeakerConfig() SpeakerConfig {
	hc := lease.DefaultHolderConfig()
	return SpeakerConfig{
		Drift:        hc.Drift,
		Refresh:      hc.Refresh,
		DemandMaxAge: 2 * time.Second, // a few missed reports
	}
}

// Validate reports the first problem with c, naming the field and value.
func (c SpeakerConfig) Validate() error {
	switch {
	case c.Region == "":
		return fmt.Errorf("%w: speaker region is empty", ErrInvalidConfig)
	case c.Agent == "":
		return fmt.Errorf("%w: speaker agent is empty", ErrInvalidConfig)
	case c.DemandMaxAge <= 0:
		return fmt.Errorf("%w: speaker demand_max_age=%s must be > 0", ErrInvalidConfig, c.DemandMaxAge)
	case c.Drift < 0:
		return fmt.Errorf("%w: speaker drift=%s must be ≥ 0", ErrInvalidConfig, c.Drift)
	}
	return nil
}

// Speaker is the protocol of the agent that speaks for its region: the
// region's lease.Holder, fed the region's summed demand; a Settler for the
// allocation changes the Holder makes; the table every agent of the region
// decides with, numbered by publication; and acknowledgements held back
// until every live agent has adopted the table they belong to.
//
// Like etcd's raft it does no I/O, starts no goroutines, takes no locks and
// reads no clock: its driver feeds it the coordinator's messages (Step),
// the passing of time with the agents' demand reports and the live members
// (Tick), a new stream (Connected) and a clean stop (Release), carries out
// what Ready lists, in the order the fields say, and reports back how it
// went (Advance). The agent's lease client and the simulator are its two
// drivers. It is not safe for concurrent use.
type Speaker struct {
	cfg     SpeakerConfig
	holder  *lease.Holder
	settler *Settler
	now     time.Time // of the latest input

	last      *Table // the table last published (or resumed)
	pubBase   uint64 // the last publication number used
	republish bool   // last must be published again, above pubBase
	// pending are acknowledgements held back until every live agent has
	// adopted the publication they belong to, oldest first; adopted is
	// what each agent last reported deciding with.
	pending []pendingAck
	// retAck is the latest acknowledgement the last Ready produced (in
	// s.pending or in that Ready's Send), which Advance completes with what
	// its settlement took away (lease.Message.Returns); nil when it
	// produced none.
	retAck  *lease.Message
	adopted map[string]adoption
	live    []string // nil until the first Tick says who is live

	sum, tmp []lease.Demand // Tick's buffers

	// mark is the Holder's state when Ready last looked at its table, at
	// markAt: while it stays the same and no lease or hold end passes,
	// nothing is to settle or publish, and Ready skips building the table.
	// dirty forces a look (new budgets, a settle that failed).
	mark   holderMark
	markAt time.Time
	dirty  bool
}

// holderMark is what identifies a Holder's table and lease: a change of
// entries moves the version (or the term, or their number), a renewal the
// lease end.
type holderMark struct {
	term, version       uint64
	leaseEnd, holdUntil time.Time
	entries             int
	released            bool
}

func markOf(st lease.HolderStatus) holderMark {
	return holderMark{term: st.Term, version: st.Version, leaseEnd: st.LeaseEnd, holdUntil: st.HoldUntil,
		entries: st.Entries, released: st.Released}
}

// passed reports whether x lies between a and b: an instant the clock
// moved across, either way.
func passed(a, b, x time.Time) bool { return a.Before(x) != b.Before(x) }

type pendingAck struct {
	m   lease.Message
	pub uint64
}

// adoption is the table an agent reported deciding with.
type adoption struct {
	pub     uint64
	speaker string
}

// Ready is what the Speaker asks of its driver after an input. The driver
// carries it out in field order, calling Advance with the outcome before
// it sends:
//
//  1. Settle every Change in the regional store (Change.Apply, or Settle),
//     before anything else: an agent must never decide with a table whose
//     allocation its bucket does not have yet;
//  2. then Publish the table, when set: to the store the region's agents
//     read it from, and to the speaking agent's own view, which adopts it
//     at once;
//  3. then report the Outcome to Advance, which completes the latest
//     acknowledgement with what the settlement took away from the buckets
//     (lease.Message.Returns), in Send when it is there;
//  4. then Send the messages, in order, on the stream to the coordinator
//     (dropped when there is none: a new stream starts with a hello). An
//     acknowledgement is among them only once every live agent has
//     reported adopting the publication it belongs to.
type Ready struct {
	Settle  []Change
	Publish *Table
	Send    []lease.Message
}

// Outcome is how the driver carried out a Ready. The zero Outcome means
// everything was done.
type Outcome struct {
	// Unsettled are the changes of Ready.Settle the store did not take;
	// their buckets keep the old limit and they are listed again.
	Unsettled []Change
	// Lost are the tokens the rebases of Ready.Settle took away (what a
	// bucket held beyond its new burst; Change.Apply): Advance puts them on
	// the acknowledgement of the decreases, so the coordinator puts them
	// back in the budget's stored reserve.
	Lost []Loss
	// Refused is set when the store refused Ready.Publish because it holds
	// a table numbered StoredPub ≥ its Pub: another speaker published
	// while membership was split. The Speaker publishes again above it at
	// its next Ready, so the region's agents take this speaker's table.
	Refused   bool
	StoredPub uint64
}

// NewSpeaker returns the Speaker of a region with no table yet: a new
// lease.Holder (under session), every key at its floor. Publications are
// numbered from now's microseconds, so they go on above any table an agent
// may still hold from before.
func NewSpeaker(cfg SpeakerConfig, session uint64, now time.Time) (*Speaker, error) {
	return RestoreSpeaker(cfg, session, nil, now)
}

// RestoreSpeaker returns the Speaker of an agent that takes over its
// region's lease from the shared table t (nil: none, as NewSpeaker): the
// Holder resumes t's lease and entries under a new session, which the
// coordinator treats as a new incarnation that holds what it says, so the
// lease does not lapse across the takeover. The allocations t gives at now
// count as settled (the previous speaker settled them), and publications go
// on above t's.
func RestoreSpeaker(cfg SpeakerConfig, session uint64, t *Table, now time.Time) (*Speaker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	hc := lease.HolderConfig{Region: cfg.Region, Session: session, Budgets: cfg.Budgets, Drift: cfg.Drift, Refresh: cfg.Refresh}
	var h *lease.Holder
	var err error
	if t != nil {
		h, err = lease.RestoreHolder(hc, t.HolderState(session), now)
	} else {
		h, err = lease.NewHolder(hc, now)
	}
	if err != nil {
		return nil, fmt.Errorf("region: speaker for %s: %w", cfg.Region, err)
	}
	s := &Speaker{cfg: cfg, holder: h, settler: NewSettler(cfg.Region, cfg.Budgets), now: now,
		last: t, pubBase: uint64(now.UnixMicro()), adopted: map[string]adoption{}, dirty: true}
	if t != nil {
		s.pubBase = max(s.pubBase, t.Pub)
		s.settler.Resume(now, h)
	}
	return s, nil
}

// Step applies a message from the coordinator at now. The error is only
// for a message a region does not accept; it changes nothing.
func (s *Speaker) Step(now time.Time, m lease.Message) error {
	s.now = now
	return s.holder.Step(now, m)
}

// Tick moves the Speaker to now: it takes every live agent's report not
// older than DemandMaxAge (the table it decides with, and its demand,
// summed over the live agents into the region's), and ticks the Holder,
// which reports every refresh interval and at once for a key pressing on
// its allocation. live lists the region's live agents, this one included;
// nil reports (the shared store did not answer) change neither demand nor
// adoption.
func (s *Speaker) Tick(now time.Time, reports []DemandReport, live []string) {
	s.live = append(make([]string, 0, len(live)), live...)
	s.Adopted(now, reports)
	if reports != nil {
		s.sum, s.tmp = sumDemand(s.sum[:0], s.tmp[:0], reports, live, now, s.cfg.DemandMaxAge)
		for _, d := range s.sum {
			s.holder.Demand(now, d.Key, d.Want)
		}
		s.holder.Fed(now)
	}
	s.holder.Tick(now)
}

// Adopted takes, between ticks, the tables the agents' reports say they
// decide with (reports older than DemandMaxAge are not counted): an agent
// told of a publication adopts it and reports so at once, and the
// acknowledgements that waited for it go at the next Ready rather than
// after the next Tick. Demand is left to Tick.
func (s *Speaker) Adopted(now time.Time, reports []DemandReport) {
	s.now = now
	for _, r := range reports {
		if now.Sub(r.At) <= s.cfg.DemandMaxAge {
			s.adopted[r.Agent] = adoption{pub: r.Pub, speaker: r.Speaker}
		}
	}
}

// Connected tells the Speaker its driver opened a new stream (perhaps to
// another coordinator) at now: acknowledgements held for the last stream
// are dropped, since the hello it says at once answers for them.
func (s *Speaker) Connected(now time.Time) {
	s.now = now
	s.pending = nil
	s.holder.Reconnect(now)
}

// Release gives back everything above the floors, for the region's last
// agent stopping cleanly: the next Ready settles the floors, publishes the
// released table and sends the release.
func (s *Speaker) Release(now time.Time) {
	s.now = now
	s.holder.Release(now)
}

// SetBudgets replaces the budgets (after a rules change); floors change at
// once.
func (s *Speaker) SetBudgets(bs []lease.Budget) error {
	if err := s.holder.SetBudgets(bs); err != nil {
		return fmt.Errorf("region: speaker for %s: %w", s.cfg.Region, err)
	}
	s.cfg.Budgets = bs
	s.settler.SetBudgets(bs)
	s.dirty = true
	return nil
}

// Ready returns what to do after the inputs so far, at the time of the
// latest (see Ready for the order), and forgets it.
func (s *Speaker) Ready() Ready {
	var rd Ready
	s.retAck = nil // a Ready not advanced is given up
	st := s.holder.Status(s.now)
	m := markOf(st)
	if t := s.last; t != nil && (passed(s.markAt, s.now, t.LeaseEnd) || passed(s.markAt, s.now, t.HoldUntil)) {
		// The agents decided with the last table past its lease's or
		// hold's end; a grant since may have renewed it.
		s.settler.Lapsed(t)
		s.dirty = true
	}
	if s.dirty || m != s.mark || passed(s.markAt, s.now, st.LeaseEnd) || passed(s.markAt, s.now, st.HoldUntil) {
		rd.Settle = s.settler.Changes(s.now, s.holder)
		t := TableOf(s.cfg.Region, s.cfg.Agent, s.pubBase+1, s.holder.Snapshot(), s.now)
		if !t.Same(s.last) {
			s.last, s.pubBase = t, t.Pub
			rd.Publish = t
		}
		s.mark, s.markAt, s.dirty = m, s.now, false
	}
	if s.republish && s.last != nil {
		if rd.Publish == nil {
			t := *s.last
			t.Pub, t.Written = s.pubBase+1, s.now
			rd.Publish = &t
			s.last, s.pubBase = rd.Publish, rd.Publish.Pub
		}
		s.republish = false
	}
	// An acknowledgement tells the coordinator the region no longer uses
	// what the grant took away; the other agents use it until they adopt
	// the table that carries the grant. So it waits for that.
	var pub uint64
	if s.last != nil {
		pub = s.last.Pub
	}
	acks := 0
	for _, m := range s.holder.Ready() {
		if m.Type == lease.MsgAck {
			acks++
			s.pending = append(s.pending, pendingAck{m: m, pub: pub})
		} else {
			rd.Send = append(rd.Send, m)
		}
	}
	rd.Send = append(rd.Send, s.Acks()...)
	// What this Ready's settlement takes away goes back with the latest
	// acknowledgement it produced (Advance): still pending, or the last
	// one in Send, which the driver sends after Advance.
	if acks > 0 {
		if n := len(s.pending); n > 0 {
			s.retAck = &s.pending[n-1].m
		} else {
			for j := len(rd.Send) - 1; j >= 0; j-- {
				if rd.Send[j].Type == lease.MsgAck {
					s.retAck = &rd.Send[j]
					break
				}
			}
		}
	}
	return rd
}

// Reports returns the reports (and hellos) the inputs so far queued, and
// forgets them, leaving the rest to Ready: a driver that carries Ready out
// on a goroutine of its own sends them while a carry is under way
// (lease.Holder.ReadyReports). Only Ready settles and publishes.
func (s *Speaker) Reports() []lease.Message { return s.holder.ReadyReports() }

// Acks returns the acknowledgements whose publication every live agent has
// reported adopting, in order, and forgets them; Ready sends them too. A
// driver that carries Ready out on a goroutine of its own sends them as
// the adoptions come in, rather than after the carry under way. Between a
// Ready and its Advance, the acknowledgement that Advance is to put the
// carry's returns on (Outcome.Lost) stays, with those after it, for the
// next Ready.
func (s *Speaker) Acks() []lease.Message {
	done := s.adoptedPub()
	var out []lease.Message
	i := 0
	for ; i < len(s.pending) && s.pending[i].pub <= done && s.retAck != &s.pending[i].m; i++ {
		out = append(out, s.pending[i].m)
	}
	s.pending = s.pending[i:]
	return out
}

// adoptedPub is the publication every live agent but this one has
// reported adopting (this one adopts on publishing); 0 while one decides
// with another speaker's table, or before a Tick has said who is live.
func (s *Speaker) adoptedPub() uint64 {
	if s.live == nil {
		return 0
	}
	done := uint64(math.MaxUint64)
	for _, a := range s.live {
		if a == s.cfg.Agent {
			continue
		}
		r := s.adopted[a]
		if r.speaker != s.cfg.Agent {
			return 0
		}
		done = min(done, r.pub)
	}
	return done
}

// Advance takes the outcome of the last Ready.
func (s *Speaker) Advance(o Outcome) {
	for _, c := range o.Unsettled {
		s.settler.Unsettle(c)
		s.dirty = true
	}
	if ack := s.retAck; ack != nil {
		s.retAck = nil
		for _, l := range o.Lost {
			// Only what a decrease applied once took away: a change listed
			// again may find its bucket at another limit than From (a full
			// bucket is stored as none, and reads as full under any limit),
			// so what it reports is not known to have been there. That
			// includes every move to the floors past a lease's end (Lapsed),
			// when the coordinator no longer counts the region's allocation.
			c := l.Change
			if l.Tokens > 0 && !c.Again && c.To.Burst() < c.From.Burst() {
				ack.Returns = append(ack.Returns, lease.Return{Key: c.Key, Tokens: min(l.Tokens, c.From.Burst()-c.To.Burst())})
			}
		}
	}
	if o.Refused {
		s.pubBase = max(s.pubBase, o.StoredPub)
		s.republish = true
	}
}

// Table returns the table last published (or resumed from), nil before
// the first.
func (s *Speaker) Table() *Table { return s.last }

// Status reports the Holder's lease at now.
func (s *Speaker) Status(now time.Time) lease.HolderStatus { return s.holder.Status(now) }

// Budgets returns the budgets the Holder serves: its configured ones until
// a coordinator's full table brings the coordinator's.
func (s *Speaker) Budgets() []lease.Budget { return s.holder.Budgets() }

// PendingAcks is how many acknowledgements wait for the agents to adopt
// their table.
func (s *Speaker) PendingAcks() int { return len(s.pending) }

// Config returns the Speaker's configuration (its budgets as last set).
func (s *Speaker) Config() SpeakerConfig { return s.cfg }
