// Package embedetcd runs a single-node etcd inside the process, so that
// `rangesvc serve` works on a fresh machine with one command and every test
// in the module can talk to a real etcd on loopback.
//
// A Server owns one data directory and one client URL and one peer URL. Start
// it, hand Endpoints() (or NewClient) to clientv3, Stop it when done. Stop
// followed by Start on the same Server reopens the same data directory on the
// same URLs, which is how tests simulate a crash/restart of the store: every
// committed key (high-water marks, lease keys, revisions) survives.
//
// Ports: an empty URL, or one with port 0, listens on a random free port of
// 127.0.0.1; the port actually bound is remembered, so a restart comes back
// on the same address and existing clientv3 clients reconnect by themselves.
//
// Security: http URLs serve plaintext to anyone who reaches the port (the
// tests' default). https URLs (both, as `rangesvc serve` uses) serve TLS
// and require a client certificate of the PKI that Start keeps in
// Dir/pki (pki.go): NewClient presents it, and operators reach the member
// with etcdctl and those files (PKI).
//
// Logs: etcd is chatty. Config.LogLevel defaults to "error"; tests use a nop
// logger (package embedetcdtest, which holds the test helpers so that this
// package does not import testing).
package embedetcd

import (
	"context"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"go.etcd.io/etcd/client/pkg/v3/transport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/embed"
	"go.uber.org/zap"

	"github.com/idrange/idrange/tlsfiles"
)

// Defaults used when a Config field is zero.
const (
	// DefaultName is the etcd member name.
	DefaultName = "idrange"
	// DefaultReadyTimeout bounds how long Start waits for the member to
	// become ready (leader elected, serving clients).
	DefaultReadyTimeout = 30 * time.Second
	// DefaultLogLevel keeps etcd quiet unless something is wrong.
	DefaultLogLevel = "error"
	// DefaultClientURL is the loopback client URL with a random port
	// (plaintext).
	DefaultClientURL = "http://127.0.0.1:0"
	// DefaultPeerURL is the loopback peer URL with a random port
	// (plaintext).
	DefaultPeerURL = "http://127.0.0.1:0"
	// BusyTickMs and BusyElectionMs are generous raft timings for a machine
	// loaded by other work (tests under -race, benchmarks that use every
	// core): a missed heartbeat must not trigger an election mid-run.
	BusyTickMs     = 200
	BusyElectionMs = 2000
)

// Errors returned by Start.
var (
	// ErrNotReady: etcd did not become ready within Config.ReadyTimeout (or
	// the context ended first).
	ErrNotReady = errors.New("embedetcd: etcd did not become ready")
	// ErrDirInUse: another embedded member (in this or another process)
	// holds the data directory.
	ErrDirInUse = errors.New("embedetcd: data dir is in use by another embedded etcd")
)

// lockFile is created in the data dir and flock'ed while a member runs.
const lockFile = "idrange-embedetcd.lock"

// Config configures an embedded etcd member. Only Dir is required.
type Config struct {
	// Dir is the data directory (created if missing). Required.
	Dir string
	// Name is the member name. Default DefaultName.
	Name string
	// ClientURL is where clients connect, e.g. "http://127.0.0.1:2379".
	// Default DefaultClientURL (random loopback port). With https (then
	// PeerURL is https too) the member requires client certificates of
	// the PKI in Dir/pki.
	ClientURL string
	// PeerURL is the raft peer URL (unused by a single node but required by
	// etcd). Default DefaultPeerURL (random loopback port); its scheme is
	// ClientURL's.
	PeerURL string
	// TickMs and ElectionMs are raft timings. Zero keeps etcd's defaults
	// (100 ms / 1000 ms). ElectionMs must be >= 5*TickMs (etcd's rule).
	TickMs, ElectionMs uint
	// ReadyTimeout bounds Start. Default DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// LogLevel is etcd's zap level (debug, info, warn, error). Default
	// DefaultLogLevel. Ignored when Logger is set.
	LogLevel string
	// Logger, if set, receives etcd's logs (zap.NewNop() to silence them).
	Logger *zap.Logger
	// QuotaBackendBytes is etcd's backend size quota; 0 keeps etcd's default
	// (2 GiB). When the backend reaches it, etcd raises the NOSPACE alarm and
	// refuses writes until it is defragmented and the alarm disarmed.
	QuotaBackendBytes int64
	// AutoCompactionRetention turns on etcd's own periodic history
	// compaction, keeping this much history (etcd compacts every
	// retention, or every hour when it is longer). 0 keeps etcd's default:
	// off. The range service's compactor (internal/server/etcdspace) also
	// compacts; both only remove superseded revisions.
	AutoCompactionRetention time.Duration
	// UnsafeNoFsync disables fsync. Only for tests that never simulate a
	// machine crash (process restarts are still durable via the page cache).
	UnsafeNoFsync bool
}

