//go:build race

package sim

// raceEnabled shortens the library test under the race detector, which
// slows the simulator about tenfold.
const raceEnabled = true
