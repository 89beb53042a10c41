package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// These tests run the client against real in-process regions: embedded
// etcd, store.Store, the gRPC service on 127.0.0.1:0. They take seconds
// of real time each and are skipped with -short.

// etcd's shortest lease with the test raft timings (1.5 election timeouts).
const realTTL = 3 * time.Second

func realRegion(t *testing.T, replicas int) []*localregion.Region {
	t.Helper()
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	rs := make([]*localregion.Region, replicas)
	for i := range rs {
		rs[i] = regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd, Store: store.Config{LeaseTTL: realTTL}})
	}
	return rs
}

func realClient(t *testing.T, edit func(*Config), targets ...string) *Engine {
	t.Helper()
	return startClient(t, Config{Targets: targets, Region: 1, Owner: t.Name(), SafetyMargin: time.Second}, 20*time.Second, edit)
}

// Two replicas of one region: the client keeps minting while either is
// down, reconnecting to the one that comes back.
func TestRealRegionFailover(t *testing.T) {
	rs := realRegion(t, 2)
	c := realClient(t, func(cfg *Config) { cfg.RefillInterval = 200 * time.Millisecond }, rs[0].Addr(), rs[1].Addr())
	var ids []snowflake.ID
	mintFor := func(d time.Duration) {
		t.Helper()
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			id, err := c.Next(ctx)
			cancel()
			if err != nil {
				t.Fatalf("Next with one replica up: %v (stats %+v)", err, c.Stats())
			}
			ids = append(ids, id)
		}
	}
	// keptGoing fails the test unless the client refilled and renewed
	// while one replica was down, and no lease expired. The client
	// refills about 1.5 times a second here (10-11 in the 7 s), so each
	// phase of 3-4 s must show at least two refills and a renewal.
	keptGoing := func(phase string, before, after Stats) {
		t.Helper()
		if after.Refills-before.Refills < 2 || after.Renewals-before.Renewals < 1 || after.Expiries != 0 {
			t.Fatalf("%s: refills and renewals stopped: before %+v after %+v", phase, before, after)
		}
	}
	mintFor(500 * time.Millisecond)
	s0 := c.Stats()
	rs[0].Kill()
	mintFor(3 * time.Second) // > a safe interval (2 s) and many 200 ms blocks
	s1 := c.Stats()
	keptGoing("replica 0 down", s0, s1)
	if err := rs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	rs[1].Kill()
	mintFor(4 * time.Second) // gRPC reconnects to the restarted replica
	keptGoing("replica 1 down", s1, c.Stats())
	checkUnique(t, ids)
}

