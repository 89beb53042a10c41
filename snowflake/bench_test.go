package snowflake

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// fastClock advances 1 µs per reading, so no millisecond ever holds more than
// 1,000 calls: benchmarks then measure the minting mechanism, not the
// 4,096 IDs/ms capacity of one code (which caps a real clock at ~244 ns/ID).
type fastClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *fastClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Microsecond) }

// paidClock reads the real clock (and pays for it) but returns a time that
// advances 1 µs per reading: the like-for-like counterpart of rangeclient's
// Next, which reads Go's monotonic clock once per ID.
type paidClock struct{ fastClock }

func (c *paidClock) Now() time.Time {
	_ = time.Now()
	return c.fastClock.Now()
}

// benchGen builds a generator reading now (nil: time.Now).
func benchGen(b *testing.B, now func() time.Time) *Generator {
	if now == nil {
		now = time.Now
	}
	g, err := newGenerator(Config{HighWater: NewMemHighWater(), Window: time.Hour}, now)
	if err != nil {
		b.Fatal(err)
	}
	return g
}

// BenchmarkNext is one goroutine on the real clock: bounded below by the
// per-code capacity of 4,096 IDs/ms (244 ns/ID) once it saturates.
func BenchmarkNext(b *testing.B) {
	g := benchGen(b, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextMechanism is the minting cost without the capacity limit.
func BenchmarkNextMechanism(b *testing.B) {
	g := benchGen(b, (&fastClock{base: time.Now()}).Now)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextPaidClock is the minting cost plus one real clock read per ID,
// without the capacity limit (compare with rangeclient's BenchmarkNext).
func BenchmarkNextPaidClock(b *testing.B) {
	g := benchGen(b, (&paidClock{fastClock{base: time.Now()}}).Now)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNextParallel(b *testing.B) {
	benchNextParallel(b, benchGen(b, (&fastClock{base: time.Now()}).Now))
}

func BenchmarkNextParallelPaidClock(b *testing.B) {
	benchNextParallel(b, benchGen(b, (&paidClock{fastClock{base: time.Now()}}).Now))
}

func benchNextParallel(b *testing.B, g *Generator) {
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		ctx := context.Background()
		for pb.Next() {
			if _, err := g.Next(ctx); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkAppendN64 reports ns per batch of 64 IDs on the real clock.
func BenchmarkAppendN64(b *testing.B) {
	g := benchGen(b, nil)
	ctx := context.Background()
	buf := make([]ID, 0, 64)
	b.ReportAllocs()
	for b.Loop() {
		var err error
		if buf, err = g.AppendN(ctx, buf[:0], 64); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkCap mints flat out on the real clock and reports the share of
// one code's capacity (4,096 IDs per millisecond) it sustained, as %cap:
// docs/design.md's per-code limit is only reached if the generator waits
// for the next millisecond without overshooting it. Run with -benchtime of
// a second or more so the partial first and last milliseconds do not count.
func BenchmarkCap(b *testing.B) {
	ctx := context.Background()
	b.Run("Next", func(b *testing.B) {
		g := benchGen(b, nil)
		benchCap(b, 1, func() error { _, err := g.Next(ctx); return err })
	})
	for _, n := range []int{64, 4096} {
		b.Run(fmt.Sprintf("AppendN%d", n), func(b *testing.B) {
			g := benchGen(b, nil)
			buf := make([]ID, 0, n)
			benchCap(b, n, func() (err error) { buf, err = g.AppendN(ctx, buf[:0], n); return err })
		})
	}
	b.Run("NextParallel", func(b *testing.B) {
		g := benchGen(b, nil)
		b.SetParallelism(4) // 4 goroutines per GOMAXPROCS, sharing one code
		start := time.Now()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := g.Next(ctx); err != nil {
					b.Error(err)
					return
				}
			}
		})
		reportCap(b, int64(b.N), time.Since(start))
	})
}

// benchCap calls mint (which mints per IDs) b.N times and reports %cap.
func benchCap(b *testing.B, per int, mint func() error) {
	b.ReportAllocs()
	var ids int64
	start := time.Now()
	for b.Loop() {
		if err := mint(); err != nil {
			b.Fatal(err)
		}
		ids += int64(per)
	}
	reportCap(b, ids, time.Since(start))
}

// reportCap reports ids minted in elapsed as a share of one code's
// capacity, 4,096 IDs/ms (MaxSequence+1).
func reportCap(b *testing.B, ids int64, elapsed time.Duration) {
	if ms := float64(elapsed) / float64(time.Millisecond); ms > 0 {
		b.ReportMetric(float64(ids)/ms/(MaxSequence+1)*100, "%cap")
	}
}

// BenchmarkParse reads an ID's decimal text: the reference the public-ID
// token benchmarks (publicid's BenchmarkEncode and BenchmarkDecode) are
// reported next to, in docs/figures/token.md.
func BenchmarkParse(b *testing.B) {
	s := ID(153652455016566789).String()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Parse(s); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDecode checks an ID and splits it into its fields.
func BenchmarkDecode(b *testing.B) {
	id := ID(153652455016566789)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Decode(id); err != nil {
			b.Fatal(err)
		}
	}
}
