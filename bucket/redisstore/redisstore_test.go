package redisstore_test

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/bucket/storetest"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
)

func newRedisStore(t testing.TB, c redis.UniversalClient, opts redisstore.Options) *redisstore.Store {
	t.Helper()
	s, err := redisstore.New(c, opts)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// The Lua script runs the conformance suite with the test's clock passed in
// as the script's now, so the same fixed instants and the same random
// sequences as the pure Go functions must give identical answers.
func TestRedisConformance(t *testing.T) {
	c := testenv.RedisClient(t)
	storetest.Run(t, func(t *testing.T, clk clock.Clock) bucket.Store {
		return newRedisStore(t, c, redisstore.Options{Now: clk.Now, Timeout: 5 * time.Second})
	})
}

func TestRedisClusterConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a three-node cluster")
	}
	addrs := testenv.StartRedisCluster(t, 3)
	c := redisstore.NewUniversalClient(addrs, "", "")
	t.Cleanup(func() { c.Close() })
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("UniversalClient with %d addresses is %T, want a cluster client", len(addrs), c)
	}
	storetest.Run(t, func(t *testing.T, clk clock.Clock) bucket.Store {
		return newRedisStore(t, c, redisstore.Options{Now: clk.Now, Timeout: 5 * time.Second})
	})
	// The store groups a batch's operations by the slot it computes; a
	// slot the server computes differently would send a script call keys
	// of two slots, which the Cluster refuses.
	s := newRedisStore(t, c, redisstore.Options{})
	ctx := context.Background()
	for i := range 200 {
		k := s.RedisKey(bucket.Key{Rule: fmt.Sprint("r", i%7), Subject: fmt.Sprint(i)})
		for _, key := range []string{k, fmt.Sprint("plain-", i), fmt.Sprint("a{}b", i), fmt.Sprint("{", i, "}x{y}")} {
			want, err := c.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if got := redisstore.Slot(key); int64(got) != want {
				t.Fatalf("slot(%q) = %d, CLUSTER KEYSLOT says %d", key, got, want)
			}
		}
	}
}

func uniqueRule(t *testing.T) string {
	return fmt.Sprintf("%s-%d", strings.ReplaceAll(t.Name(), "/", "-"), rand.Int64())
}

