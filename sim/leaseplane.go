package sim

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// leasePlane drives the real lease protocol: per region, the speaking
// agent's region.Speaker (at the region's clock), and a lease.Allocator on
// the coordinator leader (at the clock of the region it runs in),
// exchanging lease.Messages over the simulated network. It is the
// Speaker's driver, as agent.LeaseClient is in the agent: it feeds it the
// coordinator's messages, ticks it with the agents' demand reports read
// from the region's shared store and the live agents, and carries out its
// Ready in order: settle in the regional Redis model, publish the table to
// the shared store (where the agents load it at their ticks), send.
type leasePlane struct {
	a       *allot
	budgets []lease.Budget
	cfg     lease.Config
	spkCfg  region.SpeakerConfig // Region and Agent set per speaker
	keys    []bucket.Key
	floors  [][]bucket.Limit // [region][rule]

	regions []*regionPlane
	coords  []coordinator
	leader  int // −1 during an election
	term    uint64

	msgs       int64
	tracked    []int // per rule: the budget whose allocation is charted
	allocBins  [][][]float64
	stepErrors int64
	// published counts the tables the speakers published, refused those
	// the shared store refused as not newer than its own.
	published, refused int64
	// rng draws the control plane's own randomness (sessions, the shared
	// store's losses), apart from the decision path's stream.
	rng *rand.Rand
	// msgBins counts lease messages per time bin, for the steady-state
	// rate.
	msgBins []int64
	// violations counts broken protocol promises (protocol.go);
	// violationList holds the first few.
	violations    int64
	violationList []string
	// keyBuf is checkSettled's list of a publication's keys, kept between
	// publications.
	keyBuf []bucket.Key
}

// regionPlane is one region's end of the lease protocol.
type regionPlane struct {
	sp      *region.Speaker // nil while no agent speaks
	speaker int             // the speaking agent, −1 when none
	shared  *sharedStore
	store   *regionStore
	// view follows the region's publications, for the allocation chart.
	view *region.TableView
	// last is the current speaker's last publication, live is the list
	// of live agents its last Tick was given, carries maps a grant to the
	// publication current when the Speaker took it (once per delivery: a
	// duplicated grant is acknowledged again), and stepped is the grant the
	// Speaker was just given (protocol.go's checks).
	last    *region.Table
	live    []string
	carries map[grantRef][]uint64
	stepped *grantRef
	// checkViews are checkSettled's views of the previous publication and
	// the new one per rule, kept from check to check so that their floors
	// are computed once, not at every publication.
	checkViews [2][]*region.TableView
	// heardNext is when a notice of a new level may next tick the Speaker
	// (half a tick after the last that did; 0: now), and later is set
	// while one that came before then waits for it (plHeard), as the
	// agent's LeaseClient.heardRound.
	heardNext Micros
	later     bool
	// onRound, when a test sets it, sees every round of the Speaker.
	onRound func(t Micros)
	// upLast and downLast are the latest arrivals a coordinator_delay
	// fault set on the region's lease stream, to and from the
	// coordinators: a delayed message keeps the stream's order.
	upLast, downLast Micros
}

type coordinator struct {
	region int
	alloc  *lease.Allocator
}

// Plane event kinds, carried in event.flag under alPlane.
const (
	plSpeakerTick int8 = iota
	plAllocTick
	plToCoord
	plToRegion
	plElected
	plReconnect
	plAdopt // an agent told of a publication adopts the table the notice carries
	plWake  // the speaking agent told of an adoption takes the report the notice carries
	plHeard // the half tick after the last round that reports announced whole ticked the Speaker ended
)

// tickEvery is how often the coordinator's driver ticks the Allocator.
const tickEvery = 200_000 // µs

// speakerTick is how often the speaking agent ticks its Speaker and
// gathers its region's demand, as agent.DefaultSpeakerConfig's Tick.
const speakerTick = 100_000 // µs

// speakerWait is how long a restarted agent waits before it may speak
// (agent.DefaultConfig's SpeakerWait); meanwhile it is live, so the agent
// that spoke stops, and nobody speaks.
const speakerWait = 1_500_000 // µs

