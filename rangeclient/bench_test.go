package rangeclient_test

import (
	"context"
	"testing"
	"time"

	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
)

// The public Client's hot path, beside the engine's own benchmarks
// (go test -run '^$' -bench . ./rangeclient ./internal/client/engine): the
// front holds the engine by value, so it should add nothing measurable.
// The in-memory service allows an hour's lead, so the benchmark is not
// throttled to one code's 4,096 IDs/ms (see the engine's BenchmarkNext).
func BenchmarkClientNext(b *testing.B) {
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, MaxLead: time.Hour})
	ctx := context.Background()
	c, err := rangeclient.New(ctx, rangeclient.Config{Allocator: svc.Conn(), Region: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Next(ctx); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.Stats().Stalls)/float64(b.N), "stalls/op")
}
