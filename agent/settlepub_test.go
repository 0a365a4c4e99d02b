package agent

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/breaker"
	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/region"
)

// handshake reports whether cmd is one a new connection sends before it
// is used (HELLO, CLIENT SETINFO), not the caller's.
func handshake(cmd redis.Cmder) bool { return cmd.Name() == "hello" || cmd.Name() == "client" }

// countHook counts the round trips a client makes for its callers: single
// commands and pipelines.
type countHook struct{ single, pipelines atomic.Int64 }

func (h *countHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *countHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if !handshake(cmd) {
			h.single.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *countHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if !slices.ContainsFunc(cmds, handshake) {
			h.pipelines.Add(1)
		}
		return next(ctx, cmds)
	}
}

// monitor streams the commands the server at addr runs, in its order,
// over a connection of its own (MONITOR, read as the server writes it),
// until the test ends.
func monitor(t *testing.T, addr string) *monitorLog {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	if _, err := conn.Write([]byte("MONITOR\r\n")); err != nil {
		t.Fatal(err)
	}
	m := &monitorLog{ch: make(chan string, 4096)}
	go func() {
		rd := bufio.NewReader(conn)
		for {
			l, err := rd.ReadString('\n')
			if err != nil {
				close(m.ch)
				return
			}
			m.ch <- strings.TrimRight(l, "\r\n")
		}
	}()
	return m
}

type monitorLog struct {
	ch    chan string
	lines []string
}

// until sends a marker command on c, again every 100 ms while the
// server may not be streaming yet, and reads the stream up to it.
func (m *monitorLog) until(t *testing.T, c *redis.Client, marker string) {
	t.Helper()
	timeout := time.After(10 * time.Second)
	for {
		_ = c.Echo(context.Background(), marker).Err()
		again := time.After(100 * time.Millisecond)
	read:
		for {
			select {
			case l, ok := <-m.ch:
				if !ok {
					t.Fatalf("MONITOR's connection closed before %q", marker)
				}
				m.lines = append(m.lines, l)
				if strings.Contains(l, marker) {
					return
				}
			case <-again:
				break read
			case <-timeout:
				t.Fatalf("MONITOR streamed no %q within 10 s", marker)
			}
		}
	}
}

// short is the stream with each line cut to 200 bytes: a script call's
// line carries its source, kilobytes, before its keys.
func (m *monitorLog) short() []string {
	out := make([]string, len(m.lines))
	for i, l := range m.lines {
		if len(l) > 200 {
			l = l[:200] + "…"
		}
		out[i] = l
	}
	return out
}

// first is the index of the first line streamed that contains s, -1 if
// none.
func (m *monitorLog) first(s string) int {
	for i, l := range m.lines {
		if strings.Contains(l, s) {
			return i
		}
	}
	return -1
}

