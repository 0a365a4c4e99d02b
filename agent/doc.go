// Package agent runs a region's agent: the drivers around the
// deterministic core in package region. cmd/agent, cmd/demo and any Go
// gateway that embeds an agent import it.
//
// Agent ticks its region.Core on a clock, keeps membership of the region's
// agents (Gossip, over hashicorp/memberlist; StaticMembership for a fixed
// set), and, on the one agent that speaks for the region, runs the lease
// client: the region's end of the lease protocol over a lease.Transport
// (coordinator.Client in production, LocalCoordinator in process), with
// the allocation table published to the regional Redis (RedisShared;
// MemShared in process) so every agent of the region decides with the same
// one. It also polls the regional Redis for failovers and exports
// Prometheus metrics (Metrics).
package agent