// Two gateways (two clients, separate pools) and many goroutines on one key
// admit exactly the burst when refill is negligible for the test's length.
func TestRedisConcurrentExact(t *testing.T) {
	addr := testenv.RedisAddr(t)
	l := bucket.Per(500, 24*time.Hour) // one token refills every 172.8 s
	key := bucket.Key{Rule: uniqueRule(t), Subject: "tenant"}
	var admitted, denied atomic.Int64
	var wg sync.WaitGroup
	for g := range 2 {
		c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 16, ContextTimeoutEnabled: true})
		t.Cleanup(func() { c.Close() })
		s := newRedisStore(t, c, redisstore.Options{Timeout: 5 * time.Second})
		for w := range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := range 50 {
					d, err := s.Decide(context.Background(), key, l, 1, "")
					if err != nil {
						t.Errorf("gateway %d worker %d call %d: %v", g, w, i, err)
						return
					}
					if d.Allowed {
						admitted.Add(1)
					} else {
						denied.Add(1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if admitted.Load() != 500 || denied.Load() != 1100 {
		t.Fatalf("admitted %d denied %d of 1600, want exactly 500 and 1100", admitted.Load(), denied.Load())
	}
}

// Concurrent decisions share script calls: many callers on distinct keys
// make far fewer calls than decisions, and each gets its own key's answer.
func TestRedisConcurrentCallsShareScriptCalls(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newRedisStore(t, c, redisstore.Options{Timeout: 5 * time.Second})
	l := bucket.Per(1000, 24*time.Hour)
	if err := c.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	const workers, each = 32, 50
	var wg sync.WaitGroup
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			key := bucket.Key{Rule: "shared", Subject: fmt.Sprint("tenant-", w)}
			for i := range each {
				cost := bucket.Tokens(1 + w%3)
				d, err := s.Decide(ctx, key, l, cost, "")
				if want := l.Burst() - cost*bucket.Tokens(i+1); err != nil || !d.Allowed || d.Remaining != want {
					t.Errorf("worker %d call %d = %+v, %v; want allowed with %d remaining", w, i, d, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
	info, err := c.Info(ctx, "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	calls := 0
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"cmdstat_evalsha:calls=", "cmdstat_eval:calls="} {
			if rest, ok := strings.CutPrefix(line, cmd); ok {
				n := 0
				fmt.Sscanf(rest, "%d", &n)
				calls += n
			}
		}
	}
	if decisions := workers * each; calls == 0 || calls > decisions/2 {
		t.Fatalf("%d decisions made %d script calls, want at most %d", decisions, calls, decisions/2)
	}
	t.Logf("%d decisions in %d script calls", workers*each, calls)
}

// The server's clock decides; the key expires when the bucket would be full.
func TestRedisServerClockAndTTL(t *testing.T) {
	c := testenv.RedisClient(t)
	s := newRedisStore(t, c, redisstore.Options{})
	key := bucket.Key{Rule: uniqueRule(t), Subject: "alice@example.com"}
	l := bucket.PerMinute(10)
	d, err := s.Decide(context.Background(), key, l, 2, "")
	if err != nil || !d.Allowed || d.Remaining != 8 {
		t.Fatalf("decide = %+v, %v; want allowed with 8 remaining", d, err)
	}
	rk := s.RedisKey(key)
	if strings.Contains(rk, "alice") {
		t.Fatalf("key %q stores the subject in clear", rk)
	}
	pttl, err := c.PTTL(context.Background(), rk).Result()
	if err != nil {
		t.Fatal(err)
	}
	// Two tokens take 12 s to refill: the TTL is at most that, and only the
	// round trip's few milliseconds less.
	if pttl > 12*time.Second || pttl < 11*time.Second {
		t.Fatalf("PTTL = %s, want just under 12s", pttl)
	}
	// Returning both tokens fills the bucket, which deletes the key.
	if err := s.Return(context.Background(), key, l, 2); err != nil {
		t.Fatal(err)
	}
	if n, _ := c.Exists(context.Background(), rk).Result(); n != 0 {
		t.Fatalf("full bucket's key %s still exists", rk)
	}
}

func TestRedisKeyHashing(t *testing.T) {
	c := testenv.RedisClient(t)
	plain := newRedisStore(t, c, redisstore.Options{})
	keyed := newRedisStore(t, c, redisstore.Options{Secret: []byte("s3cret")})
	other := newRedisStore(t, c, redisstore.Options{Secret: []byte("other")})
	k := bucket.Key{Rule: "per-tenant", Subject: "T-42"}
	a, b, o := plain.RedisKey(k), keyed.RedisKey(k), other.RedisKey(k)
	if a == b || b == o {
		t.Fatalf("keys do not depend on the secret: %s %s %s", a, b, o)
	}
	if !strings.HasPrefix(b, "allot:{per-tenant:") || !strings.HasSuffix(b, "}") || len(b) != len("allot:{per-tenant:}")+32 {
		t.Fatalf("key %q is not prefix{rule:hash}", b)
	}
	plainClient := redis.NewClient(&redis.Options{Addr: testenv.RedisAddr(t)})
	defer plainClient.Close()
	if _, err := redisstore.New(plainClient, redisstore.Options{}); err == nil || !strings.Contains(err.Error(), "ContextTimeoutEnabled") {
		t.Fatalf("client without context timeouts: err = %v, want one naming ContextTimeoutEnabled", err)
	}
	if _, err := redisstore.New(c, redisstore.Options{Prefix: "a{b"}); err == nil || !strings.Contains(err.Error(), `Prefix="a{b"`) {
		t.Fatalf("prefix with a brace: err = %v, want one naming the prefix", err)
	}
	if _, err := redisstore.New(c, redisstore.Options{Batch: -1}); err == nil || !strings.Contains(err.Error(), "Batch=-1") {
		t.Fatalf("negative batch: err = %v, want one naming Batch", err)
	}
	if _, err := redisstore.New(c, redisstore.Options{Pipes: -2}); err == nil || !strings.Contains(err.Error(), "Pipes=-2") {
		t.Fatalf("negative pipes: err = %v, want one naming Pipes", err)
	}
}

// A key of the wrong type, or a hash with garbage in it, becomes an empty
// bucket: the caller is denied until it refills, never granted a full one.
func TestRedisWrongTypeAndCorrupt(t *testing.T) {
	c := testenv.RedisClient(t)
	ctx := context.Background()
	s := newRedisStore(t, c, redisstore.Options{})
	l := bucket.PerMinute(10)
	for name, corrupt := range map[string]func(k string) error{
		"hash":      func(k string) error { return c.HSet(ctx, k, "t", "1").Err() },
		"list":      func(k string) error { return c.RPush(ctx, k, "a").Err() },
		"garbage":   func(k string) error { return c.Set(ctx, k, "soon", 0).Err() },
		"old text":  func(k string) error { return c.Set(ctx, k, "99999999999999 0 1 1 10", 0).Err() },
		"negative":  func(k string) error { return c.Set(ctx, k, packState(-5, 0, 1, 1, 10), 0).Err() },
		"bad den":   func(k string) error { return c.Set(ctx, k, packState(1, 5, 1, 0, 10), 0).Err() },
		"rem ≥ den": func(k string) error { return c.Set(ctx, k, packState(99999999999999, 7, 1, 7, 10), 0).Err() },
		"too large": func(k string) error {
			return c.Set(ctx, k, packState(99999999999999, 0, 4503599627370496, 1, 10), 0).Err()
		},
	} {
		t.Run(name, func(t *testing.T) {
			key := bucket.Key{Rule: uniqueRule(t), Subject: "x"}
			if err := corrupt(s.RedisKey(key)); err != nil {
				t.Fatal(err)
			}
			before := s.RepairedKeys()
			d, err := s.Decide(ctx, key, l, 1, "")
			if err != nil {
				t.Fatal(err)
			}
			if d.Allowed || d.Remaining != 0 || d.RetryAfter != 6*time.Second {
				t.Fatalf("decide on a corrupt key = %+v, want denied, empty, retry 6s", d)
			}
			if s.RepairedKeys() != before+1 {
				t.Fatalf("RepairedKeys = %d, want %d", s.RepairedKeys(), before+1)
			}
			typ, _ := c.Type(ctx, s.RedisKey(key)).Result()
			if typ != "string" {
				t.Fatalf("key type after repair = %s, want string", typ)
			}
		})
	}
}

// packState encodes a bucket value as the script stores it: five
// little-endian int64 (TAT, rem, num, den, burst).
func packState(v ...int64) string {
	b := make([]byte, 0, 8*len(v))
	for _, x := range v {
		b = binary.LittleEndian.AppendUint64(b, uint64(x))
	}
	return string(b)
}

// After SCRIPT FLUSH (a restart or a failover to a replica that never saw
// the script), EVALSHA fails with NOSCRIPT and the store falls back to EVAL.
func TestRedisEmptyScriptCache(t *testing.T) {
	c := testenv.RedisClient(t)
	ctx := context.Background()
	s := newRedisStore(t, c, redisstore.Options{})
	key := bucket.Key{Rule: uniqueRule(t), Subject: "x"}
	for i := range 3 {
		if err := c.ScriptFlush(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		d, err := s.Decide(ctx, key, bucket.PerMinute(10), 1, "")
		if err != nil || !d.Allowed || d.Remaining != bucket.Tokens(9-i) {
			t.Fatalf("decide %d after SCRIPT FLUSH = %+v, %v", i, d, err)
		}
	}
}

// A stopped or stalled server is ErrUnavailable within the deadline.
func TestRedisUnavailable(t *testing.T) {
	srv := testenv.StartRedis(t)
	c := srv.Client(t)
	ctx := context.Background()
	s := newRedisStore(t, c, redisstore.Options{Timeout: 100 * time.Millisecond})
	key := bucket.Key{Rule: uniqueRule(t), Subject: "x"}
	if _, err := s.Decide(ctx, key, bucket.PerMinute(10), 1, ""); err != nil {
		t.Fatal(err)
	}

	// Stalled: CLIENT PAUSE holds every client command for 3 s.
	admin := srv.Client(t)
	if err := admin.Do(ctx, "CLIENT", "PAUSE", "3000", "ALL").Err(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err := s.Decide(ctx, key, bucket.PerMinute(10), 1, "")
	if !errors.Is(err, bucket.ErrUnavailable) {
		t.Fatalf("decide on a paused server: err = %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("decide on a paused server took %s, want about the 100ms deadline", el)
	}
	// Callers queued behind the stalled calls leave at their own
	// deadlines too, without having run.
	var wg sync.WaitGroup
	for w := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			_, err := s.Decide(ctx, bucket.Key{Rule: key.Rule, Subject: fmt.Sprint(w)}, bucket.PerMinute(10), 1, "")
			if !errors.Is(err, bucket.ErrUnavailable) {
				t.Errorf("caller %d on a paused server: err = %v, want ErrUnavailable", w, err)
			}
			if el := time.Since(start); el > 2*time.Second {
				t.Errorf("caller %d on a paused server took %s, want about the 100ms deadline", w, el)
			}
		}()
	}
	wg.Wait()
	_ = admin.Do(ctx, "CLIENT", "UNPAUSE").Err()

	// Stopped.
	srv.Kill()
	start = time.Now()
	_, err = s.Decide(ctx, key, bucket.PerMinute(10), 1, "")
	if !errors.Is(err, bucket.ErrUnavailable) || !bucket.IsUnavailable(err) {
		t.Fatalf("decide on a stopped server: err = %v, want ErrUnavailable", err)
	}
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("decide on a stopped server took %s", el)
	}
	// A cost that can never fit is decided before any round trip, even now.
	if _, err := s.Decide(ctx, key, bucket.PerMinute(10), 11, ""); !errors.Is(err, bucket.ErrNeverFits) {
		t.Fatalf("never-fit cost on a stopped server: err = %v, want ErrNeverFits", err)
	}
}

// The same store on a Sentinel-managed primary: the one setting that
// changes is the address list plus a master name.
func TestRedisSentinelConformance(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a primary, a replica and a sentinel")
	}
	s := testenv.StartSentinel(t)
	c := redisstore.NewUniversalClient([]string{s.Addr}, s.Master, "")
	t.Cleanup(func() { c.Close() })
	storetest.Run(t, func(t *testing.T, clk clock.Clock) bucket.Store {
		return newRedisStore(t, c, redisstore.Options{Now: clk.Now, Timeout: 5 * time.Second})
	})
}

// TestClientDoesNotRetryARefusedDial: a call to a Redis that is down
// dials once per attempt of the command. go-redis's default dials five
// times, 100 ms apart, for each: 20 dials and 1.7 s a call, which held an
// agent's round (several calls, no decision deadline) past ten seconds.
func TestClientDoesNotRetryARefusedDial(t *testing.T) {
	srv := testenv.StartRedis(t)
	addr := srv.Addr
	srv.Kill()
	o := redisstore.ClientOptions([]string{addr}, "", "")
	var dials atomic.Int32
	var d net.Dialer
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		dials.Add(1)
		return d.DialContext(ctx, network, addr)
	}
	c := redis.NewUniversalClient(o)
	defer c.Close()
	if err := c.Set(context.Background(), "k", "v", 0).Err(); err == nil {
		t.Fatal("a write to a stopped server succeeded")
	}
	// One dial for each of the command's attempts (go-redis's MaxRetries,
	// 3, plus the first).
	if n := dials.Load(); n != 4 {
		t.Fatalf("%d dials for one call to a stopped server, want 4 (one per attempt)", n)
	}
}

// countCalls is a go-redis hook that counts the round trips a client
// makes: each command sent alone, and each pipeline.
type countCalls struct{ n atomic.Int64 }

func (c *countCalls) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *countCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmd)
	}
}

