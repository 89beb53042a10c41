// Package wire is the gRPC boundary of the range service: it maps idrange's
// sentinel errors to gRPC statuses and back, and adapts the generated
// RangeService client to segment.Allocator.
//
// The mapping is two-sided so that errors.Is works across the network: the
// server turns segment.ErrFenced into FailedPrecondition carrying a
// google.rpc.ErrorInfo whose reason names the sentinel ("FENCED"), and the
// client turns that status back into an error that wraps segment.ErrFenced,
// keeping the server's message. Backpressure travels as ResourceExhausted
// with a google.rpc.RetryInfo, so errors.As(err, &*segment.Backpressure)
// yields the server's RetryAfter on the client.
//
// Statuses without idrange's ErrorInfo (transport failures, other servers)
// are mapped by code alone, conservatively: FailedPrecondition becomes
// ErrLeaseLost (stop minting), PermissionDenied and Unauthenticated become
// ErrPermissionDenied, Unavailable becomes ErrUnavailable (retry).
//
// The client imports this package (rangeclient's gRPC path), so, like the
// libraries, it uses the standard library's errors and nothing that would
// pull cockroachdb/errors into a client (internal/tools/depcheck).
package wire

import (
	"context"
	"errors"
	"strings"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/protoadapt"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// ErrorDomain is the google.rpc.ErrorInfo domain of idrange's statuses.
const ErrorDomain = "idrange.v1"

// ErrProtocol: a reply from the range service is malformed (for example a
// block with Hi <= Lo). The reply is not used; treat the call as failed.
var ErrProtocol = errors.New("wire: malformed reply from range service")

// mapping ties one sentinel to its status code and ErrorInfo reason.
type mapping struct {
	sentinel error
	code     codes.Code
	reason   string
}

// mappings is checked in order by ToStatus: the first sentinel err wraps
// decides the status. Fencing comes first: an error that says "fenced" must
// stop the client even if it also says something else.
var mappings = []mapping{
	{segment.ErrFenced, codes.FailedPrecondition, "FENCED"},
	{segment.ErrLeaseLost, codes.FailedPrecondition, "LEASE_LOST"},
	{segment.ErrPermissionDenied, codes.PermissionDenied, "PERMISSION_DENIED"},
	{segment.ErrCodeCap, codes.ResourceExhausted, "CODE_CAP"},
	{segment.ErrBackpressure, codes.ResourceExhausted, "BACKPRESSURE"},
	{segment.ErrNoFreeCode, codes.ResourceExhausted, "NO_FREE_CODE"},
	{segment.ErrEpochExhausted, codes.OutOfRange, "EPOCH_EXHAUSTED"},
	// Before ErrCorrupt, which it is a kind of: the client drops a code
	// whose mark went back and takes another, but stops on a corrupt one.
	{segment.ErrHighWaterRegressed, codes.DataLoss, "HIGH_WATER_REGRESSED"},
	{segment.ErrCorrupt, codes.DataLoss, "CORRUPT"},
	{segment.ErrInvalid, codes.InvalidArgument, "INVALID"},
	{segment.ErrUnavailable, codes.Unavailable, "UNAVAILABLE"},
	{snowflake.ErrClockMovedBack, codes.Unavailable, "CLOCK_MOVED_BACK"},
	{snowflake.ErrClockBehindHighWater, codes.Unavailable, "CLOCK_BEHIND_HIGH_WATER"},
	{snowflake.ErrSequenceExhausted, codes.ResourceExhausted, "SEQUENCE_EXHAUSTED"},
	{snowflake.ErrPersist, codes.Unavailable, "PERSIST"},
	{snowflake.ErrClosed, codes.Unavailable, "CLOSED"},
	{snowflake.ErrInvalidID, codes.InvalidArgument, "INVALID_ID"},
	{snowflake.ErrFieldRange, codes.InvalidArgument, "FIELD_RANGE"},
}

// Reason returns the ErrorInfo reason ToStatus uses for err's sentinel, or ""
// if err wraps none of them.
func Reason(err error) string {
	if m, ok := find(err); ok {
		return m.reason
	}
	return ""
}

func find(err error) (mapping, bool) {
	for _, m := range mappings {
		if errors.Is(err, m.sentinel) {
			return m, true
		}
	}
	return mapping{}, false
}

// ToStatus converts an error from a segment.Allocator (or snowflake) into a
// gRPC status error for a server handler to return. The status message is
// err.Error(). Errors that already carry a gRPC status pass through;
// context errors become Canceled / DeadlineExceeded; anything else is
// Internal. ToStatus(nil) is nil.
func ToStatus(err error) error {
	if err == nil {
		return nil
	}
	if m, ok := find(err); ok {
		st := status.New(m.code, err.Error())
		details := []protoadapt.MessageV1{&errdetails.ErrorInfo{Reason: m.reason, Domain: ErrorDomain}}
		var bp *segment.Backpressure
		if errors.As(err, &bp) {
			details = append(details, &errdetails.RetryInfo{RetryDelay: durationpb.New(bp.RetryAfter)})
		}
		if withDetails, derr := st.WithDetails(details...); derr == nil {
			st = withDetails
		}
		return st.Err()
	}
	if st, ok := status.FromError(err); ok {
		return st.Err()
	}
	switch {
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

// Error is an error received from the range service. Its message is the
// server's; it unwraps to the idrange sentinel the status names (if any), so
// errors.Is and errors.As work as they would in process, and it still
// carries the gRPC status (status.Code(err) works).
type Error struct {
	st    *status.Status
	cause error // the sentinel (or *segment.Backpressure), may be nil
}

// Error is the server's status message, on one line: line breaks (a
// stack trace from another server, say) become "; ".
func (e *Error) Error() string {
	m := e.st.Message()
	if !strings.ContainsAny(m, "\r\n") {
		return m
	}
	return strings.Join(strings.FieldsFunc(m, func(r rune) bool { return r == '\r' || r == '\n' }), "; ")
}

// Unwrap returns the sentinel the status maps to, or nil.
func (e *Error) Unwrap() error { return e.cause }

// GRPCStatus returns the status as received, for status.FromError.
func (e *Error) GRPCStatus() *status.Status { return e.st }

// Code is the gRPC status code.
func (e *Error) Code() codes.Code { return e.st.Code() }

// FromStatus converts an error returned by a gRPC client call into an error
// that wraps the matching idrange sentinel (see the package doc), keeping the
// server's message. Errors that carry no gRPC status are returned unchanged;
// FromStatus(nil) is nil.
func FromStatus(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	var (
		info  *errdetails.ErrorInfo
		retry *errdetails.RetryInfo
	)
	for _, d := range st.Details() {
		switch d := d.(type) {
		case *errdetails.ErrorInfo:
			if d.GetDomain() == ErrorDomain && info == nil {
				info = d
			}
		case *errdetails.RetryInfo:
			retry = d
		}
	}
	e := &Error{st: st}
	if info != nil {
		for _, m := range mappings {
			if m.reason == info.GetReason() {
				e.cause = m.sentinel
				break
			}
		}
	}
	if e.cause == nil {
		e.cause = byCode(st.Code(), retry != nil)
	}
	if errors.Is(e.cause, segment.ErrBackpressure) {
		var d time.Duration
		if retry != nil && retry.GetRetryDelay() != nil {
			d = retry.GetRetryDelay().AsDuration()
		}
		e.cause = &segment.Backpressure{RetryAfter: d}
	}
	return e
}

// byCode is the conservative mapping for statuses without idrange's
// ErrorInfo.
func byCode(c codes.Code, hasRetry bool) error {
	switch c {
	case codes.FailedPrecondition:
		return segment.ErrLeaseLost
	case codes.PermissionDenied, codes.Unauthenticated:
		// Refused by the service's authentication (internal/server/authz) or by
		// a proxy: this caller may not do this, retrying will not help.
		return segment.ErrPermissionDenied
	case codes.ResourceExhausted:
		if hasRetry {
			return segment.ErrBackpressure
		}
		return nil
	case codes.Unavailable:
		return segment.ErrUnavailable
	case codes.InvalidArgument:
		return segment.ErrInvalid
	case codes.DataLoss:
		return segment.ErrCorrupt
	case codes.OutOfRange:
		return segment.ErrEpochExhausted
	case codes.DeadlineExceeded:
		return context.DeadlineExceeded
	case codes.Canceled:
		return context.Canceled
	}
	return nil
}
