package compare

import (
	"context"
	"testing"
	"time"

	bwsnow "github.com/bwmarrin/snowflake"
	"github.com/sony/sonyflake/v2"

	"github.com/idrange/idrange/internal/testing/comparerun"
	"github.com/idrange/idrange/snowflake"
)

// Caps per instance, in IDs per millisecond: one snowflake code or
// bwmarrin node mints 4,096 per ms; one sonyflake machine ID 256 per 10 ms.
const (
	codeCapPerMs      = snowflake.MaxSequence + 1
	sonyflakeCapPerMs = 256.0 / 10
)

// BenchmarkCap mints flat out from one instance of our generator and of
// each peer library, on the real clock, in the same run, and reports the
// share of the instance's cap it sustained (%cap): the cap is only reached
// by a minter that waits for the next millisecond (or 10 ms unit) without
// overshooting it. Run with -benchtime 2s or more so the partial first and
// last milliseconds do not count (they can put a figure a little above
// 100); snowflake's own BenchmarkCap has more shapes of call.
//
//	go test ./compare -run '^$' -bench Cap -benchtime 2s -count 3
func BenchmarkCap(b *testing.B) {
	ctx := context.Background()
	b.Run("local/Next", func(b *testing.B) {
		g := newBenchGenerator(b)
		benchCap(b, 1, codeCapPerMs, func() error { _, err := g.Next(ctx); return err })
	})
	b.Run("local/AppendN64", func(b *testing.B) {
		g := newBenchGenerator(b)
		buf := make([]snowflake.ID, 0, 64)
		benchCap(b, 64, codeCapPerMs, func() (err error) { buf, err = g.AppendN(ctx, buf[:0], 64); return err })
	})
	b.Run("bwmarrin/Generate", func(b *testing.B) {
		n, err := bwsnow.NewNode(comparerun.BwmarrinNode)
		if err != nil {
			b.Fatal(err)
		}
		benchCap(b, 1, codeCapPerMs, func() error { n.Generate(); return nil })
	})
	b.Run("sonyflake/NextID", func(b *testing.B) {
		sf, err := sonyflake.New(comparerun.SonyflakeSettings())
		if err != nil {
			b.Fatal(err)
		}
		benchCap(b, 1, sonyflakeCapPerMs, func() error { _, err := sf.NextID(); return err })
	})
}

func newBenchGenerator(b *testing.B) *snowflake.Generator {
	g, err := snowflake.NewGenerator(snowflake.Config{Region: comparerun.LocalRegion, Worker: comparerun.LocalWorker,
		HighWater: snowflake.NewMemHighWater(), Window: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { g.Close() })
	return g
}

// benchCap calls mint (which mints per IDs) until the benchmark ends and
// reports the IDs per millisecond as a share of capPerMs.
func benchCap(b *testing.B, per int, capPerMs float64, mint func() error) {
	b.ReportAllocs()
	var ids int64
	start := time.Now()
	for b.Loop() {
		if err := mint(); err != nil {
			b.Fatal(err)
		}
		ids += int64(per)
	}
	if ms := float64(time.Since(start)) / float64(time.Millisecond); ms > 0 {
		b.ReportMetric(float64(ids)/ms/capPerMs*100, "%cap")
	}
}
