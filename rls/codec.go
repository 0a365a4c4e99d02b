package rls

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Codec is the gRPC codec of a server that serves the rate limit service:
// it reads a RateLimitRequest and writes a RateLimitResponse with code
// written for those two messages (protowire, no reflection, the request's
// descriptors and entries allocated together), and hands every other
// message to gRPC's proto codec. Both read and write the standard
// protobuf encoding, so clients see no difference; in this package's
// benchmark (BenchmarkCodec) they take a fraction of the proto codec's
// time and allocations.
//
// Unknown fields of a request are skipped rather than kept, which nothing
// here reads; a response with a field the hand-written encoder does not
// know (dynamic metadata, quota) goes to the proto codec.
//
// Install it with ServerOption. A server without it serves the same
// answers through the proto codec.
type Codec struct{}

var _ encoding.CodecV2 = Codec{}

// ServerOption makes a gRPC server use Codec for every call.
func ServerOption() grpc.ServerOption { return grpc.ForceServerCodecV2(Codec{}) }

// StreamWorkers is how many goroutines ServerOptions keeps to run calls.
// A call that finds them all busy (more in flight, each waiting on Redis)
// runs on a goroutine of its own, as without them.
const StreamWorkers = 128

// ServerOptions are the options of a gRPC server that serves decisions:
// Codec, and StreamWorkers long-lived goroutines that run the calls.
// Without them gRPC starts a goroutine per call whose stack grows, copied,
// on every call: 15–17% of the agent's CPU in a profile under load.
func ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{ServerOption(), grpc.NumStreamWorkers(StreamWorkers)}
}

// Name implements encoding.CodecV2: it replaces the proto codec, whose
// name clients ask for.
func (Codec) Name() string { return grpcproto.Name }

// Marshal implements encoding.CodecV2.
func (Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(*rlsv3.RateLimitResponse)
	if !ok || !encodable(m) {
		return protoCodec().Marshal(v)
	}
	size := sizeResponse(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		return mem.BufferSlice{mem.SliceBuffer(appendResponse(make([]byte, 0, size), m))}, nil
	}
	pool := mem.DefaultBufferPool()
	buf := pool.Get(size)
	*buf = appendResponse((*buf)[:0], m)
	return mem.BufferSlice{mem.NewBuffer(buf, pool)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return protoCodec().Unmarshal(data, v)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return UnmarshalRequest(buf.ReadOnlyData(), m)
}

// fieldError is the error of a field protowire.ConsumeField returned
// length l for: a parse error, or a field number above the largest valid
// one (which ConsumeField accepts and proto.Unmarshal refuses).
func fieldError(l int) error {
	if l < 0 {
		return protowire.ParseError(l)
	}
	return errors.New("invalid field number")
}

func protoCodec() encoding.CodecV2 { return encoding.GetCodecV2(grpcproto.Name) }

// errRequest is the error of a RateLimitRequest that is not valid
// protobuf.
var errRequest = errors.New("rls: malformed RateLimitRequest")

// UnmarshalRequest reads b, a RateLimitRequest in the protobuf encoding,
// into m as proto.Unmarshal would, except that unknown fields are skipped
// rather than kept. It fails on what proto.Unmarshal fails on (truncated
// or invalid encoding, a string that is not UTF-8).
func UnmarshalRequest(b []byte, m *rlsv3.RateLimitRequest) error {
	m.Reset()
	// The descriptors and their entries are counted first so that each
	// kind is allocated in one piece.
	nd, ne := 0, 0
	for rest := b; len(rest) > 0; {
		num, typ, l := protowire.ConsumeField(rest)
		if l < 0 || !num.IsValid() {
			return fmt.Errorf("%w: %w", errRequest, fieldError(l))
		}
		if num == 2 && typ == protowire.BytesType {
			nd++
			_, _, tl := protowire.ConsumeTag(rest)
			v, _ := protowire.ConsumeBytes(rest[tl:])
			n, err := countEntries(v)
			if err != nil {
				return err
			}
			ne += n
		}
		rest = rest[l:]
	}
	var a arena
	if nd > 0 {
		a.descs = make([]rlcommon.RateLimitDescriptor, nd)
		m.Descriptors = make([]*rlcommon.RateLimitDescriptor, 0, nd)
	}
	if ne > 0 {
		a.entries = make([]rlcommon.RateLimitDescriptor_Entry, ne)
		a.ptrs = make([]*rlcommon.RateLimitDescriptor_Entry, ne)
	}
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		b = b[l:] // ConsumeField above checked every field
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if !utf8.Valid(v) {
				return fmt.Errorf("%w: domain is not UTF-8", errRequest)
			}
			m.Domain = names.get(v)
			b = b[l:]
		case num == 2 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			d := &a.descs[len(m.Descriptors)]
			if err := unmarshalDescriptor(v, d, &a); err != nil {
				return err
			}
			m.Descriptors = append(m.Descriptors, d)
			b = b[l:]
		case num == 3 && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			m.HitsAddend = uint32(v)
			b = b[l:]
		default:
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
	}
	return nil
}

