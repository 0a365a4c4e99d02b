package bucket_test

import (
	"testing"

	"github.com/allot-dev/allot/bucket"
	"github.com/allot-dev/allot/bucket/storetest"
	"github.com/allot-dev/allot/clock"
)

func TestMemoryConformance(t *testing.T) {
	storetest.Run(t, func(t *testing.T, clk clock.Clock) bucket.Store {
		return bucket.NewMemory(bucket.MemoryOptions{Clock: clk})
	})
}
