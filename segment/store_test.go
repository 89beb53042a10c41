package segment_test

import (
	"context"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/internal/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/segment"
)

// testTTL is the lease TTL tests ask for unless they test expiry: long
// enough that a slow run never loses a lease by accident.
const testTTL = 60 * time.Second

func newStore(t testing.TB, cli *clientv3.Client, cfg segment.StoreConfig) *segment.Store {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = testTTL
	}
	st, err := segment.NewStore(cli, cfg)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return st
}

func testCtx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// counter is an Observer that counts events, to check that the hooks fire.
type counter struct {
	segment.NopObserver
	granted, grantFailed, conflicts, acquired, acquireFailed, renewed, released, corrupt atomic.Int64
	size                                                                                 atomic.Int64
}

func (c *counter) Granted(_, _ int, size int64, _ time.Duration) { c.granted.Add(1); c.size.Add(size) }
func (c *counter) GrantFailed(int, int, error, time.Duration)    { c.grantFailed.Add(1) }
func (c *counter) Conflict(int, int)                             { c.conflicts.Add(1) }
func (c *counter) Acquired(int, int)                             { c.acquired.Add(1) }
func (c *counter) AcquireFailed(int, error)                      { c.acquireFailed.Add(1) }
func (c *counter) Renewed(_, _ int, err error) {
	if err == nil {
		c.renewed.Add(1)
	}
}
func (c *counter) Released(int, int, error) { c.released.Add(1) }
func (c *counter) Corrupt(string, error)    { c.corrupt.Add(1) }

// checkDisjoint sorts blocks and fails on any overlap.
func checkDisjoint(t *testing.T, blocks []segment.Block) {
	t.Helper()
	slices.SortFunc(blocks, func(a, b segment.Block) int { return int(a.Lo - b.Lo) })
	for i := 1; i < len(blocks); i++ {
		if blocks[i].Lo < blocks[i-1].Hi {
			t.Fatalf("blocks overlap: [%d,%d) and [%d,%d)", blocks[i-1].Lo, blocks[i-1].Hi, blocks[i].Lo, blocks[i].Hi)
		}
	}
}

