// Package chaos runs allot's real binaries under real faults and judges
// what they admitted.
//
// A run starts real processes on loopback — coordinators (three on a real
// etcd, or one standalone), and per region a redis-server (with a replica
// and three sentinels where the scenario asks) and its agents joined by
// memberlist — and puts a TCP fault proxy of its own on every link to a
// coordinator or a Redis server: one per agent in front of its region's
// Redis, and one shared proxy in front of each coordinator (and each Redis
// of a Sentinel region) that attributes a connection to the process that
// opened it (its socket, found through sock_diag and /proc). So a fault can
// cut, delay or cut one way the links of one agent or one region while the
// others pass. Kills are kill -9 of the real process: the coordinator
// leader, the region's speaking agent, a Redis primary; restarts reuse the
// same ports.
//
// Load is open loop over Envoy's rate limit service v3 (the agents' gRPC
// port): Poisson arrivals per traffic stream, sent whether or not earlier
// ones were answered, and every decision is recorded with its send and
// answer instants. The checker counts an admission inside a window only if
// it certainly happened there (sent at or after the window's start and
// answered by its end) and reports, per budget and per fault, the largest
// excess over B + R·t against the bound the design's fault table states for
// that fault, derived from configuration and the fault alone. It also
// reports utilization against min(offered, B + R·T), convergence to the
// fair share after each demand shift, and the promises of the failure
// handling: one speaker per region, a region back at its share soon after
// its Redis returns, no emergency admissions after the outage, and no
// breaker opened by a healthy Redis.
//
// Scenarios are the simulator's scenario files (package sim) with an
// optional chaos block for what only the harness does (processes, faults
// the simulator cannot express, the expected verdict), so one file drives
// both and the two results sit side by side.
package chaos