func (c *countCalls) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.n.Add(1)
		return next(ctx, cmds)
	}
}

// TestRebaseWithCreditIsOneCall: the settlement of a raise that carries
// credit (a Rebase that carries it) is one round trip to Redis, where a
// Rebase and then a Return took two, and leaves the bucket as they do.
func TestRebaseWithCreditIsOneCall(t *testing.T) {
	ctx := context.Background()
	base := testenv.RedisClient(t)
	c := redis.NewClient(base.Options())
	t.Cleanup(func() { c.Close() })
	calls := &countCalls{}
	c.AddHook(calls)
	clk := clock.NewManual(time.Unix(1_700_000_000, 0))
	s := newRedisStore(t, c, redisstore.Options{Now: clk.Now, Timeout: 5 * time.Second})
	from, to := bucket.PerSecond(100), bucket.PerSecond(200)
	one := bucket.Key{Rule: "rebase-credit", Subject: fmt.Sprint(rand.Int64())}
	two := bucket.Key{Rule: "rebase-credit", Subject: fmt.Sprint(rand.Int64())}
	for _, k := range []bucket.Key{one, two} {
		if _, err := s.TakeUpTo(ctx, k, from, 70); err != nil { // also loads the script
			t.Fatal(err)
		}
	}
	calls.n.Store(0)
	lost, err := s.Rebase(ctx, one, from, to, 60)
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.n.Load(); n != 1 {
		t.Fatalf("a rebase with credit made %d calls, want 1", n)
	}
	calls.n.Store(0)
	lost2, err := s.Rebase(ctx, two, from, to, 0)
	if err == nil {
		err = s.Return(ctx, two, to, 60)
	}
	if err != nil {
		t.Fatal(err)
	}
	if n := calls.n.Load(); n != 2 {
		t.Fatalf("Rebase and Return made %d calls, want 2", n)
	}
	d1, err1 := s.Peek(ctx, one, to)
	d2, err2 := s.Peek(ctx, two, to)
	if err := errors.Join(err1, err2); err != nil {
		t.Fatal(err)
	}
	// 30 of 100 left, spent under 200, and 60 back: 90.
	if lost != lost2 || d1 != d2 || d1.Remaining != 90 {
		t.Fatalf("in one call: lost %d, %+v; in two: lost %d, %+v; want the same, 90 left", lost, d1, lost2, d2)
	}
}

