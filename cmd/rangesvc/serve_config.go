package main

import (
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/idrange/idrange/internal/cli"
	"github.com/idrange/idrange/internal/region"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/segment/etcdstore"
	"github.com/idrange/idrange/snowflake"
)

// Defaults of `rangesvc serve`.
const (
	defaultListen        = "127.0.0.1:7070"
	defaultMetrics       = "127.0.0.1:9090"
	defaultDataDir       = "./data/rangesvc"
	defaultEtcdClientURL = "http://127.0.0.1:2379"
	defaultEtcdPeerURL   = "http://127.0.0.1:2380"
	defaultShutdown      = 10 * time.Second
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
	// Metrics (--metrics, default 127.0.0.1:9090) serves /metrics and
	// /healthz over HTTP. Port 0 picks a free port.
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
	// defaults http://127.0.0.1:2379 and :2380) are the embedded etcd's
	// addresses; other replicas can point --etcd at the client URL.
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
	// RollbackBound (--rollback-bound, default 5ms): a service clock this far
	// behind the highest time seen reports NOT_SERVING.
	RollbackBound time.Duration
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

	// Faults are the test-only fault flags; empty, and no flags, unless
	// built with -tags idrange_faults (faults_on.go).
	Faults faultConfig
}

// parseServeFlags maps args 1:1 onto a validated serveConfig.
func parseServeFlags(args []string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	fs := cli.NewFlagSet(prog, "serve", stderr)
	fs.IntVar(&c.Region, "region", -1, "region code 0..3 this replica serves (required)")
	fs.StringVar(&c.Listen, "listen", defaultListen, "gRPC listen address host:port (port 0: any free port)")
	fs.StringVar(&c.Metrics, "metrics", defaultMetrics, "HTTP address for /metrics and /healthz")
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
			return fmt.Errorf("no endpoints in %q", s)
		}
		return nil
	})
	fs.StringVar(&c.EtcdClientURL, "etcd-client-url", defaultEtcdClientURL, "embedded etcd client URL (port 0: any free port)")
	fs.StringVar(&c.EtcdPeerURL, "etcd-peer-url", defaultEtcdPeerURL, "embedded etcd peer URL (port 0: any free port)")
	fs.DurationVar(&c.LeaseTTL, "lease-ttl", segment.DefaultLeaseTTL, "worker-code lease TTL (whole seconds, >= 2s)")
	fs.IntVar(&c.MaxBlock, "max-block", int(segment.DefaultMaxBlock), "largest block a request may ask for, in IDs")
	fs.DurationVar(&c.MaxLead, "max-lead", segment.DefaultMaxLead, "how far a code's HWM may run ahead of the clock")
	fs.DurationVar(&c.RollbackBound, "rollback-bound", service.DefaultRollbackBound, "clock rollback that makes the replica NOT_SERVING")
	fs.StringVar(&c.KeyPrefix, "key-prefix", etcdstore.DefaultPrefix, "etcd key prefix")
	fs.DurationVar(&c.EtcdTimeout, "etcd-timeout", region.DefaultEtcdTimeout, "timeout for connecting to etcd and health probes")
	fs.DurationVar(&c.ShutdownTimeout, "shutdown-timeout", defaultShutdown, "graceful shutdown bound")
	fs.StringVar(&c.LogLevel, "log-level", "info", "log level: debug, info, warn, error")
	c.Faults.register(fs)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: rangesvc serve --region N [--listen ADDR] [--metrics ADDR] [--data-dir DIR | --etcd EPS] [flags]")
		fs.PrintDefaults()
	}
	if err := cli.ParseFlags(fs, args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, cli.Usagef("unexpected arguments %q", fs.Args())
	}
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
		return fmt.Errorf("--region is required (0..%d)", snowflake.MaxRegion)
	case c.Region < 0 || c.Region > snowflake.MaxRegion:
		return fmt.Errorf("--region %d not in 0..%d", c.Region, snowflake.MaxRegion)
	case c.dataDirSet && len(c.Etcd) > 0:
		return fmt.Errorf("--data-dir and --etcd are mutually exclusive (--data-dir is for the embedded etcd)")
	case c.DataDir == "" && len(c.Etcd) == 0:
		return fmt.Errorf("--data-dir must not be empty")
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
			return fmt.Errorf("--etcd endpoint %d: %w", i+1, err)
		}
	}
	if len(c.Etcd) == 0 {
		for flag, u := range map[string]string{"--etcd-client-url": c.EtcdClientURL, "--etcd-peer-url": c.EtcdPeerURL} {
			if err := checkHTTPURL(u); err != nil {
				return fmt.Errorf("%s: %w", flag, err)
			}
		}
	}
	switch {
	case c.LeaseTTL < 2*time.Second || c.LeaseTTL%time.Second != 0:
		return fmt.Errorf("--lease-ttl %v must be whole seconds, at least 2s", c.LeaseTTL)
	case c.MaxBlock < 1 || int64(c.MaxBlock) > segment.MaxBlockLimit:
		return fmt.Errorf("--max-block %d not in 1..%d", c.MaxBlock, segment.MaxBlockLimit)
	case c.MaxLead < time.Second || c.MaxLead%time.Millisecond != 0:
		return fmt.Errorf("--max-lead %v must be whole milliseconds, at least 1s", c.MaxLead)
	case c.RollbackBound < 0:
		return fmt.Errorf("--rollback-bound %v must not be negative", c.RollbackBound)
	case c.EtcdTimeout <= 0:
		return fmt.Errorf("--etcd-timeout %v must be positive", c.EtcdTimeout)
	case c.ShutdownTimeout <= 0:
		return fmt.Errorf("--shutdown-timeout %v must be positive", c.ShutdownTimeout)
	}
	if err := etcdstore.ValidatePrefix(c.KeyPrefix); err != nil {
		return fmt.Errorf("--key-prefix: %w", err)
	}
	if _, err := parseLogLevel(c.LogLevel); err != nil {
		return err
	}
	if err := c.storeConfig().Validate(); err != nil {
		return fmt.Errorf("store settings (--lease-ttl, --max-block, --max-lead): %w", err)
	}
	return nil
}

func parseLogLevel(s string) (slog.Level, error) {
	var l slog.Level
	if err := l.UnmarshalText([]byte(s)); err != nil {
		return 0, fmt.Errorf("--log-level %q: want debug, info, warn or error", s)
	}
	return l, nil
}

// checkHostPort accepts host:port with a numeric port 0..65535 (host may be
// empty: all interfaces).
func checkHostPort(flag, addr string) error {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%s %q: want host:port", flag, addr)
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 0 || p > 65535 {
		return fmt.Errorf("%s %q: port %q not in 0..65535", flag, addr, port)
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("%s %q: bad host %q", flag, addr, host)
	}
	return nil
}

// checkEndpoint accepts an etcd endpoint: host:port or http(s)://host:port.
func checkEndpoint(e string) error {
	if strings.Contains(e, "://") {
		u, err := url.Parse(e)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("%q: want host:port or http(s)://host:port", e)
		}
		e = u.Host
	}
	host, port, err := net.SplitHostPort(e)
	if err != nil || host == "" {
		return fmt.Errorf("%q: want host:port", e)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("%q: port %q not in 1..65535", e, port)
	}
	return nil
}

func checkHTTPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme != "http" || u.Host == "" || (u.Path != "" && u.Path != "/") {
		return fmt.Errorf("%q: want http://host:port", raw)
	}
	return checkHostPort("url", u.Host)
}
