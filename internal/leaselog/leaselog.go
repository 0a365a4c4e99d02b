// Package leaselog logs lease messages at debug level, the same way at
// both ends of the protocol: the coordinator's server and the speaking
// agent's lease client.
package leaselog

import (
	"context"
	"log/slog"

	"github.com/allot-dev/allot/lease"
)

// Keys is how many of a message's entries, demands and returns a record
// lists; the rest are counted.
const Keys = 16

// Trace logs m as msg with its direction (up: region to coordinator; down:
// the other way), its summary and its keys with their values, at debug
// level: off unless log's level is debug, where it costs one level check.
func Trace(log *slog.Logger, msg, dir string, m lease.Message) {
	ctx := context.Background()
	if !log.Enabled(ctx, slog.LevelDebug) {
		return
	}
	log.LogAttrs(ctx, slog.LevelDebug, msg, slog.String("dir", dir),
		slog.String("msg", m.String()), slog.String("keys", m.Keys(Keys)))
}
