// Package comparerun is the engine of compare: it runs one workload through
// each way of minting IDs, in one process and one run, and reports them
// side by side: what each costs per ID, in time, network calls and etcd
// writes, and what it guarantees.
//
// The strategies (see Default):
//
//   - local: snowflake.Generator with a statically assigned code, no network;
//   - bwmarrin and sonyflake: the libraries a user would pick instead,
//     github.com/bwmarrin/snowflake (4,096 IDs/ms per node) and
//     github.com/sony/sonyflake/v2 (256 IDs per 10 ms, 25,600/s, per
//     machine ID), each with a static node or machine ID, run as they ship;
//   - buffered: rangeclient against a real rangesvc (embedded etcd, loopback
//     gRPC): blocks of (timestamp, sequence) space prefetched in the
//     background, an in-memory step per ID;
//   - per-id-rpc: one MintBatch(count=1) RPC per ID to the central service, the design
//     docs/design.md rules out, measured to show why;
//   - segment-per-call: a naive client that asks the service for a fresh
//     block (AllocateBlock) for every call of 1–16 IDs;
//   - uuidv7: github.com/google/uuid NewV7, 128 bits, no coordination.
//
// The workload is a stream of calls, each for k IDs with k drawn from a
// fixed pseudo-random sequence uniform on [BatchMin, BatchMax] (the same
// sequence for every strategy). Each strategy runs the stream first on one
// goroutine, then on N goroutines sharing one instance (one code, one
// connection, like the goroutines of one process). Latency is per call, as
// the caller sees it, recorded in a log-linear histogram. Network calls are
// counted by a client interceptor, etcd writes by a counter on the service's
// store (successful grants, acquisitions and releases), and every 64-bit ID
// (up to Config.VerifyMax per strategy) is checked unique and in range with
// internal/testing/measure (a peer's IDs for uniqueness, and their timestamps, as
// the library decodes them, for range).
//
// The figures include the harness: two clock readings and a histogram
// record per call (about 50 ns on a current core), which dominates the local
// strategies' cost per call. Ratios are against local minting at the same
// goroutine count.
package comparerun

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/snowflake"
)

// Defaults for zero Config fields.
const (
	DefaultDuration   = 2 * time.Second
	DefaultGoroutines = 8
	DefaultBatchMin   = 1
	DefaultBatchMax   = 16
	// DefaultVerifyMax bounds the IDs kept per strategy for the uniqueness
	// check (8 bytes each): 16M is 128 MiB at most.
	DefaultVerifyMax = 16 << 20
)

// ErrVerify marks a run in which some strategy produced a duplicate or an
// out-of-range ID (or an ID out of order where it promises order).
var ErrVerify = errors.New("compare: verification failed")

// Region is the range service the network strategies talk to.
// internal/server/region.Region implements it.
type Region interface {
	// RegionID is the region code the service serves.
	RegionID() int
	// Addr is the service's gRPC address (host:port on loopback).
	Addr() string
	// EtcdWrites counts successful writing store operations so far (block
	// grants, lease acquisitions and releases).
	EtcdWrites() uint64
	// EnableNext installs a minter behind the service's MintBatch and Next RPCs until
	// stop is called.
	EnableNext(ctx context.Context) (stop func() error, err error)
}

// Config configures a Run. Zero fields take the defaults above.
type Config struct {
	// Strategies to run, in order. Default: Default().
	Strategies []Strategy
	// Region serves the network strategies. Run requires it if any
	// strategy has Info.NeedsRegion; RunWithRegion starts one if needed.
	Region Region
	// Duration bounds each strategy: half for the 1-goroutine phase, half
	// for the N-goroutine phase. Default 2 s.
	Duration time.Duration
	// IDs, when > 0, also bounds each phase to this many IDs (whichever of
	// Duration and IDs comes first ends it).
	IDs int64
	// Goroutines is N for the concurrent phase. Default 8.
	Goroutines int
	// BatchMin and BatchMax bound the IDs per call. Defaults 1 and 16.
	BatchMin, BatchMax int
	// VerifyMax bounds the IDs kept for the uniqueness check per strategy;
	// the report says how many were checked. Default 16Mi.
	VerifyMax int
	// Seed fixes the batch-size sequence (default 1).
	Seed uint64
	// Progress, if set, receives one line per phase.
	Progress io.Writer
}

