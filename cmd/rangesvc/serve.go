package main

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/internal/region"
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

	etcd, err := openEtcd(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer etcd.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	rep, err := region.NewReplica(cfg.replicaConfig(etcd.cli, clk, reg, log))
	if err != nil {
		return err
	}
	gl, ml, err := listen(cfg)
	if err != nil {
		return err
	}
	hs := metricsServer(reg, rep.Service())
	errc := make(chan error, 3)
	api, err := startHTTPAPI(cfg.HTTP, rep.GRPCServer(), errc, log)
	if err != nil {
		gl.Close()
		ml.Close()
		return err
	}
	grpcErr := rep.Serve(gl)
	go func() { errc <- <-grpcErr }()
	go func() {
		if err := hs.Serve(ml); !errors.Is(err, http.ErrServerClosed) {
			errc <- errors.Wrap(err, "metrics server")
		}
	}()
	log.Info("listening", "grpc", gl.Addr().String(), "metrics", ml.Addr().String(),
		"region", cfg.Region, "etcd", strings.Join(etcd.cli.Endpoints(), ","), "embedded", etcd.emb != nil)

	failure := waitForEnd(ctx, errc, etcd.Err(), log)

	// Drain: NOT_SERVING first, stop accepting, let in-flight RPCs finish
	// (bounded), close the Next minter, then the metrics server, then etcd
	// (deferred).
	api.stop(cfg.ShutdownTimeout)
	rep.Stop(cfg.ShutdownTimeout)
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	_ = hs.Shutdown(sctx)
	log.Info("servers stopped; closing the store", "embedded_etcd", etcd.emb != nil)
	return failure
}

// replicaConfig is the replica `rangesvc serve` runs, from its flags.
func (c serveConfig) replicaConfig(cli *clientv3.Client, clk clock.Clock, reg *prometheus.Registry, log *slog.Logger) region.ReplicaConfig {
	return region.ReplicaConfig{
		Region:        c.Region,
		Etcd:          cli,
		Prefix:        c.KeyPrefix,
		Store:         c.storeConfig(),
		Clock:         clk,
		RollbackBound: c.RollbackBound,
		EtcdTimeout:   c.EtcdTimeout,
		Registry:      reg,
		Next:          nextMinter(serveNextOwner(), log.With("component", "next-minter")),
		Logger:        log,
	}
}

// waitForEnd blocks until ctx ends (a signal), a server fails or the
// embedded etcd fails, and returns the failure (nil for a signal).
func waitForEnd(ctx context.Context, serverErr <-chan error, etcdErr <-chan error, log *slog.Logger) error {
	select {
	case <-ctx.Done():
		log.Info("shutting down", "reason", context.Cause(ctx))
		return nil
	case err := <-serverErr:
		log.Error("server failed; shutting down", "err", err)
		return err
	case err := <-etcdErr:
		log.Error("embedded etcd failed; shutting down", "err", err)
		return errors.Wrap(err, "embedded etcd failed")
	}
}

// listen opens the gRPC and the metrics listeners.
func listen(cfg serveConfig) (grpcLis, metricsLis net.Listener, err error) {
	gl, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "--listen %s", cfg.Listen)
	}
	ml, err := net.Listen("tcp", cfg.Metrics)
	if err != nil {
		gl.Close()
		return nil, nil, errors.Wrapf(err, "--metrics %s", cfg.Metrics)
	}
	return gl, ml, nil
}

// metricsServer serves /metrics from reg and /healthz from svc.
func metricsServer(reg *prometheus.Registry, svc *service.Service) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !svc.Serving() {
			http.Error(w, "NOT_SERVING", http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "SERVING\n")
	})
	return &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
}

// serveEtcd is serve's etcd: the embedded member in the data dir (emb set)
// or the external cluster, and the client the replica uses.
type serveEtcd struct {
	cli   *clientv3.Client
	emb   *embedetcd.Server
	quiet func() // silences the embedded etcd's logs before its orderly stop
}

// openEtcd starts the embedded etcd or connects to the external one, and
// checks that it answers.
func openEtcd(ctx context.Context, cfg serveConfig, log *slog.Logger) (_ *serveEtcd, err error) {
	e := &serveEtcd{}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if len(cfg.Etcd) == 0 {
		log.Info("starting embedded etcd", "data_dir", cfg.DataDir, "client_url", cfg.EtcdClientURL)
		elog, quiet, err := etcdLogger()
		if err != nil {
			return nil, err
		}
		e.quiet = quiet
		e.emb, err = embedetcd.Start(ctx, embedetcd.Config{
			Dir:       cfg.DataDir,
			ClientURL: cfg.EtcdClientURL,
			PeerURL:   cfg.EtcdPeerURL,
			Logger:    elog,
		})
		if err != nil {
			return nil, errors.Wrap(err, "embedded etcd")
		}
		if e.cli, err = e.emb.NewClient(nil); err != nil {
			return nil, err
		}
		log.Info("embedded etcd ready", "endpoints", strings.Join(e.emb.Endpoints(), ","))
	} else {
		e.cli, err = clientv3.New(clientv3.Config{
			Endpoints:   cfg.Etcd,
			DialTimeout: cfg.EtcdTimeout,
			Logger:      zap.NewNop(),
		})
		if err != nil {
			return nil, errors.Wrapf(err, "etcd client for %v", cfg.Etcd)
		}
	}
	if err := region.ProbeEtcd(ctx, e.cli, cfg.KeyPrefix, cfg.EtcdTimeout); err != nil {
		return nil, errors.Wrapf(err, "etcd at %v not reachable", e.cli.Endpoints())
	}
	return e, nil
}

// Err delivers a fatal error of the embedded etcd (nil channel for an
// external one).
func (e *serveEtcd) Err() <-chan error {
	if e.emb == nil {
		return nil
	}
	return e.emb.Err()
}

// Close closes the client, then stops the embedded etcd.
func (e *serveEtcd) Close() {
	if e.cli != nil {
		e.cli.Close()
	}
	if e.emb != nil {
		e.quiet() // etcd logs its own orderly close as errors
		e.emb.Stop()
	}
}

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
