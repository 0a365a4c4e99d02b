package sim

// steadySettle is how many refresh intervals after a change in demand or
// in the network the lease protocol is given to settle before its message
// rate counts as steady.
const steadySettle = 3

// steadyBins reports, per time bin, whether the run is in steady state
// then: demand neither starting, stopping nor swinging, and the network
// whole. A bin is steady when it starts steadySettle refresh intervals
// after the run's start, after every traffic stream's start and stop and
// after every fault's end, and no fault is active in it. A run with a
// bursty or diurnal stream has no steady bins: its demand moves by design.
func (w *world) steadyBins() []bool {
	bs := w.idealM.bins
	settle := Micros(steadySettle) * us(w.sc.Coordinator.Refresh)
	for _, ts := range w.sc.Traffic {
		if ts.Kind == "bursty" || ts.Diurnal != nil {
			return make([]bool, bs.nbins)
		}
	}
	changes := []Micros{0}
	for _, ts := range w.sc.Traffic {
		changes = append(changes, us(ts.Start), us(ts.Stop))
	}
	type span struct{ from, to Micros }
	var faults []span
	for _, f := range w.sc.Faults {
		end := us(f.At + f.For) // an instant fault (a failover) changes things at its start
		faults = append(faults, span{us(f.At), end})
		changes = append(changes, end)
	}
	out := make([]bool, bs.nbins)
	for i := range out {
		from, to := Micros(i)*bs.width, Micros(i+1)*bs.width
		ok := true
		for _, c := range changes {
			if c < to && from < c+settle {
				ok = false
			}
		}
		for _, f := range faults {
			if f.from < to && from < f.to {
				ok = false
			}
		}
		out[i] = ok
	}
	return out
}

// steadyRate is the rate per second of what counts holds per bin, over
// the steady bins; nil when there are none.
func (w *world) steadyRate(counts []int64) *float64 {
	if counts == nil {
		counts = make([]int64, w.idealM.bins.nbins) // nothing sent
	}
	steady := w.steadyBins()
	var n, bins int64
	for i, ok := range steady {
		if ok {
			n += counts[i]
			bins++
		}
	}
	if bins == 0 {
		return nil
	}
	v := round(float64(n)/(float64(bins)*float64(w.idealM.bins.width)/1e6), 4)
	return &v
}