func (c Config) withDefaults() Config {
	if c.Strategies == nil {
		c.Strategies = Default()
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Goroutines == 0 {
		c.Goroutines = DefaultGoroutines
	}
	if c.BatchMin == 0 {
		c.BatchMin = DefaultBatchMin
	}
	if c.BatchMax == 0 {
		c.BatchMax = max(DefaultBatchMax, c.BatchMin)
	}
	if c.VerifyMax == 0 {
		c.VerifyMax = DefaultVerifyMax
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate reports the first bad field (after defaults). A missing Region
// is not one: Run refuses it, RunWithRegion starts one.
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case len(c.Strategies) == 0:
		return errors.New("compare: no strategies")
	case c.Duration < 10*time.Millisecond:
		return errors.Newf("compare: Duration %v is below 10ms", c.Duration)
	case c.IDs < 0:
		return errors.Newf("compare: IDs %d is negative", c.IDs)
	case c.Goroutines < 1 || c.Goroutines > 4096:
		return errors.Newf("compare: Goroutines %d not in 1..4096", c.Goroutines)
	case c.BatchMin < 1 || c.BatchMax < c.BatchMin || c.BatchMax > 4096:
		return errors.Newf("compare: batch %d..%d must satisfy 1 <= min <= max <= 4096", c.BatchMin, c.BatchMax)
	case c.VerifyMax < 0:
		return errors.Newf("compare: VerifyMax %d is negative", c.VerifyMax)
	}
	seen := map[string]bool{}
	for i, s := range c.Strategies {
		info := s.Info()
		if info.Name == "" || seen[info.Name] {
			return errors.Newf("compare: strategy %d has an empty or repeated name %q", i, info.Name)
		}
		seen[info.Name] = true
	}
	return nil
}

// needsRegion is the first strategy of c that talks to the range service,
// or "" when none does.
func (c Config) needsRegion() string {
	for _, s := range c.withDefaults().Strategies {
		if info := s.Info(); info.NeedsRegion {
			return info.Name
		}
	}
	return ""
}

// Report is the outcome of a Run.
type Report struct {
	Machine    measure.Machine `json:"machine"`
	Started    time.Time       `json:"started"`
	Duration   Dur             `json:"duration_per_strategy"`
	IDsCap     int64           `json:"ids_per_phase_cap,omitempty"`
	Goroutines int             `json:"goroutines"`
	BatchMin   int             `json:"batch_min"`
	BatchMax   int             `json:"batch_max"`
	Results    []Result        `json:"results"`
}

// Result is one strategy's figures.
type Result struct {
	Info
	// Single and Multi are the 1-goroutine and N-goroutine phases.
	Single Phase `json:"single"`
	Multi  Phase `json:"multi"`
	// Per 1M IDs over both phases and the strategy's start-up (leases,
	// first block): what an operator pays.
	RPCsPer1M       float64 `json:"rpcs_per_1m_ids"`
	EtcdWritesPer1M float64 `json:"etcd_writes_per_1m_ids"`
	// WireBytesPerID is gRPC payload bytes (both directions, with gRPC
	// framing, without HTTP/2 and TCP overhead) per ID.
	WireBytesPerID float64 `json:"wire_bytes_per_id"`
	// RatioSingle and RatioMulti are IDs/s divided by local minting's at
	// the same goroutine count (0 when local did not run).
	RatioSingle float64 `json:"ratio_vs_local_single"`
	RatioMulti  float64 `json:"ratio_vs_local_multi"`
	// Verify is the uniqueness and range check of the kept IDs.
	Verify Verify `json:"verify"`
	// Error is set when the strategy failed to start or a call failed.
	Error string `json:"error,omitempty"`
}

// Verify is what the check of one strategy found.
type Verify struct {
	Checked    int64  `json:"checked"`
	Minted     int64  `json:"minted"`
	Duplicates int64  `json:"duplicates"`
	OutOfRange int64  `json:"out_of_range"`
	Problem    string `json:"problem,omitempty"`
}

// Phase is one run of the workload at a fixed goroutine count.
type Phase struct {
	Goroutines int             `json:"goroutines"`
	IDs        int64           `json:"ids"`
	Calls      int64           `json:"calls"`
	Elapsed    Dur             `json:"elapsed"`
	IDsPerSec  float64         `json:"ids_per_sec"`
	Latency    measure.Summary `json:"latency_per_call"`
	RPCs       uint64          `json:"rpcs"`
	EtcdWrites uint64          `json:"etcd_writes"`
	// OrderViolations counts IDs not greater than the previous ID the same
	// goroutine received (a time-ordered strategy has none).
	OrderViolations int64 `json:"order_violations"`
	// MaxLeadMs and MaxLagMs are the largest amounts by which an ID's
	// timestamp was ahead of / behind the wall clock when it was returned.
	MaxLeadMs int64 `json:"max_lead_ms"`
	MaxLagMs  int64 `json:"max_lag_ms"`
	// Waits counts calls that had to wait inside the strategy: the local
	// generator's sequence exhaustion (all 4,096 IDs of a millisecond used,
	// wait for the next), the buffered client's stalls (no block ready).
	Waits uint64 `json:"waits"`
}

// Dur is a time.Duration that marshals as text ("1.5s"); see measure.Dur.
type Dur = measure.Dur

// Err is nil when every strategy ran and verified at least one ID;
// otherwise it names the first that did not (wrapping ErrVerify for a
// failed check, and for a strategy that checked nothing: an empty check
// proves nothing).
func (r *Report) Err() error {
	for _, res := range r.Results {
		if res.Verify.Duplicates > 0 || res.Verify.OutOfRange > 0 || (res.TimeOrdered && res.Single.OrderViolations+res.Multi.OrderViolations > 0) {
			return errors.Wrapf(ErrVerify, "strategy %s: %d duplicates, %d out of range, %d order violations among %d checked: %s",
				res.Name, res.Verify.Duplicates, res.Verify.OutOfRange, res.Single.OrderViolations+res.Multi.OrderViolations,
				res.Verify.Checked, res.Verify.Problem)
		}
		if res.Error != "" {
			return errors.Newf("compare: strategy %s: %s", res.Name, res.Error)
		}
		if res.Verify.Checked == 0 {
			return errors.Wrapf(ErrVerify, "strategy %s: no IDs checked (%d minted): %s", res.Name, res.Verify.Minted, res.Verify.Problem)
		}
	}
	return nil
}

// Result returns the result of the named strategy, or nil.
func (r *Report) Result(name string) *Result {
	for i := range r.Results {
		if r.Results[i].Name == name {
			return &r.Results[i]
		}
	}
	return nil
}

// Run runs every strategy in turn and returns the report. A strategy that
// fails is reported (Result.Error) and the run goes on; Run itself fails
// only on bad configuration or when ctx ends. Check Report.Err.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if name := cfg.needsRegion(); name != "" && cfg.Region == nil {
		return nil, errors.Newf("compare: strategy %q needs Config.Region", name)
	}
	cfg = cfg.withDefaults()
	rep := &Report{
		Machine:    measure.CurrentMachine(),
		Started:    time.Now().UTC(),
		Duration:   Dur(cfg.Duration),
		IDsCap:     cfg.IDs,
		Goroutines: cfg.Goroutines,
		BatchMin:   cfg.BatchMin,
		BatchMax:   cfg.BatchMax,
	}
	for _, s := range cfg.Strategies {
		if err := ctx.Err(); err != nil {
			return rep, err
		}
		res := runStrategy(ctx, cfg, s)
		rep.Results = append(rep.Results, res)
		runtime.GC() // the kept IDs of one strategy must not slow the next
	}
	if local := rep.Result(LocalName); local != nil {
		for i := range rep.Results {
			r := &rep.Results[i]
			if local.Single.IDsPerSec > 0 {
				r.RatioSingle = r.Single.IDsPerSec / local.Single.IDsPerSec
			}
			if local.Multi.IDsPerSec > 0 {
				r.RatioMulti = r.Multi.IDsPerSec / local.Multi.IDsPerSec
			}
		}
	}
	return rep, ctx.Err()
}

