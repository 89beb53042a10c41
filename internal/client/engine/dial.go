package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strings"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	grpcbackoff "google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// minConnectTimeout is the least time a connection attempt gets: gRPC's
// own default, which ConnectParams would otherwise replace with 0 (an
// attempt then gets only the backoff's 50 ms). A replica at its connection
// cap under a flood admits a new connection after the listen backlog ahead
// of it drains (about a second; docs/operations/probes-and-limits.md, "Connection limits and
// timeouts"): an attempt cut at 50 ms rejoins the backlog at its end, and
// the client got in only once its backoff had grown past the wait (issue
// 35: 4 to 6 s instead of 0.9). Calls keep their own deadlines.
const minConnectTimeout = 20 * time.Second

// dialOptions are the client's gRPC options: TLS with Config.TLS, plaintext
// only when it is nil; reconnects with exponential backoff; then
// Config.DialOptions, which win.
func dialOptions(cfg Config) []grpc.DialOption {
	creds := insecure.NewCredentials()
	if cfg.TLS != nil {
		creds = credentials.NewTLS(cfg.TLS) // clones cfg.TLS
	}
	opts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		grpc.WithConnectParams(grpc.ConnectParams{
			Backoff: grpcbackoff.Config{
				BaseDelay:  cfg.Tuning.BackoffBase,
				Multiplier: 1.6,
				Jitter:     0.2,
				MaxDelay:   cfg.Tuning.BackoffMax,
			},
			MinConnectTimeout: minConnectTimeout,
		}),
	}
	return append(opts, cfg.DialOptions...)
}

// dial connects to cfg.Targets. One target with a scheme ("dns:///...")
// is one connection balancing over what it resolves to (round_robin).
// host:port targets get one connection each, behind a replicaSet that
// fails over between them.
func dial(cfg Config, log *slog.Logger) (segment.Allocator, []*grpc.ClientConn, error) {
	if t := cfg.Targets[0]; strings.Contains(t, "://") {
		conn, err := grpc.NewClient(t, append(dialOptions(cfg),
			grpc.WithDefaultServiceConfig(`{"loadBalancingConfig":[{"round_robin":{}}]}`))...)
		if err != nil {
			return nil, nil, err
		}
		return wire.NewAllocator(conn), []*grpc.ClientConn{conn}, nil
	}
	rs := &replicaSet{log: log}
	var conns []*grpc.ClientConn
	for _, t := range cfg.Targets {
		conn, err := grpc.NewClient(t, dialOptions(cfg)...)
		if err != nil {
			for _, c := range conns {
				c.Close()
			}
			return nil, nil, fmt.Errorf("target %q: %w", t, err)
		}
		conns = append(conns, conn)
		rs.targets = append(rs.targets, t)
		rs.allocs = append(rs.allocs, wire.NewAllocator(conn))
	}
	rs.cur.Store(int64(rand.IntN(len(rs.allocs)))) // spread a fleet over the replicas
	if len(rs.allocs) == 1 {
		return rs.allocs[0], conns, nil
	}
	return rs, conns, nil
}

// learnRegion asks the service which region it serves (GetReplicaInfo,
// through the replica set, so failover applies) and settles c.cfg.Region
// before the first lease: zero takes the service's answer, a non-zero
// Region must equal it. Retryable failures are retried with backoff until
// ctx is done, like the first acquisition. A replica that predates the RPC
// (Unimplemented) leaves Region as configured; AcquireLease still refuses a
// region the replica does not serve.
func (c *lane) learnRegion(ctx context.Context) error {
	rr, ok := c.alloc.(wire.RegionReporter)
	if !ok {
		return nil // an in-process Allocator: Region is used as given
	}
	return c.retryUntil(ctx, "asking the service for its region", "region from the service", func() (bool, error) {
		rctx, cancel := context.WithTimeout(ctx, c.cfg.Tuning.RPCTimeout)
		region, err := rr.ReplicaRegion(rctx)
		cancel()
		switch {
		case err == nil && c.cfg.Region != 0 && region != c.cfg.Region:
			return true, fmt.Errorf("rangeclient: Config.Region is %d but the service at %v serves region %d: %w",
				c.cfg.Region, c.cfg.Targets, region, ErrInvalidConfig)
		case err == nil:
			if c.cfg.Region != region {
				c.log.Info("rangeclient: region learnt from the service", "region", region)
			}
			c.cfg.Region = region
			return true, nil
		case status.Code(err) == codes.Unimplemented:
			c.log.Info("rangeclient: the service cannot tell its region (older rangesvc); using Config.Region",
				"region", c.cfg.Region, "err", err)
			return true, nil
		case errors.Is(err, segment.ErrInvalid) || errors.Is(err, segment.ErrCorrupt) || errors.Is(err, wire.ErrProtocol) ||
			errors.Is(err, segment.ErrPermissionDenied):
			return true, fmt.Errorf("rangeclient: ask the service for its region: %w", err)
		}
		return false, err
	})
}

