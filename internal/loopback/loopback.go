// Package loopback picks loopback ports for the servers that tests and the
// chaos harness start as separate processes, which bind them a moment after
// they are picked.
package loopback

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
)

// lowest is the lowest port Port picks.
const lowest = 10000

// Port returns a loopback port that was free for TCP and UDP (memberlist
// binds both) a moment ago and is not in given, which it marks. It picks
// below the kernel's ephemeral range (ip_local_port_range), from which
// the kernel hands out ports to outgoing connections and to listeners on
// port 0: a port picked inside it, as a listener on port 0 picks, can be
// taken by any connection some process opens before the server binds it
// (a coordinator of the deploy test failed to start with "address already
// in use" that way). Where the range cannot be read or leaves no room below
// it, Port falls back to the kernel's choice.
func Port(given map[int]bool) (int, error) {
	n := ephemeralLow() - lowest
	for i := range 600 {
		var p int
		if i < 500 && n >= 1000 {
			p = lowest + rand.IntN(n)
		} else { // no room below the range: the kernel's choice
			l, err := net.Listen("tcp", "127.0.0.1:0")
			if err != nil {
				return 0, fmt.Errorf("loopback: free port: %w", err)
			}
			p = l.Addr().(*net.TCPAddr).Port
			_ = l.Close() // only the port number was wanted
		}
		if !given[p] && free(p) {
			given[p] = true
			return p, nil
		}
	}
	return 0, errors.New("loopback: no free port after 600 tries")
}

// free reports whether port p can be bound on loopback for TCP and UDP.
func free(p int) bool {
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return false
	}
	u, err := net.ListenPacket("udp", addr)
	_ = l.Close() // only the test of the port was wanted
	if err != nil {
		return false
	}
	_ = u.Close() // as above
	return true
}

// ephemeralLow returns the lowest port of the kernel's ephemeral range, or
// 0 when it cannot be read.
func ephemeralLow() int {
	var low int
	if b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range"); err == nil {
		_, _ = fmt.Sscan(string(b), &low) // low stays 0 if it does not parse
	}
	return low
}