// arena holds a request's descriptors and entries, allocated together;
// each descriptor takes its entries from the front of entries and ptrs.
type arena struct {
	descs   []rlcommon.RateLimitDescriptor
	entries []rlcommon.RateLimitDescriptor_Entry
	ptrs    []*rlcommon.RateLimitDescriptor_Entry
}

// countEntries counts a descriptor's entries, checking its encoding.
func countEntries(b []byte) (int, error) {
	n := 0
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeField(b)
		if l < 0 || !num.IsValid() {
			return 0, fmt.Errorf("%w: descriptor: %w", errRequest, fieldError(l))
		}
		if num == 1 && typ == protowire.BytesType {
			n++
		}
		b = b[l:]
	}
	return n, nil
}

// unmarshalDescriptor reads a RateLimitDescriptor, whose encoding
// countEntries checked, into the zero d.
func unmarshalDescriptor(b []byte, d *rlcommon.RateLimitDescriptor, a *arena) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeTag(b)
		b = b[l:]
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if d.Entries == nil {
				// The entries of the descriptor are the next ones: the
				// count of its own is not known here, so it gets the rest
				// and the capacity is cut when it is done.
				d.Entries = a.ptrs[:0]
			}
			e := &a.entries[0]
			a.entries = a.entries[1:]
			if err := unmarshalEntry(v, e); err != nil {
				return err
			}
			d.Entries = append(d.Entries, e)
			b = b[l:]
		case num == 2 && typ == protowire.BytesType:
			// A limit override, which the rules ignore: rare, so the
			// proto package reads it, merging as it merges a repeated
			// singular message.
			v, l := protowire.ConsumeBytes(b)
			if d.Limit == nil {
				d.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{}
			}
			if err := (proto.UnmarshalOptions{Merge: true, DiscardUnknown: true}).Unmarshal(v, d.Limit); err != nil {
				return fmt.Errorf("%w: descriptor limit: %w", errRequest, err)
			}
			b = b[l:]
		case num == 3 && typ == protowire.BytesType:
			v, l := protowire.ConsumeBytes(b)
			if d.HitsAddend == nil {
				d.HitsAddend = &wrapperspb.UInt64Value{}
			}
			if err := unmarshalUInt64Value(v, d.HitsAddend); err != nil {
				return err
			}
			b = b[l:]
		case num == 4 && typ == protowire.VarintType:
			v, l := protowire.ConsumeVarint(b)
			d.IsNegativeHits = protowire.DecodeBool(v)
			b = b[l:]
		default:
			b = b[protowire.ConsumeFieldValue(num, typ, b):]
		}
	}
	if n := len(d.Entries); n > 0 {
		d.Entries = d.Entries[:n:n]
		a.ptrs = a.ptrs[n:]
	}
	return nil
}

// unmarshalEntry reads a descriptor entry into the zero e.
func unmarshalEntry(b []byte, e *rlcommon.RateLimitDescriptor_Entry) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeField(b)
		if l < 0 || !num.IsValid() {
			return fmt.Errorf("%w: entry: %w", errRequest, fieldError(l))
		}
		if (num == 1 || num == 2) && typ == protowire.BytesType {
			_, _, tl := protowire.ConsumeTag(b)
			v, _ := protowire.ConsumeBytes(b[tl:])
			if !utf8.Valid(v) {
				return fmt.Errorf("%w: entry key or value is not UTF-8", errRequest)
			}
			if num == 1 {
				e.Key = names.get(v)
			} else {
				e.Value = string(v)
			}
		}
		b = b[l:]
	}
	return nil
}

