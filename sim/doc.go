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
// The simulator drives the real code: bucket decisions are bucket.Decide,
// bucket.TakeUpTo and bucket.Return on bucket.State, evaluated at the Redis
// primary's clock, exactly as the regional Redis script evaluates them.
//
// What it measures, per budget: overshoot (the largest amount by which the
// tokens admitted in any window [s,e] exceed B + R·(e−s), computed exactly
// over all windows in linear time), utilization against an ideal global
// bucket fed the same arrivals, false rejects, decision latency by path,
// Redis operations per decision and coordinator messages per second; and it
// checks the measured overshoot against the bound the design states for the
// scenario's faults.
package sim
