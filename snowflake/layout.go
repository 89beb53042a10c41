// Package snowflake is idrange's 64-bit ID layout and its pure local
// generator.
//
// # Layout (format version 1)
//
//	bit 63      62 ........ 22   21 20   19 ..... 12   11 ....... 0
//	+-----+--------------------+-------+-------------+-------------+
//	|  0  | timestamp (41 bit) | region|  worker (8) | sequence(12)|
//	+-----+--------------------+-------+-------------+-------------+
//
//	ID = ms<<22 | region<<20 | worker<<12 | seq
//
// The widths are derived from the requirements, smallest unit first:
//
//   - sequence: one worker must mint up to 3,000 IDs inside one millisecond;
//     the smallest power of two >= 3,000 is 2^12 = 4,096 (11 bits give 2,048).
//   - worker: at most 200 workers per region; 2^8 = 256 >= 200 (7 bits give 128).
//   - region: 4 regions; 2^2 = 4.
//   - timestamp: what is left of 63 bits (the sign bit stays 0 so the ID is a
//     positive int64): 63-12-8-2 = 41 bits of milliseconds, 2^41 ms = 69.7
//     years >= the 60 years required.
//
// The epoch is 2026-01-01T00:00:00Z, before the first ID was minted, so no
// valid ID is 0 and every ID is positive. The last millisecond is
// Epoch + (2^41-1) ms = 2095-09-07T15:47:35.551Z. Generators warn long before
// (see Config.EpochWarning) and reject the millisecond after it with
// ErrEpochExhausted.
//
// Changing any width (a 5th region, 300 workers per region, 5,000 IDs/ms) is
// a new, explicitly versioned format; version 1 IDs are never reinterpreted.
package snowflake

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
)

// Field widths and limits of format version 1.
const (
	TimestampBits = 41
	RegionBits    = 2
	WorkerBits    = 8
	SequenceBits  = 12

	// MaxTimestamp is the last millisecond after Epoch that an ID can carry.
	MaxTimestamp = 1<<TimestampBits - 1
	MaxRegion    = 1<<RegionBits - 1
	MaxWorker    = 1<<WorkerBits - 1
	MaxSequence  = 1<<SequenceBits - 1

	workerShift = SequenceBits
	regionShift = SequenceBits + WorkerBits
	timeShift   = SequenceBits + WorkerBits + RegionBits

	// FormatVersion names this layout. A different layout is a new version.
	FormatVersion = 1
)

// Epoch is the instant of timestamp 0: 2026-01-01T00:00:00Z.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

var epochMs = Epoch.UnixMilli()

// Errors returned by this package. Conditions a caller acts on are sentinels
// (check with errors.Is); messages wrapping them say which field or how much.
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
	// ErrInvalidID: a value is not an ID this format could have produced.
	ErrInvalidID = errors.New("snowflake: invalid id")
	// ErrFieldRange: a field given to Compose is out of range.
	ErrFieldRange = errors.New("snowflake: field out of range")
	// ErrClosed: the generator was closed.
	ErrClosed = errors.New("snowflake: generator closed")
	// ErrPersist: the high-water mark could not be made durable; the
	// generator stops minting past its last durable ceiling.
	ErrPersist = errors.New("snowflake: cannot persist high-water mark")
)

// ID is a 64-bit idrange identifier. Valid IDs are positive.
type ID int64

// Parts are the decoded fields of an ID.
type Parts struct {
	Time     time.Time // Epoch + Ms, in UTC
	Ms       int64     // milliseconds since Epoch
	Region   int
	Worker   int
	Sequence int
}

// Compose builds the ID for the given fields, rejecting any out of range.
func Compose(ms int64, region, worker, seq int) (ID, error) {
	switch {
	case ms < 0 || ms > MaxTimestamp:
		return 0, errors.Wrapf(ErrFieldRange, "timestamp %d ms not in 0..%d", ms, int64(MaxTimestamp))
	case region < 0 || region > MaxRegion:
		return 0, errors.Wrapf(ErrFieldRange, "region %d not in 0..%d", region, MaxRegion)
	case worker < 0 || worker > MaxWorker:
		return 0, errors.Wrapf(ErrFieldRange, "worker %d not in 0..%d", worker, MaxWorker)
	case seq < 0 || seq > MaxSequence:
		return 0, errors.Wrapf(ErrFieldRange, "sequence %d not in 0..%d", seq, MaxSequence)
	case ms == 0 && region == 0 && worker == 0 && seq == 0:
		return 0, errors.Wrap(ErrFieldRange, "all fields zero would give ID 0, which is never minted")
	}
	return ID(ms<<timeShift | int64(region)<<regionShift | int64(worker)<<workerShift | int64(seq)), nil
}

