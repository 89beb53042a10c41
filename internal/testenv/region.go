package testenv

import (
	"context"
	"log/slog"
	"net"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/internal/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/service"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
)

// Config describes an in-process range-service replica.
type Config struct {
	// Region is the region code the replica serves (0..3).
	Region int
	// Etcd is the store to use; share one Server between replicas (and
	// regions) to model several replicas on one etcd. nil starts a fresh
	// embedetcd.StartForTest.
	Etcd *embedetcd.Server
	// Store configures the segment.Store; its Clock and Observer are set by
	// Start (Clock from Config.Clock).
	Store segment.StoreConfig
	// Clock is the service clock (store and service). nil: a fresh
	// *clock.Offset, exposed as Replica.Offset so tests can jump it.
	Clock clock.Clock
	// Service, if set, adjusts the service.Config before New (Region,
	// Allocator, Clock, Metrics are filled in already).
	Service func(*service.Config)
	// Next, if set, opens the minter behind the Next RPC on first use, over
	// the replica's own store (pass a rangeclient.New with
	// Config.Allocator = a). testenv does not import rangeclient itself, so
	// rangeclient's own tests can use testenv. nil: Next is Unimplemented.
	Next func(ctx context.Context, a segment.Allocator, region int) (service.MinterCloser, error)
	// Logger for store and service; nil discards.
	Logger *slog.Logger
}

// Replica is one in-process rangesvc replica: a segment.Store over its own
// etcd client, an internal/service.Service and a gRPC server on
// 127.0.0.1:<random>.
type Replica struct {
	// Addr is the gRPC address (stable across Restart).
	Addr string
	Etcd *embedetcd.Server
	// Client is the replica's own etcd client (one connection per replica).
	Client *clientv3.Client
	// Offset is the injected clock when Config.Clock was nil.
	Offset *clock.Offset

	cfg Config
	clk clock.Clock

	mu       sync.Mutex
	store    *segment.Store
	svc      *service.Service
	registry *prometheus.Registry
	srv      *grpc.Server
	cancel   context.CancelFunc
	done     chan struct{}
	minter   *service.LazyMinter
}

// Start stands up a replica and stops it at the end of the test.
func Start(t testing.TB, cfg Config) *Replica {
	t.Helper()
	if cfg.Etcd == nil {
		cfg.Etcd = embedetcdtest.Start(t)
	}
	r := &Replica{cfg: cfg, Etcd: cfg.Etcd, Client: embedetcdtest.Client(t, cfg.Etcd), clk: cfg.Clock}
	if r.clk == nil {
		r.Offset = &clock.Offset{}
		r.clk = r.Offset
	}
	r.start(t, "127.0.0.1:0")
	t.Cleanup(r.Kill)
	return r
}

// StartRegion starts a fresh etcd and n replicas of region on it.
func StartRegion(t testing.TB, region, n int) []*Replica {
	t.Helper()
	etcd := embedetcdtest.Start(t)
	rs := make([]*Replica, n)
	for i := range rs {
		rs[i] = Start(t, Config{Region: region, Etcd: etcd})
	}
	return rs
}

func (r *Replica) start(t testing.TB, addr string) {
	t.Helper()
	lg := r.cfg.Logger
	if lg == nil {
		lg = slog.New(slog.DiscardHandler)
	}
	reg := prometheus.NewRegistry()
	m, err := service.NewMetrics(reg, r.clk)
	if err != nil {
		t.Fatal(err)
	}
	sc := r.cfg.Store
	sc.Clock = r.clk
	sc.Observer = m.StoreObserver()
	sc.Logger = lg
	store, err := segment.NewStore(r.Client, sc)
	if err != nil {
		t.Fatalf("testenv: NewStore: %v", err)
	}
	region := r.cfg.Region
	svcCfg := service.Config{
		Region:    region,
		Allocator: store,
		Clock:     r.clk,
		MaxBlock:  int(store.Policy().MaxBlock),
		Metrics:   m,
		Logger:    lg,
		FreeCodes: func(ctx context.Context) (int, error) { return store.FreeCodes(ctx, region) },
	}
	if r.cfg.Service != nil {
		r.cfg.Service(&svcCfg)
	}
	var minter *service.LazyMinter
	if r.cfg.Next != nil {
		open := r.cfg.Next
		minter = service.NewLazyMinter(func(ctx context.Context) (service.MinterCloser, error) {
			return open(ctx, store, region)
		})
		svcCfg.Minter = minter
	}
	svc, err := service.New(svcCfg)
	if err != nil {
		t.Fatalf("testenv: service.New: %v", err)
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("testenv: listen %s: %v", addr, err)
	}
	srv := grpc.NewServer(service.ServerOptions()...)
	svc.Register(srv)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go srv.Serve(lis)
	go func() { svc.Run(ctx); close(done) }()

	r.mu.Lock()
	r.Addr = lis.Addr().String()
	r.store, r.svc, r.registry, r.srv, r.cancel, r.done = store, svc, reg, srv, cancel, done
	r.minter = minter
	r.mu.Unlock()
}

// Store is the replica's current segment.Store (a new one after Restart).
func (r *Replica) Store() *segment.Store {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.store
}

// Service is the replica's current service.
func (r *Replica) Service() *service.Service {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.svc
}

// Registry holds the replica's current metrics.
func (r *Replica) Registry() *prometheus.Registry {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.registry
}

// Clock is the replica's service clock.
func (r *Replica) Clock() clock.Clock { return r.clk }

// Stop drains the gRPC server gracefully (in-flight RPCs finish). The
// replica's etcd client stays open; etcd keeps running.
func (r *Replica) Stop() { r.stop(true) }

// Kill closes the gRPC server at once (in-flight RPCs fail), as a crash of
// the replica would. Killing a stopped replica is a no-op.
func (r *Replica) Kill() { r.stop(false) }

func (r *Replica) stop(graceful bool) {
	r.mu.Lock()
	srv, cancel, done, svc, minter := r.srv, r.cancel, r.done, r.svc, r.minter
	r.srv = nil
	r.mu.Unlock()
	if srv == nil {
		return
	}
	svc.Shutdown()
	if graceful {
		srv.GracefulStop()
	} else {
		srv.Stop()
	}
	if minter != nil {
		minter.Close()
	}
	cancel()
	<-done
}

// Restart stops the replica (if running) and starts a fresh Store and
// Service on the same address, etcd and clock: what a restarted process
// would have, minus the process.
func (r *Replica) Restart(t testing.TB) {
	t.Helper()
	r.Kill()
	r.start(t, r.Addr)
}

// Dial returns a gRPC connection to the replica, closed at the end of the
// test.
func (r *Replica) Dial(t testing.TB) *grpc.ClientConn {
	t.Helper()
	return Dial(t, r.Addr)
}

// Allocator is the wire adapter over a new connection to the replica.
func (r *Replica) Allocator(t testing.TB) segment.Allocator {
	t.Helper()
	return wire.NewAllocator(r.Dial(t))
}

// Dial connects to addr (insecure, loopback) and closes the connection at
// the end of the test.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("testenv: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
