// Command minter is the fault suite's client process: a rangeclient that
// mints IDs continuously at a steady rate and appends every ID it hands out,
// and every lease and block call its client makes, to its own history file
// (internal/faultsuite/history), so a checker can prove after the run that nothing was
// handed out twice or after the process's safety deadline.
//
//	minter --targets 127.0.0.1:7001,127.0.0.1:7002 --region 1 --name m0 \
//	  --history m0.hist [--rate 5000] [--batch 50] [--safety-margin 1s]
//
// It prints "READY <name> <pid>" on stdout once its client holds a lease and
// a block, mints until SIGTERM/SIGINT or --duration, then closes the client
// (giving the lease back), flushes the history and exits 0.
//
// If the history cannot be written (a full disk, a file size limit), IDs it
// hands out would escape the checker: the minter stops minting at once,
// closes the client and exits 1 naming the write error. Any exit other
// than 0 after SIGTERM fails the fault suite's scenario.
//
// SIGUSR1 makes it quiet: it stops minting but keeps its client open and
// idle (its runs and blocks expire, its lease is renewed), as an
// application between bursts of work; SIGUSR2 resumes minting. Each is
// noted in the history ("quiet", "resume").
//
// With --exit-on-stdin-eof the process exits when its stdin closes (its
// parent test process is gone); what it reads from stdin is ignored. The
// client reads only Go's monotonic clock, so there is no client clock to
// move: clock faults are injected into the service (rangesvc serve).
package main

import (
	"context"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/cockroachdb/errors"

	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/faultsuite/history"
	"github.com/idrange/idrange/snowflake"
	"github.com/idrange/idrange/tlsfiles"
)

type config struct {
	targets      []string
	region       int
	name, path   string
	rate, batch  int
	margin       time.Duration
	rpcTimeout   time.Duration
	callTimeout  time.Duration
	startTimeout time.Duration
	duration     time.Duration
	refill       time.Duration
	stdinEOF     bool
	logLevel     string
	failurePause time.Duration
	codes        int
	tls          tlsfiles.Files // --tls-cert, --tls-key, --tls-ca
}

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "minter:", err)
		os.Exit(1)
	}
}

func parse(args []string) (config, error) {
	var c config
	fs := flag.NewFlagSet("minter", flag.ContinueOnError)
	var targets string
	fs.StringVar(&targets, "targets", "", "rangesvc replicas host:port,... (required)")
	fs.IntVar(&c.region, "region", -1, "region code 0..3 (required)")
	fs.StringVar(&c.name, "name", "", "process name in the history (required, no spaces)")
	fs.StringVar(&c.path, "history", "", "history file to write (required)")
	fs.IntVar(&c.rate, "rate", 5000, "IDs per second to mint")
	fs.IntVar(&c.batch, "batch", 50, "IDs per minting call (NextN)")
	fs.DurationVar(&c.margin, "safety-margin", engine.DefaultSafetyMargin, "rangeclient SafetyMargin")
	fs.DurationVar(&c.rpcTimeout, "rpc-timeout", engine.DefaultRPCTimeout, "rangeclient RPCTimeout")
	fs.DurationVar(&c.callTimeout, "call-timeout", 200*time.Millisecond, "deadline of each minting call")
	fs.DurationVar(&c.startTimeout, "start-timeout", 60*time.Second, "how long to wait for the first lease and block")
	fs.DurationVar(&c.duration, "duration", 10*time.Minute, "stop after this long whatever happens (bounds a leaked process)")
	fs.DurationVar(&c.refill, "refill-interval", 0, "rangeclient RefillInterval (0: the client's default)")
	fs.DurationVar(&c.failurePause, "failure-pause", 20*time.Millisecond, "pause after a failed minting call")
	fs.BoolVar(&c.stdinEOF, "exit-on-stdin-eof", false, "exit when stdin is closed")
	fs.StringVar(&c.logLevel, "log-level", "info", "log level of the client's logs on stderr")
	// The scenarios check leases, deadlines and committed blocks: a code of
	// its own, unless a scenario asks for the shared path (0).
	fs.IntVar(&c.codes, "codes", 1, "rangeclient Codes (0: automatic, the shared path while the rate allows)")
	fs.StringVar(&c.tls.Cert, "tls-cert", "", "client certificate (mutual TLS)")
	fs.StringVar(&c.tls.Key, "tls-key", "", "key of --tls-cert")
	fs.StringVar(&c.tls.CA, "tls-ca", "", "CA verifying the replicas; any --tls-* flag turns TLS on")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	for _, t := range strings.Split(targets, ",") {
		if t = strings.TrimSpace(t); t != "" {
			c.targets = append(c.targets, t)
		}
	}
	switch {
	case fs.NArg() > 0:
		return c, errors.Newf("unexpected arguments %q", fs.Args())
	case len(c.targets) == 0:
		return c, errors.New("--targets is required")
	case c.region < 0 || c.region > snowflake.MaxRegion:
		return c, errors.Newf("--region %d not in 0..%d", c.region, snowflake.MaxRegion)
	case c.name == "" || strings.ContainsAny(c.name, " \t=") || c.path == "":
		return c, errors.New("--name (no spaces) and --history are required")
	case c.rate < 1 || c.batch < 1 || c.batch > c.rate:
		return c, errors.Newf("--rate %d and --batch %d must be >= 1 with batch <= rate", c.rate, c.batch)
	case c.codes < 0 || c.codes > engine.MaxCodes:
		return c, errors.Newf("--codes %d not in 0..%d", c.codes, engine.MaxCodes)
	case c.margin <= 0 || c.rpcTimeout <= 0 || c.callTimeout <= 0 || c.duration <= 0 || c.startTimeout <= 0:
		return c, errors.New("durations must be positive")
	}
	return c, nil
}

