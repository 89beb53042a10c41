package segment

import "github.com/idrange/idrange/snowflake"

// A worker code's IDs, in order, are numbered by their linear position
// L = ms<<12 | seq (see docs/id-layout.md). Blocks and high-water marks are
// ranges and points of L; these two functions convert between L and IDs.

// idAt returns the ID at linear position l of code (region, worker). It does
// not validate: callers hold l inside a granted block, so 0 <= l < EndL and
// the code is in range.
func idAt(l int64, region, worker int) snowflake.ID {
	return snowflake.ID((l>>snowflake.SequenceBits)<<(snowflake.SequenceBits+snowflake.WorkerBits+snowflake.RegionBits) |
		int64(region)<<(snowflake.SequenceBits+snowflake.WorkerBits) |
		int64(worker)<<snowflake.SequenceBits |
		l&snowflake.MaxSequence)
}

// Linear is the inverse of Block.ID: id's linear position ms<<12 | seq within
// its code's space.
func Linear(id snowflake.ID) int64 {
	return id.Ms()<<snowflake.SequenceBits | int64(id.Sequence())
}
