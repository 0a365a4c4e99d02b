package agent

import (
	"fmt"
	"net"
	"strconv"

	"github.com/allot-dev/allot/lease"
)

// Floors returns how every budget splits into floors for an agent of
// region, and whether the agent is alone. An agent alone — no coordinators,
// and regions empty or naming only its own — owns the whole of every
// budget: no coordinator holds a reserve for it to grant and no other
// region shares it. Any other agent takes the split the coordinator has
// (regions, weights, reserve) and stays on its floor while it has no lease,
// however long the coordinator is unreachable (I5). cmd/agent and
// cmd/gateway's embedded agent both take their floors from here.
func Floors(region string, regions []string, weights []int64, reserve float64, coordinated bool) (spec lease.Split, alone bool) {
	if !coordinated && (len(regions) == 0 || len(regions) == 1 && regions[0] == region) {
		return lease.Split{Regions: []string{region}}, true
	}
	return lease.Split{Regions: regions, Weights: weights, Reserve: reserve}, false
}

// HostPort splits a host:port flag value such as -gossip-bind into the
// host and the port number memberlist takes.
func HostPort(s string) (string, int, error) {
	host, port, err := net.SplitHostPort(s)
	if err != nil {
		return "", 0, err
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return "", 0, fmt.Errorf("port: %w", err)
	}
	return host, n, nil
}
