package etcdstore_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/server/store/storetest"
	"github.com/idrange/idrange/internal/testing/fakeclock"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/segment"
)

// backend is an embedded etcd under the conformance suite; every Storage
// call opens a new client (a new replica) on it.
type backend struct {
	srv *embedetcd.Server
	cli *clientv3.Client
	stg *etcdstore.Storage
	// open, if set, replaces a new client per Storage (an external etcd).
	open func(t testing.TB) store.Storage
}

func openBackend(t *testing.T) storetest.Backend {
	srv := embedetcdtest.StartConfig(t, embedetcd.Config{UnsafeNoFsync: true})
	cli := embedetcdtest.Client(t, srv)
	return &backend{srv: srv, cli: cli, stg: newStorage(t, cli)}
}

func (b *backend) Storage(t testing.TB) store.Storage {
	if b.open != nil {
		return b.open(t)
	}
	return newStorage(t, embedetcdtest.Client(t, b.srv))
}
func (b *backend) Put(t testing.TB, key string, value []byte, lease int64) {
	t.Helper()
	var opts []clientv3.OpOption
	if lease != 0 {
		opts = append(opts, clientv3.WithLease(clientv3.LeaseID(lease)))
	}
	if _, err := b.cli.Put(context.Background(), key, string(value), opts...); err != nil {
		t.Fatal(err)
	}
}
func (b *backend) Delete(t testing.TB, key string) {
	t.Helper()
	if _, err := b.cli.Delete(context.Background(), key); err != nil {
		t.Fatal(err)
	}
}
func (b *backend) Get(t testing.TB, key string) ([]byte, bool) {
	t.Helper()
	resp, err := b.cli.Get(context.Background(), key)
	if err != nil {
		t.Fatal(err)
	}
	if len(resp.Kvs) == 0 {
		return nil, false
	}
	return resp.Kvs[0].Value, true
}
func (b *backend) LeaseKey(r, w int) string     { return b.stg.LeaseKey(r, w) }
func (b *backend) HighWaterKey(r, w int) string { return b.stg.HighWaterKey(r, w) }
func (b *backend) Leases(t testing.TB) int {
	t.Helper()
	resp, err := b.cli.Leases(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return len(resp.Leases)
}

// TestConformance runs the grant rule and store tests shared with memstore
// against etcd.
func TestConformance(t *testing.T) { storetest.Run(t, openBackend) }

func newStorage(t testing.TB, cli *clientv3.Client) *etcdstore.Storage {
	t.Helper()
	stg, err := etcdstore.New(cli, etcdstore.Config{})
	if err != nil {
		t.Fatalf("etcdstore.New: %v", err)
	}
	return stg
}

func newStore(t testing.TB, cli *clientv3.Client, cfg store.Config) *store.Store {
	t.Helper()
	return storetest.NewStore(t, newStorage(t, cli), cfg)
}

var testCtx = storetest.Ctx

type counter = storetest.Counter

var checkDisjoint = storetest.CheckDisjoint

// TestRestartGrantsAboveEarlierBlocks stops etcd and starts it again on the
// same data dir: new grants (from the old Store with its cached view, and
// from a fresh Store) start above every earlier Hi, also with the service
// clock set back 2 s.
func TestRestartGrantsAboveEarlierBlocks(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, srv)
	st := newStore(t, cli, store.Config{LeaseTTL: 30 * time.Second})
	ctx := testCtx(t)
	l, err := st.Acquire(ctx, 3, "before-restart")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []segment.Block
	var maxHi int64
	for i := 0; i < 5; i++ {
		b, err := st.Allocate(ctx, l, 4096*1000) // 1 s of span each: HWM runs ahead of the clock
		if err != nil {
			t.Fatal(err)
		}
		blocks = append(blocks, b)
		maxHi = max(maxHi, b.Hi)
	}

	srv.Stop()
	dctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	if _, err := st.Allocate(dctx, l, 1); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Allocate with etcd down: %v, want ErrUnavailable", err)
	}
	if err := srv.Start(ctx); err != nil {
		t.Fatalf("restart etcd: %v", err)
	}

	var off fakeclock.Offset
	off.Set(-2 * time.Second)
	fresh := newStore(t, embedetcdtest.Client(t, srv), store.Config{Now: off.Now})
	for i, s := range []*store.Store{st, fresh, st} {
		b, err := s.Allocate(ctx, l, 4096)
		if err != nil {
			t.Fatalf("grant %d after restart: %v", i, err)
		}
		if b.Lo < maxHi {
			t.Fatalf("grant %d after restart [%d,%d) starts below an earlier Hi %d", i, b.Lo, b.Hi, maxHi)
		}
		blocks = append(blocks, b)
		maxHi = b.Hi
	}
	checkDisjoint(t, blocks)
}