// unmarshalUInt64Value merges a google.protobuf.UInt64Value into w.
func unmarshalUInt64Value(b []byte, w *wrapperspb.UInt64Value) error {
	for len(b) > 0 {
		num, typ, l := protowire.ConsumeField(b)
		if l < 0 || !num.IsValid() {
			return fmt.Errorf("%w: hits_addend: %w", errRequest, fieldError(l))
		}
		if num == 1 && typ == protowire.VarintType {
			_, _, tl := protowire.ConsumeTag(b)
			w.Value, _ = protowire.ConsumeVarint(b[tl:])
		}
		b = b[l:]
	}
	return nil
}

// encodable reports whether the hand-written encoder knows every field m
// sets.
func encodable(m *rlsv3.RateLimitResponse) bool {
	if m.DynamicMetadata != nil || m.Quota != nil {
		return false
	}
	for _, st := range m.Statuses {
		if st == nil || st.Quota != nil {
			return false
		}
	}
	for _, hs := range [2][]*corev3.HeaderValue{m.ResponseHeadersToAdd, m.RequestHeadersToAdd} {
		for _, h := range hs {
			if h == nil {
				return false
			}
		}
	}
	return true
}

// The response's encoding, field by field in field-number order as the
// proto package writes it, so that the bytes are the same
// (TestCodecMatchesProto).

func sizeResponse(m *rlsv3.RateLimitResponse) int {
	n := 0
	if m.OverallCode != 0 {
		n += 1 + protowire.SizeVarint(uint64(m.OverallCode))
	}
	for _, st := range m.Statuses {
		n += 1 + sizeMessage(sizeStatus(st))
	}
	for _, h := range m.ResponseHeadersToAdd {
		n += 1 + sizeMessage(sizeHeader(h))
	}
	for _, h := range m.RequestHeadersToAdd {
		n += 1 + sizeMessage(sizeHeader(h))
	}
	if len(m.RawBody) > 0 {
		n += 1 + protowire.SizeBytes(len(m.RawBody))
	}
	return n
}

func appendResponse(b []byte, m *rlsv3.RateLimitResponse) []byte {
	if m.OverallCode != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(m.OverallCode))
	}
	for _, st := range m.Statuses {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeStatus(st)))
		b = appendStatus(b, st)
	}
	for _, h := range m.ResponseHeadersToAdd {
		b = appendHeader(b, 3, h)
	}
	for _, h := range m.RequestHeadersToAdd {
		b = appendHeader(b, 4, h)
	}
	if len(m.RawBody) > 0 {
		b = protowire.AppendTag(b, 5, protowire.BytesType)
		b = protowire.AppendBytes(b, m.RawBody)
	}
	return b
}

func sizeMessage(n int) int { return protowire.SizeBytes(n) }

func sizeStatus(st *rlsv3.RateLimitResponse_DescriptorStatus) int {
	n := 0
	if st.Code != 0 {
		n += 1 + protowire.SizeVarint(uint64(st.Code))
	}
	if l := st.CurrentLimit; l != nil {
		n += 1 + sizeMessage(sizeLimit(l))
	}
	if st.LimitRemaining != 0 {
		n += 1 + protowire.SizeVarint(uint64(st.LimitRemaining))
	}
	if d := st.DurationUntilReset; d != nil {
		n += 1 + sizeMessage(sizeDuration(d.Seconds, d.Nanos))
	}
	return n
}

func appendStatus(b []byte, st *rlsv3.RateLimitResponse_DescriptorStatus) []byte {
	if st.Code != 0 {
		b = protowire.AppendTag(b, 1, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(st.Code))
	}
	if l := st.CurrentLimit; l != nil {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeLimit(l)))
		if l.RequestsPerUnit != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(l.RequestsPerUnit))
		}
		if l.Unit != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(l.Unit))
		}
		if l.Name != "" {
			b = protowire.AppendTag(b, 3, protowire.BytesType)
			b = protowire.AppendString(b, l.Name)
		}
		if u := l.UnitMultiplier; u != nil {
			b = protowire.AppendTag(b, 4, protowire.BytesType)
			if u.Value != 0 {
				b = protowire.AppendVarint(b, uint64(1+protowire.SizeVarint(uint64(u.Value))))
				b = protowire.AppendTag(b, 1, protowire.VarintType)
				b = protowire.AppendVarint(b, uint64(u.Value))
			} else {
				b = protowire.AppendVarint(b, 0)
			}
		}
	}
	if st.LimitRemaining != 0 {
		b = protowire.AppendTag(b, 3, protowire.VarintType)
		b = protowire.AppendVarint(b, uint64(st.LimitRemaining))
	}
	if d := st.DurationUntilReset; d != nil {
		b = protowire.AppendTag(b, 4, protowire.BytesType)
		b = protowire.AppendVarint(b, uint64(sizeDuration(d.Seconds, d.Nanos)))
		if d.Seconds != 0 {
			b = protowire.AppendTag(b, 1, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(d.Seconds))
		}
		if d.Nanos != 0 {
			b = protowire.AppendTag(b, 2, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(int64(d.Nanos)))
		}
	}
	return b
}

