// Package benchrun is the engine of bench, idrange's fleet load generator:
// R regions × W workers, each worker a rangeclient.Client in this process
// talking over loopback gRPC to its region's range service, paced to a
// target aggregate rate, with a burst profile, per-ID latency, refills,
// stalls, etcd writes, and a uniqueness and range check of every ID minted.
//
// Layout: one in-process region (store.Store + service + gRPC server on
// 127.0.0.1) per region code; by default all regions share one embedded
// etcd (Config.EtcdPerRegion gives each its own). Each worker has its own
// client and its own gRPC connection, as separate processes would.
//
// Many clients: beyond a region's 256 codes (or with Config.AutoCodes) the
// replicas serve the shared path (each one's Next minter holds a code and
// carves runs for clients without one), 255 workers per region keep a code
// each (none with AutoCodes) and the rest use rangeclient Codes 0, sharing
// Config.Conns gRPC connections per region through a wire allocator
// (Config.Allocator), since 10,000 connections would exhaust the process's
// file descriptors. The report counts the shared grants and their
// server-side latency (AllocateShared) next to the codes' (AllocateBlock).
//
// Pacing: each worker runs its own goroutine and ticker (Config.Tick,
// default 50 ms, phases staggered), so a worker that waits for a grant
// delays no other, as with separate processes (pacing several workers
// from one goroutine let one stall leave its neighbours' shared runs to
// expire unused, and cost 10,000 workers about half their rate). On
// every tick each worker mints what a token bucket at rate/(R×W) IDs/s
// says it owes since the start, so a worker that fell behind catches up and
// the achieved rate is the honest total of IDs over elapsed time. Nothing
// busy-loops. Per-ID latency is the time of each Next call alone (a
// clock reading before and after it: the worker's own bookkeeping, which
// in a large fleet takes locks shared by several workers, is not charged
// to Next); tick lateness (how late a tick was received) shows
// whether the machine kept up with the schedule.
//
// Burst: one worker (the first of region 0) additionally asks for
// Config.BurstSize IDs (3,000 in rangesvc bench) back to back every BurstEvery; the
// report says how long each burst took against the 1 ms budget of docs/design.md.
//
// CPU hog: Config.CPUHog > 0 keeps that many cores busy in a child process
// (this executable again, HogSubcommand) for the paced run, so a run under
// overload is reproducible on a quiet machine. The child competes with
// everything in this process, as another program on the host would; it
// stops when its stdin closes and, on Linux, when this process dies.
//
// Verification: every ID is kept (8 bytes each) and checked with
// internal/testing/measure at the end: unique, timestamp inside the run (plus the
// service's maximum lead), code one of the fleet's leased codes. Report.Err
// is non-nil on any failure. Workers that minted nothing (starved by an
// overloaded store) are listed, but are a liveness problem, not a
// uniqueness one.
//
// Files by concern: config.go (Config, defaults, validation), env.go (the
// regions and their etcds, the shared path's minters), clients.go
// (starting and closing the fleet's clients and shared connections),
// timed.go (the Codes-0 workers' grants timed as they see them),
// worker.go (a worker's paced loop, latencies and bursts), bench.go (a
// run from start to report), verify.go (the check of every ID), report.go
// and markdown.go (the report), sweep.go (one run per block size, charted),
// hog.go (the CPU hog child process).
package benchrun

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/measure"
)

