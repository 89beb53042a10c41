// Package region builds one range-service replica. NewReplica is the one
// construction (a store.Store over an etcd client behind the region
// identity's guard, internal/server/service.Service, the AdminService, a
// gRPC server with the production options) that `rangesvc serve` runs.
// The in-process harness that wraps it for benchmarks and tests is
// internal/testing/localregion.
package region

import (
	"cmp"
	"context"
	"crypto/tls"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/reflection"

	"github.com/idrange/idrange/internal/server/admin"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/etcdspace"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/segment"
)

// DefaultEtcdTimeout bounds each etcd health probe of a replica (and
// rangesvc serve's connection to etcd).
const DefaultEtcdTimeout = 5 * time.Second

// NextFunc opens the minter behind the Next RPC over the replica's own
// store; rangesvc serve passes a rangeclient.New. (This package does not
// import rangeclient, so that rangeclient's own tests can stand up regions.)
type NextFunc func(ctx context.Context, a segment.Allocator, region int) (service.MinterCloser, error)

// ReplicaConfig is what one range-service replica is built from. `rangesvc
// serve` fills it from its flags; Start fills it for in-process regions, so
// tests and benchmarks run the server users run.
type ReplicaConfig struct {
	// Region is the region code (0..3) the replica serves.
	Region int
	// Etcd is the replica's etcd client (required); the caller closes it
	// after Stop.
	Etcd *clientv3.Client
	// Prefix is the etcd key prefix of the replica's state. Default
	// etcdstore.DefaultPrefix.
	Prefix string
	// Store tunes the store.Store (lease TTL, policy); its Now, Logger and
	// Observer are set by NewReplica.
	Store store.Config
	// Now is the service clock of the store, the service and the
	// metrics. Default time.Now.
	Now func() time.Time
	// RollbackBound is service.Config.RollbackBound. Zero: the service's
	// default.
	RollbackBound time.Duration
	// EtcdTimeout bounds each health probe of etcd. Default
	// DefaultEtcdTimeout.
	EtcdTimeout time.Duration
	// Observer, if set, also receives the store's events (besides the
	// metrics).
	Observer store.Observer
	// Registry receives the service metrics. Default: a fresh registry.
	Registry *prometheus.Registry
	// Limits bound what one peer holds on the gRPC server: handshake
	// timeout, idle connections, streams per connection
	// (service.ServerOptions). Zero fields: service's defaults.
	Limits service.ConnLimits
	// Interceptors run around every unary RPC, after the production server
	// options (service.ServerOptions) and the authentication.
	Interceptors []grpc.UnaryServerInterceptor
	// TLS, if set, serves gRPC over TLS with it (build it with
	// tlsfiles.Files.ServerConfig, which re-reads a rotated certificate).
	// nil serves plaintext. When it requires and verifies client
	// certificates (tls.RequireAndVerifyClientCert: mutual TLS), every RPC
	// is authenticated and authorised by internal/server/authz, and leases are
	// bound to the caller's identity, with Store.MaxCodesPerIdentity codes
	// at most per identity.
	TLS *tls.Config
	// AllowedIdentities may call the RangeService (empty: any verified
	// client certificate); AdminIdentities may call every method,
	// admin RPCs included (empty: nobody may call admin RPCs). Both need
	// mutual TLS.
	AllowedIdentities, AdminIdentities []authz.Pattern
	// Next, if set, opens the minters of the replica's own codes: a
	// mintpool.Pool of them serves MintBatch, Next and the shared path.
	// The pool takes its first code at Serve when the shared path is on
	// (SharedRate not negative: the shared path carves from its codes),
	// else on the first call; more as demand needs them, up to
	// SharedCodes; Stop gives them back. nil: Next answers Unimplemented
	// until Service().SetMinter.
	Next NextFunc
	// SharedCodes bounds the codes the replica's own minter holds
	// (mintpool.Config.MaxCodes; rangesvc serve --shared-codes). 0:
	// mintpool.DefaultMaxCodes.
	SharedCodes int
	// Logger receives store and service logs. Default: discard.
	Logger *slog.Logger
	// SharedRate bounds the shared path (AllocateShared, served from the
	// Next minter's blocks) per caller identity, in IDs/s
	// (service.Config.SharedRate): 0 the service's default, negative off.
	SharedRate float64
	// SharedRateTotal bounds what all identities together take from the
	// replica's own codes, in IDs/s (service.Config.SharedRateTotal). 0:
	// service.SharedRatePerCode per code SharedCodes allows.
	SharedRateTotal float64

	// CompactionInterval is how often this replica compacts etcd's history
	// while it holds the compactor key (<Prefix>compactor; one replica of
	// all that share the etcd cluster and prefix at a time). 0: the replica
	// does not compact (the default here, so in-process regions keep their
	// history; `rangesvc serve` defaults to
	// etcdspace.DefaultCompactionInterval).
	CompactionInterval time.Duration
	// CompactionRetention is how much history a compaction keeps. Default
	// etcdspace.DefaultCompactionRetention.
	CompactionRetention time.Duration
	// EtcdQuotaBytes is the backend quota the etcd cluster runs with,
	// exported as idrange_etcd_quota_bytes when the members do not report
	// it. Default etcdspace.DefaultQuotaBytes.
	EtcdQuotaBytes int64
	// SpaceCheckInterval is how often the replica reads etcd's backend size
	// and alarms; while the NOSPACE alarm is raised the replica reports
	// NOT_SERVING. Default etcdspace.DefaultMonitorInterval; negative: off.
	SpaceCheckInterval time.Duration

	// InitRegion lets the replica create the region record when etcd has
	// none (rangesvc serve --init-region, and always for the embedded etcd,
	// which is new by construction). Without it a replica against an etcd
	// without a record does not start. See internal/server/regionid.Open.
	InitRegion bool
	// Restored marks the region restore-pending at start (rangesvc serve
	// --restored): the operator knows this etcd was restored from a backup.
	Restored bool
	// RegistryEtcd, if set, is the registry where the region claims its
	// code (rangesvc serve --registry-etcd); the caller closes it after
	// Stop. RegistryPrefix is its key prefix (default
	// regionid.DefaultRegistryPrefix), RegistryCheckInterval how often the
	// claim is confirmed (default DefaultRegistryCheckInterval).
	RegistryEtcd          *clientv3.Client
	RegistryPrefix        string
	RegistryCheckInterval time.Duration

	// SharedEtcd skips the region record (neither written nor checked):
	// several in-process regions of different codes share one etcd, a test
	// and benchmark model (internal/testing/localregion). rangesvc serve
	// never sets it; production runs one etcd per region.
	SharedEtcd bool
	// WrapStorage, if set, wraps the etcd storage under the store (below
	// the region identity's guard); the in-process harness counts etcd
	// write transactions with it. nil: the etcd storage itself.
	WrapStorage func(store.BatchStorage) store.BatchStorage
}