func newPlane(w *world, a *allot) (*leasePlane, error) {
	sc := w.sc
	p := &leasePlane{a: a, leader: 0, term: 1, rng: rand.New(rand.NewPCG(w.seed, 0x6c65617365))} // "lease"
	var names []string
	for _, r := range w.regions {
		names = append(names, r.name)
	}
	for _, r := range w.rules {
		p.budgets = append(p.budgets, lease.Budget{Rule: r.spec.Name, Limit: r.limit, Regions: names,
			Weights: r.spec.Weights, Reserve: r.spec.Reserve, Policy: r.spec.allocation()})
		p.keys = appendKeys(p.keys, r.spec.Name, r.keys)
		tr := 0
		for _, ts := range sc.Traffic {
			if ts.Rule == r.spec.Name && ts.Key != nil {
				tr = *ts.Key
			}
		}
		p.tracked = append(p.tracked, r.base+tr)
	}
	cfg := sc.LeaseConfig()
	cfg.Budgets = p.budgets
	cfg.UnsafeSkipEscrow = w.opts.UnsafeSkipEscrow
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: scenario %s: coordinator: %w", sc.Name, err)
	}
	p.cfg = cfg
	p.spkCfg = region.DefaultSpeakerConfig()
	p.spkCfg.Budgets, p.spkCfg.Drift, p.spkCfg.Refresh = p.budgets, cfg.Drift, cfg.Refresh
	for _, name := range sc.Coordinator.Regions {
		p.coords = append(p.coords, coordinator{region: sc.regionIndex(name)})
	}
	alloc, err := lease.NewFirstAllocator(cfg, p.term, p.coordNow(w, 0, 0))
	if err != nil {
		return nil, fmt.Errorf("sim: new allocator: %w", err)
	}
	p.coords[0].alloc = alloc
	for r := range w.regions {
		fl := make([]bucket.Limit, len(w.rules))
		for i, b := range p.budgets {
			fl[i] = b.Floor(w.regions[r].name).Limit
		}
		p.floors = append(p.floors, fl)
		p.regions = append(p.regions, &regionPlane{speaker: -1, shared: newSharedStore(w.regions[r].agents),
			store: &regionStore{p: p, rd: a.redis[r], r: r}, view: region.NewTableView(w.regions[r].name, a.cfg[r].Floors)})
		// Stagger the regions' ticks so they do not all fire at once.
		w.at(Micros(r+1)*997, a.si, event{sub: alPlane, flag: plSpeakerTick, aux: int32(r)})
	}
	p.allocBins = make([][][]float64, len(w.rules))
	for i := range p.allocBins {
		p.allocBins[i] = make([][]float64, len(w.regions))
		for r := range p.allocBins[i] {
			p.allocBins[i][r] = make([]float64, w.sc.Bins)
		}
	}
	w.at(tickEvery/2, a.si, event{sub: alPlane, flag: plAllocTick})
	return p, nil
}

// start makes every region's first speaker at t: the agents of a fresh
// region all start together, so none waits.
func (p *leasePlane) start(w *world, t Micros) {
	for r := range p.regions {
		p.elect(w, r, t)
	}
}

func (p *leasePlane) regionNow(w *world, r int, t Micros) time.Time { return w.regions[r].agent.at(t) }

func (p *leasePlane) coordNow(w *world, c int, t Micros) time.Time {
	return w.regions[p.coords[c].region].agent.at(t)
}

