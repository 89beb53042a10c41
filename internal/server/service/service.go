// Package service is the gRPC RangeService of one region: a thin, strict
// layer over a segment.Allocator (the etcd-backed store.Store in
// production, a fake in tests).
//
// The layer does three things and nothing clever:
//
//   - It validates every field of every request before the store is touched
//     (region must be this replica's, worker 0..255, token > 0, lease_id > 0,
//     count 1..MaxBlock, lease present) and answers InvalidArgument with a
//     message naming the field. Fail closed: a request the store would have to
//     guess about never reaches it.
//   - It maps the store's sentinel errors to gRPC statuses (internal/wire), so
//     clients can tell fenced (stop minting) from backpressure (retry later).
//     The caller's verified identity, when the server runs mutual TLS, is
//     put in the context by internal/server/authz's interceptor
//     (authz.WithIdentity); the store binds leases to it and refuses
//     other identities with PermissionDenied.
//   - It watches its own clock. Grants stay safe when the clock moves back
//     (Lo = max(HWM, now<<12) does not depend on it), but a replica whose
//     clock is behind the highest time it has seen by more than
//     Config.RollbackBound reports NOT_SERVING on the standard gRPC health
//     service and exports clock_rollback_ms, so balancers and operators move
//     traffic away. It also reports NOT_SERVING while Config.StoreCheck fails.
//
// Metrics (namespace idrange, subsystem service) are registered on the
// registerer passed in; see Metrics for the names.
package service

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Defaults for zero Config fields.
const (
	// DefaultMaxBlock is the largest count a request may ask for: 10 s of
	// span at 4,096 IDs/ms (docs/design.md: the client sizes blocks as time spans).
	DefaultMaxBlock = int(segment.DefaultMaxBlock)
	// DefaultRollbackBound is how far the service clock may be behind the
	// highest time it has seen before the replica reports NOT_SERVING (docs/design.md:
	// wait at most 5 ms for a rollback).
	DefaultRollbackBound = 5 * time.Millisecond
	// DefaultCheckInterval is how often the clock and the store are checked.
	DefaultCheckInterval = 250 * time.Millisecond
	// DefaultStoreCheckTimeout bounds one StoreCheck call.
	DefaultStoreCheckTimeout = 2 * time.Second
	// DefaultFreeCodesInterval is how often the free-code gauge is refreshed.
	DefaultFreeCodesInterval = 5 * time.Second
	// DefaultRPCTimeout caps how long one RPC may wait on the store when
	// the caller set no shorter deadline.
	DefaultRPCTimeout = 10 * time.Second
	// HealthService is the name under which the RangeService's health is
	// reported (the empty name "" reports the same).
	HealthService = "idrange.v1.RangeService"
)

// MaxMintBatch is the largest count one MintBatch call may ask for (over
// gRPC and HTTP alike): 100,000 IDs are about 2 MB of JSON and 25 ms of a
// worker code's 4,096 IDs/ms, so one call never holds a replica's minter
// for long. Callers that need more make more calls, or link rangeclient.
const MaxMintBatch = 100_000

// Minter mints IDs; *rangeclient.Client satisfies it. It backs the MintBatch
// and Next RPCs: AppendN appends n new IDs to dst (on error, the IDs minted
// so far, which the service discards).
type Minter interface {
	AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error)
}

