package agent

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/redisstore"
	"github.com/allot-dev/allot/clock"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// failoverAgent is an agent on client c whose rules empty their buckets
// after a failover, on a manual clock (so no bucket refills), with
// deadlines long enough for a loaded host: the failover tests poll it by
// hand (pollFailover) and read what the core did.
func failoverAgent(t *testing.T, c redis.UniversalClient) (*Agent, *clock.Manual) {
	t.Helper()
	clk := clock.NewManual(time.Date(2026, 12, 2, 0, 0, 0, 0, time.UTC))
	rs, err := redisstore.New(c, redisstore.Options{Prefix: "allot-test-" + t.Name() + ":", Timeout: 5 * time.Second, Now: clk.Now})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Name, cfg.Core.Region = "eu-0", "eu"
	cfg.Core.Floors = lease.Split{Regions: []string{"eu"}}
	cfg.Core.DefaultRule = region.RuleConfig{OnUnavailable: rules.FailClosed, EmptyOnFailover: true}
	cfg.Core.Timeout, cfg.Core.MaxTimeout = 2*time.Second, 5*time.Second
	// The breaker stays out of it: these tests are about detection.
	cfg.Core.BreakerFailures, cfg.Core.BreakerRatio = 1000, 1
	a, err := New(cfg, Deps{Store: rs, Redis: c, Clock: clk, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	return a, clk
}

// waitFailovers polls a for failovers until it has counted want, within d.
func waitFailovers(t *testing.T, a *Agent, clk *clock.Manual, want int64, d time.Duration, what string) {
	t.Helper()
	deadline := time.Now().Add(d)
	for a.Core().Stats().Failovers < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s not detected within %s (failovers %d, want %d)", what, d, a.Core().Stats().Failovers, want)
		}
		time.Sleep(100 * time.Millisecond) // waiting for Redis to fail over, not for time to pass
		a.pollFailover(context.Background(), clk.Now())
	}
	if n := a.Core().Stats().Failovers; n != want {
		t.Fatalf("after %s: %d failovers, want %d", what, n, want)
	}
}

// decideN decides n requests of cost 1 on k (100/s, burst 100) and
// returns how many were admitted.
func decideN(t *testing.T, a *Agent, clk *clock.Manual, k bucket.Key, n int) int {
	t.Helper()
	admitted := 0
	for range n {
		d, err := a.Store().Decide(context.Background(), k, bucket.PerSecond(100), 1, "")
		if err != nil {
			t.Fatalf("decide %v: %v", k, err)
		}
		if d.Allowed {
			admitted++
		}
	}
	return admitted
}

// TestSentinelFailoverDetected: a primary, a replica and three real
// Sentinels (quorum 2). Polls with nothing happening count no failover.
// The primary is killed; once the Sentinels promote the replica, the
// agent (on a Sentinel client) notices the new run id and role, and a
// bucket that still held tokens on the old primary starts empty.
func TestSentinelFailoverDetected(t *testing.T) {
	s := testenv.StartSentinels(t, 3)
	c := redisstore.NewUniversalClient(s.Addrs, s.Master, "")
	t.Cleanup(func() { c.Close() })
	a, clk := failoverAgent(t, c)
	for range 3 {
		a.pollFailover(context.Background(), clk.Now())
	}
	if n := a.Core().Stats().Failovers; n != 0 {
		t.Fatalf("%d failovers with none, want 0", n)
	}
	k := bucket.Key{Rule: "api", Subject: "sentinel"}
	if got := decideN(t, a, clk, k, 60); got != 60 {
		t.Fatalf("admitted %d of 60 from a full bucket of 100", got)
	}
	s.Primary.Kill()
	began := time.Now()
	deadline := began.Add(30 * time.Second)
	for {
		if addr, err := s.MasterAddr(context.Background()); err == nil && addr == s.Replica.Addr {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the sentinels did not promote the replica within 30 s")
		}
		time.Sleep(100 * time.Millisecond) // waiting for the sentinels
	}
	waitFailovers(t, a, clk, 1, 20*time.Second, "the sentinel failover")
	t.Logf("promoted and detected %s after the kill", time.Since(began).Round(time.Millisecond))
	// The replica had the 60 tokens taken (or lost them in the lag); the
	// failover drains the rest.
	if got := decideN(t, a, clk, k, 40); got != 0 {
		t.Fatalf("admitted %d after the failover, want 0 (the bucket starts empty)", got)
	}
}

