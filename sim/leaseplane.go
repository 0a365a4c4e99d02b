package sim

import (
	"context"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
)

// leasePlane drives the real lease protocol: a lease.Holder per region
// (held by the region's speaking agent, at the region's clock) and a
// lease.Allocator on the coordinator leader (at the clock of the region it
// runs in), exchanging lease.Messages over the simulated network. Agents
// decide with Holder.Allocation.
type leasePlane struct {
	a       *allot
	budgets []lease.Budget
	cfg     lease.Config
	subject [][]string // [rule][key] → subject
	keys    []bucket.Key
	floors  [][]bucket.Limit // [region][rule]

	holders []*lease.Holder
	speaker []int // speaking agent per region, −1 when none is alive
	coords  []coordinator
	leader  int // −1 during an election
	term    uint64

	// The allocation cache: Holder.Allocation answers change only when the
	// Holder steps or ticks, or when its lease or hold ends, so each
	// region keeps the answers it gave until then.
	epoch      []uint32
	validUntil []Micros // agent-local µs
	cacheLim   [][]bucket.Limit
	cacheEp    [][]uint32

	msgs       int64
	tracked    []int // per rule: the budget whose allocation is charted
	allocBins  [][][]float64
	stepErrors int64
	// settlers apply, per region, the Holder's allocation changes to the
	// regional buckets (region.Settler, as the speaking agent); stores are the
	// regional Redis models they write to; settleAt the pending settle
	// event.
	settlers []*region.Settler
	stores   []*regionStore
	settleAt []Micros
	// demandSum and demandTmp are demand's merge buffers.
	demandSum, demandTmp []keyWant
}

type coordinator struct {
	region int
	alloc  *lease.Allocator
}

// Plane event kinds, carried in event.flag under alPlane.
const (
	plHolderTick int8 = iota
	plAllocTick
	plToCoord
	plToRegion
	plElected
	plReconnect
	plSettle
)

// tickEvery is how often the drivers tick the state machines and the
// speaking agent gathers its region's demand: well inside the refresh
// interval, as a real driver's timer would.
const tickEvery = 200_000 // µs

