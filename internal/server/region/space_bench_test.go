package region_test

import (
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/region"
)

// BenchmarkBackendPerGrant reports etcd backend bytes per 1,000 grants with
// and without the service's compactor (1 s interval and retention), for
// b.N grants of a flat-out load of 24 codes through one replica. Without
// compaction the figure is what every grant costs for good; with it, the
// backend stops growing once the retention's worth of history is kept, so
// the figure falls as b.N grows. Run it with a fixed count:
//
//	go test -run '^$' -bench BackendPerGrant -benchtime 300000x ./internal/server/region/
func BenchmarkBackendPerGrant(b *testing.B) {
	for _, bc := range []struct {
		name     string
		interval time.Duration
	}{{"compaction=off", 0}, {"compaction=on", time.Second}} {
		b.Run(bc.name, func(b *testing.B) {
			etcd := embedetcdtest.StartConfig(b, embedetcd.Config{UnsafeNoFsync: true})
			r := startSpaceReplica(b, etcd, region.ReplicaConfig{Region: 1, CompactionInterval: bc.interval, CompactionRetention: time.Second})
			cli := embedetcdtest.Client(b, etcd)
			size0, inUse0, rev0 := backend(b, cli)
			b.ResetTimer()
			g := startGrantLoad(b, r.addr, 1, loadWorkers, 0)
			for g.grants.Load() < int64(b.N) {
				time.Sleep(10 * time.Millisecond) // poll pace
			}
			g.stop()
			b.StopTimer()
			n := g.grants.Load()
			size, inUse, rev := backend(b, cli)
			k := float64(n) / 1000
			b.ReportMetric(float64(size-size0)/k, "backend-B/1000grants")
			b.ReportMetric(float64(inUse-inUse0)/k, "in-use-B/1000grants")
			b.ReportMetric(float64(inUse), "in-use-B")
			b.ReportMetric(float64(rev-rev0)/k, "revisions/1000grants")
			b.ReportMetric(float64(g.fails.Load()), "failed-grants")
		})
	}
}
