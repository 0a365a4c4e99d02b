package coordinator

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"

	"github.com/allot-dev/allot/lease"
)

// ElectionConfig configures RunElection.
type ElectionConfig struct {
	// Prefix is the etcd key prefix every coordinator of the cluster shares.
	Prefix string
	// SessionTTL is the etcd lease of the leader's key, in seconds: a dead
	// leader is replaced about this long after it stops.
	SessionTTL int
	// Retry is the pause after an etcd error.
	Retry time.Duration
	// Logger logs leadership changes.
	Logger *slog.Logger
}

// DefaultElectionConfig returns an ElectionConfig for prefix.
func DefaultElectionConfig(prefix string) ElectionConfig {
	return ElectionConfig{Prefix: prefix, SessionTTL: 3, Retry: 500 * time.Millisecond, Logger: slog.Default()}
}

// Validate reports the first problem with c, naming the field and value.
func (c ElectionConfig) Validate() error {
	switch {
	case c.Prefix == "":
		return fmt.Errorf("%w: election prefix is empty", ErrInvalidConfig)
	case c.SessionTTL <= 0:
		// etcd would take its own default (60 s) for these: a dead leader
		// would keep its leadership a minute.
		return fmt.Errorf("%w: election session_ttl=%d must be > 0 seconds", ErrInvalidConfig, c.SessionTTL)
	case c.Retry <= 0:
		return fmt.Errorf("%w: election retry=%s must be > 0", ErrInvalidConfig, c.Retry)
	}
	return nil
}

// RunElection campaigns for leadership of the cluster under cfg.Prefix on
// etcd until ctx ends. While another coordinator leads, s follows and
// redirects to it; when s wins, it leads with the revision of its leader
// key as its term, so every later leader's term is larger. When its etcd
// session ends (the etcd lease could not be kept alive), s steps down at
// once. When ctx ends while leading, s expires every lease and resigns, so
// regions drop to their floors instead of waiting out their leases. It
// returns at once with cfg's problem when cfg is not valid.
func RunElection(ctx context.Context, cli *clientv3.Client, cfg ElectionConfig, s *Server) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	for ctx.Err() == nil {
		if err := campaign(ctx, cli, cfg, s); err != nil && ctx.Err() == nil {
			cfg.Logger.Warn("coordinator: election", "err", err)
			select {
			case <-ctx.Done():
			case <-time.After(cfg.Retry):
			}
		}
	}
	return nil
}

func campaign(ctx context.Context, cli *clientv3.Client, cfg ElectionConfig, s *Server) error {
	sess, err := concurrency.NewSession(cli, concurrency.WithTTL(cfg.SessionTTL), concurrency.WithContext(ctx))
	if err != nil {
		return fmt.Errorf("coordinator: etcd session: %w", err)
	}
	defer sess.Close()
	e := concurrency.NewElection(sess, cfg.Prefix+"/election")
	octx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		for resp := range e.Observe(octx) {
			if len(resp.Kvs) > 0 {
				s.SetLeader(string(resp.Kvs[0].Value))
			}
		}
	}()
	cctx, ccancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sess.Done():
			ccancel() // lost the session while campaigning
		case <-cctx.Done():
		}
	}()
	err = e.Campaign(cctx, s.cfg.Advertise)
	ccancel()
	if err != nil {
		return fmt.Errorf("coordinator: campaign: %w", err)
	}
	term := uint64(e.Rev()) // #nosec G115 -- a revision after a won campaign is >= 1
	first, err := recordLeader(ctx, cli, cfg.Prefix, e, term)
	if err != nil {
		cfg.Logger.Warn("coordinator: could not record the leader; leading as a later one", "term", term, "err", err)
	}
	if err := s.becomeLeader(term, first); err != nil {
		return err
	}
	select {
	case <-sess.Done():
		s.StepDown("")
		return fmt.Errorf("coordinator: etcd session of term %d ended", term)
	case <-ctx.Done():
		s.ExpireAll()
		time.Sleep(100 * time.Millisecond) // let the expiries reach the regions
		rctx, rcancel := context.WithTimeout(context.Background(), time.Second)
		_ = e.Resign(rctx)
		rcancel()
		s.StepDown("")
		return nil
	}
}

// LedKey is the etcd key under prefix that the first leader of the cluster
// creates (its value is the term): a leader that finds it knows an earlier
// leader may have granted regions more than their floors.
func LedKey(prefix string) string { return prefix + "/led" }

