package snowflake

import (
	"context"
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

func benchGen(b *testing.B, clk Clock) *Generator {
	g, err := NewGenerator(Config{HighWater: NewMemHighWater(), Clock: clk, Window: time.Hour})
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
	g := benchGen(b, &fastClock{base: time.Now()})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNextParallel(b *testing.B) {
	g := benchGen(b, &fastClock{base: time.Now()})
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