// Replica is one range-service replica: a store.Store over an etcd
// client, the internal/server/service.Service over it, and a gRPC server with the
// production options. NewReplica builds it; Serve and Stop run it.
type Replica struct {
	cfg      ReplicaConfig
	store    *store.Store
	svc      *service.Service
	metrics  *service.Metrics
	registry *prometheus.Registry
	srv      *grpc.Server
	minter   *mintpool.Pool
	ident    *identity
	marks    store.HighWaterWatcher // the etcd storage, watched for lowered marks
	space    *etcdspace.Monitor     // nil when SpaceCheckInterval < 0
	compact  *etcdspace.Compactor   // nil when CompactionInterval == 0

	cancel context.CancelFunc
	done   chan struct{}
}

// NewReplica builds the store, the service and the gRPC server; nothing
// listens or runs until Serve.
func NewReplica(cfg ReplicaConfig) (*Replica, error) {
	if cfg.Etcd == nil {
		return nil, errors.New("region: ReplicaConfig.Etcd is required")
	}
	mtls := cfg.TLS != nil && cfg.TLS.ClientAuth == tls.RequireAndVerifyClientCert
	if !mtls && len(cfg.AllowedIdentities)+len(cfg.AdminIdentities) > 0 {
		return nil, errors.New("region: ReplicaConfig.AllowedIdentities and AdminIdentities need mutual TLS (a TLS config that requires and verifies client certificates)")
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Prefix == "" {
		cfg.Prefix = etcdstore.DefaultPrefix
	}
	if cfg.EtcdTimeout == 0 {
		cfg.EtcdTimeout = DefaultEtcdTimeout
	}
	if cfg.Registry == nil {
		cfg.Registry = prometheus.NewRegistry()
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Replica{cfg: cfg, registry: cfg.Registry}
	var err error
	if r.metrics, err = service.NewMetrics(cfg.Registry, cfg.Now); err != nil {
		return nil, err
	}
	if err := r.openSpace(); err != nil {
		return nil, err
	}
	if !cfg.SharedEtcd {
		if r.ident, err = newIdentity(cfg); err != nil {
			return nil, err
		}
		octx, cancel := context.WithTimeout(context.Background(), 3*cfg.EtcdTimeout)
		err = r.ident.open(octx, cfg.InitRegion, cfg.Restored)
		cancel()
		if err != nil {
			return nil, err
		}
	}
	if r.store, r.marks, err = openStore(cfg, r.metrics, r.ident); err != nil {
		return nil, errors.Wrap(err, "segment store")
	}
	r.metrics.SetStoreConfig(r.store.Config())
	if cfg.Next != nil {
		st, region, open := r.store, cfg.Region, cfg.Next
		r.minter, err = mintpool.New(mintpool.Config{
			Open: func(ctx context.Context) (mintpool.Minter, error) {
				// A code may be taken in a caller's context, which under
				// mutual TLS carries that caller's identity. The minter's
				// lease is the replica's own (renewed from its background
				// loop, without any caller), so it is taken without one.
				m, err := open(authz.WithIdentity(ctx, ""), st, region)
				if err != nil {
					return nil, err
				}
				return mintpool.Carving(m), nil
			},
			MaxCodes:  cfg.SharedCodes,
			Keep:      cfg.SharedRate >= 0,
			Now:       cfg.Now,
			NotBefore: st.RestartFloor(),
			Logger:    cfg.Logger,
		})
		if err != nil {
			return nil, err
		}
	}
	r.svc, err = service.New(r.serviceConfig())
	if err != nil {
		return nil, err
	}
	opts := service.ServerOptions(cfg.Limits)
	unary := cfg.Interceptors
	if cfg.TLS != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(cfg.TLS)))
	}
	if mtls {
		// Authentication runs first: nothing (not even the timing
		// interceptors) sees an unauthenticated call, except the
		// first-message timer of service.ServerOptions, which only
		// stops its timer.
		pol := authz.Policy{Allowed: cfg.AllowedIdentities, Admin: cfg.AdminIdentities}
		unary = append([]grpc.UnaryServerInterceptor{pol.UnaryInterceptor()}, unary...)
		opts = append(opts, grpc.ChainStreamInterceptor(pol.StreamInterceptor()))
	}
	if len(unary) > 0 {
		opts = append(opts, grpc.ChainUnaryInterceptor(unary...))
	}
	r.srv = grpc.NewServer(opts...)
	r.svc.Register(r.srv)
	if err := registerAdmin(r); err != nil {
		return nil, err
	}

	// Server reflection: grpcurl and other generic clients list and call
	// the services without the .proto files (docs/operations.md).
	reflection.Register(r.srv)
	return r, nil
}