// recordLeader creates LedKey while e's leader key is still the one this
// campaign won. It reports whether it created it: no leader served the
// regions before, so the Allocator may start with every reserve full. An
// error, a key already there, or a lost leadership all say false, which
// is always safe.
func recordLeader(ctx context.Context, cli *clientv3.Client, prefix string, e *concurrency.Election, term uint64) (bool, error) {
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	resp, err := cli.Txn(tctx).
		If(clientv3.Compare(clientv3.CreateRevision(LedKey(prefix)), "=", 0),
			clientv3.Compare(clientv3.CreateRevision(e.Key()), "=", e.Rev())).
		Then(clientv3.OpPut(LedKey(prefix), strconv.FormatUint(term, 10))).
		Commit()
	if err != nil {
		return false, fmt.Errorf("coordinator: record the leader under %s: %w", LedKey(prefix), err)
	}
	return resp.Succeeded, nil
}

// DocumentKey is the etcd key holding the budgets document under prefix.
func DocumentKey(prefix string) string { return prefix + "/budgets" }

// PutDocument validates a budgets document and stores it in etcd.
func PutDocument(ctx context.Context, cli *clientv3.Client, prefix string, data []byte, fromRules RulesBudgets) error {
	d, err := ParseDocument(data, DocumentKey(prefix))
	if err != nil {
		return err
	}
	if d.RulesFile != "" {
		return fmt.Errorf("%w: rules_file cannot be stored in etcd; inline the rules", ErrInvalidDocument)
	}
	if _, err := d.Resolve(fromRules); err != nil {
		return err
	}
	if err := d.LeaseConfig(lease.DefaultConfig()).Validate(); err != nil {
		return fmt.Errorf("%w: lease: %w", ErrInvalidDocument, err)
	}
	if _, err := cli.Put(ctx, DocumentKey(prefix), string(data)); err != nil {
		return fmt.Errorf("coordinator: etcd put %s: %w", DocumentKey(prefix), err)
	}
	return nil
}

// GetDocument returns the stored budgets document and its revision; nil
// data when none is stored.
func GetDocument(ctx context.Context, cli *clientv3.Client, prefix string) ([]byte, int64, error) {
	resp, err := cli.Get(ctx, DocumentKey(prefix))
	if err != nil {
		return nil, 0, fmt.Errorf("coordinator: etcd get %s: %w", DocumentKey(prefix), err)
	}
	if len(resp.Kvs) == 0 {
		return nil, resp.Header.Revision, nil
	}
	return resp.Kvs[0].Value, resp.Kvs[0].ModRevision, nil
}

// WatchDocument calls apply with the stored budgets document's budgets now
// and after every change, until ctx ends. A document that does not
// validate is logged and skipped: the last good budgets stay in force.
func WatchDocument(ctx context.Context, cli *clientv3.Client, prefix string, fromRules RulesBudgets, log *slog.Logger, apply func([]lease.Budget)) error {
	if log == nil {
		log = slog.Default()
	}
	try := func(data []byte, rev int64) {
		d, err := ParseDocument(data, fmt.Sprintf("%s@%d", DocumentKey(prefix), rev))
		if err == nil {
			var bs []lease.Budget
			if bs, err = d.Resolve(fromRules); err == nil {
				apply(bs)
				log.Info("coordinator: budgets applied", "revision", rev, "budgets", len(bs))
				return
			}
		}
		log.Warn("coordinator: budgets rejected, keeping the last good ones", "revision", rev, "err", err)
	}
	for ctx.Err() == nil {
		data, rev, err := GetDocument(ctx, cli, prefix)
		if err != nil {
			log.Warn("coordinator: budgets", "err", err)
			select {
			case <-ctx.Done():
				return nil
			case <-time.After(time.Second):
				continue
			}
		}
		if data != nil {
			try(data, rev)
		}
		for wr := range cli.Watch(clientv3.WithRequireLeader(ctx), DocumentKey(prefix), clientv3.WithRev(rev+1)) {
			if wr.Err() != nil {
				log.Warn("coordinator: budgets watch", "err", wr.Err())
				break
			}
			for _, ev := range wr.Events {
				if ev.Type == clientv3.EventTypePut {
					try(ev.Kv.Value, ev.Kv.ModRevision)
				}
			}
		}
	}
	return nil
}
