package snowflake

import "errors"

// Errors returned by this package, matched with errors.Is; messages that wrap
// them say which field or how much.
var (
	// ErrSequenceExhausted: all 4,096 sequences of the current millisecond are
	// used and the caller's deadline ends before the next one. Overload;
	// retryable.
	ErrSequenceExhausted = errors.New("snowflake: sequence exhausted for this millisecond")
	// ErrClockMovedBack: the clock is behind the last millisecond used by more
	// than the caller can wait. Retryable once the clock catches up.
	ErrClockMovedBack = errors.New("snowflake: clock moved backwards")
	// ErrEpochExhausted: the timestamp would pass MaxTimestamp. Final: a new
	// format version is needed.
	ErrEpochExhausted = errors.New("snowflake: timestamp field exhausted (epoch end of life)")
	// ErrClockBehindHighWater: at start-up the clock is behind the persisted
	// high-water mark by more than the allowed start-up wait. The generator
	// refuses to start rather than re-enter used space.
	ErrClockBehindHighWater = errors.New("snowflake: clock is behind the persisted high-water mark")
	// ErrInvalidID: a value is not an ID this format could have produced
	// (Decode, Parse, UnmarshalText).
	ErrInvalidID = errors.New("snowflake: invalid id")
	// ErrFieldRange: a field given to Compose is out of range.
	ErrFieldRange = errors.New("snowflake: field out of range")
	// ErrClosed: the generator was closed.
	ErrClosed = errors.New("snowflake: generator closed")
	// ErrPersist: the high-water mark could not be made durable; the
	// generator stops minting past its last durable ceiling.
	ErrPersist = errors.New("snowflake: cannot persist high-water mark")
	// ErrHighWaterCorrupt: the persisted high-water mark cannot be decoded.
	// The generator refuses to start rather than guess.
	ErrHighWaterCorrupt = errors.New("snowflake: high-water mark is corrupt")
)
