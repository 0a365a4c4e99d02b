package sim

import (
	"github.com/allot-dev/allot/region"
)

// sharedStore models what a region's agents share in its regional Redis
// (agent.RedisShared): the table the speaking agent publishes, replaced
// only by a higher publication number, and each agent's latest demand
// report. An agent reaches it over its link to the region's Redis
// (partitions, loss, a failover's downtime: reachShared), without a
// decision waiting on it. A Redis failover rolls the table back to the
// last one the replica had received; reports are rewritten every tick and
// are kept.
type sharedStore struct {
	table *region.Table
	// writes are the tables published within the replication lag, oldest
	// first; replicated is the newest one older than that.
	writes     []tableWrite
	replicated *region.Table
	reports    []region.DemandReport // by agent index
	has        []bool
	buf        []region.DemandReport
	// holder is the agent holding the speaker lease (−1: none) until
	// leaseEnd in the store; holderTill is when the holder's own view of
	// it ends (agent.holdSpeaker: a tenth of the lease before the store's).
	holder               int
	leaseEnd, holderTill Micros
}

type tableWrite struct {
	at Micros
	t  *region.Table
}

func newSharedStore(agents int) *sharedStore {
	return &sharedStore{reports: make([]region.DemandReport, agents), has: make([]bool, agents), holder: -1}
}

// redisCut reports whether a cut separates agent i of region r from the
// region's Redis.
func (w *world) redisCut(r, i int) bool {
	return len(w.net.cuts) > 0 && w.net.blocked(node{kind: kindAgent, region: r, idx: i}, node{kind: kindRedis, region: r})
}

// reachShared reports whether agent i of region r reaches the region's
// Redis at t, drawing losses from the plane's own random source.
func (p *leasePlane) reachShared(w *world, r, i int, t Micros) bool {
	if w.redisCut(r, i) {
		return false
	}
	if loss := w.net.loss + w.net.extraRedis; loss > 0 && p.rng.Float64() < loss {
		return false
	}
	// A redis_slow link fails the shared state's calls as it fails the
	// store's; its delay stays well under their one-second timeout.
	if sl := p.a.agents[r][i].store.slow; sl != nil && sl.loss > 0 && p.rng.Float64() < sl.loss {
		return false
	}
	return p.a.redis[r].up(t + w.net.lat[r][r])
}

// speakerLease is the speaker lease's time to live in the regional store,
// as agent.Config's SpeakerLease default.
const speakerLease = 2_000_000 // µs

// holdSpeaker is agent i's renewal of the speaker lease at t
// (agent.Shared.HoldSpeaker, at every tick of the agent standing to
// speak): taken when no other agent's lease is live in the store,
// renewed when it is i's own; it reports whether i holds the lease by its
// own view at t. An agent that cannot reach the store cannot renew, and
// stops speaking once its view of the lease ends, a tenth of it before the
// store's: a region whose store is out has no speaker, so its coordinator
// lease lapses and its agents decide at their floors. The renewal is one
// call per tick against a lease of twenty ticks, so the link's random loss
// is not drawn for it; a cut or a store down is.
func (s *sharedStore) holdSpeaker(w *world, p *leasePlane, r, i int, t Micros) bool {
	reach := !w.redisCut(r, i) && p.a.redis[r].up(t+w.net.lat[r][r])
	if reach && (s.holder == i || s.holder < 0 || s.leaseEnd <= t) {
		s.holder, s.leaseEnd, s.holderTill = i, t+speakerLease, t+speakerLease-speakerLease/10
	}
	return s.holder == i && t < s.holderTill
}

// publish stores tb from agent i unless the store holds a table numbered
// at least as high, whose number it then returns with refused set; ok is
// false when the agent could not reach the store.
func (s *sharedStore) publish(w *world, p *leasePlane, r, i int, t Micros, tb *region.Table) (refused bool, stored uint64, ok bool) {
	if !p.reachShared(w, r, i, t) {
		return false, 0, false
	}
	if s.table != nil && s.table.Pub >= tb.Pub {
		return true, s.table.Pub, true
	}
	s.table = tb
	if p.a.redis[r].replica != nil {
		s.writes = append(s.writes, tableWrite{at: t, t: tb})
		s.replicate(t - us(w.sc.Redis.Lag))
	}
	return false, tb.Pub, true
}

// replicate moves the writes made by until into the replica's copy.
func (s *sharedStore) replicate(until Micros) {
	n := 0
	for n < len(s.writes) && s.writes[n].at <= until {
		s.replicated = s.writes[n].t
		n++
	}
	s.writes = s.writes[n:]
}

// failover rolls the table back to what the replica had received at t.
func (s *sharedStore) failover(t, lag Micros) {
	s.replicate(t - lag)
	s.table, s.writes = s.replicated, s.writes[:0]
}

// loadTable returns the stored table as agent i reads it at t; ok is false
// when it could not reach the store.
func (s *sharedStore) loadTable(w *world, p *leasePlane, r, i int, t Micros) (*region.Table, bool) {
	if !p.reachShared(w, r, i, t) {
		return nil, false
	}
	return s.table, true
}

// putDemand stores agent i's report and reports whether it did; it is
// lost when the agent cannot reach the store.
func (s *sharedStore) putDemand(w *world, p *leasePlane, r, i int, t Micros, rep region.DemandReport) bool {
	if !p.reachShared(w, r, i, t) {
		return false
	}
	s.reports[i], s.has[i] = rep, true
	return true
}

// demands returns every agent's latest report as agent i reads them at t
// (nil, false when it cannot reach the store). The slice is reused.
func (s *sharedStore) demands(w *world, p *leasePlane, r, i int, t Micros) ([]region.DemandReport, bool) {
	if !p.reachShared(w, r, i, t) {
		return nil, false
	}
	if s.buf == nil {
		s.buf = make([]region.DemandReport, 0, len(s.reports))
	}
	s.buf = s.buf[:0]
	for j, rep := range s.reports {
		if s.has[j] {
			s.buf = append(s.buf, rep)
		}
	}
	return s.buf, true
}
