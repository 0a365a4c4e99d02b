// Package redisstore is the bucket.Store on Redis: one atomic Lua script
// per operation on the server's clock, through go-redis's UniversalClient so
// one setting covers a single primary, Sentinel and Cluster. It lives apart
// from package bucket so that the deterministic packages (bucket's pure
// functions and in-process store, lease, region, sim) import no Redis
// client.
package redisstore

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
)

//go:embed script.lua
var scriptSource string

var script = redis.NewScript(scriptSource)

// Options configures a Store.
type Options struct {
	// Prefix starts every key the store writes.
	Prefix string // default "allot:"
	// Secret, when set, keys subjects by HMAC-SHA-256 under it, so that
	// identifiers are not stored in clear and cannot be guessed from a dump;
	// without it subjects are keyed by plain SHA-256.
	Secret []byte
	// Timeout bounds every operation. A slow or unreachable Redis turns into
	// bucket.ErrUnavailable after it, never a hang.
	Timeout time.Duration // default 100 ms
	// AttemptWindow is how long an attempt id's decision is remembered.
	AttemptWindow time.Duration // default bucket.DefaultAttemptWindow
	// Now, when set, replaces the Redis server's clock in the script. It is
	// for tests and deterministic drivers only: in production the server's
	// TIME is the one clock every agent shares.
	Now func() time.Time
}

// DefaultOptions returns the options New uses for zero fields.
func DefaultOptions() Options {
	return Options{
		Prefix:        "allot:",
		Timeout:       100 * time.Millisecond, // a regional round trip is ~1 ms; 100× that is an outage
		AttemptWindow: bucket.DefaultAttemptWindow,
	}
}

// Store is a bucket.Store on a Redis primary (single, Sentinel or Cluster through
// redis.UniversalClient). Each bucket is one string key, hash-tagged so that a
// bucket and its attempt records live in one Cluster slot, and every
// operation is one atomic Lua script that reads the server's clock, so the
// agents' clocks do not matter. Keys expire when their bucket would be full
// again, so none lingers and none expires early. Store is safe for concurrent
// use.
type Store struct {
	c       redis.UniversalClient
	opts    Options
	hashers sync.Pool
	// repaired counts keys found corrupt or of the wrong type and replaced
	// by an empty bucket; read it with RepairedKeys.
	repaired atomic.Int64
}

var (
	_ bucket.Store   = (*Store)(nil)
	_ bucket.Rebaser = (*Store)(nil)
)

// New returns a Store on c. It returns an error naming the field
// when the options cannot work.
func New(c redis.UniversalClient, opts Options) (*Store, error) {
	def := DefaultOptions()
	if opts.Prefix == "" {
		opts.Prefix = def.Prefix
	}
	if strings.ContainsAny(opts.Prefix, "{}") {
		return nil, fmt.Errorf("redisstore: Options.Prefix=%q must not contain '{' or '}' (they delimit the Cluster hash tag)", opts.Prefix)
	}
	if opts.Timeout < 0 {
		return nil, fmt.Errorf("redisstore: Options.Timeout=%s must be ≥ 0", opts.Timeout)
	}
	if opts.Timeout == 0 {
		opts.Timeout = def.Timeout
	}
	if opts.AttemptWindow < 0 {
		return nil, fmt.Errorf("redisstore: Options.AttemptWindow=%s must be ≥ 0", opts.AttemptWindow)
	}
	if opts.AttemptWindow == 0 {
		opts.AttemptWindow = def.AttemptWindow
	}
	if !contextTimeouts(c) {
		return nil, errors.New("redisstore: the Redis client must set ContextTimeoutEnabled=true, or a stalled server holds callers for ReadTimeout instead of Options.Timeout")
	}
	r := &Store{c: c, opts: opts}
	secret := opts.Secret
	r.hashers.New = func() any {
		if len(secret) > 0 {
			return &keyHasher{h: hmac.New(sha256.New, secret)}
		}
		return &keyHasher{h: sha256.New()}
	}
	return r, nil
}

// RedisKey returns the Redis key of a bucket:
// prefix + "{" + rule + ":" + hex(first 16 bytes of the subject's hash) + "}".
func (r *Store) RedisKey(k bucket.Key) string {
	kh := r.hashers.Get().(*keyHasher)
	kh.h.Reset()
	kh.buf = append(kh.buf[:0], k.Subject...)
	kh.h.Write(kh.buf)
	// The sum goes to the same buffer: a local array would escape through
	// the hash.Hash interface and be allocated on every call.
	kh.buf = kh.h.Sum(kh.buf[:0])
	var hx [32]byte
	hex.Encode(hx[:], kh.buf[:16])
	r.hashers.Put(kh)
	var b strings.Builder
	b.Grow(len(r.opts.Prefix) + len(k.Rule) + 35)
	b.WriteString(r.opts.Prefix)
	b.WriteByte('{')
	b.WriteString(k.Rule)
	b.WriteByte(':')
	b.Write(hx[:])
	b.WriteByte('}')
	return b.String()
}

// keyHasher is a pooled hash with a buffer for the subject and the sum, so
// keying a bucket allocates only the key itself.
type keyHasher struct {
	h   hash.Hash
	buf []byte
}

// attemptKey shares the bucket's hash tag, so Cluster keeps both in one slot.
func (r *Store) attemptKey(bucketKey, id string) string {
	sum := sha256.Sum256([]byte(id))
	return bucketKey + ":a:" + hex.EncodeToString(sum[:12])
}

type result struct {
	allowed   bool
	remaining bucket.Tokens
	retry     time.Duration
	reset     time.Duration
	granted   bucket.Tokens
}

