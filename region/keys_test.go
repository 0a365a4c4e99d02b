package region

import (
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// TestKeysFoundAsTheShardsGrow checks that a key is found without the lock
// from the moment it is created, through every doubling of its shard's
// copy, and that a key never created is not found.
func TestKeysFoundAsTheShardsGrow(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Shards = 4 })
	c := f.core
	now := f.clk.Now().UnixMicro()
	const n = 3000
	made := make([]*keyState, n)
	for i := range n {
		made[i] = c.state(key(fmt.Sprint("k", i)), now)
		if got := c.lookup(&made[i].key); got != made[i] {
			t.Fatalf("key %d: lookup right after creation = %p, want %p", i, got, made[i])
		}
	}
	for i, ks := range made {
		k := key(fmt.Sprint("k", i))
		if got := c.lookup(&k); got != ks {
			t.Fatalf("key %d: lookup = %p, want %p", i, got, ks)
		}
		if k := key(fmt.Sprint("never", i)); c.lookup(&k) != nil {
			t.Fatalf("key never%d found, never created", i)
		}
	}
	for i := range c.shards {
		s := &c.shards[i]
		r := s.read.Load()
		if r.used != len(s.keys) || 2*r.used > len(r.slots) {
			t.Fatalf("shard %d: copy holds %d of %d keys in %d slots, want all in at least twice as many",
				i, r.used, len(s.keys), len(r.slots))
		}
	}
}

// TestKeysFoundWhileOthersAreAdded has goroutines create keys while others
// look up the keys created so far: each must be found, as the race
// detector watches the copy filled in place.
func TestKeysFoundWhileOthersAreAdded(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.Shards = 2 })
	c := f.core
	now := f.clk.Now().UnixMicro()
	const writers, perWriter = 4, 500
	var done [writers]atomic.Int64 // keys created so far by each writer
	name := func(w, i int) string { return fmt.Sprintf("w%d-%d", w, i) }
	var wg sync.WaitGroup
	var stop atomic.Bool
	errs := make(chan error, 8)
	for w := range writers {
		wg.Go(func() {
			for i := range perWriter {
				c.state(key(name(w, i)), now)
				done[w].Store(int64(i + 1))
			}
		})
	}
	var rg sync.WaitGroup
	for r := range 2 {
		rg.Go(func() {
			for j := 0; !stop.Load(); j++ {
				w := (j + r) % writers
				m := done[w].Load()
				if m == 0 {
					continue
				}
				k := key(name(w, int(int64(j)%m)))
				if ks := c.lookup(&k); ks == nil || ks.key != k {
					errs <- fmt.Errorf("key %v created but not found", k)
					return
				}
			}
		})
	}
	wg.Wait()
	stop.Store(true)
	rg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if got := c.Stats().Keys; got != writers*perWriter {
		t.Fatalf("keys %d, want %d", got, writers*perWriter)
	}
}

// TestAllocationKeptWhenEpochLeavesItSame checks that a key whose answer a
// new table leaves as it was keeps its cached allocation, marked current,
// while a key whose entry or lease end changed gets a new one; either way
// a decision sees the current table's allocation.
func TestAllocationKeptWhenEpochLeavesItSame(t *testing.T) {
	f := newFixture(t, nil)
	pub := uint64(0)
	install := func(end time.Duration, hot, lent bucket.Tokens) {
		t.Helper()
		pub++
		ep := f.view.Epoch()
		tab := &Table{Region: "a", Pub: pub, Term: 1, Version: pub, LeaseEnd: t0.Add(end), HoldUntil: t0.Add(end),
			Entries: []lease.Entry{{Key: key("hot"), Count: hot, Burst: hot}, {Key: key("lent"), Count: lent, Burst: lent}}}
		if !f.view.Set(tab) || f.view.Epoch() == ep {
			t.Fatalf("table %d not installed with a new epoch", pub)
		}
	}
	cached := func(name string) *allocCache {
		k := key(name)
		ks := f.core.lookup(&k)
		if ks == nil {
			t.Fatalf("key %s has no state", name)
		}
		return ks.alloc.Load()
	}
	steps := []struct {
		name      string
		end       time.Duration
		hot, lent bucket.Tokens
		kept      map[string]bool // whether each key's cache is the one before
	}{
		{"first table", 10 * time.Second, 250, 40, nil},
		{"hot entry changed", 10 * time.Second, 200, 40, map[string]bool{"hot": false, "lent": true}},
		{"lent entry changed", 10 * time.Second, 200, 30, map[string]bool{"hot": true, "lent": false}},
		{"lease end moved", 8 * time.Second, 200, 30, map[string]bool{"hot": false, "lent": false}},
	}
	before := map[string]*allocCache{}
	for _, st := range steps {
		install(st.end, st.hot, st.lent)
		for name, want := range map[string]bucket.Tokens{"hot": st.hot, "lent": st.lent} {
			if r := f.decide(t, key(name), 1); r.Decision.Limit != bucket.PerSecond(want) || !r.Hot {
				t.Errorf("%s: key %s decided under %v (hot %v), want %v hot", st.name, name, r.Decision.Limit, r.Hot,
					bucket.PerSecond(want))
			}
			ac := cached(name)
			if got := ac.epoch.Load(); got != f.view.Epoch() {
				t.Errorf("%s: key %s cached at epoch %d, want %d", st.name, name, got, f.view.Epoch())
			}
			if kept, ok := st.kept[name]; ok && (ac == before[name]) != kept {
				t.Errorf("%s: key %s kept its cached allocation %v, want %v", st.name, name, ac == before[name], kept)
			}
			before[name] = ac
		}
	}
}
