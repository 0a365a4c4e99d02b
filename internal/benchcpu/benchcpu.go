// Package benchcpu reports the CPU time a benchmark's process spends per
// operation, every thread counted (the servers' goroutines of a benchmark
// over loopback too). On a machine shared with other work, wall time per
// operation swings with the load while CPU time per operation moves far
// less, so side-by-side comparisons read it.
package benchcpu

import (
	"syscall"
	"testing"
	"time"
)

// Start records the process's CPU time; the returned function reports the
// CPU time since then per b.N as "cpu-ns/op". Call it right before the
// benchmark's loop and the returned function right after it.
func Start(b *testing.B) func() {
	start := cpu(b)
	return func() {
		if b.N > 0 {
			b.ReportMetric(float64(cpu(b)-start)/float64(b.N), "cpu-ns/op")
		}
	}
}

func cpu(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatalf("benchcpu: getrusage: %v", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
