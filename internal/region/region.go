// Package region stands up a complete range-service region inside the
// process, outside of tests: an embedded etcd (or a shared one), a
// segment.Store over its own etcd client, an internal/service.Service and a
// gRPC server on 127.0.0.1:<random port>. `rangesvc compare` and
// `rangesvc bench` use it so that one command measures the real stack
// (etcd transactions with fsync, loopback gRPC) without a separate process.
//
// It counts what the store does (grants, acquisitions, releases, renewals,
// HWM races) through the store's Observer, so callers can report etcd
// writes per ID as a count.
//
// internal/testenv is the test-only counterpart (it takes a testing.TB and
// can restart parts); it could be rebuilt on this package.
package region

import (
	"context"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/internal/hdr"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/segment/etcdstore"
	"github.com/idrange/idrange/snowflake"
)

// Raft timings of the embedded etcd StartEtcd starts: generous, because
// the benchmarks load a 2-core machine fully and a missed heartbeat must not
// trigger an election mid-run.
const (
	TickMs     = 200
	ElectionMs = 2000
)

// Etcd is an embedded etcd started by StartEtcd, possibly shared by several
// regions. Close stops it and removes its data directory if StartEtcd
// created it.
type Etcd struct {
	*embedetcd.Server
	removeDir string
}

// Close stops etcd and removes a temporary data directory.
func (e *Etcd) Close() error {
	e.Server.Stop()
	if e.removeDir != "" {
		return os.RemoveAll(e.removeDir)
	}
	return nil
}

// StartEtcd starts an embedded single-node etcd on random loopback ports.
// An empty dir means a fresh temporary directory, removed by Close. fsync
// stays on: grant latency includes the disk, as it would in production.
func StartEtcd(ctx context.Context, dir string) (*Etcd, error) {
	e := &Etcd{}
	if dir == "" {
		d, err := os.MkdirTemp("", "idrange-etcd-*")
		if err != nil {
			return nil, errors.Wrap(err, "region: temporary etcd data dir")
		}
		dir, e.removeDir = d, d
	}
	srv, err := embedetcd.Start(ctx, embedetcd.Config{
		Dir:        dir,
		TickMs:     TickMs,
		ElectionMs: ElectionMs,
		Logger:     zap.NewNop(),
	})
	if err != nil {
		if e.removeDir != "" {
			os.RemoveAll(e.removeDir)
		}
		return nil, err
	}
	e.Server = srv
	return e, nil
}

// Config configures one region.
type Config struct {
	// Region is the region code (0..3).
	Region int
	// Etcd is the store to use. nil starts a private one (StartEtcd with a
	// temporary directory) that Close stops.
	Etcd *Etcd
	// Store tunes the segment.Store (lease TTL, policy, prefix); its
	// Observer is set by Start.
	Store segment.StoreConfig
	// Logger receives store and service logs; nil discards them.
	Logger *slog.Logger
}

// Counts are the store operations a region performed. Grants, Acquires and
// Releases are etcd writes (each one committed transaction); Renewals are
// lease keep-alives (handled by the etcd leader, not a raft write).
type Counts struct {
	Grants       uint64 `json:"grants"`
	GrantedUnits uint64 `json:"granted_units"` // linear units (IDs) granted
	GrantErrors  uint64 `json:"grant_errors"`
	Conflicts    uint64 `json:"conflicts"` // HWM races lost and retried
	Acquires     uint64 `json:"acquires"`
	Releases     uint64 `json:"releases"`
	Renewals     uint64 `json:"renewals"`
	RenewErrors  uint64 `json:"renew_errors"`
}

// Writes is the number of etcd writes: grants + acquisitions + releases.
func (c Counts) Writes() uint64 { return c.Grants + c.Acquires + c.Releases }

// Sub is c - o per field.
func (c Counts) Sub(o Counts) Counts {
	return Counts{
		Grants: c.Grants - o.Grants, GrantedUnits: c.GrantedUnits - o.GrantedUnits,
		GrantErrors: c.GrantErrors - o.GrantErrors, Conflicts: c.Conflicts - o.Conflicts,
		Acquires: c.Acquires - o.Acquires, Releases: c.Releases - o.Releases,
		Renewals: c.Renewals - o.Renewals, RenewErrors: c.RenewErrors - o.RenewErrors,
	}
}

type counter struct {
	segment.NopObserver
	grants, units, grantErrs, conflicts, acquires, releases, renewals, renewErrs atomic.Uint64
}

func (c *counter) Granted(_, _ int, size int64, _ time.Duration) {
	c.grants.Add(1)
	c.units.Add(uint64(size))
}
func (c *counter) GrantFailed(int, int, error, time.Duration) { c.grantErrs.Add(1) }
func (c *counter) Conflict(int, int)                          { c.conflicts.Add(1) }
func (c *counter) Acquired(int, int)                          { c.acquires.Add(1) }
func (c *counter) Released(_, _ int, err error) {
	if err == nil {
		c.releases.Add(1)
	}
}
func (c *counter) Renewed(_, _ int, err error) {
	if err == nil {
		c.renewals.Add(1)
	} else {
		c.renewErrs.Add(1)
	}
}

// Region is one running region.
type Region struct {
	cfg     Config
	etcd    *Etcd
	ownEtcd bool
	cli     *clientv3.Client
	store   *segment.Store
	svc     *service.Service
	srv     *grpc.Server
	lis     net.Listener
	count   *counter
	cancel  context.CancelFunc
	done    chan struct{}

	latMu sync.Mutex
	lat   map[string]*hdr.Histogram // server-side latency per RPC method

	mu        sync.Mutex
	minter    *rangeclient.Client
	closeOnce sync.Once
	closeErr  error
}

