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

// cut is one active partition.
type cut struct {
	kind   string
	region int
	agent  int // −1: every agent of the region
}

// network is the simulated transport: one-way latency from the region
// matrix, uniform jitter, random loss, and the partitions active now.
type network struct {
	lat    [][]Micros // one-way, [from][to]
	jitter float64
	loss   float64
	cuts   []cut
	// extraLoss is loss added by an active loss fault.
	extraLoss float64
	// sent and lost count messages for the report.
	sent, lost int64
}

// blocked reports whether an active partition separates a and b.
func (n *network) blocked(a, b node) bool {
	for _, c := range n.cuts {
		switch c.kind {
		case FaultRegionCut:
			if a.region != b.region && (a.region == c.region || b.region == c.region) {
				return true
			}
		case FaultCoordinatorCut:
			if (a.kind == kindAgent && a.region == c.region && b.kind == kindCoordinator) ||
				(b.kind == kindAgent && b.region == c.region && a.kind == kindCoordinator) {
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
	if p := n.loss + n.extraLoss; p > 0 && rng.Float64() < p {
		n.lost++
		return 0, false
	}
	return t + n.delay(rng, a.region, b.region), true
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
