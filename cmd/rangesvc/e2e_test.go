package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// waitHealth watches the replica's health until it reports want.
func waitHealth(t *testing.T, ctx context.Context, hc healthpb.HealthClient, want healthpb.HealthCheckResponse_ServingStatus) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	stream, err := hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: service.HealthService})
	if err != nil {
		t.Fatal(err)
	}
	for {
		r, err := stream.Recv()
		if err != nil {
			t.Fatalf("health never became %v: %v", want, err)
		}
		if r.GetStatus() == want {
			return
		}
	}
}

func checkIDs(t *testing.T, region int, seen map[snowflake.ID]bool, ids []snowflake.ID) {
	t.Helper()
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("duplicate ID %d", id)
		}
		seen[id] = true
		if _, err := snowflake.Decode(id); err != nil || id.Region() != region {
			t.Fatalf("ID %d: region %d (want %d), %v", id, id.Region(), region, err)
		}
	}
}

// The real binary (its fault build): serve on loopback random ports with an
// embedded etcd in a temp dir; mint through `rangesvc mint` and the wire
// adapter; scrape /metrics; jump the service clock back 2 s through the
// test-only hook (NOT_SERVING, grants still above the HWM); kill -9; restart
// on the same data dir: new blocks start above every earlier one; SIGTERM
// exits 0.
func TestServeEndToEnd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	testenv.FaultBinary(t) // build first: a cold build must not eat the test's deadline
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	const region = 1
	dataDir := t.TempDir()
	faultFile := filepath.Join(t.TempDir(), "clock-offset")
	cfg := testenv.ServeConfig{
		Region: region, DataDir: dataDir, Faults: true,
		Args: []string{"--fault-clock-file", faultFile, "--log-level", "debug"},
	}
	start := time.Now()
	p := testenv.StartServe(t, cfg)
	t.Logf("serve listening after %v", time.Since(start))

	seen := map[snowflake.ID]bool{}
	checkIDs(t, region, seen, p.Mint(t, region, 1000))
	checkMintRegion(t, p.GRPCAddr, region, seen) // mint learns the region; a wrong --region fails

	t.Logf("first mint done after %v", time.Since(start))
	cc := regiontest.Dial(t, p.GRPCAddr)
	a := wire.NewAllocator(cc)
	hc := healthpb.NewHealthClient(cc)
	lease, err := a.Acquire(ctx, region, "e2e")
	if err != nil {
		t.Fatal(err)
	}
	// A 10 s block: its Hi runs ~10 s ahead of every clock, so only a
	// persisted HWM can keep a later block above it.
	b1 := allocateWaiting(ctx, t, a, lease, service.DefaultMaxBlock, "first 10 s block")
	if b1.Worker != lease.Worker || b1.Len() < 1 {
		t.Fatalf("block %+v for lease %+v", b1, lease)
	}

	// The per-ID baseline RPC mints on the replica's own lease.
	rsc := idrangev1.NewRangeServiceClient(cc)
	var nextIDs []snowflake.ID
	for range 50 {
		r, err := rsc.Next(ctx, &idrangev1.NextRequest{})
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		nextIDs = append(nextIDs, snowflake.ID(r.GetId()))
	}
	checkIDs(t, region, seen, nextIDs)

	metrics := p.Scrape(t)
	for _, name := range service.MetricNames {
		if !strings.Contains(metrics, "# TYPE "+name+" ") {
			t.Errorf("/metrics lacks %s", name)
		}
	}
	if !strings.Contains(metrics, `idrange_service_free_worker_codes{region="1"}`) {
		t.Errorf("/metrics lacks free_worker_codes for region 1")
	}
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_SERVING)

	// Test-only fault: the service clock jumps back 2 s.
	if err := os.WriteFile(faultFile, []byte("-2s\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	if !p.WaitStderr("TEST-ONLY fault: service clock offset set", 20*time.Second) {
		t.Fatalf("fault hook did not fire; stderr:\n%s", p.Stderr())
	}
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_NOT_SERVING)
	// The rollback heals as the clock runs (2 s after the jump it is 0),
	// so the gauge is read while the health still says NOT_SERVING: the
	// service sets both from one clock reading, so NOT_SERVING after the
	// scrape means the scraped rollback was above the bound. It used to be
	// read after the grant below, which can wait ~2 s for backpressure
	// first (the code may be ahead of the clock), and then read 0.
	m := p.Scrape(t)
	if h, err := hc.Check(ctx, &healthpb.HealthCheckRequest{Service: service.HealthService}); err != nil {
		t.Fatal(err)
	} else if h.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Logf("the clock caught up before the health check (a stall of ~2 s): clock_rollback_ms not checked")
	} else if strings.Contains(m, "\nidrange_service_clock_rollback_ms 0\n") || !strings.Contains(m, "\nidrange_service_clock_rollback_ms ") {
		t.Errorf("clock_rollback_ms is 0 or missing while the clock is 2 s back (NOT_SERVING)")
	}
	b2 := allocateWaiting(ctx, t, a, lease, 4096, "grant with the service clock 2 s back")
	if b2.Lo < b1.Hi {
		t.Fatalf("grant with the clock 2 s back starts at %d, below the HWM %d", b2.Lo, b1.Hi)
	}
	if err := os.WriteFile(faultFile, []byte("0s"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := p.Signal(syscall.SIGUSR1); err != nil {
		t.Fatal(err)
	}
	waitHealth(t, ctx, hc, healthpb.HealthCheckResponse_SERVING)

	// kill -9, restart on the same data dir (new ports).
	p.Kill()
	var ws syscall.WaitStatus
	if st, ok := p.Cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
		ws = st
	}
	if !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("process was not killed by SIGKILL: %v", p.ExitErr())
	}
	p2 := testenv.StartServe(t, cfg)
	cc2 := regiontest.Dial(t, p2.GRPCAddr)
	a2 := wire.NewAllocator(cc2)
	// The etcd lease survived the restart (etcd extends leases on start), so
	// the same owner continues on the same code: its next block must start
	// above everything granted before the crash.
	if _, err := a2.Renew(ctx, lease); err != nil {
		t.Fatalf("renew after restart: %v", err)
	}
	b3 := allocateWaiting(ctx, t, a2, lease, 4096, "grant after the restart")
	if b3.Lo < b1.Hi || b3.Lo < b2.Hi {
		t.Fatalf("block after kill -9 and restart starts at %d, below earlier blocks' end %d / %d", b3.Lo, b1.Hi, b2.Hi)
	}
	checkIDs(t, region, seen, p2.Mint(t, region, 1000))
	if err := a2.Release(ctx, lease); err != nil {
		t.Fatal(err)
	}
	if _, err := a2.Allocate(ctx, lease, 1); !errors.Is(err, segment.ErrFenced) && !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("grant after release: %v, want fenced", err)
	}

	// Graceful stop: exit status 0.
	if err := p2.Stop(20 * time.Second); err != nil {
		t.Fatalf("SIGTERM: %v\nstderr:\n%s", err, p2.Stderr())
	}
	if !strings.Contains(p2.Stderr(), "shutting down") {
		t.Errorf("no shutdown log; stderr:\n%s", p2.Stderr())
	}
}

