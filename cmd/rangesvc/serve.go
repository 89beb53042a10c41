package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/internal/service"
)

// runServe runs one range-service replica until ctx ends (SIGINT/SIGTERM),
// then drains in-flight RPCs and closes etcd.
func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	lvl, _ := parseLogLevel(cfg.LogLevel)
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: lvl}))

	clk, stopFaults := cfg.Faults.serviceClock(log)
	defer stopFaults()

	// etcd: embedded in the data dir, or the external cluster.
	var (
		cli *clientv3.Client
		emb *embedetcd.Server
	)
	if len(cfg.Etcd) == 0 {
		log.Info("starting embedded etcd", "data_dir", cfg.DataDir, "client_url", cfg.EtcdClientURL)
		elog, quiet, err := etcdLogger()
		if err != nil {
			return err
		}
		emb, err = embedetcd.Start(ctx, embedetcd.Config{
			Dir:       cfg.DataDir,
			ClientURL: cfg.EtcdClientURL,
			PeerURL:   cfg.EtcdPeerURL,
			Logger:    elog,
		})
		if err != nil {
			return errors.Wrap(err, "embedded etcd")
		}
		defer func() {
			quiet() // etcd logs its own orderly close as errors
			emb.Stop()
		}()
		cli, err = emb.NewClient(nil)
		if err != nil {
			return err
		}
		log.Info("embedded etcd ready", "endpoints", strings.Join(emb.Endpoints(), ","))
	} else {
		cli, err = clientv3.New(clientv3.Config{
			Endpoints:   cfg.Etcd,
			DialTimeout: cfg.EtcdTimeout,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return errors.Wrapf(err, "etcd client for %v", cfg.Etcd)
		}
	}
	defer cli.Close()
	if err := probeEtcd(ctx, cli, cfg); err != nil {
		return errors.Wrapf(err, "etcd at %v not reachable", endpointsOf(cli))
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	metrics, err := service.NewMetrics(reg, clk)
	if err != nil {
		return err
	}
	st, err := openStore(cli, cfg, clk, log, metrics)
	if err != nil {
		return errors.Wrap(err, "segment store")
	}
	region := cfg.Region
	svc, err := service.New(service.Config{
		Region:        region,
		Allocator:     st,
		Clock:         clk,
		MaxBlock:      cfg.MaxBlock,
		RollbackBound: cfg.RollbackBound,
		StoreCheck: func(ctx context.Context) error {
			return probeEtcd(ctx, cli, cfg)
		},
		StoreCheckTimeout: cfg.EtcdTimeout,
		FreeCodes:         func(ctx context.Context) (int, error) { return st.FreeCodes(ctx, region) },
		Metrics:           metrics,
		Logger:            log,
	})
	if err != nil {
		return err
	}
	minter := newServiceMinter(st, cfg.Region, log)
	svc.SetMinter(minter)
	defer minter.Close() // after the gRPC drain: releases the Next lease

	gl, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return errors.Wrapf(err, "--listen %s", cfg.Listen)
	}
	ml, err := net.Listen("tcp", cfg.Metrics)
	if err != nil {
		gl.Close()
		return errors.Wrapf(err, "--metrics %s", cfg.Metrics)
	}
	gs := grpc.NewServer(service.ServerOptions()...)
	svc.Register(gs)
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !svc.Serving() {
			http.Error(w, "NOT_SERVING", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "SERVING\n")
	})
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	runCtx, cancelRun := context.WithCancel(ctx)
	defer cancelRun()
	errc := make(chan error, 2)
	go func() { errc <- errors.Wrap(gs.Serve(gl), "grpc server") }()
	go func() {
		if err := hs.Serve(ml); !errors.Is(err, http.ErrServerClosed) {
			errc <- errors.Wrap(err, "metrics server")
		}
	}()
	var runDone sync.WaitGroup
	runDone.Go(func() { svc.Run(runCtx) })
	log.Info("listening", "grpc", gl.Addr().String(), "metrics", ml.Addr().String(),
		"region", cfg.Region, "etcd", strings.Join(endpointsOf(cli), ","), "embedded", emb != nil)

	var etcdErr <-chan error
	if emb != nil {
		etcdErr = emb.Err()
	}
	var failure error
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
	case err := <-errc:
		failure = err
		log.Error("server failed; shutting down", "err", err)
	case err := <-etcdErr:
		failure = errors.Wrap(err, "embedded etcd failed")
		log.Error("embedded etcd failed; shutting down", "err", err)
	}

	// Drain: NOT_SERVING first, stop accepting, let in-flight RPCs finish
	// (bounded), then the metrics server, then etcd (deferred).
	svc.Shutdown()
	drained := make(chan struct{})
	go func() { gs.GracefulStop(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(cfg.ShutdownTimeout):
		log.Warn("graceful stop timed out; closing connections", "timeout", cfg.ShutdownTimeout)
		gs.Stop()
		<-drained
	}
	cancelRun()
	runDone.Wait()
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	_ = hs.Shutdown(sctx)
	log.Info("servers stopped; closing the store", "embedded_etcd", emb != nil)
	return failure
}

// probeEtcd is a cheap linearizable read: it succeeds only while the
// cluster has a leader and answers.
func probeEtcd(ctx context.Context, cli *clientv3.Client, cfg serveConfig) error {
	ctx, cancel := context.WithTimeout(ctx, cfg.EtcdTimeout)
	defer cancel()
	_, err := cli.Get(ctx, cfg.KeyPrefix+"probe", clientv3.WithCountOnly())
	return err
}

func endpointsOf(cli *clientv3.Client) []string { return cli.Endpoints() }

// etcdLogger is the embedded etcd's logger: JSON on stderr at error level,
// silenced by quiet() just before an orderly stop.
func etcdLogger() (lg *zap.Logger, quiet func(), err error) {
	zc := zap.NewProductionConfig()
	zc.Level = zap.NewAtomicLevelAt(zapcore.ErrorLevel)
	zc.OutputPaths = []string{"stderr"}
	zc.ErrorOutputPaths = []string{"stderr"}
	var stopping atomic.Bool
	lg, err = zc.Build(zap.WrapCore(func(c zapcore.Core) zapcore.Core {
		return quietCore{Core: c, stopping: &stopping}
	}))
	if err != nil {
		return nil, nil, errors.Wrap(err, "etcd logger")
	}
	return lg, func() { stopping.Store(true) }, nil
}

// quietCore drops every entry once stopping is set.
type quietCore struct {
	zapcore.Core
	stopping *atomic.Bool
}

func (c quietCore) With(f []zapcore.Field) zapcore.Core {
	return quietCore{Core: c.Core.With(f), stopping: c.stopping}
}

func (c quietCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.stopping.Load() {
		return ce
	}
	return c.Core.Check(e, ce)
}