// Defaults for zero Config fields.
const (
	DefaultRegions  = 4
	DefaultWorkers  = 200
	DefaultRate     = 2_000_000
	DefaultDuration = 10 * time.Second
	// DefaultTick is 50 ms: at 800 workers a 10 ms tick means 80,000
	// goroutine wake-ups per second, which on 2 cores starves the service
	// and etcd (lease renewals time out and clients fail closed).
	DefaultTick = 50 * time.Millisecond
	// tickFleet is the fleet size up to which the default tick is
	// DefaultTick, and maxAutoTick the longest default tick (10,000
	// workers: 40,000 wake-ups a second instead of 200,000, which cost the
	// 2-core machine a quarter of its CPU).
	tickFleet   = 800
	maxAutoTick = 250 * time.Millisecond

	DefaultBurstSize  = 3000
	DefaultBurstEvery = time.Second
	// MaxWorkers bounds Config.Workers per region: 10,000 is the issue's
	// many-clients fleet; every worker costs a rangeclient's goroutines
	// and buffers in this one process.
	MaxWorkers = 50_000
	// DefaultConns is the gRPC connections per region the Codes-0 workers
	// share: a few, so each carries many clients' grants (as one host's
	// processes share a proxy or a node-local connection).
	DefaultConns = 8
	// maxConns bounds Config.Conns (file descriptors: two per loopback
	// connection in this process).
	maxConns = 1024
	// maxShards bounds the workers' latency histograms (30 KiB each, two
	// per shard): a fleet larger than the default 800 workers shares
	// them, a few workers to a shard, under a lock.
	maxShards = DefaultRegions * DefaultWorkers
	// DefaultSetupConcurrency bounds how many clients start at once: more
	// only queues on etcd's fsync and starves lease renewals on 2 cores.
	DefaultSetupConcurrency = 8
	// setupAttempts is how often one client's start is tried.
	setupAttempts = 3
	// endGrace is how long after the end of the run a Next still waiting
	// for a block may take before it is cancelled.
	endGrace = 2 * time.Second
	// BurstBudget is the time docs/design.md gives one worker for 3,000 IDs.
	BurstBudget = time.Millisecond
	// flushEvery is how many IDs a worker buffers before handing them to
	// the checker (one lock per flush, not per ID); a fleet of more than
	// maxShards workers buffers proportionally fewer each (at least 256),
	// so the buffers together stay within flushEvery × maxShards IDs.
	flushEvery = 8192
)

// ErrVerify marks a run whose IDs failed the check (duplicates, out of
// range, a worker that minted nothing).
var ErrVerify = errors.New("bench: verification failed")

// Run starts a fresh environment, runs the fleet once and tears it down.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	fmt.Fprintf(cfg.Progress, "bench: starting %d region(s) (%s)\n", cfg.Regions, etcdLayout(cfg))
	env, err := StartEnv(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer env.Close()
	return RunOn(ctx, env, cfg)
}

