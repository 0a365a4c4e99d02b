package sim

import (
	"fmt"
	"runtime"
	"runtime/metrics"
	"testing"
	"time"
)

// synthetic builds a scenario of n regions in a ring of latencies, one rule
// of keys budgets, Zipf traffic of rate requests per second split with a
// skew toward the first region, and no faults.
func synthetic(regions, keys int, rate float64, d time.Duration) *Scenario {
	sc := &Scenario{Name: fmt.Sprintf("synthetic-%dr-%dk", regions, keys), Duration: d}
	sc.Latency = map[string]map[string]time.Duration{}
	for i := 0; i < regions; i++ {
		name := fmt.Sprintf("r%02d", i)
		sc.Regions = append(sc.Regions, RegionSpec{Name: name})
		sc.Latency[name] = map[string]time.Duration{}
		for j := 0; j <= i; j++ {
			hop := min(i-j, regions-(i-j))
			sc.Latency[name][fmt.Sprintf("r%02d", j)] = time.Duration(hop)*20*time.Millisecond + 500*time.Microsecond
		}
	}
	sc.Rules = []RuleSpec{{Name: "tenant", Count: 1000, Period: time.Second, Keys: keys, Reserve: 0.3}}
	for i := 0; i < regions; i++ {
		share := rate / float64(regions+1)
		if i == 0 {
			share *= 2
		}
		t := TrafficSpec{Region: fmt.Sprintf("r%02d", i), Rule: "tenant", Rate: share}
		if keys > 1 {
			t.Zipf = 1.1
		}
		sc.Traffic = append(sc.Traffic, t)
	}
	sc.setDefaults()
	if err := sc.Validate(); err != nil {
		panic(err)
	}
	return sc
}

// runBench runs sc once per iteration and reports, per wall-clock second:
// arrivals; decisions (one per system per arrival, the ideal bucket
// included); and allot's decisions alone (one per arrival it decides, the
// figure the speed target is about), also per second of the process's CPU
// time, which other work on a shared machine does not inflate. It also
// reports the largest live heap sampled during the runs.
func runBench(b *testing.B, sc *Scenario, opts Options) {
	b.Helper()
	var decisions, arrivals, allotDecisions int64
	var peak uint64
	// The heap is sampled through runtime/metrics, which, unlike
	// runtime.ReadMemStats, does not stop the world 200 times a run.
	heap := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	opts.Progress = func(now, end time.Duration) {
		metrics.Read(heap)
		if heap[0].Value.Kind() == metrics.KindUint64 {
			peak = max(peak, heap[0].Value.Uint64())
		}
	}
	runtime.GC()
	cpu0 := cpuTime()
	start := time.Now()
	for i := 0; i < b.N; i++ {
		res, err := Run(sc, uint64(i+1), opts)
		if err != nil {
			b.Fatal(err)
		}
		decisions += res.Decisions
		arrivals += res.Arrivals
		for _, s := range res.Systems {
			if s.Name == "allot" {
				allotDecisions += s.Requests
			}
		}
	}
	el := time.Since(start).Seconds()
	cpu := (cpuTime() - cpu0).Seconds()
	b.ReportMetric(float64(decisions)/el, "decisions/s")
	b.ReportMetric(float64(arrivals)/el, "arrivals/s")
	if allotDecisions > 0 {
		b.ReportMetric(float64(allotDecisions)/el, "allot-decisions/s")
		if cpu > 0 {
			b.ReportMetric(float64(allotDecisions)/cpu, "allot-decisions/cpu-s")
		}
	}
	b.ReportMetric(float64(peak)/(1<<20), "peak-heap-MB")
}

// BenchmarkDecisions is the speed figure: a steady three-region load on
// 1,000 keys, with every system (allot on the real region and lease code,
// the four baselines and the ideal bucket) deciding every arrival, and with
// allot alone.
func BenchmarkDecisions(b *testing.B) {
	sc := synthetic(3, 1000, 100_000, 10*time.Second)
	b.Run("all-systems", func(b *testing.B) { runBench(b, sc, Options{}) })
	b.Run("allot-only", func(b *testing.B) { runBench(b, sc, Options{Systems: []string{"allot"}}) })
	b.Run("baselines-only", func(b *testing.B) {
		runBench(b, sc, Options{Systems: []string{"independent", "static", "central", "async-global"}})
	})
}

// BenchmarkDuration shows memory flat in simulated duration: the same load
// for 10 s and for 80 s.
func BenchmarkDuration(b *testing.B) {
	for _, d := range []time.Duration{10 * time.Second, 80 * time.Second} {
		sc := synthetic(3, 1000, 20_000, d)
		b.Run(d.String(), func(b *testing.B) { runBench(b, sc, Options{}) })
	}
}

// BenchmarkScaleKeys and BenchmarkScaleRegions are the scaling table.
func BenchmarkScaleKeys(b *testing.B) {
	for _, k := range []int{1, 100, 10_000, 100_000} {
		sc := synthetic(3, k, 50_000, 10*time.Second)
		b.Run(fmt.Sprintf("keys=%d", k), func(b *testing.B) { runBench(b, sc, Options{}) })
	}
}

func BenchmarkScaleRegions(b *testing.B) {
	for _, n := range []int{3, 10, 30} {
		sc := synthetic(n, 1000, 50_000, 10*time.Second)
		b.Run(fmt.Sprintf("regions=%d", n), func(b *testing.B) { runBench(b, sc, Options{}) })
	}
}

// BenchmarkLibrary runs every committed scenario once at full scale, the
// figure for "the whole library within 60 seconds".
func BenchmarkLibrary(b *testing.B) {
	scs, err := LoadDir("scenarios")
	if err != nil {
		b.Fatal(err)
	}
	for i := 0; i < b.N; i++ {
		var arrivals int64
		start := time.Now()
		for _, sc := range scs {
			res, err := Run(sc, sc.Seeds[0], Options{})
			if err != nil {
				b.Fatal(err)
			}
			arrivals += res.Arrivals
		}
		b.ReportMetric(time.Since(start).Seconds(), "library-s")
		b.ReportMetric(float64(arrivals), "arrivals")
	}
}