// replicaSet is a segment.Allocator over several replicas of one region.
// Every call goes to the current replica, so the lease loop and the refill
// loop share one view of which replica works (round-robin per call could
// phase-lock one loop onto a broken replica while the other keeps the lease
// alive on a good one). A failure that points at the replica (unavailable,
// timed out) moves the client to the next replica, and the call is retried
// there while its context allows: each attempt but the last gets half of
// the time left, so a hanging replica leaves room for a healthy one.
//
// Retrying a grant or an acquisition on another replica is safe: if the
// first attempt did commit, its block or lease is never used (a gap, or a
// code held until its TTL), never handed out twice.
type replicaSet struct {
	targets []string
	allocs  []segment.Allocator
	cur     atomic.Int64
	log     *slog.Logger
}

// replicaFault reports errors that say "this replica did not answer", as
// opposed to answers from the region's state (fenced, backpressure, no free
// code, invalid) that any replica would give.
func replicaFault(err error) bool {
	return errors.Is(err, segment.ErrUnavailable) || errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, wire.ErrProtocol)
}

func (r *replicaSet) do(ctx context.Context, f func(context.Context, segment.Allocator) error) error {
	n := len(r.allocs)
	start := int(r.cur.Load())
	var err error
	for i := range n {
		idx := (start + i) % n
		actx, cancel := ctx, context.CancelFunc(func() {})
		if dl, ok := ctx.Deadline(); ok && i < n-1 {
			actx, cancel = context.WithTimeout(ctx, time.Until(dl)/2)
		}
		err = f(actx, r.allocs[idx])
		cancel()
		if err == nil || !replicaFault(err) {
			return err
		}
		next := (idx + 1) % n
		if r.cur.CompareAndSwap(int64(idx), int64(next)) {
			r.log.Warn("rangeclient: replica failed; switching", "from", r.targets[idx], "to", r.targets[next], "err", err)
		}
		if ctx.Err() != nil {
			break
		}
	}
	return err
}

func (r *replicaSet) Acquire(ctx context.Context, region int, owner string) (l segment.Lease, err error) {
	err = r.do(ctx, func(ctx context.Context, a segment.Allocator) (err error) {
		l, err = a.Acquire(ctx, region, owner)
		return err
	})
	return l, err
}

func (r *replicaSet) Renew(ctx context.Context, in segment.Lease) (l segment.Lease, err error) {
	err = r.do(ctx, func(ctx context.Context, a segment.Allocator) (err error) {
		l, err = a.Renew(ctx, in)
		return err
	})
	return l, err
}

func (r *replicaSet) Release(ctx context.Context, l segment.Lease) error {
	return r.do(ctx, func(ctx context.Context, a segment.Allocator) error { return a.Release(ctx, l) })
}

func (r *replicaSet) Allocate(ctx context.Context, l segment.Lease, n int) (b segment.Block, err error) {
	err = r.do(ctx, func(ctx context.Context, a segment.Allocator) (err error) {
		b, err = a.Allocate(ctx, l, n)
		return err
	})
	return b, err
}

// ReplicaRegion asks the current replica which region it serves, failing
// over like every other call (wire.RegionReporter).
func (r *replicaSet) ReplicaRegion(ctx context.Context) (region int, err error) {
	err = r.do(ctx, func(ctx context.Context, a segment.Allocator) (err error) {
		rr, ok := a.(wire.RegionReporter)
		if !ok {
			return fmt.Errorf("replica allocator %T cannot report its region: %w", a, segment.ErrInvalid)
		}
		region, err = rr.ReplicaRegion(ctx)
		return err
	})
	return region, err
}

// AllocateShared asks the current replica for a shared run, failing over
// like every other call. It fails with ErrUnsupported when a replica's
// allocator cannot grant shared runs.
func (r *replicaSet) AllocateShared(ctx context.Context, region, n int, after snowflake.ID, clientID string) (b segment.Block, err error) {
	err = r.do(ctx, func(ctx context.Context, a segment.Allocator) (err error) {
		sa, ok := a.(segment.SharedAllocator)
		if !ok {
			return fmt.Errorf("replica allocator %T cannot grant shared runs: %w", a, errors.ErrUnsupported)
		}
		b, err = sa.AllocateShared(ctx, region, n, after, clientID)
		return err
	})
	return b, err
}
