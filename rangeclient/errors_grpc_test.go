package rangeclient

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/grpctest"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
)

// The errors New returns when the service refuses the first lease, after
// crossing a real gRPC server (internal/service over the in-memory fake):
// each matches its sentinels with the standard library's errors.Is, says
// whether it is retryable, and is one line.
func TestNewErrorsThroughGRPCMatchStdlibErrorsIs(t *testing.T) {
	cases := []struct {
		name      string
		refuse    error   // what the service's store answers Acquire with
		want      []error // sentinels errors.Is must find
		retryable bool
	}{
		{"epoch exhausted", segment.ErrEpochExhausted, []error{ErrEpochExhausted, segment.ErrEpochExhausted}, false},
		{"corrupt", segment.ErrCorrupt, []error{segment.ErrCorrupt}, false},
		{"invalid", segment.ErrInvalid, []error{segment.ErrInvalid}, false},
		{"no free code", segment.ErrNoFreeCode, []error{ErrUnavailable, context.DeadlineExceeded, segment.ErrNoFreeCode}, true},
		{"store unavailable", segment.ErrUnavailable, []error{ErrUnavailable, context.DeadlineExceeded, segment.ErrUnavailable}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := rangeclienttest.New(rangeclienttest.Options{Region: 1})
			conn := fake.Conn()
			conn.SetHook(func(_ context.Context, m rangeclienttest.Method) error {
				if m == rangeclienttest.Acquire {
					return fmt.Errorf("test store: %w", tc.refuse)
				}
				return nil
			})
			svc, err := service.New(service.Config{Region: 1, Allocator: conn})
			if err != nil {
				t.Fatal(err)
			}
			alloc := wire.NewAllocator(grpctest.Dial(t, svc.Register))
			ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
			defer cancel()
			c, err := New(ctx, Config{Allocator: alloc, Region: 1, Owner: t.Name()})
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("errors.Is(%v, %v) = false", err, w)
				}
			}
			if IsRetryable(err) != tc.retryable {
				t.Errorf("IsRetryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err.Error())
			}
		})
	}
}
