package engine

import (
	"errors"
	"fmt"
	"strings"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Sentinel errors returned by the Engine, and by rangeclient, which exports
// these same values with their documentation for users. Check them with
// errors.Is; the messages that wrap them say which lease, block or field
// was involved.
//
// Retryable (the client keeps working in the background and a later call may
// succeed without restarting it): ErrLeaseLost, ErrFenced, ErrUnavailable,
// ErrOverlap. Final: ErrClosed, ErrEpochExhausted, ErrInvalidConfig.
// IsRetryable tells them apart.
var (
	// ErrLeaseLost: the client's worker-code lease is past its local safety
	// deadline (the last renewal that succeeded was sent more than TTL -
	// SafetyMargin ago), so the client stopped minting. It is decided locally,
	// without any network call. The client acquires a fresh lease in the
	// background and resumes by itself. Errors returned for it also satisfy
	// errors.Is(err, segment.ErrLeaseLost).
	ErrLeaseLost = errors.New("rangeclient: lease lost: past the local safety deadline")

	// ErrFenced: the service answered that the client's lease is no longer
	// the code's current one (segment.ErrFenced or segment.ErrLeaseLost in
	// reply to a renewal or a grant). The client stopped minting at once and
	// acquires a fresh lease in the background. The service's error stays in
	// the chain, so errors.Is(err, segment.ErrFenced) works too.
	ErrFenced = errors.New("rangeclient: fenced: the service no longer accepts this lease")

	// ErrUnavailable: both block buffers are empty and no refill arrived
	// before the caller's context ended (the service is slow or unreachable,
	// or the code is at its 4,096 IDs/ms limit and the service applies
	// backpressure). Retryable. The context's error and the last refill error
	// are in the chain.
	ErrUnavailable = errors.New("rangeclient: no block available before the deadline")

	// ErrOverlap: the service granted a block that overlaps one this client
	// was granted before on the same worker code (under this lease or an
	// earlier one): the code's high-water mark went back somewhere (a
	// tampered or restored etcd, a bug). Nothing is minted from that block;
	// the client stops minting on the code at once, leaves its lease to
	// expire and takes another code in the background, so it is retryable.
	// Errors returned for it also satisfy errors.Is(err, segment.ErrCorrupt).
	// Stats.Overlaps counts them. The same happens, without this sentinel,
	// when the service refuses the code with segment.ErrHighWaterRegressed.
	ErrOverlap = errors.New("rangeclient: granted block overlaps one this client already had")

	// ErrClosed: Close was called. Final.
	ErrClosed = errors.New("rangeclient: client closed")

	// ErrEpochExhausted: the service cannot grant blocks because the
	// timestamp field would pass snowflake.MaxTimestamp. Final: a new ID
	// format version is needed. Alias of snowflake.ErrEpochExhausted.
	ErrEpochExhausted = snowflake.ErrEpochExhausted

	// ErrInvalidConfig: a Config field is out of range; the message names the
	// field. Returned by Config.Validate and New.
	ErrInvalidConfig = errors.New("rangeclient: invalid config")
)

// IsRetryable reports whether a later call may succeed without building a
// new Client: true for ErrLeaseLost, ErrFenced, ErrUnavailable and
// ErrOverlap, and for a code the service refuses with
// segment.ErrHighWaterRegressed (the client recovers in the background, on
// another code for the last two), false for nil, ErrClosed,
// ErrEpochExhausted, ErrInvalidConfig and anything else.
func IsRetryable(err error) bool {
	if err == nil || errors.Is(err, ErrClosed) || errors.Is(err, ErrEpochExhausted) || errors.Is(err, ErrInvalidConfig) {
		return false
	}
	return errors.Is(err, ErrLeaseLost) || errors.Is(err, ErrFenced) || errors.Is(err, ErrUnavailable) || isUnsafeCode(err)
}

// leaseLostError wraps ErrLeaseLost with detail and marks it as
// segment.ErrLeaseLost, so callers checking either sentinel see it.
func leaseLostError(format string, args ...any) error {
	return mark(fmt.Errorf(format+": %w", append(args, ErrLeaseLost)...), segment.ErrLeaseLost)
}

// fencedError keeps the service's error (cause) in the chain and marks the
// result as ErrFenced.
func fencedError(cause error, format string, args ...any) error {
	return mark(fmt.Errorf(format+": %w", append(args, cause)...), ErrFenced)
}

// marked is err that errors.Is and errors.As also match against sentinel,
// with err's message alone: a caller checking for sentinel sees it, and the
// message is not lengthened by a second sentinel's text.
type marked struct{ err, sentinel error }

func mark(err, sentinel error) error { return &marked{err, sentinel} }

func (m *marked) Error() string   { return m.err.Error() }
func (m *marked) Unwrap() []error { return []error{m.err, m.sentinel} }

// joined is several errors on one line, separated by "; ". Unlike
// errors.Join it never puts a newline into a log line; errors.Is and
// errors.As see each of them.
type joined []error

// join returns the non-nil errs as one error: nil if there are none, the
// error itself if there is one.
func join(errs ...error) error {
	var j joined
	for _, err := range errs {
		if err != nil {
			j = append(j, err)
		}
	}
	switch len(j) {
	case 0:
		return nil
	case 1:
		return j[0]
	}
	return j
}

func (j joined) Error() string {
	msgs := make([]string, len(j))
	for i, err := range j {
		msgs[i] = err.Error()
	}
	return strings.Join(msgs, "; ")
}

func (j joined) Unwrap() []error { return j }

// isFencedReply reports whether a service error means "this lease is no
// longer the code's owner": stop minting now. Under mutual TLS the service
// answers a call on a lease its caller's identity does not hold (expired,
// released or fenced, so its record is gone) with PermissionDenied, the one
// answer a stranger gets too: on a renewal or a grant that also means gone.
func isFencedReply(err error) bool {
	return errors.Is(err, segment.ErrFenced) || errors.Is(err, segment.ErrLeaseLost) || errors.Is(err, segment.ErrPermissionDenied)
}

// isFinalRefillError reports refill errors that will not go away by
// retrying soon: callers waiting for a block get them at once instead of
// waiting out their deadline. The refill loop still retries (with backoff),
// so an operator's repair is picked up without a restart.
func isFinalRefillError(err error) bool {
	return errors.Is(err, segment.ErrEpochExhausted) || errors.Is(err, segment.ErrInvalid) || errors.Is(err, segment.ErrCorrupt) ||
		errors.Is(err, segment.ErrPermissionDenied)
}
