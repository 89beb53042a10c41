package service_test

import (
	"context"
	"testing"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/segment"
)

// BenchmarkAllocateBlock is one block grant through loopback gRPC and the
// etcd transaction of a real embedded etcd (fsync on), one caller.
func BenchmarkAllocateBlock(b *testing.B) {
	r := regiontest.Start(b, localregion.Config{Region: 0})
	a := regiontest.Allocator(b, r)
	ctx := context.Background()
	l, err := a.Acquire(ctx, 0, "bench")
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := a.Allocate(ctx, l, 4096); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkNextRPC is the per-ID baseline: one gRPC round trip per ID (the
// replica mints from its own buffered client, so etcd is rarely touched).
func BenchmarkNextRPC(b *testing.B) {
	r := regiontest.Start(b, localregion.Config{Region: 0, NextMinter: func(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
		return engine.New(ctx, engine.Config{Allocator: a, Region: region})
	}})
	ctx := context.Background()
	if _, err := r.EnableNext(ctx); err != nil {
		b.Fatal(err)
	}
	cli := idrangev1.NewRangeServiceClient(regiontest.Dial(b, r.Addr()))
	if _, err := cli.Next(ctx, &idrangev1.NextRequest{}); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for b.Loop() {
		if _, err := cli.Next(ctx, &idrangev1.NextRequest{}); err != nil {
			b.Fatal(err)
		}
	}
}