func runStrategy(ctx context.Context, cfg Config, s Strategy) Result {
	res := Result{Info: s.Info()}
	fmt.Fprintf(cfg.Progress, "compare: %-16s starting\n", res.Name)
	var writes0 uint64
	if cfg.Region != nil {
		writes0 = cfg.Region.EtcdWrites()
	}
	inst, err := s.Start(ctx, Env{Region: cfg.Region})
	if err != nil {
		res.Error = fmt.Sprintf("start: %v", err)
		fmt.Fprintf(cfg.Progress, "compare: %-16s failed to start: %v\n", res.Name, err)
		return res
	}
	v, err := newVerifier(s)
	if err != nil {
		res.Error = fmt.Sprintf("verifier: %v", err)
		_ = inst.Close()
		return res
	}
	keep := cfg.VerifyMax
	var callErr error
	for i, g := range []int{1, cfg.Goroutines} {
		ph, err := runPhase(ctx, cfg, inst, g, cfg.Duration/2, keep/2, v, uint64(i))
		if i == 0 {
			res.Single = ph
		} else {
			res.Multi = ph
		}
		fmt.Fprintf(cfg.Progress, "compare: %-16s %4d goroutine(s): %12.0f IDs/s  p99 %-10v %d IDs\n",
			res.Name, g, ph.IDsPerSec, ph.Latency.P99, ph.IDs)
		if err != nil {
			callErr = err
			break
		}
	}
	total := res.Single.IDs + res.Multi.IDs
	rpc := inst.Calls()
	if cerr := inst.Close(); cerr != nil && callErr == nil {
		callErr = errors.Wrap(cerr, "close")
	}
	var writes uint64
	if cfg.Region != nil {
		writes = cfg.Region.EtcdWrites() - writes0
	}
	if total > 0 {
		res.RPCsPer1M = float64(rpc.Calls) * 1e6 / float64(total)
		res.EtcdWritesPer1M = float64(writes) * 1e6 / float64(total)
		res.WireBytesPerID = float64(rpc.SentBytes+rpc.RecvBytes) / float64(total)
	}
	res.Verify = v.result(res.Bits)
	res.Verify.Minted = total
	if callErr != nil {
		res.Error = callErr.Error()
	}
	return res
}

