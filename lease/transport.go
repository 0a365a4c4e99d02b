package lease

import (
	"context"
	"errors"
)

// Transport opens lease streams to the coordinator for a region's speaking
// agent. coordinator.Client is the production one (gRPC, trying every
// configured coordinator and following leader redirects); the agent's
// in-process coordinator and tests have their own. Each stream it returns
// reaches a coordinator that can answer, or ends with a redirect.
type Transport interface {
	// Connect opens a stream; it blocks until one is open or ctx ends.
	Connect(ctx context.Context) (Stream, error)
}

// Stream is one open lease stream between a region and the coordinator.
// Send and Recv may be called from different goroutines.
type Stream interface {
	Send(m Message) error
	// Recv blocks for the next message; an error ends the stream.
	Recv() (Message, error)
	// Close ends the stream; a Recv blocked on it returns an error.
	Close() error
}

// ErrStreamClosed is returned by a stream that either end has closed.
var ErrStreamClosed = errors.New("lease: stream closed")
