package snowflake

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
)

// ID is a 64-bit idrange identifier. Valid IDs are positive; the accessors
// read its fields without checking (Decode checks). Its text and JSON form is
// the decimal string, which keeps 64-bit precision in JavaScript.
type ID int64

// Parts are the decoded fields of an ID.
type Parts struct {
	Time     time.Time // Epoch + Ms, in UTC
	Ms       int64     // milliseconds since Epoch
	Region   int       // 0..MaxRegion
	Worker   int       // 0..MaxWorker
	Sequence int       // 0..MaxSequence, the order within the millisecond
}

// Compose builds the ID for the given fields (ms since Epoch, see MsSince),
// rejecting any out of range, and the all-zero ID, with ErrFieldRange.
func Compose(ms int64, region, worker, seq int) (ID, error) {
	switch {
	case ms < 0 || ms > MaxTimestamp:
		return 0, fmt.Errorf("timestamp %d ms not in 0..%d: %w", ms, int64(MaxTimestamp), ErrFieldRange)
	case region < 0 || region > MaxRegion:
		return 0, fmt.Errorf("region %d not in 0..%d: %w", region, MaxRegion, ErrFieldRange)
	case worker < 0 || worker > MaxWorker:
		return 0, fmt.Errorf("worker %d not in 0..%d: %w", worker, MaxWorker, ErrFieldRange)
	case seq < 0 || seq > MaxSequence:
		return 0, fmt.Errorf("sequence %d not in 0..%d: %w", seq, MaxSequence, ErrFieldRange)
	case ms == 0 && region == 0 && worker == 0 && seq == 0:
		return 0, fmt.Errorf("all fields zero would give ID 0, which is never minted: %w", ErrFieldRange)
	}
	return ID(ms<<timeShift | int64(region)<<regionShift | int64(worker)<<workerShift | int64(seq)), nil
}

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

// Decode checks that id could have been minted (it is positive) and returns
// its fields; otherwise the error is ErrInvalidID.
func Decode(id ID) (Parts, error) {
	switch {
	case id == 0:
		return Parts{}, fmt.Errorf("0 is never minted: %w", ErrInvalidID)
	case id < 0:
		return Parts{}, fmt.Errorf("%d has the sign bit set: %w", int64(id), ErrInvalidID)
	}
	return id.Parts(), nil
}

// Parse reads a decimal ID and checks it with Decode; the error is
// ErrInvalidID.
func Parse(s string) (ID, error) {
	digits := strings.TrimPrefix(s, "-")
	if digits == "" || strings.Trim(digits, "0123456789") != "" {
		return 0, fmt.Errorf("%q is not a decimal integer: %w", s, ErrInvalidID)
	}
	v, err := strconv.ParseInt(s, 10, 64)
	if err != nil {
		var ne *strconv.NumError
		if errors.As(err, &ne) && errors.Is(ne.Err, strconv.ErrRange) {
			return 0, fmt.Errorf("%q does not fit in a signed 64-bit integer: %w", s, ErrInvalidID)
		}
		return 0, fmt.Errorf("%q is not a decimal integer: %w", s, ErrInvalidID)
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