// TestLeaseExpiresForReal lets etcd expire a lease by its TTL (no renewals)
// and checks the owner is cut off. Synchronised on the watch event of the
// key's deletion, not on a sleep.
func TestLeaseExpiresForReal(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, srv)
	st := newStore(t, cli, store.Config{LeaseTTL: time.Second})
	ctx := testCtx(t)
	l, err := st.Acquire(ctx, 2, "expiring")
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("asked for a 1 s lease, etcd granted %v", l.TTL)
	if l.TTL < time.Second {
		t.Fatalf("granted TTL %v below the request", l.TTL)
	}
	if _, err := st.Allocate(ctx, l, 10); err != nil {
		t.Fatal(err)
	}
	wch := cli.Watch(ctx, newStorage(t, cli).LeaseKey(2, l.Worker), clientv3.WithRev(l.Token+1))
	deleted := false
	for !deleted {
		select {
		case wr, ok := <-wch:
			if !ok || wr.Err() != nil {
				t.Fatalf("watch ended: %v", wr.Err())
			}
			for _, ev := range wr.Events {
				deleted = deleted || ev.Type == mvccpb.DELETE
			}
		case <-ctx.Done():
			t.Fatal("lease key was never deleted by expiry")
		}
	}
	if _, err := st.Allocate(ctx, l, 10); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate after expiry: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Renew after expiry: %v, want ErrLeaseLost", err)
	}
}

func TestStoreConfigValidate(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	stg := newStorage(t, cli)
	bad := map[string]store.Config{
		"LeaseTTL":     {LeaseTTL: 1500 * time.Millisecond},
		"LeaseTTL ":    {LeaseTTL: 2 * time.Hour},
		"OpTimeout":    {OpTimeout: -time.Second},
		"MaxConflicts": {MaxConflicts: -1},
		"MaxLead":      {Policy: segment.Policy{MaxLead: time.Microsecond}},
	}
	for field, cfg := range bad {
		_, err := store.New(stg, cfg)
		if !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("store.New(%+v) = %v; want ErrInvalid naming %s", cfg, err, field)
		}
	}
	if _, err := etcdstore.New(cli, etcdstore.Config{Prefix: "/no/slash"}); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "prefix") {
		t.Errorf("etcdstore.New(Prefix /no/slash) = %v; want ErrInvalid naming Prefix", err)
	}
	if _, err := store.New(nil, store.Config{}); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("store.New(nil storage) = %v", err)
	}
	if _, err := etcdstore.New(nil, etcdstore.Config{}); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("etcdstore.New(nil client) = %v", err)
	}
	st, err := store.New(stg, store.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Config(); stg.Prefix() != etcdstore.DefaultPrefix || c.LeaseTTL != store.DefaultLeaseTTL ||
		c.Policy != segment.DefaultPolicy() || c.OpTimeout != store.DefaultOpTimeout {
		t.Errorf("defaults not applied: %+v, prefix %q", c, stg.Prefix())
	}
	if got := stg.HighWaterKey(3, 7); got != "/idrange/v1/r3/hwm/007" {
		t.Errorf("HighWaterKey = %q", got)
	}
	if got := stg.LeaseKey(0, 255); got != "/idrange/v1/r0/lease/255" {
		t.Errorf("LeaseKey = %q", got)
	}
}

// lostResponses is a gRPC interceptor that, when armed, lets a grant's Txn
// (one with a Put) reach etcd and commit, then throws the response away and
// reports an error: the "commit unknown" case.
type lostResponses struct{ armed atomic.Bool }