// Config configures a Service. Region and Allocator are required.
type Config struct {
	// Region is this replica's region (0..3). Requests for another region
	// are InvalidArgument.
	Region int
	// Allocator serves the RPCs (store.Store in production).
	Allocator segment.Allocator
	// Now is the service clock used for rollback detection, HWM lead and
	// remaining epoch life. Give the store the same clock. Default
	// time.Now.
	Now func() time.Time
	// MaxBlock is the largest count accepted (1..segment.MaxBlockLimit).
	// Default DefaultMaxBlock. Keep it equal to the store's policy limit.
	MaxBlock int
	// RollbackBound: a clock this far behind the highest time seen makes
	// the replica NOT_SERVING. Default DefaultRollbackBound.
	RollbackBound time.Duration
	// CheckInterval is the period of the clock/store check loop in Run.
	// Default DefaultCheckInterval.
	CheckInterval time.Duration
	// StoreCheck, if set, is called every CheckInterval (bounded by
	// StoreCheckTimeout); while it fails the replica is NOT_SERVING. For
	// etcd a cheap Status or Get call.
	StoreCheck func(ctx context.Context) error
	// StoreCheckTimeout bounds one StoreCheck. Default DefaultStoreCheckTimeout.
	StoreCheckTimeout time.Duration
	// FreeCodes, if set, returns the number of unleased worker codes of
	// Region; Run refreshes the free_worker_codes gauge with it every
	// FreeCodesInterval.
	FreeCodes func(ctx context.Context) (int, error)
	// FreeCodesInterval: default DefaultFreeCodesInterval.
	FreeCodesInterval time.Duration
	// RPCTimeout caps each RPC's work on the store. Default DefaultRPCTimeout.
	RPCTimeout time.Duration
	// Minter backs the Next RPC; nil makes Next answer Unimplemented.
	// It can be set later with SetMinter (it usually needs the service's
	// own allocator to exist first).
	Minter Minter
	// SharedRate bounds the shared path (AllocateShared) per caller
	// identity, in IDs/s (rangesvc serve --shared-rate). 0:
	// DefaultSharedRate; negative: the shared path is off (AllocateShared
	// answers Unimplemented, and clients take worker codes).
	SharedRate float64
	// SharedRateTotal bounds what all identities together take from the
	// Minter (shared runs and MintBatch/Next), in IDs/s, while the shared
	// path is on (rangesvc serve --shared-rate-total); when it is spent,
	// an identity above its fair share (SharedRateTotal over the active
	// identities) gets backpressure and one below it is served. Default
	// SharedRatePerCode times mintpool.DefaultMaxCodes.
	SharedRateTotal float64
	// SharedLead bounds how far ahead of the service clock a shared run
	// may start when the caller's after_id pushes it ahead; keep it equal
	// to the store's policy MaxLead. Default segment.DefaultMaxLead.
	SharedLead time.Duration
	// Metrics, if set, are used as they are (create them first with
	// NewMetrics when the store needs Metrics.StoreObserver before the
	// Service exists); Registerer is then ignored.
	Metrics *Metrics
	// Registerer receives the metrics New creates; nil registers nothing
	// (the metrics still work, e.g. for tests that read them).
	Registerer prometheus.Registerer
	// Logger receives structured logs. Default: discard.
	Logger *slog.Logger
}