func TestLifecycle(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, srv)
	obs := &counter{}
	st := newStore(t, cli, segment.StoreConfig{Observer: obs})
	ctx := testCtx(t)

	l, err := st.Acquire(ctx, 2, "host-a/1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Region != 2 || l.Worker < 0 || l.Worker > 255 || l.Token <= 0 || l.LeaseID == 0 || l.TTL < testTTL {
		t.Fatalf("Acquire returned %+v", l)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if b1.Len() != 4096 || b1.Region != 2 || b1.Worker != l.Worker || !b1.ValidUntil.After(b1.ServiceTime) {
		t.Fatalf("block %+v", b1)
	}
	b2, err := st.Allocate(ctx, l, 100)
	if err != nil {
		t.Fatalf("Allocate 2: %v", err)
	}
	if b2.Lo < b1.Hi {
		t.Fatalf("blocks overlap: %+v then %+v", b1, b2)
	}
	hwm, err := st.HighWater(ctx, 2, l.Worker)
	if err != nil || hwm != b2.Hi {
		t.Fatalf("HighWater = %d, %v; want %d", hwm, err, b2.Hi)
	}
	l2, err := st.Renew(ctx, l)
	if err != nil || l2.TTL < testTTL || l2.Token != l.Token {
		t.Fatalf("Renew = %+v, %v", l2, err)
	}
	infos, err := st.List(ctx, 2)
	if err != nil || len(infos) != 1 || infos[0].Worker != l.Worker || infos[0].Token != l.Token ||
		infos[0].LeaseID != l.LeaseID || infos[0].Owner != "host-a/1" || infos[0].Err != nil {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if free, err := st.FreeCodes(ctx, 2); err != nil || free != 255 {
		t.Fatalf("FreeCodes = %d, %v; want 255", free, err)
	}
	if err := st.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := st.Allocate(ctx, l, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate after Release: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Renew after Release: %v, want ErrLeaseLost", err)
	}
	if err := st.Release(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("second Release: %v, want ErrLeaseLost", err)
	}
	if hwm, err := st.HighWater(ctx, 2, l.Worker); err != nil || hwm != b2.Hi {
		t.Fatalf("HWM after Release = %d, %v; want it kept at %d", hwm, err, b2.Hi)
	}
	if leases, err := cli.Leases(ctx); err != nil || len(leases.Leases) != 0 {
		t.Fatalf("etcd leases after Release: %v, %v; want none (revoked)", leases, err)
	}
	if obs.acquired.Load() != 1 || obs.granted.Load() != 2 || obs.size.Load() != b1.Len()+b2.Len() ||
		obs.renewed.Load() != 1 || obs.released.Load() != 2 || obs.grantFailed.Load() != 1 {
		t.Fatalf("observer counts: acquired %d granted %d size %d renewed %d released %d grantFailed %d",
			obs.acquired.Load(), obs.granted.Load(), obs.size.Load(), obs.renewed.Load(), obs.released.Load(), obs.grantFailed.Load())
	}
}

// TestConcurrentReplicasNeverOverlap: 8 callers on one code through two
// Stores on two etcd clients (two service replicas) sharing one etcd.
func TestConcurrentReplicasNeverOverlap(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	obs := &counter{}
	stores := []*segment.Store{
		newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{Observer: obs}),
		newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{Observer: obs}),
	}
	ctx := testCtx(t)
	l, err := stores[0].Acquire(ctx, 1, "shared")
	if err != nil {
		t.Fatal(err)
	}
	const callers, perCaller = 8, 25
	var (
		mu     sync.Mutex
		blocks []segment.Block
		wg     sync.WaitGroup
		errs   = make(chan error, callers)
	)
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			st := stores[c%2]
			r := rand.New(rand.NewPCG(uint64(c), 9))
			var prevHi int64
			for i := 0; i < perCaller; i++ {
				before, err := st.HighWater(ctx, 1, l.Worker)
				if err != nil {
					errs <- err
					return
				}
				b, err := st.Allocate(ctx, l, 1+r.IntN(10*4096))
				if err != nil {
					errs <- fmt.Errorf("caller %d grant %d: %w", c, i, err)
					return
				}
				if b.Lo < before {
					errs <- fmt.Errorf("caller %d: block [%d,%d) starts below the HWM %d read before the call", c, b.Lo, b.Hi, before)
					return
				}
				if b.Lo < prevHi || b.Hi <= b.Lo {
					errs <- fmt.Errorf("caller %d: block [%d,%d) after its previous Hi %d", c, b.Lo, b.Hi, prevHi)
					return
				}
				prevHi = b.Hi
				mu.Lock()
				blocks = append(blocks, b)
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(blocks) != callers*perCaller {
		t.Fatalf("%d blocks, want %d", len(blocks), callers*perCaller)
	}
	checkDisjoint(t, blocks)
	hwm, err := stores[1].HighWater(ctx, 1, l.Worker)
	if err != nil || hwm != blocks[len(blocks)-1].Hi {
		t.Fatalf("final HWM %d, %v; want the highest Hi %d", hwm, err, blocks[len(blocks)-1].Hi)
	}
	if obs.granted.Load() != callers*perCaller {
		t.Fatalf("observer saw %d grants", obs.granted.Load())
	}
	var signals int64
	if resp, err := embedetcdtest.Client(t, srv).Get(ctx, "/idrange/v1/r1/contend/"+fmt.Sprintf("%03d", l.Worker)); err == nil && len(resp.Kvs) == 1 {
		signals = resp.Kvs[0].Version
	}
	t.Logf("%d grants, %d failed attempts retried, %d contention signals", obs.granted.Load(), obs.conflicts.Load(), signals)
}

// TestConcurrentAcquireDistinctCodes: acquisitions racing through two
// replicas never hand one code to two live owners.
func TestConcurrentAcquireDistinctCodes(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	stores := []*segment.Store{
		newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{}),
		newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{}),
	}
	ctx := testCtx(t)
	const n = 40
	leases := make([]segment.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			leases[i], errs[i] = stores[i%2].Acquire(ctx, 0, fmt.Sprintf("w%d", i))
		}(i)
	}
	wg.Wait()
	seen := map[int]int64{}
	for i := range leases {
		if errs[i] != nil {
			t.Fatalf("acquire %d: %v", i, errs[i])
		}
		if tok, dup := seen[leases[i].Worker]; dup {
			t.Fatalf("worker %d handed out twice (tokens %d and %d)", leases[i].Worker, tok, leases[i].Token)
		}
		seen[leases[i].Worker] = leases[i].Token
	}
	infos, err := stores[0].List(ctx, 0)
	if err != nil || len(infos) != n {
		t.Fatalf("List: %d entries, %v; want %d", len(infos), err, n)
	}
	for _, in := range infos {
		if seen[in.Worker] != in.Token {
			t.Fatalf("List says worker %d token %d, acquire said %d", in.Worker, in.Token, seen[in.Worker])
		}
	}
}

