// Package coordinator is allot's control plane around the lease
// allocator: a gRPC server that carries each region's lease stream to a
// lease.Allocator, the leader election and budget store on etcd that make
// several coordinators one, the client-side stream driver regions use to
// reach whichever coordinator leads, metrics and a status page.
//
// The Server owns no policy: every decision is the lease.Allocator's, a
// deterministic state machine the Server ticks from its clock and feeds the
// messages it receives, in arrival order, under one mutex. Messages the
// Allocator emits go to the addressed region's stream, or are dropped when
// the region is not connected; the protocol tolerates loss.
//
// A coordinator is a leader or a follower. A follower answers every stream
// with a redirect naming the leader. Standalone mode makes the process the
// leader of its own term at start (the start time in milliseconds, so a
// restart always fences the previous incarnation); HA mode campaigns in an
// etcd election and uses the revision of its leader key as the term. The
// cluster's first leader records itself in etcd (LedKey) and leads with a
// lease.NewFirstAllocator, whose reserves start full; every later leader
// finds the record. A standalone process, which may be a restart of
// itself, never leads as the first.
package coordinator