func (c Config) withDefaults() Config {
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.MaxBlock == 0 {
		c.MaxBlock = DefaultMaxBlock
	}
	if c.RollbackBound == 0 {
		c.RollbackBound = DefaultRollbackBound
	}
	if c.CheckInterval == 0 {
		c.CheckInterval = DefaultCheckInterval
	}
	if c.StoreCheckTimeout == 0 {
		c.StoreCheckTimeout = DefaultStoreCheckTimeout
	}
	if c.FreeCodesInterval == 0 {
		c.FreeCodesInterval = DefaultFreeCodesInterval
	}
	if c.RPCTimeout == 0 {
		c.RPCTimeout = DefaultRPCTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.SharedRate == 0 {
		c.SharedRate = DefaultSharedRate
	}
	if c.SharedRateTotal == 0 {
		c.SharedRateTotal = SharedRatePerCode * mintpool.DefaultMaxCodes
	}
	if c.SharedLead == 0 {
		c.SharedLead = mintpool.DefaultMaxLead
	}
	return c
}

// Validate reports the first bad field of c (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Region < 0 || c.Region > snowflake.MaxRegion:
		return errors.Newf("service: Config.Region %d not in 0..%d", c.Region, snowflake.MaxRegion)
	case c.Allocator == nil:
		return errors.New("service: Config.Allocator is required")
	case c.MaxBlock < 1 || int64(c.MaxBlock) > segment.MaxBlockLimit:
		return errors.Newf("service: Config.MaxBlock %d not in 1..%d", c.MaxBlock, segment.MaxBlockLimit)
	case c.RollbackBound < 0:
		return errors.Newf("service: Config.RollbackBound %v is negative", c.RollbackBound)
	case math.IsNaN(c.SharedRate) || math.IsInf(c.SharedRate, 0):
		return errors.Newf("service: Config.SharedRate %v is not a number of IDs/s", c.SharedRate)
	case !(c.SharedRateTotal > 0) || math.IsInf(c.SharedRateTotal, 0): // also NaN
		return errors.Newf("service: Config.SharedRateTotal %v is not a positive number of IDs/s", c.SharedRateTotal)
	case c.SharedLead < 0:
		return errors.Newf("service: Config.SharedLead %v is negative", c.SharedLead)
	}
	for name, d := range map[string]time.Duration{"CheckInterval": c.CheckInterval,
		"StoreCheckTimeout": c.StoreCheckTimeout, "FreeCodesInterval": c.FreeCodesInterval,
		"RPCTimeout": c.RPCTimeout} {
		if d < 0 {
			return errors.Newf("service: Config.%s %v is negative", name, d)
		}
	}
	return nil
}

// Service implements idrangev1.RangeServiceServer over a segment.Allocator.
// Register it on a grpc.Server with Register; call Run for the background
// checks and Shutdown before stopping the server.
type Service struct {
	idrangev1.UnimplementedRangeServiceServer

	cfg     Config
	log     *slog.Logger
	metrics *Metrics
	health  *health.Server

	mu         sync.Mutex
	maxSeen    int64 // highest service time seen, UnixNano (wall, no monotonic part)
	rollback   time.Duration
	storeErr   error
	serving    bool
	shutdown   bool
	minter     Minter
	shared     *sharedLimiter // nil: the shared path is off
	lastStatus healthpb.HealthCheckResponse_ServingStatus
}

// New validates cfg and returns a Service that reports SERVING until a check
// says otherwise.
func New(cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	m := cfg.Metrics
	if m == nil {
		var err error
		if m, err = NewMetrics(cfg.Registerer, cfg.Now); err != nil {
			return nil, err
		}
	}
	m.initRegion(cfg.Region)
	s := &Service{
		cfg:     cfg,
		log:     cfg.Logger.With("component", "rangesvc", "region", cfg.Region),
		metrics: m,
		health:  health.NewServer(),
		minter:  cfg.Minter,
	}
	if cfg.SharedRate > 0 {
		s.shared = newSharedLimiter(cfg.SharedRate, cfg.SharedRateTotal)
		m.SharedRateLimit.Set(cfg.SharedRate)
		m.SharedRateTotal.Set(cfg.SharedRateTotal)
	}
	s.observe() // first reading: the floor for rollback detection
	s.updateHealth()
	return s, nil
}

// Register registers the RangeService and the standard gRPC health service
// on srv.
func (s *Service) Register(srv grpc.ServiceRegistrar) {
	idrangev1.RegisterRangeServiceServer(srv, s)
	healthpb.RegisterHealthServer(srv, s.health)
}

// Metrics returns the service's metrics (for tests and the Store observer).
func (s *Service) Metrics() *Metrics { return s.metrics }

// SetMinter installs the Minter behind the Next RPC.
func (s *Service) SetMinter(m Minter) {
	s.mu.Lock()
	s.minter = m
	s.mu.Unlock()
}

// Serving reports whether the replica currently reports SERVING.
func (s *Service) Serving() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.serving
}

