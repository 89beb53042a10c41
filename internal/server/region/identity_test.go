package region_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/regionid"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/overlap"
	"github.com/idrange/idrange/segment"
)

// idReplica is a serving replica built with region.NewReplica, as rangesvc
// serve builds it, on cli.
type idReplica struct {
	code int
	rep  *region.Replica
	addr string
	reg  *prometheus.Registry
}

// newIDReplica builds and serves a replica; err is NewReplica's (what
// makes rangesvc serve exit 1).
func newIDReplica(t *testing.T, cli *clientv3.Client, cfg region.ReplicaConfig) (*idReplica, error) {
	t.Helper()
	cfg.Etcd = cli
	if cfg.EtcdTimeout == 0 {
		cfg.EtcdTimeout = time.Second
	}
	cfg.Registry = prometheus.NewRegistry()
	rep, err := region.NewReplica(cfg)
	if err != nil {
		return nil, err
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	rep.Serve(lis)
	t.Cleanup(func() { rep.Stop(0) })
	return &idReplica{code: cfg.Region, rep: rep, addr: lis.Addr().String(), reg: cfg.Registry}, nil
}

func mustIDReplica(t *testing.T, cli *clientv3.Client, cfg region.ReplicaConfig) *idReplica {
	t.Helper()
	r, err := newIDReplica(t, cli, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func oneLineErr(t *testing.T, err error, want ...string) {
	t.Helper()
	if err == nil {
		t.Fatalf("no error, want one naming %q", want)
	}
	msg := err.Error()
	if strings.Contains(msg, "\n") {
		t.Fatalf("error is not one line: %q", msg)
	}
	for _, w := range want {
		if !strings.Contains(msg, w) {
			t.Fatalf("error %q does not say %q", msg, w)
		}
	}
}

func (r *idReplica) serving(t *testing.T) bool {
	return r.rep.Service().Serving()
}

// grantOne acquires a code and grants a block on the replica's store (the
// grant path, guard included).
func (r *idReplica) grantOne(ctx context.Context) (segment.Block, error) {
	st := r.rep.Store()
	l, err := st.Acquire(ctx, r.code, "identity-test")
	if err != nil {
		return segment.Block{}, err
	}
	defer st.Release(context.WithoutCancel(ctx), l)
	return st.Allocate(ctx, l, 4096)
}

// Issue 16: a replica started with --region 2 against a region-1 etcd does
// not start, and the error names both codes; an empty external etcd is
// not initialised without --init-region; keys of another region are not
// adopted; a corrupt record fails closed.
func TestRegionRecordStartChecks(t *testing.T) {
	ctx := ctxT(t)
	e := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, e)

	_, err := newIDReplica(t, cli, region.ReplicaConfig{Region: 1})
	if !errors.Is(err, regionid.ErrNoRecord) {
		t.Fatalf("empty etcd without InitRegion: %v, want ErrNoRecord", err)
	}
	oneLineErr(t, err, "no region record", "--init-region")

	r1 := mustIDReplica(t, cli, region.ReplicaConfig{Region: 1, InitRegion: true})
	r1.rep.Stop(0)
	for _, init := range []bool{false, true} {
		_, err = newIDReplica(t, cli, region.ReplicaConfig{Region: 2, InitRegion: init})
		if !errors.Is(err, regionid.ErrMismatch) {
			t.Fatalf("region 2 on region 1's etcd (init %v): %v, want ErrMismatch", init, err)
		}
		oneLineErr(t, err, "holds region 1", "--region 2")
	}
	mustIDReplica(t, cli, region.ReplicaConfig{Region: 1}) // the record is there: no --init-region needed

	// Keys from before region records: adopted only by their own region.
	e2 := embedetcdtest.Start(t)
	cli2 := embedetcdtest.Client(t, e2)
	if _, err := cli2.Put(ctx, etcdstore.DefaultPrefix+"r3/hwm/007", store.EncodeHighWater(1)); err != nil {
		t.Fatal(err)
	}
	_, err = newIDReplica(t, cli2, region.ReplicaConfig{Region: 1, InitRegion: true})
	if !errors.Is(err, regionid.ErrMismatch) {
		t.Fatalf("adopting region 3's keys as region 1: %v", err)
	}
	oneLineErr(t, err, "r3/hwm/007", "region 1")
	mustIDReplica(t, cli2, region.ReplicaConfig{Region: 3, InitRegion: true})

	// A corrupt record fails closed at start.
	e3 := embedetcdtest.Start(t)
	cli3 := embedetcdtest.Client(t, e3)
	if _, err := cli3.Put(ctx, regionid.Key(etcdstore.DefaultPrefix), `{"v":1,"region":1}`); err != nil {
		t.Fatal(err)
	}
	for _, init := range []bool{false, true} {
		_, err = newIDReplica(t, cli3, region.ReplicaConfig{Region: 1, InitRegion: init})
		if !errors.Is(err, regionid.ErrCorrupt) {
			t.Fatalf("corrupt record: %v, want ErrCorrupt", err)
		}
		oneLineErr(t, err, "/idrange/v1/region", "corrupt")
	}
}

// A record that turns corrupt or names another region while replicas run
// makes them NOT_SERVING with the reason, the metrics say why, and no grant
// commits; a good record brings them back.
func TestRegionRecordPeriodicCheck(t *testing.T) {
	ctx := ctxT(t)
	e := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, e)
	r := mustIDReplica(t, cli, region.ReplicaConfig{Region: 2, InitRegion: true})
	waitFor(t, 10*time.Second, "serving", func() bool { return r.serving(t) })
	if g := gauge(t, r.reg, "idrange_region_record_ok"); g != 1 {
		t.Fatalf("idrange_region_record_ok = %v", g)
	}
	key := regionid.Key(etcdstore.DefaultPrefix)
	good, err := cli.Get(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ value, reason, says string }{
		{"garbage", "record_corrupt", "corrupt"},
		{strings.Replace(string(good.Kvs[0].Value), `"region":2`, `"region":1`, 1), "region_mismatch", "holds region 1"},
	} {
		if _, err := cli.Put(ctx, key, tc.value); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "NOT_SERVING after "+tc.reason, func() bool { return !r.serving(t) })
		if g := gauge(t, r.reg, "idrange_region_refused", "reason", tc.reason); g != 1 {
			t.Fatalf("idrange_region_refused{reason=%q} = %v", tc.reason, g)
		}
		if g := gauge(t, r.reg, "idrange_region_record_ok"); g != 0 {
			t.Fatalf("idrange_region_record_ok = %v", g)
		}
		if _, err := r.grantOne(ctx); !errors.Is(err, region.ErrRegionRefused) {
			t.Fatalf("grant with a %s record: %v, want ErrRegionRefused", tc.reason, err)
		}
		if _, err := cli.Put(ctx, key, string(good.Kvs[0].Value)); err != nil {
			t.Fatal(err)
		}
		waitFor(t, 10*time.Second, "serving again", func() bool { return r.serving(t) })
		if _, err := r.grantOne(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// Issue 16's registry acceptance: two etcd clusters both initialised as
// region 1 and one registry: the second cannot claim the code; a claim
// taken over later makes the holder NOT_SERVING with the metric; with the
// registry stopped the region that holds a confirmed claim keeps minting,
// and a region without one does not start. A corrupt claim fails closed.
func TestRegistryClaims(t *testing.T) {
	ctx := ctxT(t)
	registry := embedetcdtest.Start(t)
	regCli := embedetcdtest.Client(t, registry)
	cfg := func() region.ReplicaConfig {
		return region.ReplicaConfig{Region: 1, InitRegion: true, RegistryEtcd: regCli,
			RegistryCheckInterval: 100 * time.Millisecond}
	}
	cliA := embedetcdtest.Client(t, embedetcdtest.Start(t))
	a := mustIDReplica(t, cliA, cfg())
	waitFor(t, 10*time.Second, "a serving", func() bool { return a.serving(t) })
	if g := gauge(t, a.reg, "idrange_region_registry_claim_ok"); g != 1 {
		t.Fatalf("a: idrange_region_registry_claim_ok = %v", g)
	}
	recA, err := regionid.Read(ctx, cliA, etcdstore.DefaultPrefix)
	if err != nil || recA.Record.RegistryClaimedUnixMs == 0 {
		t.Fatalf("a's record does not cache the confirmed claim: %+v, %v", recA.Record, err)
	}

	// A second cluster, also region 1: refused at start, naming both ids.
	_, err = newIDReplica(t, embedetcdtest.Client(t, embedetcdtest.Start(t)), cfg())
	if !errors.Is(err, regionid.ErrClaimTaken) {
		t.Fatalf("second region 1: %v, want ErrClaimTaken", err)
	}
	oneLineErr(t, err, "claimed by region id "+recA.Record.RegionID)

	// The claim taken by another region id while a runs: a refuses.
	claimKey := regionid.ClaimKey(regionid.DefaultRegistryPrefix, 1)
	other := regionid.EncodeClaim(strings.Repeat("9", 32))
	if _, err := regCli.Put(ctx, claimKey, other); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a NOT_SERVING on a taken claim", func() bool { return !a.serving(t) })
	if g := gauge(t, a.reg, "idrange_region_refused", "reason", "registry_conflict"); g != 1 {
		t.Fatalf("idrange_region_refused{reason=registry_conflict} = %v", g)
	}
	if _, err := a.grantOne(ctx); !errors.Is(err, region.ErrRegionRefused) {
		t.Fatalf("grant while the claim is another region's: %v", err)
	}
	// A corrupt claim value: refused too, and a new replica does not start.
	if _, err := regCli.Put(ctx, claimKey, "region one"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "registry_corrupt", func() bool {
		return gauge(t, a.reg, "idrange_region_refused", "reason", "registry_corrupt") == 1
	})
	_, err = newIDReplica(t, cliA, cfg())
	if !errors.Is(err, regionid.ErrCorrupt) {
		t.Fatalf("corrupt claim at start: %v, want ErrCorrupt", err)
	}
	oneLineErr(t, err, claimKey, "corrupt")
	if _, err := regCli.Put(ctx, claimKey, regionid.EncodeClaim(recA.Record.RegionID)); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "a serving again", func() bool { return a.serving(t) })

	// Registry stopped: a keeps minting on its cached claim.
	registry.Stop()
	waitFor(t, 20*time.Second, "registry unreachable", func() bool {
		return gauge(t, a.reg, "idrange_region_registry_reachable") == 0
	})
	for range 5 {
		if _, err := a.grantOne(ctx); err != nil {
			t.Fatalf("grant with the registry down and a confirmed claim: %v", err)
		}
	}
	if !a.serving(t) {
		t.Fatal("a NOT_SERVING with the registry down and a confirmed claim")
	}
	// A region without a confirmed claim does not start.
	c := cfg()
	c.Region = 2
	_, err = newIDReplica(t, embedetcdtest.Client(t, embedetcdtest.Start(t)), c)
	oneLineErr(t, err, "no confirmed claim")
}

// mint acquires codes codes on r and grants maxBlock blocks on each until
// d has passed (backpressure, when a code runs max lead ahead, is waited
// out by trying again), returning every granted block.
func mint(t *testing.T, ctx context.Context, r *idReplica, codes int, d time.Duration) []overlap.Span {
	t.Helper()
	st := r.rep.Store()
	var spans []overlap.Span
	var leases []segment.Lease
	for range codes {
		l, err := st.Acquire(ctx, r.code, "restore-test")
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
	}
	end := time.Now().Add(d)
	for n := 0; n < 1_000_000 && (n == 0 || time.Now().Before(end)); n++ {
		for _, l := range leases {
			b, err := st.Allocate(ctx, l, int(st.Policy().MaxBlock))
			var bp *segment.Backpressure
			switch {
			case errors.As(err, &bp):
				continue
			case err != nil:
				t.Fatalf("allocate: %v", err)
			}
			spans = append(spans, overlap.Span{Region: b.Region, Worker: b.Worker, Lo: b.Lo, Hi: b.Hi})
		}
	}
	for _, l := range leases {
		if err := st.Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	return spans
}

func copyDir(t *testing.T, src, dst string) {
	t.Helper()
	if err := os.CopyFS(dst, os.DirFS(src)); err != nil {
		t.Fatal(err)
	}
}

// Issue 16's restore acceptance, with the backup (a copy of a
// stopped replica's embedded etcd data dir, which keeps the etcd cluster
// id): mint, back up, mint ahead of the clock with long blocks, then
//
//   - without the fence, a replica on the restored copy grants blocks that
//     overlap the second phase's (the duplicate the fence prevents: a fresh
//     replica cannot tell a copied data dir from the live one);
//   - started with Restored (serve --restored), the replica refuses to
//     grant until `rangesvc admin restore-fence` (the AdminService RPC),
//     after which every block of all phases is disjoint.
func TestRestoreFence(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A lead and blocks shorter than the defaults (15 s, 10 s) keep the
	// wait after the fence short (the codes are lifted lead + span + margin
	// ahead; grants resume once the clock is within the lead of that);
	// they still leave phase 2 many seconds ahead of the clock.
	sc := store.Config{Policy: segment.Policy{MaxBlock: 2000 * segment.PerMs, MaxLead: 10 * time.Second}}
	root := t.TempDir()
	live := filepath.Join(root, "live")
	e := embedetcdtest.StartConfig(t, embedetcd.Config{Dir: live})
	cli := embedetcdtest.Client(t, e)
	r := mustIDReplica(t, cli, region.ReplicaConfig{Region: 1, InitRegion: true, Store: sc})
	first := mint(t, ctx, r, 4, 0)
	r.rep.Stop(0)
	e.Stop()
	backupA, backupB := filepath.Join(root, "backup-a"), filepath.Join(root, "backup-b")
	copyDir(t, live, backupA)
	copyDir(t, live, backupB)

	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	r = mustIDReplica(t, embedetcdtest.Client(t, e), region.ReplicaConfig{Region: 1, Store: sc})
	second := mint(t, ctx, r, 4, 3*time.Second)
	r.rep.Stop(0)
	e.Stop()
	both := append(append([]overlap.Span{}, first...), second...)
	if p := overlap.Find(both); len(p) > 0 {
		t.Fatalf("phases 1 and 2 overlap: %v", p)
	}

	// Without the fence: duplicates.
	ea := embedetcdtest.StartConfig(t, embedetcd.Config{Dir: backupA})
	ra := mustIDReplica(t, embedetcdtest.Client(t, ea), region.ReplicaConfig{Region: 1, Store: sc})
	dup := overlap.Find(append(append([]overlap.Span{}, both...), mint(t, ctx, ra, 256, 0)...))
	if len(dup) == 0 {
		t.Fatal("a replica on the restored copy without a fence granted no block of phase 2 again; the test no longer shows what the fence prevents")
	}
	t.Logf("without restore-fence: %d blocks granted again after the restore", len(dup))
	ra.rep.Stop(0)
	ea.Stop()

	// With --restored: refused until the fence, then unique.
	eb := embedetcdtest.StartConfig(t, embedetcd.Config{Dir: backupB})
	rb := mustIDReplica(t, embedetcdtest.Client(t, eb), region.ReplicaConfig{Region: 1, Store: sc, Restored: true})
	if _, err := rb.grantOne(ctx); !errors.Is(err, region.ErrRegionRefused) || !errors.Is(err, regionid.ErrRestorePending) {
		t.Fatalf("grant while a restore is pending: %v", err)
	}
	waitFor(t, 10*time.Second, "NOT_SERVING while pending", func() bool { return !rb.serving(t) })
	if g := gauge(t, rb.reg, "idrange_region_restore_pending"); g != 1 {
		t.Fatalf("idrange_region_restore_pending = %v", g)
	}
	adm := idrangev1.NewAdminServiceClient(regiontest.Dial(t, rb.addr))
	st, err := adm.Status(ctx, &idrangev1.StatusRequest{})
	if err != nil || !st.GetRegionRecord().GetRestorePending() || !strings.Contains(st.GetRegionCheck(), "--restored") {
		t.Fatalf("status before the fence: %v, %v", st, err)
	}
	resp, err := adm.RestoreFence(ctx, &idrangev1.RestoreFenceRequest{MarginMs: 500})
	if err != nil {
		t.Fatal(err)
	}
	if resp.GetCodesLifted() != 256 || resp.GetTransactions() < 6 || resp.GetRecord().GetRestorePending() {
		t.Fatalf("fence: %v", resp)
	}
	waitFor(t, 10*time.Second, "serving after the fence", func() bool { return rb.serving(t) })
	third := mint(t, ctx, rb, 4, 8*time.Second)
	if len(third) == 0 {
		t.Fatal("no grant after the fence")
	}
	all := append(append([]overlap.Span{}, both...), third...)
	if p := overlap.Find(all); len(p) > 0 {
		t.Fatalf("after restore-fence, %d blocks overlap earlier ones, e.g. %+v and %+v", len(p), all[p[0].Earlier], all[p[0].Later])
	}
	t.Logf("blocks: %d before the backup, %d after it, %d after the fence (fence: %d codes in %d txns); none overlap",
		len(first), len(second), len(third), resp.GetCodesLifted(), resp.GetTransactions())
	st, err = adm.Status(ctx, &idrangev1.StatusRequest{})
	if err != nil || st.GetRegionRecord().GetFencedUnixMs() == 0 || st.GetRegionCheck() != "ok" {
		t.Fatalf("status after the fence: %v, %v", st, err)
	}
}

// A record naming another etcd cluster (a restore into a new cluster, or a
// copied data dir of another member) is marked restore-pending at start.
func TestRestoreDetectedByClusterID(t *testing.T) {
	ctx := ctxT(t)
	e := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, e)
	r := mustIDReplica(t, cli, region.ReplicaConfig{Region: 0, InitRegion: true})
	r.rep.Stop(0)
	key := regionid.Key(etcdstore.DefaultPrefix)
	st, err := regionid.Read(ctx, cli, etcdstore.DefaultPrefix)
	if err != nil {
		t.Fatal(err)
	}
	rec := st.Record
	rec.EtcdClusterID = "00000000000000aa"
	b, _ := rec.Encode()
	if _, err := cli.Put(ctx, key, string(b)); err != nil {
		t.Fatal(err)
	}
	r = mustIDReplica(t, cli, region.ReplicaConfig{Region: 0})
	if _, err := r.grantOne(ctx); !errors.Is(err, regionid.ErrRestorePending) {
		t.Fatalf("grant on a record of another cluster: %v", err)
	}
	st, err = regionid.Read(ctx, cli, etcdstore.DefaultPrefix)
	if err != nil || !st.Record.RestorePending || !strings.Contains(st.Record.RestoreReason, "00000000000000aa") {
		t.Fatalf("record not marked pending: %+v, %v", st.Record, err)
	}
}

// A running replica whose etcd is restored under it (same endpoint, same
// cluster id: the copied data dir) notices that etcd's revision went back:
// it grants nothing more, marks the record restore-pending, and serves
// again after the fence, with every block of every phase disjoint.
func TestRestoreDetectedByRevision(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	url := "http://" + lis.Addr().String()
	lis.Close()
	sc := store.Config{Policy: segment.Policy{MaxBlock: 1000 * segment.PerMs, MaxLead: 2 * time.Second}}
	root := t.TempDir()
	live, backup := filepath.Join(root, "live"), filepath.Join(root, "backup")
	e := embedetcdtest.StartConfig(t, embedetcd.Config{Dir: live, ClientURL: url})
	r := mustIDReplica(t, embedetcdtest.Client(t, e), region.ReplicaConfig{Region: 1, InitRegion: true, Store: sc})
	spans := mint(t, ctx, r, 2, 0)
	e.Stop()
	copyDir(t, live, backup)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 20*time.Second, "serving after the etcd restart", func() bool { return r.serving(t) })
	spans = append(spans, mint(t, ctx, r, 2, time.Second)...)

	e.Stop()
	if err := os.Rename(live, live+".lost"); err != nil {
		t.Fatal(err)
	}
	copyDir(t, backup, live)
	if err := e.Start(ctx); err != nil {
		t.Fatal(err)
	}
	granted := 0 // blocks handed out from the restored etcd before it was noticed: must be none
	waitFor(t, 30*time.Second, "the revision rollback refused", func() bool {
		b, err := r.grantOne(ctx)
		if err == nil {
			granted++
			spans = append(spans, overlap.Span{Region: b.Region, Worker: b.Worker, Lo: b.Lo, Hi: b.Hi})
		}
		return errors.Is(err, regionid.ErrRestorePending)
	})
	if granted > 0 {
		t.Errorf("%d blocks granted from the restored etcd before the rollback was noticed", granted)
	}
	cli := embedetcdtest.Client(t, e)
	waitFor(t, 10*time.Second, "the record marked restore-pending", func() bool {
		st, err := regionid.Read(ctx, cli, etcdstore.DefaultPrefix)
		return err == nil && st.Record.RestorePending && strings.Contains(st.Record.RestoreReason, "revision went back")
	})
	if r.serving(t) {
		t.Fatal("serving while a restore is pending")
	}
	adm := idrangev1.NewAdminServiceClient(regiontest.Dial(t, r.addr))
	if _, err := adm.RestoreFence(ctx, &idrangev1.RestoreFenceRequest{MarginMs: 200}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 10*time.Second, "serving after the fence", func() bool { return r.serving(t) })
	third := mint(t, ctx, r, 2, 6*time.Second)
	if len(third) == 0 {
		t.Fatal("no grant after the fence")
	}
	all := append(spans, third...)
	if p := overlap.Find(all); len(p) > 0 {
		t.Fatalf("%d blocks overlap, e.g. %+v and %+v", len(p), all[p[0].Earlier], all[p[0].Later])
	}
}