// TestClusterFailoverDetected: a real Redis Cluster of three primaries,
// each with a replica. Polls with nothing happening count no failover. A
// CLUSTER FAILOVER on one shard's replica is detected as one failover;
// then another shard's primary is killed and its replica promoted, a
// second. After each, a bucket that still held tokens starts empty.
func TestClusterFailoverDetected(t *testing.T) {
	if testing.Short() {
		t.Skip("starts six redis-server processes")
	}
	rc := testenv.StartRedisClusterReplicas(t, 3, 1)
	c := redisstore.NewUniversalClient(rc.Addrs(), "", "")
	t.Cleanup(func() { c.Close() })
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("client %T, want a Cluster client", c)
	}
	a, clk := failoverAgent(t, c)
	for range 3 {
		a.pollFailover(context.Background(), clk.Now())
	}
	if n := a.Core().Stats().Failovers; n != 0 {
		t.Fatalf("%d failovers with none, want 0", n)
	}
	role := func(s *testenv.RedisServer) string {
		cl := redis.NewClient(&redis.Options{Addr: s.Addr})
		defer cl.Close()
		info, err := cl.Info(context.Background(), "replication").Result()
		if err != nil {
			return ""
		}
		return infoField(info, "role")
	}
	var replica *testenv.RedisServer
	for _, s := range rc.Servers {
		if role(s) == "slave" {
			replica = s
			break
		}
	}
	if replica == nil {
		t.Fatal("no replica in the cluster")
	}

	k1 := bucket.Key{Rule: "api", Subject: "manual"}
	if got := decideN(t, a, clk, k1, 60); got != 60 {
		t.Fatalf("admitted %d of 60 from a full bucket of 100", got)
	}
	cl := redis.NewClient(&redis.Options{Addr: replica.Addr})
	defer cl.Close()
	if err := cl.ClusterFailover(context.Background()).Err(); err != nil {
		t.Fatalf("CLUSTER FAILOVER on %s: %v", replica.Addr, err)
	}
	began := time.Now()
	waitFailovers(t, a, clk, 1, 20*time.Second, "CLUSTER FAILOVER")
	t.Logf("CLUSTER FAILOVER detected after %s", time.Since(began).Round(time.Millisecond))
	if r := role(replica); r != "master" {
		t.Fatalf("the replica's role %q after CLUSTER FAILOVER, want master", r)
	}
	if got := decideN(t, a, clk, k1, 40); got != 0 {
		t.Fatalf("admitted %d after CLUSTER FAILOVER, want 0 (the bucket starts empty)", got)
	}

	// Every bucket refills from the first failover (a key first used
	// after a failover is drained to it too).
	clk.Advance(2 * time.Second)
	k2 := bucket.Key{Rule: "api", Subject: "killed"}
	if got := decideN(t, a, clk, k2, 60); got != 60 {
		t.Fatalf("admitted %d of 60 from a full bucket of 100", got)
	}
	var victim *testenv.RedisServer
	for _, s := range rc.Servers {
		if s != replica && role(s) == "master" {
			victim = s
			break
		}
	}
	victim.Kill()
	began = time.Now()
	waitFailovers(t, a, clk, 2, 30*time.Second, "a killed primary's replacement")
	t.Logf("a killed primary's replacement detected after %s", time.Since(began).Round(time.Millisecond))
	if err := rc.WaitOK(20 * time.Second); err != nil {
		t.Fatal(err)
	}
	got := 0
	deadline := time.Now().Add(10 * time.Second)
	for {
		d, err := a.Store().Decide(context.Background(), k2, bucket.PerSecond(100), 1, "")
		if err == nil {
			if d.Allowed {
				got++
			}
			break
		}
		if time.Now().After(deadline) || !errors.Is(err, bucket.ErrUnavailable) {
			t.Fatalf("decide after the kill: %v", err)
		}
		time.Sleep(100 * time.Millisecond) // the client finds the new primary
	}
	got += decideN(t, a, clk, k2, 39)
	if got != 0 {
		t.Fatalf("admitted %d after the kill, want 0 (the bucket starts empty)", got)
	}
}