func (c Config) withDefaults() Config {
	if c.Name == "" {
		c.Name = DefaultName
	}
	if c.ClientURL == "" {
		c.ClientURL = DefaultClientURL
	}
	if c.PeerURL == "" {
		c.PeerURL = DefaultPeerURL
	}
	if c.ReadyTimeout == 0 {
		c.ReadyTimeout = DefaultReadyTimeout
	}
	if c.LogLevel == "" {
		c.LogLevel = DefaultLogLevel
	}
	return c
}

// Validate reports the first bad field.
func (c Config) Validate() error {
	c = c.withDefaults()
	if c.Dir == "" {
		return errors.New("embedetcd: Config.Dir is required")
	}
	for field, raw := range map[string]string{"ClientURL": c.ClientURL, "PeerURL": c.PeerURL} {
		if _, err := parseURL(raw); err != nil {
			return errors.Wrapf(err, "embedetcd: Config.%s", field)
		}
	}
	if cu, pu := c.ClientURL, c.PeerURL; !strings.HasPrefix(cu, "https:") != !strings.HasPrefix(pu, "https:") {
		return errors.Newf("embedetcd: Config.ClientURL %q and Config.PeerURL %q: both http or both https (a plaintext peer port would be a way around the client certificates)", cu, pu)
	}
	if c.ReadyTimeout < 0 {
		return errors.Newf("embedetcd: Config.ReadyTimeout %v is negative", c.ReadyTimeout)
	}
	if (c.TickMs == 0) != (c.ElectionMs == 0) {
		return errors.New("embedetcd: set both Config.TickMs and Config.ElectionMs, or neither")
	}
	if c.QuotaBackendBytes < 0 {
		return errors.Newf("embedetcd: Config.QuotaBackendBytes %d is negative", c.QuotaBackendBytes)
	}
	if c.AutoCompactionRetention < 0 {
		return errors.Newf("embedetcd: Config.AutoCompactionRetention %v is negative", c.AutoCompactionRetention)
	}
	if c.TickMs != 0 && c.ElectionMs < 5*c.TickMs {
		return errors.Newf("embedetcd: Config.ElectionMs %d must be >= 5*TickMs (%d)", c.ElectionMs, 5*c.TickMs)
	}
	return nil
}

func parseURL(raw string) (url.URL, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return url.URL{}, errors.Wrapf(err, "url %q", raw)
	}
	if u.Scheme != "http" && u.Scheme != "https" {
		return url.URL{}, errors.Newf("url %q: want http://host:port or https://host:port", raw)
	}
	host, port, err := net.SplitHostPort(u.Host)
	if err != nil || host == "" {
		return url.URL{}, errors.Newf("url %q: want %s://host:port", raw, u.Scheme)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 0 || p > 65535 {
		return url.URL{}, errors.Newf("url %q: bad port", raw)
	}
	if u.Path != "" && u.Path != "/" {
		return url.URL{}, errors.Newf("url %q: must not have a path", raw)
	}
	return url.URL{Scheme: u.Scheme, Host: u.Host}, nil
}

// Server is an embedded single-node etcd. Its methods are safe for
// concurrent use, but Start/Stop are meant to be called from one goroutine.
type Server struct {
	cfg Config

	mu        sync.Mutex
	e         *embed.Etcd
	unlock    func()      // releases the data dir lock
	lingering atomic.Bool // the last Stop left etcd's close running
	clientURL url.URL     // actual bound address after the first start
	peerURL   url.URL
	pki       PKI // the files of a secured member, after Start
}