func (res result) decision(l bucket.Limit) bucket.Decision {
	return bucket.Decision{Allowed: res.allowed, Remaining: res.remaining, RetryAfter: res.retry, ResetAfter: res.reset, Limit: l}
}

func (r *Store) run(ctx context.Context, op scriptOp, key bucket.Key, l bucket.Limit, n bucket.Tokens, attemptID string, from ...int64) (result, error) {
	bk := r.RedisKey(key)
	keys := []string{bk}
	if attemptID != "" {
		keys = append(keys, r.attemptKey(bk, attemptID))
	}
	now := ""
	if r.opts.Now != nil {
		now = fmt.Sprint(r.opts.Now().UnixMicro())
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	// The numbers travel as one binary argument (the script unpacks it
	// with struct.unpack): fewer arguments to box here and to intern there.
	var buf [64]byte
	p := buf[:0]
	num, den := l.IntervalFraction()
	for _, x := range [...]int64{num, den, int64(l.Burst()), int64(n), r.opts.AttemptWindow.Milliseconds()} {
		p = binary.LittleEndian.AppendUint64(p, uint64(x))
	}
	for _, x := range from {
		p = binary.LittleEndian.AppendUint64(p, uint64(x))
	}
	v, err := script.Run(ctx, r.c, keys, op.code, string(p), now).Int64Slice()
	if err != nil {
		return result{}, fmt.Errorf("%w: redis %s on %s: %w", bucket.ErrUnavailable, op.name, bk, err)
	}
	if len(v) != 6 {
		return result{}, fmt.Errorf("%w: redis %s on %s: script returned %d values, want 6", bucket.ErrUnavailable, op.name, bk, len(v))
	}
	if v[5] != 0 {
		r.repaired.Add(1)
	}
	return result{
		allowed:   v[0] == 1,
		remaining: bucket.Tokens(v[1]),
		retry:     time.Duration(v[2]) * time.Microsecond,
		reset:     time.Duration(v[3]) * time.Microsecond,
		granted:   bucket.Tokens(v[4]),
	}, nil
}

// scriptOp is an operation of the script: its code, already boxed so that
// passing it to the script does not allocate, and its name for errors.
type scriptOp struct {
	code any
	name string
}

var (
	opDecide   = scriptOp{"d", "decide"}
	opTakeUpTo = scriptOp{"t", "take-up-to"}
	opReturn   = scriptOp{"r", "return"}
	opPeek     = scriptOp{"p", "peek"}
	opRebase   = scriptOp{"b", "rebase"}
)

// RepairedKeys is how many keys of the wrong type or with a corrupt value
// the store has replaced by an empty bucket.
func (r *Store) RepairedKeys() int64 {
	return r.repaired.Load()
}

// Decide implements bucket.Store.
func (r *Store) Decide(ctx context.Context, key bucket.Key, l bucket.Limit, cost bucket.Tokens, attemptID string) (bucket.Decision, error) {
	if err := bucket.Check(l, cost); err != nil {
		return bucket.Decision{Limit: l}, err
	}
	res, err := r.run(ctx, opDecide, key, l, cost, attemptID)
	if err != nil {
		return bucket.Decision{Limit: l}, err
	}
	return res.decision(l), nil
}

// TakeUpTo implements bucket.Store.
func (r *Store) TakeUpTo(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) (bucket.Tokens, error) {
	if err := bucket.Check(l, 1); err != nil {
		return 0, err
	}
	if n <= 0 {
		return 0, errCost(n)
	}
	res, err := r.run(ctx, opTakeUpTo, key, l, n, "")
	return res.granted, err
}

// Return implements bucket.Store.
func (r *Store) Return(ctx context.Context, key bucket.Key, l bucket.Limit, n bucket.Tokens) error {
	if err := bucket.Check(l, 1); err != nil {
		return err
	}
	if n <= 0 {
		return errCost(n)
	}
	_, err := r.run(ctx, opReturn, key, l, n, "")
	return err
}

// Rebase implements bucket.Rebaser.
func (r *Store) Rebase(ctx context.Context, key bucket.Key, from, to bucket.Limit) error {
	if err := bucket.Check(from, 1); err != nil {
		return err
	}
	if err := bucket.Check(to, 1); err != nil {
		return err
	}
	fnum, fden := from.IntervalFraction()
	_, err := r.run(ctx, opRebase, key, to, 1, "", fnum, fden, int64(from.Burst()))
	return err
}

// Peek implements bucket.Store.
func (r *Store) Peek(ctx context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := bucket.Check(l, 1); err != nil {
		return bucket.Decision{Limit: l}, err
	}
	res, err := r.run(ctx, opPeek, key, l, 1, "")
	if err != nil {
		return bucket.Decision{Limit: l}, err
	}
	return res.decision(l), nil
}

// contextTimeouts reports whether the client honours context deadlines on
// its sockets, for the client types go-redis builds.
func contextTimeouts(c redis.UniversalClient) bool {
	switch c := c.(type) {
	case *redis.Client:
		return c.Options().ContextTimeoutEnabled
	case *redis.ClusterClient:
		return c.Options().ContextTimeoutEnabled
	}
	return true
}

// NewUniversalClient returns a go-redis client for addrs: one address is a
// single primary, several are a Cluster, and a non-empty masterName means
// Sentinel addresses. Context deadlines are honoured, as the store needs.
func NewUniversalClient(addrs []string, masterName, password string) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 addrs,
		MasterName:            masterName,
		Password:              password,
		ContextTimeoutEnabled: true,
	})
}

// errCost is the error of a batch size n ≤ 0, as the bucket functions give
// it.
func errCost(n bucket.Tokens) error {
	return fmt.Errorf("%w: n=%d must be > 0", bucket.ErrInvalidCost, n)
}