func newPlane(w *world, a *allot) (*leasePlane, error) {
	sc := w.sc
	p := &leasePlane{a: a, leader: 0, term: 1}
	var names []string
	for _, r := range w.regions {
		names = append(names, r.name)
	}
	for _, r := range w.rules {
		p.budgets = append(p.budgets, lease.Budget{Rule: r.spec.Name, Limit: r.limit, Regions: names,
			Reserve: r.spec.Reserve, Policy: lease.MaxMin})
		subs := make([]string, r.keys)
		for k := range subs {
			subs[k] = "s" + strconv.Itoa(k)
			p.keys = append(p.keys, bucket.Key{Rule: r.spec.Name, Subject: subs[k]})
		}
		p.subject = append(p.subject, subs)
		tr := 0
		for _, ts := range sc.Traffic {
			if ts.Rule == r.spec.Name && ts.Key != nil {
				tr = *ts.Key
			}
		}
		p.tracked = append(p.tracked, r.base+tr)
	}
	cfg := lease.DefaultConfig()
	cfg.TTL = sc.Coordinator.LeaseTTL
	cfg.Refresh = sc.Coordinator.Refresh
	cfg.Drift = time.Duration(float64(cfg.TTL) * sc.Coordinator.Drift)
	cfg.Hold = cfg.TTL + 2*cfg.Drift + cfg.Refresh + cfg.Refresh/2
	cfg.DemandTTL = 2*cfg.Refresh + cfg.Refresh/3
	cfg.Budgets = p.budgets
	cfg.UnsafeSkipEscrow = w.opts.UnsafeSkipEscrow
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("sim: scenario %s: coordinator: %w", sc.Name, err)
	}
	p.cfg = cfg
	for _, name := range sc.Coordinator.Regions {
		p.coords = append(p.coords, coordinator{region: sc.regionIndex(name)})
	}
	c0 := &p.coords[0]
	alloc, err := lease.NewAllocator(cfg, p.term, p.coordNow(w, 0, 0))
	if err != nil {
		return nil, fmt.Errorf("sim: new allocator: %w", err)
	}
	c0.alloc = alloc
	n := len(w.regions)
	p.epoch = make([]uint32, n)
	p.settleAt = make([]Micros, n)
	for r := range p.settleAt {
		p.settleAt[r] = -1
	}
	for r := range w.regions {
		p.settlers = append(p.settlers, region.NewSettler(w.regions[r].name, p.budgets))
		p.stores = append(p.stores, &regionStore{p: p, rd: a.redis[r]})
	}
	p.validUntil = make([]Micros, n)
	for r := range w.regions {
		hc := lease.DefaultHolderConfig()
		hc.Region = w.regions[r].name
		hc.Session = w.sysRng[a.si].Uint64() | 1
		hc.Budgets = p.budgets
		hc.Drift = cfg.Drift
		hc.Refresh = cfg.Refresh
		h, err := lease.NewHolder(hc, p.regionNow(w, r, 0))
		if err != nil {
			return nil, fmt.Errorf("sim: new holder for %s: %w", hc.Region, err)
		}
		p.holders = append(p.holders, h)
		p.speaker = append(p.speaker, 0)
		fl := make([]bucket.Limit, len(w.rules))
		for i, b := range p.budgets {
			fl[i] = b.Floor(hc.Region).Limit
		}
		p.floors = append(p.floors, fl)
		p.cacheLim = append(p.cacheLim, make([]bucket.Limit, w.nb))
		p.cacheEp = append(p.cacheEp, make([]uint32, w.nb))
		p.epoch[r] = 1
		// Stagger the regions' ticks so they do not all fire at once.
		w.at(Micros(r+1)*997, a.si, event{sub: alPlane, flag: plHolderTick, aux: int32(r)})
		p.flushHolder(w, r, 0)
	}
	p.allocBins = make([][][]float64, len(w.rules))
	for i := range p.allocBins {
		p.allocBins[i] = make([][]float64, n)
		for r := range p.allocBins[i] {
			p.allocBins[i][r] = make([]float64, w.sc.Bins)
		}
	}
	w.at(tickEvery/2, a.si, event{sub: alPlane, flag: plAllocTick})
	return p, nil
}

func (p *leasePlane) regionNow(w *world, r int, t Micros) time.Time { return w.regions[r].agent.at(t) }

func (p *leasePlane) coordNow(w *world, c int, t Micros) time.Time {
	return w.regions[p.coords[c].region].agent.at(t)
}

// limit is Holder.Allocation, cached until the Holder changes or its
// lease or hold ends.
func (p *leasePlane) limit(r, b int) (bucket.Limit, bool) {
	w := p.a.w
	now := w.regions[r].agent.local(w.eng.now)
	if now >= p.validUntil[r] {
		p.invalidate(w, r, w.eng.now)
	}
	if p.cacheEp[r][b] != p.epoch[r] {
		l, _ := p.holders[r].Allocation(wall(now), p.keys[b])
		p.cacheLim[r][b] = l
		p.cacheEp[r][b] = p.epoch[r]
	}
	l := p.cacheLim[r][b]
	return l, l != p.floors[r][w.ruleIdx[b]]
}

// invalidate starts a new cache epoch for region r, works out until when
// (on the region's clock) its answers stay valid, and settles the region's
// buckets.
func (p *leasePlane) invalidate(w *world, r int, t Micros) {
	p.epoch[r]++
	if r < len(p.a.allocs) {
		p.a.allocs[r].Touch()
	}
	local := w.regions[r].agent.local(t)
	st := p.holders[r].Status(wall(local))
	until := Micros(math.MaxInt64)
	for _, x := range []time.Time{st.LeaseEnd, st.HoldUntil} {
		if x.IsZero() {
			continue
		}
		if v := x.UnixMicro() - epochMicros; v > local && v < until {
			until = v
		}
	}
	p.validUntil[r] = until
	p.settle(w, r, t)
	if until != math.MaxInt64 {
		at := w.regions[r].agent.virtual(until) + 1
		if at > t && at != p.settleAt[r] {
			p.settleAt[r] = at
			w.at(at, p.a.si, event{sub: alPlane, flag: plSettle, aux: int32(r)})
		}
	}
}

