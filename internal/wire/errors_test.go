package wire

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func TestMappingRoundTrip(t *testing.T) {
	cases := []struct {
		sentinel error
		code     codes.Code
	}{
		{segment.ErrFenced, codes.FailedPrecondition},
		{segment.ErrLeaseLost, codes.FailedPrecondition},
		{segment.ErrPermissionDenied, codes.PermissionDenied},
		{segment.ErrCodeCap, codes.ResourceExhausted},
		{segment.ErrBackpressure, codes.ResourceExhausted},
		{segment.ErrNoFreeCode, codes.ResourceExhausted},
		{segment.ErrEpochExhausted, codes.OutOfRange},
		{segment.ErrHighWaterRegressed, codes.DataLoss},
		{segment.ErrCorrupt, codes.DataLoss},
		{segment.ErrInvalid, codes.InvalidArgument},
		{segment.ErrUnavailable, codes.Unavailable},
		{snowflake.ErrClockMovedBack, codes.Unavailable},
		{snowflake.ErrClockBehindHighWater, codes.Unavailable},
		{snowflake.ErrSequenceExhausted, codes.ResourceExhausted},
		{snowflake.ErrPersist, codes.Unavailable},
		{snowflake.ErrClosed, codes.Unavailable},
		{snowflake.ErrInvalidID, codes.InvalidArgument},
		{snowflake.ErrFieldRange, codes.InvalidArgument},
	}
	if len(cases) != len(mappings) {
		t.Fatalf("table has %d cases, mappings has %d: keep them in step", len(cases), len(mappings))
	}
	for _, tc := range cases {
		t.Run(Reason(tc.sentinel), func(t *testing.T) {
			orig := fmt.Errorf("worker %d: %w", 7, tc.sentinel)
			st := ToStatus(orig)
			if got := status.Code(st); got != tc.code {
				t.Fatalf("ToStatus code = %v, want %v", got, tc.code)
			}
			if got := status.Convert(st).Message(); got != orig.Error() {
				t.Fatalf("message = %q, want %q", got, orig.Error())
			}
			back := FromStatus(st)
			if !errors.Is(back, tc.sentinel) {
				t.Fatalf("FromStatus(%v) does not wrap %v", back, tc.sentinel)
			}
			for _, other := range cases {
				if other.sentinel != tc.sentinel && errors.Is(back, other.sentinel) && !errors.Is(tc.sentinel, other.sentinel) {
					t.Fatalf("FromStatus(%v) also wraps %v", back, other.sentinel)
				}
			}
			if back.Error() != orig.Error() {
				t.Fatalf("client message = %q, want %q", back.Error(), orig.Error())
			}
			if status.Code(back) != tc.code {
				t.Fatalf("status.Code on client error = %v, want %v", status.Code(back), tc.code)
			}
			// Second trip (a service relaying a client error) keeps it.
			if again := FromStatus(ToStatus(back)); !errors.Is(again, tc.sentinel) || again.Error() != orig.Error() {
				t.Fatalf("second round trip lost the sentinel or message: %v", again)
			}
		})
	}
}

func TestBackpressureRetryAfterCrossesWire(t *testing.T) {
	orig := fmt.Errorf("code 3: %w", &segment.Backpressure{RetryAfter: 1500 * time.Millisecond})
	st := ToStatus(orig)
	if status.Code(st) != codes.ResourceExhausted {
		t.Fatalf("code = %v", status.Code(st))
	}
	var ri *errdetails.RetryInfo
	for _, d := range status.Convert(st).Details() {
		if r, ok := d.(*errdetails.RetryInfo); ok {
			ri = r
		}
	}
	if ri == nil || ri.GetRetryDelay().AsDuration() != 1500*time.Millisecond {
		t.Fatalf("RetryInfo = %v, want 1.5s", ri)
	}
	back := FromStatus(st)
	var bp *segment.Backpressure
	if !errors.As(back, &bp) {
		t.Fatalf("errors.As(*Backpressure) failed on %v", back)
	}
	if bp.RetryAfter != 1500*time.Millisecond {
		t.Fatalf("RetryAfter = %v, want 1.5s", bp.RetryAfter)
	}
	if !errors.Is(back, segment.ErrBackpressure) {
		t.Fatal("not ErrBackpressure")
	}
}

func TestToStatusOtherErrors(t *testing.T) {
	cases := []struct {
		name string
		err  error
		code codes.Code
	}{
		{"canceled", fmt.Errorf("x: %w", context.Canceled), codes.Canceled},
		{"deadline", fmt.Errorf("etcd: %w", context.DeadlineExceeded), codes.DeadlineExceeded},
		{"unknown", errors.New("boom"), codes.Internal},
		{"status passes through", status.Error(codes.PermissionDenied, "no"), codes.PermissionDenied},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := status.Code(ToStatus(tc.err)); got != tc.code {
				t.Fatalf("code = %v, want %v", got, tc.code)
			}
		})
	}
	if ToStatus(nil) != nil || FromStatus(nil) != nil {
		t.Fatal("nil must map to nil")
	}
}

// Statuses from elsewhere (no idrange ErrorInfo) map conservatively by code.
func TestFromStatusForeign(t *testing.T) {
	cases := []struct {
		code codes.Code
		want error // nil: no sentinel
	}{
		{codes.FailedPrecondition, segment.ErrLeaseLost},
		{codes.Unavailable, segment.ErrUnavailable},
		{codes.PermissionDenied, segment.ErrPermissionDenied},
		{codes.Unauthenticated, segment.ErrPermissionDenied},
		{codes.InvalidArgument, segment.ErrInvalid},
		{codes.DataLoss, segment.ErrCorrupt},
		{codes.OutOfRange, segment.ErrEpochExhausted},
		{codes.DeadlineExceeded, context.DeadlineExceeded},
		{codes.Canceled, context.Canceled},
		{codes.ResourceExhausted, nil},
		{codes.Internal, nil},
	}
	all := []error{segment.ErrFenced, segment.ErrLeaseLost, segment.ErrBackpressure, segment.ErrNoFreeCode,
		segment.ErrUnavailable, segment.ErrInvalid, segment.ErrCorrupt, segment.ErrHighWaterRegressed, segment.ErrEpochExhausted,
		segment.ErrPermissionDenied, segment.ErrCodeCap}
	for _, tc := range cases {
		t.Run(tc.code.String(), func(t *testing.T) {
			back := FromStatus(status.Error(tc.code, "foreign"))
			if back.Error() != "foreign" {
				t.Fatalf("message = %q", back.Error())
			}
			if tc.want != nil && !errors.Is(back, tc.want) {
				t.Fatalf("%v does not wrap %v", back, tc.want)
			}
			for _, s := range all {
				if s != tc.want && errors.Is(back, s) {
					t.Fatalf("%v wraps unexpected %v", back, s)
				}
			}
		})
	}
	plain := errors.New("not a status")
	if FromStatus(plain) != plain {
		t.Fatal("a non-status error must pass unchanged")
	}
	// ResourceExhausted with RetryInfo but no ErrorInfo is backpressure.
	st, err := status.New(codes.ResourceExhausted, "slow down").WithDetails(&errdetails.RetryInfo{})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(FromStatus(st.Err()), segment.ErrBackpressure) {
		t.Fatal("ResourceExhausted+RetryInfo should be backpressure")
	}
}
