//go:build !unix

package sim

import "time"

// cpuTime is not measured here; the benchmarks then omit their CPU-time
// figures.
func cpuTime() time.Duration { return 0 }
