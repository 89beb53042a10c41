package main

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/buildinfo"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/connlimit"
	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/service"
)

// runServe runs one range-service replica until ctx ends (SIGINT/SIGTERM),
// then drains (see drain) and closes etcd. Once the logger exists, a
// failure is logged (in --log-format) rather than returned as text.
func runServe(ctx context.Context, args []string, _, stderr io.Writer) error {
	cfg, err := parseServeFlags(args, stderr)
	if err != nil {
		return err
	}
	lvl, _ := parseLogLevel(cfg.LogLevel)
	log := newLogger(stderr, cfg.LogFormat, lvl)
	grpcLog.Store(log.With("component", "grpc"))
	if err := serve(ctx, cfg, log); err != nil {
		log.Error("serve failed", "err", err)
		return cli.ExitError{Code: cli.ExitFailure}
	}
	log.Info("stopped")
	return nil
}

// serve is runServe after the flags and the logger.
func serve(ctx context.Context, cfg serveConfig, log *slog.Logger) error {
	bi := buildinfo.Read()
	attrs := []any{"version", bi.Version, "revision", bi.Revision, "modified", bi.Modified, "go", bi.GoVersion}
	if cfg.ConfigFile != "" {
		attrs = append(attrs, "config", cfg.ConfigFile)
	}
	log.Info("starting", attrs...)
	clk, stopFaults := cfg.Faults.serviceClock(log)
	defer stopFaults()
	// Every block granted before this instant ends below the restart
	// floor (store.Config.StartedAt): read before etcd starts, so the
	// floor is as low as it can be proven.
	started := clk()
	// Before etcd starts: the embedded one sizes its own listener from
	// the limit.
	limits, err := cfg.connLimits(openFileLimit(log), log)
	if err != nil {
		return err
	}

	etcd, err := openEtcd(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer etcd.Close()

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		buildinfo.NewCollector(bi))
	if err := limits.register(reg); err != nil {
		return err
	}
	registry, err := cfg.RegionID.openRegistry(cfg.EtcdTimeout)
	if err != nil {
		return err
	}
	if registry != nil {
		defer registry.Close()
	}
	// The listeners first: the gRPC server tells its listener which
	// connections have started (connlimit).
	gl, rawML, err := listen(cfg, limits)
	if err != nil {
		return err
	}
	rc := cfg.replicaConfig(etcd.cli, clk, reg, log)
	rc.Store.StartedAt = started
	cfg.RegionID.applyReplica(&rc, etcd.emb != nil, registry)
	rc.Limits = limits.grpcLimits(gl)
	rep, err := region.NewReplica(rc)
	if err != nil {
		gl.Close()
		rawML.Close()
		return err
	}
	ml := cfg.Security.metricsListener(rawML)
	cfg.Security.logMode(log)
	hs := metricsServer(reg, rep.Service(), limits, log)
	errc := make(chan error, 3)
	api, err := startHTTPAPI(cfg.HTTP, limits, cfg.Security.httpListener, rep.GRPCServer(), errc, log)
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
	drain(ctx, cfg, rep, api, hs, failure != nil, log)
	log.Info("servers stopped; closing the store", "embedded_etcd", etcd.emb != nil)
	return failure
}

// drain stops the servers in the order that lets balancers and clients
// move away without failed calls: report NOT_SERVING at once (gRPC health
// and /readyz), keep answering for --drain-delay while balancers notice
// (skipped after a failure: there is nothing to wait for), then stop
// accepting RPCs and let in-flight ones finish within --shutdown-timeout,
// close the Next minter, and last the metrics server, so /livez answers
// until the end. Each step is logged.
func drain(ctx context.Context, cfg serveConfig, rep *region.Replica, api *httpAPI, hs *http.Server, failed bool, log *slog.Logger) {
	rep.Service().Shutdown()
	delay := cfg.DrainDelay
	if failed {
		delay = 0
	}
	log.Info("reporting NOT_SERVING; draining", "drain_delay", delay)
	if delay > 0 {
		t := time.NewTimer(delay)
		<-t.C
	}
	log.Info("stopping the gRPC server", "shutdown_timeout", cfg.ShutdownTimeout)
	start := time.Now()
	api.stop(cfg.ShutdownTimeout) // its requests are served by the gRPC server: stop it first
	rep.Stop(cfg.ShutdownTimeout)
	log.Info("gRPC server stopped", "took", time.Since(start).Round(time.Millisecond))
	sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cfg.ShutdownTimeout)
	defer cancel()
	if err := hs.Shutdown(sctx); err != nil {
		log.Warn("metrics server did not stop cleanly", "err", err)
	}
}

// replicaConfig is the replica `rangesvc serve` runs, from its flags.
func (c serveConfig) replicaConfig(cli *clientv3.Client, clk func() time.Time, reg *prometheus.Registry, log *slog.Logger) region.ReplicaConfig {
	rc := region.ReplicaConfig{
		Region:          c.Region,
		Etcd:            cli,
		Prefix:          c.KeyPrefix,
		Store:           c.storeConfig(),
		Now:             clk,
		RollbackBound:   c.RollbackBound,
		SharedRate:      c.sharedRate(),
		SharedCodes:     c.SharedCodes,
		SharedRateTotal: float64(c.SharedRateTotal),
		EtcdTimeout:     c.EtcdTimeout,
		Registry:        reg,
		Next:            nextMinter(serveNextOwner(), log.With("component", "next-minter")),
		Logger:          log,

		CompactionInterval:  c.CompactionInterval,
		CompactionRetention: c.CompactionRetention,
		EtcdQuotaBytes:      c.EtcdQuotaBytes,
	}
	c.Security.applyReplica(&rc)
	return rc
}

