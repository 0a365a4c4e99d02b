package redisstore

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/allot-dev/allot/bucket"
)

var _ bucket.Pinger = (*Store)(nil)

// Ping sends PING within the store's timeout (on a Cluster, to every
// primary: a store that answers for some keys only is not back). A circuit
// breaker probes with it, so a store's return is noticed without waiting
// for a request on one of its buckets.
func (r *Store) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, r.opts.Timeout)
	defer cancel()
	var err error
	if cc, ok := r.c.(*redis.ClusterClient); ok {
		err = cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error { return c.Ping(ctx).Err() })
	} else {
		err = r.c.Ping(ctx).Err()
	}
	if err != nil {
		return fmt.Errorf("%w: redis ping: %w", bucket.ErrUnavailable, err)
	}
	return nil
}
