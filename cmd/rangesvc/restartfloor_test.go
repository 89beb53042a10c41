package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Acceptance (issue 35, "a floor that survives restarts"): two real
// replicas of region 1, B with the embedded etcd and A on it (--etcd,
// with the etcd certificate). A grants a lease three blocks that run 12 s
// ahead of the clock, as a client's reserve does, and is stopped; at once
// the operator, with the etcd certificate, lowers the code's mark to the
// start of the first block; A is restarted. Its next grant on the code
// starts above the end of every block it granted before (0 overlap),
// although the stored mark and the clock alone would have put it below
// (checked: the test proves nothing otherwise). B, which never granted on
// the code, reports the lowering (hwm_regressions_total, the series the
// IdrangeHighWaterMarkRegressed alert fires on) whatever the timing: also
// for a second code whose mark is raised and lowered again within a few
// milliseconds, which no 5 s scan would see.
func TestRestartedReplicaGrantsAboveItsPastSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	testenv.Binary(t)
	const region = 1
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := testenv.StartServe(t, testenv.ServeConfig{Region: region})
	etcd := b.EmbeddedEtcd(t)
	aCfg := testenv.ServeConfig{Region: region, Etcd: []string{etcd.Endpoint}, Args: etcd.Flags()}
	a := testenv.StartServe(t, aCfg)
	viaA := wire.NewAllocator(regiontest.Dial(t, a.GRPCAddr))
	viaB := wire.NewAllocator(regiontest.Dial(t, b.GRPCAddr))
	regressions := func() float64 {
		return metricValue(t, b.Scrape(t), fmt.Sprintf(`idrange_service_hwm_regressions_total{region="%d"}`, region))
	}
	waitRegressions := func(want float64, what string) time.Duration {
		t.Helper()
		start := time.Now()
		for got := regressions(); got < want; got = regressions() {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("B reports %v regressions 10 s after %s, want %v", got, what, want)
			}
			time.Sleep(20 * time.Millisecond)
		}
		return time.Since(start)
	}
	base := regressions()

	lease, err := viaA.Acquire(ctx, region, "restart floor test")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []segment.Block
	for i := range 3 {
		blocks = append(blocks, allocateWaiting(ctx, t, viaA, lease, 4000*segment.PerMs, fmt.Sprintf("A's block %d", i)))
	}
	end := blocks[len(blocks)-1].Hi
	if err := a.Stop(30 * time.Second); err != nil {
		t.Fatalf("stopping A: %v\n%s", err, a.Stderr())
	}

	// The operator lowers the mark behind the stopped replica.
	op := etcd.Client(t)
	keys, err := etcdstore.New(op, etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := op.Put(ctx, keys.HighWaterKey(region, lease.Worker), store.EncodeHighWater(blocks[0].Lo)); err != nil {
		t.Fatal(err)
	}
	t.Logf("code %d: blocks up to %d (%v ahead of the clock), mark lowered to %d", lease.Worker, end,
		time.Until(segment.ValidUntil(end)).Round(time.Millisecond), blocks[0].Lo)
	took := waitRegressions(base+1, "the lowering")
	t.Logf("B reported the lowering after %v", took.Round(time.Millisecond))

	// A mark raised (as another replica's grant would) and lowered 5 ms
	// later, on a code B never read since: only a watch sees both.
	other := (lease.Worker + 1) % 256
	hk := keys.HighWaterKey(region, other)
	risen := snowflake.MsSince(time.Now().Add(5*time.Second)) << snowflake.SequenceBits
	if _, err := op.Put(ctx, hk, store.EncodeHighWater(risen)); err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	if _, err := op.Put(ctx, hk, store.EncodeHighWater(risen-1<<20)); err != nil {
		t.Fatal(err)
	}
	took = waitRegressions(base+2, "a rise and a lowering 5 ms apart")
	t.Logf("B reported the rise-and-lowering of code %d after %v", other, took.Round(time.Millisecond))

	// A restarts; the test's lease lives on (renewed through B meanwhile).
	if _, err := viaB.Renew(ctx, lease); err != nil {
		t.Fatalf("renewing the lease through B: %v", err)
	}
	a2 := testenv.StartServe(t, aCfg)
	viaA2 := wire.NewAllocator(regiontest.Dial(t, a2.GRPCAddr))
	if _, err := viaA2.Renew(ctx, lease); err != nil {
		t.Fatalf("renewing the lease through the restarted A: %v", err)
	}
	nb := allocateWaiting(ctx, t, viaA2, lease, 4096, "the restarted A's grant")
	for _, old := range blocks {
		if nb.Lo < old.Hi && old.Lo < nb.Hi {
			t.Fatalf("the restarted A granted [%d,%d), overlapping its earlier block [%d,%d)", nb.Lo, nb.Hi, old.Lo, old.Hi)
		}
	}
	if nb.Lo < end {
		t.Fatalf("the restarted A granted from %d, below the end %d of its earlier blocks", nb.Lo, end)
	}
	// The control: the stored mark and the grant's own clock would have
	// started it below the earlier blocks' end.
	if clockL := snowflake.MsSince(nb.ServiceTime) << snowflake.SequenceBits; max(blocks[0].Lo, clockL) >= end {
		t.Fatalf("without the floor the grant would have started at %d, not below %d: the test proves nothing", max(blocks[0].Lo, clockL), end)
	}
	t.Logf("the restarted A granted [%d,%d): %d positions above the earlier blocks' end", nb.Lo, nb.Hi, nb.Lo-end)
	if err := a2.Stop(30 * time.Second); err != nil {
		t.Fatalf("stopping A: %v", err)
	}
	if err := b.Stop(30 * time.Second); err != nil {
		t.Fatalf("stopping B: %v", err)
	}
}
