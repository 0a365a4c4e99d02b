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
	"strings"
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
	if low := ephemeralLow(); low-lowest >= 1000 {
		start := lowest + rand.IntN(low-lowest)
		for i := range 500 {
			p := lowest + (start-lowest+i*7919)%(low-lowest)
			if !given[p] && free(p) {
				given[p] = true
				return p, nil
			}
		}
	}
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return 0, fmt.Errorf("loopback: free port: %w", err)
		}
		p := l.Addr().(*net.TCPAddr).Port
		_ = l.Close() // only the port number was wanted
		if !given[p] && free(p) {
			given[p] = true
			return p, nil
		}
	}
	return 0, errors.New("loopback: no free port after 100 tries")
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
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	low, err := strconv.Atoi(f[0])
	if err != nil {
		return 0
	}
	return low
}
