package sim

import "math/rand/v2"

// nodeKind says what a simulated node is.
type nodeKind uint8

const (
	kindAgent nodeKind = iota
	kindRedis
	kindCoordinator
)

// node names one endpoint of a simulated link. A coordinator's region is
// the region it runs in.
type node struct {
	kind   nodeKind
	region int
	idx    int // agent index in its region, or coordinator index
}

// cut is one active partition. A coordinator_flap fault is a
// coordinator_cut while it is down.
type cut struct {
	kind   string
	region int
	agent  int    // −1: every agent of the region
	dir    string // coordinator_oneway: "to" or "from" the coordinators
}

// linkFault is an active fault on lease messages: duplication,
// reordering or delay, on one region's link to the coordinators or on
// every region's (region −1).
type linkFault struct {
	kind   string
	region int
	prob   float64 // duplicate
	// delay is reorder's largest extra hold, coordinator_delay's hold;
	// jitter is coordinator_delay's largest extra hold on top.
	delay, jitter Micros
}

// network is the simulated transport: one-way latency from the region
// matrix, uniform jitter, random loss, and the partitions and lease
// message faults active now.
type network struct {
	lat    [][]Micros // one-way, [from][to]
	jitter float64
	loss   float64
	cuts   []cut
	faults []linkFault
	// extraWAN and extraRedis are loss added by active loss faults: on
	// every link but agents' calls to their regional Redis, and on those.
	extraWAN, extraRedis float64
	// sent and lost count messages for the report; dups counts lease
	// messages delivered twice.
	sent, lost, dups int64
}

// redisLink reports whether a and b are an agent and its region's Redis.
func redisLink(a, b node) bool {
	if a.kind == kindRedis {
		a, b = b, a
	}
	return b.kind == kindRedis && a.region == b.region
}

// lossFor is the probability that a message between a and b is lost.
func (n *network) lossFor(a, b node) float64 {
	if redisLink(a, b) {
		return n.loss + n.extraRedis
	}
	return n.loss + n.extraWAN
}

// blocked reports whether an active partition separates a and b (a
// sending to b: one-way cuts have a direction).
func (n *network) blocked(a, b node) bool {
	for _, c := range n.cuts {
		switch c.kind {
		case FaultRegionCut:
			if a.region != b.region && (a.region == c.region || b.region == c.region) {
				return true
			}
		case FaultCoordinatorCut, FaultCoordinatorFlap:
			if (a.kind == kindAgent && a.region == c.region && b.kind == kindCoordinator) ||
				(b.kind == kindAgent && b.region == c.region && a.kind == kindCoordinator) {
				return true
			}
		case FaultCoordinatorOneway:
			if c.dir == "to" && a.kind == kindAgent && a.region == c.region && b.kind == kindCoordinator ||
				c.dir == "from" && b.kind == kindAgent && b.region == c.region && a.kind == kindCoordinator {
				return true
			}
		case FaultRedisCut:
			if x, y := a, b; x.kind == kindRedis || y.kind == kindRedis {
				if x.kind == kindRedis {
					x, y = y, x
				}
				if x.kind == kindAgent && y.kind == kindRedis && x.region == c.region &&
					y.region == c.region && (c.agent < 0 || c.agent == x.idx) {
					return true
				}
			}
		}
	}
	return false
}

// send returns the virtual time at which a message sent from a to b at t
// arrives, or false when it is lost or partitioned away.
func (n *network) send(rng *rand.Rand, a, b node, t Micros) (Micros, bool) {
	n.sent++
	if len(n.cuts) > 0 && n.blocked(a, b) {
		n.lost++
		return 0, false
	}
	if p := n.lossFor(a, b); p > 0 && rng.Float64() < p {
		n.lost++
		return 0, false
	}
	return t + n.delay(rng, a.region, b.region), true
}

// sendLease is send for a lease message between a region's speaking agent
// and a coordinator: the active duplicate, reorder and coordinator_delay
// faults of the region apply too. It returns how many copies arrive (0, 1
// or 2) and when. last is the latest arrival a coordinator_delay fault
// set on this link and direction: a delayed message arrives no earlier,
// as bytes held on one TCP stream (the chaos harness's proxy) keep their
// order.
func (n *network) sendLease(rng *rand.Rand, a, b node, t Micros, last *Micros) (at [2]Micros, copies int) {
	first, ok := n.send(rng, a, b, t)
	if !ok {
		return at, 0
	}
	at[0], copies = first, 1
	if len(n.faults) == 0 {
		return at, copies
	}
	r := a.region
	if a.kind == kindCoordinator {
		r = b.region
	}
	for _, f := range n.faults {
		if f.region >= 0 && f.region != r {
			continue
		}
		switch f.kind {
		case FaultDuplicate:
			if copies == 1 && rng.Float64() < f.prob {
				// The copy travels on its own: its own latency and hold.
				at[1], copies = t+n.delay(rng, a.region, b.region), 2
				n.dups++
			}
		case FaultReorder:
			for i := range copies {
				at[i] += Micros(rng.Float64() * float64(f.delay))
			}
		case FaultCoordinatorDelay:
			for i := range copies {
				at[i] += f.delay + Micros(rng.Float64()*float64(f.jitter))
				at[i] = max(at[i], *last)
				*last = at[i]
			}
		}
	}
	return at, copies
}

// delay samples one one-way latency between two regions.
func (n *network) delay(rng *rand.Rand, from, to int) Micros {
	d := n.lat[from][to]
	if n.jitter > 0 && d > 0 {
		d += Micros(rng.Float64() * n.jitter * float64(d))
	}
	return d
}

func (n *network) addCut(c cut) { n.cuts = append(n.cuts, c) }

func (n *network) removeCut(c cut) {
	for i, x := range n.cuts {
		if x == c {
			n.cuts = append(n.cuts[:i], n.cuts[i+1:]...)
			return
		}
	}
}

func (n *network) addFault(f linkFault) { n.faults = append(n.faults, f) }

func (n *network) removeFault(f linkFault) {
	for i, x := range n.faults {
		if x == f {
			n.faults = append(n.faults[:i], n.faults[i+1:]...)
			return
		}
	}
}