// Waiter is implemented by instances that count internal waits (see
// Phase.Waits).
type Waiter interface {
	Waits() uint64
}

func waitsOf(inst Instance) uint64 {
	if w, ok := inst.(Waiter); ok {
		return w.Waits()
	}
	return 0
}

// batchSizes is the deterministic stream of call sizes.
type batchSizes struct {
	r        *rand.Rand
	min, spn int
}

func newBatchSizes(seed, stream uint64, lo, hi int) *batchSizes {
	return &batchSizes{r: rand.New(rand.NewPCG(seed, stream)), min: lo, spn: hi - lo + 1}
}

func (b *batchSizes) next() int { return b.min + b.r.IntN(b.spn) }

// goroutineResult is what one goroutine of a phase measured.
type goroutineResult struct {
	hist            measure.Histogram
	ids, calls      int64
	order           int64
	maxLead, maxLag int64
	err             error
	kept            []snowflake.ID
	keptU           [][16]byte
	lastID          snowflake.ID
	lastU           [16]byte
	haveLast        bool
	keepCap         int
}

func runPhase(ctx context.Context, cfg Config, inst Instance, g int, d time.Duration, keep int,
	v *verifier, phase uint64) (Phase, error) {
	ph := Phase{Goroutines: g}
	rpc0 := inst.Calls()
	waits0 := waitsOf(inst)
	var w0 uint64
	if cfg.Region != nil {
		w0 = cfg.Region.EtcdWrites()
	}
	quota := int64(0)
	if cfg.IDs > 0 {
		quota = max(1, cfg.IDs/int64(g))
	}
	results := make([]*goroutineResult, g)
	workers := make([]Worker, g)
	for i := range g {
		workers[i] = inst.Worker()
		results[i] = &goroutineResult{keepCap: keep / g}
	}
	runtime.GC()
	start := time.Now()
	deadline := start.Add(d)
	pctx, cancel := context.WithDeadline(ctx, deadline.Add(5*time.Second)) // a stuck call must not hang the run
	defer cancel()
	done := make(chan struct{})
	for i := range g {
		go func() {
			defer func() { done <- struct{}{} }()
			runGoroutine(pctx, workers[i], results[i], newBatchSizes(cfg.Seed, phase<<32|uint64(i), cfg.BatchMin, cfg.BatchMax), deadline, quota, v.unixMs)
		}()
	}
	for range g {
		<-done
	}
	ph.Elapsed = Dur(time.Since(start))
	var hist measure.Histogram
	var firstErr error
	for _, r := range results {
		hist.Merge(&r.hist)
		ph.IDs += r.ids
		ph.Calls += r.calls
		ph.OrderViolations += r.order
		ph.MaxLeadMs = max(ph.MaxLeadMs, r.maxLead)
		ph.MaxLagMs = max(ph.MaxLagMs, r.maxLag)
		if r.err != nil && firstErr == nil {
			firstErr = r.err
		}
		v.add(r.kept, r.keptU)
	}
	ph.Latency = hist.Summary()
	if s := time.Duration(ph.Elapsed).Seconds(); s > 0 {
		ph.IDsPerSec = float64(ph.IDs) / s
	}
	ph.RPCs = inst.Calls().Calls - rpc0.Calls
	ph.Waits = waitsOf(inst) - waits0
	if cfg.Region != nil {
		ph.EtcdWrites = cfg.Region.EtcdWrites() - w0
	}
	return ph, firstErr
}

