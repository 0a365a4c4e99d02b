package redisstore

// Slot exposes the Cluster hash slot the store groups operations by, so a
// test can compare it with the server's CLUSTER KEYSLOT.
var Slot = slot

// ScriptSource is the Lua script, for benchmarks that time parts of it.
var ScriptSource = scriptSource
