package wire

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
)

// MaxSharedBatch bounds the requests of one AllocateSharedBatch call; the
// service refuses more as InvalidArgument.
const MaxSharedBatch = 1024

// batchTimeout bounds a batch whose callers set no deadline.
const batchTimeout = 30 * time.Second

// sharedBatcher sends the AllocateShared requests of the clients that share
// one allocator (one connection) with natural batching: a request that
// finds no call in flight goes out at once, as a plain AllocateShared with
// its caller's context; requests that arrive while a call is in flight wait
// for it and then go out together, as one AllocateSharedBatch. A lone
// client (the usual process) thus sees exactly the unary call, and many
// clients of one process pay gRPC's per-call cost once per round trip
// instead of once per request: the busier the connection, the larger the
// batches, and the cost per request falls as the load grows.
type sharedBatcher struct {
	c idrangev1.RangeServiceClient

	mu      sync.Mutex
	queue   []*sharedCall
	sending bool // a sender goroutine owns the queue

	// unary is set when the service answered AllocateSharedBatch with
	// Unimplemented (it predates it): every request then goes alone.
	unary atomic.Bool
}

// sharedCall is one caller's request and, once done is closed, its answer.
type sharedCall struct {
	ctx  context.Context
	req  *idrangev1.AllocateSharedRequest
	resp *idrangev1.AllocateSharedResponse
	err  error // a gRPC status error, as the unary call returns
	done chan struct{}
}

// do sends req, alone or in a batch, and waits for its answer or ctx.
func (b *sharedBatcher) do(ctx context.Context, req *idrangev1.AllocateSharedRequest) (*idrangev1.AllocateSharedResponse, error) {
	if b.unary.Load() {
		return b.c.AllocateShared(ctx, req)
	}
	call := &sharedCall{ctx: ctx, req: req, done: make(chan struct{})}
	b.mu.Lock()
	if !b.sending {
		b.sending = true
		b.mu.Unlock()
		b.one(call)
		b.mu.Lock()
		if len(b.queue) == 0 {
			b.sending = false
			b.mu.Unlock()
		} else {
			b.mu.Unlock()
			go b.drain()
		}
		return call.resp, call.err
	}
	b.queue = append(b.queue, call)
	b.mu.Unlock()
	select {
	case <-call.done:
		return call.resp, call.err
	case <-ctx.Done():
		// The batch may still carve a run for it: a wasted run, never a
		// reused one.
		return nil, status.FromContextError(ctx.Err()).Err()
	}
}

// one sends call alone, as a plain AllocateShared.
func (b *sharedBatcher) one(call *sharedCall) {
	call.resp, call.err = b.c.AllocateShared(call.ctx, call.req)
	close(call.done)
}

// drain sends what queued while a call was in flight, in batches of up to
// MaxSharedBatch, one at a time, until the queue is empty; then it clears
// sending. It runs on a goroutine of its own, so no caller waits for
// another's request.
func (b *sharedBatcher) drain() {
	for {
		b.mu.Lock()
		n := min(len(b.queue), MaxSharedBatch)
		if n == 0 {
			b.sending = false
			b.mu.Unlock()
			return
		}
		calls := make([]*sharedCall, 0, n)
		for _, c := range b.queue[:n] {
			if c.ctx.Err() == nil {
				calls = append(calls, c)
			}
		}
		b.queue = append(b.queue[:0], b.queue[n:]...)
		b.mu.Unlock()
		switch {
		case len(calls) == 0:
		case len(calls) == 1:
			b.one(calls[0])
		default:
			b.batch(calls)
		}
	}
}

// batch sends calls as one AllocateSharedBatch and hands each its result.
// The call's deadline is the latest of its callers' (each caller stops
// waiting at its own); a service without the RPC gets them one by one, and
// every later request too.
func (b *sharedBatcher) batch(calls []*sharedCall) {
	deadline := time.Time{}
	reqs := make([]*idrangev1.AllocateSharedRequest, len(calls))
	for i, c := range calls {
		reqs[i] = c.req
		d, ok := c.ctx.Deadline()
		if !ok {
			d = time.Now().Add(batchTimeout)
		}
		if d.After(deadline) {
			deadline = d
		}
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(calls[0].ctx), deadline)
	resp, err := b.c.AllocateSharedBatch(ctx, &idrangev1.AllocateSharedBatchRequest{Requests: reqs})
	cancel()
	if status.Code(err) == codes.Unimplemented {
		b.unary.Store(true)
		var wg sync.WaitGroup
		for _, c := range calls {
			wg.Go(func() { b.one(c) })
		}
		wg.Wait()
		return
	}
	if err == nil && len(resp.GetResults()) != len(calls) {
		err = fmt.Errorf("AllocateSharedBatch reply: %d results for %d requests: %w", len(resp.GetResults()), len(calls), ErrProtocol)
	}
	for i, c := range calls {
		switch {
		case err != nil:
			c.err = err
		case resp.GetResults()[i].GetStatus().GetCode() != int32(codes.OK):
			c.err = status.ErrorProto(resp.GetResults()[i].GetStatus())
		case resp.GetResults()[i].GetRun() == nil:
			c.err = fmt.Errorf("AllocateSharedBatch reply: result %d has neither a run nor a refusal: %w", i, ErrProtocol)
		default:
			c.resp = resp.GetResults()[i].GetRun()
		}
		close(c.done)
	}
}