func runGoroutine(ctx context.Context, w Worker, r *goroutineResult, sizes *batchSizes, deadline time.Time, quota int64,
	unixMs func(snowflake.ID) int64) {
	var out Batch
	now := time.Now()
	for now.Before(deadline) && (quota == 0 || r.ids < quota) {
		k := sizes.next()
		out.IDs, out.UUIDs = out.IDs[:0], out.UUIDs[:0]
		t0 := now
		err := w.Mint(ctx, k, &out)
		now = time.Now()
		r.hist.Record(now.Sub(t0))
		r.calls++
		n := len(out.IDs) + len(out.UUIDs)
		r.ids += int64(n)
		if err == nil && n != k {
			err = errors.Newf("compare: asked for %d IDs, got %d", k, n)
		}
		nowMs := now.UnixMilli()
		t0Ms := t0.UnixMilli()
		for _, id := range out.IDs {
			if r.haveLast && id <= r.lastID {
				r.order++
			}
			r.lastID, r.haveLast = id, true
		}
		if len(out.IDs) > 0 {
			r.note(unixMs(out.IDs[0]), t0Ms, nowMs)
			r.note(unixMs(out.IDs[len(out.IDs)-1]), t0Ms, nowMs)
			if room := r.keepCap - len(r.kept); room > 0 {
				r.kept = append(r.kept, out.IDs[:min(room, len(out.IDs))]...)
			}
		}
		for _, u := range out.UUIDs {
			if r.haveLast && !lessU(r.lastU, u) {
				r.order++
			}
			r.lastU, r.haveLast = u, true
		}
		if len(out.UUIDs) > 0 {
			r.note(uuidMs(out.UUIDs[0]), t0Ms, nowMs)
			if room := r.keepCap - len(r.keptU); room > 0 {
				r.keptU = append(r.keptU, out.UUIDs[:min(room, len(out.UUIDs))]...)
			}
		}
		if err != nil {
			r.err = err
			return
		}
	}
}

