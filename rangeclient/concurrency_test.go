package rangeclient

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// 64 goroutines share one client for 1,000,000 IDs (real time, so block
// rotation and background refills race with the callers): every ID is
// unique, inside a granted block, and each goroutine's IDs strictly increase.
func TestConcurrentCallersUniqueAndIncreasing(t *testing.T) {
	const goroutines, total = 64, 1_000_000
	per := total / goroutines
	if testing.Short() {
		per /= 10
	}
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	// Small blocks so that the run crosses many rotations and refills.
	c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.FixedBlock = 50_000 })
	out := make([][]snowflake.ID, goroutines)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]snowflake.ID, 0, per)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for len(ids) < per {
				if len(ids)%7 == 3 { // mix single and batched calls
					var err error
					ids, err = c.AppendN(ctx, ids, min(5, per-len(ids)))
					if err != nil {
						errs <- err
						return
					}
					continue
				}
				id, err := c.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				ids = append(ids, id)
			}
			out[g] = ids
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("minting failed: %v", err)
	}
	all := make([]snowflake.ID, 0, per*goroutines)
	for g, ids := range out {
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("goroutine %d: ID %d (%d) not above the previous (%d)", g, i, ids[i], ids[i-1])
			}
		}
		all = append(all, ids...)
	}
	if len(all) != per*goroutines {
		t.Fatalf("got %d IDs, want %d", len(all), per*goroutines)
	}
	checkUnique(t, all)
	checkInGrants(t, svc, all)
	s := c.Stats()
	if s.Minted != int64(len(all)) {
		t.Errorf("Stats.Minted = %d, minted %d", s.Minted, len(all))
	}
	if s.Refills < 2 {
		t.Errorf("only %d refills: the run did not cross a block boundary", s.Refills)
	}
	t.Logf("%d IDs over %d blocks, %d stalls", len(all), s.Refills, s.Stalls)
}
