package benchrun

import (
	"fmt"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/measure"
)

// Report is the outcome of a Run.
type Report struct {
	Machine measure.Machine `json:"machine"`
	Started time.Time       `json:"started"`
	Fleet   Fleet           `json:"fleet"`

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
	// CPUByRole is CPUCores by part (sampled by the CPU profile of the
	// paced run, cpurole.go): replica (the range services), client (the
	// rangeclients), pacer (the workers minting and keeping every ID),
	// etcd, other. Empty when the profile could not be taken.
	CPUByRole map[string]float64 `json:"cpu_by_role,omitempty"`
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
	Latency measure.Summary `json:"latency_per_id"`
	// TickLateness is how late workers received their pacing ticks: large
	// values mean the machine could not keep up with the schedule.
	TickLateness measure.Summary `json:"tick_lateness"`
	Burst        Burst           `json:"burst"`

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
	// EtcdTxnsPerSec is Store.Txns (raft proposals) over Elapsed.
	EtcdTxnsPerSec float64 `json:"etcd_txns_per_sec"`
	// SharedGrants is the shared runs the replicas granted during the run,
	// alone (AllocateShared) or in batches (AllocateSharedBatch, whose
	// calls ServerLatency times: several runs each).
	SharedGrants uint64 `json:"shared_grants"`
	// SharedClients is the workers minting from the shared path at the end
	// of the run; SharedTookCode the Codes-0 workers that took a code of
	// their own (their rate needed one, docs/design.md).
	SharedClients  int `json:"shared_clients"`
	SharedTookCode int `json:"shared_took_code"`
	// ServerLatency is the services' own time per RPC method during the
	// run (all regions), store included: where a stall came from.
	ServerLatency map[string]measure.Summary `json:"server_latency"`
	// GrantLatency is the round trip of the Codes-0 workers' grants per RPC
	// method as they saw it (queueing on the shared connections and
	// scheduling included), during the run. Workers with a code of their
	// own dial by themselves and are not timed here.
	GrantLatency map[string]measure.Summary `json:"grant_latency,omitempty"`
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
	// Dedicated is the workers per region with a code of their own
	// (Codes 1); the other Workers - Dedicated use Codes 0 over
	// SharedConns connections per region (Config.Conns, the many-clients
	// mode; 0 otherwise).
	Dedicated   int `json:"dedicated_workers_per_region"`
	SharedConns int `json:"shared_conns_per_region,omitempty"`
	// SharedRate is the replicas' shared-path bound per identity, IDs/s
	// (the many-clients mode; 0 otherwise).
	SharedRate float64 `json:"shared_rate,omitempty"`
}

// Burst summarises the burst profile.
type Burst struct {
	Size         int             `json:"size"`
	Count        int             `json:"count"`
	WithinBudget int             `json:"within_1ms"`
	Duration     measure.Summary `json:"duration"`
	Latency      measure.Summary `json:"latency_per_id"`
}

// VerifySummary is the idcheck result without the per-code list.
type VerifySummary struct {
	Checked            int64               `json:"checked"`
	Unique             int64               `json:"unique"`
	Duplicates         int64               `json:"duplicates"`
	DuplicateExamples  []measure.Duplicate `json:"duplicate_examples,omitempty"`
	OutOfRange         int64               `json:"out_of_range"`
	OutOfRangeExamples []measure.Bad       `json:"out_of_range_examples,omitempty"`
	Codes              int                 `json:"codes"`
	MissingCodes       []measure.Code      `json:"missing_codes,omitempty"`
	// IdleSharedWorkers counts Codes-0 workers that minted nothing (they
	// have no code of their own to list in MissingCodes).
	IdleSharedWorkers int    `json:"idle_shared_workers,omitempty"`
	Problem           string `json:"problem,omitempty"`
}

// Dur is a time.Duration that marshals as text ("1.5s"); see measure.Dur.
type Dur = measure.Dur

// Err is nil when every ID verified and no call failed; otherwise it wraps
// ErrVerify (with the checker's sentinel) or describes the failed calls.
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

// newReport is the report of a run of cfg before anything ran.
func newReport(cfg Config) *Report {
	n := cfg.Regions * cfg.Workers
	rep := &Report{
		Machine: measure.CurrentMachine(),
		Started: time.Now().UTC(),
		Fleet: Fleet{
			Regions: cfg.Regions, Workers: cfg.Workers, TargetRate: cfg.Rate,
			PerWorkerRate: cfg.Rate / float64(n), Duration: Dur(cfg.Duration), Tick: Dur(cfg.Tick),
			Etcd: etcdLayout(cfg), RefillInterval: Dur(cfg.RefillInterval), FixedBlock: cfg.FixedBlock,
			CPUHog: cfg.CPUHog, Dedicated: cfg.DedicatedWorkers(),
		},
	}
	if cfg.SharedPath() {
		rep.Fleet.SharedConns = cfg.Conns
		rep.Fleet.SharedRate = cfg.SharedRate
	}
	if rep.Fleet.RefillInterval == 0 {
		rep.Fleet.RefillInterval = Dur(engine.DefaultRefillInterval)
	}
	return rep
}

// sumWorkers adds up what the workers measured: IDs, latency, errors,
// bursts and the rates.
func (rep *Report) sumWorkers(cfg Config, workers []*worker, ls []*latencies) {
	var lat, late, bh, bd measure.Histogram
	for _, l := range ls {
		lat.Merge(&l.hist)
		late.Merge(&l.late)
	}
	var inWindow int64
	for _, w := range workers {
		rep.IDs += w.minted.Load()
		inWindow += w.window
		rep.SlowCalls += w.slow
		rep.Errors += w.errs
		if w.err != nil && rep.FirstError == "" {
			rep.FirstError = fmt.Sprintf("r%d/w%d: %v", w.code.Region, w.code.Worker, w.err)
			if w.shared {
				rep.FirstError = fmt.Sprintf("r%d/client %d (Codes 0): %v", w.region, w.index, w.err)
			}
		}
		if b := w.burst; b != nil {
			bh.Merge(&b.hist)
			bd.Merge(&b.dur)
			rep.Burst.Count += b.count
			rep.BurstIDs += b.ids
			rep.Burst.WithinBudget += b.inBudget
		}
	}
	rep.Latency, rep.TickLateness = lat.Summary(), late.Summary()
	rep.Burst.Size, rep.Burst.Latency, rep.Burst.Duration = cfg.BurstSize, bh.Summary(), bd.Summary()
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
	rep.EtcdTxnsPerSec = float64(rep.Store.Txns) / time.Duration(rep.Elapsed).Seconds()
	rep.SharedGrants = rep.Store.SharedRuns
	for _, w := range workers {
		if w.c.Stats().Shared {
			rep.SharedClients++
		}
	}
}

// sharedMethod and sharedBatchMethod are the RPCs of the shared path, as
// ServerLatency names them.
const (
	sharedMethod      = "AllocateShared"
	sharedBatchMethod = "AllocateSharedBatch"
)
