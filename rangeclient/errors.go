package rangeclient

import "github.com/idrange/idrange/internal/client/engine"

// Sentinel errors returned by the Client. Check them with errors.Is; the
// messages that wrap them say which lease, block or field was involved.
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
	ErrLeaseLost = engine.ErrLeaseLost

	// ErrFenced: the service answered that the client's lease is no longer
	// the code's current one (segment.ErrFenced or segment.ErrLeaseLost in
	// reply to a renewal or a grant). The client stopped minting at once and
	// acquires a fresh lease in the background. The service's error stays in
	// the chain, so errors.Is(err, segment.ErrFenced) works too.
	ErrFenced = engine.ErrFenced

	// ErrUnavailable: both block buffers are empty and no refill arrived
	// before the caller's context ended (the service is slow or unreachable,
	// or the code is at its 4,096 IDs/ms limit and the service applies
	// backpressure). Retryable. The context's error and the last refill error
	// are in the chain.
	ErrUnavailable = engine.ErrUnavailable

	// ErrOverlap: the service granted a block that overlaps one this client
	// was granted before on the same worker code (under this lease or an
	// earlier one): the code's high-water mark went back somewhere (a
	// tampered or restored etcd, a bug). Nothing is minted from that block;
	// the client stops minting on the code at once, leaves its lease to
	// expire and takes another code in the background, so it is retryable.
	// Errors returned for it also satisfy errors.Is(err, segment.ErrCorrupt).
	// Stats.Overlaps counts them. The same happens, without this sentinel,
	// when the service refuses the code with segment.ErrHighWaterRegressed.
	ErrOverlap = engine.ErrOverlap

	// ErrClosed: Close was called. Final.
	ErrClosed = engine.ErrClosed

	// ErrEpochExhausted: the service cannot grant blocks because the
	// timestamp field would pass snowflake.MaxTimestamp. Final: a new ID
	// format version is needed. Alias of snowflake.ErrEpochExhausted.
	ErrEpochExhausted = engine.ErrEpochExhausted

	// ErrInvalidConfig: a Config field is out of range; the message names the
	// field. Returned by Config.Validate and New.
	ErrInvalidConfig = engine.ErrInvalidConfig
)

// IsRetryable reports whether a later call may succeed without building a
// new Client: true for ErrLeaseLost, ErrFenced, ErrUnavailable and
// ErrOverlap, and for a code the service refuses with
// segment.ErrHighWaterRegressed (the client recovers in the background, on
// another code for the last two), false for nil, ErrClosed,
// ErrEpochExhausted, ErrInvalidConfig and anything else.
func IsRetryable(err error) bool { return engine.IsRetryable(err) }
