package localregion

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// BenchmarkAllocateShared is the shared path's grant over gRPC on loopback:
// concurrent callers (GOMAXPROCS x -cpu... goroutines via RunParallel, 8
// per proc) each asking for runs of 128 after their last ID, from one
// replica. It reports the grant latency percentiles and grants/s; no etcd
// write is made per grant.
//
//	go test ./internal/testing/localregion -run '^$' -bench AllocateShared -benchtime 20000x
func BenchmarkAllocateShared(b *testing.B) {
	ctx := context.Background()
	r := startShared(b, ctx, Config{Region: 1})
	cc := dialTest(b, r.Addr())
	a := wire.NewAllocator(cc).(segment.SharedAllocator)
	txns := r.Counts().Txns
	var mu sync.Mutex
	var lat []time.Duration
	b.SetParallelism(8)
	b.ResetTimer()
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		var after snowflake.ID
		var mine []time.Duration
		for pb.Next() {
			t0 := time.Now()
			run, err := a.AllocateShared(ctx, 1, 128, after, "bench")
			mine = append(mine, time.Since(t0))
			if err != nil {
				b.Error(err)
				return
			}
			after = run.ID(run.Hi - 1)
		}
		mu.Lock()
		lat = append(lat, mine...)
		mu.Unlock()
	})
	elapsed := time.Since(start)
	b.StopTimer()
	slices.Sort(lat)
	q := func(p float64) float64 { return float64(lat[int(p*float64(len(lat)-1))].Microseconds()) }
	b.ReportMetric(q(0.5), "p50-us")
	b.ReportMetric(q(0.99), "p99-us")
	b.ReportMetric(q(0.999), "p99.9-us")
	b.ReportMetric(float64(len(lat))/elapsed.Seconds(), "grants/s")
	b.ReportMetric(float64(r.Counts().Txns-txns)/float64(len(lat)), "etcd-txns/grant")
}
