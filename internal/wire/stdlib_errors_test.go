package wire

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/segment"
)

// Every fault a server's Allocator can report reaches the client through a
// real gRPC server (grpctest's in-memory listener) as an error that the
// standard library's errors.Is matches against the same sentinel, and
// against no other; errors.As finds *segment.Backpressure with its delay;
// the message is the server's, on one line. All four calls are checked.
func TestSentinelsCrossGRPCForStdlibErrorsIs(t *testing.T) {
	sentinels := []error{
		segment.ErrFenced, segment.ErrLeaseLost, segment.ErrBackpressure, segment.ErrNoFreeCode,
		segment.ErrEpochExhausted, segment.ErrCorrupt, segment.ErrHighWaterRegressed, segment.ErrInvalid, segment.ErrUnavailable,
		context.DeadlineExceeded, context.Canceled,
	}
	cases := []struct {
		name string
		err  error // what the server's Allocator returns
		want error // the sentinel the client must see
		code codes.Code
	}{
		{"fenced", fmt.Errorf("worker 3 token 9: %w", segment.ErrFenced), segment.ErrFenced, codes.FailedPrecondition},
		{"lease lost", fmt.Errorf("lease 11: %w", segment.ErrLeaseLost), segment.ErrLeaseLost, codes.FailedPrecondition},
		{"backpressure", fmt.Errorf("code 1: %w", &segment.Backpressure{RetryAfter: 40 * time.Millisecond}), segment.ErrBackpressure, codes.ResourceExhausted},
		{"no free code", fmt.Errorf("region 2: 256 of 256 leased: %w", segment.ErrNoFreeCode), segment.ErrNoFreeCode, codes.ResourceExhausted},
		{"epoch exhausted", fmt.Errorf("hi: %w", segment.ErrEpochExhausted), segment.ErrEpochExhausted, codes.OutOfRange},
		{"corrupt", fmt.Errorf("hwm key: %w", segment.ErrCorrupt), segment.ErrCorrupt, codes.DataLoss},
		// A kind of ErrCorrupt: the client sees both.
		{"high water regressed", fmt.Errorf("worker 7: %w", segment.ErrHighWaterRegressed), segment.ErrHighWaterRegressed, codes.DataLoss},
		{"invalid", fmt.Errorf("count 0: %w", segment.ErrInvalid), segment.ErrInvalid, codes.InvalidArgument},
		{"unavailable", fmt.Errorf("etcd: %w", segment.ErrUnavailable), segment.ErrUnavailable, codes.Unavailable},
		// A sentinel with its cause (two %w): the sentinel decides the status.
		{"unavailable with cause", fmt.Errorf("%w: %w", segment.ErrUnavailable, context.DeadlineExceeded), segment.ErrUnavailable, codes.Unavailable},
		// Fencing wins over anything else the error also says.
		{"fenced and unavailable", fmt.Errorf("%w; %w", segment.ErrUnavailable, segment.ErrFenced), segment.ErrFenced, codes.FailedPrecondition},
		{"server deadline", fmt.Errorf("etcd: %w", context.DeadlineExceeded), context.DeadlineExceeded, codes.DeadlineExceeded},
	}
	calls := []struct {
		name string
		call func(context.Context, segment.Allocator) error
	}{
		{"Acquire", func(ctx context.Context, a segment.Allocator) error { _, err := a.Acquire(ctx, 2, "x"); return err }},
		{"Renew", func(ctx context.Context, a segment.Allocator) error { _, err := a.Renew(ctx, testLease); return err }},
		{"Release", func(ctx context.Context, a segment.Allocator) error { return a.Release(ctx, testLease) }},
		{"Allocate", func(ctx context.Context, a segment.Allocator) error {
			_, err := a.Allocate(ctx, testLease, 10)
			return err
		}},
	}
	f := newFake()
	a := dialRelay(t, &relay{a: f})
	ctx := context.Background()
	for _, tc := range cases {
		for _, c := range calls {
			t.Run(tc.name+"/"+c.name, func(t *testing.T) {
				f.mu.Lock()
				f.fail = tc.err
				f.mu.Unlock()
				err := c.call(ctx, a)
				if !errors.Is(err, tc.want) {
					t.Fatalf("errors.Is(%v, %v) = false", err, tc.want)
				}
				for _, other := range sentinels {
					if other != tc.want && errors.Is(err, other) && !errors.Is(tc.want, other) {
						t.Fatalf("errors.Is(%v, %v) = true, want only %v", err, other, tc.want)
					}
				}
				if got := status.Code(err); got != tc.code {
					t.Fatalf("status code %v, want %v", got, tc.code)
				}
				if err.Error() != tc.err.Error() || strings.Contains(err.Error(), "\n") {
					t.Fatalf("message %q, want the server's %q on one line", err.Error(), tc.err.Error())
				}
				var bp *segment.Backpressure
				if errors.As(err, &bp) != (tc.want == segment.ErrBackpressure) {
					t.Fatalf("errors.As(*Backpressure) = %v on %v", bp, err)
				}
				if bp != nil && bp.RetryAfter != 40*time.Millisecond {
					t.Fatalf("RetryAfter %v, want 40ms", bp.RetryAfter)
				}
			})
		}
	}
}

var testLease = segment.Lease{Region: 2, Worker: 1, Token: 5, LeaseID: 9}

// A multi-line message from a server (another implementation, a proxy)
// still reaches the client's logs as one line.
func TestErrorFromStatusIsOneLine(t *testing.T) {
	err := FromStatus(status.Error(codes.Unavailable, "proxy: upstream failed\ngoroutine 1 [running]:\nmain.main()"))
	if !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("errors.Is(%v, ErrUnavailable) = false", err)
	}
	if msg := err.Error(); strings.Contains(msg, "\n") {
		t.Fatalf("message spans lines: %q", msg)
	}
}
