package engine

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// A client with Config.Codes = 3 leases three distinct codes, spreads its
// calls over all of them, mints unique IDs inside granted blocks from
// concurrent callers, sums its Stats over the codes, and gives every lease
// back on Close.
func TestSeveralCodes(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Codes = 3 })
		leases := c.Leases()
		if len(leases) != 3 {
			t.Fatalf("%d leases, want 3", len(leases))
		}
		workers := map[int]bool{}
		for _, li := range leases {
			if li.Err != nil || li.Lease.Region != 1 {
				t.Fatalf("lease %+v", li)
			}
			workers[li.Lease.Worker] = true
		}
		if len(workers) != 3 {
			t.Fatalf("codes %v, want 3 distinct", workers)
		}

		var mu sync.Mutex
		var all []snowflake.ID
		var wg sync.WaitGroup
		for range 4 {
			wg.Go(func() {
				var mine []snowflake.ID
				for range 200 {
					ids, err := c.NextN(context.Background(), 50)
					if err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, ids...)
					id, err := c.Next(context.Background())
					if err != nil {
						t.Error(err)
						return
					}
					mine = append(mine, id)
					time.Sleep(time.Millisecond)
				}
				mu.Lock()
				all = append(all, mine...)
				mu.Unlock()
			})
		}
		wg.Wait()
		checkUnique(t, all)
		checkInGrants(t, svc, all)
		used := map[int]int{}
		for _, id := range all {
			used[id.Worker()]++
		}
		for w := range workers {
			if used[w] < len(all)/10 {
				t.Fatalf("code %d minted %d of %d IDs; calls are not spread (%v)", w, used[w], len(all), used)
			}
		}
		if s := c.Stats(); s.Minted != int64(len(all)) || s.Acquisitions != 3 {
			t.Fatalf("Stats: minted %d (want %d), %d acquisitions (want 3)", s.Minted, len(all), s.Acquisitions)
		}
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
		for w := range workers {
			if _, held := svc.Owner(w); held {
				t.Fatalf("code %d still held after Close", w)
			}
		}
		if _, err := c.Next(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("Next after Close: %v", err)
		}
	})
}

// BenchmarkAppendNCodes: one Client with 1 and 4 codes, offered 12M IDs/s
// in AppendN calls of 1,000 IDs from every P (paced: call k starts at
// k*1,000/rate), against the in-memory service in real time. It reports
// the achieved IDs/s and how far the newest ID's timestamp ran ahead of
// the clock (lead-ms): one code caps at 4.096M IDs/s, falls behind the
// schedule and runs ahead to the service's lead limit; four keep up and
// stay at the clock. The offer is above the 10M IDs/s the figure is
// checked against, so that the pacing does not cap what is achieved. For
// the 20 s figure:
//
//	go test -run '^$' -bench AppendNCodes -benchtime 20s ./internal/client/engine
func BenchmarkAppendNCodes(b *testing.B) {
	const rate, batch = 12_000_000, 1000
	for _, codes := range []int{1, 4} {
		b.Run(fmt.Sprintf("codes=%d", codes), func(b *testing.B) {
			svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
			c := startClient(b, Config{Allocator: svc.Conn(), Region: 1, Owner: b.Name()}, 30*time.Second,
				func(cfg *Config) { cfg.Codes = codes })
			var (
				calls   atomic.Int64
				mu      sync.Mutex
				maxLead int64
			)
			b.ResetTimer()
			start := time.Now()
			b.RunParallel(func(pb *testing.PB) {
				buf := make([]snowflake.ID, 0, batch)
				var mine int64
				for pb.Next() {
					k := calls.Add(1) - 1
					if d := time.Until(start.Add(time.Duration(k * batch * int64(time.Second) / rate))); d > 0 {
						time.Sleep(d)
					}
					var err error
					buf, err = c.AppendN(context.Background(), buf[:0], batch)
					if err != nil {
						b.Error(err)
						return
					}
					mine = max(mine, buf[len(buf)-1].Ms()-snowflake.MsSince(time.Now()))
				}
				mu.Lock()
				maxLead = max(maxLead, mine)
				mu.Unlock()
			})
			b.ReportMetric(float64(b.N)*batch/time.Since(start).Seconds(), "IDs/s")
			b.ReportMetric(float64(maxLead), "lead-ms")
		})
	}
}

// Over gRPC the codes share the client's connections: Close gives every
// code's lease back before it closes them, and reports no error.
func TestSeveralCodesCloseReleasesAllOverGRPC(t *testing.T) {
	store := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	addr, _ := serveReplica(t, 1, store, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, Config{Targets: []string{addr}, Codes: 4, Owner: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	var workers []int
	for _, li := range c.Leases() {
		workers = append(workers, li.Lease.Worker)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	for _, w := range workers {
		if _, held := store.Owner(w); held {
			t.Fatalf("code %d still held after Close (codes %v)", w, workers)
		}
	}
}
