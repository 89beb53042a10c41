package localregion

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Shared runs carved concurrently by two replicas of one region, over
// gRPC, while MintBatch mints from the same minters: every run starts
// after the caller's last ID, lies within its validity rule, and no
// position is handed out twice (runs and minted IDs together).
func TestAllocateSharedOverGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r0, err := Start(ctx, Config{Region: 1, NextMinter: rangeclientMinter})
	if err != nil {
		t.Fatal(err)
	}
	defer r0.Close()
	r1, err := Start(ctx, Config{Region: 1, Etcd: r0.Etcd(), NextMinter: rangeclientMinter})
	if err != nil {
		t.Fatal(err)
	}
	defer r1.Close()

	var clients []segment.SharedAllocator
	var rpcs []idrangev1.RangeServiceClient
	for _, r := range []*Region{r0, r1} {
		cc := dialTest(t, r.Addr())
		a := wire.NewAllocator(cc).(segment.SharedAllocator)
		// Before EnableNext the replica has no minter: Unimplemented,
		// which tells a client to take a code of its own.
		if _, err := a.AllocateShared(ctx, 1, 10, 0, "early"); status.Code(err) != codes.Unimplemented {
			t.Fatalf("AllocateShared without a minter: %v, want Unimplemented", err)
		}
		stop, err := r.EnableNext(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer stop()
		clients = append(clients, a)
		rpcs = append(rpcs, idrangev1.NewRangeServiceClient(cc))
	}

	const workers, calls, count = 6, 150, 97
	var mu sync.Mutex
	var ids []snowflake.ID
	var wg sync.WaitGroup
	errc := make(chan error, workers+2)
	for w := range workers {
		wg.Go(func() {
			var after snowflake.ID
			var mine []snowflake.ID
			for i := range calls {
				a := clients[(w+i)%2] // alternate replicas: order must hold across them
				b, err := a.AllocateShared(ctx, 1, count, after, "client-"+string(rune('a'+w)))
				if err != nil {
					errc <- err
					return
				}
				first, last := b.ID(b.Lo), b.ID(b.Hi-1)
				firstMs := snowflake.Epoch.Add(time.Duration(b.Lo>>snowflake.SequenceBits) * time.Millisecond)
				switch {
				case first <= after:
					t.Errorf("run [%d,%d) starts at ID %d, not after %d", b.Lo, b.Hi, first, after)
				case b.Len() < 1 || b.Len() > count:
					t.Errorf("run of %d positions, asked %d", b.Len(), count)
				case b.ValidUntil.After(firstMs.Add(service.SharedValidity - service.SharedMargin)):
					t.Errorf("run valid until %v, more than %v after its first ms %v", b.ValidUntil, service.SharedValidity-service.SharedMargin, firstMs)
				case !b.ValidUntil.After(b.ServiceTime) || firstMs.Before(b.ServiceTime.Truncate(time.Millisecond)):
					t.Errorf("run at %v (first ms %v) valid until %v", b.ServiceTime, firstMs, b.ValidUntil)
				}
				for l := b.Lo; l < b.Hi; l++ {
					mine = append(mine, b.ID(l))
				}
				after = last
			}
			mu.Lock()
			ids = append(ids, mine...)
			mu.Unlock()
		})
	}
	for _, rpc := range rpcs {
		wg.Go(func() {
			var mine []snowflake.ID
			for range 100 {
				resp, err := rpc.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: 50})
				if err != nil {
					errc <- err
					return
				}
				for _, id := range resp.GetIds() {
					mine = append(mine, snowflake.ID(id))
				}
			}
			mu.Lock()
			ids = append(ids, mine...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if len(ids) < workers*calls+2*100*50 {
		t.Fatalf("only %d IDs", len(ids))
	}
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			t.Fatalf("ID %d handed out twice (%+v)", ids[i], ids[i].Parts())
		}
	}

	for i, r := range []*Region{r0, r1} {
		info, err := rpcs[i].GetReplicaInfo(ctx, &idrangev1.GetReplicaInfoRequest{})
		if err != nil {
			t.Fatal(err)
		}
		// Each replica served every worker (they alternate).
		if info.GetSharedClients() != workers || info.GetCodesHeld() != 1 {
			t.Fatalf("replica %d info %v, want %d shared clients and 1 code", i, info, workers)
		}
		m := r.rep.Service().Metrics()
		if got := counterValue(t, m.SharedIDs); got < workers*calls/2 {
			t.Fatalf("replica %d shared_ids_total %v", i, got)
		}
	}
	// Bad requests: one-line InvalidArgument, nothing carved.
	for _, req := range []*idrangev1.AllocateSharedRequest{{Count: 0}, {Count: segment.MaxShared + 1},
		{Count: 1, AfterId: -1}, {Count: 1, ClientId: string(make([]byte, segment.MaxClientID+1))}} {
		if _, err := rpcs[0].AllocateShared(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("AllocateShared(%v): %v, want InvalidArgument", req, err)
		}
	}
}

// startShared starts a region of cfg with its Next minter on (the shared
// path carves from it), both stopped when the test ends.
func startShared(tb testing.TB, ctx context.Context, cfg Config) *Region {
	tb.Helper()
	cfg.NextMinter = rangeclientMinter
	r, err := Start(ctx, cfg)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { r.Close() })
	stop, err := r.EnableNext(ctx)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { stop() })
	return r
}