func run(args []string) error {
	c, err := parse(args)
	if err != nil {
		return err
	}
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(c.logLevel)); err != nil {
		return errors.Newf("--log-level %q", c.logLevel)
	}
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})).With("minter", c.name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, c.duration)
	defer cancel()

	rec, err := history.Create(c.path, history.Header{Name: c.name, PID: os.Getpid(), Region: c.region, Margin: c.margin})
	if err != nil {
		return err
	}
	defer rec.Close()

	var tc *tls.Config
	if c.tls.Cert+c.tls.Key+c.tls.CA != "" {
		if tc, err = c.tls.ClientConfig(); err != nil {
			return err
		}
	}
	cfg := engine.Config{
		TLS:            tc,
		Targets:        c.targets,
		Region:         c.region,
		Codes:          c.codes,
		Owner:          c.name,
		SafetyMargin:   c.margin,
		RefillInterval: c.refill,
		Logger:         log,
		DialOptions:    []grpc.DialOption{grpc.WithChainUnaryInterceptor(rec.UnaryClientInterceptor())},
		Tuning:         engine.Tuning{RPCTimeout: c.rpcTimeout},
	}
	if c.stdinEOF {
		go exitOnStdinEOF(stop)
	}

	sctx, scancel := context.WithTimeout(ctx, c.startTimeout)
	cli, err := engine.New(sctx, cfg)
	scancel()
	if err != nil {
		rec.Note(history.Now(), "start failed: "+err.Error())
		return errors.Newf("start: %w", err)
	}
	if err := rec.Flush(); err != nil { // the lease is on file before READY
		return err
	}
	fmt.Printf("READY %s %d\n", c.name, os.Getpid())

	quiet := make(chan os.Signal, 4)
	signal.Notify(quiet, syscall.SIGUSR1, syscall.SIGUSR2)
	defer signal.Stop(quiet)
	minted, failed, merr := mint(ctx, c, cli, rec, quiet)
	cerr := cli.Close()
	log.Info("stopped", "minted", minted, "failed_calls", failed, "close_err", cerr, "history_err", merr)
	if merr != nil {
		return merr
	}
	return rec.Close()
}

// mint hands out IDs at c.rate in calls of c.batch until ctx ends. Every ID
// is recorded with the time before the call started (t0) and after it
// returned (t1); a failed call is recorded with its class. It stops with an
// error as soon as the history fails to record (see Recorder.Err). A
// SIGUSR1 on quiet stops minting until a SIGUSR2.
func mint(ctx context.Context, c config, cli *engine.Engine, rec *history.Recorder, quiet <-chan os.Signal) (minted, failed int64, histErr error) {
	interval := time.Duration(int64(time.Second) * int64(c.batch) / int64(c.rate))
	buf := make([]snowflake.ID, 0, c.batch)
	next := time.Now()
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	for ctx.Err() == nil {
		select {
		case sig := <-quiet:
			if sig != syscall.SIGUSR1 {
				break
			}
			rec.Note(history.Now(), "quiet")
			if !waitResume(ctx, quiet) {
				return minted, failed, nil
			}
			rec.Note(history.Now(), "resume")
			next = time.Now()
		default:
		}
		t0 := history.Now()
		cctx, cancel := context.WithTimeout(ctx, c.callTimeout)
		ids, err := cli.AppendN(cctx, buf[:0], c.batch)
		cancel()
		t1 := history.Now()
		rec.Minted(t0, t1, ids)
		minted += int64(len(ids))
		if rerr := rec.Err(); rerr != nil {
			return minted, failed, errors.Newf("stopped minting after %d IDs: the history misses events since its last flush: %w", minted, rerr)
		}
		wait := time.Duration(0)
		if err != nil {
			if ctx.Err() != nil {
				return minted, failed, nil
			}
			failed++
			rec.MintFailed(t0, t1, classify(err))
			wait = c.failurePause
			next = time.Now().Add(wait)
		} else {
			next = next.Add(interval)
			wait = time.Until(next)
			if wait < -time.Second { // fell far behind (paused): do not burst
				next = time.Now()
			}
		}
		if wait > 0 {
			timer.Reset(wait)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
		}
	}
	return minted, failed, nil
}

// waitResume waits for a SIGUSR2 on quiet; false when ctx ends first.
func waitResume(ctx context.Context, quiet <-chan os.Signal) bool {
	for {
		select {
		case <-ctx.Done():
			return false
		case sig := <-quiet:
			if sig == syscall.SIGUSR2 {
				return true
			}
		}
	}
}

// classify names a minting error in one word for the history.
func classify(err error) string {
	switch {
	case errors.Is(err, engine.ErrFenced):
		return "fenced"
	case errors.Is(err, engine.ErrLeaseLost):
		return "lease_lost"
	case errors.Is(err, engine.ErrUnavailable):
		return "unavailable"
	case errors.Is(err, engine.ErrClosed):
		return "closed"
	case errors.Is(err, engine.ErrEpochExhausted):
		return "epoch_exhausted"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	}
	return "other"
}

// exitOnStdinEOF reads stdin to its end, discarding it, and then stops the
// process.
func exitOnStdinEOF(stop func()) {
	io.Copy(io.Discard, os.Stdin)
	stop()
}