// sharedRate is --shared-rate for the service: 0 (off) becomes negative.
func (c serveConfig) sharedRate() float64 {
	if c.SharedRate == 0 {
		return -1
	}
	return float64(c.SharedRate)
}

// embeddedAutoCompaction is the embedded etcd's own periodic compaction
// retention: the service's retention, or off with the service's compactor.
func (c serveConfig) embeddedAutoCompaction() time.Duration {
	if c.CompactionInterval == 0 {
		return 0
	}
	return c.CompactionRetention
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

// listen opens the gRPC and the metrics listeners, each holding at most
// lim's connections, the metrics one probeReserve more for the probes
// (TLS, if any, goes on top: a connection waiting for its handshake holds
// a slot).
func listen(cfg serveConfig, lim connLimits) (grpcLis, metricsLis *connlimit.Listener, err error) {
	gl, err := lim.listen("--listen", cfg.Listen, "grpc", 0)
	if err != nil {
		return nil, nil, err
	}
	ml, err := lim.listen("--metrics", cfg.Metrics, "metrics", probeReserve)
	if err != nil {
		gl.Close()
		return nil, nil, err
	}
	return gl, ml, nil
}

// isProbe reports whether r is a probe the metrics server answers on its
// reserve slots: a GET or HEAD of /livez, /readyz or /healthz.
func isProbe(r *http.Request) bool {
	switch r.URL.Path {
	case "/livez", "/readyz", "/healthz":
		return r.Method == http.MethodGet || r.Method == http.MethodHead
	}
	return false
}

// metricsServer serves /metrics from reg and the HTTP probes:
//
//   - /livez: 200 while the process runs. It never looks at etcd or the
//     clock, so an etcd outage does not make an orchestrator restart every
//     replica (a restart cannot fix etcd).
//   - /readyz: 200 "SERVING" while svc reports SERVING (the same signal as
//     gRPC health); otherwise 503 "NOT_SERVING: <reason>".
//   - /healthz: /readyz under its old name.
//
// The server has lim's timeouts, and answers the probes alone on the
// listener's reserve slots (isProbe); its own errors go to log.
func metricsServer(reg *prometheus.Registry, svc *service.Service, lim connLimits, log *slog.Logger) *http.Server {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/livez", func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "ok\n")
	})
	ready := func(w http.ResponseWriter, _ *http.Request) {
		if reason := svc.NotServingReason(); reason != "" {
			http.Error(w, "NOT_SERVING: "+reason, http.StatusServiceUnavailable)
			return
		}
		io.WriteString(w, "SERVING\n")
	}
	mux.HandleFunc("/readyz", ready)
	mux.HandleFunc("/healthz", ready)
	return lim.httpServer(mux, isProbe, log.With("component", "metrics-http"))
}

// serveEtcd is serve's etcd: the embedded member in the data dir (emb set)
// or the external cluster, and the client the replica uses.
type serveEtcd struct {
	cli   *clientv3.Client
	emb   *embedetcd.Server
	quiet func() // silences the embedded etcd's logs before its orderly stop
	log   *slog.Logger
}

// openEtcd starts the embedded etcd or connects to the external one, and
// checks that it answers. The embedded etcd is always the secured member
// (https, client certificates of <data-dir>/pki required): its URLs are
// https (serveConfig.Validate).
func openEtcd(ctx context.Context, cfg serveConfig, log *slog.Logger) (_ *serveEtcd, err error) {
	e := &serveEtcd{log: log}
	defer func() {
		if err != nil {
			e.Close()
		}
	}()
	if len(cfg.Etcd) == 0 {
		log.Info("starting embedded etcd", "data_dir", cfg.DataDir, "client_url", cfg.EtcdClientURL)
		elog, quiet := etcdLogger(log)
		e.quiet = quiet
		e.emb, err = embedetcd.Start(ctx, embedetcd.Config{
			Dir:       cfg.DataDir,
			ClientURL: cfg.EtcdClientURL,
			PeerURL:   cfg.EtcdPeerURL,
			Logger:    elog,

			QuotaBackendBytes:       cfg.EtcdQuotaBytes,
			AutoCompactionRetention: cfg.embeddedAutoCompaction(),
		})
		if err != nil {
			return nil, errors.Wrap(err, "embedded etcd")
		}
		pki := e.emb.PKI()
		for _, c := range pki.Changes {
			log.Info("embedded etcd pki", "change", c)
		}
		if e.cli, err = e.emb.NewClient(nil); err != nil {
			return nil, err
		}
		log.Info("embedded etcd ready", "endpoints", strings.Join(e.emb.Endpoints(), ","), "peer", e.emb.PeerEndpoint(),
			"cacert", pki.CACert, "cert", pki.ClientCert, "key", pki.ClientKey)
	} else {
		if e.cli, err = cfg.Security.openEtcd(ctx, cfg.Etcd, cfg.EtcdTimeout, cfg.KeyPrefix); err != nil {
			return nil, err
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
		if e.emb.Lingering() {
			e.log.Warn("embedded etcd stopped, but its servers did not close within the grace (connections that never finished a handshake); exiting anyway",
				"grace", embedetcd.StopGrace)
		}
	}
}
