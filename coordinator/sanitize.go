package coordinator

import (
	"cmp"
	"fmt"
	"slices"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/lease"
)

// Limits bounds what one region may send. A region is trusted to speak
// only for itself; these bounds keep a buggy or compromised one from
// crashing the coordinator, holding its memory, or feeding the Allocator
// values no honest region could send.
type Limits struct {
	// MaxMessageBytes bounds one message on the wire (gRPC's receive limit
	// on the lease stream); a larger message ends the stream.
	MaxMessageBytes int
	// MaxReportKeys bounds the demand entries, and separately the held
	// entries, of one message; beyond it the keys with the largest values
	// are kept and the rest dropped.
	MaxReportKeys int
	// MaxKeyBytes bounds a key's rule plus subject; a longer key is dropped.
	MaxKeyBytes int
}

// DefaultLimits fit the largest report an honest region sends: 200,000
// keys whose subjects have the 256 bytes the edge allows take about 57 MB
// on the wire.
func DefaultLimits() Limits {
	return Limits{
		MaxMessageBytes: MaxMessageSize, // 64 MiB: 200,000 keys of 256-byte subjects, with room
		MaxReportKeys:   200_000,        // twice the 100,000 hot keys the allocator is sized for
		MaxKeyBytes:     2048,           // a subject built from a few descriptor values of 512 bytes
	}
}

// Validate reports a bound that is not positive.
func (l Limits) Validate() error {
	switch {
	case l.MaxMessageBytes <= 0:
		return fmt.Errorf("%w: max_message_bytes=%d must be > 0", ErrInvalidConfig, l.MaxMessageBytes)
	case l.MaxReportKeys <= 0:
		return fmt.Errorf("%w: max_report_keys=%d must be > 0", ErrInvalidConfig, l.MaxReportKeys)
	case l.MaxKeyBytes <= 0:
		return fmt.Errorf("%w: max_key_bytes=%d must be > 0", ErrInvalidConfig, l.MaxKeyBytes)
	}
	return nil
}

// sanitized counts what sanitize changed in one message.
type sanitized struct {
	clipped int // entries beyond MaxReportKeys
	dropped int // entries with an unknown rule or a key over MaxKeyBytes
	clamped int // values outside [0, the budget's count or burst]
}

func (s sanitized) any() bool { return s.clipped+s.dropped+s.clamped > 0 }

// sanitize makes a region's message one an honest region could have sent:
// only the fields of an upward message, entries of known budgets with keys
// within MaxKeyBytes, counts and wants within [0, the budget's count]
// (bursts, and an acknowledgement's returns, within [0, its burst]), and
// at most MaxReportKeys of each list,
// keeping the largest. Every count then lies in what the Allocator's
// arithmetic was written for: no sum over a budget's regions can overflow,
// and no negative value can read as free capacity. budgets maps rules to
// the budgets served.
func sanitize(m lease.Message, budgets map[string]lease.Budget, lim Limits) (lease.Message, sanitized) {
	var n sanitized
	up := lease.Message{Type: m.Type, Region: m.Region, Session: m.Session, Term: m.Term, Seq: m.Seq,
		Grant: m.Grant, Version: m.Version}
	keep := func(k bucket.Key) (lease.Budget, bool) {
		b, ok := budgets[k.Rule]
		if !ok || len(k.Rule)+len(k.Subject) > lim.MaxKeyBytes {
			n.dropped++
			return b, false
		}
		return b, true
	}
	clamp := func(v, hi bucket.Tokens) bucket.Tokens {
		if v < 0 || v > hi {
			n.clamped++
			return min(max(v, 0), hi)
		}
		return v
	}
	for _, d := range m.Demand {
		if b, ok := keep(d.Key); ok {
			up.Demand = append(up.Demand, lease.Demand{Key: d.Key, Want: clamp(d.Want, b.Limit.Count())})
		}
	}
	for _, e := range m.Entries {
		if b, ok := keep(e.Key); ok {
			up.Entries = append(up.Entries, lease.Entry{Key: e.Key, Count: clamp(e.Count, b.Limit.Count()),
				Burst: clamp(e.Burst, b.Limit.Burst()), Drop: e.Drop})
		}
	}
	if m.Type == lease.MsgAck {
		for _, r := range m.Returns {
			if b, ok := keep(r.Key); ok {
				up.Returns = append(up.Returns, lease.Return{Key: r.Key, Tokens: clamp(r.Tokens, b.Limit.Burst())})
			}
		}
	}
	if len(up.Returns) > lim.MaxReportKeys {
		slices.SortStableFunc(up.Returns, func(a, b lease.Return) int { return cmp.Compare(b.Tokens, a.Tokens) })
		n.clipped += len(up.Returns) - lim.MaxReportKeys
		up.Returns = slices.Clip(up.Returns[:lim.MaxReportKeys])
	}
	if len(up.Demand) > lim.MaxReportKeys {
		slices.SortStableFunc(up.Demand, func(a, b lease.Demand) int { return cmp.Compare(b.Want, a.Want) })
		n.clipped += len(up.Demand) - lim.MaxReportKeys
		up.Demand = slices.Clip(up.Demand[:lim.MaxReportKeys])
	}
	if len(up.Entries) > lim.MaxReportKeys {
		slices.SortStableFunc(up.Entries, func(a, b lease.Entry) int { return cmp.Compare(b.Count, a.Count) })
		n.clipped += len(up.Entries) - lim.MaxReportKeys
		up.Entries = slices.Clip(up.Entries[:lim.MaxReportKeys])
	}
	return up, n
}