// registerAdmin serves the AdminService (rangesvc admin) beside the
// RangeService, over the replica's own store and etcd client.
func registerAdmin(r *Replica) error {
	ac := admin.Config{Region: r.cfg.Region, Store: r.store, Etcd: r.cfg.Etcd,
		Serving: r.svc.Serving, Now: r.cfg.Now, Logger: r.cfg.Logger}
	if r.ident != nil {
		ac.RegionRecord, ac.RestoreFence = r.regionRecord, r.restoreFence
	}
	adm, err := admin.New(ac)
	if err != nil {
		return err
	}
	adm.Register(r.srv)
	return nil
}

// openSpace builds the etcd space monitor and the history compactor.
func (r *Replica) openSpace() error {
	cfg := r.cfg
	var err error
	if cfg.SpaceCheckInterval >= 0 {
		r.space, err = etcdspace.NewMonitor(etcdspace.MonitorConfig{
			Etcd: cfg.Etcd, Interval: cfg.SpaceCheckInterval, QuotaBytes: cfg.EtcdQuotaBytes,
			Timeout: cfg.EtcdTimeout, Registerer: cfg.Registry, Logger: cfg.Logger,
		})
		if err != nil {
			return err
		}
	}
	if cfg.CompactionInterval > 0 {
		r.compact, err = etcdspace.NewCompactor(etcdspace.CompactorConfig{
			Etcd: cfg.Etcd, Key: cfg.Prefix + "compactor", Interval: cfg.CompactionInterval,
			Retention: cfg.CompactionRetention, Registerer: cfg.Registry, Logger: cfg.Logger,
		})
		if err != nil {
			return err
		}
	}
	return nil
}

