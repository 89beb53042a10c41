package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/benchrun"
	"github.com/idrange/idrange/rangeclient"
)

const benchUsage = `usage: rangesvc bench [flags]

Runs the fleet load test in this process: --regions x --workers rangeclients
(default 4 x 200), each over loopback gRPC to its region's in-process
rangesvc (one embedded etcd shared by all regions unless --etcd-per-region),
paced to --rate IDs/s in total for --duration, plus a burst of --burst IDs
from one worker every --burst-every. Many clients: beyond a region's 256
codes (or with --auto-codes for all) workers use rangeclient Codes 0, the
shared path the replicas serve from their Next minter, over --conns shared
connections per region (e.g. --regions 1 --workers 10000). --cpu-hog N keeps N cores busy in a
child process during the run, to reproduce an overloaded machine. Every ID is verified unique and in
range at the end; exit 1 on any duplicate or out-of-range ID (and, with
--fail-on-errors, on failed Next calls, which are otherwise reported).
With --sweep, runs once per block size instead and writes a chart.

Prints a Markdown table (or JSON) on stdout, a progress line every second
on stderr.

flags:`

// runBench is `rangesvc bench`.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newReportFlags("bench", benchUsage, stderr)
	var (
		regions       = fs.Int("regions", benchrun.DefaultRegions, "regions (1..4)")
		workers       = fs.Int("workers", benchrun.DefaultWorkers, fmt.Sprintf("workers (rangeclients) per region (1..%d); beyond 256, the workers past the 255th use the shared path (Codes 0)", benchrun.MaxWorkers))
		autoCodes     = fs.Bool("auto-codes", false, "every worker uses rangeclient Codes 0 (the shared path; a code only when its rate needs one)")
		conns         = fs.Int("conns", benchrun.DefaultConns, "gRPC connections per region shared by the Codes-0 workers")
		sharedRate    = fs.Float64("shared-rate", 0, "the replicas' shared-path bound per identity, IDs/s (rangesvc serve --shared-rate; 0: its default)")
		rate          = fs.Float64("rate", benchrun.DefaultRate, "target aggregate IDs/s")
		duration      = fs.Duration("duration", benchrun.DefaultDuration, "paced run time (per point with --sweep)")
		tick          = fs.Duration("tick", 0, "pacing interval of each worker (0: 50ms, longer beyond 800 workers in all, at most 250ms)")
		burst         = fs.Int("burst", benchrun.DefaultBurstSize, "IDs one worker asks for back to back (0: no burst)")
		burstEvery    = fs.Duration("burst-every", benchrun.DefaultBurstEvery, "interval between bursts")
		refill        = fs.Duration("refill-interval", rangeclient.DefaultRefillInterval, "rangeclient RefillInterval (block span)")
		fixedBlock    = fs.Int("block", 0, "rangeclient block size in linear units (0: adaptive)")
		prefetch      = fs.Float64("prefetch", engine.DefaultPrefetchThreshold, "rangeclient prefetch threshold (0, 1]")
		rpcTimeout    = fs.Duration("rpc-timeout", engine.DefaultRPCTimeout, "rangeclient RPC timeout (each lease/refill call)")
		idleTimeout   = fs.Duration("idle-timeout", engine.DefaultIdleTimeout, "rangeclient idleness: stop refilling after this long without a minted ID")
		failOnErrors  = fs.Bool("fail-on-errors", false, "exit 1 also when Next calls failed (default: only on a verification failure)")
		etcdPerRegion = fs.Bool("etcd-per-region", false, "one embedded etcd per region instead of one shared")
		cpuHog        = fs.Int("cpu-hog", 0, fmt.Sprintf("cores a child process keeps busy during the run, to reproduce overload (0..%d; 0: off)", benchrun.MaxCPUHog()))
		sweep         = fs.Bool("sweep", false, "run once per block size (--sweep-blocks) and chart the results")
		sweepBlocks   = fs.String("sweep-blocks", joinInts(benchrun.DefaultSweepBlocks), "comma-separated block sizes (linear units) for --sweep")
		out           = fs.String("out", "", "with --sweep: directory for sweep.svg, sweep.md, sweep.json")
		setupTimeout  = fs.Duration("setup-timeout", 2*time.Minute, "bound on starting all clients (per point with --sweep)")
		cpuProfile    = fs.String("cpuprofile", "", "write a CPU profile of the paced run to this file (samples labelled by role: go tool pprof -tags)")
		logLevel      = fs.String("log", "", "log clients and services to stderr at this level (debug, info, warn, error); default off")
	)
	if err := fs.parse(args); err != nil {
		return err
	}
	switch {
	case *regions < 1:
		return cli.Usagef("--regions %d must be at least 1", *regions)
	case *workers < 1:
		return cli.Usagef("--workers %d must be at least 1", *workers)
	case !(*rate > 0):
		return cli.Usagef("--rate %v must be positive", *rate)
	case *duration <= 0:
		return cli.Usagef("--duration %v must be positive", *duration)
	case *tick < 0:
		return cli.Usagef("--tick %v is negative (0: automatic)", *tick)
	case *burst < 0:
		return cli.Usagef("--burst %d is negative", *burst)
	case *burstEvery <= 0:
		return cli.Usagef("--burst-every %v must be positive", *burstEvery)
	case *refill <= 0:
		return cli.Usagef("--refill-interval %v must be positive", *refill)
	case *fixedBlock < 0:
		return cli.Usagef("--block %d is negative", *fixedBlock)
	case !(*prefetch > 0 && *prefetch <= 1):
		return cli.Usagef("--prefetch %v not in (0, 1]", *prefetch)
	case *idleTimeout <= 0:
		return cli.Usagef("--idle-timeout %v must be positive", *idleTimeout)
	case *conns < 1:
		return cli.Usagef("--conns %d must be at least 1", *conns)
	case *sharedRate < 0:
		return cli.Usagef("--shared-rate %v is negative (0: the service's default)", *sharedRate)
	case *setupTimeout <= 0:
		return cli.Usagef("--setup-timeout %v must be positive", *setupTimeout)
	case *rpcTimeout <= 0:
		return cli.Usagef("--rpc-timeout %v must be positive", *rpcTimeout)
	case *cpuHog < 0 || *cpuHog > benchrun.MaxCPUHog():
		return cli.Usagef("--cpu-hog %d not in 0..%d cores", *cpuHog, benchrun.MaxCPUHog())
	}
	if *out != "" && !*sweep {
		return cli.Usagef("--out is only used with --sweep")
	}
	var logger *slog.Logger
	if *logLevel != "" {
		var lvl slog.Level
		if err := lvl.UnmarshalText([]byte(*logLevel)); err != nil {
			return cli.Usagef("--log %q: want debug, info, warn or error", *logLevel)
		}
		logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))
	}
	cfg := benchrun.Config{
		Logger:            logger,
		Regions:           *regions,
		Workers:           *workers,
		AutoCodes:         *autoCodes,
		Conns:             *conns,
		SharedRate:        *sharedRate,
		Rate:              *rate,
		Duration:          *duration,
		Tick:              *tick,
		BurstSize:         *burst,
		BurstEvery:        *burstEvery,
		EtcdPerRegion:     *etcdPerRegion,
		CPUHog:            *cpuHog,
		SetupTimeout:      *setupTimeout,
		Progress:          stderr,
		RefillInterval:    *refill,
		FixedBlock:        *fixedBlock,
		PrefetchThreshold: *prefetch,
		RPCTimeout:        *rpcTimeout,
		IdleTimeout:       *idleTimeout,
	}
	if err := cfg.Validate(); err != nil {
		return cli.UsageError{Err: err}
	}
	if *sweep {
		blocks, err := parseInts(*sweepBlocks)
		if err != nil {
			return cli.Usagef("--sweep-blocks: %v", err)
		}
		if *fixedBlock != 0 {
			return cli.Usagef("--block and --sweep are exclusive (the sweep sets the block)")
		}
		start := time.Now()
		sr, err := benchrun.Sweep(ctx, cfg, blocks)
		if err != nil {
			return err
		}
		if err := fs.write(stdout, sr); err != nil {
			return err
		}
		if *out != "" {
			paths, err := sr.WriteFiles(*out)
			if err != nil {
				return err
			}
			for _, p := range paths {
				fmt.Fprintf(stderr, "bench: wrote %s\n", p)
			}
		}
		fmt.Fprintf(stderr, "bench: sweep finished in %v\n", time.Since(start).Round(time.Second))
		return sr.Err() // verification failures only: tiny blocks are expected to fail calls
	}
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			return errors.Wrap(err, "--cpuprofile")
		}
		defer f.Close()
		cfg.CPUProfile = f
	}
	rep, err := benchrun.Run(ctx, cfg)
	if err != nil {
		return err
	}
	if err := fs.write(stdout, rep); err != nil {
		return err
	}
	if !rep.TargetReached {
		fmt.Fprintf(stderr, "bench: target %.0f IDs/s NOT reached on this machine: achieved %.0f IDs/s\n", cfg.Rate, rep.AchievedRate)
	}
	if err := rep.VerifyErr(); err != nil {
		return err
	}
	if err := rep.Err(); err != nil {
		if *failOnErrors {
			return err
		}
		fmt.Fprintf(stderr, "bench: WARNING: %v (the IDs minted verified; --fail-on-errors makes this exit 1)\n", err)
	}
	return nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range cli.SplitList(s) {
		v, err := strconv.Atoi(f)
		if err != nil || v < 1 {
			return nil, errors.Newf("%q is not a positive integer", f)
		}
		out = append(out, v)
	}
	if len(out) == 0 {
		return nil, errors.Newf("no block sizes")
	}
	return out, nil
}

func joinInts(v []int) string {
	s := ""
	for i, x := range v {
		if i > 0 {
			s += ","
		}
		s += strconv.Itoa(x)
	}
	return s
}