// elect makes the agent that should speak for region r at t do so, as
// the agent does: each live agent stands when region.SpeakerOf, over the
// agents whose breaker is closed (or over all of them when none is) and
// the speaker of the table its view holds, names it, once it has waited
// speakerWait since it started; it speaks only while it holds the speaker
// lease in the region's store (holdSpeaker). A new speaker restores its
// Speaker from the newer of the shared table and its own view, under a
// new session, and opens a stream.
func (p *leasePlane) elect(w *world, r int, t Micros) {
	rp := p.regions[r]
	want := -1
	var live, reach []string
	for _, ag := range p.a.agents[r] {
		if ag.alive {
			live = append(live, ag.name)
			if !ag.cut {
				reach = append(reach, ag.name)
			}
		}
	}
	if len(reach) == 0 {
		reach = live
	}
	for i, ag := range p.a.agents[r] {
		if !ag.alive || ag.speakAfter > t {
			continue
		}
		if region.SpeakerOf(reach, ag.view.Speaker()) == ag.name && rp.shared.holdSpeaker(w, p, r, i, t) {
			want = i
			break
		}
	}
	if want == rp.speaker {
		return
	}
	rp.sp, rp.speaker = nil, want
	rp.heardNext, rp.later = 0, false // a new speaker's client
	if want < 0 {
		return
	}
	ag := p.a.agents[r][want]
	now := p.regionNow(w, r, t)
	tb := ag.view.Table()
	if st, ok := rp.shared.loadTable(w, p, r, want, t); ok && st != nil && (tb == nil || st.Newer(tb)) {
		tb = st
	}
	cfg := p.spkCfg
	cfg.Region, cfg.Agent = w.regions[r].name, ag.name
	sp, err := region.RestoreSpeaker(cfg, p.rng.Uint64()|1, tb, now)
	if err != nil {
		panic(fmt.Sprintf("sim: speaker for %s: %v", cfg.Region, err)) // the config was validated
	}
	rp.sp = sp
	rp.last = sp.Table()
	rp.carries, rp.stepped = map[grantRef][]uint64{}, nil
	if p.leader >= 0 {
		sp.Connected(now)
	}
	p.carry(w, r, t)
}

// carry carries out region r's Speaker's Ready at t, in its order: settle
// in the regional Redis model, publish to the shared store and the
// speaking agent's view, send to the leader.
func (p *leasePlane) carry(w *world, r int, t Micros) {
	rp := p.regions[r]
	ag := p.a.agents[r][rp.speaker]
	for range 2 {
		rd := rp.sp.Ready()
		if g := rp.stepped; g != nil {
			if tb := rp.sp.Table(); tb != nil {
				rp.carries[*g] = append(rp.carries[*g], tb.Pub)
			}
			rp.stepped = nil
		}
		var o region.Outcome
		if len(rd.Settle) > 0 {
			rp.store.t, rp.store.from = t, rp.speaker
			o = region.Settle(context.Background(), rp.store, rd.Settle)
		}
		if tb := rd.Publish; tb != nil {
			p.checkSettled(w, r, t, tb, o.Unsettled)
			rp.last = tb
			p.published++
			refused, stored, ok := rp.shared.publish(w, p, r, rp.speaker, t, tb)
			if ok && refused {
				o.Refused, o.StoredPub = true, stored
				p.refused++
			}
			ag.view.Set(tb)
			rp.view.Set(tb)
			if ok && !refused {
				// The script that stored it announced it.
				p.notify(w, r, t, tb)
			}
		}
		rp.sp.Advance(o)
		for _, m := range rd.Send {
			p.checkAdopted(w, r, t, m)
			p.count(w, t)
			if p.leader < 0 {
				continue // no leader: the stream is down
			}
			at, n := w.net.sendLease(w.sysRng[p.a.si], p.agentNode(r), p.coordNode(p.leader), t, &rp.upLast)
			for _, at := range at[:n] {
				w.at(at, p.a.si, event{sub: alPlane, flag: plToCoord, agt: int32(p.leader), p: m}) // #nosec G115 -- an index into p.coords; 2^31 entries would not fit in memory
			}
		}
		if !o.Refused {
			return
		}
	}
}