// openStore is the one place a replica's store.Store is constructed. It
// also returns the etcd storage, whose high-water marks the replica
// watches (Store.WatchHighWaters).
func openStore(cfg ReplicaConfig, m *service.Metrics, id *identity) (*store.Store, store.HighWaterWatcher, error) {
	sc := cfg.Store
	sc.Now = cfg.Now
	sc.Logger = cfg.Logger.With("component", "segment")
	sc.Observer = m.StoreObserver()
	if cfg.Observer != nil {
		sc.Observer = teeObserver{sc.Observer, cfg.Observer}
	}
	stg, err := etcdstore.New(cfg.Etcd, etcdstore.Config{Prefix: cfg.Prefix, Logger: sc.Logger})
	if err != nil {
		return nil, nil, err
	}
	var bs store.BatchStorage = stg
	if cfg.WrapStorage != nil {
		bs = cfg.WrapStorage(bs)
	}
	if id != nil {
		bs = guardStorage{bs, id}
	}
	st, err := store.New(bs, sc)
	return st, stg, err
}

func (r *Replica) serviceConfig() service.Config {
	cfg, st := r.cfg, r.store
	sc := service.Config{
		Region:     cfg.Region,
		Allocator:  st,
		Now:        cfg.Now,
		MaxBlock:   int(st.Policy().MaxBlock),
		SharedRate: cfg.SharedRate,
		SharedRateTotal: cmp.Or(cfg.SharedRateTotal,
			service.SharedRatePerCode*float64(cmp.Or(cfg.SharedCodes, mintpool.DefaultMaxCodes))),
		SharedLead:    min(st.Policy().MaxLead, mintpool.DefaultMaxLead),
		RollbackBound: cfg.RollbackBound,
		StoreCheck: func(ctx context.Context) error {
			if r.ident == nil {
				// No region record (Config.SharedEtcd): probe etcd alone.
				if err := ProbeEtcd(ctx, cfg.Etcd, cfg.Prefix, cfg.EtcdTimeout); err != nil {
					return err
				}
			} else if err := r.ident.check(ctx); err != nil {
				// The record's read is itself the linearizable probe (it
				// fails while etcd has no leader or does not answer), so
				// it is not preceded by a second one. Otherwise: the
				// record names another region, is corrupt or missing, a
				// restore is pending, or the registry refuses.
				return err
			}
			if r.space != nil {
				// etcd answers reads under NOSPACE but refuses every
				// write, so no grant can commit: not serving.
				return r.space.Err()
			}
			return nil
		},
		StoreCheckTimeout: cfg.EtcdTimeout,
		FreeCodes:         func(ctx context.Context) (int, error) { return st.FreeCodes(ctx, cfg.Region) },
		Metrics:           r.metrics,
		Logger:            cfg.Logger,
	}
	if r.minter != nil {
		sc.Minter = r.minter
	}
	return sc
}

// ProbeEtcd is a cheap linearizable read under prefix: it succeeds only
// while the cluster has a leader and answers within timeout.
func ProbeEtcd(ctx context.Context, cli *clientv3.Client, prefix string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_, err := cli.Get(ctx, prefix+"probe", clientv3.WithCountOnly())
	return err
}

// Serve serves gRPC on lis and runs the service's background checks until
// Stop. It returns at once; the channel receives the gRPC server's error
// if it stops serving for another reason than Stop.
func (r *Replica) Serve(lis net.Listener) <-chan error {
	errc := make(chan error, 1)
	go func() {
		if err := r.srv.Serve(lis); err != nil {
			errc <- errors.Wrap(err, "grpc server")
		}
	}()
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel, r.done = cancel, make(chan struct{})
	var wg sync.WaitGroup
	if r.space != nil {
		wg.Go(func() { r.space.Run(ctx) })
	}
	if r.compact != nil {
		wg.Go(func() { r.compact.Run(ctx) })
	}
	if r.ident != nil && r.ident.reg != nil {
		wg.Go(func() { r.ident.runRegistry(ctx) })
	}
	wg.Go(func() { r.svc.Run(ctx) })
	// Every write of a mark is checked as it happens, so a lowering is
	// noticed whatever the timing (docs/design.md, "Defense in depth").
	wg.Go(func() { r.store.WatchHighWaters(ctx, r.cfg.Region, r.marks) })
	if r.minter != nil {
		wg.Go(func() { r.minter.Run(ctx) })
	}
	go func() { wg.Wait(); close(r.done) }()
	return errc
}

