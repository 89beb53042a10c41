package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// sharedRegion starts a region of replicas with the Next minter enabled
// (as rangesvc serve has it), so they serve the shared path, and returns
// one gRPC allocator per replica.
func sharedRegion(t *testing.T, replicas int, sc store.Config) ([]*localregion.Region, []segment.Allocator) {
	t.Helper()
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	minter := func(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
		return New(ctx, Config{Allocator: a, Region: region, Codes: 1, Owner: "rangesvc/next"})
	}
	var rs []*localregion.Region
	var as []segment.Allocator
	for range replicas {
		r := regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd, Store: sc, NextMinter: minter})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		stop, err := r.EnableNext(ctx)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { stop() })
		rs = append(rs, r)
		as = append(as, regiontest.Allocator(t, r))
	}
	return rs, as
}

// sharedFleet starts n Codes-0 clients over the replicas' allocators (a
// few connections shared by many clients, as in-process clients of one
// process would be), each minting perClient IDs with Next, and checks every
// ID's time against the moment Next returned it. Every tenth client paces
// its calls (pace apart), so its IDs span its runs' validity. It returns
// the clients (closed at the end of the test) and their IDs.
func sharedFleet(t *testing.T, as []segment.Allocator, n, perClient int, pace time.Duration) ([]*Engine, []snowflake.ID) {
	t.Helper()
	clients := make([]*Engine, n)
	out := make([][]snowflake.ID, n)
	errs := make(chan error, n)
	sem := make(chan struct{}, 32) // bounded start-up concurrency
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			c, err := New(ctx, Config{Allocator: as[i%len(as)], Region: 1, Owner: fmt.Sprintf("fleet-%d", i)})
			if err != nil {
				errs <- fmt.Errorf("client %d: New: %w", i, err)
				return
			}
			clients[i] = c
			for j := range perClient {
				if i%10 == 0 && j > 0 {
					time.Sleep(pace)
				}
				id, err := c.Next(ctx)
				at := time.Now()
				if err != nil {
					errs <- fmt.Errorf("client %d: Next: %w", i, err)
					return
				}
				ms := snowflake.Epoch.Add(time.Duration(id.Ms()) * time.Millisecond)
				if ms.Before(at.Add(-time.Second)) || ms.After(at.Add(segment.DefaultMaxLead)) {
					errs <- fmt.Errorf("client %d: ID %d has time %v, returned at %v", i, id, ms, at)
					return
				}
				out[i] = append(out[i], id)
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, c := range clients {
			if c != nil {
				c.Close()
			}
		}
	})
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var all []snowflake.ID
	for i, ids := range out {
		if !slices.IsSorted(ids) {
			t.Fatalf("client %d: IDs not increasing", i)
		}
		all = append(all, ids...)
	}
	if len(all) != n*perClient {
		t.Fatalf("%d IDs, want %d", len(all), n*perClient)
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("ID %d minted twice (%+v)", all[i], all[i].Parts())
		}
	}
	return clients, all
}

// Issue 27: one region (two replicas over gRPC on loopback) serves 1,000
// clients, four times its 256 codes; each mints, no ID repeats, and every
// ID lies within [returned - 1 s, returned + lead], also for the clients
// that mint slowly over 3 s (their runs expire and are replaced).
func TestSharedPathThousandClients(t *testing.T) {
	rs, as := sharedRegion(t, 2, store.Config{})
	clients, all := sharedFleet(t, as, 1000, 20, 150*time.Millisecond)
	for i, c := range clients {
		if !c.Stats().Shared {
			t.Fatalf("client %d holds a code at 20 IDs: %+v", i, c.Lease())
		}
	}
	free, err := rs[0].Store().FreeCodes(context.Background(), 1)
	if err != nil {
		t.Fatal(err)
	}
	if free < snowflake.MaxWorker+1-2 {
		t.Fatalf("%d free codes with 1,000 shared clients; want all but the 2 minters'", free)
	}
	t.Logf("1,000 clients, %d IDs, %d codes free", len(all), free)
}

// Issue 27: a region whose codes are all held but 8 (the rest leased by
// others) still lets the next 500 clients start and mint, and keeps doing
// so when none at all is left.
func TestSharedPathWithoutFreeCodes(t *testing.T) {
	rs, as := sharedRegion(t, 2, store.Config{LeaseTTL: time.Minute})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	hog := as[0]
	free := func() int {
		n, err := rs[0].Store().FreeCodes(ctx, 1)
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	for free() > 8 {
		if _, err := hog.Acquire(ctx, 1, "hog"); err != nil {
			t.Fatal(err)
		}
	}
	sharedFleet(t, as, 500, 10, 0)
	if n := free(); n != 8 {
		t.Fatalf("%d codes free after 500 shared clients, want the 8 left", n)
	}
	for free() > 0 {
		if _, err := hog.Acquire(ctx, 1, "hog"); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := hog.Acquire(ctx, 1, "hog"); !errors.Is(err, segment.ErrNoFreeCode) {
		t.Fatalf("Acquire with every code held: %v", err)
	}
	sharedFleet(t, []segment.Allocator{wire.NewAllocator(regiontest.Dial(t, rs[1].Addr()))}, 50, 10, 0)
}

// A shared-path client over two replicas keeps minting when the replica it
// uses is killed (its runs then come from the other replica's code), with
// its IDs still increasing and within the time bound, none repeated.
func TestSharedPathReplicaKilled(t *testing.T) {
	rs, _ := sharedRegion(t, 2, store.Config{})
	c := startClient(t, Config{Targets: []string{rs[0].Addr(), rs[1].Addr()}, Region: 1, Owner: t.Name()}, 20*time.Second, nil)
	if !c.Stats().Shared {
		t.Fatalf("Codes 0 on a region with minters: %+v", c.Lease())
	}
	var ids []snowflake.ID
	workers := map[int]bool{}
	mintFor := func(d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := c.Next(ctx)
			cancel()
			at := time.Now()
			if err != nil {
				t.Fatalf("Next: %v (stats %+v)", err, c.Stats())
			}
			ms := snowflake.Epoch.Add(time.Duration(id.Ms()) * time.Millisecond)
			if ms.Before(at.Add(-time.Second)) || ms.After(at.Add(segment.DefaultMaxLead)) {
				t.Fatalf("ID %d has time %v, returned at %v", id, ms, at)
			}
			if n := len(ids); n > 0 && id <= ids[n-1] {
				t.Fatalf("ID %d after %d: not increasing", id, ids[n-1])
			}
			ids = append(ids, id)
			workers[id.Worker()] = true
		}
	}
	mintFor(time.Second)
	rs[0].Kill()
	mintFor(2 * time.Second)
	rs[1].Kill()
	if err := rs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	stop, err := rs[0].EnableNext(ctx)
	cancel()
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	mintFor(2 * time.Second)
	if len(workers) < 2 {
		t.Fatalf("IDs from codes %v: the client did not move to the other replica's code", workers)
	}
	checkUnique(t, ids)
	t.Logf("%d IDs from codes %v across two replica kills", len(ids), workers)
}
