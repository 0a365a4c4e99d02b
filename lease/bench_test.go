package lease

import (
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/allot-dev/allot/bucket"
)

// benchAllocator returns an Allocator past its learning period with nRegions
// regions that said hello and nKeys hot keys, each wanted by two regions
// above their floors, at rest: every grant acknowledged. reports are the
// regions' periodic reports, to be re-sent every round to keep demand
// fresh.
func benchAllocator(b *testing.B, nRegions, nKeys int) (*Allocator, time.Time, []Message) {
	b.Helper()
	cfg := DefaultConfig()
	var regions []string
	for i := range nRegions {
		regions = append(regions, fmt.Sprintf("r%02d", i))
	}
	cfg.Budgets = []Budget{{Rule: "api", Limit: bucket.PerMinute(100000).WithBurst(10000), Regions: regions, Reserve: DefaultReserve}}
	now := t0
	a, err := NewAllocator(cfg, 1, now)
	if err != nil {
		b.Fatal(err)
	}
	reports := make([]Message, nRegions)
	for i, r := range regions {
		reports[i] = Message{Type: MsgReport, Region: r, Session: uint64(i + 1)}
		if err := a.Step(now, Message{Type: MsgHello, Region: r, Session: uint64(i + 1), Seq: 1}); err != nil {
			b.Fatal(err)
		}
	}
	for k := range nKeys {
		key := bucket.Key{Rule: "api", Subject: fmt.Sprintf("tenant-%06d", k)}
		for _, ri := range []int{k % nRegions, (k*7 + 3) % nRegions} {
			reports[ri].Demand = append(reports[ri].Demand, Demand{Key: key, Want: bucket.Tokens(7000 + (k*997)%20000)})
		}
	}
	seq := uint64(1)
	ackAll := func() {
		for _, m := range a.Ready() {
			if m.Type == MsgGrant {
				seq++
				_ = a.Step(now, Message{Type: MsgAck, Region: m.Region, Session: m.Session, Term: m.Term, Seq: seq, Grant: m.Grant, Version: m.Version})
			}
		}
	}
	ackAll()
	// Past learning, then rounds until nothing changes.
	for range 12 {
		now = now.Add(cfg.Refresh)
		for i := range reports {
			seq++
			reports[i].Seq = seq
			if err := a.Step(now, reports[i]); err != nil {
				b.Fatal(err)
			}
		}
		ackAll()
		a.Tick(now)
		ackAll()
	}
	return a, now, reports
}

// BenchmarkRound is one allocation round (Tick at a refresh boundary) for
// 100,000 hot keys across 10 regions in steady state: every key
// rebalanced, every lease renewed. Target: ≤ 1 s, no allocation per key.
func BenchmarkRound(b *testing.B) {
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	a, now, reports := benchAllocator(b, 10, 100000)
	runtime.GC()
	runtime.ReadMemStats(&m1)
	// Heap held per hot key by the Allocator and the reports kept for the
	// benchmark (two 40-byte demands per key).
	perKey := float64(m1.HeapAlloc-m0.HeapAlloc) / 100000
	st := a.Stats(now)
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		b.StopTimer()
		now = now.Add(a.cfg.Refresh)
		for i := range reports {
			reports[i].Seq += 1000
			_ = a.Step(now, reports[i])
		}
		for _, m := range a.Ready() {
			_ = a.Step(now, Message{Type: MsgAck, Region: m.Region, Session: m.Session, Term: m.Term, Seq: m.Seq + 500, Grant: m.Grant, Version: m.Version})
		}
		a.Ready()
		b.StartTimer()
		a.Tick(now)
	}
	b.StopTimer()
	st2 := a.Stats(now)
	b.ReportMetric(float64(st2.HotKeys), "hotkeys")
	b.ReportMetric(perKey, "heapB/hotkey")
	b.ReportMetric(float64(st2.Increases+st2.Decreases-st.Increases-st.Decreases)/float64(b.N), "changes/round")
}

// BenchmarkReport is one demand report of 1,000 hot keys stepping into the
// Allocator in steady state.
func BenchmarkReport(b *testing.B) {
	a, now, reports := benchAllocator(b, 10, 10000)
	m := reports[0]
	m.Demand = m.Demand[:1000]
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		m.Seq += 2
		if err := a.Step(now, m); err != nil {
			b.Fatal(err)
		}
		a.Ready()
	}
}

// BenchmarkHolderReport is a Holder recording demand for 1,000 keys and
// building its report.
func BenchmarkHolderReport(b *testing.B) {
	cfg := testConfig()
	hc := DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 1, cfg.Budgets
	h, err := NewHolder(hc, t0)
	if err != nil {
		b.Fatal(err)
	}
	h.wantHello = false
	h.Ready()
	keys := make([]bucket.Key, 1000)
	for i := range keys {
		keys[i] = bucket.Key{Rule: "api", Subject: fmt.Sprintf("tenant-%06d", i)}
	}
	now := t0
	b.ReportAllocs()
	b.ResetTimer()
	for range b.N {
		now = now.Add(h.refresh)
		for _, k := range keys {
			h.Demand(now, k, 100)
		}
		h.Tick(now)
		if len(h.Ready()) != 1 {
			b.Fatal("no report")
		}
	}
}

// BenchmarkAllocation is the region's question on its hot path.
func BenchmarkAllocation(b *testing.B) {
	cfg := testConfig()
	hc := DefaultHolderConfig()
	hc.Region, hc.Session, hc.Budgets = "a", 1, cfg.Budgets
	h, _ := NewHolder(hc, t0)
	k := bucket.Key{Rule: "api", Subject: "t"}
	h.table[k] = Entry{Key: k, Count: 300, Burst: 30}
	h.leaseEnd = t0.Add(time.Hour)
	b.ReportAllocs()
	for range b.N {
		if _, ok := h.Allocation(t0, k); !ok {
			b.Fatal("no budget")
		}
	}
}