// Stop reports NOT_SERVING, stops accepting RPCs and lets in-flight ones
// finish for up to grace (grace <= 0 closes them at once, as a crash
// would), stops the background checks and the compactor (which gives the
// compactor key up, so another replica takes over at once), and closes the
// minter pool (which gives its codes back). The store and the etcd client
// stay usable.
func (r *Replica) Stop(grace time.Duration) {
	r.svc.Shutdown()
	if grace <= 0 {
		r.srv.Stop()
	} else {
		drained := make(chan struct{})
		go func() { r.srv.GracefulStop(); close(drained) }()
		t := time.NewTimer(grace)
		select {
		case <-drained:
		case <-t.C:
			r.cfg.Logger.Warn("graceful stop timed out; closing connections", "timeout", grace)
			r.srv.Stop()
			<-drained
		}
		t.Stop()
	}
	if r.cancel != nil {
		r.cancel()
		<-r.done
	}
	if r.minter != nil {
		r.minter.Close()
	}
}

// Store is the replica's store.Store.
func (r *Replica) Store() *store.Store { return r.store }

// GRPCServer is the replica's gRPC server, for handlers that serve the same
// services over another transport (rangesvc serve --http transcodes
// HTTP/JSON into it), so every interceptor and option applies there too.
func (r *Replica) GRPCServer() *grpc.Server { return r.srv }

// Service is the replica's gRPC service.
func (r *Replica) Service() *service.Service { return r.svc }

// Compactor is the replica's etcd history compactor (nil when
// CompactionInterval is 0).
func (r *Replica) Compactor() *etcdspace.Compactor { return r.compact }

// SpaceMonitor is the replica's etcd space monitor (nil when
// SpaceCheckInterval < 0).
func (r *Replica) SpaceMonitor() *etcdspace.Monitor { return r.space }

// Registry holds the replica's metrics.
func (r *Replica) Registry() *prometheus.Registry { return r.registry }

// teeObserver sends every store event to both observers.
type teeObserver struct{ a, b store.Observer }

func (t teeObserver) Granted(region, worker int, size int64, d time.Duration) {
	t.a.Granted(region, worker, size, d)
	t.b.Granted(region, worker, size, d)
}
func (t teeObserver) GrantFailed(region, worker int, err error, d time.Duration) {
	t.a.GrantFailed(region, worker, err, d)
	t.b.GrantFailed(region, worker, err, d)
}
func (t teeObserver) Conflict(region, worker int) {
	t.a.Conflict(region, worker)
	t.b.Conflict(region, worker)
}
func (t teeObserver) Acquired(region, worker int) {
	t.a.Acquired(region, worker)
	t.b.Acquired(region, worker)
}
func (t teeObserver) AcquireFailed(region int, err error) {
	t.a.AcquireFailed(region, err)
	t.b.AcquireFailed(region, err)
}
func (t teeObserver) Renewed(region, worker int, err error) {
	t.a.Renewed(region, worker, err)
	t.b.Renewed(region, worker, err)
}
func (t teeObserver) Released(region, worker int, err error) {
	t.a.Released(region, worker, err)
	t.b.Released(region, worker, err)
}
func (t teeObserver) Corrupt(key string, err error) { t.a.Corrupt(key, err); t.b.Corrupt(key, err) }
func (t teeObserver) HighWaterRegressed(region, worker int, floor, seen int64) {
	t.a.HighWaterRegressed(region, worker, floor, seen)
	t.b.HighWaterRegressed(region, worker, floor, seen)
}
func (t teeObserver) HighWaterRecovered(region, worker int) {
	t.a.HighWaterRecovered(region, worker)
	t.b.HighWaterRecovered(region, worker)
}
