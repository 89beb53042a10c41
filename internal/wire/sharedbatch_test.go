package wire

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// sharedFake answers AllocateShared and AllocateSharedBatch: a run of the
// asked count at a position of its own per request, or what refuse says.
// gate, when set, holds the first unary call until it is closed.
type sharedFake struct {
	idrangev1.RangeServiceClient // other methods are not called

	gate     chan struct{}
	noBatch  bool                                           // answer AllocateSharedBatch Unimplemented
	short    bool                                           // answer a batch with one result too few
	refuse   func(r *idrangev1.AllocateSharedRequest) error // nil: grant
	mu       sync.Mutex
	next     int64
	unary    int
	batches  []int // size of each AllocateSharedBatch call
	gateOnce sync.Once
}

func (f *sharedFake) run(r *idrangev1.AllocateSharedRequest) *idrangev1.AllocateSharedResponse {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next += 1 << 20
	now := snowflake.Epoch.Add(time.Hour) // synctest's clock starts before the epoch
	return &idrangev1.AllocateSharedResponse{Region: 0, Worker: 3, Lo: f.next, Hi: f.next + int64(r.GetCount()),
		ServiceTimeUnixNano: now.UnixNano(), ValidUntilUnixNano: now.Add(900 * time.Millisecond).UnixNano()}
}

func (f *sharedFake) AllocateShared(ctx context.Context, r *idrangev1.AllocateSharedRequest, _ ...grpc.CallOption) (*idrangev1.AllocateSharedResponse, error) {
	f.mu.Lock()
	f.unary++
	f.mu.Unlock()
	if f.gate != nil {
		f.gateOnce.Do(func() { <-f.gate })
	}
	if f.refuse != nil {
		if err := f.refuse(r); err != nil {
			return nil, ToStatus(err)
		}
	}
	return f.run(r), nil
}

func (f *sharedFake) AllocateSharedBatch(ctx context.Context, in *idrangev1.AllocateSharedBatchRequest, _ ...grpc.CallOption) (*idrangev1.AllocateSharedBatchResponse, error) {
	f.mu.Lock()
	f.batches = append(f.batches, len(in.GetRequests()))
	f.mu.Unlock()
	if f.noBatch {
		return nil, status.Error(codes.Unimplemented, "unknown method AllocateSharedBatch")
	}
	out := &idrangev1.AllocateSharedBatchResponse{}
	for _, r := range in.GetRequests() {
		if f.refuse != nil {
			if err := f.refuse(r); err != nil {
				out.Results = append(out.Results, &idrangev1.AllocateSharedResult{Status: status.Convert(ToStatus(err)).Proto()})
				continue
			}
		}
		out.Results = append(out.Results, &idrangev1.AllocateSharedResult{Run: f.run(r)})
	}
	if f.short {
		out.Results = out.Results[1:]
	}
	return out, nil
}

// callWhileHeld starts one call that the fake holds, then n more that
// queue behind it, and returns their outcomes once the gate opens. It
// runs inside a synctest bubble: synctest.Wait is the point at which every
// caller is blocked (the first in the fake, the others queued).
func callWhileHeld(t *testing.T, f *sharedFake, n int) (blocks []segment.Block, errs []error) {
	t.Helper()
	f.gate = make(chan struct{})
	a := &allocator{c: f, shared: &sharedBatcher{c: f}}
	blocks, errs = make([]segment.Block, n+1), make([]error, n+1)
	var wg sync.WaitGroup
	call := func(i int) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		blocks[i], errs[i] = a.AllocateShared(ctx, 0, 10+i, snowflake.ID(0), "c")
	}
	wg.Go(func() { call(0) })
	synctest.Wait() // the first call is in the fake
	for i := 1; i <= n; i++ {
		wg.Go(func() { call(i) })
	}
	synctest.Wait() // the others are queued behind it
	if got := len(a.shared.queue); got != n {
		t.Fatalf("%d requests queued behind the call in flight, want %d", got, n)
	}
	close(f.gate)
	wg.Wait()
	return blocks, errs
}

