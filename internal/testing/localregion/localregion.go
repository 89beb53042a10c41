// Package localregion stands up in-process range-service replicas for the
// benchmarks and the tests. Start wraps region.NewReplica, the one
// construction of a replica that `rangesvc serve` runs: an embedded etcd
// (or a shared one), a replica on 127.0.0.1:<random port>, counters of what
// the store did and server-side RPC latency. `rangesvc-bench compare`,
// `rangesvc-bench bench` and the tests use Start, so they measure and test
// the server users run (etcd transactions with fsync, loopback gRPC)
// without a separate process.
//
// Test helpers (testing.TB wrappers) are in
// internal/testing/localregion/regiontest; this package does not import
// testing, so the benchmark binary can link it.
package localregion

import (
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/region"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/snowflake"
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

// StartEtcd starts an embedded single-node etcd on random loopback ports
// with embedetcd's busy-machine raft timings (the benchmarks load every
// core). An empty dir means a fresh temporary directory, removed by Close.
// fsync stays on: grant latency includes the disk, as it would in
// production.
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
		TickMs:     embedetcd.BusyTickMs,
		ElectionMs: embedetcd.BusyElectionMs,
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

// Config configures one in-process region replica.
type Config struct {
	// Region is the region code (0..3).
	Region int
	// Etcd is the store to use; share one between replicas (and regions)
	// to model several replicas on one etcd. nil starts a private one
	// (StartEtcd with a temporary directory) that Close stops.
	Etcd *embedetcd.Server
	// SharedEtcd: regions of different codes share Etcd (a test and
	// benchmark model; production runs one etcd per region), so the
	// replica neither writes nor checks the region record
	// (internal/server/regionid). false: the first replica initialises the record
	// and every replica checks it, as rangesvc serve does.
	SharedEtcd bool
	// Store tunes the store.Store (lease TTL, policy, prefix).
	Store store.Config
	// Now is the service clock; pass a fakeclock.Offset's Now to move it.
	// Default time.Now.
	Now func() time.Time
	// NextMinter opens the minter EnableNext installs behind the Next RPC
	// (a rangeclient.New over the given allocator). nil: EnableNext fails.
	NextMinter region.NextFunc
	// Logger receives store and service logs; nil discards them.
	Logger *slog.Logger
	// SharedRate is ReplicaConfig.SharedRate: the shared path's bound per
	// identity in IDs/s (0: the service's default; negative: off).
	SharedRate float64
	// TLS, AllowedIdentities and AdminIdentities are the replica's
	// (region.ReplicaConfig): TLS on the gRPC port, mutual TLS with identity-bound
	// leases when TLS requires client certificates. Addr stays
	// 127.0.0.1:port; the certificate must name 127.0.0.1 or the client
	// must set its ServerName.
	TLS                                *tls.Config
	AllowedIdentities, AdminIdentities []authz.Pattern
}

// Counts are the store operations a region performed. Grants, Acquires and
// Releases are etcd writes (each one committed write; grants for different
// codes may share a Txn, see Txns); Renewals are lease keep-alives (handled
// by the etcd leader, not a raft write).
type Counts struct {
	Grants       uint64 `json:"grants"`
	GrantedUnits uint64 `json:"granted_units"` // linear units (IDs) granted
	GrantErrors  uint64 `json:"grant_errors"`
	Conflicts    uint64 `json:"conflicts"` // HWM races lost and retried
	Acquires     uint64 `json:"acquires"`
	Releases     uint64 `json:"releases"`
	Renewals     uint64 `json:"renewals"`
	RenewErrors  uint64 `json:"renew_errors"`
	// Txns are the write transactions sent to etcd (grants, acquisitions,
	// releases, failed compares included), each one raft proposal: fewer
	// than the writes above when grants are group-committed.
	Txns uint64 `json:"txns"`
	// SharedRuns are the shared runs granted (AllocateShared, one per
	// call, and AllocateSharedBatch, one per granted request).
	SharedRuns uint64 `json:"shared_runs"`
}

// Writes is the number of etcd writes: grants + acquisitions + releases.
func (c Counts) Writes() uint64 { return c.Grants + c.Acquires + c.Releases }

// Add is c + o per field.
func (c Counts) Add(o Counts) Counts {
	return Counts{
		Grants: c.Grants + o.Grants, GrantedUnits: c.GrantedUnits + o.GrantedUnits,
		GrantErrors: c.GrantErrors + o.GrantErrors, Conflicts: c.Conflicts + o.Conflicts,
		Acquires: c.Acquires + o.Acquires, Releases: c.Releases + o.Releases,
		Renewals: c.Renewals + o.Renewals, RenewErrors: c.RenewErrors + o.RenewErrors,
		Txns: c.Txns + o.Txns, SharedRuns: c.SharedRuns + o.SharedRuns,
	}
}

// Sub is c - o per field.
func (c Counts) Sub(o Counts) Counts {
	return Counts{
		Grants: c.Grants - o.Grants, GrantedUnits: c.GrantedUnits - o.GrantedUnits,
		GrantErrors: c.GrantErrors - o.GrantErrors, Conflicts: c.Conflicts - o.Conflicts,
		Acquires: c.Acquires - o.Acquires, Releases: c.Releases - o.Releases,
		Renewals: c.Renewals - o.Renewals, RenewErrors: c.RenewErrors - o.RenewErrors,
		Txns: c.Txns - o.Txns, SharedRuns: c.SharedRuns - o.SharedRuns,
	}
}

type counter struct {
	store.NopObserver
	grants, units, grantErrs, conflicts, acquires, releases, renewals, renewErrs atomic.Uint64
	sharedRuns                                                                   atomic.Uint64

	latMu    sync.Mutex
	grantLat measure.Histogram // the store's time per grant, etcd included
}

func (c *counter) Granted(_, _ int, size int64, d time.Duration) {
	c.grants.Add(1)
	c.units.Add(uint64(size))
	c.latMu.Lock()
	c.grantLat.Record(d)
	c.latMu.Unlock()
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

// countingStorage counts the write Txns sent to etcd (each one raft
// proposal; a group commit of many grants is one). It keeps the storage's
// group commit (store.BatchStorage).
type countingStorage struct {
	store.BatchStorage
	n *atomic.Uint64
}

var _ store.BatchStorage = countingStorage{}

func (c countingStorage) CreateOwner(ctx context.Context, region, worker int, highWaterRev int64, value []byte, lease int64) (int64, bool, error) {
	c.n.Add(1)
	return c.BatchStorage.CreateOwner(ctx, region, worker, highWaterRev, value, lease)
}

func (c countingStorage) CommitHighWater(ctx context.Context, region, worker int, hc store.HighWaterCommit) (int64, bool, store.CodeView, error) {
	c.n.Add(1)
	return c.BatchStorage.CommitHighWater(ctx, region, worker, hc)
}

func (c countingStorage) CommitHighWaters(ctx context.Context, ops []store.GrantOp) ([]store.GrantResult, error) {
	if len(ops) > 0 {
		c.n.Add(1)
	}
	return c.BatchStorage.CommitHighWaters(ctx, ops)
}

func (c countingStorage) DeleteOwner(ctx context.Context, region, worker int, token, lease int64) (bool, store.CodeView, error) {
	c.n.Add(1)
	return c.BatchStorage.DeleteOwner(ctx, region, worker, token, lease)
}

// Region is one in-process replica of a region, listening on loopback. It
// can be killed and restarted on the same address, etcd, etcd client and
// clock, as a restarted process would be.
type Region struct {
	cfg     Config
	etcd    *embedetcd.Server
	ownEtcd *Etcd
	cli     *clientv3.Client
	addr    string
	count   *counter
	txns    atomic.Uint64 // write Txns sent to etcd, across Restart

	latMu sync.Mutex
	lat   map[string]*measure.Histogram // server-side latency per RPC method

	mu        sync.Mutex
	rep       *region.Replica // nil while stopped
	last      *region.Replica // the current or last replica (accessors)
	minter    service.MinterCloser
	closeOnce sync.Once
	closeErr  error
}

// Start stands up the replica and returns once its gRPC server listens.
func Start(ctx context.Context, cfg Config) (*Region, error) {
	if cfg.Region < 0 || cfg.Region > snowflake.MaxRegion {
		return nil, errors.Newf("region: Config.Region %d not in 0..%d", cfg.Region, snowflake.MaxRegion)
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Region{cfg: cfg, etcd: cfg.Etcd, count: &counter{}, lat: map[string]*measure.Histogram{}}
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
		r.ownEtcd, r.etcd = e, e.Server
	}
	cli, err := r.etcd.NewClient(nil)
	if err != nil {
		return nil, err
	}
	r.cli = cli
	if err := r.start("127.0.0.1:0"); err != nil {
		return nil, err
	}
	ok = true
	return r, nil
}

// start builds a fresh replica and serves it on addr.
func (r *Region) start(addr string) error {
	rep, err := region.NewReplica(region.ReplicaConfig{
		Region:       r.cfg.Region,
		Etcd:         r.cli,
		Store:        r.cfg.Store,
		Now:          r.cfg.Now,
		Observer:     r.count,
		Interceptors: []grpc.UnaryServerInterceptor{r.timeRPC},
		Logger:       r.cfg.Logger,
		WrapStorage: func(s store.BatchStorage) store.BatchStorage {
			return countingStorage{s, &r.txns}
		},
		SharedRate: r.cfg.SharedRate,
		// An in-process region's etcd is its own: the first replica
		// initialises the region record (as rangesvc serve does on its
		// embedded etcd).
		InitRegion: true,
		SharedEtcd: r.cfg.SharedEtcd,

		TLS:               r.cfg.TLS,
		AllowedIdentities: r.cfg.AllowedIdentities,
		AdminIdentities:   r.cfg.AdminIdentities,
	})
	if err != nil {
		return errors.Wrap(err, "region")
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return errors.Wrapf(err, "region: listen %s", addr)
	}
	rep.Serve(lis)
	r.mu.Lock()
	r.rep, r.last, r.addr = rep, rep, lis.Addr().String()
	r.mu.Unlock()
	return nil
}

// timeRPC records each RPC's server-side latency (decode to reply, store
// included) per method, and counts the shared runs granted.
func (r *Region) timeRPC(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	start := time.Now()
	resp, err := handler(ctx, req)
	d := time.Since(start)
	switch resp := resp.(type) {
	case *idrangev1.AllocateSharedResponse:
		if err == nil {
			r.count.sharedRuns.Add(1)
		}
	case *idrangev1.AllocateSharedBatchResponse:
		for _, res := range resp.GetResults() {
			if res.GetRun() != nil {
				r.count.sharedRuns.Add(1)
			}
		}
	}
	m := info.FullMethod
	if i := strings.LastIndexByte(m, '/'); i >= 0 {
		m = m[i+1:]
	}
	r.latMu.Lock()
	h := r.lat[m]
	if h == nil {
		h = measure.NewHistogram()
		r.lat[m] = h
	}
	h.Record(d)
	r.latMu.Unlock()
	return resp, err
}

// RPCLatency returns a copy of the server-side latency histogram of each
// RPC method served so far ("AllocateBlock", "RenewLease", ...).
func (r *Region) RPCLatency() map[string]*measure.Histogram {
	r.latMu.Lock()
	defer r.latMu.Unlock()
	out := make(map[string]*measure.Histogram, len(r.lat))
	for m, h := range r.lat {
		c := measure.NewHistogram()
		c.Merge(h)
		out[m] = c
	}
	return out
}

// RegionID is the region code.
func (r *Region) RegionID() int { return r.cfg.Region }

// Addr is the gRPC address, 127.0.0.1:port (stable across Restart).
func (r *Region) Addr() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.addr
}

func (r *Region) replica() *region.Replica {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last
}

// Store is the replica's store.Store (a new one after Restart).
func (r *Region) Store() *store.Store { return r.replica().Store() }

// Service is the replica's gRPC service (a new one after Restart).
func (r *Region) Service() *service.Service { return r.replica().Service() }

// Registry holds the replica's metrics (a new registry after Restart).
func (r *Region) Registry() *prometheus.Registry { return r.replica().Registry() }

// Etcd is the etcd the region uses.
func (r *Region) Etcd() *embedetcd.Server { return r.etcd }

// Client is the replica's own etcd client (one connection per replica,
// kept across Restart).
func (r *Region) Client() *clientv3.Client { return r.cli }

// Counts reads the store's operation counters (summed across Restart).
func (r *Region) Counts() Counts {
	c := r.count
	return Counts{
		Grants: c.grants.Load(), GrantedUnits: c.units.Load(), GrantErrors: c.grantErrs.Load(),
		Conflicts: c.conflicts.Load(), Acquires: c.acquires.Load(), Releases: c.releases.Load(),
		Renewals: c.renewals.Load(), RenewErrors: c.renewErrs.Load(), Txns: r.txns.Load(),
		SharedRuns: c.sharedRuns.Load(),
	}
}

// GrantLatency returns a copy of the histogram of the store's time per
// granted block (the etcd write included), whoever asked: a client's
// AllocateBlock or the replica's own Next minter, which calls the store
// directly and so has no RPC latency of its own.
func (r *Region) GrantLatency() *measure.Histogram {
	c := r.count
	h := measure.NewHistogram()
	c.latMu.Lock()
	h.Merge(&c.grantLat)
	c.latMu.Unlock()
	return h
}

// EtcdWrites is Counts().Writes().
func (r *Region) EtcdWrites() uint64 { return r.Counts().Writes() }

// EnableNext opens a minter with Config.NextMinter now (so a measurement of
// Next does not pay for its lease) and serves the Next RPC with it until
// stop is called or the replica stops. It is not on by default so that its
// background refills are not charged to other measurements.
func (r *Region) EnableNext(ctx context.Context) (stop func() error, err error) {
	if r.cfg.NextMinter == nil {
		return nil, errors.New("region: Config.NextMinter is not set")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.rep == nil:
		return nil, errors.New("region: replica is stopped")
	case r.minter != nil:
		return nil, errors.New("region: Next is already enabled")
	}
	// The replica's minter pool, as rangesvc serve runs it: its first
	// code taken now, more as demand needs them.
	st, region := r.rep.Store(), r.cfg.Region
	m, err := mintpool.New(mintpool.Config{
		Open: func(ctx context.Context) (mintpool.Minter, error) {
			return r.cfg.NextMinter(ctx, st, region)
		},
		Now:    r.cfg.Now,
		Logger: r.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	if err := m.Open(ctx); err != nil {
		return nil, errors.Wrap(err, "region: minter for Next")
	}
	runCtx, cancel := context.WithCancel(context.Background())
	ran := make(chan struct{})
	go func() { m.Run(runCtx); close(ran) }()
	svc := r.rep.Service()
	r.minter = m
	svc.SetMinter(m)
	var once sync.Once
	return func() error {
		once.Do(func() {
			r.mu.Lock()
			if r.minter == m {
				r.minter = nil
			}
			r.mu.Unlock()
			svc.SetMinter(nil)
			cancel()
			<-ran
			err = m.Close()
		})
		return err
	}, nil
}

// Stop drains the gRPC server gracefully (in-flight RPCs finish). The
// etcd client stays open; etcd keeps running. Restart brings it back.
func (r *Region) Stop() { r.stop(DefaultDrainTimeout) }

// Kill closes the gRPC server at once (in-flight RPCs fail), as a crash of
// the replica would. Killing a stopped replica is a no-op.
func (r *Region) Kill() { r.stop(0) }

// DefaultDrainTimeout bounds Stop's graceful drain.
const DefaultDrainTimeout = 10 * time.Second

func (r *Region) stop(grace time.Duration) error {
	r.mu.Lock()
	rep, m := r.rep, r.minter
	r.rep, r.minter = nil, nil
	r.mu.Unlock()
	if rep == nil {
		return nil
	}
	rep.Stop(grace)
	if m != nil {
		return m.Close() // Next's own lease, given back as serve's is
	}
	return nil
}

// Restart stops the replica (if running) and starts a fresh Store and
// Service on the same address, etcd client and clock: what a restarted
// process would have, minus the process.
func (r *Region) Restart() error {
	r.Kill()
	return r.start(r.Addr())
}

// Close stops the replica, closes its etcd client and, if the region
// started it, etcd.
func (r *Region) Close() error {
	r.closeOnce.Do(func() { r.closeErr = r.teardown() })
	return r.closeErr
}

func (r *Region) teardown() error {
	errs := []error{r.stop(0)}
	if r.cli != nil {
		errs = append(errs, r.cli.Close())
	}
	if r.ownEtcd != nil {
		errs = append(errs, r.ownEtcd.Close())
	}
	return errors.Join(errs...)
}
