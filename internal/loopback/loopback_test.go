package loopback

import (
	"net"
	"strconv"
	"testing"
)

// TestPortBelowTheEphemeralRange: where the kernel says its ephemeral
// range, every port picked lies below it (outgoing connections cannot take
// it), can be bound for TCP and UDP, and is never given twice.
func TestPortBelowTheEphemeralRange(t *testing.T) {
	low := ephemeralLow()
	given := map[int]bool{}
	for range 50 {
		p, err := Port(given)
		if err != nil {
			t.Fatal(err)
		}
		if low-lowest >= 1000 && (p < lowest || p >= low) {
			t.Fatalf("port %d outside [%d, %d): the ephemeral range starts at %d", p, lowest, low, low)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		_ = l.Close()
	}
	if len(given) != 50 {
		t.Fatalf("%d ports given for 50 picks, want 50 distinct", len(given))
	}
}
