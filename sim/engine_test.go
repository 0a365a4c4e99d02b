package sim

import (
	"math/rand/v2"
	"testing"
)

// TestEngineOrder drives the engine's two heaps with arrivals retimed or
// dropped as they fire and other events scheduled meanwhile, at times
// drawn from a small range so that ties are common, and checks every
// event fires in the order of a plain list sorted by time and then by
// when it was scheduled or retimed, arrivals and other events
// interleaved as one sequence.
func TestEngineOrder(t *testing.T) {
	type pending struct {
		at      Micros
		seq     uint64
		arrival bool
		id      int64 // the source of an arrival, else the event's k
	}
	for seed := uint64(1); seed <= 20; seed++ {
		rng := rand.New(rand.NewPCG(seed, 7))
		g := newEngine(seed)
		var ref []pending
		var seq uint64
		add := func(at Micros, arrival bool, id int64) {
			seq++
			ref = append(ref, pending{at: max(at, g.now), seq: seq, arrival: arrival, id: id})
			if arrival {
				g.schedule(event{at: at, kind: evArrival, i: int32(id)})
			} else {
				g.schedule(event{at: at, kind: evSystem, k: id})
			}
		}
		popRef := func() pending {
			m := 0
			for i, p := range ref {
				if p.at < ref[m].at || p.at == ref[m].at && p.seq < ref[m].seq {
					m = i
				}
			}
			p := ref[m]
			ref = append(ref[:m], ref[m+1:]...)
			return p
		}
		for src := int64(0); src < 1+int64(seed%8); src++ { // both sides of siftRoot's five
			add(rng.Int64N(20), true, src)
		}
		nextID := int64(100)
		var arrivals, others int
		for steps := 0; len(ref) > 0; steps++ {
			if steps > 10_000 {
				t.Fatalf("seed %d: events still pending after %d steps", seed, steps)
			}
			want := popRef()
			at, ok := g.peekAt()
			if !ok || at != want.at {
				t.Fatalf("seed %d step %d: peekAt %d %v, want %d", seed, steps, at, ok, want.at)
			}
			if g.arrivalFirst() != want.arrival {
				t.Fatalf("seed %d step %d: arrivalFirst %v, want %v (%+v)", seed, steps, !want.arrival, want.arrival, want)
			}
			if want.arrival {
				arrivals++
				src, at := g.topArrival()
				if int64(src) != want.id || at != want.at {
					t.Fatalf("seed %d step %d: arrival of source %d at %d, want source %d at %d", seed, steps, src, at, want.id, want.at)
				}
				// What the arrival schedules comes after it, as the
				// systems' events do.
				if rng.IntN(3) == 0 {
					add(g.now+rng.Int64N(5), false, nextID)
					nextID++
				}
				if steps < 2000 {
					nt := g.now + rng.Int64N(4)
					g.retimeArrival(nt)
					seq++
					ref = append(ref, pending{at: nt, seq: seq, arrival: true, id: want.id})
				} else {
					g.dropArrival()
				}
				continue
			}
			others++
			e := g.top()
			if e.k != want.id || e.at != want.at {
				t.Fatalf("seed %d step %d: event %d at %d, want %d at %d", seed, steps, e.k, e.at, want.id, want.at)
			}
			g.drop()
			if rng.IntN(2) == 0 && steps < 2000 {
				add(g.now+rng.Int64N(6), false, nextID)
				nextID++
			}
		}
		if _, ok := g.peekAt(); ok {
			t.Fatalf("seed %d: the engine holds events the list does not", seed)
		}
		if arrivals == 0 || others == 0 || g.fired != uint64(arrivals+others) {
			t.Fatalf("seed %d: %d arrivals and %d other events, %d fired: the test needs both, each counted once", seed, arrivals, others, g.fired)
		}
	}
}
