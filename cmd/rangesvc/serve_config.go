package main

import (
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/etcdspace"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Defaults of `rangesvc serve`.
const (
	defaultListen        = "127.0.0.1:7070"
	defaultMetrics       = "127.0.0.1:9090"
	defaultDataDir       = "./data/rangesvc"
	defaultEtcdClientURL = "https://127.0.0.1:2379"
	defaultEtcdPeerURL   = "https://127.0.0.1:2380"
	defaultShutdown      = 10 * time.Second
	defaultDrainDelay    = 5 * time.Second
	// defaultMaxClockSkew is --max-clock-skew's default: far above what
	// NTP or chrony keeps hosts to, small enough that the restart floor's
	// backpressure after a start stays under two seconds.
	defaultMaxClockSkew = 500 * time.Millisecond
	// maxSharedRate bounds --shared-rate: far above what one replica's
	// code can carve (4,096,000 IDs/s, more with its lead).
	maxSharedRate = 1e9
)

// serveConfig is `rangesvc serve`'s flags, one field per flag. Zero values
// are not defaults: parseServeFlags fills every field, then Validate checks
// them all.
type serveConfig struct {
	// Region (--region, required) is the region code 0..3 this replica
	// serves; requests for another region are refused.
	Region int
	// Listen (--listen, default 127.0.0.1:7070) is the gRPC address. Port 0
	// picks a free port; the bound address is logged ("msg=listening").
	Listen string
	// Metrics (--metrics, default 127.0.0.1:9090) serves /metrics and the
	// probes /livez, /readyz (and /healthz, its old name) over HTTP. Port 0
	// picks a free port.
	Metrics string
	// HTTP (--http, default 127.0.0.1:7071; empty disables) serves the
	// HTTP/JSON API (GET /v1/ids?count=N, serve_http.go).
	HTTP string
	// DataDir (--data-dir, default ./data/rangesvc) is the embedded etcd's
	// data directory. Only without --etcd.
	DataDir string
	// dataDirSet records that --data-dir was given explicitly.
	dataDirSet bool
	// Etcd (--etcd host:port,...) selects an external etcd cluster instead
	// of the embedded one.
	Etcd []string
	// EtcdClientURL / EtcdPeerURL (--etcd-client-url, --etcd-peer-url,
	// defaults https://127.0.0.1:2379 and :2380) are the embedded etcd's
	// addresses: https only, and client certificates of the PKI in
	// <DataDir>/pki required on both (internal/server/embedetcd); a non-loopback
	// host needs --insecure. Other replicas can point --etcd at the client
	// URL with that PKI's files (--etcd-cacert, --etcd-cert, --etcd-key).
	EtcdClientURL, EtcdPeerURL string
	// LeaseTTL (--lease-ttl, default 10s) is the worker-code lease TTL asked
	// of etcd (whole seconds, at least 2s).
	LeaseTTL time.Duration
	// MaxBlock (--max-block, default 40960000 = 10 s of span) is the largest
	// block a request may ask for.
	MaxBlock int
	// MaxLead (--max-lead, default 15s) bounds how far a code's HWM may run
	// ahead of the service clock before grants are refused (backpressure).
	MaxLead time.Duration
	// SharedRate (--shared-rate, default 2000000; 0 = off) bounds the
	// shared path (AllocateShared: clients that hold no worker code mint
	// from runs of this replica's own code) per caller identity, in IDs/s;
	// every client without mutual TLS is one identity.
	SharedRate int64
	// SharedRateTotal (--shared-rate-total, default 0 = 3,000,000 per
	// code of --shared-codes) bounds what all identities together take
	// from this replica's own codes (shared runs, MintBatch, Next), in
	// IDs/s; when it is spent, an identity above its fair share (the
	// bound over the identities active) waits and one below it is served.
	SharedRateTotal int64
	// SharedCodes (--shared-codes, default 4) bounds the worker codes
	// this replica's own minter holds: it takes them as demand nears
	// what its codes mint and gives them back when it falls.
	SharedCodes int
	// RollbackBound (--rollback-bound, default 5ms): a service clock this far
	// behind the highest time seen reports NOT_SERVING.
	RollbackBound time.Duration
	// MaxClockSkew (--max-clock-skew, default 500ms, 0..1h) is the bound the
	// region documents on how far its replicas' clocks may differ (and one
	// replica's clock may step back across a restart). The replica grants
	// nothing below its restart floor, its clock at start + --max-lead +
	// this (store.Config.RestartFloor; docs/design.md).
	MaxClockSkew time.Duration
	// KeyPrefix (--key-prefix, default /idrange/v1/) is the etcd key prefix.
	KeyPrefix string
	// EtcdTimeout (--etcd-timeout, default 5s) bounds connecting to etcd and
	// each health probe.
	EtcdTimeout time.Duration
	// ShutdownTimeout (--shutdown-timeout, default 10s) bounds the graceful
	// drain of in-flight RPCs on SIGINT/SIGTERM.
	ShutdownTimeout time.Duration
	// LogLevel (--log-level debug|info|warn|error, default info).
	LogLevel string

	// Operations (docs/operations.md).
	//
	// DrainDelay (--drain-delay, default 5s; 0 allowed) is how long serve
	// keeps answering after SIGINT/SIGTERM while it reports NOT_SERVING
	// (gRPC health, /readyz), so balancers move traffic away before the
	// gRPC server stops; ShutdownTimeout bounds the stop after it.
	DrainDelay time.Duration
	// LogFormat (--log-format text|json, default text): one line per event
	// on stderr, the embedded etcd's logs included.
	LogFormat string
	// ConfigFile (--config FILE) is the YAML file the flags were read from
	// ("" without one); flags on the command line override it.
	ConfigFile string
	// History compaction and space (internal/server/etcdspace, docs/operations.md).
	//
	// CompactionInterval (--compaction-interval, default 5m; 0 = off) is how
	// often the replica holding the compactor key compacts etcd's history.
	// 0 also leaves the embedded etcd's own auto-compaction off.
	CompactionInterval time.Duration
	// CompactionRetention (--compaction-retention, default 5m) is how much
	// history a compaction keeps; also the embedded etcd's auto-compaction
	// retention.
	CompactionRetention time.Duration
	// EtcdQuotaBytes (--etcd-quota-bytes, default 2 GiB, etcd's default)
	// is the embedded etcd's backend quota; with --etcd, the quota the
	// external cluster runs with (exported when members do not report it).
	EtcdQuotaBytes int64

	// Connection limits (serve_limits.go; docs/operations/probes-and-limits.md, "Connection
	// limits and timeouts").
	//
	// MaxConnections (--max-connections, default 10000) caps the
	// connections each listener (--listen, --http, --metrics) holds open
	// at once; at the cap new ones wait in the kernel's listen backlog.
	// serve lowers it so the caps fit the open-file limit minus a reserve
	// for etcd.
	MaxConnections int
	// maxConnsSet records that --max-connections was given (flag or
	// file): lowering it is then worth a warning.
	maxConnsSet bool
	// HandshakeTimeout (--handshake-timeout, default 5s) closes a
	// connection that has not finished its TLS handshake and HTTP/2
	// preface (gRPC) or sent its request headers (HTTP) by then, and ends
	// a gRPC call whose request message does not follow its headers.
	HandshakeTimeout time.Duration
	// IdleTimeout (--idle-timeout, default 2m) closes a connection with no
	// call or request in flight for this long.
	IdleTimeout time.Duration
	// HTTPReadTimeout (--http-read-timeout, default 10s) closes an HTTP
	// connection (--http, --metrics) whose request, headers and body, has
	// not arrived this long after it began.
	HTTPReadTimeout time.Duration
	// HTTPWriteTimeout (--http-write-timeout, default 15s) closes an HTTP
	// connection whose response has not been taken this long after its
	// request's headers arrived (the handler's time included).
	HTTPWriteTimeout time.Duration

	// Faults are the test-only fault flags; empty, and no flags, unless
	// built with -tags idrange_faults (faults_on.go).
	Faults faultConfig
	// Security are the TLS, identity and etcd security flags (tls_flags.go).
	Security securityFlags
	// RegionID are the region identity flags (region_flags.go).
	RegionID regionFlags
}

// parseServeFlags maps args 1:1 onto a validated serveConfig.
func parseServeFlags(args []string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	fs := cli.NewFlagSet(prog, "serve", stderr)
	fs.IntVar(&c.Region, "region", -1, "region code 0..3 this replica serves (required)")
	fs.StringVar(&c.Listen, "listen", defaultListen, "gRPC listen address host:port (port 0: any free port)")
	fs.StringVar(&c.Metrics, "metrics", defaultMetrics, "HTTP address for /metrics and the probes /livez, /readyz")
	fs.StringVar(&c.HTTP, "http", defaultHTTP, "HTTP/JSON API address (GET /v1/ids?count=N); empty disables it")
	fs.Func("data-dir", "embedded etcd data directory (default "+defaultDataDir+"); not with --etcd", func(s string) error {
		c.DataDir, c.dataDirSet = s, true
		return nil
	})
	fs.Func("etcd", "external etcd endpoints host:port[,host:port...] instead of the embedded etcd", func(s string) error {
		for _, e := range strings.Split(s, ",") {
			if e = strings.TrimSpace(e); e != "" {
				c.Etcd = append(c.Etcd, e)
			}
		}
		if len(c.Etcd) == 0 {
			return errors.Newf("no endpoints in %q", s)
		}
		return nil
	})
	fs.StringVar(&c.EtcdClientURL, "etcd-client-url", defaultEtcdClientURL, "embedded etcd client URL, https only: clients need the certificates in <data-dir>/pki (port 0: any free port; not loopback: needs --insecure)")
	fs.StringVar(&c.EtcdPeerURL, "etcd-peer-url", defaultEtcdPeerURL, "embedded etcd peer URL, https only, as --etcd-client-url")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", store.DefaultLeaseTTL, "worker-code lease TTL (whole seconds, >= 2s)")
	fs.IntVar(&c.MaxBlock, "max-block", int(segment.DefaultMaxBlock), "largest block a request may ask for, in IDs")
	fs.DurationVar(&c.MaxLead, "max-lead", segment.DefaultMaxLead, "how far a code's HWM may run ahead of the clock")
	fs.Int64Var(&c.SharedRate, "shared-rate", service.DefaultSharedRate, "shared path (clients without a worker code of their own): IDs/s per caller identity on this replica (0: off)")
	fs.Int64Var(&c.SharedRateTotal, "shared-rate-total", 0, "IDs/s all identities together take from this replica's own codes (shared runs, MintBatch); spent, each gets its fair share (0: 3000000 per --shared-codes)")
	fs.IntVar(&c.SharedCodes, "shared-codes", mintpool.DefaultMaxCodes, "worker codes this replica's own minter may hold, taken as demand needs them")
	fs.DurationVar(&c.RollbackBound, "rollback-bound", service.DefaultRollbackBound, "clock rollback that makes the replica NOT_SERVING")
	fs.DurationVar(&c.MaxClockSkew, "max-clock-skew", defaultMaxClockSkew, "most the region's replica clocks may differ; no grant starts below the clock at start + --max-lead + this")
	fs.StringVar(&c.KeyPrefix, "key-prefix", etcdstore.DefaultPrefix, "etcd key prefix")
	fs.DurationVar(&c.EtcdTimeout, "etcd-timeout", region.DefaultEtcdTimeout, "timeout for connecting to etcd and health probes")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", defaultShutdown, "graceful shutdown bound")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	fs.DurationVar(&c.DrainDelay, "drain-delay", defaultDrainDelay, "after SIGTERM, report NOT_SERVING this long before stopping the gRPC server (0: stop at once)")
	fs.StringVar(&c.LogFormat, "log-format", logText, "log format: text or json")
	fs.DurationVar(&c.CompactionInterval, "compaction-interval", etcdspace.DefaultCompactionInterval, "how often one replica compacts etcd history (0: off)")
	fs.DurationVar(&c.CompactionRetention, "compaction-retention", etcdspace.DefaultCompactionRetention, "etcd history a compaction keeps")
	fs.Int64Var(&c.EtcdQuotaBytes, "etcd-quota-bytes", etcdspace.DefaultQuotaBytes, "etcd backend quota in bytes (embedded: set; --etcd: what the cluster runs with)")
	fs.IntVar(&c.MaxConnections, "max-connections", defaultMaxConnections, "connections each listener (gRPC, HTTP, metrics) holds open at once; more wait in the listen backlog (lowered to fit the open-file limit)")
	fs.DurationVar(&c.HandshakeTimeout, "handshake-timeout", service.DefaultHandshakeTimeout, "close a connection without a finished TLS/HTTP2 handshake or request headers after this; also bounds a gRPC call's wait for its request")
	fs.DurationVar(&c.IdleTimeout, "idle-timeout", service.DefaultIdleTimeout, "close a connection idle (no call or request in flight) this long")
	fs.DurationVar(&c.HTTPReadTimeout, "http-read-timeout", defaultHTTPReadTimeout, "HTTP ports: close a connection whose request (headers and body) has not arrived this long after it began")
	fs.DurationVar(&c.HTTPWriteTimeout, "http-write-timeout", defaultHTTPWriteTimeout, "HTTP ports: close a connection whose response has not been taken this long after its request's headers")
	c.Faults.register(fs)
	c.Security.register(fs)
	c.RegionID.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rangesvc serve --region N [--listen ADDR] [--metrics ADDR] [--data-dir DIR | --etcd EPS] [--config FILE] [flags]")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlagsWithConfig(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, cli.Usagef("unexpected arguments %q", fs.Args())
	}
	c.ConfigFile = fs.Lookup(cli.ConfigFlag).Value.String()
	fs.Visit(func(f *flag.Flag) { c.maxConnsSet = c.maxConnsSet || f.Name == "max-connections" })
	if !c.dataDirSet {
		c.DataDir = defaultDataDir
	}
	if err := c.Validate(); err != nil {
		return c, cli.UsageError{Err: err}
	}
	return c, nil
}