// RunOn runs the fleet once on env (whose regions must match cfg.Regions):
// start every client, run the paced load, sum what was measured, close the
// clients and verify every ID.
func RunOn(ctx context.Context, env *Env, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if len(env.regions) != cfg.Regions {
		return nil, errors.Newf("bench: environment has %d regions, config %d", len(env.regions), cfg.Regions)
	}
	rep := newReport(cfg)
	stopShared, err := env.enableShared(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer stopShared()
	f, err := rep.startFleet(ctx, env, cfg)
	defer f.close(cfg.SetupConcurrency)
	if err != nil {
		return nil, err
	}
	workers := f.workers

	var h *hog
	if cfg.CPUHog > 0 {
		if h, err = startHog(ctx, cfg.CPUHog); err != nil {
			return nil, err
		}
		defer h.stop()
		fmt.Fprintf(cfg.Progress, "bench: cpu hog: %d busy core(s) in child process %d\n", cfg.CPUHog, h.cmd.Process.Pid)
	}
	begin := time.Now()
	cpu0 := measure.CPUTime()
	checker, err := newChecker(env, cfg, begin)
	if err != nil {
		return nil, err
	}
	if cfg.BurstSize > 0 {
		workers[0].burst = &burstStats{}
	}
	base := takeBaseline(env, workers)
	for _, a := range f.allocs {
		a.reset()
	}
	prof, err := startRoleProfile(cfg.CPUProfile)
	if err != nil {
		return nil, err
	}
	ls := rep.runPaced(ctx, cfg, env, workers, checker, begin, cpu0, base)
	if prof != nil {
		if rep.CPUByRole, err = prof.stop(); err != nil {
			return nil, err
		}
	}
	if h != nil {
		res := h.stop()
		rep.HogCPUCores, rep.HogProblem = res.CPUCores, res.Problem
		fmt.Fprintf(cfg.Progress, "bench: cpu hog stopped: it burnt %.2f cores\n", res.CPUCores)
	}
	rep.sumWorkers(cfg, workers, ls)
	rep.sumFleet(cfg, env, workers, base)
	rep.GrantLatency = grantLatency(f.allocs)

	// Close the clients (frees the CPU, gives the leases back), then check.
	f.close(cfg.SetupConcurrency)
	rep.verify(cfg, checker, workers)
	runtime.GC()
	return rep, nil
}

// roleLabel labels the goroutines a part of the bench starts (they pass it
// on to every goroutine they start), for Config.CPUProfile.
func roleLabel(role string) pprof.LabelSet { return pprof.Labels("role", role) }

// baseline is what the counters read before the paced run; the report
// counts the difference.
type baseline struct {
	counts  localregion.Counts
	stats   statsSum
	latency map[string]*measure.Histogram
}

func takeBaseline(env *Env, workers []*worker) baseline {
	return baseline{counts: env.counts(), stats: fleetStats(workers), latency: env.rpcLatency()}
}

// runPaced runs every worker's paced loop (and the progress line) until
// the end of the window plus the grace for late Next calls, and records
// the elapsed time and CPU use.
func (rep *Report) runPaced(ctx context.Context, cfg Config, env *Env, workers []*worker, checker *measure.Checker,
	begin time.Time, cpu0 time.Duration, base baseline) []*latencies {
	end := begin.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end.Add(endGrace))
	defer cancel()
	perWorker := cfg.Rate / float64(len(workers))
	var wg sync.WaitGroup
	jitter := rand.New(rand.NewPCG(uint64(begin.UnixNano()), 7))
	ls := shardLatencies(workers)
	for _, w := range workers {
		offset := time.Duration(jitter.Int64N(int64(cfg.Tick)))
		wg.Add(1)
		go pprof.Do(runCtx, roleLabel("pacer"), func(runCtx context.Context) {
			defer wg.Done()
			w.run(runCtx, cfg, begin, end, offset, perWorker, checker)
		})
	}
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(runCtx, cfg, env, workers, begin, base.counts, base.stats)
	}()
	wg.Wait()
	rep.Elapsed = Dur(time.Since(begin))
	rep.CPUCores = float64(measure.CPUTime()-cpu0) / float64(rep.Elapsed)
	cancel()
	<-progressDone
	return ls
}

// progress prints a line every ProgressEvery until ctx ends.
func progress(ctx context.Context, cfg Config, env *Env, ws []*worker, begin time.Time, c0 localregion.Counts, s0 statsSum) {
	t := time.NewTicker(cfg.ProgressEvery)
	defer t.Stop()
	var lastIDs int64
	last := begin
	lastWrites := c0.Writes()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			var ids int64
			for _, w := range ws {
				ids += w.minted.Load()
			}
			st := fleetStats(ws)
			c := env.counts()
			dt := now.Sub(last).Seconds()
			fmt.Fprintf(cfg.Progress, "bench: %5.1fs/%v  %s IDs/s (target %s)  total %s  refills %d  stalls %d  etcd writes/s %.0f\n",
				now.Sub(begin).Seconds(), cfg.Duration, measure.SI(float64(ids-lastIDs)/dt), measure.SI(cfg.Rate), measure.SI(float64(ids)),
				st.Refills-s0.Refills, st.Stalls-s0.Stalls, float64(c.Writes()-lastWrites)/dt)
			lastIDs, last, lastWrites = ids, now, c.Writes()
		}
	}
}