// holdDecisions is a go-redis hook that holds every script call whose
// first operation is a decision until release is closed.
type holdDecisions struct {
	release chan struct{}
	held    chan struct{} // closed when the first decision is held
	once    sync.Once
}

func (h *holdDecisions) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *holdDecisions) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		args := cmd.Args()
		if len(args) > 3 {
			if n, ok := args[2].(int); ok && len(args) > 3+n {
				if blob, ok := args[3+n].([]byte); ok && len(blob) >= 8 && binary.LittleEndian.Uint64(blob)&7 == 1 {
					h.once.Do(func() { close(h.held) })
					<-h.release
				}
			}
		}
		return next(ctx, cmd)
	}
}

func (h *holdDecisions) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// TestRebaseDoesNotWaitForABatch: a settlement's rebase runs while a
// batch of decisions is in flight (held here until the rebase is done),
// rather than queueing behind it for a round trip.
func TestRebaseDoesNotWaitForABatch(t *testing.T) {
	ctx := context.Background()
	base := testenv.RedisClient(t)
	c := redis.NewClient(base.Options())
	t.Cleanup(func() { c.Close() })
	s := newRedisStore(t, c, redisstore.Options{Timeout: 5 * time.Second})
	k := bucket.Key{Rule: "rebase-alone", Subject: fmt.Sprint(rand.Int64())}
	if _, err := s.Peek(ctx, k, bucket.PerSecond(10)); err != nil { // loads the script
		t.Fatal(err)
	}
	h := &holdDecisions{release: make(chan struct{}), held: make(chan struct{})}
	c.AddHook(h)
	decided := make(chan error, 1)
	go func() {
		_, err := s.Decide(ctx, k, bucket.PerSecond(10), 1, "")
		decided <- err
	}()
	<-h.held
	rebased := make(chan error, 1)
	go func() {
		_, err := s.Rebase(ctx, k, bucket.PerSecond(10), bucket.PerSecond(20), 0)
		rebased <- err
	}()
	select {
	case err := <-rebased:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(3 * time.Second):
		close(h.release)
		<-decided
		t.Fatal("the rebase waited for the batch in flight")
	}
	close(h.release)
	if err := <-decided; err != nil {
		t.Fatal(err)
	}
}