// New validates cfg and returns a stopped Server. Call Start.
func New(cfg Config) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	cu, _ := parseURL(cfg.ClientURL)
	pu, _ := parseURL(cfg.PeerURL)
	return &Server{cfg: cfg, clientURL: cu, peerURL: pu}, nil
}

// Start is New followed by Server.Start.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	s, err := New(cfg)
	if err != nil {
		return nil, err
	}
	if err := s.Start(ctx); err != nil {
		return nil, err
	}
	return s, nil
}

// Start launches etcd on the Server's data directory and waits until it
// serves clients, or ReadyTimeout / ctx ends (then it is stopped again and
// ErrNotReady is returned). Starting a running Server is an error. After a
// Stop, Start reopens the same directory on the same addresses.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e != nil {
		return errors.New("embedetcd: already running")
	}
	if err := os.MkdirAll(s.cfg.Dir, 0o700); err != nil {
		return errors.Wrapf(err, "embedetcd: data dir %q", s.cfg.Dir)
	}
	unlock, err := lockDir(s.cfg.Dir)
	if err != nil {
		return err
	}
	started := false
	defer func() {
		if !started {
			unlock()
		}
	}()
	secure := s.clientURL.Scheme == "https"
	if secure {
		// The configured hosts, not the bound ones: a wildcard stays a
		// wildcard, and the certificate does not change with the port.
		cu, _ := parseURL(s.cfg.ClientURL)
		pu, _ := parseURL(s.cfg.PeerURL)
		if s.pki, err = ensurePKI(s.cfg.Dir, serverHosts(cu, pu), time.Now()); err != nil {
			return err
		}
	}
	ec := embed.NewConfig()
	ec.Name = s.cfg.Name
	ec.Dir = s.cfg.Dir
	ec.ListenClientUrls = []url.URL{s.clientURL}
	ec.AdvertiseClientUrls = []url.URL{s.clientURL}
	ec.ListenPeerUrls = []url.URL{s.peerURL}
	ec.AdvertisePeerUrls = []url.URL{s.peerURL}
	ec.InitialCluster = ec.InitialClusterFromName(s.cfg.Name)
	if secure {
		tls := transport.TLSInfo{CertFile: s.pki.ServerCert, KeyFile: s.pki.ServerKey,
			TrustedCAFile: s.pki.CACert, ClientCertAuth: true}
		ec.ClientTLSInfo, ec.PeerTLSInfo = tls, tls
	}
	if s.cfg.TickMs != 0 {
		ec.TickMs = s.cfg.TickMs
		ec.ElectionMs = s.cfg.ElectionMs
	}
	if s.cfg.QuotaBackendBytes != 0 {
		ec.QuotaBackendBytes = s.cfg.QuotaBackendBytes
	}
	if s.cfg.AutoCompactionRetention > 0 {
		ec.AutoCompactionMode = embed.CompactorModePeriodic
		ec.AutoCompactionRetention = s.cfg.AutoCompactionRetention.String()
	}
	ec.UnsafeNoFsync = s.cfg.UnsafeNoFsync
	ec.LogLevel = s.cfg.LogLevel
	if s.cfg.Logger != nil {
		ec.ZapLoggerBuilder = embed.NewZapLoggerBuilder(s.cfg.Logger)
	}

	e, err := embed.StartEtcd(ec)
	if err != nil {
		return errors.Wrapf(err, "embedetcd: start on %q", s.cfg.Dir)
	}
	timer := time.NewTimer(s.cfg.ReadyTimeout)
	defer timer.Stop()
	select {
	case <-e.Server.ReadyNotify():
	case err := <-e.Err():
		e.Close()
		return errors.Wrapf(err, "embedetcd: etcd failed while starting on %q", s.cfg.Dir)
	case <-timer.C:
		e.Close()
		return errors.Wrapf(ErrNotReady, "within %v (data dir %q)", s.cfg.ReadyTimeout, s.cfg.Dir)
	case <-ctx.Done():
		e.Close()
		return errors.Wrapf(ErrNotReady, "%v (data dir %q)", ctx.Err(), s.cfg.Dir)
	}
	// Remember the ports actually bound so a restart reuses them (on the
	// configured host: a wildcard bound as [::] stays what it was).
	if len(e.Clients) > 0 {
		s.clientURL.Host = withPort(s.clientURL, e.Clients[0].Addr())
	}
	if len(e.Peers) > 0 && e.Peers[0].Listener != nil {
		s.peerURL.Host = withPort(s.peerURL, e.Peers[0].Addr())
	}
	s.e, s.unlock, started = e, unlock, true
	return nil
}

