package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
	"github.com/idrange/idrange/tlsfiles"
)

// sharedLoadFor is how long TestSharedTenantsAtTheirCaps runs.
const sharedLoadFor = 30 * time.Second

// Four identities take shared runs at their --shared-rate caps (2M IDs/s
// each, 8M together: twice what one code mints) from one replica while a
// fifth mints with MintBatch, for 30 s, over mutual TLS (docs/design.md,
// "The shared path": the capacity and fairness rules). The replica's
// minter takes the codes the demand needs, so: the fifth's MintBatch p99 is
// under 50 ms, no run or ID is dated 1 s or more ahead of the moment it
// was returned, no shared run fails (a refusal with a retry delay at the
// cap is the rate limit working, counted apart), and no position is handed
// out twice (runs disjoint per code, MintBatch IDs in no run and unique).
func TestSharedTenantsAtTheirCaps(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	t.Parallel()
	tenants := []string{"minter-t1", "minter-t2", "minter-t3", "minter-t4"}
	p := newTestPKI(t, append(slices.Clone(tenants), "minter-batch")...)
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 2, Args: p.serverFlags("--tls-allowed-identities", "cn:minter-*")})
	conn := func(cn string) idrangev1.RangeServiceClient {
		tc, err := tlsfiles.Files{Cert: p.clients[cn].Cert, Key: p.clients[cn].Key, CA: p.ca}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		cc, err := grpc.NewClient(srv.GRPCAddr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		return idrangev1.NewRangeServiceClient(cc)
	}

	ctx, cancel := context.WithTimeout(context.Background(), sharedLoadFor)
	defer cancel()
	var (
		mu               sync.Mutex
		runs             []segment.Block
		failed           []error
		limited, granted int
		maxLead          time.Duration
	)
	lead := func(ms int64, at time.Time) {
		d := time.Duration(ms-snowflake.MsSince(at)) * time.Millisecond
		mu.Lock()
		maxLead = max(maxLead, d)
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for _, cn := range tenants {
		cli := conn(cn)
		for w := range 2 { // two callers per identity keep it at its cap
			wg.Go(func() {
				var after int64
				for ctx.Err() == nil {
					cctx, ccancel := context.WithTimeout(ctx, 2*time.Second)
					resp, err := cli.AllocateShared(cctx, &idrangev1.AllocateSharedRequest{
						Count: segment.MaxShared, AfterId: after, ClientId: fmt.Sprintf("%s#%d", cn, w)})
					ccancel()
					at := time.Now()
					var bp *segment.Backpressure
					switch {
					case ctx.Err() != nil:
						return
					case errors.As(wire.FromStatus(err), &bp):
						mu.Lock()
						limited++
						mu.Unlock()
						select {
						case <-time.After(bp.RetryAfter):
						case <-ctx.Done():
						}
						continue
					case err != nil:
						mu.Lock()
						failed = append(failed, fmt.Errorf("%s: %w", cn, err))
						mu.Unlock()
						continue
					}
					b := wire.SharedFromProto(resp)
					lead(b.Lo>>snowflake.SequenceBits, at)
					after = int64(b.ID(b.Hi - 1))
					mu.Lock()
					runs, granted = append(runs, b), granted+int(b.Len())
					mu.Unlock()
				}
			})
		}
	}
	// The fifth identity: a MintBatch of 100 every 10 ms, timed from its
	// first try to its IDs: a well-behaved caller honours a retry delay
	// (backpressure) and tries again.
	batch, lat := conn("minter-batch"), measure.NewHistogram()
	var ids []snowflake.ID
	var batchRetries int
	wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for ctx.Err() == nil {
			start := time.Now()
			resp, err := batch.MintBatch(context.Background(), &idrangev1.MintBatchRequest{Count: 100})
			var bp *segment.Backpressure
			for errors.As(wire.FromStatus(err), &bp) && time.Since(start) < time.Second {
				batchRetries++
				time.Sleep(bp.RetryAfter)
				resp, err = batch.MintBatch(context.Background(), &idrangev1.MintBatchRequest{Count: 100})
			}
			at := time.Now()
			if err != nil {
				mu.Lock()
				failed = append(failed, fmt.Errorf("MintBatch: %w", err))
				mu.Unlock()
			} else {
				lat.Record(at.Sub(start))
				for _, id := range resp.GetIds() {
					ids = append(ids, snowflake.ID(id))
				}
				lead(snowflake.ID(resp.GetIds()[len(resp.GetIds())-1]).Ms(), at)
			}
			select {
			case <-tick.C:
			case <-ctx.Done():
			}
		}
	})
	wg.Wait()

	p50, p99, mx := lat.Quantile(0.5), lat.Quantile(0.99), lat.Max()
	t.Logf("%d shared runs (%.1fM IDs, %.2fM IDs/s), %d answered with a retry delay; MintBatch: %d calls (%d retried after a delay), p50 %v, p99 %v, max %v; the most any run or ID led the clock: %v",
		len(runs), float64(granted)/1e6, float64(granted)/1e6/sharedLoadFor.Seconds(), limited, lat.Count(), batchRetries, p50, p99, mx, maxLead)
	if len(failed) > 0 {
		t.Fatalf("%d calls failed, the first: %v", len(failed), failed[0])
	}
	if want := 0.9 * 4 * 2e6 * sharedLoadFor.Seconds(); float64(granted) < want {
		t.Errorf("the four identities got %.1fM IDs in %v, want at least %.1fM (90%% of their caps)", float64(granted)/1e6, sharedLoadFor, want/1e6)
	}
	if p99 >= 50*time.Millisecond {
		t.Errorf("the fifth identity's MintBatch p99 is %v, want under 50 ms", p99)
	}
	// A run may start up to the runs carved at once beyond the bound (the
	// cursor moves between the check and the take): 8 callers here.
	if maxLead >= time.Second+8*segment.MaxShared/4096*time.Millisecond {
		t.Errorf("a run or ID was dated %v ahead of the moment it was returned, want under 1 s", maxLead)
	}
	checkNoOverlap(t, runs, ids)
}

// checkNoOverlap fails if two runs share a position of one code, or an ID
// of ids lies in a run or repeats.
func checkNoOverlap(t *testing.T, runs []segment.Block, ids []snowflake.ID) {
	t.Helper()
	byCode := map[int][]segment.Block{}
	for _, b := range runs {
		byCode[b.Worker] = append(byCode[b.Worker], b)
	}
	for w, rs := range byCode {
		slices.SortFunc(rs, func(a, b segment.Block) int { return int(a.Lo - b.Lo) })
		for i := 1; i < len(rs); i++ {
			if rs[i].Lo < rs[i-1].Hi {
				t.Fatalf("runs [%d,%d) and [%d,%d) of code %d overlap", rs[i-1].Lo, rs[i-1].Hi, rs[i].Lo, rs[i].Hi, w)
			}
		}
	}
	slices.Sort(ids)
	for i, id := range ids {
		if i > 0 && ids[i-1] == id {
			t.Fatalf("MintBatch handed out ID %d twice", id)
		}
		p := id.Parts()
		l := p.Ms<<snowflake.SequenceBits | int64(p.Sequence)
		rs := byCode[p.Worker]
		// The last run starting at or below l is the only one that can hold it.
		j, _ := slices.BinarySearchFunc(rs, l+1, func(b segment.Block, l int64) int { return int(b.Lo - l) })
		if j > 0 && l < rs[j-1].Hi {
			t.Fatalf("MintBatch ID %d lies in the shared run [%d,%d) of code %d", id, rs[j-1].Lo, rs[j-1].Hi, p.Worker)
		}
	}
}
