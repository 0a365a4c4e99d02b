package main

import (
	"context"
	"fmt"
	"io"
	"runtime"
	"runtime/metrics"
	"strconv"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
)

// MemResult is the memory one system's keys took.
type MemResult struct {
	System string
	Where  string // "in process" or "Redis"
	Kind   string // "idle" or "hot"
	Keys   int    // subjects decided
	// BytesPerKey is the memory's growth divided by the subjects decided;
	// KeysPerSubject is how many stored keys each subject held at the
	// measurement (Redis only), and BytesPerStored the growth per stored key.
	BytesPerKey    float64
	KeysPerSubject float64
	BytesPerStored float64
	StoredKeys     int64 // DBSIZE's growth (Redis only)
}

// measureMemory measures bytes per key: in process for bucket.Memory (the
// agent's in-process store), from the live heap (runtime/metrics) after a
// collection; in Redis for every system with one, from INFO memory's
// used_memory. Idle keys are decided once under the idle limit (10 an
// hour, so each holds its state for the measurement); hot keys are decided
// over and over for cfg.HotFor under the hot limit (faster than it
// refills, so each is always in use: some decisions are denied), and
// measured while still in use.
func measureMemory(ctx context.Context, cfg Config, systems []*system) ([]MemResult, error) {
	var out []MemResult
	for _, kind := range []string{"idle", "hot"} {
		// In process, keys cost microseconds: enough of them that the
		// heap's other movements (the run's connections, its goroutines)
		// are noise, whatever the Redis measurements use.
		n := max(cfg.MemoryKeys, 100_000)
		if kind == "hot" {
			n = max(cfg.HotKeys, 100_000)
		}
		b, err := memoryStore(ctx, n, kind == "hot")
		if err != nil {
			return nil, err
		}
		out = append(out, MemResult{System: "allot (bucket.Memory)", Where: "in process", Kind: kind, Keys: n, BytesPerKey: b})
	}
	for _, s := range systems {
		if s.raddr == "" {
			continue
		}
		c := redis.NewClient(&redis.Options{Addr: s.raddr})
		for _, kind := range []string{"idle", "hot"} {
			r, err := memoryRedis(ctx, cfg, s, c, kind)
			if err != nil {
				c.Close()
				return nil, fmt.Errorf("peers: memory of %s: %w", s.name, err)
			}
			out = append(out, r)
		}
		c.Close()
	}
	return out, nil
}

// liveHeap is the heap's live bytes after a full collection.
func liveHeap() uint64 {
	runtime.GC()
	runtime.GC()
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
}

// memoryStore is bucket.Memory's live heap per key: n keys decided once
// (idle), or ten times each (hot: the state is updated in place, so a key
// in use should cost what an idle one does).
func memoryStore(ctx context.Context, n int, hot bool) (float64, error) {
	m := bucket.NewMemory(bucket.MemoryOptions{})
	keys := make([]bucket.Key, n)
	for i := range keys {
		keys[i] = bucket.Key{Rule: "idle", Subject: "subject-" + strconv.Itoa(i)}
	}
	l := bucket.PerHour(idlePerHour)
	times := 1
	if hot {
		// Ten decisions each under a limit that refills none of them
		// during the measurement, so no bucket is full and swept.
		l, times = bucket.PerHour(1000), 10
	}
	before := liveHeap()
	for range times {
		for _, k := range keys {
			if _, err := m.Decide(ctx, k, l, 1, ""); err != nil {
				return 0, err
			}
		}
	}
	after := liveHeap()
	if b, _ := m.Len(); b != n {
		return 0, fmt.Errorf("peers: bucket.Memory holds %d buckets after %d keys, want all of them", b, n)
	}
	runtime.KeepAlive(m)
	runtime.KeepAlive(keys)
	// The keys' own strings are the caller's, not the store's: they are
	// live before and after, so the difference is the store's.
	return float64(int64(after)-int64(before)) / float64(n), nil
}

