// Package sim is a deterministic discrete-event simulator of allot and of the
// usual alternatives, run on the same arrivals in the same run.
//
// The model: one virtual clock (integer microseconds since the start of the
// run), one heap of events ordered by (time, sequence number), and one
// seeded random source. Nothing reads the wall clock and nothing runs
// concurrently, so a scenario and a seed give byte-identical results; a
// failing run prints its seed and replays exactly.
//
// Every node — an agent, a regional Redis primary or replica, a coordinator —
// has its own clock, a function of virtual time with an offset (skew) and a
// rate error (drift). The code under test sees only its node's clock.
// Messages between nodes cross simulated links whose one-way latency comes
// from the scenario's region latency matrix, with jitter, loss and
// time-windowed partitions.
//
// The simulator drives the real code: every agent is a region.Core deciding
// through a bucket.Store on a model of its regional Redis, whose buckets are
// bucket.Decide, TakeUpTo, Return and Peek on bucket.State at the primary's
// clock, as the Lua script evaluates them, and with the region's table as
// it last loaded it from the regional Redis; every region's speaking agent
// runs a region.Speaker, driven as the agent's lease client drives it
// (settle, publish the table, send), and the coordinator leader runs a
// lease.Allocator, exchanging their messages over the simulated network.
// The simulator itself models only what is not code in the project: the
// network, the Redis server and its replication, the clocks, membership,
// the traffic and the measurement.
//
// What it measures, per budget: overshoot (the largest amount by which the
// tokens admitted in any window [s,e] exceed B + R·(e−s), computed exactly
// over all windows in linear time), utilization against an ideal global
// bucket fed the same arrivals (each second's use capped at the ideal's, so
// overshoot never counts as use; per rule, its worst budget and the mean),
// false rejects, decision latency by path, Redis operations per decision and
// coordinator messages per second, overall and in steady state; and it
// checks the measured overshoot against the bound the design states for the
// scenario's faults.
package sim