// StopGrace bounds how long Stop waits for etcd's own close once the
// member has stopped (raft, WAL and backend closed: the data is safe).
// etcd's peer server can otherwise wait forever for connections that
// never finished a handshake, which a flood of the peer port leaves.
const StopGrace = 5 * time.Second

// Stop shuts etcd down and waits for it: for the member to stop, then at
// most StopGrace for etcd to close its servers (Lingering reports a close
// that was still running then). Stopping a stopped Server is a no-op.
// Clients connected to it see Unavailable until it is started again.
func (s *Server) Stop() {
	s.mu.Lock()
	e, unlock := s.e, s.unlock
	s.e, s.unlock = nil, nil
	s.mu.Unlock()
	if e == nil {
		return
	}
	closed := make(chan struct{})
	go func() {
		e.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-e.Server.StopNotify():
		t := time.NewTimer(StopGrace)
		select {
		case <-closed:
		case <-t.C:
			s.lingering.Store(true)
		}
		t.Stop()
	}
	unlock()
}

// Lingering reports whether the last Stop returned while etcd was still
// closing its servers (see StopGrace).
func (s *Server) Lingering() bool { return s.lingering.Load() }

// Close is Stop, for io.Closer-style cleanup.
func (s *Server) Close() error {
	s.Stop()
	return nil
}

// Running reports whether Start succeeded and Stop was not called since.
func (s *Server) Running() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.e != nil
}

// Err delivers a fatal error of the running member (nil channel when
// stopped). A serving process should watch it and exit.
func (s *Server) Err() <-chan error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.e == nil {
		return nil
	}
	return s.e.Err()
}

// Dir is the data directory.
func (s *Server) Dir() string { return s.cfg.Dir }

// Endpoints are the client addresses to give clientv3.Config.Endpoints. After
// the first Start they name the port actually bound; a wildcard listen host
// (0.0.0.0, ::) is given as the loopback address, which the server
// certificate names.
func (s *Server) Endpoints() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return []string{dialable(s.clientURL)}
}

// PeerEndpoint is the peer URL, as Endpoints gives the client URL.
func (s *Server) PeerEndpoint() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return dialable(s.peerURL)
}

// withPort is u's host with the port of bound.
func withPort(u url.URL, bound net.Addr) string {
	_, port, err := net.SplitHostPort(bound.String())
	if err != nil {
		return bound.String()
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// dialable is u with a wildcard host replaced by loopback.
func dialable(u url.URL) string {
	host, port, err := net.SplitHostPort(u.Host)
	if ip := net.ParseIP(host); err == nil && ip != nil && ip.IsUnspecified() {
		lo := "127.0.0.1"
		if ip.To4() == nil {
			lo = "::1"
		}
		u.Host = net.JoinHostPort(lo, port)
	}
	return u.String()
}

// PKI names the files of a secured member's PKI (valid after Start; zero
// for a plaintext member).
func (s *Server) PKI() PKI {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.pki
}

// NewClient connects a clientv3 client to the server, with the PKI's
// client certificate when the member is secured. The caller closes it.
// A nil logger selects zap.NewNop (the client's own logs are noise here).
func (s *Server) NewClient(lg *zap.Logger) (*clientv3.Client, error) {
	if lg == nil {
		lg = zap.NewNop()
	}
	cfg := clientv3.Config{
		Endpoints:   s.Endpoints(),
		DialTimeout: 5 * time.Second,
		Logger:      lg,
	}
	if p := s.PKI(); p.Dir != "" {
		tc, err := tlsfiles.Files{Cert: p.ClientCert, Key: p.ClientKey, CA: p.CACert}.ClientConfig()
		if err != nil {
			return nil, errors.Wrap(err, "embedetcd: client certificate")
		}
		cfg.TLS = tc
	}
	cli, err := clientv3.New(cfg)
	if err != nil {
		return nil, errors.Wrap(err, "embedetcd: new client")
	}
	return cli, nil
}
