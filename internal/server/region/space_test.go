package region_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/etcdspace"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
)

// spaceReplica is a replica built with NewReplica (what rangesvc serve
// runs) on its own etcd client, serving on loopback, with its logs kept.
type spaceReplica struct {
	rep  *region.Replica
	addr string
	logs *syncBuffer
}

// startSpaceReplica serves a replica with cfg (Etcd, Region and Logger are
// filled in) and stops it at the end of the test.
func startSpaceReplica(t testing.TB, etcd *embedetcd.Server, cfg region.ReplicaConfig) *spaceReplica {
	t.Helper()
	logs := &syncBuffer{}
	cfg.Etcd = embedetcdtest.Client(t, etcd)
	cfg.InitRegion = true
	cfg.Logger = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))
	rep, err := region.NewReplica(cfg)
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rep.Serve(lis)
	sr := &spaceReplica{rep: rep, addr: lis.Addr().String(), logs: logs}
	var once sync.Once
	t.Cleanup(func() { once.Do(func() { rep.Stop(0) }) })
	return sr
}

// syncBuffer is a log sink safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// grantLoad is an AllocateBlock load over gRPC: workers goroutines, each
// holding its own code and granting 1-ID blocks (one HWM revision each).
type grantLoad struct {
	grants atomic.Int64
	fails  atomic.Int64

	mu      sync.Mutex
	lastErr error

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startGrantLoad starts a grantLoad at about rate grants/s in all (each
// worker keeps its own schedule; one that falls behind runs flat out), or
// with rate 0 flat out: as fast as the replica commits.
func startGrantLoad(t testing.TB, addr string, region, workers int, rate float64) *grantLoad {
	t.Helper()
	a := wire.NewAllocator(regiontest.Dial(t, addr))
	ctx, cancel := context.WithCancel(context.Background())
	g := &grantLoad{cancel: cancel}
	var period time.Duration // between one worker's grants; 0: flat out
	if rate > 0 {
		period = time.Duration(float64(workers) / rate * float64(time.Second))
	}
	leases := make([]segment.Lease, workers)
	for i := range leases {
		l, err := a.Acquire(ctx, region, fmt.Sprintf("space-load-%d", i))
		if err != nil {
			cancel()
			t.Fatalf("acquire: %v", err)
		}
		leases[i] = l
	}
	for _, l := range leases {
		g.wg.Go(func() {
			renewed, next := time.Now(), time.Now()
			for ctx.Err() == nil {
				if time.Since(renewed) > time.Second {
					if nl, err := a.Renew(ctx, l); err == nil {
						l, renewed = nl, time.Now()
					}
				}
				if period > 0 {
					if d := time.Until(next); d > 0 {
						time.Sleep(d) // pacing: the load's schedule
					}
					next = next.Add(period)
				}
				if _, err := a.Allocate(ctx, l, 1); err != nil {
					if ctx.Err() != nil {
						return
					}
					g.fails.Add(1)
					g.mu.Lock()
					g.lastErr = err
					g.mu.Unlock()
					if period == 0 {
						time.Sleep(10 * time.Millisecond) // pace retries against a refusing store
					}
					continue
				}
				g.grants.Add(1)
			}
		})
	}
	t.Cleanup(g.stop)
	return g
}

func (g *grantLoad) stop() { g.cancel(); g.wg.Wait() }

func (g *grantLoad) err() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.lastErr
}

// backend is one member's status: backend file size and bytes in use.
func backend(t testing.TB, cli *clientv3.Client) (size, inUse, rev int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatalf("etcd status: %v", err)
	}
	return st.DbSize, st.DbSizeInUse, st.Header.Revision
}

// loadWorkers is the number of codes granting flat out.
const loadWorkers = 24