// NotServingReason says why the replica reports NOT_SERVING, in a few
// words for probes and operators ("shutting down", the clock rollback, the
// store check's error); it is "" while the replica is SERVING.
func (s *Service) NotServingReason() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.serving:
		return ""
	case s.shutdown:
		return "shutting down"
	case s.rollback > s.cfg.RollbackBound:
		return fmt.Sprintf("service clock %v behind the highest time seen (bound %v)", s.rollback, s.cfg.RollbackBound)
	case s.storeErr != nil:
		return "store check failed: " + s.storeErr.Error()
	}
	return "NOT_SERVING"
}

// Shutdown marks every health status NOT_SERVING for good (so balancers stop
// sending traffic) before the gRPC server drains.
func (s *Service) Shutdown() {
	s.mu.Lock()
	s.shutdown = true
	s.mu.Unlock()
	s.updateHealth()
	s.health.Shutdown()
}

// Run performs the periodic checks until ctx ends: the clock against the
// highest time seen, StoreCheck, and the free-code gauge.
func (s *Service) Run(ctx context.Context) {
	s.Check(ctx)
	s.refreshFreeCodes(ctx)
	check := time.NewTicker(s.cfg.CheckInterval)
	defer check.Stop()
	free := time.NewTicker(s.cfg.FreeCodesInterval)
	defer free.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-check.C:
			s.Check(ctx)
			s.sweepShared()
			s.sweepMinter()
		case <-free.C:
			s.refreshFreeCodes(ctx)
		}
	}
}

// Check runs one round of the health checks now (Run calls it every
// CheckInterval) and updates the health status.
func (s *Service) Check(ctx context.Context) {
	s.observe()
	if s.cfg.StoreCheck != nil {
		cctx, cancel := context.WithTimeout(ctx, s.cfg.StoreCheckTimeout)
		err := s.cfg.StoreCheck(cctx)
		cancel()
		if ctx.Err() != nil {
			return // shutting down: not the store's fault
		}
		s.mu.Lock()
		was := s.storeErr
		s.storeErr = err
		s.mu.Unlock()
		switch {
		case err != nil && was == nil:
			s.log.Warn("store check failed", "err", err)
		case err == nil && was != nil:
			s.log.Info("store reachable again")
		}
	}
	s.updateHealth()
}

func (s *Service) refreshFreeCodes(ctx context.Context) {
	if s.cfg.FreeCodes == nil {
		return
	}
	cctx, cancel := context.WithTimeout(ctx, s.cfg.StoreCheckTimeout)
	defer cancel()
	n, err := s.cfg.FreeCodes(cctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("counting free worker codes failed", "err", err)
		}
		return
	}
	s.metrics.FreeCodes.WithLabelValues(regionLabel(s.cfg.Region)).Set(float64(n))
}

// observe reads the service clock, raises the highest time seen and records
// how far the clock is behind it. It returns the reading.
func (s *Service) observe() time.Time {
	// Read the clock under the lock: a reading taken before it could be
	// overtaken by a concurrent, later one and show a rollback that never
	// happened.
	s.mu.Lock()
	now := s.cfg.Now()
	ns := now.UnixNano() // wall time: a stepped clock must show as a rollback
	if ns > s.maxSeen {
		s.maxSeen = ns
	}
	was := s.rollback
	s.rollback = time.Duration(s.maxSeen - ns)
	rb := s.rollback
	// Under the lock, so a slower concurrent reading cannot overwrite a
	// newer one.
	s.metrics.ClockRollbackMs.Set(float64(rb) / float64(time.Millisecond))
	s.mu.Unlock()
	if rb > s.cfg.RollbackBound && was <= s.cfg.RollbackBound {
		s.log.Error("service clock moved back beyond the bound; reporting NOT_SERVING",
			"rollback", rb, "bound", s.cfg.RollbackBound)
		s.updateHealth()
	} else if rb <= s.cfg.RollbackBound && was > s.cfg.RollbackBound {
		s.log.Info("service clock caught up", "rollback", rb)
		s.updateHealth()
	}
	return now
}