// note records how far an ID's timestamp ms lies outside [t0Ms, nowMs].
func (r *goroutineResult) note(ms, t0Ms, nowMs int64) {
	if ms > nowMs {
		r.maxLead = max(r.maxLead, ms-nowMs)
	}
	if ms < t0Ms {
		r.maxLag = max(r.maxLag, t0Ms-ms)
	}
}

// verifier checks the IDs one strategy kept: 64-bit IDs with idcheck
// (uniqueness and, in snowflake's layout, every field's range; in a peer's
// layout, uniqueness and the sign bit there and the timestamp's range
// here, through TimeDecoder), UUIDs by sorting.
type verifier struct {
	ids        *measure.Checker
	uuids      uuidSet
	timestamp  func(int64) time.Time // nil: snowflake's layout
	lo, hi     time.Time             // allowed creation times
	outOfRange int64                 // peer IDs whose time is outside [lo, hi]
	example    string                // the first of them
}

func newVerifier(s Strategy) (*verifier, error) {
	now := time.Now()
	v := &verifier{lo: now.Add(-time.Hour), hi: now.Add(time.Hour)} // a lead beyond MaxLead (15 s) is a bug
	if d, ok := s.(TimeDecoder); ok {
		v.timestamp = d.IDTime
	}
	cfg := measure.CheckConfig{NotBefore: v.lo, NotAfter: v.hi}
	if v.timestamp != nil {
		cfg = measure.CheckConfig{} // another layout: the checker's field checks do not apply
	}
	var err error
	v.ids, err = measure.NewChecker(cfg)
	return v, err
}

// unixMs is the Unix millisecond an ID's timestamp names.
func (v *verifier) unixMs(id snowflake.ID) int64 {
	if v.timestamp != nil {
		return v.timestamp(int64(id)).UnixMilli()
	}
	return snowflake.MsTime(id.Ms()).UnixMilli()
}

func (v *verifier) add(ids []snowflake.ID, uuids [][16]byte) {
	v.ids.Add(ids...)
	v.uuids.add(uuids)
	if v.timestamp == nil {
		return
	}
	for _, id := range ids {
		if t := v.timestamp(int64(id)); t.Before(v.lo) || t.After(v.hi) {
			if v.outOfRange == 0 {
				v.example = fmt.Sprintf("id %d names %s, outside %s..%s", int64(id), t.Format(time.RFC3339Nano),
					v.lo.Format(time.RFC3339), v.hi.Format(time.RFC3339))
			}
			v.outOfRange++
		}
	}
}

// result checks what was added (Minted is left to the caller).
func (v *verifier) result(bits int) Verify {
	var out Verify
	if bits != 64 {
		out.Checked, out.Duplicates = v.uuids.check()
		if out.Duplicates > 0 {
			out.Problem = fmt.Sprintf("%d duplicate UUIDs", out.Duplicates)
		}
		return out
	}
	r := v.ids.Check()
	out.Checked, out.Duplicates, out.OutOfRange = r.Checked, r.Duplicates, r.OutOfRange+v.outOfRange
	if err := r.Err(); err != nil {
		out.Problem = err.Error() // "no ids checked" too: Report.Err fails on it
	}
	if v.outOfRange > 0 {
		out.Problem = strings.TrimPrefix(out.Problem+"; ", "; ") + fmt.Sprintf("%d IDs out of time range: %s", v.outOfRange, v.example)
	}
	return out
}