func (p *leasePlane) handle(w *world, e *event) {
	t := e.at
	switch e.flag {
	case plSpeakerTick:
		r := int(e.aux)
		p.elect(w, r, t)
		if rp := p.regions[r]; rp.sp != nil {
			rp.later = false // this round takes the announced reports too
			reports, _ := rp.shared.demands(w, p, r, rp.speaker, t)
			p.round(w, r, t, reports)
		}
		p.sample(w, r, t)
		w.at(t+speakerTick, p.a.si, event{sub: alPlane, flag: plSpeakerTick, aux: e.aux})
	case plAllocTick:
		if p.leader >= 0 {
			p.coords[p.leader].alloc.Tick(p.coordNow(w, p.leader, t))
			p.flushAlloc(w, t)
		}
		w.at(t+tickEvery, p.a.si, event{sub: alPlane, flag: plAllocTick})
	case plToCoord:
		c := int(e.agt)
		if c != p.leader {
			return // the coordinator died or lost the leadership
		}
		m := e.p.(lease.Message)
		if err := p.coords[c].alloc.Step(p.coordNow(w, c, t), m); err != nil {
			p.stepErrors++
		}
		p.flushAlloc(w, t)
	case plToRegion:
		r := int(e.aux)
		rp := p.regions[r]
		if rp.sp == nil || int(e.agt) != rp.speaker {
			return // the speaking agent it was sent to is gone
		}
		m := e.p.(lease.Message)
		if w.opts.CorruptGrants && m.Type == lease.MsgGrant {
			m = corruptGrant(p, m)
		}
		if err := rp.sp.Step(p.regionNow(w, r, t), m); err != nil {
			p.stepErrors++
		} else if m.Type == lease.MsgGrant && !m.Quiet {
			// A quiet grant is never acknowledged: nothing to check.
			rp.stepped = &grantRef{m.Term, m.Grant}
		}
		p.carry(w, r, t)
	case plElected:
		c := int(e.agt)
		p.term++
		alloc, err := lease.NewAllocator(p.cfg, p.term, p.coordNow(w, c, t))
		if err != nil {
			panic(fmt.Sprintf("sim: allocator for term %d: %v", p.term, err)) // the config was validated
		}
		p.coords[c].alloc = alloc
		p.leader = c
		// The regions' transports find the new leader through the other
		// addresses they were given and open a new stream.
		for r, rp := range p.regions {
			if rp.sp == nil {
				continue
			}
			if at, ok := w.net.send(w.sysRng[p.a.si], p.coordNode(c), p.agentNode(r), t); ok {
				w.at(at, p.a.si, event{sub: alPlane, flag: plReconnect, aux: int32(r)})
			}
		}
	case plAdopt:
		// The notice carries the table (e.p): no read of the store. It
		// is lost when the agent's link to the store drops it. A bare
		// wake-up (a table too large to carry) has the agent read the
		// store as it is now, over that link again.
		r, ai := int(e.aux), int(e.agt)
		ag, rp := p.a.agents[r][ai], p.regions[r]
		if !ag.alive || ai == rp.speaker || !p.reachShared(w, r, ai, t) {
			return
		}
		tb, ok := e.p.(*region.Table)
		if !ok {
			if tb, ok = rp.shared.loadTable(w, p, r, ai, t); !ok {
				return
			}
		}
		if tb == nil || !ag.view.Set(tb) {
			return
		}
		p.a.report(w, r, ai, t, p.regionNow(w, r, t), false)
	case plWake:
		// As LeaseClient.adopted: a report of a new level announced
		// whole ticks the Speaker (heard), then the adoption is taken.
		r := int(e.aux)
		rp := p.regions[r]
		if rp.sp == nil || !p.reachShared(w, r, rp.speaker, t) {
			return
		}
		n := e.p.(wakeNotice)
		if n.level {
			p.heard(w, r, t)
		}
		rp.sp.Adopted(p.regionNow(w, r, t), []region.DemandReport{n.rep})
		p.carry(w, r, t)
	case plHeard:
		r := int(e.aux)
		if rp := p.regions[r]; rp.sp != nil && rp.later && rp.heardNext == t {
			rp.later = false
			p.heard(w, r, t)
		}
	case plReconnect:
		r := int(e.aux)
		if rp := p.regions[r]; rp.sp != nil {
			rp.sp.Connected(p.regionNow(w, r, t))
			p.carry(w, r, t)
		}
	}
}

// round ticks region r's Speaker at t with reports and carries out what it
// is then ready for: the speaking agent's round (LeaseClient.roundWith).
func (p *leasePlane) round(w *world, r int, t Micros, reports []region.DemandReport) {
	rp := p.regions[r]
	var live []string
	for _, ag := range p.a.agents[r] {
		if ag.alive {
			live = append(live, ag.name)
		}
	}
	rp.live = live
	rp.sp.Tick(p.regionNow(w, r, t), reports, live)
	p.carry(w, r, t)
	if rp.onRound != nil {
		rp.onRound(t)
	}
}