// TestRestartGrantsAboveEarlierBlocks stops etcd and starts it again on the
// same data dir: new grants (from the old Store with its cached view, and
// from a fresh Store) start above every earlier Hi, also with the service
// clock set back 2 s.
func TestRestartGrantsAboveEarlierBlocks(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, srv)
	st := newStore(t, cli, segment.StoreConfig{LeaseTTL: 30 * time.Second})
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

	var off clock.Offset
	off.Set(-2 * time.Second)
	fresh := newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{Clock: &off})
	for i, s := range []*segment.Store{st, fresh, st} {
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

// TestClockBackStillAboveHWM: with the service clock set back 2 s, the next
// grant starts exactly at the HWM; far beyond the lead it is backpressure,
// and nothing is written.
func TestClockBackStillAboveHWM(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	var off clock.Offset
	st := newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{Clock: &off})
	ctx := testCtx(t)
	l, err := st.Acquire(ctx, 0, "clock")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096*1000) // ends ~1 s ahead of now
	if err != nil {
		t.Fatal(err)
	}
	off.Set(-2 * time.Second)
	b2, err := st.Allocate(ctx, l, 4096*1000)
	if err != nil {
		t.Fatalf("grant with the clock 2 s back: %v", err)
	}
	if b2.Lo != b1.Hi {
		t.Fatalf("grant with the clock back starts at %d, want the HWM %d", b2.Lo, b1.Hi)
	}
	if d := b1.ServiceTime.Sub(b2.ServiceTime); d < time.Second {
		t.Fatalf("service time moved by %v; the offset clock was not used", -d)
	}

	off.Set(-30 * time.Second) // beyond the 15 s lead
	_, err = st.Allocate(ctx, l, 1)
	var bp *segment.Backpressure
	if !errors.As(err, &bp) || !errors.Is(err, segment.ErrBackpressure) || bp.RetryAfter < 10*time.Second {
		t.Fatalf("grant 30 s back: %v, want *Backpressure with RetryAfter > 10 s", err)
	}
	if hwm, err := st.HighWater(ctx, 0, l.Worker); err != nil || hwm != b2.Hi {
		t.Fatalf("HWM after refusal %d, %v; want %d", hwm, err, b2.Hi)
	}
}