// docs/design.md case 6 against a real region: the only replica goes away (etcd
// stays): the client mints from its buffers while the safety deadline
// holds, then fails closed with ErrLeaseLost; the replica restarts on the
// same address and the client recovers by itself, without duplicates.
func TestRealRegionCase6ServiceDown(t *testing.T) {
	rs := realRegion(t, 1)
	c := realClient(t, func(cfg *Config) { cfg.RefillInterval = 5 * time.Second }, rs[0].Addr())
	var ids []snowflake.ID
	for range 200 {
		ids = append(ids, mustNext(t, c))
	}
	old := c.Lease().Lease
	rs[0].Kill()
	// The client read its clock somewhere between t0 and t1, so its
	// deadline lies in [earliest, latest]: the checks below need no
	// slack for scheduling (a fixed slack flaked when the test was
	// descheduled between Lease and its own clock reading).
	t0 := time.Now()
	li := c.Lease()
	t1 := time.Now()
	if li.Err != nil {
		t.Fatalf("lease right after the kill: %v", li.Err)
	}
	earliest, latest := t0.Add(li.SafeFor), t1.Add(li.SafeFor)
	var failedClosed bool
	for time.Now().Before(latest.Add(time.Second)) {
		start := time.Now()
		id, err := c.Next(expiredCtx())
		end := time.Now()
		switch {
		case err == nil && start.After(latest):
			t.Fatalf("minted %v after the safety deadline", start.Sub(latest))
		case err == nil:
			ids = append(ids, id)
		case !errors.Is(err, ErrLeaseLost):
			t.Fatalf("Next with the service down: %v; want ErrLeaseLost", err)
		case end.Before(earliest):
			t.Fatalf("ErrLeaseLost %v before the deadline", earliest.Sub(end))
		default:
			failedClosed = true
			if d := end.Sub(start); d > 100*time.Millisecond {
				t.Logf("failing Next took %v (scheduling on a busy box?)", d)
			}
		}
		time.Sleep(2 * time.Millisecond)
	}
	if !failedClosed {
		t.Fatal("client never failed closed")
	}
	if err := rs[0].Restart(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	for {
		rctx, rcancel := context.WithTimeout(ctx, time.Second)
		id, err := c.Next(rctx)
		rcancel()
		if err == nil {
			ids = append(ids, id)
			break
		}
		if ctx.Err() != nil {
			t.Fatalf("client did not recover within 15 s: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	for range 200 {
		ids = append(ids, mustNext(t, c))
	}
	if nl := c.Lease().Lease; nl.Token == old.Token {
		t.Fatalf("recovered on the old lease %+v", nl)
	}
	checkUnique(t, ids)
}

// docs/design.md case 4 against a real region. The old owner A is "paused": its
// requests reach the service but the replies are held, and it mints
// nothing (its goroutines and timers frozen, its monotonic clock running,
// as under SIGSTOP). Its etcd lease expires, B takes the same code, then A
// resumes: it mints nothing under the old lease, and no ID overlaps.
func TestRealRegionCase4PausedOwner(t *testing.T) {
	rs := realRegion(t, 1)
	connA := rangeclienttest.Wrap(regiontest.Allocator(t, rs[0]))
	a, err := New(context.Background(), Config{Allocator: connA, Region: 1, Owner: "A", SafetyMargin: time.Second,
		RefillInterval: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { connA.SetFault(rangeclienttest.Healthy); a.Close() })
	leaseA := a.Lease().Lease

	// The store picks codes at random: hold every other code of the region
	// (on a replica with long leases), so the only code B can get is A's.
	filler := regiontest.Start(t, localregion.Config{Region: 1, Etcd: rs[0].Etcd(), Store: store.Config{LeaseTTL: time.Minute}})
	ctx := context.Background()
	var fillers []segment.Lease
	for {
		l, err := filler.Store().Acquire(ctx, 1, "filler")
		if errors.Is(err, segment.ErrNoFreeCode) {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		fillers = append(fillers, l)
	}
	if len(fillers) != snowflake.MaxWorker {
		t.Fatalf("held %d other codes, want %d", len(fillers), snowflake.MaxWorker)
	}

	var idsA, idsB []snowflake.ID
	for range 300 {
		idsA = append(idsA, mustNext(t, a))
	}
	keys, err := etcdstore.New(rs[0].Client(), etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	ownerKey := keys.LeaseKey(1, leaseA.Worker)
	owner, err := rs[0].Client().Get(ctx, ownerKey)
	if err != nil || len(owner.Kvs) != 1 {
		t.Fatalf("A's owner key %s: %v (%d keys)", ownerKey, err, len(owner.Kvs))
	}
	connA.SetFault(rangeclienttest.HoldReplies)
	pausedAt := time.Now()
	waitDeleted(t, rs[0].Client(), ownerKey, owner.Header.Revision, realTTL+10*time.Second)
	t.Logf("etcd expired A's lease %v after the pause (TTL %v)", time.Since(pausedAt).Round(time.Millisecond), realTTL)

	b := realClient(t, nil, rs[0].Addr())
	leaseB := b.Lease().Lease
	if leaseB.Worker != leaseA.Worker || leaseB.Token <= leaseA.Token {
		t.Fatalf("B leased %+v; want A's code %d with a token above %d", leaseB, leaseA.Worker, leaseA.Token)
	}
	for range 300 {
		idsB = append(idsB, mustNext(t, b))
	}
	// A resumes; its replies are still in flight.
	if id, err := a.Next(expiredCtx()); err == nil || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("A resumed %v after the pause: Next = %d, %v; want ErrLeaseLost", time.Since(pausedAt), id, err)
	}
	connA.SetFault(rangeclienttest.Healthy)
	check := func(d time.Duration) {
		for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			id, err := a.Next(expiredCtx())
			if err == nil {
				if id.Worker() == leaseA.Worker {
					t.Fatalf("A minted %d on its old code %d (now B's) after resuming", id, leaseA.Worker)
				}
				idsA = append(idsA, id)
			}
			idsB = append(idsB, mustNext(t, b))
		}
	}
	check(time.Second) // every code is taken: A cannot mint at all
	if st := a.Stats(); st.Minted != 300 {
		t.Fatalf("A minted %d IDs with no code to lease", st.Minted-300)
	}
	for _, l := range fillers {
		if err := filler.Store().Release(ctx, l); err != nil {
			t.Fatal(err)
		}
	}
	check(3 * time.Second) // codes are free again: A recovers on one
	if got := a.Lease(); got.Err != nil || got.Lease.Token == leaseA.Token || got.Lease.Worker == leaseA.Worker {
		t.Fatalf("A did not move to a fresh lease on another code: %+v", got)
	}
	checkUnique(t, append(idsA, idsB...))
}

// waitDeleted waits until key is deleted after revision rev (an etcd
// lease's expiry deletes the keys attached to it), failing t after timeout.
func waitDeleted(t *testing.T, cli *clientv3.Client, key string, rev int64, timeout time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	for resp := range cli.Watch(ctx, key, clientv3.WithRev(rev+1)) {
		if err := resp.Err(); err != nil {
			t.Fatalf("watching %s: %v", key, err)
		}
		for _, ev := range resp.Events {
			if ev.Type == clientv3.EventTypeDelete {
				return
			}
		}
	}
	t.Fatalf("%s was not deleted within %v: etcd did not expire its lease", key, timeout)
}

// docs/design.md case 5 over etcd: 4 regions x 200 workers, each region its own
// service over one shared embedded etcd. Every client mints 1,000 IDs, all
// at once: all decoded fields in range, region and worker as leased, the
// timestamp within the test's run (plus the service's lead: a prefetched
// block may start ahead of time), every ID unique. (The clients read Go's
// monotonic clock, which a test cannot freeze, so the "whole fleet in one
// millisecond" form of the case runs on fake time:
// TestDesignCase5FleetInOneMillisecond.)
func TestRealDesignCase5Fleet(t *testing.T) {
	if testing.Short() {
		t.Skip("800 clients over etcd: skipped with -short")
	}
	// The race detector instruments the in-process etcd too; 800 leases
	// on 2 cores then miss etcd's own deadlines. The client's concurrency
	// is covered under -race by the 64-goroutine test.
	testenv.SkipUnderRace(t, "800 clients over in-process etcd miss etcd's deadlines")
	const regions, perRegion, perClient = 4, 200, 1000
	etcd := embedetcdtest.Start(t)
	msBefore := snowflake.MsSince(time.Now())
	clients := make([][]*Engine, regions)
	var mu sync.Mutex
	var wg sync.WaitGroup
	errs := make(chan error, regions*perRegion)
	for r := range regions {
		rep := regiontest.Start(t, localregion.Config{Region: r, Etcd: etcd, SharedEtcd: true})
		alloc := regiontest.Allocator(t, rep) // one gRPC connection per region, shared by its 200 clients
		clients[r] = make([]*Engine, perRegion)
		for i := range perRegion {
			wg.Add(1)
			go func() {
				defer wg.Done()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				c, err := New(ctx, Config{Allocator: alloc, Region: r, Owner: "fleet"})
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				clients[r][i] = c
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("New: %v", err)
	}
	defer func() {
		for _, cs := range clients {
			for _, c := range cs {
				wg.Add(1)
				go func() { defer wg.Done(); c.Close() }()
			}
		}
		wg.Wait()
	}()

	// All 800 mint at once.
	out := mintAtOnce(t, clients, perClient)
	msAfter := snowflake.MsSince(time.Now())

	lead := segment.DefaultMaxLead.Milliseconds()
	checkFleet(t, clients, out, regions*perRegion*perClient,
		func(m int64) bool { return m >= msBefore && m <= msAfter+lead },
		fmt.Sprintf("%d..%d (the test's run + the service's lead %v)", msBefore, msAfter, segment.DefaultMaxLead))
}
