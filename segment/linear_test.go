package segment_test

import (
	"testing"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// FuzzLinear: every ID round-trips through its linear position, and Block.ID
// builds the same ID as snowflake.Compose from the same fields.
func FuzzLinear(f *testing.F) {
	f.Add(int64(0), 0, 0, 1)
	f.Add(int64(snowflake.MaxTimestamp), snowflake.MaxRegion, snowflake.MaxWorker, snowflake.MaxSequence)
	f.Add(int64(123456), 2, 17, 99)
	f.Fuzz(func(t *testing.T, ms int64, region, worker, seq int) {
		id, err := snowflake.Compose(ms, region, worker, seq)
		if err != nil {
			return // out of range: snowflake's FuzzComposeDecode checks the refusal
		}
		l := segment.Linear(id)
		if want := ms<<snowflake.SequenceBits | int64(seq); l != want {
			t.Fatalf("Linear(%d) = %d, want ms<<12|seq = %d", id, l, want)
		}
		if back := (segment.Block{Region: region, Worker: worker}).ID(l); back != id {
			t.Fatalf("Block.ID(Linear(%d)) = %d: Linear/Block.ID do not round-trip", id, back)
		}
	})
}
