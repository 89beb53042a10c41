package snowflake

import "time"

// Field widths and limits of format version 1 (see docs/id-layout.md).
const (
	TimestampBits = 41
	RegionBits    = 2
	WorkerBits    = 8
	SequenceBits  = 12

	// MaxTimestamp is the last millisecond after Epoch that an ID can carry.
	MaxTimestamp = 1<<TimestampBits - 1
	// MaxRegion is the highest region field value (4 regions).
	MaxRegion = 1<<RegionBits - 1
	// MaxWorker is the highest worker field value (256 workers per region).
	MaxWorker = 1<<WorkerBits - 1
	// MaxSequence is the highest sequence value (4,096 IDs per ms per code).
	MaxSequence = 1<<SequenceBits - 1

	workerShift = SequenceBits
	regionShift = SequenceBits + WorkerBits
	timeShift   = SequenceBits + WorkerBits + RegionBits
)

// Epoch is the instant of timestamp 0: 2026-01-01T00:00:00Z, before the first
// ID was minted, so no valid ID is 0.
var Epoch = time.Date(2026, time.January, 1, 0, 0, 0, 0, time.UTC)

var epochMs = Epoch.UnixMilli()

// MsTime is the instant ms milliseconds after Epoch, in UTC: the time a
// timestamp field value names.
func MsTime(ms int64) time.Time { return time.UnixMilli(epochMs + ms).UTC() }

// MsSince is t as milliseconds since Epoch (floor), the timestamp field value
// for t, as Compose takes it. It may be negative or exceed MaxTimestamp;
// callers check.
func MsSince(t time.Time) int64 {
	return t.UnixMilli() - epochMs
}

// EndOfLife is the last instant an ID can name: Epoch + MaxTimestamp ms,
// 2095-09-07T15:47:35.551Z.
func EndOfLife() time.Time { return MsTime(MaxTimestamp) }

// RemainingLife is how long after now IDs can still be minted (0 if past), to
// export as a metric and alert on long before it runs out.
func RemainingLife(now time.Time) time.Duration {
	d := EndOfLife().Sub(now)
	if d < 0 {
		return 0
	}
	return d
}
