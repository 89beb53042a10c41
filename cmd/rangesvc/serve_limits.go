package main

import (
	"context"
	stdlog "log"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/idrange/idrange/internal/server/connlimit"
	"github.com/idrange/idrange/internal/server/service"
)

// Connection limits of `rangesvc serve` (docs/operations/probes-and-limits.md, "Connection
// limits and timeouts").
const (
	// defaultMaxConnections is --max-connections' default: room for a
	// large fleet of client processes on one replica (each holds one
	// connection per replica it lists); the open-file limit usually
	// lowers it (connCap).
	defaultMaxConnections = 10000
	// maxMaxConnections bounds --max-connections: Linux's default
	// fs.nr_open, above which no process can hold descriptors.
	maxMaxConnections = 1 << 20
	// fdReserve is how many descriptors of the open-file limit the
	// connection caps leave for the rest of the process: the embedded
	// etcd (go.etcd.io/etcd/server/v3/embed keeps the same 150,
	// reservedInternalFDNum, for its internals: it caps its own client
	// listener at the limit minus 150 and refuses to start at or below
	// 150), the etcd client connections, the data and log files.
	fdReserve = 150
	// minConnsPerListener is the smallest cap serve starts with: below it
	// the open-file limit is a misconfiguration, not a choice.
	minConnsPerListener = 16
	// probeReserve is how many connections the metrics listener admits
	// beyond its cap for /livez and /readyz (and /healthz) alone, so that
	// slow peers holding every other slot cannot make the probes fail
	// (connlimit.Config.Reserve): a kubelet's liveness, readiness and
	// startup probes, and room to spare.
	probeReserve = 8
	// maxShedAfter bounds how long a connection that has not started (no
	// gRPC call, no HTTP request yet) is safe from being shed at the cap
	// (connlimit.Config.ShedAfter; --handshake-timeout if shorter): long
	// enough for a TLS handshake and a first request on a loaded host,
	// short enough that a flood drains fast (docs/operations.md: the
	// admission bound).
	maxShedAfter = 100 * time.Millisecond
	// defaultHTTPReadTimeout and defaultHTTPWriteTimeout are the defaults
	// of --http-read-timeout and --http-write-timeout: a request (headers
	// and body) must arrive within the first, a response be taken within
	// the second after its request's headers. The write timeout covers the
	// handler too: the longest, a MintBatch through --http, waits for the
	// store at most service.DefaultRPCTimeout (10 s).
	defaultHTTPReadTimeout  = 10 * time.Second
	defaultHTTPWriteTimeout = 15 * time.Second
)

// validateConnLimits checks --max-connections, --handshake-timeout,
// --idle-timeout, --http-read-timeout and --http-write-timeout.
func (c serveConfig) validateConnLimits() error {
	switch {
	case c.MaxConnections < 1 || c.MaxConnections > maxMaxConnections:
		return errors.Newf("--max-connections %d not in 1..%d", c.MaxConnections, maxMaxConnections)
	case c.HandshakeTimeout <= 0:
		return errors.Newf("--handshake-timeout %v must be positive", c.HandshakeTimeout)
	case c.IdleTimeout <= 0:
		return errors.Newf("--idle-timeout %v must be positive", c.IdleTimeout)
	case c.HTTPReadTimeout <= 0:
		return errors.Newf("--http-read-timeout %v must be positive", c.HTTPReadTimeout)
	case c.HTTPWriteTimeout <= 0:
		return errors.Newf("--http-write-timeout %v must be positive", c.HTTPWriteTimeout)
	}
	return nil
}

// connLimits are serve's bounds on what peers hold: at most maxConns open
// connections per listener (gRPC, --http, --metrics; the metrics listener
// probeReserve more for the probes), shedding at the cap connections that
// have not started after shedAfter, the handshake and idle timeouts on
// each, the HTTP servers' read and write timeouts, and the gRPC server's
// per-connection limits.
type connLimits struct {
	maxConns        int
	handshake, idle time.Duration
	shedAfter       time.Duration
	read, write     time.Duration      // HTTP: the whole request, the response
	metrics         *connlimit.Metrics // nil: not exported
}

// openFileLimit raises the soft open-file limit to the hard limit, logs
// both, and returns the limit (0: unknown).
func openFileLimit(log *slog.Logger) uint64 {
	before, after, err := raiseOpenFileLimit()
	switch {
	case err != nil:
		log.Warn("open-file limit not raised", "err", err, "open_files", after)
	case after == 0:
		log.Info("open-file limit unknown on this system: the connection caps are --max-connections")
	default:
		log.Info("open-file limit", "soft_before", before, "soft", after)
	}
	return after
}