// Validate reports the first bad field, naming its flag.
func (c serveConfig) Validate() error {
	switch {
	case c.Region == -1:
		return errors.Newf("--region is required (0..%d)", snowflake.MaxRegion)
	case c.Region < 0 || c.Region > snowflake.MaxRegion:
		return errors.Newf("--region %d not in 0..%d", c.Region, snowflake.MaxRegion)
	case c.dataDirSet && len(c.Etcd) > 0:
		return errors.Newf("--data-dir and --etcd are mutually exclusive (--data-dir is for the embedded etcd)")
	case c.DataDir == "" && len(c.Etcd) == 0:
		return errors.Newf("--data-dir must not be empty")
	}
	if err := checkHostPort("--listen", c.Listen); err != nil {
		return err
	}
	if err := checkHostPort("--metrics", c.Metrics); err != nil {
		return err
	}
	if err := checkHostPort("--http", c.HTTP); c.HTTP != "" && err != nil {
		return err
	}
	for i, e := range c.Etcd {
		if err := checkEndpoint(e); err != nil {
			return errors.Newf("--etcd endpoint %d: %w", i+1, err)
		}
	}
	if len(c.Etcd) == 0 {
		for _, f := range []struct{ flag, url string }{{"--etcd-client-url", c.EtcdClientURL}, {"--etcd-peer-url", c.EtcdPeerURL}} {
			if err := checkEmbeddedEtcdURL(f.flag, f.url, c.Security.Insecure); err != nil {
				return err
			}
		}
	}
	switch {
	case c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0:
		return errors.Newf("--lease-ttl %v must be whole seconds, at least 2s", c.LeaseTTL)
	case c.MaxBlock < 1 || int64(c.MaxBlock) > segment.MaxBlockLimit:
		return errors.Newf("--max-block %d not in 1..%d", c.MaxBlock, segment.MaxBlockLimit)
	case c.MaxLead < time.Second || c.MaxLead%time.Millisecond != 0:
		return errors.Newf("--max-lead %v must be whole milliseconds, at least 1s", c.MaxLead)
	case c.RollbackBound < 0:
		return errors.Newf("--rollback-bound %v must not be negative", c.RollbackBound)
	case c.MaxClockSkew < 0 || c.MaxClockSkew > time.Hour:
		return errors.Newf("--max-clock-skew %v not in 0s..1h", c.MaxClockSkew)
	case c.SharedRate < 0 || c.SharedRate > maxSharedRate:
		return errors.Newf("--shared-rate %d not in 0..%d IDs/s (0 turns the shared path off)", c.SharedRate, int64(maxSharedRate))
	case c.SharedRateTotal < 0 || c.SharedRateTotal > maxSharedRate:
		return errors.Newf("--shared-rate-total %d not in 0..%d IDs/s (0: %d per --shared-codes)", c.SharedRateTotal, int64(maxSharedRate), int64(service.SharedRatePerCode))
	case c.SharedCodes < 1 || c.SharedCodes > mintpool.MaxCodesLimit:
		return errors.Newf("--shared-codes %d not in 1..%d", c.SharedCodes, mintpool.MaxCodesLimit)
	case c.EtcdTimeout <= 0:
		return errors.Newf("--etcd-timeout %v must be positive", c.EtcdTimeout)
	case c.ShutdownTimeout <= 0:
		return errors.Newf("--shutdown-timeout %v must be positive", c.ShutdownTimeout)
	case c.DrainDelay < 0:
		return errors.Newf("--drain-delay %v must not be negative", c.DrainDelay)
	case c.LogFormat != logText && c.LogFormat != logJSON:
		return errors.Newf("--log-format %q: want %s or %s", c.LogFormat, logText, logJSON)
	}
	if err := c.validateSpace(); err != nil {
		return err
	}
	if err := c.validateConnLimits(); err != nil {
		return err
	}
	if err := c.RegionID.validate(); err != nil {
		return err
	}
	if err := etcdstore.ValidatePrefix(c.KeyPrefix); err != nil {
		return errors.Newf("--key-prefix: %w", err)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if err := c.storeConfig().Validate(); err != nil {
		return errors.Newf("store settings (--lease-ttl, --max-block, --max-lead): %w", err)
	}
	return c.Security.validate(c.Listen, c.Metrics, c.HTTP, c.Etcd)
}

// validateSpace checks the compaction and quota flags.
func (c serveConfig) validateSpace() error {
	switch {
	case c.CompactionInterval < 0:
		return errors.Newf("--compaction-interval %v must not be negative (0 turns compaction off)", c.CompactionInterval)
	case c.CompactionInterval > 0 && c.CompactionInterval < time.Second:
		return errors.Newf("--compaction-interval %v must be at least 1s (or 0: off)", c.CompactionInterval)
	case c.CompactionRetention < time.Second:
		return errors.Newf("--compaction-retention %v must be at least 1s", c.CompactionRetention)
	case c.EtcdQuotaBytes < minQuotaBytes:
		return errors.Newf("--etcd-quota-bytes %d must be at least %d (1 MiB)", c.EtcdQuotaBytes, minQuotaBytes)
	}
	return nil
}

// minQuotaBytes is the smallest --etcd-quota-bytes: below it a fresh etcd
// raises NOSPACE almost at once.
const minQuotaBytes = 1 << 20

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, errors.Newf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// checkHostPort accepts host:port with a numeric port 0..65535 (host may be
// empty: all interfaces).
func checkHostPort(flag, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return errors.Newf("%s %q: want host:port", flag, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return errors.Newf("%s %q: port %q not in 0..65535", flag, addr, port)
	}
	if strings.ContainsAny(host, " /") {
		return errors.Newf("%s %q: bad host %q", flag, addr, host)
	}
	return nil
}

// checkEndpoint accepts an etcd endpoint: host:port or http(s)://host:port.
func checkEndpoint(e string) error {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return errors.Newf("%q: want host:port or http(s)://host:port", e)
		}
		e = u.Host
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil || host == "" {
		return errors.Newf("%q: want host:port", e)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return errors.Newf("%q: port %q not in 1..65535", e, port)
	}
	return nil
}

// checkEmbeddedEtcdURL accepts an embedded etcd URL: https://host:port,
// on loopback unless insecure. The member serves TLS and requires client
// certificates; an http:// URL would serve plaintext to anyone, so it is
// refused rather than mapped.
func checkEmbeddedEtcdURL(flag, raw string, insecure bool) error {
	u, err := url.Parse(raw)
	switch {
	case err == nil && u.Scheme == "http":
		return errors.Newf("%s %s: the embedded etcd serves https only, with client certificates from <data-dir>/pki (docs/operations.md, \"The embedded etcd\"); use https://%s", flag, raw, u.Host)
	case err != nil || u.Scheme != "https" || u.Hostname() == "" || (u.Path != "" && u.Path != "/"):
		return errors.Newf("%s %q: want https://host:port", flag, raw)
	}
	if err := checkHostPort(flag, u.Host); err != nil {
		return err
	}
	if !insecure && !loopback(u.Host) {
		return errors.Newf("%s %s is not a loopback address: the embedded etcd holds every lease and high-water mark; serving it to other hosts needs --insecure (it still requires the client certificates of <data-dir>/pki)", flag, raw)
	}
	return nil
}
