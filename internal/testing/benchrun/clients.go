package benchrun

import (
	"context"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// fleet is the running clients and the connections the Codes-0 ones share.
type fleet struct {
	workers []*worker // some nil after a failed start
	conns   []*grpc.ClientConn
	allocs  []*timedAllocator // one per connection
}

// close closes every client, then the shared connections (idempotent).
func (f *fleet) close(concurrency int) {
	closeClients(f.workers, concurrency)
	for _, cc := range f.conns {
		cc.Close()
	}
	f.conns = nil
}

// startFleet starts every client (lease or first shared run, and first
// block) before the clock starts, recording the setup time and retries.
// The fleet it returns must be closed by the caller, also on error.
func (rep *Report) startFleet(ctx context.Context, env *Env, cfg Config) (*fleet, error) {
	n := cfg.Regions * cfg.Workers
	setupStart := time.Now()
	if cfg.SharedPath() {
		fmt.Fprintf(cfg.Progress, "bench: starting %d clients (%d regions x %d workers: %d with a code each, %d with Codes 0 over %d shared connections per region)\n",
			n, cfg.Regions, cfg.Workers, cfg.DedicatedWorkers(), cfg.Workers-cfg.DedicatedWorkers(), cfg.Conns)
	} else {
		fmt.Fprintf(cfg.Progress, "bench: starting %d clients (%d regions x %d workers)\n", n, cfg.Regions, cfg.Workers)
	}
	var (
		f       *fleet
		retries int64
		err     error
	)
	pprof.Do(ctx, roleLabel("client"), func(ctx context.Context) { f, retries, err = startClients(ctx, env, cfg) })
	rep.SetupRetries = retries
	if err != nil {
		return f, err
	}
	rep.SetupTime = Dur(time.Since(setupStart))
	fmt.Fprintf(cfg.Progress, "bench: %d clients ready in %v\n", n, time.Duration(rep.SetupTime).Round(time.Millisecond))
	return f, nil
}

// dialPools opens cfg.Conns connections to each region when some workers
// use Codes 0, and returns one allocator per connection, per region.
func dialPools(env *Env, cfg Config, f *fleet) ([][]segment.Allocator, error) {
	if cfg.DedicatedWorkers() == cfg.Workers {
		return nil, nil
	}
	pools := make([][]segment.Allocator, len(env.regions))
	for r, reg := range env.regions {
		for range cfg.Conns {
			cc, err := grpc.NewClient(reg.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
			if err != nil {
				return nil, errors.Wrapf(err, "bench: dial region %d", reg.RegionID())
			}
			a := &timedAllocator{SharedAllocator: wire.NewAllocator(cc).(segment.SharedAllocator)}
			f.conns = append(f.conns, cc)
			f.allocs = append(f.allocs, a)
			pools[r] = append(pools[r], a)
		}
	}
	return pools, nil
}

// startClients builds one rangeclient per worker, SetupConcurrency at a
// time, with a progress line every ProgressEvery.
func startClients(ctx context.Context, env *Env, cfg Config) (*fleet, int64, error) {
	n := cfg.Regions * cfg.Workers
	f := &fleet{workers: make([]*worker, n)}
	pools, err := dialPools(env, cfg, f)
	if err != nil {
		return f, 0, err
	}
	bufCap := min(flushEvery, max(256, flushEvery*maxShards/n))
	sem := make(chan struct{}, cfg.SetupConcurrency)
	var setupRetries, started atomic.Int64
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	sctx, cancel := context.WithTimeout(ctx, cfg.SetupTimeout)
	defer cancel()
	stopProgress := setupProgress(cfg, n, &started)
	defer stopProgress()
	for i := range n {
		reg := env.regions[i/cfg.Workers]
		index := i % cfg.Workers
		var alloc segment.Allocator
		if pools != nil {
			pool := pools[i/cfg.Workers]
			alloc = pool[index%len(pool)]
		}
		wg.Add(1)
		select {
		case sem <- struct{}{}:
		case <-sctx.Done():
			wg.Done()
			continue
		}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			cc := cfg.clientConfig(reg.Addr(), alloc, reg.RegionID(), index)
			var (
				c   *engine.Engine
				err error
			)
			for attempt := range setupAttempts {
				if c, err = engine.New(sctx, cc); err == nil || sctx.Err() != nil {
					break
				}
				setupRetries.Add(1)
				fmt.Fprintf(cfg.Progress, "bench: client %d of region %d failed to start (attempt %d of %d): %v\n",
					index, reg.RegionID(), attempt+1, setupAttempts, err)
			}
			if err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = errors.Wrapf(err, "bench: start client %d of region %d", index, reg.RegionID())
					cancel()
				}
				mu.Unlock()
				return
			}
			w := &worker{region: reg.RegionID(), index: index, c: c, shared: cc.Codes == 0,
				buf: make([]snowflake.ID, 0, bufCap)}
			if !w.shared {
				l := c.Lease().Lease
				w.code = measure.Code{Region: l.Region, Worker: l.Worker}
			}
			f.workers[i] = w
			started.Add(1)
		}()
	}
	wg.Wait()
	if firstErr == nil && sctx.Err() != nil {
		firstErr = errors.Wrapf(sctx.Err(), "bench: %d of %d clients started", started.Load(), n)
	}
	return f, setupRetries.Load(), firstErr
}

// setupProgress prints how many of n clients have started every
// ProgressEvery until stop is called.
func setupProgress(cfg Config, n int, started *atomic.Int64) (stop func()) {
	done := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(cfg.ProgressEvery)
		defer t.Stop()
		begin := time.Now()
		for {
			select {
			case <-done:
				return
			case now := <-t.C:
				fmt.Fprintf(cfg.Progress, "bench: setup %5.1fs: %d of %d clients started\n", now.Sub(begin).Seconds(), started.Load(), n)
			}
		}
	}()
	return func() {
		close(done)
		<-exited
	}
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