func sizeLimit(l *rlsv3.RateLimitResponse_RateLimit) int {
	n := 0
	if l.RequestsPerUnit != 0 {
		n += 1 + protowire.SizeVarint(uint64(l.RequestsPerUnit))
	}
	if l.Unit != 0 {
		n += 1 + protowire.SizeVarint(uint64(l.Unit))
	}
	if l.Name != "" {
		n += 1 + protowire.SizeBytes(len(l.Name))
	}
	if u := l.UnitMultiplier; u != nil {
		m := 0
		if u.Value != 0 {
			m = 1 + protowire.SizeVarint(uint64(u.Value))
		}
		n += 1 + sizeMessage(m)
	}
	return n
}

// sizeDuration is a google.protobuf.Duration's size; a negative nanos is
// written, as every int32, as ten bytes.
func sizeDuration(seconds int64, nanos int32) int {
	n := 0
	if seconds != 0 {
		n += 1 + protowire.SizeVarint(uint64(seconds))
	}
	if nanos != 0 {
		n += 1 + protowire.SizeVarint(uint64(int64(nanos)))
	}
	return n
}

func sizeHeader(h *corev3.HeaderValue) int {
	n := 0
	if h.Key != "" {
		n += 1 + protowire.SizeBytes(len(h.Key))
	}
	if h.Value != "" {
		n += 1 + protowire.SizeBytes(len(h.Value))
	}
	if len(h.RawValue) > 0 {
		n += 1 + protowire.SizeBytes(len(h.RawValue))
	}
	return n
}

func appendHeader(b []byte, field protowire.Number, h *corev3.HeaderValue) []byte {
	b = protowire.AppendTag(b, field, protowire.BytesType)
	b = protowire.AppendVarint(b, uint64(sizeHeader(h)))
	if h.Key != "" {
		b = protowire.AppendTag(b, 1, protowire.BytesType)
		b = protowire.AppendString(b, h.Key)
	}
	if h.Value != "" {
		b = protowire.AppendTag(b, 2, protowire.BytesType)
		b = protowire.AppendString(b, h.Value)
	}
	if len(h.RawValue) > 0 {
		b = protowire.AppendTag(b, 3, protowire.BytesType)
		b = protowire.AppendBytes(b, h.RawValue)
	}
	return b
}

// names interns the strings of a request that repeat from one request to
// the next (the domain, the entries' keys), so reading them allocates
// nothing once they are known; the values, which differ, are allocated.
// It holds at most maxNames strings of at most maxNameLen bytes: requests
// that keep naming new keys fill it once and then allocate as before.
var names interner

const (
	maxNames   = 1024
	maxNameLen = 64
)

// interner is a copy-on-write set of strings: reads take no lock. It is
// safe for concurrent use.
type interner struct {
	set atomic.Pointer[map[string]string]
	mu  sync.Mutex
}

// get returns b as a string, the interned one when there is one.
func (in *interner) get(b []byte) string {
	if m := in.set.Load(); m != nil {
		if s, ok := (*m)[string(b)]; ok { // a lookup that allocates nothing
			return s
		}
	}
	s := string(b)
	if len(b) > maxNameLen {
		return s
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	old := in.set.Load()
	if old != nil && len(*old) >= maxNames {
		return s
	}
	m := make(map[string]string, 1+len(deref(old)))
	for k, v := range deref(old) {
		m[k] = v
	}
	m[s] = s
	in.set.Store(&m)
	return s
}

func deref(m *map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	return *m
}
