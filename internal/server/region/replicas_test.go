package region_test

import (
	"context"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/fakeclock"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Eight callers on one code, spread over two replicas that share one etcd,
// get blocks that never overlap; with one replica's clock set back 2 s its
// grants still start above the HWM; after a replica restart (new Store, new
// Service) blocks still start above every earlier one.
func TestConcurrentGrantsAcrossReplicas(t *testing.T) {
	etcd := embedetcdtest.Start(t)
	// Eight callers racing on one HWM key lose many optimistic rounds; the
	// store's default of 32 lost races per grant is for real traffic (one
	// owner per code), not for this pile-up.
	sc := store.Config{MaxConflicts: 1000}
	off := &fakeclock.Offset{} // replica 1's service clock
	r0 := regiontest.Start(t, localregion.Config{Region: 2, Etcd: etcd, Store: sc})
	r1 := regiontest.Start(t, localregion.Config{Region: 2, Etcd: etcd, Store: sc, Now: off.Now})
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()

	allocs := []segment.Allocator{regiontest.Allocator(t, r0), regiontest.Allocator(t, r1)}
	lease, err := allocs[0].Acquire(ctx, 2, "testenv")
	if err != nil {
		t.Fatal(err)
	}

	var (
		mu     sync.Mutex
		blocks []segment.Block
	)
	grantAll := func(round string, perCaller int) {
		t.Helper()
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for c := range 8 {
			a := allocs[c%2]
			wg.Go(func() {
				for i := range perCaller {
					b, err := a.Allocate(ctx, lease, 1000+c*100+i)
					// Right after a replica restart the channel may still
					// send on the dead connection: Unavailable, retryable
					// (the block, if committed, is a gap).
					for try := 0; errors.Is(err, segment.ErrUnavailable) && try < 20; try++ {
						select {
						case <-time.After(50 * time.Millisecond):
						case <-ctx.Done():
						}
						b, err = a.Allocate(ctx, lease, 1000+c*100+i)
					}
					if err != nil {
						errs <- errors.Wrapf(err, "%s caller %d grant %d", round, c, i)
						return
					}
					mu.Lock()
					blocks = append(blocks, b)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
	}
	maxHi := func() int64 {
		mu.Lock()
		defer mu.Unlock()
		var m int64
		for _, b := range blocks {
			m = max(m, b.Hi)
		}
		return m
	}

	grantAll("first", 10)
	conflicts := testutil.ToFloat64(r0.Service().Metrics().GrantConflicts) + testutil.ToFloat64(r1.Service().Metrics().GrantConflicts)
	t.Logf("HWM races lost and retried: %v", conflicts)

	// Replica 1's clock goes back 2 s: its grants still start above the HWM.
	before := maxHi()
	off.Add(-2 * time.Second)
	b, err := allocs[1].Allocate(ctx, lease, 4096)
	if err != nil {
		t.Fatalf("grant with the clock 2 s back: %v", err)
	}
	if b.Lo < before {
		t.Fatalf("grant with the clock 2 s back starts at %d, below the HWM %d", b.Lo, before)
	}
	mu.Lock()
	blocks = append(blocks, b)
	mu.Unlock()
	r1.Service().Check(ctx)
	hc := healthpb.NewHealthClient(regiontest.Dial(t, r1.Addr()))
	if st, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || st.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("health of the replica with the clock 2 s back: %v, %v; want NOT_SERVING", st, err)
	}

	// Restart replica 0 (fresh Store and Service, same address) and grant
	// more from both.
	before = maxHi()
	if err := r0.Restart(); err != nil {
		t.Fatal(err)
	}
	grantAll("after restart", 5)
	mu.Lock()
	for _, b := range blocks[len(blocks)-40:] {
		if b.Lo < before {
			t.Fatalf("block [%d,%d) after restart starts below the earlier HWM %d", b.Lo, b.Hi, before)
		}
	}
	mu.Unlock()

	// No two blocks overlap.
	mu.Lock()
	defer mu.Unlock()
	sort.Slice(blocks, func(i, j int) bool { return blocks[i].Lo < blocks[j].Lo })
	for i, b := range blocks {
		if b.Hi <= b.Lo || b.Region != 2 || b.Worker != lease.Worker {
			t.Fatalf("bad block %+v", b)
		}
		if i > 0 && b.Lo < blocks[i-1].Hi {
			t.Fatalf("blocks overlap: [%d,%d) and [%d,%d)", blocks[i-1].Lo, blocks[i-1].Hi, b.Lo, b.Hi)
		}
	}
	if len(blocks) != 8*10+1+8*5 {
		t.Fatalf("%d blocks, want %d", len(blocks), 8*10+1+8*5)
	}
}

// A released (or expired) lease's token is refused through the wire with
// FailedPrecondition, and errors.Is sees the segment sentinel.
func TestStaleTokenIsFencedOverGRPC(t *testing.T) {
	r := regiontest.Start(t, localregion.Config{Region: 0})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a := regiontest.Allocator(t, r)
	l, err := a.Acquire(ctx, 0, "old owner")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := a.Allocate(ctx, l, 100); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	_, err = a.Allocate(ctx, l, 100)
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("grant on a released lease: %v, want FailedPrecondition", err)
	}
	if !errors.Is(err, segment.ErrFenced) && !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("grant on a released lease: %v, want ErrFenced or ErrLeaseLost", err)
	}
	if _, err := a.Renew(ctx, l); !errors.Is(err, segment.ErrFenced) && !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("renew of a released lease: %v", err)
	}
	// A token that was never issued (above the store's revision) is a bad
	// request, not a lost lease.
	bogus := segment.Lease{Region: 0, Worker: (l.Worker + 1) % 256, Token: 1 << 40, LeaseID: 12345}
	if _, err := a.Allocate(ctx, bogus, 10); status.Code(err) != codes.InvalidArgument || !errors.Is(err, segment.ErrInvalid) {
		t.Fatalf("grant with an unknown token: %v, want InvalidArgument", err)
	}
}

// The Next RPC mints on the replica's own lease through the client engine.
func TestNextRPC(t *testing.T) {
	r := regiontest.Start(t, localregion.Config{Region: 3, NextMinter: func(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
		return engine.New(ctx, engine.Config{Allocator: a, Region: region, Owner: "testenv next"})
	}})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := r.EnableNext(ctx); err != nil {
		t.Fatal(err)
	}
	cli := idrangev1.NewRangeServiceClient(regiontest.Dial(t, r.Addr()))
	seen := map[int64]bool{}
	var last int64
	for range 200 {
		resp, err := cli.Next(ctx, &idrangev1.NextRequest{})
		if err != nil {
			t.Fatal(err)
		}
		id := snowflake.ID(resp.GetId())
		if seen[resp.GetId()] || id.Region() != 3 || resp.GetId() <= last {
			t.Fatalf("Next returned %d (region %d) after %d", id, id.Region(), last)
		}
		seen[resp.GetId()] = true
		last = resp.GetId()
	}
	leases, err := r.Store().List(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(leases) != 1 {
		t.Fatalf("%d leases in region 3, want 1 (the Next minter's)", len(leases))
	}
	r.Stop() // closes the minter, which releases its lease
	if leases, err = r.Store().List(ctx, 3); err != nil || len(leases) != 0 {
		t.Fatalf("after Stop: %d leases (%v), want 0", len(leases), err)
	}
}