// TestFullRegionAndFencing leases all 256 codes of a region, checks the
// 257th acquire fails retryably without leaking an etcd lease, then
// simulates one owner's lease expiring (revoking its etcd lease directly):
// the code goes to a new owner with a bigger token, starting above the old
// HWM, and the old token is refused everything.
func TestFullRegionAndFencing(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.StartConfig(t, embedetcd.Config{UnsafeNoFsync: true})
	cli := embedetcdtest.Client(t, srv)
	obs := &counter{}
	st := newStore(t, cli, segment.StoreConfig{Observer: obs, LeaseTTL: 60 * time.Second})
	ctx := testCtx(t)

	byWorker := map[int]segment.Lease{}
	for i := 0; i < 256; i++ {
		l, err := st.Acquire(ctx, 1, "filler")
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if _, dup := byWorker[l.Worker]; dup {
			t.Fatalf("worker %d handed out twice", l.Worker)
		}
		byWorker[l.Worker] = l
	}
	leasesBefore, err := cli.Leases(ctx)
	if err != nil {
		t.Fatal(err)
	}
	_, err = st.Acquire(ctx, 1, "one too many")
	if !errors.Is(err, segment.ErrNoFreeCode) || !strings.Contains(err.Error(), "region 1") {
		t.Fatalf("257th acquire: %v, want ErrNoFreeCode naming region 1", err)
	}
	if leasesAfter, err := cli.Leases(ctx); err != nil || len(leasesAfter.Leases) != len(leasesBefore.Leases) {
		t.Fatalf("etcd leases %d before, %d after the failed acquire (%v): the unused lease leaked",
			len(leasesBefore.Leases), len(leasesAfter.Leases), err)
	}
	if free, err := st.FreeCodes(ctx, 1); err != nil || free != 0 {
		t.Fatalf("FreeCodes = %d, %v; want 0", free, err)
	}
	if obs.acquireFailed.Load() != 1 {
		t.Fatalf("observer saw %d failed acquisitions, want 1", obs.acquireFailed.Load())
	}

	old := byWorker[77]
	b, err := st.Allocate(ctx, old, 4096*500)
	if err != nil {
		t.Fatal(err)
	}
	// Expiry, without waiting for it: etcd deletes the lease key.
	if _, err := cli.Revoke(ctx, clientv3.LeaseID(old.LeaseID)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Allocate(ctx, old, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate on an expired lease: %v, want ErrLeaseLost", err)
	}
	// A second replica (fresh cache) acquires: code 77 is the only free one.
	other := newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{LeaseTTL: 60 * time.Second})
	nl, err := other.Acquire(ctx, 1, "new owner")
	if err != nil {
		t.Fatal(err)
	}
	if nl.Worker != 77 || nl.Token <= old.Token {
		t.Fatalf("new owner got worker %d token %d; want worker 77 with a token above %d", nl.Worker, nl.Token, old.Token)
	}
	nb, err := other.Allocate(ctx, nl, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if nb.Lo < b.Hi {
		t.Fatalf("new owner's block starts at %d, below the old owner's Hi %d", nb.Lo, b.Hi)
	}
	// The old token, through either replica, is fenced from everything.
	for _, s := range []*segment.Store{st, other} {
		if _, err := s.Allocate(ctx, old, 1); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Allocate: %v, want ErrFenced", err)
		}
		if _, err := s.Renew(ctx, old); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Renew: %v, want ErrFenced", err)
		}
		if err := s.Release(ctx, old); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Release: %v, want ErrFenced", err)
		}
	}
	// The stale owner knowing the new lease id but not the token gets nothing.
	stale := old
	stale.LeaseID = nl.LeaseID
	if _, err := st.Allocate(ctx, stale, 1); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("old token with new lease id: %v, want ErrFenced", err)
	}
	// Never two live owners: exactly one lease key for code 77, the new one.
	infos, err := st.List(ctx, 1)
	if err != nil || len(infos) != 256 {
		t.Fatalf("List: %d, %v", len(infos), err)
	}
	for _, in := range infos {
		if in.Worker == 77 && (in.Token != nl.Token || in.Owner != "new owner") {
			t.Fatalf("code 77 listed as %+v, want the new owner", in)
		}
	}
	if _, err := other.Renew(ctx, nl); err != nil {
		t.Fatalf("new owner Renew after the stale calls: %v", err)
	}
	if _, err := st.Allocate(ctx, nl, 1); err != nil {
		t.Fatalf("new owner through the other replica: %v", err)
	}
}

// TestLeaseExpiresForReal lets etcd expire a lease by its TTL (no renewals)
// and checks the owner is cut off. Synchronised on the watch event of the
// key's deletion, not on a sleep.
func TestLeaseExpiresForReal(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, srv)
	st := newStore(t, cli, segment.StoreConfig{LeaseTTL: time.Second})
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
	wch := cli.Watch(ctx, st.LeaseKey(2, l.Worker), clientv3.WithRev(l.Token+1))
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