// dialTest connects to addr (insecure, loopback) until the test ends.
func dialTest(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

func counterValue(t testing.TB, c prometheus.Collector) float64 {
	t.Helper()
	return testutil.ToFloat64(c)
}

// An identity over --shared-rate is refused with backpressure: a
// ResourceExhausted whose RetryAfter the client reads (errors.As through
// the wire), counted as refused{rate_limited}; the shared path off
// (negative rate) answers Unimplemented.
func TestAllocateSharedRateLimit(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startShared(t, ctx, Config{Region: 1, SharedRate: 1000})
	a := wire.NewAllocator(dialTest(t, r.Addr())).(segment.SharedAllocator)
	if _, err := a.AllocateShared(ctx, 1, 800, 0, "c"); err != nil {
		t.Fatal(err)
	}
	_, err := a.AllocateShared(ctx, 1, 800, 0, "c")
	var bp *segment.Backpressure
	if !errors.As(err, &bp) || bp.RetryAfter <= 0 || bp.RetryAfter > time.Second || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("800 more of a 1,000 IDs/s bound at once: %v, want backpressure with a retry delay", err)
	}
	m := r.rep.Service().Metrics()
	if got := counterValue(t, m.SharedRefused.WithLabelValues("rate_limited")); got != 1 {
		t.Fatalf("shared_refused_total{rate_limited} = %v, want 1", got)
	}
	if got := counterValue(t, m.SharedRateLimit); got != 1000 {
		t.Fatalf("shared_rate_limit = %v, want 1000", got)
	}

	off := startShared(t, ctx, Config{Region: 1, Etcd: r.Etcd(), SharedRate: -1})
	b := wire.NewAllocator(dialTest(t, off.Addr())).(segment.SharedAllocator)
	if _, err := b.AllocateShared(ctx, 1, 10, 0, "c"); status.Code(err) != codes.Unimplemented {
		t.Fatalf("AllocateShared with the shared path off: %v, want Unimplemented", err)
	}
	if got := counterValue(t, off.rep.Service().Metrics().SharedRefused.WithLabelValues("off")); got != 1 {
		t.Fatalf("shared_refused_total{off} = %v, want 1", got)
	}
}

// AllocateSharedBatch over gRPC: each request is answered in its place as
// AllocateShared would answer it (runs of their own, a bad count refused
// as InvalidArgument, an identity over its bound refused with a retry
// delay), counted per request; a call of no requests or more than
// wire.MaxSharedBatch is refused whole.
func TestAllocateSharedBatchOverGRPC(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r := startShared(t, ctx, Config{Region: 1, SharedRate: 1000})
	rpc := idrangev1.NewRangeServiceClient(dialTest(t, r.Addr()))
	reqs := []*idrangev1.AllocateSharedRequest{
		{Count: 300, ClientId: "a"},
		{Count: 0, ClientId: "bad"},
		{Count: 300, ClientId: "b"},
		{Count: 800, ClientId: "over"}, // 600 of the 1,000-ID bucket are gone
	}
	resp, err := rpc.AllocateSharedBatch(ctx, &idrangev1.AllocateSharedBatchRequest{Requests: reqs})
	if err != nil {
		t.Fatal(err)
	}
	res := resp.GetResults()
	if len(res) != len(reqs) {
		t.Fatalf("%d results for %d requests", len(res), len(reqs))
	}
	var runs []segment.Block
	for _, i := range []int{0, 2} {
		b := wire.SharedFromProto(res[i].GetRun())
		if res[i].GetStatus() != nil || b.CheckShared(1, 300, 0) != nil {
			t.Fatalf("request %d: %v, want a run of up to 300", i, res[i])
		}
		runs = append(runs, b)
	}
	if runs[0].Worker == runs[1].Worker && runs[0].Lo < runs[1].Hi && runs[1].Lo < runs[0].Hi {
		t.Fatalf("runs [%d,%d) and [%d,%d) of one code overlap", runs[0].Lo, runs[0].Hi, runs[1].Lo, runs[1].Hi)
	}
	if c := codes.Code(res[1].GetStatus().GetCode()); c != codes.InvalidArgument || res[1].GetRun() != nil {
		t.Fatalf("request with count 0: %v, want InvalidArgument", res[1])
	}
	var bp *segment.Backpressure
	if err := wire.FromStatus(status.ErrorProto(res[3].GetStatus())); !errors.As(err, &bp) || bp.RetryAfter <= 0 {
		t.Fatalf("request over the bound: %v, want backpressure with a retry delay", err)
	}
	m := r.rep.Service().Metrics()
	if g, rl := counterValue(t, m.SharedGrants.WithLabelValues("granted")), counterValue(t, m.SharedRefused.WithLabelValues("rate_limited")); g != 2 || rl != 1 {
		t.Fatalf("shared_grants_total{granted} = %v, shared_refused_total{rate_limited} = %v; want 2 and 1", g, rl)
	}
	for _, n := range []int{0, wire.MaxSharedBatch + 1} {
		req := &idrangev1.AllocateSharedBatchRequest{}
		for range n {
			req.Requests = append(req.Requests, &idrangev1.AllocateSharedRequest{Count: 1})
		}
		if _, err := rpc.AllocateSharedBatch(ctx, req); status.Code(err) != codes.InvalidArgument {
			t.Fatalf("a batch of %d requests: %v, want InvalidArgument", n, err)
		}
	}
}
