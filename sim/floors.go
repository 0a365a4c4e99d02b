package sim

import (
	"github.com/allot-dev/allot/bucket"
)

// floorPlane is the control plane with no coordinator at all: every region
// runs every budget on its floor, its static share of the budget minus the
// reserve. It is what a region falls back to without a lease (I5).
type floorPlane struct {
	floors []bucket.Limit // per rule
	rules  []uint16       // budget → rule
}

// floorShare is region r's static share of a rule's budget: (1 − reserve)/N
// of the rate and of the burst, in thousandths so the rate stays exact.
func floorShare(w *world, rule int) bucket.Limit {
	r := w.rules[rule]
	num := int64((1 - r.spec.Reserve) * 1000)
	return share(r.limit, num, 1000*int64(len(w.regions)))
}

func newFloorPlane(w *world) *floorPlane {
	p := &floorPlane{}
	for i := range w.rules {
		p.floors = append(p.floors, floorShare(w, i))
	}
	return p
}

func (p *floorPlane) limit(r, b int) (bucket.Limit, bool) {
	return p.floors[p.rules[b]], false
}

func (p *floorPlane) observe(*world, int, int, int64, bool, Micros) {}
func (p *floorPlane) handle(*world, *event)                         {}
func (p *floorPlane) fault(*world, *FaultSpec, bool)                {}
func (p *floorPlane) boundTerms(*world, int) (float64, []string)    { return 0, nil }
func (p *floorPlane) messages() int64                               { return 0 }
func (p *floorPlane) allocation(*world) [][][]float64               { return nil }

func newPlane(w *world, a *allot) (plane, error) {
	return &floorPlane{floors: newFloorPlane(w).floors, rules: w.ruleIdx}, nil
}