func (s *Service) updateHealth() {
	s.mu.Lock()
	ok := !s.shutdown && s.rollback <= s.cfg.RollbackBound && s.storeErr == nil
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	changed := st != s.lastStatus
	s.serving = ok
	s.lastStatus = st
	// Set the status under the lock so concurrent updates cannot reorder.
	if changed {
		s.health.SetServingStatus("", st)
		s.health.SetServingStatus(HealthService, st)
	}
	s.mu.Unlock()
	if ok {
		s.metrics.Serving.Set(1)
	} else {
		s.metrics.Serving.Set(0)
	}
}

// rpc wraps one handler: a timeout on the store work, the error mapping,
// error metrics and logs.
func (s *Service) rpc(ctx context.Context, method string, f func(ctx context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.cfg.RPCTimeout)
	defer cancel()
	err := f(ctx)
	if err == nil {
		return nil
	}
	serr := wire.ToStatus(err)
	code := status.Code(serr)
	s.metrics.Errors.WithLabelValues(method, code.String()).Inc()
	s.log.Log(ctx, logLevel(code), "rpc failed", "method", method, "code", code.String(), "err", err)
	return serr
}

// invalid is the InvalidArgument status for a bad field.
func invalid(format string, args ...any) error {
	return status.Errorf(codes.InvalidArgument, format, args...)
}

// checkRegion validates a region field against this replica.
func (s *Service) checkRegion(field string, r uint32) error {
	if r > snowflake.MaxRegion {
		return invalid("%s: %d not in 0..%d", field, r, snowflake.MaxRegion)
	}
	if int(r) != s.cfg.Region {
		return invalid("%s: %d is not this replica's region %d", field, r, s.cfg.Region)
	}
	return nil
}

// checkLease validates a lease message field by field.
func (s *Service) checkLease(p *idrangev1.Lease) (segment.Lease, error) {
	if p == nil {
		return segment.Lease{}, invalid("lease: required")
	}
	if err := s.checkRegion("lease.region", p.GetRegion()); err != nil {
		return segment.Lease{}, err
	}
	l := wire.LeaseFromProto(p)
	if err := l.Validate(); err != nil {
		return segment.Lease{}, errors.Newf("lease: %w", err)
	}
	return l, nil
}

// AcquireLease leases a free worker code of this region.
func (s *Service) AcquireLease(ctx context.Context, req *idrangev1.AcquireLeaseRequest) (*idrangev1.AcquireLeaseResponse, error) {
	var resp *idrangev1.AcquireLeaseResponse
	err := s.rpc(ctx, "AcquireLease", func(ctx context.Context) error {
		if err := s.checkRegion("region", req.GetRegion()); err != nil {
			return err
		}
		if err := segment.ValidateOwner(req.GetOwner()); err != nil {
			return err
		}
		s.observe()
		l, err := s.cfg.Allocator.Acquire(ctx, int(req.GetRegion()), req.GetOwner())
		if err != nil {
			return err
		}
		s.metrics.LeaseAcquisitions.Inc()
		s.log.Info("lease acquired", "worker", l.Worker, "token", l.Token, "lease_id", l.LeaseID,
			"ttl", l.TTL, "owner", req.GetOwner(), "identity", authz.IdentityFrom(ctx))
		resp = &idrangev1.AcquireLeaseResponse{Lease: wire.LeaseToProto(l), TtlMs: l.TTL.Milliseconds()}
		return nil
	})
	if err != nil {
		s.metrics.LeaseAcquireFailures.Inc()
		return nil, err
	}
	return resp, nil
}

