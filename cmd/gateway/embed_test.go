package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"

	"github.com/allot-dev/allot/coordinator"
	"github.com/allot-dev/allot/internal/testenv"
	"github.com/allot-dev/allot/lease"
	"github.com/allot-dev/allot/region"
	"github.com/allot-dev/allot/rules"
)

// TestEmbeddedAgent runs two gateways of region eu with the agent in
// process (-region): they find each other over memberlist, one of them
// holds the region's lease from a real coordinator on loopback, and both
// decide on the region's shared Redis buckets, so a tenant's requests
// spread over them are admitted within the budget once, not once per
// gateway.
func TestEmbeddedAgent(t *testing.T) {
	set, err := rules.Parse(exampleRules, "embedded rules.yaml")
	if err != nil {
		t.Fatal(err)
	}
	spec := lease.Split{Regions: []string{"eu"}, Reserve: lease.DefaultReserve}
	cfg := coordinator.DefaultConfig()
	cfg.Lease.Budgets = region.Budgets(set, spec, lease.MaxMin)
	cfg.Lease.TTL, cfg.Lease.Refresh, cfg.Lease.Drift, cfg.Lease.Hold, cfg.Lease.DemandTTL = 2*time.Second, 500*time.Millisecond, 100*time.Millisecond, 3500*time.Millisecond, 1200*time.Millisecond
	cfg.Insecure, cfg.Logger = true, slog.New(slog.DiscardHandler) // loopback: the regions name themselves
	coord, err := coordinator.NewServer(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := coord.BecomeLeader(1); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go coord.Run(ctx)
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	g := grpc.NewServer(coordinator.ServerOptions()...)
	coord.Register(g)
	go g.Serve(lis)
	t.Cleanup(g.Stop)

	redisAddr := testenv.StartRedis(t).Addr
	p1, p2 := testenv.FreePort(t), testenv.FreePort(t)
	common := []string{"-grpc", "", "-region", "eu", "-regions", "eu", "-coordinators", lis.Addr().String(), "-redis", redisAddr}
	a := start(t, append(common, "-agent-name", "gw-a", "-gossip-bind", fmt.Sprintf("127.0.0.1:%d", p1))...)
	b := start(t, append(common, "-agent-name", "gw-b", "-gossip-bind", fmt.Sprintf("127.0.0.1:%d", p2),
		"-gossip-join", fmt.Sprintf("127.0.0.1:%d", p1))...)

	// Membership and the lease are real memberlist and gRPC: wait until
	// both gateways see two agents and the region's lease lives.
	members := regexp.MustCompile(`(?m)^allot_region_members\{[^}]*\} (\d+)$`)
	live := regexp.MustCompile(`(?m)^allot_region_lease_live\{[^}]*\} (\d+)$`)
	deadline := time.Now().Add(20 * time.Second)
	for {
		ma, mb := metricsOf(t, a), metricsOf(t, b)
		if value(members, ma) == 2 && value(members, mb) == 2 && value(live, ma) == 1 && value(live, mb) == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 20 s: members %v/%v, lease live %v/%v", value(members, ma), value(members, mb), value(live, ma), value(live, mb))
		}
		time.Sleep(100 * time.Millisecond)
	}

	// The free plan is 10 a minute; eu, the budget's only region, has a
	// floor of two thirds of it and the rest through its lease. Gateways
	// deciding on buckets of their own would admit a floor each (12); on
	// the region's shared buckets, under the lease, at most 10 pass.
	tenant := "embedded-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	allowed := [2]int{}
	for i := range 30 {
		if r := get(t, []Ready{a, b}[i%2], "/items", "X-Tenant", tenant); r.status == http.StatusOK {
			allowed[i%2]++
		} else if r.status != http.StatusTooManyRequests {
			t.Fatalf("request %d: status %d (%s)", i, r.status, r.body)
		}
	}
	if allowed[0] == 0 || allowed[1] == 0 || allowed[0]+allowed[1] > 10 {
		t.Fatalf("admitted %d and %d of 15 each: want both some, together at most the budget's 10", allowed[0], allowed[1])
	}
	t.Logf("admitted %d + %d of 30 across two embedded agents", allowed[0], allowed[1])
}

func metricsOf(t *testing.T, r Ready) string {
	t.Helper()
	res, err := http.Get("http://" + r.HTTP + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return string(b)
}

// value is the first sample re matches in text, -1 without one.
func value(re *regexp.Regexp, text string) int {
	m := re.FindStringSubmatch(text)
	if m == nil {
		return -1
	}
	n, _ := strconv.Atoi(strings.TrimSpace(m[1]))
	return n
}

func TestEmbeddedFlags(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-coordinators", "127.0.0.1:1"}, `-coordinators="127.0.0.1:1" needs -region`},
		{[]string{"-region", "eu", "-agent", "127.0.0.1:1"}, "exclude each other"},
		{[]string{"-region", "eu", "-coordinators", "127.0.0.1:1"}, "needs -regions"},
		{[]string{"-region", "eu", "-gossip-join", "127.0.0.1:1"}, "needs -gossip-bind"},
		{[]string{"-region", "eu", "-coordinator-ca", "ca.pem"}, "need -coordinators"},
		{[]string{"-region", "eu", "-gossip-bind", "127.0.0.1:7946"}, "needs -redis"},
	} {
		if _, err := parseFlags(tc.args, io.Discard); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%q: %v, want %q", tc.args, err, tc.want)
		}
	}
}
