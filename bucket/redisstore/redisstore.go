// Package redisstore is the bucket.Store on Redis: every operation applied
// atomically by one Lua script on the server's clock (concurrent operations
// sharing a script call), through go-redis's UniversalClient so one setting
// covers a single primary, Sentinel and Cluster. It lives apart
// from package bucket so that the deterministic packages (bucket's pure
// functions and in-process store, lease, region, sim) import no Redis
// client.
package redisstore

import (
	"cmp"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	_ "embed"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"strconv"
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
	// Batch is the most operations one script call carries. Operations
	// that arrive while Pipes script calls are in flight queue, and the
	// first to return hands the queue to one of them, which sends it as
	// one call: concurrent decisions share a round trip, a script run and
	// the server's clock, and a lone decision goes at once. 1 sends every
	// operation on its own.
	Batch int // default 128
	// Pipes is how many script calls of this store may be in flight at
	// once; it also bounds the connections the store holds busy.
	Pipes int // default 1
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
		Batch:         128, // ~8 KiB of arguments; past it a larger batch saves no measurable time
		Pipes:         1,   // Redis runs one script at a time; one call in flight makes the next batch larger
	}
}

// Store is a bucket.Store on a Redis primary (single, Sentinel or Cluster through
// redis.UniversalClient). Each bucket is one string key, hash-tagged so that a
// bucket and its attempt records live in one Cluster slot, and every
// operation is applied atomically by one Lua script that reads the server's
// clock, so the agents' clocks do not matter. Operations that arrive while
// a script call is in flight go together in the next one (see pipe), so
// concurrent decisions share round trips. Keys expire when their bucket
// would be full again, so none lingers and none expires early. Store is
// safe for concurrent use.
type Store struct {
	c       redis.UniversalClient
	opts    Options
	cluster bool   // keys of one script call must share a slot
	window  string // opts.AttemptWindow in ms, as the script reads it
	pipe    pipe
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
	if opts.Batch < 0 {
		return nil, fmt.Errorf("redisstore: Options.Batch=%d must be ≥ 0", opts.Batch)
	}
	if opts.Batch == 0 {
		opts.Batch = def.Batch
	}
	if opts.Pipes < 0 {
		return nil, fmt.Errorf("redisstore: Options.Pipes=%d must be ≥ 0", opts.Pipes)
	}
	if opts.Pipes == 0 {
		opts.Pipes = def.Pipes
	}
	_, single := c.(*redis.Client)
	r := &Store{c: c, opts: opts, cluster: !single,
		window: strconv.FormatInt(opts.AttemptWindow.Milliseconds(), 10),
		pipe:   pipe{max: opts.Pipes, size: opts.Batch}}
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

// Script operation codes (see script.lua); codeAttempt is added when the
// operation carries an attempt record.
const (
	codeDecide  = 1
	codeTake    = 2
	codeReturn  = 3
	codePeek    = 4
	codeRebase  = 5
	codeAttempt = 8
)

var opNames = [...]string{codeDecide: "decide", codeTake: "take-up-to", codeReturn: "return", codePeek: "peek", codeRebase: "rebase"}

// run applies one operation to key through the pipe: alone when the store
// is idle, in one script call with every other operation that arrives
// while earlier ones are in flight otherwise.
func (r *Store) run(ctx context.Context, code int64, key bucket.Key, l bucket.Limit, n bucket.Tokens, attemptID string, from ...int64) (result, error) {
	o := opPool.Get().(*op)
	o.code = code
	o.bk = r.RedisKey(key)
	o.ak = ""
	if attemptID != "" {
		o.ak = r.attemptKey(o.bk, attemptID)
		o.code |= codeAttempt
	}
	num, den := l.IntervalFraction()
	o.args = [7]int64{num, den, int64(l.Burst()), int64(n)}
	copy(o.args[4:], from)
	o.deadline = time.Now().Add(r.opts.Timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(o.deadline) {
		o.deadline = d
	}
	o.err = nil
	bk := o.bk
	var (
		res result
		err error
	)
	if err = ctx.Err(); err == nil {
		if err = r.pipe.do(ctx, o, r.exec); err == nil {
			res, err = o.res, o.err
		} else {
			o = nil // abandoned: a running batch may still write to it
		}
	}
	if err != nil {
		err = fmt.Errorf("%w: redis %s on %s: %w", bucket.ErrUnavailable, opNames[code], bk, err)
	}
	if o != nil {
		o.bk, o.ak = "", ""
		opPool.Put(o)
	}
	return res, err
}

// exec runs one batch of operations and returns the error of a call that
// failed as a whole. On a single primary (or Sentinel's) that is one script
// call; on a Cluster, where the keys of one script call must share a slot,
// one script call per slot, pipelined so that the client sends each node
// its calls in one round trip (and a failure of one node is not the
// batch's).
func (r *Store) exec(ctx context.Context, batch []*op) error {
	now := r.nowArg()
	if !r.cluster || len(batch) == 1 {
		return r.call(ctx, r.c, batch, now)
	}
	groups := make(map[uint16][]*op, len(batch))
	for _, o := range batch {
		s := slot(o.bk)
		groups[s] = append(groups[s], o)
	}
	if len(groups) == 1 {
		return r.call(ctx, r.c, batch, now)
	}
	ordered := make([][]*op, 0, len(groups))
	for _, g := range groups {
		ordered = append(ordered, g)
	}
	cmds := make([]*redis.Cmd, len(ordered))
	_, _ = r.c.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, g := range ordered {
			keys, argv := scriptArgs(g, now, r.window)
			cmds[i] = script.EvalSha(ctx, p, keys, argv...)
		}
		return nil
	})
	for i, g := range ordered {
		if err := cmds[i].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
			// A node restarted or failed over to a replica that never saw
			// the script: that slot's call goes again with the source.
			_ = r.call(ctx, r.c, g, now)
			continue
		}
		_ = r.deliver(g, cmds[i])
	}
	return nil
}