// TestCorruptValuesStopTheCode writes garbage to etcd behind the Store's back.
func TestCorruptValuesStopTheCode(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.StartConfig(t, embedetcd.Config{UnsafeNoFsync: true})
	cli := embedetcdtest.Client(t, srv)
	obs := &counter{}
	st := newStore(t, cli, segment.StoreConfig{Observer: obs})
	ctx := testCtx(t)

	t.Run("hwm", func(t *testing.T) {
		l, err := st.Acquire(ctx, 0, "a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Allocate(ctx, l, 100); err != nil { // warms the cache
			t.Fatal(err)
		}
		hk := st.HighWaterKey(0, l.Worker)
		for _, garbage := range []string{"v1:-5", "0", "", "v1:12abc"} {
			if _, err := cli.Put(ctx, hk, garbage); err != nil {
				t.Fatal(err)
			}
			before := obs.corrupt.Load()
			_, err := st.Allocate(ctx, l, 100)
			if !errors.Is(err, segment.ErrCorrupt) || !strings.Contains(err.Error(), hk) {
				t.Fatalf("Allocate over HWM %q: %v, want ErrCorrupt naming %s", garbage, err, hk)
			}
			if obs.corrupt.Load() == before {
				t.Fatalf("observer not told about corrupt %q", garbage)
			}
			resp, err := cli.Get(ctx, hk)
			if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != garbage {
				t.Fatalf("HWM key changed to %v (%v); the Store must not overwrite it", resp.Kvs, err)
			}
			if _, err := st.HighWater(ctx, 0, l.Worker); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("HighWater over %q: %v", garbage, err)
			}
		}
	})

	t.Run("lease record", func(t *testing.T) {
		l, err := st.Acquire(ctx, 1, "b")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Allocate(ctx, l, 100); err != nil {
			t.Fatal(err)
		}
		hwm, _ := st.HighWater(ctx, 1, l.Worker)
		lk := st.LeaseKey(1, l.Worker)
		wrongWorker := segment.OwnerRecord{Version: 1, Region: 1, Worker: (l.Worker + 1) % 256, LeaseID: l.LeaseID,
			Owner: "b", AcquiredUnixMs: 1}.Encode()
		for _, garbage := range []string{"not json", wrongWorker} {
			// Same lease: the key keeps its CreateRevision (the token).
			if _, err := cli.Put(ctx, lk, garbage, clientv3.WithLease(clientv3.LeaseID(l.LeaseID))); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Allocate(ctx, l, 100); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("Allocate over lease record %q: %v, want ErrCorrupt", garbage, err)
			}
			if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("Renew over lease record %q: %v, want ErrCorrupt", garbage, err)
			}
			if got, _ := st.HighWater(ctx, 1, l.Worker); got != hwm {
				t.Fatalf("HWM moved to %d over a corrupt lease record", got)
			}
		}
		infos, err := st.List(ctx, 1)
		if err != nil || len(infos) != 1 || !errors.Is(infos[0].Err, segment.ErrCorrupt) {
			t.Fatalf("List over a corrupt record: %+v, %v", infos, err)
		}
	})

	t.Run("acquire skips corrupt hwm", func(t *testing.T) {
		// Region 2: every code's HWM is corrupt, so nothing may be handed out.
		for w := 0; w < 256; w++ {
			if _, err := cli.Put(ctx, st.HighWaterKey(2, w), "bogus"); err != nil {
				t.Fatal(err)
			}
		}
		_, err := st.Acquire(ctx, 2, "c")
		if !errors.Is(err, segment.ErrNoFreeCode) || !strings.Contains(err.Error(), "corrupt") {
			t.Fatalf("Acquire in a region of corrupt HWMs: %v, want ErrNoFreeCode mentioning corrupt", err)
		}
		if free, err := st.FreeCodes(ctx, 2); err != nil || free != 0 {
			t.Fatalf("FreeCodes = %d, %v; want 0", free, err)
		}
		// Repair one: that code, and only it, is handed out.
		if _, err := cli.Put(ctx, st.HighWaterKey(2, 9), segment.EncodeHighWater(12345)); err != nil {
			t.Fatal(err)
		}
		l, err := st.Acquire(ctx, 2, "c")
		if err != nil || l.Worker != 9 {
			t.Fatalf("Acquire after repair: %+v, %v; want worker 9", l, err)
		}
		b, err := st.Allocate(ctx, l, 1)
		if err != nil || b.Lo < 12345 {
			t.Fatalf("Allocate after repair: %+v, %v", b, err)
		}
	})
}

