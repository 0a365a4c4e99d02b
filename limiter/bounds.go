package limiter

import (
	"errors"
	"flag"
	"fmt"
)

// ErrTooLarge: a request field is larger than the Bounds allow. Errors
// wrapping it also wrap ErrInvalidRequest.
var ErrTooLarge = errors.New("limiter: request field too large")

// Bounds limits what one request may carry. Every field a store may keep
// (the subject, descriptor values that build a subject, the plan, the
// attempt id) is bounded, so a caller cannot make a store hold megabytes per
// key, and the number of descriptor entries is bounded, so matching costs a
// bounded time. The zero value means DefaultBounds.
type Bounds struct {
	// MaxSubject is the most bytes Request.Subject may have.
	MaxSubject int
	// MaxValue is the most bytes one descriptor key or value, the plan or
	// the rule name may have. The attempt id may have MaxSubject + 1 +
	// MaxValue bytes: room for an idempotency key qualified by its subject.
	MaxValue int
	// MaxEntries is the most entries one descriptor may have.
	MaxEntries int
}

// DefaultBounds returns the bounds used when none are set.
func DefaultBounds() Bounds {
	return Bounds{
		MaxSubject: 256, // a tenant id, an API key id, a UUID or an e-mail address, with room
		MaxValue:   512, // a URL path or a header value of ordinary length
		MaxEntries: 64,  // far more than a rule matches on
	}
}

// OrDefault returns b, or DefaultBounds when b is the zero value.
func (b Bounds) OrDefault() Bounds {
	if b == (Bounds{}) {
		return DefaultBounds()
	}
	return b
}

// Validate reports a bound that is not positive.
func (b Bounds) Validate() error {
	switch {
	case b.MaxSubject <= 0:
		return fmt.Errorf("limiter: bounds max_subject=%d must be > 0", b.MaxSubject)
	case b.MaxValue <= 0:
		return fmt.Errorf("limiter: bounds max_value=%d must be > 0", b.MaxValue)
	case b.MaxEntries <= 0:
		return fmt.Errorf("limiter: bounds max_entries=%d must be > 0", b.MaxEntries)
	}
	return nil
}

// RegisterFlags defines -max-subject-bytes, -max-value-bytes and
// -max-descriptor-entries on fs with b's values as defaults, writing into b:
// every process names its bounds alike.
func (b *Bounds) RegisterFlags(fs *flag.FlagSet) {
	fs.IntVar(&b.MaxSubject, "max-subject-bytes", b.MaxSubject, "longest subject (identity) a request may carry; beyond it the request is refused (400/431, INVALID_ARGUMENT)")
	fs.IntVar(&b.MaxValue, "max-value-bytes", b.MaxValue, "longest descriptor key or value, plan or rule name a request may carry")
	fs.IntVar(&b.MaxEntries, "max-descriptor-entries", b.MaxEntries, "most entries one descriptor may have")
}

// MaxAttemptID is the most bytes an attempt id may have.
func (b Bounds) MaxAttemptID() int { return b.MaxSubject + 1 + b.MaxValue }

// BoundError is a request field over its bound. It wraps ErrTooLarge and
// ErrInvalidRequest.
type BoundError struct {
	// Field names the field: subject, plan, rule, attempt_id, descriptor,
	// descriptor[i].key or descriptor[i].value.
	Field string
	// Key is the descriptor entry's key, for a descriptor value; transports
	// use it to say where the value came from (a header, the path).
	Key string
	// Size is the field's size (bytes, or entries for descriptor), Max its
	// bound.
	Size, Max int
}

func (e *BoundError) Error() string {
	unit := "bytes"
	if e.Field == "descriptor" {
		unit = "entries"
	}
	field := e.Field
	if e.Key != "" {
		field = fmt.Sprintf("%s (key %q)", e.Field, truncate(e.Key, 64))
	}
	return fmt.Sprintf("limiter: %s has %d %s, more than the %d allowed", field, e.Size, unit, e.Max)
}

// Unwrap lets errors.Is match ErrTooLarge and ErrInvalidRequest.
func (e *BoundError) Unwrap() []error { return []error{ErrTooLarge, ErrInvalidRequest} }

// Check returns a *BoundError for the first field of req over its bound,
// nil when req is within b (DefaultBounds when b is zero). It allocates
// nothing when req is within its bounds.
func (b Bounds) Check(req Request) error {
	b = b.OrDefault()
	return b.check(&req)
}

// check is Check on bounds already defaulted, reading req in place.
func (b *Bounds) check(req *Request) error {
	// The common case, every field within its bounds, with a branch per
	// bound rather than per field: the bitwise or of lengths is at least
	// the longest of them, so within a bound it puts all of them within.
	if len(req.Descriptor) <= b.MaxEntries && len(req.Subject) <= b.MaxSubject && len(req.AttemptID) <= b.MaxAttemptID() {
		n := len(req.Plan) | len(req.Rule)
		for i := range req.Descriptor {
			e := &req.Descriptor[i] // in place: ranging by value copies each entry
			n |= len(e.Key) | len(e.Value)
		}
		if n <= b.MaxValue {
			return nil
		}
	}
	return b.over(req)
}

// over is check on a request over some bound: the first field over its
// bound, in the order the fields are documented.
func (b *Bounds) over(req *Request) error {
	switch {
	case len(req.Subject) > b.MaxSubject:
		return &BoundError{Field: "subject", Size: len(req.Subject), Max: b.MaxSubject}
	case len(req.Plan) > b.MaxValue:
		return &BoundError{Field: "plan", Size: len(req.Plan), Max: b.MaxValue}
	case len(req.Rule) > b.MaxValue:
		return &BoundError{Field: "rule", Size: len(req.Rule), Max: b.MaxValue}
	case len(req.AttemptID) > b.MaxAttemptID():
		return &BoundError{Field: "attempt_id", Size: len(req.AttemptID), Max: b.MaxAttemptID()}
	case len(req.Descriptor) > b.MaxEntries:
		return &BoundError{Field: "descriptor", Size: len(req.Descriptor), Max: b.MaxEntries}
	}
	for i := range req.Descriptor {
		e := &req.Descriptor[i] // in place: ranging by value copies each entry
		if len(e.Key) > b.MaxValue {
			return &BoundError{Field: fmt.Sprintf("descriptor[%d].key", i), Size: len(e.Key), Max: b.MaxValue}
		}
		if len(e.Value) > b.MaxValue {
			return &BoundError{Field: fmt.Sprintf("descriptor[%d].value", i), Key: e.Key, Size: len(e.Value), Max: b.MaxValue}
		}
	}
	return nil
}

// truncate shortens s to at most n bytes for an error message.
func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}