// nowArg is the script's clock argument: Options.Now in µs, or "" for the
// server's TIME.
func (r *Store) nowArg() string {
	if r.opts.Now == nil {
		return ""
	}
	return strconv.FormatInt(r.opts.Now().UnixMicro(), 10)
}

// call runs one script call for ops, whose keys share a slot or are on a
// single primary, falling back from EVALSHA to EVAL when the server has
// lost the script.
func (r *Store) call(ctx context.Context, c redis.Scripter, ops []*op, now string) error {
	keys, argv := scriptArgs(ops, now, r.window)
	return r.deliver(ops, script.Run(ctx, c, keys, argv...))
}

// scriptArgs lays out a batch as script.lua reads it.
func scriptArgs(ops []*op, now, window string) ([]string, []any) {
	keys := make([]string, 0, len(ops)+1)
	blob := make([]byte, 0, 64*len(ops))
	for _, o := range ops {
		keys = append(keys, o.bk)
		if o.ak != "" {
			keys = append(keys, o.ak)
		}
		blob = binary.LittleEndian.AppendUint64(blob, uint64(o.code)) // #nosec G115 -- the int64's bit pattern; script.lua unpacks it as '<i8'
		for _, x := range o.args {
			blob = binary.LittleEndian.AppendUint64(blob, uint64(x)) // #nosec G115 -- as above
		}
	}
	return keys, []any{blob, now, window}
}

