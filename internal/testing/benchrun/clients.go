package benchrun

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/snowflake"
)

// startFleet starts every client (lease + first block) before the clock
// starts, recording the setup time and retries. The workers it returns
// (some nil on error) must be closed by the caller.
func (rep *Report) startFleet(ctx context.Context, env *Env, cfg Config) ([]*worker, error) {
	n := cfg.Regions * cfg.Workers
	setupStart := time.Now()
	fmt.Fprintf(cfg.Progress, "bench: starting %d clients (%d regions x %d workers)\n", n, cfg.Regions, cfg.Workers)
	workers, retries, err := startClients(ctx, env, cfg)
	rep.SetupRetries = retries
	if err != nil {
		return workers, err
	}
	rep.SetupTime = Dur(time.Since(setupStart))
	fmt.Fprintf(cfg.Progress, "bench: %d clients ready in %v\n", n, time.Duration(rep.SetupTime).Round(time.Millisecond))
	return workers, nil
}

// startClients builds one rangeclient per worker, SetupConcurrency at a time.
func startClients(ctx context.Context, env *Env, cfg Config) ([]*worker, int64, error) {
	n := cfg.Regions * cfg.Workers
	workers := make([]*worker, n)
	sem := make(chan struct{}, cfg.SetupConcurrency)
	var setupRetries atomic.Int64
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sctx, cancel := context.WithTimeout(ctx, cfg.SetupTimeout)
	defer cancel()
	for i := range n {
		reg := env.regions[i/cfg.Workers]
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cc := cfg.clientConfig(reg.Addr(), reg.RegionID(), i%cfg.Workers)
			var (
				c   *rangeclient.Client
				err error
			)
			for attempt := range setupAttempts {
				if c, err = rangeclient.New(sctx, cc); err == nil || sctx.Err() != nil {
					break
				}
				setupRetries.Add(1)
				fmt.Fprintf(cfg.Progress, "bench: client %d of region %d failed to start (attempt %d of %d): %v\n",
					i%cfg.Workers, reg.RegionID(), attempt+1, setupAttempts, err)
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = errors.Wrapf(err, "bench: start client %d of region %d", i%cfg.Workers, reg.RegionID())
					cancel()
				}
				mu.Unlock()
				return
			}
			l := c.Lease().Lease
			workers[i] = &worker{region: reg.RegionID(), index: i % cfg.Workers, c: c,
				code: measure.Code{Region: l.Region, Worker: l.Worker}, buf: make([]snowflake.ID, 0, flushEvery)}
		}()
	}
	wg.Wait()
	return workers, setupRetries.Load(), firstErr
}

// closeClients closes every client (Close is idempotent), a few at a
// time: each gives its lease back with one RPC.
func closeClients(ws []*worker, concurrency int) {
	sem := make(chan struct{}, concurrency)
	var wg sync.WaitGroup
	for _, w := range ws {
		if w == nil || w.c == nil {
			continue
		}
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			w.c.Close()
		}()
	}
	wg.Wait()
}

type statsSum struct{ Refills, RefillErrors, Backpressure, Stalls uint64 }

func fleetStats(ws []*worker) statsSum {
	var s statsSum
	for _, w := range ws {
		st := w.c.Stats()
		s.Refills += st.Refills
		s.RefillErrors += st.RefillErrors
		s.Backpressure += st.Backpressure
		s.Stalls += st.Stalls
	}
	return s
}
