// Package bench is idrange's fleet load test as a library: Run starts
// Config.Regions in-process regions (a range service each, over one
// embedded etcd with fsync on, gRPC on 127.0.0.1), Config.Workers
// rangeclients per region, paces them to Config.Rate IDs per second in
// total for Config.Duration, with a burst of 3,000 IDs from one worker
// every second, and then checks every ID minted: unique, in range, from a
// code the fleet leased.
//
// The report carries the headline figures as fields; WriteJSON and
// WriteMarkdown give all of them (latency per ID, refills, stalls, etcd
// writes, server-side latency, the verification). rangesvc bench
// (cmd/rangesvc-bench) runs the same fleet with every knob: block sweeps,
// a CPU hog, fixed blocks, prefetch, tick and burst settings.
package bench

import (
	"context"
	"io"
	"time"

	"github.com/idrange/idrange/internal/testing/benchrun"
	"github.com/idrange/idrange/internal/testing/measure"
)

// ErrVerify marks a run whose IDs failed the check (a duplicate, an ID out
// of range); Report.Err wraps it.
var ErrVerify = benchrun.ErrVerify

// Config shapes a run. Zero fields take the defaults given.
type Config struct {
	// Regions (1..4) and Workers per region (1..50,000). Defaults 4 and
	// 200. Up to a region's 256 codes each worker holds a code of its own;
	// beyond them 255 workers per region do and the rest mint through the
	// shared path (rangeclient Codes 0), sharing a few connections.
	Regions, Workers int
	// Rate is the target aggregate IDs/s. Default 2,000,000.
	Rate float64
	// Duration of the paced run. Default 10 s.
	Duration time.Duration
	// Progress, if set, receives a line every second of the run.
	Progress io.Writer
}

// Report is the outcome of a Run: the headline figures here (named as in
// the JSON), every figure in WriteJSON and WriteMarkdown.
type Report struct {
	// IDs minted during the run, bursts included.
	IDs int64 `json:"ids"`
	// AchievedRate is the paced IDs returned within the window divided by
	// Config.Duration; TargetReached is AchievedRate >= 99% of Config.Rate.
	AchievedRate  float64 `json:"achieved_rate"`
	TargetReached bool    `json:"target_reached"`

	full measure.Printer // the full report; nil in one decoded from JSON
}

// Run starts the regions and the fleet, runs it once, checks every ID and
// tears everything down. Check Report.Err: Run fails only when the fleet
// could not run (bad Config, a region or client that did not start, ctx).
func Run(ctx context.Context, cfg Config) (*Report, error) {
	full, err := benchrun.Run(ctx, benchrun.Config{
		Regions:  cfg.Regions,
		Workers:  cfg.Workers,
		Rate:     cfg.Rate,
		Duration: cfg.Duration,
		Progress: cfg.Progress,
		// The burst docs/design.md budgets, as rangesvc bench runs it.
		BurstSize: benchrun.DefaultBurstSize,
	})
	if err != nil {
		return nil, err
	}
	return &Report{IDs: full.IDs, AchievedRate: full.AchievedRate, TargetReached: full.TargetReached, full: full}, nil
}

// Err is nil when every ID verified and no Next call failed; otherwise it
// wraps ErrVerify or describes the failed calls.
func (r *Report) Err() error { return measure.Or(r.full, "bench").Err() }

// WriteJSON writes the full report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return measure.Or(r.full, "bench").WriteJSON(w) }

// WriteMarkdown writes the full report as a Markdown table.
func (r *Report) WriteMarkdown(w io.Writer) error {
	return measure.Or(r.full, "bench").WriteMarkdown(w)
}