// TestSettleAndPublishInOneRoundTrip: a carry's rebases and its table go
// to the region's Redis in one pipeline, one round trip where settling and
// then publishing took two, and the server runs the rebases before the
// publication (its MONITOR stream), so no agent reads the table before its
// buckets are settled. The rebases take what Rebase takes, one by one.
// Swapping the two in the pipeline fails the order check.
func TestSettleAndPublishInOneRoundTrip(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	addr := testenv.RedisAddr(t)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = c.Close() })
	prefix := fmt.Sprintf("allot-test-%s-%d:", t.Name(), time.Now().UnixNano())
	at := time.Unix(1_800_000_000, 0)
	rs, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second, Now: func() time.Time { return at }})
	if err != nil {
		t.Fatal(err)
	}
	sh := NewRedisShared(c, prefix, "eu", 5*time.Second, time.Minute)
	b, err := breaker.New(breaker.DefaultConfig())
	if err != nil {
		t.Fatal(err)
	}
	// The agent's store is the Redis store under the breaker's deadlines.
	timed := breaker.Timed(rs, b, nil)
	if !sh.SettlesIn(rs) || !sh.SettlesIn(timed) {
		t.Fatal("SettlesIn(its own client's store) = false")
	}
	other := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = other.Close() })
	rsOther, err := redisstore.New(other, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if sh.SettlesIn(rsOther) || sh.SettlesIn(bucket.NewMemory(bucket.MemoryOptions{})) {
		t.Fatal("SettlesIn is true for another client's store or an in-process one: their calls cannot share its pipeline")
	}
	// A Cluster's pipeline keeps no order between nodes: its carries
	// settle, then publish (no server is dialled here).
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{addr}, ContextTimeoutEnabled: true})
	t.Cleanup(func() { _ = cc.Close() })
	rsCluster, err := redisstore.New(cc, redisstore.Options{Prefix: prefix})
	if err != nil {
		t.Fatal(err)
	}
	if NewRedisShared(cc, prefix, "eu", time.Second, time.Minute).SettlesIn(rsCluster) {
		t.Error("SettlesIn is true on a Cluster client")
	}
	if rsCluster.QueuesOn(cc) {
		t.Error("QueuesOn is true on a Cluster client")
	}
	rb := redisstore.Rebasing{Key: bucket.Key{Rule: "api", Subject: "x"}, From: bucket.PerSecond(10), To: bucket.PerSecond(20)}
	if _, errs := rsCluster.QueueRebases(ctx, cc.Pipeline(), []redisstore.Rebasing{rb})(); errs[0] == nil {
		t.Error("QueueRebases took a rebase on a Cluster client, whose pipelines keep no order")
	}

	from := bucket.PerSecond(100)
	k := func(s string) bucket.Key { return bucket.Key{Rule: "api", Subject: s} }
	// The same buckets twice: settled together here, one by one by Rebase.
	for _, s := range []string{"spent", "spent-ref"} {
		if got, err := rs.TakeUpTo(ctx, k(s), from, 70); err != nil || got != 70 {
			t.Fatalf("TakeUpTo %s = %d, %v; want 70", s, got, err)
		}
	}
	changes := []region.Change{
		{Key: k("full"), From: from, To: bucket.PerSecond(10)},                        // a decrease of a full bucket: 90 taken away
		{Key: k("spent"), From: from, To: bucket.PerSecond(200), Credit: 5},           // a raise that carries credit
		{Key: k("lent"), From: from, To: bucket.PerSecond(10).WithBurst(0)},           // to nothing: nothing written
		{Key: k("bad"), From: from, To: bucket.PerSecond(10), Credit: -1},             // a credit below 0: unsettled
		{Key: k("full-ref"), From: from, To: bucket.PerSecond(10), Again: true},       // listed again, settled as any
		{Key: k("from-nothing"), From: bucket.Limit{}, To: bucket.PerSecond(10)},      // from nothing: left empty
		{Key: k("from-nothing-2"), From: from.WithBurst(0), To: bucket.PerSecond(10)}, // likewise
	}
	tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: 7, Written: at}
	tables := sh.Watch(ctx, NoticeTable)
	mon := monitor(t, addr)
	mon.until(t, other, "monitor-ready")
	hook := &countHook{}
	c.AddHook(hook)

	o, stored, err := sh.SettleAndPublish(ctx, timed, changes, tab, Fence{})
	if err != nil || !stored {
		t.Fatalf("SettleAndPublish: stored %v, %v", stored, err)
	}
	if s, p := hook.single.Load(), hook.pipelines.Load(); s != 0 || p != 1 {
		t.Errorf("SettleAndPublish made %d single calls and %d pipelines, want one pipeline", s, p)
	}
	mon.until(t, other, "settled-and-published")
	rebase, publish := mon.first(rs.RedisKey(k("full"))), mon.first("region:{eu}:table")
	if rebase < 0 || publish < 0 || rebase > publish {
		t.Errorf("the server ran the rebase at line %d and the publication at line %d of its MONITOR stream, want the rebase first:\n%s",
			rebase, publish, strings.Join(mon.short(), "\n"))
	}
	if got := tableIn(t, woken(t, tables, "the table's notice")[0]); got.Pub != 7 {
		t.Errorf("the notice carried publication %d, want 7", got.Pub)
	}

	// What the one pipeline settled is what Rebase settles.
	if len(o.Unsettled) != 1 || o.Unsettled[0].Key != k("bad") {
		t.Errorf("Unsettled = %+v, want the change with a negative credit alone", o.Unsettled)
	}
	lost := map[string]bucket.Tokens{}
	for _, l := range o.Lost {
		lost[l.Change.Key.Subject] = l.Tokens
	}
	for _, c := range []struct {
		s, ref string
		to     bucket.Limit
		credit bucket.Tokens
	}{
		{"full", "full-ref", bucket.PerSecond(10), 0},
		{"spent", "spent-ref", bucket.PerSecond(200), 5},
	} {
		want, err := rs.Rebase(ctx, k(c.ref), from, c.to, c.credit)
		if err != nil {
			t.Fatal(err)
		}
		if lost[c.s] != want {
			t.Errorf("%s: the pipeline took %d away, Rebase %d", c.s, lost[c.s], want)
		}
		got, err1 := rs.Peek(ctx, k(c.s), c.to)
		ref, err2 := rs.Peek(ctx, k(c.ref), c.to)
		if err1 != nil || err2 != nil || got.Remaining != ref.Remaining {
			t.Errorf("%s holds %d after the pipeline, %d after Rebase (%v, %v)", c.s, got.Remaining, ref.Remaining, err1, err2)
		}
	}
	if lost["full"] != 90 {
		t.Errorf("the full bucket's decrease took %d away, want 90", lost["full"])
	}
	for _, s := range []string{"from-nothing", "from-nothing-2"} {
		if d, err := rs.Peek(ctx, k(s), bucket.PerSecond(10)); err != nil || d.Remaining != 0 {
			t.Errorf("%s: %d tokens after a rebase from nothing (%v), want an empty bucket", s, d.Remaining, err)
		}
	}
	if n, err := c.Exists(ctx, rs.RedisKey(k("lent"))).Result(); err != nil || n != 0 {
		t.Errorf("a change to nothing wrote its bucket (exists %d, %v)", n, err)
	}
}

