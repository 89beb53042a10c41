// Package compare runs one workload through each way of minting IDs, in
// one process, one after the other, and reports them side by side: IDs per
// second and latency per call, network calls and etcd writes per million
// IDs, what each guarantees (64 or 128 bits, deterministic uniqueness,
// time order), and a uniqueness and range check of the IDs each minted.
//
// The strategies, by name: local (snowflake.Generator, static code),
// bwmarrin and sonyflake (the libraries a user would pick instead), buffered
// (rangeclient against an in-process rangesvc on embedded etcd, loopback
// gRPC), per-id-rpc (one MintBatch RPC per ID), segment-per-call (one
// AllocateBlock, one etcd write, per call) and uuidv7. Run starts the
// in-process service only when a chosen strategy needs it.
//
// Each strategy runs Config.Duration: half on one goroutine, half on
// Config.Goroutines sharing one instance. The report carries IDs per
// second as fields; WriteJSON and WriteMarkdown give every figure.
// rangesvc compare (cmd/rangesvc-bench) is the same run with a few more
// knobs (an ID cap per phase, the verification bound, the seed).
package compare

import (
	"context"
	"io"
	"time"

	"github.com/idrange/idrange/internal/testing/comparerun"
	"github.com/idrange/idrange/internal/testing/measure"
)

// ErrVerify marks a run in which some strategy produced a duplicate or an
// out-of-range ID (or one out of order where it promises order);
// Report.Err wraps it.
var ErrVerify = comparerun.ErrVerify

// Config shapes a run. Zero fields take the defaults given.
type Config struct {
	// Strategies names the strategies to run, in order. Default: all, in
	// the order of the package documentation.
	Strategies []string
	// Duration per strategy: half at 1 goroutine, half at Goroutines.
	// Default 2 s.
	Duration time.Duration
	// Goroutines of the concurrent phase. Default 8.
	Goroutines int
	// BatchMin and BatchMax bound the IDs per call (uniform). Defaults 1
	// and 16.
	BatchMin, BatchMax int
	// Progress, if set, receives a line per phase.
	Progress io.Writer
}

// Report is the outcome of a Run: IDs per second here (named as in the
// JSON), every figure in WriteJSON and WriteMarkdown.
type Report struct {
	// Results are the strategies' in the order run.
	Results []Result `json:"results"`

	full measure.Printer // the full report; nil in one decoded from JSON
}

// Result is one strategy's headline figures.
type Result struct {
	Name string `json:"name"`
	// Single and Multi are the 1-goroutine and Config.Goroutines phases.
	Single Phase `json:"single"`
	Multi  Phase `json:"multi"`
}

// Phase is one run of the workload at a fixed goroutine count.
type Phase struct {
	IDsPerSec float64 `json:"ids_per_sec"`
}

// Run runs every strategy in turn and returns the report. A strategy that
// fails is reported and the run goes on; Run itself fails only on a bad
// Config, a service that did not start, or when ctx ends. Check
// Report.Err.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	var strats []comparerun.Strategy
	if cfg.Strategies != nil {
		var err error
		if strats, err = comparerun.ByName(cfg.Strategies); err != nil {
			return nil, err
		}
	}
	full, err := comparerun.RunWithRegion(ctx, comparerun.Config{
		Strategies: strats,
		Duration:   cfg.Duration,
		Goroutines: cfg.Goroutines,
		BatchMin:   cfg.BatchMin,
		BatchMax:   cfg.BatchMax,
		Progress:   cfg.Progress,
	})
	if err != nil {
		return nil, err
	}
	rep := &Report{full: full}
	for _, r := range full.Results {
		rep.Results = append(rep.Results, Result{Name: r.Name,
			Single: Phase{IDsPerSec: r.Single.IDsPerSec}, Multi: Phase{IDsPerSec: r.Multi.IDsPerSec}})
	}
	return rep, nil
}

// Err is nil when every strategy ran and verified the IDs it minted (at
// least one: an empty check proves nothing); otherwise it names the first
// that did not (wrapping ErrVerify for a failed or empty check).
func (r *Report) Err() error { return measure.Or(r.full, "compare").Err() }

// WriteJSON writes the full report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return measure.Or(r.full, "compare").WriteJSON(w) }

// WriteMarkdown writes the full report as Markdown: throughput and latency
// per strategy and goroutine count, costs and properties, the headline
// ratios.
func (r *Report) WriteMarkdown(w io.Writer) error {
	return measure.Or(r.full, "compare").WriteMarkdown(w)
}
