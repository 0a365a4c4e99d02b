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
}

type tableWrite struct {
	at Micros
	t  *region.Table
}

func newSharedStore(agents int) *sharedStore {
	return &sharedStore{reports: make([]region.DemandReport, agents), has: make([]bool, agents)}
}

// reachShared reports whether agent i of region r reaches the region's
// Redis at t, drawing losses from the plane's own random source.
func (p *leasePlane) reachShared(w *world, r, i int, t Micros) bool {
	from, to := node{kind: kindAgent, region: r, idx: i}, node{kind: kindRedis, region: r}
	if len(w.net.cuts) > 0 && w.net.blocked(from, to) {
		return false
	}
	if loss := w.net.loss + w.net.extraRedis; loss > 0 && p.rng.Float64() < loss {
		return false
	}
	return p.a.redis[r].up(t + w.net.lat[r][r])
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