func (x *lostResponses) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if txn, ok := req.(*pb.TxnRequest); ok && err == nil && len(txn.Success) > 0 && txn.Success[0].GetRequestPut() != nil &&
		x.armed.CompareAndSwap(true, false) {
		return status.Error(codes.Unknown, "injected: response lost after the commit")
	}
	return err
}

// TestUnknownCommitNeverReturnsTheBlock: the grant Txn commits but the
// caller sees an error. Allocate must return ErrUnavailable and no block;
// the next grant must start above what the lost commit wrote.
func TestUnknownCommitNeverReturnsTheBlock(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.StartConfig(t, embedetcd.Config{UnsafeNoFsync: true})
	var lost lostResponses
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(lost.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	st := newStore(t, cli, store.Config{})
	ctx := testCtx(t)
	l, err := st.Acquire(ctx, 0, "lossy")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}

	lost.armed.Store(true)
	b, err := st.Allocate(ctx, l, 4096)
	if !errors.Is(err, segment.ErrUnavailable) || b != (segment.Block{}) {
		t.Fatalf("Allocate with a lost response = %+v, %v; want no block and ErrUnavailable", b, err)
	}
	if lost.armed.Load() {
		t.Fatal("the injection did not fire")
	}
	burned, err := st.HighWater(ctx, 0, l.Worker)
	if err != nil || burned <= b1.Hi {
		t.Fatalf("HWM %d (%v): the lost commit should have raised it above %d", burned, err, b1.Hi)
	}
	b3, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if b3.Lo < burned {
		t.Fatalf("grant after the lost commit starts at %d, inside the burned range below %d", b3.Lo, burned)
	}

	// A context that ends before the commit: no block either.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if b, err := st.Allocate(cctx, l, 4096); err == nil || b != (segment.Block{}) || !errors.Is(err, context.Canceled) {
		t.Fatalf("Allocate with a cancelled context = %+v, %v", b, err)
	}
	if b4, err := st.Allocate(ctx, l, 4096); err != nil || b4.Lo < b3.Hi {
		t.Fatalf("grant after the cancelled one: %+v, %v", b4, err)
	}
}

// BenchmarkAllocate measures one grant round trip (a fenced Txn, fsync on)
// against the embedded etcd. Run: go test -run X -bench Allocate ./internal/server/store/etcdstore
func BenchmarkAllocate(b *testing.B) {
	srv := embedetcdtest.Start(b)
	st := newStore(b, embedetcdtest.Client(b, srv), store.Config{})
	ctx := testCtx(b)
	l, err := st.Acquire(ctx, 0, "bench")
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		if _, err := st.Allocate(ctx, l, 1); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAllocateTwoReplicas: parallel callers on one code through two
// Stores, the contended case (conflicts per grant are reported).
func BenchmarkAllocateTwoReplicas(b *testing.B) {
	srv := embedetcdtest.Start(b)
	obs := &counter{}
	stores := []*store.Store{
		newStore(b, embedetcdtest.Client(b, srv), store.Config{Observer: obs}),
		newStore(b, embedetcdtest.Client(b, srv), store.Config{Observer: obs}),
	}
	ctx := testCtx(b)
	l, err := stores[0].Acquire(ctx, 0, "bench")
	if err != nil {
		b.Fatal(err)
	}
	var next, starved atomic.Int64
	b.SetParallelism(4)
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		st := stores[next.Add(1)%2]
		for pb.Next() {
			_, err := st.Allocate(ctx, l, 1)
			switch {
			case errors.Is(err, segment.ErrUnavailable) && strings.Contains(err.Error(), "races"):
				starved.Add(1) // gave up after MaxConflicts lost races: retryable
			case err != nil:
				b.Error(err)
				return
			}
		}
	})
	b.ReportMetric(float64(obs.NConflicts.Load())/float64(max(obs.NGranted.Load(), 1)), "conflicts/grant")
	b.ReportMetric(float64(starved.Load())/float64(b.N), "starved/op")
}

