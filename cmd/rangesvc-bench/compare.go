package main

import (
	"context"
	"fmt"
	"io"
	"strconv"
	"strings"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/comparerun"
)

const compareUsage = `usage: rangesvc compare [flags]

Runs one workload (calls of --batch IDs) through each strategy in this
process, one after the other. Each strategy runs --duration: half on 1
goroutine, half on --goroutines. Prints a Markdown table (or JSON) on
stdout, progress on stderr. Exit 1 if any strategy failed or produced a
duplicate or out-of-range ID.

strategies (--strategies, default all, in this order):
  local             snowflake.Generator, static code, no network
                    (4,096 IDs/ms per code)
  bwmarrin          github.com/bwmarrin/snowflake, static node
                    (4,096 IDs/ms per node)
  sonyflake         github.com/sony/sonyflake/v2, static machine ID
                    (256 IDs per 10 ms: 25,600 IDs/s per machine ID)
  buffered          rangeclient against an in-process rangesvc on embedded
                    etcd (loopback gRPC): prefetched blocks
  per-id-rpc        one Next RPC per ID to that service
  segment-per-call  one AllocateBlock (one etcd write) per call
  uuidv7            github.com/google/uuid NewV7, 128 bits, random

flags:`

// runCompare is `rangesvc compare`.
func runCompare(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newReportFlags("compare", compareUsage, stderr)
	var (
		duration   = fs.Duration("duration", comparerun.DefaultDuration, "time per strategy (half at 1 goroutine, half at --goroutines)")
		ids        = fs.Int64("ids", 0, "also stop each phase after this many IDs (0: duration only)")
		goroutines = fs.Int("goroutines", comparerun.DefaultGoroutines, "goroutines of the concurrent phase")
		batch      = fs.String("batch", fmt.Sprintf("%d-%d", comparerun.DefaultBatchMin, comparerun.DefaultBatchMax), "IDs per call: N or MIN-MAX (uniform)")
		strategies = fs.String("strategies", strings.Join(defaultStrategyNames(), ","), "comma-separated strategies to run, in order")
		verifyMax  = fs.Int("verify-max", comparerun.DefaultVerifyMax, "IDs kept per strategy for the uniqueness check")
		seed       = fs.Uint64("seed", 1, "seed of the batch-size sequence")
	)
	if err := fs.parse(args); err != nil {
		return err
	}
	switch {
	case *duration <= 0:
		return cli.Usagef("--duration %v must be positive", *duration)
	case *ids < 0:
		return cli.Usagef("--ids %d is negative", *ids)
	case *goroutines < 1:
		return cli.Usagef("--goroutines %d must be at least 1", *goroutines)
	case *verifyMax < 1:
		return cli.Usagef("--verify-max %d must be at least 1", *verifyMax)
	case *seed == 0:
		return cli.Usagef("--seed must not be 0")
	}
	bmin, bmax, err := parseBatch(*batch)
	if err != nil {
		return cli.UsageError{Err: err}
	}
	strats, err := comparerun.ByName(cli.SplitList(*strategies))
	if err != nil {
		return cli.UsageError{Err: err}
	}
	cfg := comparerun.Config{
		Strategies: strats,
		Duration:   *duration,
		IDs:        *ids,
		Goroutines: *goroutines,
		BatchMin:   bmin,
		BatchMax:   bmax,
		VerifyMax:  *verifyMax,
		Seed:       *seed,
		Progress:   stderr,
	}
	if err := cfg.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	rep, err := comparerun.RunWithRegion(ctx, cfg)
	if err != nil {
		return err
	}
	if err := fs.write(stdout, rep); err != nil {
		return err
	}
	return rep.Err()
}

func defaultStrategyNames() []string {
	var out []string
	for _, s := range comparerun.Default() {
		out = append(out, s.Info().Name)
	}
	return out
}

// parseBatch reads "N" or "MIN-MAX".
func parseBatch(s string) (int, int, error) {
	lo, hi, found := strings.Cut(s, "-")
	a, err := strconv.Atoi(strings.TrimSpace(lo))
	if err != nil {
		return 0, 0, errors.Newf("--batch %q: want N or MIN-MAX", s)
	}
	b := a
	if found {
		if b, err = strconv.Atoi(strings.TrimSpace(hi)); err != nil {
			return 0, 0, errors.Newf("--batch %q: want N or MIN-MAX", s)
		}
	}
	if a < 1 || b < a || b > 4096 {
		return 0, 0, errors.Newf("--batch %q: need 1 <= MIN <= MAX <= 4096", s)
	}
	return a, b, nil
}