// settle has region r's Settler apply every changed allocation of its
// Holder to the regional buckets at t, as the speaking agent does before it
// publishes the table and acknowledges (region.Settler). When no primary
// answers (a failover) it settles again when one does.
func (p *leasePlane) settle(w *world, r int, t Micros) {
	s := p.stores[r]
	s.t, s.down = t, false
	for _, c := range p.settlers[r].Changes(p.regionNow(w, r, t), p.holders[r]) {
		if c.Apply(context.Background(), s) != nil {
			p.settlers[r].Unsettle(c)
		}
	}
	if s.down {
		if at := s.rd.downUntil; at > t && at != p.settleAt[r] {
			p.settleAt[r] = at
			w.at(at, p.a.si, event{sub: alPlane, flag: plSettle, aux: int32(r)})
		}
	}
}

// demand reports the region's demand to its Holder: the sum over its live
// agents of what each core says it should report (region.Core.Demand), in
// tokens per the budget's period, in key order. In the agent this travels
// to the speaking agent through the regional Redis. Each core lists its
// keys sorted, so the sums are a merge of sorted lists, into buffers the
// plane reuses.
func (p *leasePlane) demand(w *world, r int, t Micros) {
	now := p.regionNow(w, r, t)
	sum := p.demandSum[:0]
	for _, ag := range p.a.agents[r] {
		if !ag.alive {
			continue
		}
		sum, p.demandTmp = mergeDemand(p.demandTmp[:0], sum, ag.core.Demand(now)), sum
	}
	for _, d := range sum {
		p.holders[r].Demand(now, d.key, d.want)
	}
	p.demandSum = sum[:0]
}

// keyWant is one key's demand summed over a region's agents.
type keyWant struct {
	key  bucket.Key
	want bucket.Tokens
}

// mergeDemand appends to dst the merge of acc and ds, both sorted by key
// with no key twice, adding the wants of a key in both.
func mergeDemand(dst, acc []keyWant, ds []region.KeyDemand) []keyWant {
	i, j := 0, 0
	for i < len(acc) && j < len(ds) {
		switch c := cmpKey(acc[i].key, ds[j].Key); {
		case c < 0:
			dst = append(dst, acc[i])
			i++
		case c > 0:
			dst = append(dst, keyWant{ds[j].Key, ds[j].Want})
			j++
		default:
			dst = append(dst, keyWant{acc[i].key, acc[i].want + ds[j].Want})
			i++
			j++
		}
	}
	dst = append(dst, acc[i:]...)
	for ; j < len(ds); j++ {
		dst = append(dst, keyWant{ds[j].Key, ds[j].Want})
	}
	return dst
}

// cmpKey orders keys by rule, then subject, as the cores list them.
func cmpKey(x, y bucket.Key) int {
	if x.Rule != y.Rule {
		return strings.Compare(x.Rule, y.Rule)
	}
	return strings.Compare(x.Subject, y.Subject)
}