// wakeNotice is the notice of an agent's stored report (plWake): the
// report without its keys (Adopted reads only who adopted what, not the
// demand, whose buffer the agent reuses), and whether it ticks the
// Speaker: a report of a new level the notice carried whole
// (agent.adoptionNotice, LeaseClient.adopted).
type wakeNotice struct {
	rep   region.DemandReport
	level bool
}

// announce is the notice of agent ai of region r's report rep, stored at
// t: one script stores the report and announces it, carrying it, so the
// speaking agent has it one one-way trip after the store took it (two
// after the agent sent it).
func (p *leasePlane) announce(w *world, r, ai int, t Micros, rep region.DemandReport) {
	level := rep.Level && !overNotice(rep, len(rep.Keys), len(`,"whole":true`))
	rep.Keys = nil
	w.at(t+2*w.net.lat[r][r], p.a.si, event{sub: alPlane, flag: plWake, aux: int32(r), agt: int32(ai), p: wakeNotice{rep, level}}) // #nosec G115 -- indexes
}

// heard is a report of a new level announced whole reaching region r's
// speaking agent at t (LeaseClient.heardRound): it ticks the Speaker now, or, within half a
// tick of the last round it so ticked, at that half tick's end. The
// Speaker is ticked with the reports stored now, which the announced ones
// are among: a report stored in the last one-way trip, not yet announced,
// is taken early.
func (p *leasePlane) heard(w *world, r int, t Micros) {
	rp := p.regions[r]
	if t < rp.heardNext {
		if !rp.later {
			rp.later = true
			w.at(rp.heardNext, p.a.si, event{sub: alPlane, flag: plHeard, aux: int32(r)}) // #nosec G115 -- region index
		}
		return
	}
	rp.heardNext = t + speakerTick/2
	reports, _ := rp.shared.demands(w, p, r, rp.speaker, t)
	p.round(w, r, t, reports)
}

// notify is the notice of region r's publication of tb at t
// (agent.Notifier): the script that stores the table announces it,
// carrying it, so every other live agent has it one one-way trip after
// the store took it (plAdopt). A table larger than a notice carries
// (noticeBodyMax) is announced with a bare wake-up: each agent reads the
// store a round trip later (plAdopt with no table).
func (p *leasePlane) notify(w *world, r int, t Micros, tb *region.Table) {
	rp := p.regions[r]
	at, carried := t+w.net.lat[r][r], any(tb)
	if overNotice(tb, len(tb.Entries), 0) {
		at, carried = t+3*w.net.lat[r][r], nil
	}
	for ai, ag := range p.a.agents[r] {
		if ag.alive && ai != rp.speaker {
			w.at(at, p.a.si, event{sub: alPlane, flag: plAdopt, aux: int32(r), agt: int32(ai), p: carried}) // #nosec G115 -- indexes
		}
	}
}

// noticeBodyMax is agent.NoticeBodyMax (TestNoticeBodyMaxIsTheAgents).
const noticeBodyMax = 64 << 10

// overNotice reports whether v, a table or a report listing n entries or
// keys, is too large for a notice to carry: its JSON, with extra bytes the
// notice adds, over noticeBodyMax (agent.tableNotice, agent.adoptionNotice,
// whose reports carry `"whole":true`). One of 256 entries or fewer is not
// encoded: each entry's or key's JSON takes well under 256 bytes.
func overNotice(v any, n, extra int) bool {
	if n <= 256 {
		return false
	}
	b, err := json.Marshal(v)
	return err != nil || len(b)+extra > noticeBodyMax
}

// corruptGrant is the corrupted wire of Options.CorruptGrants: every grant
// reaches the region handing it the whole budget for each key it names.
func corruptGrant(p *leasePlane, m lease.Message) lease.Message {
	out := m
	out.Entries = make([]lease.Entry, len(m.Entries))
	for i, e := range m.Entries {
		for _, b := range p.budgets {
			if b.Rule == e.Key.Rule && !e.Drop {
				e.Count = b.Limit.Count()
				e.Burst = b.Limit.Burst()
			}
		}
		out.Entries[i] = e
	}
	return out
}

// budgetOf returns the budget index of key k.
func (p *leasePlane) budgetOf(w *world, k bucket.Key) (int, bool) {
	n, ok := subjectIndex(k.Subject)
	if !ok {
		return 0, false
	}
	if len(w.rules) == 1 {
		if n < w.rules[0].keys {
			return n, true
		}
		return 0, false
	}
	for _, r := range w.rules {
		if r.spec.Name == k.Rule && n < r.keys {
			return r.base + n, true
		}
	}
	return 0, false
}