// Issue 14's compaction acceptance. Without compaction the grant load
// fills the quota (spaceQuota: 8 MiB, 16 MiB with -tags soak) within
// spaceFillLimit and the replica reports NOT_SERVING with the NOSPACE
// reason, and the alarm metric says so. With the compactor on
// (spaceCompaction as interval and retention), the same load runs for 3x
// that time: every grant succeeds, the backend stays below the quota, and
// the grants written are 1.5x what filled the quota without compaction.
func TestCompactionKeepsTheBackendUnderQuota(t *testing.T) {
	// Filling even 8 MiB at a few hundred grants/s (the race detector
	// slows the in-process etcd about tenfold) takes minutes. The
	// compactor's and the monitor's concurrency are covered under -race by
	// TestCompactorOneLeaderAtATime and internal/server/etcdspace's tests.
	testenv.SkipUnderRace(t, "a quota-filling grant load takes minutes")
	// Off: etcd's own auto-compaction is off too (embedetcd's default).
	etcd := embedetcdtest.StartConfig(t, embedetcd.Config{QuotaBackendBytes: spaceQuota, UnsafeNoFsync: true})
	off := startSpaceReplica(t, etcd, region.ReplicaConfig{Region: 1, SpaceCheckInterval: 100 * time.Millisecond})
	cli := embedetcdtest.Client(t, etcd)
	g := startGrantLoad(t, off.addr, 1, loadWorkers, 0)
	start := time.Now()
	for gauge(t, off.rep.Registry(), "idrange_etcd_alarm", "alarm", "NOSPACE") != 1 {
		if time.Since(start) > spaceFillLimit {
			size, inUse, _ := backend(t, cli)
			t.Fatalf("no NOSPACE within %v without compaction: %d grants, backend %d bytes (%d in use) of %d",
				spaceFillLimit, g.grants.Load(), size, inUse, spaceQuota)
		}
		time.Sleep(50 * time.Millisecond) // poll interval, bounded above
	}
	fill := time.Since(start)
	filled := g.grants.Load()
	// The health check runs every 250 ms; the monitor already saw NOSPACE.
	waitFor(t, 10*time.Second, "NOT_SERVING after NOSPACE", func() bool { return !off.rep.Service().Serving() })
	if err := off.rep.SpaceMonitor().Err(); !errors.Is(err, etcdspace.ErrNoSpace) ||
		!strings.Contains(err.Error(), "etcd alarm NOSPACE on member ") || !strings.Contains(err.Error(), "etcdctl alarm disarm") {
		t.Fatalf("reason %v: want the NOSPACE line naming the member and the recovery", err)
	}
	// The reason reaches the service's health log line.
	waitFor(t, 10*time.Second, "the NOT_SERVING reason in the logs", func() bool {
		for _, l := range strings.Split(off.logs.String(), "\n") {
			if strings.Contains(l, "msg=\"store check failed\"") && strings.Contains(l, "err=\"etcd alarm NOSPACE on member") {
				return true
			}
		}
		return false
	})
	g.stop()
	size, inUse, _ := backend(t, cli)
	t.Logf("FIGURES without compaction: NOSPACE after %v, %d grants (%.0f/s), backend %d bytes (%d in use), %.0f bytes/grant",
		fill.Round(time.Millisecond), filled, float64(filled)/fill.Seconds(), size, inUse, float64(inUse)/float64(filled))

	// On: a fresh etcd with the same quota, the service's compactor only.
	etcd2 := embedetcdtest.StartConfig(t, embedetcd.Config{QuotaBackendBytes: spaceQuota, UnsafeNoFsync: true})
	on := startSpaceReplica(t, etcd2, region.ReplicaConfig{Region: 1, SpaceCheckInterval: 100 * time.Millisecond,
		CompactionInterval: spaceCompaction, CompactionRetention: spaceCompaction})
	cli2 := embedetcdtest.Client(t, etcd2)
	g2 := startGrantLoad(t, on.addr, 1, loadWorkers, 0)
	start = time.Now()
	var maxSize, maxInUse int64
	// 3x the fill time, and until 1.5x the grants that filled the quota are
	// written: the property is that count (the load wrote well past a
	// quota's worth without reaching the quota), not a rate. The shared
	// machine may run this phase several times slower than the first (a
	// concurrent build); the bound used to be 6x the fill time, a ratio of
	// two throughputs that failed a working compactor then. The wall clock
	// now only bounds the test: 6x the fill time or 2x spaceFillLimit,
	// whichever is longer (the first phase's whole budget, twice, for 1.5
	// quotas' worth).
	limit := max(6*fill, 2*spaceFillLimit)
	for time.Since(start) < 3*fill || (g2.grants.Load() < filled*3/2 && time.Since(start) < limit) {
		time.Sleep(100 * time.Millisecond) // sampling pace
		size, inUse, _ := backend(t, cli2)
		maxSize, maxInUse = max(maxSize, size), max(maxInUse, inUse)
		if size >= spaceQuota || g2.fails.Load() > 0 || !on.rep.Service().Serving() {
			t.Fatalf("with compaction after %v: backend %d bytes of %d, %d failed grants (last %v), serving %v",
				time.Since(start), size, spaceQuota, g2.fails.Load(), g2.err(), on.rep.Service().Serving())
		}
	}
	g2.stop()
	granted := g2.grants.Load()
	t.Logf("FIGURES with compaction (%v interval and retention): %v, %d grants (%.0f/s), 0 failed, backend max %d bytes (%d in use) of %d, %d compactions",
		spaceCompaction, time.Since(start).Round(time.Millisecond), granted, float64(granted)/time.Since(start).Seconds(), maxSize, maxInUse, spaceQuota,
		int(gauge(t, on.rep.Registry(), "idrange_compactor_compactions_total")))
	if granted < filled*3/2 {
		t.Fatalf("with compaction %d grants in %v, want 1.5x the %d grants that filled the quota: the load did not outgrow the quota", granted, limit, filled)
	}
	if gauge(t, on.rep.Registry(), "idrange_etcd_alarm", "alarm", "NOSPACE") != 0 || gauge(t, on.rep.Registry(), "idrange_compactor_leader") != 1 {
		t.Fatal("with compaction: NOSPACE raised or the only replica is not leading the compactor")
	}
	if !strings.Contains(on.logs.String(), "compactor: compacted to revision") {
		t.Fatalf("no compaction logged:\n%s", on.logs.String())
	}
}

