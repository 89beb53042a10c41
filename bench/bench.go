// Package bench is idrange's fleet load generator: R regions × W workers,
// each worker a rangeclient.Client in this process talking over loopback
// gRPC to its region's range service, paced to a target aggregate rate,
// with a burst profile, per-ID latency, refills, stalls, etcd writes, and a
// uniqueness and range check of every ID minted.
//
// Layout: one in-process region (store.Store + service + gRPC server on
// 127.0.0.1) per region code; by default all regions share one embedded
// etcd (Config.EtcdPerRegion gives each its own). Each worker has its own
// client and its own gRPC connection, as separate processes would.
//
// Pacing: each worker runs a ticker (Config.Tick, default 10 ms, phases
// staggered) and on every tick mints what a token bucket at rate/(R×W) IDs/s
// says it owes since the start, so a worker that fell behind catches up and
// the achieved rate is the honest total of IDs over elapsed time. Nothing
// busy-loops. Per-ID latency is the time of each Next call (one clock
// reading per ID); tick lateness (how late a tick was received) shows
// whether the machine kept up with the schedule.
//
// Burst: one worker (the first of region 0) additionally asks for
// Config.BurstSize IDs (default 3,000) back to back every BurstEvery; the
// report says how long each burst took against the 1 ms budget of docs/design.md.
//
// CPU hog: Config.CPUHog > 0 keeps that many cores busy in a child process
// (this executable again, HogSubcommand) for the paced run, so a run under
// overload is reproducible on a quiet machine. The child competes with
// everything in this process, as another program on the host would; it
// stops when its stdin closes and, on Linux, when this process dies.
//
// Verification: every ID is kept (8 bytes each) and checked with
// internal/testing/idcheck at the end: unique, timestamp inside the run (plus the
// service's maximum lead), code one of the fleet's leased codes. Report.Err
// is non-nil on any failure. Workers that minted nothing (starved by an
// overloaded store) are listed, but are a liveness problem, not a
// uniqueness one.
package bench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/server/store"

	"github.com/idrange/idrange/internal/server/clienttune"
	"github.com/idrange/idrange/internal/testing/hdr"
	"github.com/idrange/idrange/internal/testing/idcheck"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/machine"
	"github.com/idrange/idrange/internal/testing/report"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
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
	DefaultTick       = 50 * time.Millisecond
	DefaultBurstSize  = 3000
	DefaultBurstEvery = time.Second
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
	// the checker (one lock per flush, not per ID).
	flushEvery = 8192
)

// ErrVerify marks a run whose IDs failed the check (duplicates, out of
// range, a worker that minted nothing).
var ErrVerify = errors.New("bench: verification failed")

// Config configures a Run. Zero fields take the defaults above.
type Config struct {
	// Regions (1..4) and Workers per region (1..256).
	Regions, Workers int
	// Rate is the target aggregate IDs/s. Default 2,000,000.
	Rate float64
	// Duration of the paced run. Default 10 s.
	Duration time.Duration
	// Tick is each worker's pacing interval. Default 10 ms.
	Tick time.Duration
	// BurstSize IDs are asked for back to back by one worker every
	// BurstEvery. Default 3,000 every 1 s; NoBurst disables the profile.
	BurstSize  int
	BurstEvery time.Duration
	NoBurst    bool
	// Client is the base rangeclient configuration (RefillInterval,
	// MaxReserve, ...); Targets, Region and Owner are set per worker.
	Client rangeclient.Config
	// FixedBlock, PrefetchThreshold and RPCTimeout are the workers'
	// rangeclient tuning (0: rangeclient's defaults). FixedBlock > 0 pins
	// every block to that many units (Sweep varies it).
	FixedBlock        int
	PrefetchThreshold float64
	RPCTimeout        time.Duration
	// Store tunes each region's store.Store.
	Store store.Config
	// EtcdPerRegion gives each region its own embedded etcd instead of one
	// shared by all.
	EtcdPerRegion bool
	// CPUHog is how many cores a child process keeps busy during the paced
	// run (0..MaxCPUHog()), so the overload case is reproducible instead of
	// depending on a busy machine. Default 0: no hog. The child is this
	// executable run again with HogSubcommand; it competes with the whole
	// process (etcd, services, clients, workers) as another program would,
	// and its CPU is not counted in Report.CPUCores.
	CPUHog int
	// Logger, if set, receives the regions' and (unless Client.Logger is
	// set) the clients' logs.
	Logger *slog.Logger
	// SetupTimeout bounds the start of all clients. Default 2 min.
	SetupTimeout time.Duration
	// SetupConcurrency bounds concurrent client start-ups. Default 8.
	SetupConcurrency int
	// Progress, if set, receives a line every ProgressEvery (default 1 s).
	Progress      io.Writer
	ProgressEvery time.Duration
	// Sink is a test hook: it sees each batch of a worker's IDs before they
	// are verified and returns what is verified (a test plants a duplicate
	// this way). nil passes IDs through.
	Sink func(region, worker int, ids []snowflake.ID) []snowflake.ID
}

