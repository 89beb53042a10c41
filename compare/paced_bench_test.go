package compare

import (
	"context"
	"slices"
	"testing"
	"time"

	bwsnow "github.com/bwmarrin/snowflake"

	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
)

// BenchmarkPacedLatency offers 1M IDs/s (one call per µs, paced by
// spinning on the clock) to rangeclient.Next and to bwmarrin's Generate in
// the same run, and reports the latency of each call (p50, p99, p99.9, in
// ns; the two clock readings around a call are in every figure alike),
// and their mean: where the clock ticks in steps of several ns (as on
// some VMs) the percentiles fall on those steps, and the mean of many
// calls resolves what the steps hide.
// The range client runs over the in-memory service (its refills happen in
// the background, as over gRPC).
//
//	go test ./compare -run '^$' -bench PacedLatency -benchtime 2000000x -count 3
//	go test ./compare -run '^$' -bench Burst3000 -benchtime 2000x -count 3
func BenchmarkPacedLatency(b *testing.B) {
	ctx := context.Background()
	b.Run("rangeclient", func(b *testing.B) {
		c := newBenchClient(b)
		pacedLatency(b, func() { c.Next(ctx) })
	})
	b.Run("bwmarrin", func(b *testing.B) {
		n, err := bwsnow.NewNode(BwmarrinNode)
		if err != nil {
			b.Fatal(err)
		}
		pacedLatency(b, func() { n.Generate() })
	})
}

// BenchmarkBurst3000 times 3,000 IDs back to back (one caller's burst):
// ns/op is one burst.
func BenchmarkBurst3000(b *testing.B) {
	ctx := context.Background()
	b.Run("rangeclient", func(b *testing.B) {
		c := newBenchClient(b)
		b.ResetTimer()
		for range b.N {
			for range 3000 {
				c.Next(ctx)
			}
		}
	})
	b.Run("bwmarrin", func(b *testing.B) {
		n, err := bwsnow.NewNode(BwmarrinNode)
		if err != nil {
			b.Fatal(err)
		}
		b.ResetTimer()
		for range b.N {
			for range 3000 {
				n.Generate()
			}
		}
	})
}

func newBenchClient(b *testing.B) *rangeclient.Client {
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rangeclient.New(ctx, rangeclient.Config{Allocator: svc.Conn(), Region: 1, Owner: b.Name()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.Close() })
	return c
}

// pacedLatency calls mint b.N times, one call per µs, and reports the
// per-call latency percentiles.
func pacedLatency(b *testing.B, mint func()) {
	lat := make([]time.Duration, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	start := time.Now()
	for i := range b.N {
		due := start.Add(time.Duration(i) * time.Microsecond)
		for time.Now().Before(due) {
		}
		t0 := time.Now()
		mint()
		lat[i] = time.Since(t0)
	}
	b.StopTimer()
	var sum time.Duration
	for _, d := range lat {
		sum += d
	}
	b.ReportMetric(float64(sum)/float64(len(lat)), "mean-ns")
	slices.Sort(lat)
	at := func(q float64) float64 { return float64(lat[min(int(q*float64(len(lat))), len(lat)-1)]) }
	b.ReportMetric(at(0.50), "p50-ns")
	b.ReportMetric(at(0.99), "p99-ns")
	b.ReportMetric(at(0.999), "p99.9-ns")
}