// connLimits sizes the per-listener cap from --max-connections and the
// open-file limit (files, after raiseOpenFileLimit; 0: unknown) and logs
// the result.
func (c serveConfig) connLimits(files uint64, log *slog.Logger) (connLimits, error) {
	names := []string{"grpc", "metrics"}
	if c.HTTP != "" {
		names = append(names, "http")
	}
	n, err := connCap(files, c.MaxConnections, len(names))
	if err != nil {
		return connLimits{}, err
	}
	shed := min(maxShedAfter, c.HandshakeTimeout)
	if n < c.MaxConnections && c.maxConnsSet {
		log.Warn("--max-connections lowered to fit the open-file limit (raise the hard limit: ulimit -Hn, LimitNOFILE)",
			"max_connections", c.MaxConnections, "lowered_to", n, "open_files", files, "reserved", fdReserve)
	}
	log.Info("connection limits", "max_connections_per_listener", n, "listeners", strings.Join(names, ","),
		"max_connections", c.MaxConnections, "open_files", files, "reserved", fdReserve, "probe_reserve", probeReserve,
		"handshake_timeout", c.HandshakeTimeout, "idle_timeout", c.IdleTimeout, "shed_after", shed,
		"http_read_timeout", c.HTTPReadTimeout, "http_write_timeout", c.HTTPWriteTimeout,
		"max_streams_per_connection", service.DefaultMaxStreams)
	return connLimits{maxConns: n, handshake: c.HandshakeTimeout, idle: c.IdleTimeout, shedAfter: shed,
		read: c.HTTPReadTimeout, write: c.HTTPWriteTimeout}, nil
}

// connCap is the per-listener connection cap: want, lowered so that
// listeners caps together (and the metrics listener's probeReserve) stay
// within the open-file limit files minus fdReserve. files 0 (unknown)
// leaves want as it is; a limit that leaves fewer than
// minConnsPerListener per listener is an error.
func connCap(files uint64, want, listeners int) (int, error) {
	if files == 0 {
		return want, nil
	}
	var share uint64
	if files > fdReserve+probeReserve {
		share = (files - fdReserve - probeReserve) / uint64(listeners)
	}
	if share < minConnsPerListener {
		return 0, errors.Newf("open-file limit %d leaves %d connections per listener (%d listeners) after %d descriptors reserved for etcd and the process; need at least %d: raise the hard limit (ulimit -Hn, LimitNOFILE)",
			files, share, listeners, fdReserve, minConnsPerListener)
	}
	return int(min(share, uint64(want))), nil
}

// register exports the connection metrics on reg.
func (l *connLimits) register(reg prometheus.Registerer) error {
	m, err := connlimit.NewMetrics(reg, service.Namespace, service.Subsystem)
	if err != nil {
		return err
	}
	l.metrics = m
	return nil
}

// listen listens on addr (the value of flag) with the cap and the
// admission policy, named name in the metrics, with reserve slots beyond
// the cap (the metrics listener's probeReserve; 0: none).
func (l connLimits) listen(flag, addr, name string, reserve int) (*connlimit.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Wrapf(err, "%s %s", flag, addr)
	}
	capped, err := connlimit.New(lis, connlimit.Config{Name: name, Max: l.maxConns, ShedAfter: l.shedAfter,
		Reserve: reserve, Metrics: l.metrics})
	if err != nil {
		lis.Close()
		return nil, err
	}
	return capped, nil
}

// httpServer is an HTTP server with the timeouts: a connection must send
// its request headers within the handshake timeout (which also bounds a
// TLS handshake: net/http takes the smallest of its read timeouts for it)
// and its whole request within the read timeout, take its response within
// the write timeout after the request's headers, and is closed after the
// idle timeout between requests. Its listener (listen) sees each request
// start; on a reserve slot only the requests probe accepts are served
// (connlimit.Handler). Its own errors go to log (httpErrorLog).
func (l connLimits) httpServer(h http.Handler, probe func(*http.Request) bool, log *slog.Logger) *http.Server {
	return &http.Server{Handler: connlimit.Handler(h, probe), ConnContext: connlimit.ConnContext,
		ReadHeaderTimeout: l.handshake, ReadTimeout: l.read, WriteTimeout: l.write, IdleTimeout: l.idle,
		ErrorLog: stdlog.New(httpErrorLog{log}, "", 0)}
}

// grpcLimits are the gRPC server's limits; a call arriving on a
// connection of lis marks it started.
func (l connLimits) grpcLimits(lis *connlimit.Listener) service.ConnLimits {
	return service.ConnLimits{HandshakeTimeout: l.handshake, IdleTimeout: l.idle, Established: lis.Established}
}

// noProbes is the probe filter of a server that serves no probes (its
// listener has no reserve).
func noProbes(*http.Request) bool { return false }

// httpErrorLog is an HTTP server's error log in serve's log: TLS handshake
// failures at debug (one per peer that connects and does not finish, a
// flood's worth under attack; gRPC's are debug too), everything else
// (accept errors, handler panics) at warn.
type httpErrorLog struct{ log *slog.Logger }

func (w httpErrorLog) Write(p []byte) (int, error) {
	msg := strings.TrimSpace(string(p))
	lvl := slog.LevelWarn
	if strings.HasPrefix(msg, "http: TLS handshake error") {
		lvl = slog.LevelDebug
	}
	w.log.Log(context.Background(), lvl, msg)
	return len(p), nil
}