// Bad flags through the real binary: exit status 2 and a message.
func TestServeBadFlagsSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the rangesvc binary")
	}
	cmd := exec.Command(testenv.Binary(t), "serve", "--region", "9", "--listen", "127.0.0.1:0")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != cli.ExitUsage {
		t.Fatalf("exit: %v, want status %d", err, cli.ExitUsage)
	}
	if !strings.Contains(stderr.String(), "--region 9 not in 0..3") || stdout.Len() != 0 {
		t.Fatalf("stdout %q stderr %q", stdout.String(), stderr.String())
	}
}

// Two real replicas on one external etcd (--etcd), the second with its
// service clock 2 s behind (--fault-clock-offset): one lease used through
// both gets blocks that never overlap, and `rangesvc mint` through both
// targets prints unique IDs.
func TestServeTwoReplicasExternalEtcd(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	testenv.Binary(t) // build both first: a cold build must not eat the test's deadline
	testenv.FaultBinary(t)
	etcd := embedetcdtest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	const region = 3
	pa := testenv.StartServe(t, testenv.ServeConfig{Region: region, Etcd: etcd.Endpoints()})
	pb := testenv.StartServe(t, testenv.ServeConfig{Region: region, Etcd: etcd.Endpoints(), Faults: true,
		Args: []string{"--fault-clock-offset", "-2s"}})
	aa := wire.NewAllocator(regiontest.Dial(t, pa.GRPCAddr))
	ab := wire.NewAllocator(regiontest.Dial(t, pb.GRPCAddr))
	lease, err := aa.Acquire(ctx, region, "two replicas")
	if err != nil {
		t.Fatal(err)
	}
	var blocks []segment.Block
	var behind time.Duration // how far B's service time was behind this process's clock
	for i := range 10 {
		a := aa
		if i%2 == 1 {
			a = ab
		}
		t0 := time.Now()
		// The first grants wait out each replica's restart floor
		// (--max-clock-skew): backpressure, as a client waits it out.
		b := allocateWaiting(ctx, t, a, lease, 50_000, fmt.Sprintf("grant %d", i))
		t.Logf("grant %d via %d: [%d,%d) st=%v took %v", i, i%2, b.Lo, b.Hi, b.ServiceTime, time.Since(t0))
		if i%2 == 1 {
			behind = max(behind, time.Since(b.ServiceTime))
		}
		if len(blocks) > 0 && b.Lo < blocks[len(blocks)-1].Hi {
			t.Fatalf("grant %d [%d,%d) starts below the previous block's end %d", i, b.Lo, b.Hi, blocks[len(blocks)-1].Hi)
		}
		blocks = append(blocks, b)
	}
	sorted := slices.Clone(blocks)
	slices.SortFunc(sorted, func(x, y segment.Block) int { return cmp.Compare(x.Lo, y.Lo) })
	for i := 1; i < len(sorted); i++ {
		if sorted[i].Lo < sorted[i-1].Hi {
			t.Fatalf("blocks overlap: [%d,%d) and [%d,%d)", sorted[i-1].Lo, sorted[i-1].Hi, sorted[i].Lo, sorted[i].Hi)
		}
	}
	// The replica 2 s behind really is behind: its grant times say so.
	if behind < time.Second {
		t.Fatalf("replica B's service time is only %v behind the clock; the fault flag did not apply", behind)
	}
	seen := map[snowflake.ID]bool{}
	checkIDs(t, region, seen, testenv.MintSkewed(t, []string{pa.GRPCAddr, pb.GRPCAddr}, region, 500, 2*time.Second))
	checkIDs(t, region, seen, testenv.MintSkewed(t, []string{pb.GRPCAddr}, region, 500, 2*time.Second))
}

// allocateWaiting grants about n IDs on lease, waiting out backpressure as a
// client does: the test's code may be one an earlier mint left ahead of the
// clock, and then b1's 10 s block takes its HWM near the bounded lead, where
// the next grant (more so with the service clock set back) must wait for
// the clock to catch up. Any other error fails the test.
func allocateWaiting(ctx context.Context, t *testing.T, a segment.Allocator, lease segment.Lease, n int, what string) segment.Block {
	t.Helper()
	for {
		b, err := a.Allocate(ctx, lease, n)
		var bp *segment.Backpressure
		if !errors.As(err, &bp) {
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			return b
		}
		t.Logf("%s: %v", what, err)
		select {
		case <-time.After(bp.RetryAfter):
		case <-ctx.Done():
			t.Fatalf("%s: %v", what, context.Cause(ctx))
		}
	}
}