// FromLinear returns the ID at position l = ms<<12|seq of code (region,
// worker). It does not validate: callers hold l inside a granted block.
func FromLinear(l int64, region, worker int) ID {
	return ID((l>>SequenceBits)<<timeShift | int64(region)<<regionShift | int64(worker)<<workerShift | l&MaxSequence)
}

// Linear is the inverse of FromLinear: the ID's position ms<<12|seq within
// its code's space.
func (id ID) Linear() int64 { return id.Ms()<<SequenceBits | int64(id.Sequence()) }

// Ms is the ID's timestamp in milliseconds since Epoch.
func (id ID) Ms() int64 { return int64(id) >> timeShift }

// Region is the ID's region field.
func (id ID) Region() int { return int(id>>regionShift) & MaxRegion }

// Worker is the ID's worker field.
func (id ID) Worker() int { return int(id>>workerShift) & MaxWorker }

// Sequence is the ID's sequence field.
func (id ID) Sequence() int { return int(id) & MaxSequence }

// Time is the instant the ID's timestamp names, in UTC.
func (id ID) Time() time.Time { return MsTime(id.Ms()) }

// Parts decodes all fields without validating; see Decode for a checked form.
func (id ID) Parts() Parts {
	return Parts{Time: id.Time(), Ms: id.Ms(), Region: id.Region(), Worker: id.Worker(), Sequence: id.Sequence()}
}

// Valid reports whether id could have been produced by this format: positive
// (sign bit clear, not zero).
func (id ID) Valid() bool { return id > 0 }

// Decode checks that id could have been minted and returns its fields.
func Decode(id ID) (Parts, error) {
	switch {
	case id == 0:
		return Parts{}, errors.Wrap(ErrInvalidID, "0 is never minted")
	case id < 0:
		return Parts{}, errors.Wrapf(ErrInvalidID, "%d has the sign bit set", int64(id))
	}
	return id.Parts(), nil
}

// Parse reads a decimal ID and checks it with Decode.
func Parse(s string) (ID, error) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, errors.Wrapf(ErrInvalidID, "%q is not a decimal integer", s)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, errors.Wrapf(ErrInvalidID, "%q does not fit in a signed 64-bit integer", s)
		}
		return 0, errors.Wrapf(ErrInvalidID, "%q is not a decimal integer", s)
	}
	id := ID(v)
	if _, err := Decode(id); err != nil {
		return 0, err
	}
	return id, nil
}

// String is the decimal form of the ID.
func (id ID) String() string { return strconv.FormatInt(int64(id), 10) }

// Format writes the ID's fields in the form `rangesvc decode` prints:
// id=.. time=RFC3339Nano region=.. worker=.. seq=..
func (p Parts) Format(id ID) string {
	return fmt.Sprintf("id=%d time=%s region=%d worker=%d seq=%d",
		int64(id), p.Time.Format(time.RFC3339Nano), p.Region, p.Worker, p.Sequence)
}

// MarshalText encodes the ID as decimal text (JSON carries it as a string,
// which keeps 64-bit precision in JavaScript).
func (id ID) MarshalText() ([]byte, error) { return strconv.AppendInt(nil, int64(id), 10), nil }

// UnmarshalText parses decimal text and validates it.
func (id *ID) UnmarshalText(b []byte) error {
	v, err := Parse(string(b))
	if err != nil {
		return err
	}
	*id = v
	return nil
}

// MsTime is the instant ms milliseconds after Epoch, in UTC.
func MsTime(ms int64) time.Time { return time.UnixMilli(epochMs + ms).UTC() }

// MsSince is t as milliseconds since Epoch (floor). It may be negative or
// exceed MaxTimestamp; callers check.
func MsSince(t time.Time) int64 {
	return t.UnixMilli() - epochMs
}

// EndOfLife is the last instant an ID can name: Epoch + MaxTimestamp ms.
func EndOfLife() time.Time { return MsTime(MaxTimestamp) }

// RemainingLife is how long after now IDs can still be minted (0 if past).
func RemainingLife(now time.Time) time.Duration {
	d := EndOfLife().Sub(now)
	if d < 0 {
		return 0
	}
	return d
}