func TestInvalidFields(t *testing.T) {
	t.Parallel() // each test has its own etcd
	srv := embedetcdtest.StartConfig(t, embedetcd.Config{UnsafeNoFsync: true})
	st := newStore(t, embedetcdtest.Client(t, srv), segment.StoreConfig{})
	ctx := testCtx(t)
	good, err := st.Acquire(ctx, 0, "ok")
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(*segment.Lease)) segment.Lease { l := good; f(&l); return l }
	leases := []struct {
		field string
		l     segment.Lease
	}{
		{"region", with(func(l *segment.Lease) { l.Region = -1 })},
		{"region", with(func(l *segment.Lease) { l.Region = 4 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = -1 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = 256 })},
		{"token", with(func(l *segment.Lease) { l.Token = 0 })},
		{"token", with(func(l *segment.Lease) { l.Token = -3 })},
		{"token", with(func(l *segment.Lease) { l.Token = 1 << 40 })}, // never issued
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = 0 })},
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = good.LeaseID + 1 })}, // right token, wrong lease
	}
	for _, c := range leases {
		if _, err := st.Allocate(ctx, c.l, 10); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Allocate(%s bad: %+v) = %v; want ErrInvalid naming %s", c.field, c.l, err, c.field)
		}
		if _, err := st.Renew(ctx, c.l); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Renew(%s bad) = %v; want ErrInvalid naming %s", c.field, err, c.field)
		}
	}
	for _, n := range []int{0, -1, int(segment.DefaultMaxBlock) + 1} {
		if _, err := st.Allocate(ctx, good, n); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "count") {
			t.Errorf("Allocate(n=%d) = %v; want ErrInvalid naming count", n, err)
		}
	}
	for _, region := range []int{-1, 4} {
		if _, err := st.Acquire(ctx, region, "x"); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "region") {
			t.Errorf("Acquire(region %d) = %v", region, err)
		}
		if _, err := st.FreeCodes(ctx, region); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("FreeCodes(region %d) = %v", region, err)
		}
		if _, err := st.List(ctx, region); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("List(region %d) = %v", region, err)
		}
	}
	for _, owner := range []string{"bad\nowner", strings.Repeat("x", segment.MaxOwnerLen+1), "\xff"} {
		if _, err := st.Acquire(ctx, 0, owner); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "owner") {
			t.Errorf("Acquire(owner %q) = %v; want ErrInvalid naming owner", owner, err)
		}
	}
	if _, err := st.HighWater(ctx, 0, 256); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "worker") {
		t.Errorf("HighWater(worker 256) = %v", err)
	}
	// The good lease still works: no invalid call damaged it.
	if _, err := st.Allocate(ctx, good, 10); err != nil {
		t.Fatalf("good lease after invalid calls: %v", err)
	}
}

func TestStoreConfigValidate(t *testing.T) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{"127.0.0.1:1"}, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Close()
	bad := map[string]segment.StoreConfig{
		"Prefix":       {Prefix: "/no/slash"},
		"LeaseTTL":     {LeaseTTL: 1500 * time.Millisecond},
		"LeaseTTL ":    {LeaseTTL: 2 * time.Hour},
		"OpTimeout":    {OpTimeout: -time.Second},
		"MaxConflicts": {MaxConflicts: -1},
		"MaxLead":      {Policy: segment.Policy{MaxLead: time.Microsecond}},
	}
	for field, cfg := range bad {
		_, err := segment.NewStore(cli, cfg)
		if !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), strings.TrimSpace(field)) {
			t.Errorf("NewStore(%+v) = %v; want ErrInvalid naming %s", cfg, err, field)
		}
	}
	if _, err := segment.NewStore(nil, segment.StoreConfig{}); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("NewStore(nil client) = %v", err)
	}
	st, err := segment.NewStore(cli, segment.StoreConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if c := st.Config(); c.Prefix != segment.DefaultPrefix || c.LeaseTTL != segment.DefaultLeaseTTL ||
		c.Policy != segment.DefaultPolicy() || c.OpTimeout != segment.DefaultOpTimeout {
		t.Errorf("defaults not applied: %+v", c)
	}
	if got := st.HighWaterKey(3, 7); got != "/idrange/v1/r3/hwm/007" {
		t.Errorf("HighWaterKey = %q", got)
	}
	if got := st.LeaseKey(0, 255); got != "/idrange/v1/r0/lease/255" {
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
	st := newStore(t, cli, segment.StoreConfig{})
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
// against the embedded etcd. Run: go test -run X -bench Allocate ./segment
func BenchmarkAllocate(b *testing.B) {
	srv := embedetcdtest.Start(b)
	st := newStore(b, embedetcdtest.Client(b, srv), segment.StoreConfig{})
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
	stores := []*segment.Store{
		newStore(b, embedetcdtest.Client(b, srv), segment.StoreConfig{Observer: obs}),
		newStore(b, embedetcdtest.Client(b, srv), segment.StoreConfig{Observer: obs}),
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
	b.ReportMetric(float64(obs.conflicts.Load())/float64(max(obs.granted.Load(), 1)), "conflicts/grant")
	b.ReportMetric(float64(starved.Load())/float64(b.N), "starved/op")
}