// currentRev is etcd's store revision (one per committed write Txn).
func currentRev(t testing.TB, cli *clientv3.Client) int64 {
	t.Helper()
	resp, err := cli.Get(context.Background(), "/rev-probe")
	if err != nil {
		t.Fatal(err)
	}
	return resp.Header.Revision
}

// grantAll runs one Allocate per lease at once (after a common start) and
// returns each one's block and error.
func grantAll(ctx context.Context, st *store.Store, leases []segment.Lease) ([]segment.Block, []error) {
	blocks, errs := make([]segment.Block, len(leases)), make([]error, len(leases))
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, l := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			blocks[i], errs[i] = st.Allocate(ctx, l, 4096)
		}()
	}
	close(start)
	wg.Wait()
	return blocks, errs
}

// TestGroupCommitFewerRevisions: N concurrent grants on N codes through one
// Store are committed in fewer than N Txns (etcd's revision rises once per
// write Txn, so its delta counts raft proposals), every block is disjoint
// from the code's earlier ones and every HWM is the block's Hi.
func TestGroupCommitFewerRevisions(t *testing.T) {
	t.Parallel()                  // each test has its own etcd
	srv := embedetcdtest.Start(t) // fsync on: commits take a while, as in production
	cli := embedetcdtest.Client(t, srv)
	checkFewerRevisions(t, cli, newStorage(t, cli))
}

// checkFewerRevisions is TestGroupCommitFewerRevisions on any etcd.
func checkFewerRevisions(t *testing.T, cli *clientv3.Client, stg *etcdstore.Storage) {
	st := storetest.NewStore(t, stg, store.Config{})
	ctx := testCtx(t)
	const n = 48
	leases := make([]segment.Lease, n)
	prev := make([]int64, n)
	for i := range leases {
		l, err := st.Acquire(ctx, 1, "group")
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Allocate(ctx, l, 4096) // warms the Store's view of the code
		if err != nil {
			t.Fatal(err)
		}
		leases[i], prev[i] = l, b.Hi
	}
	rev0 := currentRev(t, cli)
	blocks, errs := grantAll(ctx, st, leases)
	delta := currentRev(t, cli) - rev0
	for i, b := range blocks {
		if errs[i] != nil {
			t.Fatalf("grant %d: %v", i, errs[i])
		}
		if b.Lo < prev[i] || b.Len() != 4096 {
			t.Fatalf("grant %d: block [%d,%d) after the code's Hi %d", i, b.Lo, b.Hi, prev[i])
		}
		if hwm, err := st.HighWater(ctx, 1, leases[i].Worker); err != nil || hwm != b.Hi {
			t.Fatalf("code %d: HWM %d, %v; want the block's Hi %d committed", i, hwm, err, b.Hi)
		}
	}
	t.Logf("%d concurrent grants on %d codes: %d write Txns", n, n, delta)
	if delta >= n {
		t.Fatalf("%d grants took %d write Txns; want fewer (group commit)", n, delta)
	}
	if minTxns := int64((n + etcdstore.MaxBatch - 1) / etcdstore.MaxBatch); delta < minTxns {
		t.Fatalf("%d grants in %d Txns: more than MaxBatch %d per Txn", n, delta, etcdstore.MaxBatch)
	}
}

