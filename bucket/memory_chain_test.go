package bucket

import "testing"

// Keys whose 64-bit hashes collide share a chain: each keeps its own state,
// removing one leaves the others, and the sweep drops only full ones.
func TestMemoryHashChain(t *testing.T) {
	var s memShard
	s.m = &Memory{} // the store-wide counts
	s.buckets = make(map[uint64]*memEntry)
	const h = 42
	l := PerSecond(10)
	now := t0.UnixMicro()
	keys := []Key{{"r", "a"}, {"r", "b"}, {"q", "a"}}
	for i, k := range keys {
		var st State
		var d Decision
		decideIn(&st, now, &l, Tokens(i+1), &d)
		s.put(h, k, nil, State{}, st)
	}
	if s.n != 3 || len(s.buckets) != 1 {
		t.Fatalf("n=%d map=%d, want 3 entries in one chain", s.n, len(s.buckets))
	}
	for i, k := range keys {
		e := s.find(h, k)
		if e == nil {
			t.Fatalf("find(%v) = nil", k)
		}
		if d := peek(e.st, now, &l); d.Remaining != Tokens(10-i-1) {
			t.Errorf("%v: remaining %d, want %d", k, d.Remaining, 10-i-1)
		}
	}
	if s.find(h, Key{"r", "c"}) != nil || s.find(h+1, keys[0]) != nil {
		t.Fatal("find returned an entry for a key not stored")
	}
	s.remove(h, s.find(h, keys[1])) // the middle of the chain
	if s.n != 2 || s.find(h, keys[1]) != nil || s.find(h, keys[0]) == nil || s.find(h, keys[2]) == nil {
		t.Fatalf("after removing %v: n=%d, chain wrong", keys[1], s.n)
	}
	// keys[0] spent 1 token (full again after 100 ms), keys[2] spent 3 (300 ms).
	s.sweep(now + 200_000)
	if s.n != 1 || s.find(h, keys[0]) != nil || s.find(h, keys[2]) == nil {
		t.Fatalf("after a sweep at +200ms: n=%d, want only %v left", s.n, keys[2])
	}
	s.sweep(now + 300_000)
	if s.n != 0 || len(s.buckets) != 0 {
		t.Fatalf("after a sweep at +300ms: n=%d map=%d, want empty", s.n, len(s.buckets))
	}
}