// Start stands up the region and returns once its gRPC server listens.
func Start(ctx context.Context, cfg Config) (*Region, error) {
	if cfg.Region < 0 || cfg.Region > snowflake.MaxRegion {
		return nil, errors.Newf("region: Config.Region %d not in 0..%d", cfg.Region, snowflake.MaxRegion)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Region{cfg: cfg, etcd: cfg.Etcd, count: &counter{}, done: make(chan struct{}), lat: map[string]*hdr.Histogram{}}
	ok := false
	defer func() {
		if !ok {
			r.teardown()
		}
	}()
	if r.etcd == nil {
		e, err := StartEtcd(ctx, "")
		if err != nil {
			return nil, err
		}
		r.etcd, r.ownEtcd = e, true
	}
	cli, err := r.etcd.NewClient(nil)
	if err != nil {
		return nil, err
	}
	r.cli = cli
	sc := cfg.Store
	sc.Observer = r.count
	sc.Logger = cfg.Logger
	stg, err := etcdstore.New(cli, etcdstore.Config{Logger: cfg.Logger})
	if err != nil {
		return nil, errors.Wrap(err, "region: etcd storage")
	}
	r.store, err = segment.NewStore(stg, sc)
	if err != nil {
		return nil, errors.Wrap(err, "region: segment store")
	}
	regionCode := cfg.Region
	r.svc, err = service.New(service.Config{
		Region:    regionCode,
		Allocator: r.store,
		MaxBlock:  int(r.store.Policy().MaxBlock),
		FreeCodes: func(ctx context.Context) (int, error) { return r.store.FreeCodes(ctx, regionCode) },
		Logger:    cfg.Logger,
	})
	if err != nil {
		return nil, errors.Wrap(err, "region: service")
	}
	r.lis, err = net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, errors.Wrap(err, "region: listen")
	}
	r.srv = grpc.NewServer(grpc.ChainUnaryInterceptor(r.timeRPC))
	r.svc.Register(r.srv)
	rctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go r.srv.Serve(r.lis)
	go func() { r.svc.Run(rctx); close(r.done) }()
	ok = true
	return r, nil
}

// timeRPC records each RPC's server-side latency (decode to reply, store
// included) per method.
func (r *Region) timeRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	d := time.Since(start)
	m := info.FullMethod
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	r.latMu.Lock()
	h := r.lat[m]
	if h == nil {
		h = hdr.New()
		r.lat[m] = h
	}
	h.Record(d)
	r.latMu.Unlock()
	return resp, err
}

// RPCLatency returns a copy of the server-side latency histogram of each
// RPC method served so far ("AllocateBlock", "RenewLease", ...).
func (r *Region) RPCLatency() map[string]*hdr.Histogram {
	r.latMu.Lock()
	defer r.latMu.Unlock()
	out := make(map[string]*hdr.Histogram, len(r.lat))
	for m, h := range r.lat {
		c := hdr.New()
		c.Merge(h)
		out[m] = c
	}
	return out
}

// RegionID is the region code.
func (r *Region) RegionID() int { return r.cfg.Region }

// Addr is the gRPC address, 127.0.0.1:port.
func (r *Region) Addr() string { return r.lis.Addr().String() }

// Store is the region's segment.Store (an in-process Allocator).
func (r *Region) Store() *segment.Store { return r.store }

// Service is the region's gRPC service.
func (r *Region) Service() *service.Service { return r.svc }

// Etcd is the etcd the region uses.
func (r *Region) Etcd() *Etcd { return r.etcd }

// Counts reads the store's operation counters.
func (r *Region) Counts() Counts {
	c := r.count
	return Counts{
		Grants: c.grants.Load(), GrantedUnits: c.units.Load(), GrantErrors: c.grantErrs.Load(),
		Conflicts: c.conflicts.Load(), Acquires: c.acquires.Load(), Releases: c.releases.Load(),
		Renewals: c.renewals.Load(), RenewErrors: c.renewErrs.Load(),
	}
}

// EtcdWrites is Counts().Writes().
func (r *Region) EtcdWrites() uint64 { return r.Counts().Writes() }

// EnableNext installs a rangeclient over the in-process store behind the
// service's Next RPC (the per-ID baseline) until stop is called. It is not
// on by default so that its background refills are not charged to other
// measurements.
func (r *Region) EnableNext(ctx context.Context) (stop func() error, err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.minter != nil {
		return nil, errors.New("region: Next is already enabled")
	}
	c, err := rangeclient.New(ctx, rangeclient.Config{
		Allocator: r.store,
		Region:    r.cfg.Region,
		Owner:     "rangesvc/next-rpc",
		Logger:    r.cfg.Logger,
	})
	if err != nil {
		return nil, errors.Wrap(err, "region: minter for Next")
	}
	r.minter = c
	r.svc.SetMinter(c)
	var once sync.Once
	return func() error {
		var err error
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.svc.SetMinter(nil)
			err = c.Close()
			r.minter = nil
		})
		return err
	}, nil
}

// Close stops the gRPC server, the service, the Next minter and, if the
// region started it, etcd.
func (r *Region) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.teardown() })
	return r.closeErr
}

func (r *Region) teardown() error {
	var errs []error
	r.mu.Lock()
	m := r.minter
	r.minter = nil
	r.mu.Unlock()
	if m != nil {
		errs = append(errs, m.Close())
	}
	if r.svc != nil {
		r.svc.Shutdown()
	}
	if r.srv != nil {
		r.srv.Stop()
	}
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
	if r.cli != nil {
		errs = append(errs, r.cli.Close())
	}
	if r.ownEtcd && r.etcd != nil {
		errs = append(errs, r.etcd.Close())
	}
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
