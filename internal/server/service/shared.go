package service

import (
	"context"
	"time"
	"unicode/utf8"

	"github.com/cockroachdb/errors"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// The shared path (AllocateShared; docs/design.md, "The shared path").
const (
	// DefaultSharedRate is the default bound of the shared path per caller
	// identity and replica, in IDs/s (--shared-rate): half of what the
	// replica's own code mints at 4,096 IDs/ms, so one identity (every
	// client without mutual TLS is the identity "") cannot take the whole
	// code. The bucket holds one second of it.
	DefaultSharedRate = 2_000_000
	// SharedValidity is how long after the start of a shared run's first
	// millisecond its IDs may be handed out, less SharedMargin: the rule
	// that no ID is more than 1 s behind the moment Next returns it.
	SharedValidity = time.Second
	// SharedMargin is taken off SharedValidity for the clock-rate
	// difference between the replica and the client and the reply's trip.
	SharedMargin = 100 * time.Millisecond
	// SharedMinLife: a run whose validity would end sooner than this
	// (the replica's own lease is near its safety deadline) is refused as
	// Unavailable instead; the client asks another replica.
	SharedMinLife = 100 * time.Millisecond
	// sharedClientWindow is how long a client_id counts in
	// shared_clients after its last grant.
	sharedClientWindow = time.Minute
	// sharedFarAhead: a carve refused for the lead with a longer wait
	// than this is answered Unavailable, not backpressure, so the client
	// asks another replica instead of waiting: the replica's codes are far
	// ahead (its restart floor), not briefly at the bound.
	sharedFarAhead = time.Second
	// sharedCarveTimeout bounds the wait for the replica's minter (its
	// first lease and block) within one AllocateShared call.
	sharedCarveTimeout = 2 * time.Second
	// sharedUsageWindow is the time constant of the per-identity rate that
	// shared_usage_ratio reports.
	sharedUsageWindow = 10 * time.Second
	// sharedLogEvery spaces the log lines about refusals over the rate.
	sharedLogEvery = time.Minute
	// sharedPruneEvery spaces the walks over the client_ids (up to
	// maxSharedClients of them, under the limiter's lock).
	sharedPruneEvery = 5 * time.Second
)

// Reasons a shared run is refused (idrange_service_shared_refused_total).
const (
	sharedOff         = "off"
	sharedRateLimited = "rate_limited"
	sharedUnavailable = "unavailable"
	sharedLead        = "lead"
	sharedFairShare   = "fair_share"
	sharedNoMinter    = "no_minter"
	sharedInvalid     = "invalid"
	sharedOther       = "error"
)

// AllocateShared carves a run for a client without a worker code of its
// own from the replica's minter's current block (package carve): no etcd
// write. The caller's identity is bounded to Config.SharedRate IDs/s.
func (s *Service) AllocateShared(ctx context.Context, req *idrangev1.AllocateSharedRequest) (*idrangev1.AllocateSharedResponse, error) {
	var resp *idrangev1.AllocateSharedResponse
	err := s.rpc(ctx, "AllocateShared", func(ctx context.Context) error {
		var err error
		resp, err = s.sharedRun(ctx, req)
		return err
	})
	return resp, err
}

// AllocateSharedBatch answers several AllocateShared requests in one call:
// each one checked, bounded and carved as AllocateShared does, in order,
// its outcome (a run or the status AllocateShared would have returned) in
// the same position of the reply. Refusals are counted per request under
// AllocateShared, and logged once per call.
func (s *Service) AllocateSharedBatch(ctx context.Context, req *idrangev1.AllocateSharedBatchRequest) (*idrangev1.AllocateSharedBatchResponse, error) {
	var resp *idrangev1.AllocateSharedBatchResponse
	err := s.rpc(ctx, "AllocateSharedBatch", func(ctx context.Context) error {
		reqs := req.GetRequests()
		if len(reqs) == 0 || len(reqs) > wire.MaxSharedBatch {
			return invalid("requests: %d not in 1..%d", len(reqs), wire.MaxSharedBatch)
		}
		resp = &idrangev1.AllocateSharedBatchResponse{Results: make([]*idrangev1.AllocateSharedResult, len(reqs))}
		refused, first, firstCode := 0, error(nil), codes.OK
		for i, r := range reqs {
			run, err := s.sharedRun(ctx, r)
			if err != nil {
				st := status.Convert(wire.ToStatus(err))
				s.metrics.Errors.WithLabelValues("AllocateShared", st.Code().String()).Inc()
				if refused++; first == nil {
					first, firstCode = err, st.Code()
				}
				resp.Results[i] = &idrangev1.AllocateSharedResult{Status: st.Proto()}
				continue
			}
			resp.Results[i] = &idrangev1.AllocateSharedResult{Run: run}
		}
		if refused > 0 {
			s.log.Log(ctx, logLevel(firstCode), "shared runs refused", "method", "AllocateSharedBatch", "refused", refused, "of", len(reqs), "first", first)
		}
		return nil
	})
	return resp, err
}

// sharedRun is one AllocateShared request, counted in the shared path's
// metrics.
func (s *Service) sharedRun(ctx context.Context, req *idrangev1.AllocateSharedRequest) (*idrangev1.AllocateSharedResponse, error) {
	resp, reason, err := s.allocateShared(ctx, req)
	if err != nil {
		s.metrics.SharedGrants.WithLabelValues("refused").Inc()
		if reason == "" {
			reason = sharedOther
		}
		s.metrics.SharedRefused.WithLabelValues(reason).Inc()
		return nil, err
	}
	s.metrics.SharedGrants.WithLabelValues("granted").Inc()
	s.metrics.SharedIDs.Add(float64(resp.GetHi() - resp.GetLo()))
	return resp, nil
}

// allocateShared is AllocateShared's work; reason names a refusal.
func (s *Service) allocateShared(ctx context.Context, req *idrangev1.AllocateSharedRequest) (_ *idrangev1.AllocateSharedResponse, reason string, _ error) {
	n, after, clientID := int64(req.GetCount()), snowflake.ID(req.GetAfterId()), req.GetClientId()
	switch {
	case n < 1 || n > segment.MaxShared:
		return nil, sharedInvalid, invalid("count: %d not in 1..%d", n, segment.MaxShared)
	case after < 0:
		return nil, sharedInvalid, invalid("after_id: %d is negative", after)
	case len(clientID) > segment.MaxClientID:
		return nil, sharedInvalid, invalid("client_id: %d bytes, more than %d", len(clientID), segment.MaxClientID)
	case !utf8.ValidString(clientID):
		return nil, sharedInvalid, invalid("client_id: not valid UTF-8")
	}
	if s.shared == nil {
		return nil, sharedOff, status.Error(codes.Unimplemented, "AllocateShared: the shared path is off on this replica (--shared-rate 0)")
	}
	s.mu.Lock()
	m, _ := s.minter.(Carver)
	s.mu.Unlock()
	if m == nil {
		return nil, sharedNoMinter, status.Error(codes.Unimplemented, "AllocateShared: this replica has no minter to carve from")
	}
	if err := ctx.Err(); err != nil {
		// The caller gave up while the request queued: a run carved now
		// would only be wasted.
		return nil, sharedOther, status.FromContextError(err).Err()
	}
	ident := authz.IdentityFrom(ctx)
	now := s.observe()
	if err := s.takeShare("AllocateShared", ident, n, now, true); err != nil {
		return nil, reasonOf(err), err
	}
	b, err := s.carve(ctx, m, carve.Request{N: n, After: after, MaxLead: s.leadFor(ident, now),
		ValidFor: SharedValidity - SharedMargin, MinLife: SharedMinLife})
	if err == nil {
		if cerr := b.CheckShared(s.cfg.Region, n, after); cerr != nil {
			// Never forward a run the minter should not have carved.
			err = errors.Newf("minter carved run [%d,%d) of code %d/%d: %v", b.Lo, b.Hi, b.Region, b.Worker, cerr)
		}
	}
	if err != nil {
		s.shared.settle(ident, clientID, n, 0, now, true)
		switch {
		case errors.Is(err, carve.ErrNotCarver):
			return nil, sharedNoMinter, status.Errorf(codes.Unimplemented, "AllocateShared: %v", err)
		case errors.Is(err, segment.ErrBackpressure):
			var bp *segment.Backpressure
			if errors.As(err, &bp) && bp.RetryAfter > sharedFarAhead {
				// The replica's codes are far ahead of the clock (a
				// restarted replica's first blocks lie at its restart
				// floor): another replica may serve at once.
				return nil, sharedLead, status.Errorf(codes.Unavailable, "AllocateShared: this replica's codes are %v too far ahead of the clock; another replica may serve: %v", bp.RetryAfter, err)
			}
			// Every code of the replica is at its lead bound: the
			// caller waits (ResourceExhausted with the retry delay).
			return nil, sharedLead, errors.Wrap(err, "AllocateShared")
		case errors.Is(err, segment.ErrUnavailable):
			return nil, sharedUnavailable, status.Errorf(codes.Unavailable, "AllocateShared: %v", err)
		}
		return nil, sharedOther, err
	}
	s.shared.settle(ident, clientID, n, b.Len(), now, true)
	return wire.SharedToProto(b), "", nil
}

// leadFor is the lead bound for ident's request at now: SharedLead, or
// heavyLead of it for an identity above its fair share of what the
// replica's codes mint, so that a burst of a few tenants leaves the rest
// of the lead to the others (docs/design.md, "The shared path").
func (s *Service) leadFor(ident string, now time.Time) time.Duration {
	if s.shared == nil {
		return s.cfg.SharedLead
	}
	capacity := s.shared.total
	s.mu.Lock()
	if cc, ok := s.minter.(codeCounter); ok {
		capacity = float64(cc.Codes()) * mintpool.CodeRate
	}
	s.mu.Unlock()
	if s.shared.overShare(ident, capacity, now) {
		return time.Duration(heavyLead * float64(s.cfg.SharedLead))
	}
	return s.cfg.SharedLead
}

// shareRefusal is a refusal by the shared limiter: backpressure, with the
// reason it counts under.
type shareRefusal struct {
	reason string
	err    error
}

func (r *shareRefusal) Error() string { return r.err.Error() }
func (r *shareRefusal) Unwrap() error { return r.err }

// reasonOf is the refusal reason of an error of takeShare.
func reasonOf(err error) string {
	var r *shareRefusal
	if errors.As(err, &r) {
		return r.reason
	}
	return sharedOther
}

// takeShare takes n IDs for ident from the shared limiter (per identity
// too for a shared run), or returns the backpressure answer for method,
// logging refusals at most once a sharedLogEvery.
func (s *Service) takeShare(method, ident string, n int64, now time.Time, perIdentity bool) error {
	wait, reason, ok := s.shared.take(ident, n, now, perIdentity)
	if ok {
		return nil
	}
	if refused, log := s.shared.refuse(reason, now); log {
		s.log.Info("shared path: callers over their bound are refused with a retry delay",
			"identity", ident, "reason", reason, "rate", s.shared.rate, "rate_total", s.shared.total, "refused_since_last_line", refused)
	}
	var err error
	if reason == sharedRateLimited {
		err = errors.Newf("%s: identity %q is over its shared rate %.0f IDs/s: %w", method, ident, s.shared.rate, &segment.Backpressure{RetryAfter: wait})
	} else {
		err = errors.Newf("%s: the replica's bound of %.0f IDs/s for all callers is spent and identity %q is at or above its fair share: %w",
			method, s.shared.total, ident, &segment.Backpressure{RetryAfter: wait})
	}
	return &shareRefusal{reason: reason, err: err}
}

// carve carves r from m within sharedCarveTimeout.
func (s *Service) carve(ctx context.Context, m Carver, r carve.Request) (segment.Block, error) {
	ctx, cancel := context.WithTimeout(ctx, sharedCarveTimeout)
	defer cancel()
	return m.Carve(ctx, r)
}

// sweepShared refreshes the shared path's gauges (Run calls it every
// CheckInterval).
func (s *Service) sweepShared() {
	if s.shared == nil {
		return
	}
	clients, usage, active := s.shared.sweep(s.cfg.Now())
	s.metrics.SharedClients.Set(float64(clients))
	s.metrics.SharedUsage.Set(usage)
	s.metrics.SharedIdentities.Set(float64(active))
}

// minterGauges are what the replica's minter pool says of itself.
type minterGauges interface {
	Codes() int
	Lead() time.Duration
	Rate() float64
}

// sweepMinter refreshes the minter's gauges (Run calls it every
// CheckInterval).
func (s *Service) sweepMinter() {
	s.mu.Lock()
	m, ok := s.minter.(minterGauges)
	s.mu.Unlock()
	if !ok {
		return
	}
	s.metrics.MinterCodes.Set(float64(m.Codes()))
	s.metrics.MinterLead.Set(m.Lead().Seconds())
	s.metrics.MinterDemand.Set(m.Rate())
}

// codesHeld is the number of worker codes the replica's own minter holds:
// what it says (the minter pool: 0 before a lazily opened one is first
// used), else 1 for any minter.
func (s *Service) codesHeld() int {
	s.mu.Lock()
	m := s.minter
	s.mu.Unlock()
	if cc, ok := m.(codeCounter); ok {
		return cc.Codes()
	}
	if m != nil {
		return 1
	}
	return 0
}