// TestGroupCommitExternalEtcd runs the group-commit checks against the etcd
// at $IDRANGE_TEST_ETCD (comma-separated client URLs), under a fresh key
// prefix: how the nested Txns are checked on another etcd version, such
// as Debian's etcd-server 3.4. Skipped when the variable is unset (a
// failure in CI mode).
func TestGroupCommitExternalEtcd(t *testing.T) {
	eps := os.Getenv("IDRANGE_TEST_ETCD")
	if eps == "" {
		testenv.Missing(t, "an external etcd (IDRANGE_TEST_ETCD)",
			"set IDRANGE_TEST_ETCD to its client URLs; .ci/run installs Debian's etcd-server, starts it on loopback and sets it")
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(eps, ","), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	ctx := testCtx(t)
	if st, err := cli.Status(ctx, cli.Endpoints()[0]); err == nil {
		t.Logf("etcd server version %s", st.Version)
	}
	prefix := func() string { return fmt.Sprintf("/idrange-test/%d/", time.Now().UnixNano()) }
	stg, err := etcdstore.New(cli, etcdstore.Config{Prefix: prefix()})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("FewerRevisions", func(t *testing.T) { checkFewerRevisions(t, cli, stg) })
	stg, err = etcdstore.New(cli, etcdstore.Config{Prefix: prefix()})
	if err != nil {
		t.Fatal(err)
	}
	storetest.RunGroupCommit(t, &backend{cli: cli, stg: stg, open: func(t testing.TB) store.Storage { return stg }})
}

// lostBatches is a gRPC interceptor that, when armed, lets a group commit
// (a Txn of nested Txns) reach etcd and commit, then throws the response
// away and reports an error: an ambiguous commit of a whole batch.
type lostBatches struct{ armed, fired atomic.Bool }

func (x *lostBatches) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn,
	invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	err := invoker(ctx, method, req, reply, cc, opts...)
	if txn, ok := req.(*pb.TxnRequest); ok && err == nil && len(txn.Success) > 1 && txn.Success[0].GetRequestTxn() != nil &&
		x.armed.CompareAndSwap(true, false) {
		x.fired.Store(true)
		return status.Error(codes.Unknown, "injected: batch response lost after the commit")
	}
	return err
}

// TestUnknownBatchCommitBurnsEveryRange: a group commit commits but its
// response is lost. Every caller in the batch gets ErrUnavailable and no
// block; its code's HWM was raised by the lost commit, and the code's next
// grant starts above it. Callers outside the batch are unaffected.
func TestUnknownBatchCommitBurnsEveryRange(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	var lost lostBatches
	cli, err := clientv3.New(clientv3.Config{
		Endpoints: srv.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithChainUnaryInterceptor(lost.intercept)},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cli.Close() })
	st := newStore(t, cli, store.Config{})
	ctx := testCtx(t)
	const n = 24
	leases := make([]segment.Lease, n)
	prev := make([]int64, n)
	for i := range leases {
		l, err := st.Acquire(ctx, 0, "lossy-batch")
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Allocate(ctx, l, 4096)
		if err != nil {
			t.Fatal(err)
		}
		leases[i], prev[i] = l, b.Hi
	}
	// Concurrent grants batch as soon as one commit is in flight; a round
	// with no batch (every grant alone) is repeated, a bounded number of
	// times.
	for round := 0; round < 10 && !lost.fired.Load(); round++ {
		lost.armed.Store(true)
		blocks, errs := grantAll(ctx, st, leases)
		lost.armed.Store(false)
		burned := 0
		for i, b := range blocks {
			hwm, err := st.HighWater(ctx, 0, leases[i].Worker)
			if err != nil {
				t.Fatal(err)
			}
			switch {
			case errs[i] == nil:
				if b.Lo < prev[i] || hwm != b.Hi {
					t.Fatalf("code %d: block [%d,%d), HWM %d, previous Hi %d", i, b.Lo, b.Hi, hwm, prev[i])
				}
			case errors.Is(errs[i], segment.ErrUnavailable) && b == (segment.Block{}):
				if hwm <= prev[i] {
					t.Fatalf("code %d: HWM %d not raised above %d by the lost batch", i, hwm, prev[i])
				}
				burned++
			default:
				t.Fatalf("code %d: %+v, %v; want a block or ErrUnavailable with none", i, b, errs[i])
			}
			prev[i] = hwm
		}
		if lost.fired.Load() && burned < 2 {
			t.Fatalf("the lost batch burned %d ranges; want every grant of the batch (>= 2)", burned)
		}
		t.Logf("round %d: injection fired %v, %d ranges burned", round, lost.fired.Load(), burned)
	}
	if !lost.fired.Load() {
		t.Fatal("no group commit formed in 10 rounds of concurrent grants")
	}
	blocks, errs := grantAll(ctx, st, leases)
	for i, b := range blocks {
		if errs[i] != nil || b.Lo < prev[i] {
			t.Fatalf("code %d after the lost batch: %+v, %v; want a block at or above %d", i, b, errs[i], prev[i])
		}
	}
}
