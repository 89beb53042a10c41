package rangeclient

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// Benchmarks of the hot path against pure local minting (snowflake), in one
// run:
//
//	go test -run '^$' -bench . -benchtime 2s ./rangeclient/
//
// Both are bounded by one code's capacity of 4,096 IDs/ms (244 ns/ID) when
// a caller mints faster than that for long: "snowflake/real-clock" shows
// that figure. The like-for-like pair is "mechanism": both read the same
// fake clock that advances 1 µs per reading (the snowflake package's own
// BenchmarkNextMechanism), so neither hits the capacity limit and neither
// pays for a real clock read. "rangeclient" is the default configuration a
// user gets (Go's monotonic clock via time.Since). The client's in-memory
// service allows a lead of an hour (the real service refuses grants more
// than 15 s ahead: backpressure), so a cursor that runs ahead of time is
// not throttled during the benchmark. stalls/op counts calls that had to
// wait for a block.

func benchClient(b *testing.B, edit func(*Config)) *Client {
	b.Helper()
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, MaxLead: time.Hour})
	return newTestClient(b, svc.Conn(), edit)
}

// mechanismClient reads benchClock. That clock runs ~30x faster than real
// time while the lease loop's timers run in real time, so a normal TTL
// would (correctly) fail closed within a second: the lease is an hour long.
func mechanismClient(b *testing.B) *Client {
	b.Helper()
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, MaxLead: time.Hour, TTL: time.Hour})
	return newTestClient(b, svc.Conn(), func(cfg *Config) { cfg.Clock = &benchClock{base: time.Now()} })
}

// benchClock advances 1 µs per reading (as in snowflake's benchmarks).
type benchClock struct {
	base time.Time
	n    atomic.Int64
}

func (c *benchClock) Now() time.Time { return c.base.Add(time.Duration(c.n.Add(1)) * time.Microsecond) }

func benchGenerator(b *testing.B, clk snowflake.Clock) *snowflake.Generator {
	g, err := snowflake.NewGenerator(snowflake.Config{Region: 1, Worker: 7, HighWater: snowflake.NewMemHighWater(),
		Clock: clk, Window: time.Hour})
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

func reportStalls(b *testing.B, c *Client) {
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
	b.Run("rangeclient/clock-interface", func(b *testing.B) {
		c := benchClient(b, func(cfg *Config) { cfg.Clock = &clock.Offset{} })
		runNext(b, c)
		reportStalls(b, c)
	})
	b.Run("rangeclient/mechanism", func(b *testing.B) {
		c := mechanismClient(b)
		runNext(b, c)
		reportStalls(b, c)
	})
	b.Run("snowflake/mechanism", func(b *testing.B) {
		runNext(b, benchGenerator(b, &benchClock{base: time.Now()}))
	})
	b.Run("snowflake/real-clock", func(b *testing.B) {
		runNext(b, benchGenerator(b, nil))
	})
}

func BenchmarkNextParallel(b *testing.B) {
	b.Run("rangeclient", func(b *testing.B) {
		c := benchClient(b, nil)
		runNextParallel(b, c)
		reportStalls(b, c)
	})
	b.Run("rangeclient/mechanism", func(b *testing.B) {
		c := mechanismClient(b)
		runNextParallel(b, c)
		reportStalls(b, c)
	})
	b.Run("snowflake/mechanism", func(b *testing.B) {
		runNextParallel(b, benchGenerator(b, &benchClock{base: time.Now()}))
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
	b.Run("snowflake/mechanism", func(b *testing.B) {
		g := benchGenerator(b, &benchClock{base: time.Now()})
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
