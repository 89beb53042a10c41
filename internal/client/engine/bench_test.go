package engine

import (
	"context"
	"testing"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// Benchmarks of the hot path against pure local minting (snowflake), in one
// run:
//
//	go test -run '^$' -bench . -count 5 ./internal/client/engine/
//
// One code holds 4,096 IDs/ms, so a caller minting flat out on the real
// clock is bounded by that capacity (244 ns/ID): "snowflake/real-clock"
// shows it. To compare the cost of minting instead:
//   - "rangeclient" is the default configuration: one reading of Go's
//     monotonic clock (time.Since) and one compare-and-swap per ID. Its
//     in-memory service allows a lead of an hour (the real service refuses
//     grants more than 15 s ahead: backpressure), so the cursor may run
//     ahead of time for the whole benchmark instead of being throttled.
//   - snowflake's own BenchmarkNextPaidClock and BenchmarkNextParallelPaidClock
//     (go test -run '^$' -bench . ./snowflake) pay for one real clock reading
//     (time.Now) per ID on a clock that advances 1 µs per reading, so they
//     never wait for the next millisecond: the like-for-like counterparts.
//     BenchmarkNextMechanism there reads no real clock at all: a floor. They
//     live there because the generator's clock is not public API.
//
// stalls/op counts calls that waited for a block.

func benchClient(b *testing.B, edit func(*Config)) *Engine {
	b.Helper()
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, MaxLead: time.Hour})
	return newTestClient(b, svc.Conn(), edit)
}

func benchGenerator(b *testing.B) *snowflake.Generator {
	g, err := snowflake.NewGenerator(snowflake.Config{Region: 1, Worker: 7, HighWater: snowflake.NewMemHighWater(),
		Window: time.Hour})
	if err != nil {
		b.Fatal(err)
	}
	return g
}

type nexter interface {
	Next(ctx context.Context) (snowflake.ID, error)
}

func runNext(b *testing.B, g nexter) {
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func runNextParallel(b *testing.B, g nexter) {
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

func reportStalls(b *testing.B, c *Engine) {
	s := c.Stats()
	b.ReportMetric(float64(s.Stalls)/float64(b.N), "stalls/op")
	b.ReportMetric(float64(s.Refills), "refills")
}

func BenchmarkNext(b *testing.B) {
	b.Run("rangeclient", func(b *testing.B) {
		c := benchClient(b, nil)
		runNext(b, c)
		reportStalls(b, c)
	})
	b.Run("snowflake/real-clock", func(b *testing.B) {
		runNext(b, benchGenerator(b))
	})
}

func BenchmarkNextParallel(b *testing.B) {
	b.Run("rangeclient", func(b *testing.B) {
		c := benchClient(b, nil)
		runNextParallel(b, c)
		reportStalls(b, c)
	})
}

// BenchmarkAppendN64 is ns per batch of 64 IDs.
func BenchmarkAppendN64(b *testing.B) {
	ctx := context.Background()
	buf := make([]snowflake.ID, 0, 64)
	b.Run("rangeclient", func(b *testing.B) {
		c := benchClient(b, nil)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = c.AppendN(ctx, buf[:0], 64); err != nil {
				b.Fatal(err)
			}
		}
		reportStalls(b, c)
	})
	// (snowflake's AppendN on the fake clocks sleeps for milliseconds the
	// fake clock is ahead of real time, so it runs on the real clock,
	// bounded by capacity: 64 IDs per 15.6 µs.)
	b.Run("snowflake/real-clock", func(b *testing.B) {
		g := benchGenerator(b)
		b.ReportAllocs()
		for b.Loop() {
			var err error
			if buf, err = g.AppendN(ctx, buf[:0], 64); err != nil {
				b.Fatal(err)
			}
		}
	})
}

// BenchmarkNextSteadyRate mints at a realistic pace (one ID per ~10 µs of
// busy work, ~100,000 IDs/s, below capacity, against the default 15 s
// lead) and reports stalls per op: at steady state it must be 0.
func BenchmarkNextSteadyRate(b *testing.B) {
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	conn := svc.Conn()
	conn.SetDelay(2 * time.Millisecond) // a service 2 ms away
	c := newTestClient(b, conn, nil)
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Next(ctx); err != nil {
			b.Fatal(err)
		}
		for t := time.Now(); time.Since(t) < 10*time.Microsecond; {
		}
	}
	reportStalls(b, c)
}