// deliver sets every operation's result from the script's reply, or the
// call's error, which it returns.
func (r *Store) deliver(ops []*op, cmd *redis.Cmd) error {
	v, err := cmd.Text()
	if err == nil && len(v) != 48*len(ops) {
		err = fmt.Errorf("script returned %d bytes for %d operations, want %d", len(v), len(ops), 48*len(ops))
	}
	if err != nil {
		for _, o := range ops {
			o.err = err
		}
		return err
	}
	for i, o := range ops {
		b := v[48*i:]
		if le64(b[40:]) != 0 {
			r.repaired.Add(1)
		}
		o.res = result{
			allowed:   le64(b) == 1,
			remaining: bucket.Tokens(le64(b[8:])),
			retry:     time.Duration(le64(b[16:])) * time.Microsecond,
			reset:     time.Duration(le64(b[24:])) * time.Microsecond,
			granted:   bucket.Tokens(le64(b[32:])),
		}
	}
	return nil
}

// le64 reads a little-endian int64 from the start of s.
func le64(s string) int64 {
	_ = s[7]
	return int64(uint64(s[0]) | uint64(s[1])<<8 | uint64(s[2])<<16 | uint64(s[3])<<24 | // #nosec G115 -- the bit pattern script.lua packed as '<i8'
		uint64(s[4])<<32 | uint64(s[5])<<40 | uint64(s[6])<<48 | uint64(s[7])<<56)
}

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
	res, err := r.run(ctx, codeDecide, key, l, cost, attemptID)
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
	res, err := r.run(ctx, codeTake, key, l, n, "")
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
	_, err := r.run(ctx, codeReturn, key, l, n, "")
	return err
}