// appendKeys appends the keys of a rule's n budgets, subjects "s0" to
// "s<n−1>", to ks. The subjects are cut from one string, in budget order:
// every decision reads its key's bytes (the core hashes them), and one
// allocation per subject scattered them over the heap, a cache line apart
// where a few kilobytes hold them all.
func appendKeys(ks []bucket.Key, rule string, n int) []bucket.Key {
	var buf []byte
	ends := make([]int, n)
	for k := range n {
		buf = append(buf, 's')
		buf = strconv.AppendInt(buf, int64(k), 10)
		ends[k] = len(buf)
	}
	all := string(buf)
	start := 0
	for k := range n {
		ks = append(ks, bucket.Key{Rule: rule, Subject: all[start:ends[k]]})
		start = ends[k]
	}
	return ks
}

func (p *leasePlane) agentNode(r int) node {
	return node{kind: kindAgent, region: r, idx: max(p.regions[r].speaker, 0)}
}

func (p *leasePlane) coordNode(c int) node {
	return node{kind: kindCoordinator, region: p.coords[c].region, idx: c}
}

// flushAlloc sends the leader's queued messages to the regions.
func (p *leasePlane) flushAlloc(w *world, t Micros) {
	a := p.coords[p.leader].alloc
	if !a.HasReady() {
		return
	}
	for _, m := range a.Ready() {
		p.count(w, t)
		r := w.sc.regionIndex(m.Region)
		if r < 0 || p.regions[r].sp == nil {
			continue
		}
		at, n := w.net.sendLease(w.sysRng[p.a.si], p.coordNode(p.leader), p.agentNode(r), t, &p.regions[r].downLast)
		for _, at := range at[:n] {
			w.at(at, p.a.si, event{sub: alPlane, flag: plToRegion, aux: int32(r), agt: int32(p.regions[r].speaker), p: m}) // #nosec G115 -- region (at most 255) and agent (at most 1000) indexes
		}
	}
}

// sample records the tracked budgets' allocations in region r, as its
// latest table gives them, for the chart.
func (p *leasePlane) sample(w *world, r int, t Micros) {
	bin := int(t / (w.end / Micros(w.sc.Bins)))
	if bin >= w.sc.Bins || t > w.end {
		return
	}
	now := p.regionNow(w, r, t)
	for ri, b := range p.tracked {
		l, _, _ := p.regions[r].view.Allocation(now, p.keys[b], w.rules[ri].limit)
		p.allocBins[ri][r][bin] = round(l.Rate(), 3)
	}
}

func (p *leasePlane) fault(w *world, f *FaultSpec, start bool) {
	t := w.eng.now
	switch f.Kind {
	case FaultLeaderFailover:
		if !start || p.leader < 0 {
			return
		}
		next := (p.leader + 1) % len(p.coords)
		p.coords[p.leader].alloc = nil
		p.leader = -1
		w.at(t+us(w.sc.Coordinator.Election), p.a.si, event{sub: alPlane, flag: plElected, agt: int32(next)}) // #nosec G115 -- an index into p.coords; 2^31 entries would not fit in memory
	case FaultAgentCrash:
		// The crashed agent no longer speaks; another live agent takes over
		// from the shared table, or, when one returns, it speaks again
		// once it has waited.
		p.elect(w, w.sc.regionIndex(f.Region), t)
	}
}

func (p *leasePlane) messages() int64 { return p.msgs }

// count counts one lease message sent at t.
func (p *leasePlane) count(w *world, t Micros) {
	p.msgs++
	if p.msgBins == nil {
		p.msgBins = make([]int64, w.sc.Bins)
	}
	if bin := int(t / max(w.end/Micros(w.sc.Bins), 1)); bin >= 0 && bin < w.sc.Bins {
		p.msgBins[bin]++
	}
}

// messageBins returns the lease messages sent per time bin.
func (p *leasePlane) messageBins() []int64 { return p.msgBins }

func (p *leasePlane) allocation(*world) [][][]float64 { return p.allocBins }