// BenchmarkCarry settles the changes of 1 and of 50 keys and publishes
// the table, two ways side by side on one redis-server: settled and then
// published (region.Settle, then PublishTable: a round trip per key and
// one more), and in one pipeline (SettleAndPublish). Every iteration moves
// each key between two limits, so every rebase writes.
func BenchmarkCarry(b *testing.B) {
	ctx := context.Background()
	addr := testenv.RedisAddr(b)
	c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	b.Cleanup(func() { _ = c.Close() })
	prefix := fmt.Sprintf("allot-bench-carry-%d:", time.Now().UnixNano())
	rs, err := redisstore.New(c, redisstore.Options{Prefix: prefix, Timeout: 5 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	sh := NewRedisShared(c, prefix, "eu", 5*time.Second, time.Minute)
	lo, hi := bucket.PerSecond(100), bucket.PerSecond(200)
	var pub uint64 // publications go on rising across the sub-benchmarks
	for _, n := range []int{1, 50} {
		var down, up []region.Change
		for i := range n {
			k := bucket.Key{Rule: "api", Subject: fmt.Sprintf("k%d", i)}
			down = append(down, region.Change{Key: k, From: hi, To: lo})
			up = append(up, region.Change{Key: k, From: lo, To: hi})
		}
		for _, way := range []string{"settle-then-publish", "one-pipeline"} {
			b.Run(fmt.Sprintf("keys=%d/%s", n, way), func(b *testing.B) {
				for i := 0; b.Loop(); i++ {
					changes := down
					if i%2 == 1 {
						changes = up
					}
					pub++
					tab := &region.Table{Region: "eu", Speaker: "eu-0", Pub: pub}
					var (
						o      region.Outcome
						stored bool
						err    error
					)
					if way == "one-pipeline" {
						o, stored, err = sh.SettleAndPublish(ctx, rs, changes, tab, Fence{})
					} else {
						o = region.Settle(ctx, rs, changes)
						stored, err = sh.PublishTable(ctx, tab, Fence{})
					}
					if err != nil || !stored || len(o.Unsettled) > 0 {
						b.Fatalf("stored %v, %v, %d unsettled", stored, err, len(o.Unsettled))
					}
				}
			})
		}
	}
}