// Rebase implements bucket.Rebaser: a rebase operation and, with credit,
// a return after it, which the script applies in order in one call. From
// a limit that admits nothing the script leaves the bucket empty
// (bucket.Rebase), told so by a from-burst of 0. The script returns the
// tokens the move took away in its granted value.
//
// The call is one of its own under the store's timeout, not in a batch of
// decisions: with a batch in flight an operation waits for it to return
// before its own goes, and a settlement held the region's new table back
// that round trip more (a decrease settled in 230–260 ms under chaos's
// redis-slow, a raise in one call 100–140 ms). Settlements are rare.
func (r *Store) Rebase(ctx context.Context, key bucket.Key, from, to bucket.Limit, credit bucket.Tokens) (bucket.Tokens, error) {
	ops, what, err := r.rebaseOps(key, from, to, credit)
	if err != nil {
		return 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	err = r.exec(ctx, ops)
	return rebaseResult(ops, what, err)
}

// rebaseOps checks a rebase's arguments and lays it out as the script's
// operations: the rebase, and with credit a return after it.
func (r *Store) rebaseOps(key bucket.Key, from, to bucket.Limit, credit bucket.Tokens) ([]*op, string, error) {
	if err := bucket.Check(to, 1); err != nil {
		return nil, "", err
	}
	if credit < 0 {
		return nil, "", errCost(credit)
	}
	fnum, fden, fburst := int64(1), int64(1), int64(0)
	if !from.AdmitsNothing() {
		if err := bucket.Check(from, 1); err != nil {
			return nil, "", err
		}
		fnum, fden = from.IntervalFraction()
		fburst = int64(from.Burst())
	}
	bk := r.RedisKey(key)
	num, den := to.IntervalFraction()
	ops := []*op{{code: codeRebase, bk: bk, args: [7]int64{num, den, int64(to.Burst()), 1, fnum, fden, fburst}}}
	what := "rebase"
	if credit > 0 {
		ops = append(ops, &op{code: codeReturn, bk: bk, args: [7]int64{num, den, int64(to.Burst()), int64(credit)}})
		what = "rebase and return"
	}
	return ops, what, nil
}

// rebaseResult is what a rebase laid out by rebaseOps took away, or the
// first error of its call and its operations.
func rebaseResult(ops []*op, what string, err error) (bucket.Tokens, error) {
	for _, o := range ops {
		err = cmp.Or(err, o.err)
	}
	if err != nil {
		return 0, fmt.Errorf("%w: redis %s on %s: %w", bucket.ErrUnavailable, what, ops[0].bk, err)
	}
	return ops[0].res.granted, nil
}

// Rebasing is one rebase for QueueRebases: Rebase's arguments.
type Rebasing struct {
	Key      bucket.Key
	From, To bucket.Limit
	Credit   bucket.Tokens
}

// QueuesOn reports whether QueueRebases can queue on a pipeline of c: c is
// the store's own client, a single primary's (or Sentinel's). A Cluster's
// pipelines keep no order between nodes, and its script calls take the
// keys of one slot only.
func (r *Store) QueuesOn(c redis.UniversalClient) bool { return !r.cluster && c == r.c }

// QueueRebases queues rs on p, a pipeline of a client QueuesOn accepts, as
// one script call, so that a caller can send them in the same round trip
// as what must follow them: Redis runs a connection's commands in order,
// so a command queued after them runs once they have. The call sends the
// script's source (EVAL, not EVALSHA): a server that lost the script would
// refuse it, and what was queued after it would still run. It returns
// done, which, once p has executed, gives each rebase what Rebase would
// return, in order. On a store QueuesOn refuses, nothing is queued and
// every rebase fails.
func (r *Store) QueueRebases(ctx context.Context, p redis.Pipeliner, rs []Rebasing) (done func() ([]bucket.Tokens, []error)) {
	lost := make([]bucket.Tokens, len(rs))
	errs := make([]error, len(rs))
	what := make([]string, len(rs))
	each := make([][]*op, len(rs))
	var all []*op
	for i, rb := range rs {
		ops, w, err := r.rebaseOps(rb.Key, rb.From, rb.To, rb.Credit)
		if err == nil && r.cluster {
			err = fmt.Errorf("%w: redisstore: rebases queued on a Cluster keep no order", bucket.ErrUnavailable)
		}
		if err != nil {
			errs[i] = err
			continue
		}
		each[i], what[i] = ops, w
		all = append(all, ops...)
	}
	if len(all) == 0 {
		return func() ([]bucket.Tokens, []error) { return lost, errs }
	}
	keys, argv := scriptArgs(all, r.nowArg(), r.window)
	cmd := script.Eval(ctx, p, keys, argv...)
	return func() ([]bucket.Tokens, []error) {
		err := r.deliver(all, cmd)
		for i, ops := range each {
			if ops != nil {
				lost[i], errs[i] = rebaseResult(ops, what[i], err)
			}
		}
		return lost, errs
	}
}

// Peek implements bucket.Store.
func (r *Store) Peek(ctx context.Context, key bucket.Key, l bucket.Limit) (bucket.Decision, error) {
	if err := bucket.Check(l, 1); err != nil {
		return bucket.Decision{Limit: l}, err
	}
	res, err := r.run(ctx, codePeek, key, l, 1, "")
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
// Sentinel addresses, with ClientOptions' settings.
func NewUniversalClient(addrs []string, masterName, password string) redis.UniversalClient {
	return redis.NewUniversalClient(ClientOptions(addrs, masterName, password))
}

// ClientOptions are the settings the store's client needs, for callers
// that add their own (TLS):
//   - context deadlines are honoured on the sockets;
//   - a refused dial is not retried inside the call. go-redis's default
//     retries each dial five times, 100 ms apart, under each of a command's
//     four attempts: a Redis that is down held every call 1.7 s, and an
//     agent's round, which makes several, over ten seconds. The breaker and
//     the agent's next round are the retries.
func ClientOptions(addrs []string, masterName, password string) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 addrs,
		MasterName:            masterName,
		Password:              password,
		ContextTimeoutEnabled: true,
		DialerRetries:         1,
	}
}

// errCost is the error of a batch size n ≤ 0, as the bucket functions give
// it.
func errCost(n bucket.Tokens) error {
	return fmt.Errorf("%w: n=%d must be > 0", bucket.ErrInvalidCost, n)
}

// KeepsDeadlines marks the store as a breaker.DeadlineKeeper: every
// operation ends at its context's deadline on the store's own timers (a
// queued operation's timer, a running call's deadline), whether or not
// the context's Done channel closes then.
func (r *Store) KeepsDeadlines() {}