// waitFor polls cond every 20 ms until it holds, failing after limit.
func waitFor(t testing.TB, limit time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: not within %v", what, limit)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// gauge reads one sample of a gauge or counter from reg; labels are
// name, value pairs the sample must carry. -1 if there is none.
func gauge(t testing.TB, reg prometheus.Gatherer, name string, labels ...string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
	samples:
		for _, m := range mf.GetMetric() {
			for i := 0; i+1 < len(labels); i += 2 {
				found := false
				for _, lp := range m.GetLabel() {
					if lp.GetName() == labels[i] && lp.GetValue() == labels[i+1] {
						found = true
					}
				}
				if !found {
					continue samples
				}
			}
			if g := m.GetGauge(); g != nil {
				return g.GetValue()
			}
			return m.GetCounter().GetValue()
		}
	}
	return -1
}

// Issue 14: two replicas on one etcd run the compactor one at a time (the
// idrange_compactor_leader gauge and the "compactor: leading" log say
// which); when the leader stops, the other takes over at once, and when
// the leader's lease is lost, a waiting replica takes over.
func TestCompactorOneLeaderAtATime(t *testing.T) {
	etcd := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, etcd)
	cfg := region.ReplicaConfig{Region: 1, CompactionInterval: 200 * time.Millisecond, CompactionRetention: 200 * time.Millisecond}
	reps := []*spaceReplica{startSpaceReplica(t, etcd, cfg), startSpaceReplica(t, etcd, cfg)}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// Writes keep the revision moving, so there is history to compact.
	var wg sync.WaitGroup
	wctx, stopWrites := context.WithCancel(ctx)
	defer func() { stopWrites(); wg.Wait() }()
	wg.Go(func() {
		for i := 0; wctx.Err() == nil; i++ {
			cli.Put(wctx, "/space-test/k", fmt.Sprint(i))
			time.Sleep(5 * time.Millisecond) // write pace
		}
	})

	leaders := func(rs []*spaceReplica) (n int, who *spaceReplica) {
		for _, r := range rs {
			if gauge(t, r.rep.Registry(), "idrange_compactor_leader") == 1 {
				n, who = n+1, r
			}
		}
		return n, who
	}
	// watch samples the leaders every 10 ms for d, failing on two at once,
	// and returns the leader at the end (nil if none).
	watch := func(rs []*spaceReplica, d time.Duration) *spaceReplica {
		t.Helper()
		var who *spaceReplica
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			var n int
			if n, who = leaders(rs); n > 1 {
				t.Fatal("two replicas lead the compactor at once")
			}
		}
		return who
	}

	waitFor(t, 15*time.Second, "a compactor leader", func() bool { n, _ := leaders(reps); return n == 1 })
	first := watch(reps, 2*time.Second)
	if first == nil || !first.rep.Compactor().Leading() {
		t.Fatal("no leader after 2 s, or its Leading() disagrees with its gauge")
	}
	other := reps[0]
	if other == first {
		other = reps[1]
	}
	waitFor(t, 15*time.Second, "the leader compacting", func() bool {
		return gauge(t, first.rep.Registry(), "idrange_compactor_compactions_total") > 0
	})
	if n := gauge(t, other.rep.Registry(), "idrange_compactor_compactions_total"); n != 0 {
		t.Fatalf("the replica that does not lead compacted %v times", n)
	}
	if !strings.Contains(first.logs.String(), "compactor: leading") || strings.Contains(other.logs.String(), "compactor: leading") {
		t.Fatalf("logs do not say who leads:\nleader:\n%s\nother:\n%s", first.logs, other.logs)
	}
	// A compacted revision is really gone from etcd.
	rev := int64(gauge(t, first.rep.Registry(), "idrange_compactor_compacted_revision"))
	if _, err := cli.Get(ctx, "/space-test/k", clientv3.WithRev(rev-1)); err == nil {
		t.Fatalf("revision %d below the compacted revision %d still readable", rev-1, rev)
	}

	// The leader stops (it resigns on the way out): the other leads at once,
	// never both, and compacts.
	stopped := time.Now()
	first.rep.Stop(0)
	waitFor(t, 10*time.Second, "takeover after the leader stopped", func() bool {
		n, who := leaders([]*spaceReplica{other})
		return n == 1 && who == other
	})
	t.Logf("takeover after an orderly stop: %v", time.Since(stopped).Round(time.Millisecond))
	if gauge(t, first.rep.Registry(), "idrange_compactor_leader") != 0 {
		t.Fatal("the stopped replica still reports leading")
	}
	base := gauge(t, other.rep.Registry(), "idrange_compactor_compactions_total")
	waitFor(t, 15*time.Second, "the new leader compacting", func() bool {
		return gauge(t, other.rep.Registry(), "idrange_compactor_compactions_total") > base
	})

	// A third replica waits; the leader's lease is revoked (what its expiry
	// after a crash or partition does): the waiting one takes over and the
	// old leader stops reporting leading.
	third := startSpaceReplica(t, etcd, cfg)
	live := []*spaceReplica{other, third}
	if who := watch(live, time.Second); who != other {
		t.Fatal("the leader changed without a cause")
	}
	keys, err := cli.Get(ctx, etcdstore.DefaultPrefix+"compactor", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil || len(keys.Kvs) != 2 {
		t.Fatalf("election keys: %v, %v; want 2", keys, err)
	}
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(keys.Kvs[0].Lease)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 15*time.Second, "takeover after the leader's lease was revoked", func() bool {
		return third.rep.Compactor().Leading() && !other.rep.Compactor().Leading()
	})
	if who := watch(live, time.Second); who != third {
		t.Fatal("leadership did not stay with the replica that took over")
	}
	if !strings.Contains(other.logs.String(), "compactor: lost the compactor key") {
		t.Fatalf("the old leader did not log the loss:\n%s", other.logs)
	}
}