// Requests that wait while a call is in flight go out together, as one
// AllocateSharedBatch, and each caller gets its own run.
func TestSharedBatchGroupsWaitingCallers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &sharedFake{}
		blocks, errs := callWhileHeld(t, f, 10)
		seen := map[int64]bool{}
		for i, b := range blocks {
			if errs[i] != nil {
				t.Fatalf("call %d: %v", i, errs[i])
			}
			if b.Len() != int64(10+i) || seen[b.Lo] {
				t.Errorf("call %d: run [%d,%d), want %d positions of its own", i, b.Lo, b.Hi, 10+i)
			}
			seen[b.Lo] = true
		}
		if f.unary != 1 || len(f.batches) != 1 || f.batches[0] != 10 {
			t.Errorf("%d unary calls and batches %v, want 1 unary call and one batch of 10", f.unary, f.batches)
		}
	})
}

// A refusal inside a batch reaches its caller as the unary call's would
// have: the same sentinel, the same retry delay; the others get runs.
func TestSharedBatchRefusalPerRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &sharedFake{refuse: func(r *idrangev1.AllocateSharedRequest) error {
			if r.GetCount() == 12 {
				return &segment.Backpressure{RetryAfter: 250 * time.Millisecond}
			}
			return nil
		}}
		_, errs := callWhileHeld(t, f, 4)
		for i, err := range errs {
			if i != 2 {
				if err != nil {
					t.Errorf("call %d: %v", i, err)
				}
				continue
			}
			var bp *segment.Backpressure
			if !errors.Is(err, segment.ErrBackpressure) || !errors.As(err, &bp) || bp.RetryAfter != 250*time.Millisecond {
				t.Errorf("refused call: %v, want backpressure with a retry delay of 250ms", err)
			}
		}
	})
}

// A service that predates AllocateSharedBatch answers it Unimplemented:
// the waiting requests go one by one, and so does every later one.
func TestSharedBatchFallsBackToUnary(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &sharedFake{noBatch: true}
		_, errs := callWhileHeld(t, f, 3)
		for i, err := range errs {
			if err != nil {
				t.Errorf("call %d: %v", i, err)
			}
		}
		if f.unary != 4 || len(f.batches) != 1 {
			t.Errorf("%d unary calls, batches %v: want the 3 queued requests sent alone after one refused batch", f.unary, f.batches)
		}
		a := &allocator{c: f, shared: &sharedBatcher{c: f}}
		a.shared.unary.Store(true)
		if _, err := a.AllocateShared(context.Background(), 0, 5, 0, "c"); err != nil || len(f.batches) != 1 {
			t.Errorf("after the fallback: %v, batches %v", err, f.batches)
		}
	})
}

// A batch reply that does not answer every request is a protocol error for
// each of its callers, never a run given to the wrong one.
func TestSharedBatchShortReply(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &sharedFake{short: true}
		_, errs := callWhileHeld(t, f, 3)
		if errs[0] != nil {
			t.Errorf("the unary call: %v", errs[0])
		}
		for i, err := range errs[1:] {
			if !errors.Is(err, ErrProtocol) {
				t.Errorf("batched call %d: %v, want ErrProtocol", i+1, err)
			}
		}
	})
}

// A caller whose context ends while its request is queued returns at once
// with Canceled; the batch goes out without it.
func TestSharedBatchCallerGivesUp(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		f := &sharedFake{gate: make(chan struct{})}
		b := &sharedBatcher{c: f}
		var wg sync.WaitGroup
		wg.Go(func() { b.do(context.Background(), &idrangev1.AllocateSharedRequest{Count: 1}) })
		synctest.Wait()
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := b.do(ctx, &idrangev1.AllocateSharedRequest{Count: 2})
			done <- err
		}()
		synctest.Wait()
		cancel()
		if err := <-done; status.Code(err) != codes.Canceled {
			t.Errorf("queued caller after cancel: %v, want Canceled", err)
		}
		close(f.gate)
		wg.Wait()
		synctest.Wait() // the sender drains the queue and stops
		if len(f.batches) != 0 || f.unary != 1 {
			t.Errorf("%d unary calls, batches %v: the abandoned request was sent", f.unary, f.batches)
		}
		if b.sending || len(b.queue) != 0 {
			t.Errorf("sending %v with %d queued after the queue drained", b.sending, len(b.queue))
		}
	})
}