func (c Config) withDefaults() Config {
	if c.Regions == 0 {
		c.Regions = DefaultRegions
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Tick == 0 {
		c.Tick = DefaultTick
	}
	if c.BurstSize == 0 {
		c.BurstSize = DefaultBurstSize
	}
	if c.BurstEvery == 0 {
		c.BurstEvery = DefaultBurstEvery
	}
	if c.SetupTimeout == 0 {
		c.SetupTimeout = 2 * time.Minute
	}
	if c.SetupConcurrency == 0 {
		c.SetupConcurrency = DefaultSetupConcurrency
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate reports the first bad field (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Regions < 1 || c.Regions > snowflake.MaxRegion+1:
		return errors.Newf("bench: Regions %d not in 1..%d", c.Regions, snowflake.MaxRegion+1)
	case c.Workers < 1 || c.Workers > snowflake.MaxWorker+1:
		return errors.Newf("bench: Workers %d not in 1..%d per region", c.Workers, snowflake.MaxWorker+1)
	case !(c.Rate > 0) || c.Rate > 1e9:
		return errors.Newf("bench: Rate %v not in (0, 1e9] IDs/s", c.Rate)
	case c.Duration < 100*time.Millisecond || c.Duration > 24*time.Hour:
		return errors.Newf("bench: Duration %v not in 100ms..24h", c.Duration)
	case c.Tick < time.Millisecond || c.Tick > c.Duration:
		return errors.Newf("bench: Tick %v not in 1ms..Duration", c.Tick)
	case c.BurstSize < 1 || c.BurstSize > 1<<20:
		return errors.Newf("bench: BurstSize %d not in 1..%d", c.BurstSize, 1<<20)
	case c.BurstEvery < time.Millisecond:
		return errors.Newf("bench: BurstEvery %v below 1ms", c.BurstEvery)
	case c.SetupConcurrency < 1:
		return errors.Newf("bench: SetupConcurrency %d below 1", c.SetupConcurrency)
	case c.CPUHog < 0 || c.CPUHog > MaxCPUHog():
		return errors.Newf("bench: CPUHog %d not in 0..%d cores", c.CPUHog, MaxCPUHog())
	case c.ProgressEvery < 10*time.Millisecond:
		return errors.Newf("bench: ProgressEvery %v below 10ms", c.ProgressEvery)
	case len(c.Client.Targets) > 0 || c.Client.Allocator != nil:
		return errors.New("bench: Config.Client must not set Targets or Allocator (bench connects each worker itself)")
	}
	return nil
}

// Report is the outcome of a Run.
type Report struct {
	Machine machine.Info `json:"machine"`
	Started time.Time    `json:"started"`
	Fleet   Fleet        `json:"fleet"`

	SetupTime Dur `json:"setup_time"`
	// LeaseChanges counts leases clients acquired after their first (a lost
	// lease is replaced, possibly by another code).
	LeaseChanges uint64 `json:"lease_changes"`
	// SetupRetries counts client start-ups that failed and were retried.
	SetupRetries int64 `json:"setup_retries"`
	Elapsed      Dur   `json:"elapsed"`
	// CPUCores is the process's CPU time during the run divided by Elapsed
	// (workers, clients, services and etcd all live in this process; a CPU
	// hog child is not counted).
	CPUCores float64 `json:"cpu_cores"`
	// HogCPUCores is the CPU hog child's CPU time over its lifetime (a
	// little longer than the paced run), when Fleet.CPUHog > 0: how much
	// of the machine it actually took.
	HogCPUCores float64 `json:"hog_cpu_cores,omitempty"`
	// HogProblem says the hog child exited early, failed or had to be
	// killed: the run was then not entirely under the hog.
	HogProblem string `json:"hog_problem,omitempty"`
	// IDs minted during the run, bursts included; BurstIDs of them by the
	// burst profile.
	IDs      int64 `json:"ids"`
	BurstIDs int64 `json:"burst_ids"`
	// AchievedRate is the paced IDs returned by the end of the window
	// (start + Duration) divided by Duration: IDs owed in the window but
	// minted after it (a worker behind schedule, a late final tick) do not
	// count. TargetReached is AchievedRate >= 99% of the target.
	// ScheduleKept is all paced IDs / (target × Duration): 1 when every
	// owed ID was minted, however late. TotalRate is every ID (bursts
	// included) over Elapsed, which runs until the last worker settled.
	AchievedRate  float64 `json:"achieved_rate"`
	ScheduleKept  float64 `json:"schedule_kept"`
	TotalRate     float64 `json:"total_rate"`
	TargetReached bool    `json:"target_reached"`
	// Latency is per ID (each Next call), all workers, bursts included.
	Latency hdr.Summary `json:"latency_per_id"`
	// TickLateness is how late workers received their pacing ticks: large
	// values mean the machine could not keep up with the schedule.
	TickLateness hdr.Summary `json:"tick_lateness"`
	Burst        Burst       `json:"burst"`

	// Client counters summed over the fleet (rangeclient.Stats).
	Refills      uint64 `json:"refills"`
	RefillErrors uint64 `json:"refill_errors"`
	Backpressure uint64 `json:"backpressure"`
	Stalls       uint64 `json:"stalls"`
	// SlowCalls counts Next calls slower than 1 ms (a stall as the caller
	// feels it, whatever the cause: refill wait, scheduling, GC).
	SlowCalls uint64 `json:"slow_calls_over_1ms"`
	// Store counters summed over the regions, for the paced run.
	Store            localregion.Counts `json:"store"`
	EtcdWrites       uint64             `json:"etcd_writes"`
	EtcdWritesPerSec float64            `json:"etcd_writes_per_sec"`
	// ServerLatency is the services' own time per RPC method during the
	// run (all regions), store included: where a stall came from.
	ServerLatency map[string]hdr.Summary `json:"server_latency"`
	// Errors are failed Next calls (not counting the end of the run).
	Errors     int64  `json:"errors"`
	FirstError string `json:"first_error,omitempty"`

	Verify     VerifySummary `json:"verify"`
	VerifyTime Dur           `json:"verify_time"`

	verifyErr error
}

// Fleet is the shape of the run.
type Fleet struct {
	Regions        int     `json:"regions"`
	Workers        int     `json:"workers_per_region"`
	TargetRate     float64 `json:"target_rate"`
	PerWorkerRate  float64 `json:"per_worker_rate"`
	Duration       Dur     `json:"duration"`
	Tick           Dur     `json:"tick"`
	Etcd           string  `json:"etcd"`
	RefillInterval Dur     `json:"refill_interval"`
	FixedBlock     int     `json:"fixed_block,omitempty"`
	// CPUHog is the cores a child process kept busy during the run (0: none).
	CPUHog int `json:"cpu_hog"`
}

// Burst summarises the burst profile.
type Burst struct {
	Size         int         `json:"size"`
	Count        int         `json:"count"`
	WithinBudget int         `json:"within_1ms"`
	Duration     hdr.Summary `json:"duration"`
	Latency      hdr.Summary `json:"latency_per_id"`
}

// VerifySummary is the idcheck result without the per-code list.
type VerifySummary struct {
	Checked            int64               `json:"checked"`
	Unique             int64               `json:"unique"`
	Duplicates         int64               `json:"duplicates"`
	DuplicateExamples  []idcheck.Duplicate `json:"duplicate_examples,omitempty"`
	OutOfRange         int64               `json:"out_of_range"`
	OutOfRangeExamples []idcheck.Bad       `json:"out_of_range_examples,omitempty"`
	Codes              int                 `json:"codes"`
	MissingCodes       []idcheck.Code      `json:"missing_codes,omitempty"`
	Problem            string              `json:"problem,omitempty"`
}

// Dur is a time.Duration that marshals as text ("1.5s"); see report.Dur.
type Dur = report.Dur

// Err is nil when every ID verified and no call failed; otherwise it wraps
// ErrVerify (with idcheck's sentinel) or describes the failed calls.
func (r *Report) Err() error {
	if r.verifyErr != nil {
		return errors.Wrapf(errors.Mark(r.verifyErr, ErrVerify), "bench")
	}
	if r.Errors > 0 {
		return errors.Newf("bench: %d Next calls failed, first: %s", r.Errors, r.FirstError)
	}
	return nil
}

// VerifyErr is the verification failure alone (nil when every ID passed).
func (r *Report) VerifyErr() error {
	if r.verifyErr == nil {
		return nil
	}
	return errors.Mark(r.verifyErr, ErrVerify)
}

// Env is a running set of regions, reusable across runs (the sweep).
type Env struct {
	etcds   []*localregion.Etcd
	regions []*localregion.Region
}

// StartEnv starts cfg.Regions in-process regions on one shared etcd (or
// one each with EtcdPerRegion).
func StartEnv(ctx context.Context, cfg Config) (*Env, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	env := &Env{}
	ok := false
	defer func() {
		if !ok {
			env.Close()
		}
	}()
	var shared *localregion.Etcd
	for r := range cfg.Regions {
		e := shared
		if e == nil || cfg.EtcdPerRegion {
			var err error
			if e, err = localregion.StartEtcd(ctx, ""); err != nil {
				return nil, err
			}
			env.etcds = append(env.etcds, e)
			shared = e
		}
		reg, err := localregion.Start(ctx, localregion.Config{Region: r, Etcd: e.Server, Store: cfg.Store, Logger: cfg.Logger,
			SharedEtcd: !cfg.EtcdPerRegion})
		if err != nil {
			return nil, err
		}
		env.regions = append(env.regions, reg)
	}
	ok = true
	return env, nil
}

// Close stops the regions and their etcds.
func (e *Env) Close() error {
	var first error
	for _, r := range e.regions {
		if err := r.Close(); err != nil && first == nil {
			first = err
		}
	}
	for _, x := range e.etcds {
		if err := x.Close(); err != nil && first == nil {
			first = err
		}
	}
	return first
}

func (e *Env) counts() localregion.Counts {
	var c localregion.Counts
	for _, r := range e.regions {
		c = c.Add(r.Counts())
	}
	return c
}

func (e *Env) rpcLatency() map[string]*hdr.Histogram {
	out := map[string]*hdr.Histogram{}
	for _, r := range e.regions {
		for m, h := range r.RPCLatency() {
			if out[m] == nil {
				out[m] = hdr.New()
			}
			out[m].Merge(h)
		}
	}
	return out
}

// rpcLatencySince summarises the RPCs served after the snapshot before:
// histograms only grow, so the run's own part is the bucket difference.
func (e *Env) rpcLatencySince(before map[string]*hdr.Histogram) map[string]hdr.Summary {
	out := map[string]hdr.Summary{}
	for m, h := range e.rpcLatency() {
		if b := before[m]; b != nil {
			h.Subtract(b)
		}
		if h.Count() > 0 {
			out[m] = h.Summary()
		}
	}
	return out
}

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

func etcdLayout(cfg Config) string {
	if cfg.EtcdPerRegion || cfg.Regions == 1 {
		return "one embedded etcd per region, fsync on"
	}
	return "one embedded etcd shared by all regions, fsync on"
}

// worker is one client and what its goroutine measured.
type worker struct {
	region, index int
	code          idcheck.Code
	c             *rangeclient.Client

	n      int64 // IDs kept (owned by the worker's goroutine)
	window int64 // paced IDs returned by the end of the window
	// foreign counts IDs whose region field is not the worker's region.
	foreign   int64
	foreignEx []idcheck.Bad
	minted    atomic.Int64 // n as of the last tick, read by the progress line
	hist      hdr.Histogram
	late      hdr.Histogram
	slow      uint64
	errs      int64
	err       error
	buf       []snowflake.ID

	burst      bool
	burstHist  hdr.Histogram
	burstDur   hdr.Histogram
	bursts     int
	burstsInBg int
	burstIDs   int64
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
	workers, err := rep.startFleet(ctx, env, cfg)
	defer closeClients(workers, cfg.SetupConcurrency)
	if err != nil {
		return nil, err
	}

	var h *hog
	if cfg.CPUHog > 0 {
		if h, err = startHog(ctx, cfg.CPUHog); err != nil {
			return nil, err
		}
		defer h.stop()
		fmt.Fprintf(cfg.Progress, "bench: cpu hog: %d busy core(s) in child process %d\n", cfg.CPUHog, h.cmd.Process.Pid)
	}
	begin := time.Now()
	cpu0 := machine.CPUTime()
	checker, err := newChecker(env, cfg, begin)
	if err != nil {
		return nil, err
	}
	workers[0].burst = !cfg.NoBurst
	base := takeBaseline(env, workers)
	rep.runPaced(ctx, cfg, env, workers, checker, begin, cpu0, base)
	if h != nil {
		res := h.stop()
		rep.HogCPUCores, rep.HogProblem = res.CPUCores, res.Problem
		fmt.Fprintf(cfg.Progress, "bench: cpu hog stopped: it burnt %.2f cores\n", res.CPUCores)
	}
	rep.sumWorkers(cfg, workers)
	rep.sumFleet(cfg, env, workers, base)

	// Close the clients (frees the CPU, gives the leases back), then check.
	closeClients(workers, cfg.SetupConcurrency)
	rep.verify(cfg, checker, workers)
	runtime.GC()
	return rep, nil
}

// newReport is the report of a run of cfg before anything ran.
func newReport(cfg Config) *Report {
	n := cfg.Regions * cfg.Workers
	rep := &Report{
		Machine: machine.Current(),
		Started: time.Now().UTC(),
		Fleet: Fleet{
			Regions: cfg.Regions, Workers: cfg.Workers, TargetRate: cfg.Rate,
			PerWorkerRate: cfg.Rate / float64(n), Duration: Dur(cfg.Duration), Tick: Dur(cfg.Tick),
			Etcd: etcdLayout(cfg), RefillInterval: Dur(cfg.Client.RefillInterval), FixedBlock: cfg.FixedBlock,
			CPUHog: cfg.CPUHog,
		},
	}
	if rep.Fleet.RefillInterval == 0 {
		rep.Fleet.RefillInterval = Dur(rangeclient.DefaultRefillInterval)
	}
	return rep
}

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

// newChecker is the verification of a run that begins at begin. A client
// that loses its lease takes a new one, possibly another code of its
// region: every code of the fleet's regions is allowed, and each worker
// checks that its IDs carry its own region (keep).
func newChecker(env *Env, cfg Config, begin time.Time) (*idcheck.Checker, error) {
	regionCodes := make([]int, cfg.Regions)
	for i := range regionCodes {
		regionCodes[i] = env.regions[i].RegionID()
	}
	expect := idcheck.Codes(regionCodes, snowflake.MaxWorker+1)
	leadSlack := segment.DefaultMaxLead
	if cfg.Store.Policy.MaxLead > 0 {
		leadSlack = cfg.Store.Policy.MaxLead
	}
	return idcheck.New(idcheck.Config{
		Expect:    expect, // a worker that minted nothing is reported (Verify.MissingCodes), not a failure
		NotBefore: begin.Add(-time.Second),
		NotAfter:  begin.Add(cfg.Duration + leadSlack + 5*time.Second),
		Capacity:  int(min(cfg.Rate*cfg.Duration.Seconds()*1.05, 1<<31)) + 1<<16,
	})
}

// baseline is what the counters read before the paced run; the report
// counts the difference.
type baseline struct {
	counts  localregion.Counts
	stats   statsSum
	latency map[string]*hdr.Histogram
}

func takeBaseline(env *Env, workers []*worker) baseline {
	return baseline{counts: env.counts(), stats: fleetStats(workers), latency: env.rpcLatency()}
}

// runPaced runs every worker's paced loop (and the progress line) until
// the end of the window plus the grace for late Next calls, and records
// the elapsed time and CPU use.
func (rep *Report) runPaced(ctx context.Context, cfg Config, env *Env, workers []*worker, checker *idcheck.Checker,
	begin time.Time, cpu0 time.Duration, base baseline) {
	end := begin.Add(cfg.Duration)
	runCtx, cancel := context.WithDeadline(ctx, end.Add(endGrace))
	defer cancel()
	perWorker := cfg.Rate / float64(len(workers))
	var wg sync.WaitGroup
	jitter := rand.New(rand.NewPCG(uint64(begin.UnixNano()), 7))
	for _, w := range workers {
		offset := time.Duration(jitter.Int64N(int64(cfg.Tick)))
		wg.Add(1)
		go func() {
			defer wg.Done()
			w.run(runCtx, cfg, begin, end, offset, perWorker, checker)
		}()
	}
	progressDone := make(chan struct{})
	go func() {
		defer close(progressDone)
		progress(runCtx, cfg, env, workers, begin, base.counts, base.stats)
	}()
	wg.Wait()
	rep.Elapsed = Dur(time.Since(begin))
	rep.CPUCores = float64(machine.CPUTime()-cpu0) / float64(rep.Elapsed)
	cancel()
	<-progressDone
}

// sumWorkers adds up what the workers measured: IDs, latency, errors,
// bursts and the rates.
func (rep *Report) sumWorkers(cfg Config, workers []*worker) {
	var lat, late, bh, bd hdr.Histogram
	var inWindow int64
	for _, w := range workers {
		rep.IDs += w.minted.Load()
		inWindow += w.window
		lat.Merge(&w.hist)
		late.Merge(&w.late)
		rep.SlowCalls += w.slow
		rep.Errors += w.errs
		if w.err != nil && rep.FirstError == "" {
			rep.FirstError = fmt.Sprintf("r%d/w%d: %v", w.code.Region, w.code.Worker, w.err)
		}
		if w.burst {
			bh.Merge(&w.burstHist)
			bd.Merge(&w.burstDur)
			rep.Burst.Count += w.bursts
			rep.BurstIDs += w.burstIDs
			rep.Burst.WithinBudget += w.burstsInBg
		}
	}
	rep.Latency, rep.TickLateness = lat.Summary(), late.Summary()
	rep.Burst.Size, rep.Burst.Latency, rep.Burst.Duration = cfg.BurstSize, bh.Summary(), bd.Summary()
	if cfg.NoBurst {
		rep.Burst.Size = 0
	}
	rep.AchievedRate = float64(inWindow) / cfg.Duration.Seconds()
	rep.TotalRate = float64(rep.IDs) / time.Duration(rep.Elapsed).Seconds()
	rep.TargetReached = rep.AchievedRate >= 0.99*cfg.Rate
	rep.ScheduleKept = float64(rep.IDs-rep.BurstIDs) / (cfg.Rate * cfg.Duration.Seconds())
}

// sumFleet records what the clients and the regions counted during the
// run: refills, stalls, store operations, server-side RPC latency.
func (rep *Report) sumFleet(cfg Config, env *Env, workers []*worker, base baseline) {
	rep.ServerLatency = env.rpcLatencySince(base.latency)
	st := fleetStats(workers)
	rep.Refills = st.Refills - base.stats.Refills
	rep.RefillErrors = st.RefillErrors - base.stats.RefillErrors
	rep.Backpressure = st.Backpressure - base.stats.Backpressure
	rep.Stalls = st.Stalls - base.stats.Stalls
	rep.Store = env.counts().Sub(base.counts)
	rep.EtcdWrites = rep.Store.Writes()
	rep.EtcdWritesPerSec = float64(rep.EtcdWrites) / time.Duration(rep.Elapsed).Seconds()
}

// verify checks every ID kept and records the result (verifyErr on any
// failure).
func (rep *Report) verify(cfg Config, checker *idcheck.Checker, workers []*worker) {
	fmt.Fprintf(cfg.Progress, "bench: verifying %d IDs\n", checker.Len())
	vstart := time.Now()
	res := checker.Check()
	rep.VerifyTime = Dur(time.Since(vstart))
	// MissingCodes are the workers' first codes that minted nothing, not
	// idcheck's (every code of the fleet's regions is allowed, few are used).
	rep.Verify = VerifySummary{
		Checked: res.Checked, Unique: res.Unique, Duplicates: res.Duplicates, DuplicateExamples: res.DuplicateExamples,
		OutOfRange: res.OutOfRange, OutOfRangeExamples: res.OutOfRangeExamples, Codes: len(res.Codes),
	}
	var codesHeld uint64
	for _, w := range workers {
		rep.Verify.OutOfRange += w.foreign
		if room := idcheck.DefaultMaxExamples - len(rep.Verify.OutOfRangeExamples); room > 0 {
			rep.Verify.OutOfRangeExamples = append(rep.Verify.OutOfRangeExamples, w.foreignEx[:min(room, len(w.foreignEx))]...)
		}
		codesHeld += w.c.Stats().Acquisitions
	}
	rep.LeaseChanges = codesHeld - uint64(len(workers))
	seen := map[int]bool{}
	for _, cc := range res.Codes {
		seen[cc.Region<<snowflake.WorkerBits|cc.Worker] = true
	}
	for _, w := range workers {
		if !seen[w.code.Region<<snowflake.WorkerBits|w.code.Worker] {
			rep.Verify.MissingCodes = append(rep.Verify.MissingCodes, w.code)
		}
	}
	switch {
	case res.Checked != rep.IDs && cfg.Sink == nil:
		rep.verifyErr = errors.Newf("bench: %d IDs minted but %d checked", rep.IDs, res.Checked)
	case res.Err() != nil:
		rep.verifyErr = res.Err()
	case rep.Verify.OutOfRange > 0:
		rep.verifyErr = errors.Wrapf(idcheck.ErrOutOfRange, "%d IDs carry another region than their client's, e.g. %d (%s)",
			rep.Verify.OutOfRange, rep.Verify.OutOfRangeExamples[0].ID, rep.Verify.OutOfRangeExamples[0].Reason)
	}
	if rep.verifyErr != nil {
		rep.Verify.Problem = rep.verifyErr.Error()
	}
	fmt.Fprintf(cfg.Progress, "bench: verified %d IDs in %v: %d duplicates, %d out of range\n",
		res.Checked, time.Duration(rep.VerifyTime).Round(time.Millisecond), res.Duplicates, rep.Verify.OutOfRange)
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
			cc := clienttune.With(cfg.Client, clienttune.Tuning{FixedBlock: cfg.FixedBlock,
				PrefetchThreshold: cfg.PrefetchThreshold, RPCTimeout: cfg.RPCTimeout})
			cc.Targets = []string{reg.Addr()}
			cc.Region = reg.RegionID()
			cc.Owner = fmt.Sprintf("bench/r%d/%d", reg.RegionID(), i%cfg.Workers)
			if cc.Logger == nil {
				cc.Logger = cfg.Logger
			}
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
				code: idcheck.Code{Region: l.Region, Worker: l.Worker}, buf: make([]snowflake.ID, 0, flushEvery)}
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

// run is one worker's paced loop.
func (w *worker) run(ctx context.Context, cfg Config, begin, end time.Time, offset time.Duration, rate float64, checker *idcheck.Checker) {
	defer func() {
		w.flush(cfg, checker)
		w.minted.Store(w.n)
	}()
	if !sleepUntil(ctx, begin.Add(offset)) {
		return
	}
	t := time.NewTicker(cfg.Tick)
	defer t.Stop()
	var done int64
	nextBurst := begin.Add(offset + cfg.BurstEvery/2)
	for {
		var tick time.Time
		select {
		case <-ctx.Done():
			return
		case tick = <-t.C:
		}
		now := time.Now()
		w.late.Record(now.Sub(tick))
		last := !now.Before(end)
		if last {
			// The final tick settles what is owed up to the end exactly,
			// so a worker that kept up mints rate × Duration.
			now = end
		}
		if w.burst && !last && !now.Before(nextBurst) {
			if !w.runBurst(ctx, cfg, checker) {
				return
			}
			nextBurst = nextBurst.Add(cfg.BurstEvery)
			now = time.Now()
		}
		owed := int64(rate*now.Sub(begin).Seconds()) - done
		if last {
			now = time.Now()
		}
		for range owed {
			id, d, ok := w.next(ctx, &now)
			if !ok {
				return
			}
			w.hist.Record(d)
			w.keep(cfg, checker, id)
			done++
			if !now.After(end) {
				w.window++
			}
		}
		w.minted.Store(w.n)
		if last {
			return
		}
	}
}

// next mints one ID and times it; now is advanced to the reading after the
// call. It returns false when the run is over.
func (w *worker) next(ctx context.Context, now *time.Time) (snowflake.ID, time.Duration, bool) {
	for {
		t0 := *now
		id, err := w.c.Next(ctx)
		*now = time.Now()
		d := now.Sub(t0)
		if d > time.Millisecond {
			w.slow++
		}
		if err == nil {
			return id, d, true
		}
		if ctx.Err() != nil {
			return 0, 0, false
		}
		w.errs++
		if w.err == nil {
			w.err = err
		}
		if !rangeclient.IsRetryable(err) {
			return 0, 0, false
		}
		if !sleepUntil(ctx, now.Add(time.Millisecond)) {
			return 0, 0, false
		}
		*now = time.Now()
	}
}

// runBurst asks for BurstSize IDs back to back.
func (w *worker) runBurst(ctx context.Context, cfg Config, checker *idcheck.Checker) bool {
	start := time.Now()
	now := start
	for range cfg.BurstSize {
		id, d, ok := w.next(ctx, &now)
		if !ok {
			return false
		}
		w.hist.Record(d)
		w.burstHist.Record(d)
		w.keep(cfg, checker, id)
		w.burstIDs++
	}
	d := now.Sub(start)
	w.burstDur.Record(d)
	w.bursts++
	if d <= BurstBudget {
		w.burstsInBg++
	}
	return true
}

func (w *worker) keep(cfg Config, checker *idcheck.Checker, id snowflake.ID) {
	w.n++
	w.buf = append(w.buf, id)
	if len(w.buf) == cap(w.buf) {
		w.flush(cfg, checker)
	}
}

func (w *worker) flush(cfg Config, checker *idcheck.Checker) {
	ids := w.buf
	if cfg.Sink != nil {
		ids = cfg.Sink(w.region, w.index, ids)
	}
	for _, id := range ids {
		// A region outside the fleet is already out of range for idcheck
		// (not an expected code); count only the ones it cannot see.
		if r := id.Region(); r != w.region && r < cfg.Regions {
			w.foreign++
			if len(w.foreignEx) < 3 {
				w.foreignEx = append(w.foreignEx, idcheck.Bad{ID: int64(id),
					Reason: fmt.Sprintf("region field %d from a client of region %d", id.Region(), w.region)})
			}
		}
	}
	checker.Add(ids...)
	w.buf = w.buf[:0]
}

// sleepUntil waits until t and reports whether ctx is still live.
func sleepUntil(ctx context.Context, t time.Time) bool {
	select {
	case <-time.After(time.Until(t)):
		return true
	case <-ctx.Done():
		return false
	}
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
				now.Sub(begin).Seconds(), cfg.Duration, report.SI(float64(ids-lastIDs)/dt), report.SI(cfg.Rate), report.SI(float64(ids)),
				st.Refills-s0.Refills, st.Stalls-s0.Stalls, float64(c.Writes()-lastWrites)/dt)
			lastIDs, last, lastWrites = ids, now, c.Writes()
		}
	}
}
