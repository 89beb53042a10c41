package benchrun

import (
	"context"
	"sync"
	"time"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// timedAllocator is one shared connection's allocator, timing the grants
// its Codes-0 workers ask for as they see them: the round trip, queueing
// on the connection and the client's scheduling included, which the
// service's own latency (Report.ServerLatency) leaves out.
type timedAllocator struct {
	segment.SharedAllocator

	mu            sync.Mutex
	shared, block measure.Histogram
}

var _ segment.SharedAllocator = (*timedAllocator)(nil)

func (a *timedAllocator) AllocateShared(ctx context.Context, region, n int, after snowflake.ID, clientID string) (segment.Block, error) {
	start := time.Now()
	b, err := a.SharedAllocator.AllocateShared(ctx, region, n, after, clientID)
	a.record(&a.shared, time.Since(start))
	return b, err
}

func (a *timedAllocator) Allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	start := time.Now()
	b, err := a.SharedAllocator.Allocate(ctx, l, n)
	a.record(&a.block, time.Since(start))
	return b, err
}

func (a *timedAllocator) record(h *measure.Histogram, d time.Duration) {
	a.mu.Lock()
	h.Record(d)
	a.mu.Unlock()
}

// reset forgets what was timed so far (the setup's grants).
func (a *timedAllocator) reset() {
	a.mu.Lock()
	a.shared.Reset()
	a.block.Reset()
	a.mu.Unlock()
}

// grantLatency sums the timings of allocs per RPC method, as
// Report.ServerLatency names them.
func grantLatency(allocs []*timedAllocator) map[string]measure.Summary {
	var shared, block measure.Histogram
	for _, a := range allocs {
		a.mu.Lock()
		shared.Merge(&a.shared)
		block.Merge(&a.block)
		a.mu.Unlock()
	}
	out := map[string]measure.Summary{}
	if shared.Count() > 0 {
		out[sharedMethod] = shared.Summary()
	}
	if block.Count() > 0 {
		out["AllocateBlock"] = block.Summary()
	}
	return out
}