// usedMemory sums MEMORY USAGE over every stored key (found with SCAN) and
// counts them. INFO's used_memory would also count the clients' buffers,
// which swing by kilobytes while 32 callers keep a hundred hot keys busy and
// can outweigh the keys themselves; MEMORY USAGE is what each key costs.
func usedMemory(ctx context.Context, c *redis.Client) (mem, keys int64, err error) {
	iter := c.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		n, err := c.MemoryUsage(ctx, iter.Val(), 0).Result()
		if err == redis.Nil {
			continue // expired between SCAN and MEMORY USAGE
		}
		if err != nil {
			return 0, 0, err
		}
		mem += n
		keys++
	}
	return mem, keys, iter.Err()
}

// memoryRedis measures one system's Redis growth over its idle or hot keys.
func memoryRedis(ctx context.Context, cfg Config, s *system, c *redis.Client, kind string) (MemResult, error) {
	n, path := cfg.MemoryKeys, pathIdle
	if kind == "hot" {
		n, path = cfg.HotKeys, pathHot
	}
	prefix := "mem-" + kind + "-"
	// The load's keys would expire during the measurement and hide the new
	// ones: start from an empty Redis. (The agent writes its region's table
	// and demand reports back within a tick: two keys.)
	if err := c.FlushAll(ctx).Err(); err != nil {
		return MemResult{}, err
	}
	mem0, keys0, err := usedMemory(ctx, c)
	if err != nil {
		return MemResult{}, err
	}
	const callers = 32
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
		stop     = make(chan struct{})
	)
	passes := 1
	if kind == "hot" {
		passes = 1 << 30 // until stopped
		time.AfterFunc(cfg.HotFor, func() { close(stop) })
	}
	var mem1, keys1 int64
	var sampleOnce sync.Once
	sample := func() {
		// Hot keys are measured while the load still runs: a key in use is
		// what is asked about.
		sampleOnce.Do(func() { mem1, keys1, err = usedMemory(ctx, c) })
	}
	for w := range callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for p := 0; p < passes; p++ {
				for i := w; i < n; i += callers {
					select {
					case <-stop:
						sample()
						return
					default:
					}
					cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
					_, derr := s.decide(cctx, prefix+strconv.Itoa(i), path)
					cancel()
					if derr != nil {
						mu.Lock()
						if firstErr == nil {
							firstErr = derr
						}
						mu.Unlock()
						return
					}
				}
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return MemResult{}, firstErr
	}
	if kind == "idle" {
		sample()
	}
	if err != nil {
		return MemResult{}, err
	}
	r := MemResult{System: s.name, Where: "Redis", Kind: kind, Keys: n,
		BytesPerKey:    float64(mem1-mem0) / float64(n),
		KeysPerSubject: float64(keys1-keys0) / float64(n), StoredKeys: keys1 - keys0}
	if keys1 > keys0 {
		r.BytesPerStored = float64(mem1-mem0) / float64(keys1-keys0)
	}
	return r, nil
}

func printMemory(out io.Writer, ms []MemResult) {
	fmt.Fprintf(out, "\n### Memory per key (idle: decided once under %d an hour; hot: decided again and again for the run's hot period under %d a second, measured while in use; Redis bytes are MEMORY USAGE summed over the stored keys)\n\n", idlePerHour, hotPerSecond)
	fmt.Fprintln(out, "| system | where | key | keys | bytes per key | stored keys per key | bytes per stored key |")
	fmt.Fprintln(out, "|---|---|---|---|---|---|---|")
	for _, m := range ms {
		per, stored := "—", "—"
		if m.Where == "Redis" {
			per = strconv.FormatFloat(m.KeysPerSubject, 'f', 2, 64)
			if m.BytesPerStored > 0 {
				stored = strconv.FormatFloat(m.BytesPerStored, 'f', 0, 64)
			}
		}
		fmt.Fprintf(out, "| %s | %s | %s | %d | %.0f | %s | %s |\n", m.System, m.Where, m.Kind, m.Keys, m.BytesPerKey, per, stored)
	}
}
