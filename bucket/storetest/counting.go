package storetest

import (
	"context"
	"sync/atomic"

	"github.com/allot-dev/allot/bucket"
)

// Counting wraps a store and counts its Decide calls, for tests that show
// some decisions never reach the store.
type Counting struct {
	bucket.Store
	Calls atomic.Int64
}

// Decide implements bucket.Store.
func (c *Counting) Decide(ctx context.Context, k bucket.Key, l bucket.Limit, cost bucket.Tokens, id string) (bucket.Decision, error) {
	c.Calls.Add(1)
	return c.Store.Decide(ctx, k, l, cost, id)
}
