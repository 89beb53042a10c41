package service_test

import (
	"context"
	"testing"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/internal/testenv"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
)

// BenchmarkAllocateBlock is one block grant through loopback gRPC and the
// etcd transaction of a real embedded etcd (fsync on), one caller.
func BenchmarkAllocateBlock(b *testing.B) {
	r := testenv.Start(b, testenv.Config{Region: 0})
	a := r.Allocator(b)
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
	r := testenv.Start(b, testenv.Config{Region: 0, Next: func(ctx context.Context, a segment.Allocator, region int) (service.MinterCloser, error) {
		return rangeclient.New(ctx, rangeclient.Config{Allocator: a, Region: region})
	}})
	cli := idrangev1.NewRangeServiceClient(r.Dial(b))
	ctx := context.Background()
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