func (p *leasePlane) handle(w *world, e *event) {
	t := e.at
	switch e.flag {
	case plHolderTick:
		r := int(e.aux)
		if p.speaker[r] >= 0 {
			p.demand(w, r, t)
			p.holders[r].Tick(p.regionNow(w, r, t))
			p.flushHolder(w, r, t)
		}
		p.sample(w, r, t)
		w.at(t+tickEvery, p.a.si, event{sub: alPlane, flag: plHolderTick, aux: e.aux})
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
		if p.speaker[r] < 0 || int(e.agt) != p.speaker[r] {
			return // the speaking agent it was sent to is gone
		}
		m := e.p.(lease.Message)
		if w.opts.CorruptGrants && m.Type == lease.MsgGrant {
			m = corruptGrant(p, m)
		}
		if err := p.holders[r].Step(p.regionNow(w, r, t), m); err != nil {
			p.stepErrors++
		}
		p.invalidate(w, r, t)
		p.flushHolder(w, r, t)
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
		for r := range w.regions {
			if p.speaker[r] < 0 {
				continue
			}
			if at, ok := w.net.send(w.sysRng[p.a.si], p.coordNode(c), p.agentNode(r), t); ok {
				w.at(at, p.a.si, event{sub: alPlane, flag: plReconnect, aux: int32(r)})
			}
		}
	case plSettle:
		r := int(e.aux)
		if p.settleAt[r] == t {
			p.settleAt[r] = -1
		}
		p.invalidate(w, r, t)
	case plReconnect:
		r := int(e.aux)
		if p.speaker[r] >= 0 {
			p.holders[r].Reconnect(p.regionNow(w, r, t))
			p.flushHolder(w, r, t)
		}
	}
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

func (p *leasePlane) agentNode(r int) node {
	return node{kind: kindAgent, region: r, idx: max(p.speaker[r], 0)}
}

func (p *leasePlane) coordNode(c int) node {
	return node{kind: kindCoordinator, region: p.coords[c].region, idx: c}
}

// flushHolder sends region r's queued messages to the leader.
func (p *leasePlane) flushHolder(w *world, r int, t Micros) {
	h := p.holders[r]
	if !h.HasReady() {
		return
	}
	for _, m := range h.Ready() {
		p.msgs++
		if p.leader < 0 {
			continue // no leader: the stream is down
		}
		if at, ok := w.net.send(w.sysRng[p.a.si], p.agentNode(r), p.coordNode(p.leader), t); ok {
			w.at(at, p.a.si, event{sub: alPlane, flag: plToCoord, agt: int32(p.leader), p: m})
		}
	}
}

// flushAlloc sends the leader's queued messages to the regions.
func (p *leasePlane) flushAlloc(w *world, t Micros) {
	a := p.coords[p.leader].alloc
	if !a.HasReady() {
		return
	}
	for _, m := range a.Ready() {
		p.msgs++
		r := w.sc.regionIndex(m.Region)
		if r < 0 || p.speaker[r] < 0 {
			continue
		}
		if at, ok := w.net.send(w.sysRng[p.a.si], p.coordNode(p.leader), p.agentNode(r), t); ok {
			w.at(at, p.a.si, event{sub: alPlane, flag: plToRegion, aux: int32(r), agt: int32(p.speaker[r]), p: m})
		}
	}
}

// sample records the tracked budgets' allocations for the chart.
func (p *leasePlane) sample(w *world, r int, t Micros) {
	bin := int(t / (w.end / Micros(w.sc.Bins)))
	if bin >= w.sc.Bins || t > w.end {
		return
	}
	for ri, b := range p.tracked {
		l, _ := p.limit(r, b)
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
		w.at(t+us(w.sc.Coordinator.Election), p.a.si, event{sub: alPlane, flag: plElected, agt: int32(next)})
	case FaultAgentCrash:
		r := w.sc.regionIndex(f.Region)
		old := p.speaker[r]
		p.speaker[r] = -1
		for i, ag := range p.a.agents[r] {
			if ag.alive {
				p.speaker[r] = i
				break
			}
		}
		if p.speaker[r] >= 0 && p.speaker[r] != old {
			// Another agent speaks for the region now; the table lives in
			// the regional Redis, so it resumes the same lease.
			p.holders[r].Reconnect(p.regionNow(w, r, t))
			p.flushHolder(w, r, t)
		}
	}
}

// boundTerms is the lease protocol's allowance: clocks that drift faster
// than the margin shorten leases by ρ × TTL, worth ρ × TTL × R.
func (p *leasePlane) boundTerms(w *world, ri int) (float64, []string) {
	var rho float64
	for _, r := range w.sc.Regions {
		rho = math.Max(rho, math.Abs(r.Drift))
	}
	if rho == 0 {
		return 0, nil
	}
	R := w.rules[ri].limit.Rate()
	v := rho * w.sc.Coordinator.LeaseTTL.Seconds() * R
	return v, []string{fmt.Sprintf("%.3f: clock drift ρ=%g × TTL %s × R %.3f/s", v, rho, w.sc.Coordinator.LeaseTTL, R)}
}

func (p *leasePlane) messages() int64 { return p.msgs }

func (p *leasePlane) allocation(*world) [][][]float64 { return p.allocBins }