// RenewLease extends a lease once.
func (s *Service) RenewLease(ctx context.Context, req *idrangev1.RenewLeaseRequest) (*idrangev1.RenewLeaseResponse, error) {
	var resp *idrangev1.RenewLeaseResponse
	err := s.rpc(ctx, "RenewLease", func(ctx context.Context) error {
		l, err := s.checkLease(req.GetLease())
		if err != nil {
			return err
		}
		s.observe()
		s.metrics.LeaseRenewals.Inc()
		nl, err := s.cfg.Allocator.Renew(ctx, l)
		if err != nil {
			s.metrics.LeaseRenewalFailures.Inc()
			return err
		}
		if nl.TTL <= 0 {
			s.metrics.LeaseRenewalFailures.Inc()
			return errors.Newf("worker %d: store granted TTL %v: %w", l.Worker, nl.TTL, segment.ErrLeaseLost)
		}
		resp = &idrangev1.RenewLeaseResponse{TtlMs: nl.TTL.Milliseconds()}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// ReleaseLease gives a code back early; its HWM stays.
func (s *Service) ReleaseLease(ctx context.Context, req *idrangev1.ReleaseLeaseRequest) (*idrangev1.ReleaseLeaseResponse, error) {
	err := s.rpc(ctx, "ReleaseLease", func(ctx context.Context) error {
		l, err := s.checkLease(req.GetLease())
		if err != nil {
			return err
		}
		if err := s.cfg.Allocator.Release(ctx, l); err != nil {
			return err
		}
		s.metrics.LeaseReleases.Inc()
		s.log.Info("lease released", "worker", l.Worker, "token", l.Token, "identity", authz.IdentityFrom(ctx))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return &idrangev1.ReleaseLeaseResponse{}, nil
}

// AllocateBlock grants a block; the store commits the HWM before returning.
func (s *Service) AllocateBlock(ctx context.Context, req *idrangev1.AllocateBlockRequest) (*idrangev1.AllocateBlockResponse, error) {
	var resp *idrangev1.AllocateBlockResponse
	err := s.rpc(ctx, "AllocateBlock", func(ctx context.Context) error {
		l, err := s.checkLease(req.GetLease())
		if err != nil {
			return err
		}
		if c := req.GetCount(); c < 1 || int64(c) > int64(s.cfg.MaxBlock) {
			return invalid("count: %d not in 1..%d", c, s.cfg.MaxBlock)
		}
		start := time.Now()
		b, err := s.cfg.Allocator.Allocate(ctx, l, int(req.GetCount()))
		if err != nil {
			return err
		}
		if err := b.Check(l, int64(req.GetCount())); err != nil {
			// Never forward a block the store should not have produced;
			// the caller's request was fine, so this is Internal.
			return errors.Newf("store returned block [%d,%d): %v", b.Lo, b.Hi, err)
		}
		now := s.observe()
		s.metrics.observeGrant(b, time.Since(start), now)
		s.log.Debug("block granted", "worker", b.Worker, "lo", b.Lo, "hi", b.Hi, "len", b.Len())
		resp = wire.BlockToProto(b)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// MintBatch mints req.Count IDs with the replica's own Minter, so they carry
// the same guarantees as any rangeclient's. The count is checked before the
// Minter is touched: a bad count mints nothing (and does not open a lazily
// opened Minter).
func (s *Service) MintBatch(ctx context.Context, req *idrangev1.MintBatchRequest) (*idrangev1.MintBatchResponse, error) {
	if c := req.GetCount(); c < 1 || c > MaxMintBatch {
		err := invalid("count: %d not in 1..%d", c, MaxMintBatch)
		s.metrics.Errors.WithLabelValues("MintBatch", codes.InvalidArgument.String()).Inc()
		return nil, err
	}
	ids, err := s.mint(ctx, "MintBatch", int(req.GetCount()))
	if err != nil {
		return nil, err
	}
	resp := &idrangev1.MintBatchResponse{Ids: make([]int64, len(ids))}
	for i, id := range ids {
		resp.Ids[i] = int64(id)
	}
	return resp, nil
}

// Next mints one ID: MintBatch with count 1, kept for existing callers.
func (s *Service) Next(ctx context.Context, _ *idrangev1.NextRequest) (*idrangev1.NextResponse, error) {
	ids, err := s.mint(ctx, "Next", 1)
	if err != nil {
		return nil, err
	}
	return &idrangev1.NextResponse{Id: int64(ids[0])}, nil
}

// mint takes n IDs from the Minter for RPC method.
func (s *Service) mint(ctx context.Context, method string, n int) ([]snowflake.ID, error) {
	s.mu.Lock()
	m := s.minter
	s.mu.Unlock()
	if m == nil {
		err := status.Errorf(codes.Unimplemented, "%s: this replica has no minter configured", method)
		s.metrics.Errors.WithLabelValues(method, codes.Unimplemented.String()).Inc()
		return nil, err
	}
	var ids []snowflake.ID
	err := s.rpc(ctx, method, func(ctx context.Context) error {
		lead := s.cfg.SharedLead
		if s.shared != nil {
			// The replica's codes serve the shared path too: MintBatch
			// and Next count in the aggregate bound and the fair share.
			ident, now := authz.IdentityFrom(ctx), s.observe()
			if err := s.takeShare(method, ident, int64(n), now, false); err != nil {
				return err
			}
			defer func() { s.shared.settle(ident, "", int64(n), int64(len(ids)), now, false) }()
			lead = s.leadFor(ident, now)
		}
		var err error
		if lm, ok := m.(leadMinter); ok {
			ids, err = lm.AppendNWithin(ctx, make([]snowflake.ID, 0, n), n, lead)
		} else {
			ids, err = m.AppendN(ctx, make([]snowflake.ID, 0, n), n)
		}
		switch {
		case err == nil && len(ids) == n:
		case err == nil:
			return status.Errorf(codes.Internal, "%s: minter returned %d IDs, want %d", method, len(ids), n)
		case errors.Is(err, segment.ErrEpochExhausted), errors.Is(err, context.Canceled),
			errors.Is(err, context.DeadlineExceeded) && ctx.Err() != nil:
			return err
		case errors.Is(err, segment.ErrBackpressure):
			// Every code of the replica's minter is at its lead bound:
			// ResourceExhausted with the retry delay, like a grant.
			return err
		default:
			// The replica's own lease or buffer is not the caller's
			// business: whatever went wrong (lease lost, fenced, no
			// block yet) is this replica being unavailable for now. The
			// IDs minted before the error are dropped, never sent: a
			// batch is all or nothing.
			return status.Errorf(codes.Unavailable, "%s: %v", method, err)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	s.metrics.MintedIDs.Add(float64(n))
	return ids, nil
}

// GetReplicaInfo tells the caller which region this replica serves, so
// clients can learn it instead of being configured with it. It reads no
// store state: it answers while etcd is down or the replica is NOT_SERVING.
func (s *Service) GetReplicaInfo(ctx context.Context, _ *idrangev1.GetReplicaInfoRequest) (*idrangev1.GetReplicaInfoResponse, error) {
	var resp *idrangev1.GetReplicaInfoResponse
	err := s.rpc(ctx, "GetReplicaInfo", func(context.Context) error {
		resp = &idrangev1.GetReplicaInfoResponse{Region: uint32(s.cfg.Region), CodesHeld: uint32(s.codesHeld())}
		if s.shared != nil {
			resp.SharedClients = uint32(s.shared.clientCount())
			s.mu.Lock()
			resp.SharedPath = s.minter != nil
			s.mu.Unlock()
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// ServerOptions are the gRPC server options a replica should run with:
// clients may send keepalive pings every 5 s (also between calls: a client
// idles while its buffered blocks last; gRPC-Go clients ping every 10 s at
// most), and the server pings idle connections after 30 s and drops those
// that do not answer in 10 s, so a vanished client's connection does not
// linger. l bounds what one peer holds (ConnLimits): the handshake, the
// wait for a call's request, idle connections and streams per connection.
func ServerOptions(l ConnLimits) []grpc.ServerOption {
	l = l.withDefaults()
	return append([]grpc.ServerOption{
		grpc.ConnectionTimeout(l.HandshakeTimeout),
		grpc.MaxConcurrentStreams(l.MaxStreams),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second,
			MaxConnectionIdle: l.IdleTimeout}),
	}, firstMessageOptions(l)...)
}
