package store

import (
	"context"
	"fmt"
	"time"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Acquire leases a free worker code of region for owner (segment.ValidateOwner: for
// operators). It grants a storage lease, then tries the free codes starting
// at a random one, creating the owner entry only if it does not exist. The
// token is the revision that created the entry. With every code leased (or
// unusable because its HWM is corrupt or went back, ErrHighWaterRegressed)
// it returns an error wrapping ErrNoFreeCode (retryable) and revokes the
// unused lease.
//
// With a caller identity in ctx (authz.WithIdentity) the lease is bound to it
// (owner record version 2), and an identity that already holds
// MaxCodesPerIdentity codes gets ErrCodeCap (see keepUnderCap for how the
// cap holds against concurrent acquisitions on any replica).
func (s *Store) Acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	l, err := s.acquire(ctx, region, owner)
	if err != nil {
		if region >= 0 && region <= snowflake.MaxRegion {
			s.obs.AcquireFailed(region, err)
		}
		return segment.Lease{}, err
	}
	s.obs.Acquired(region, l.Worker)
	return l, nil
}

func (s *Store) acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	if err := validRegion(region); err != nil {
		return segment.Lease{}, err
	}
	if err := segment.ValidateOwner(owner); err != nil {
		return segment.Lease{}, err
	}
	identity := authz.IdentityFrom(ctx)
	if err := authz.ValidateIdentity(identity); err != nil {
		return segment.Lease{}, fmt.Errorf("%v: %w", err, segment.ErrInvalid)
	}
	if identity != "" {
		// Refuse early, without a lease, when the cap is already reached.
		octx, cancel := s.opCtx(ctx)
		rv, err := s.stg.Scan(octx, region)
		cancel()
		if err != nil {
			return segment.Lease{}, Unavailable(err, "region %d: list codes", region)
		}
		if held := len(identityTokens(rv, identity)); held >= s.cfg.MaxCodesPerIdentity {
			return segment.Lease{}, s.capErr(region, identity, held)
		}
	}
	octx, cancel := s.opCtx(ctx)
	leaseID, ttl, err := s.stg.Grant(octx, s.cfg.LeaseTTL)
	cancel()
	if err != nil {
		return segment.Lease{}, Unavailable(err, "acquire region %d: grant lease", region)
	}
	keep := false
	defer func() {
		if !keep {
			s.revoke(ctx, leaseID)
		}
	}()

	const passes = 3 // fresh snapshots before giving up on races
	for pass := 0; pass < passes; pass++ {
		free, err := s.freeCodes(ctx, region)
		if err != nil {
			return segment.Lease{}, err
		}
		if len(free.hwmRev) == 0 {
			return segment.Lease{}, fmt.Errorf("region %d: all %d codes leased (%d unusable: corrupt high-water mark; %d: high-water mark went back): %w",
				region, snowflake.MaxWorker+1, free.corrupt, free.regressed, segment.ErrNoFreeCode)
		}
		start := s.cfg.FirstCode(region) & snowflake.MaxWorker
		for i := 0; i <= snowflake.MaxWorker; i++ {
			w := (start + i) % (snowflake.MaxWorker + 1)
			hwmRev, ok := free.hwmRev[w]
			if !ok {
				continue
			}
			rec := OwnerRecord{
				Version: recordVersion(identity), Region: region, Worker: w, LeaseID: leaseID,
				Owner: owner, Identity: identity, AcquiredUnixMs: max(time.Now().UnixMilli(), 1),
			}
			octx, cancel := s.opCtx(ctx)
			token, ok, err := s.stg.CreateOwner(octx, region, w, hwmRev, []byte(rec.Encode()), leaseID)
			cancel()
			if err != nil {
				// Unknown commit: the deferred revoke deletes the entry if it
				// was created, so the code is not left half-owned.
				return segment.Lease{}, Unavailable(err, "acquire region %d worker %d: commit unknown", region, w)
			}
			if !ok {
				continue // taken (or its HWM changed) since the snapshot
			}
			if identity != "" {
				// Over the cap: the deferred revoke deletes the new entry.
				if err := s.keepUnderCap(ctx, region, identity, token); err != nil {
					return segment.Lease{}, err
				}
			}
			keep = true
			s.forget(region, w)
			return segment.Lease{Region: region, Worker: w, Token: token, LeaseID: leaseID, TTL: ttl}, nil
		}
	}
	return segment.Lease{}, fmt.Errorf("region %d: every free code was taken by a concurrent acquire: %w", region, segment.ErrNoFreeCode)
}

// keepUnderCap decides, after Acquire created the owner entry of token for
// identity, whether the identity may keep it: it re-reads the region and
// keeps the code only if token is among the MaxCodesPerIdentity smallest
// tokens the identity holds. Tokens are the revisions that created the
// entries, so the rule is the same on every replica: of several concurrent
// acquisitions by one identity, the later ones (larger tokens) give their
// code back. Each kept code saw every live code of its identity created
// before it (its read came after its own creation), so at most
// MaxCodesPerIdentity codes are ever held at once, however many replicas
// acquire for the identity concurrently. The price is that concurrent
// acquirers near the cap may all be refused (each counts codes the others
// are about to give back); ErrCodeCap is retryable.
func (s *Store) keepUnderCap(ctx context.Context, region int, identity string, token int64) error {
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return Unavailable(err, "region %d: count the codes of identity %q", region, identity)
	}
	toks := identityTokens(rv, identity)
	smaller := 0
	for _, t := range toks {
		if t < token {
			smaller++
		}
	}
	if smaller >= s.cfg.MaxCodesPerIdentity {
		return s.capErr(region, identity, len(toks)-1)
	}
	return nil
}

func (s *Store) capErr(region int, identity string, held int) error {
	return fmt.Errorf("region %d: identity %q holds %d codes; the cap is %d (--max-codes-per-identity): %w",
		region, identity, held, s.cfg.MaxCodesPerIdentity, segment.ErrCodeCap)
}

// identityTokens returns the tokens of the codes of rv whose owner record
// names identity. Records that do not decode are left out (Acquire does not
// hand out such codes; List reports them).
func identityTokens(rv RegionView, identity string) []int64 {
	var toks []int64
	for _, e := range rv.Owners {
		if rec, err := DecodeOwnerRecord(e.Value); err == nil && rec.Identity == identity {
			toks = append(toks, e.CreateRevision)
		}
	}
	return toks
}

func (s *Store) revoke(ctx context.Context, id int64) {
	// Clean-up runs even if ctx is done: the lease would otherwise linger
	// for its TTL holding nothing (or a code).
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	if err := s.stg.Revoke(octx, id); err != nil {
		s.log.Warn("revoke lease failed; it expires by its TTL", "lease_id", id, "err", err)
	}
}

// regionView is a snapshot of a region's codes: the HWM ModRevision (0 when
// absent) of every free, usable code, and how many free codes were
// unusable (corrupt HWM, or one that went back).
type regionView struct {
	hwmRev    map[int]int64
	leased    int
	corrupt   int
	regressed int
}

func (s *Store) freeCodes(ctx context.Context, region int) (regionView, error) {
	floors := s.regionFloors(region)
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return regionView{}, Unavailable(err, "region %d: list codes", region)
	}
	v := regionView{hwmRev: make(map[int]int64), leased: len(rv.Owners)}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		_, leased := rv.Owners[w]
		e, ok := rv.HighWaters[w]
		var hwm int64
		if ok {
			var err error
			if hwm, err = DecodeHighWater(e.Value); err != nil {
				if !leased {
					s.reportCorrupt(e.Key, err)
					v.corrupt++
				}
				continue
			}
		}
		// Every code's mark is checked, leased or not: the scan is a read.
		if err := s.seeHighWater(region, w, floors[w], hwm, e.Key); err != nil {
			if !leased {
				v.regressed++
			}
			continue
		}
		if !leased {
			v.hwmRev[w] = e.ModRevision
		}
	}
	return v, nil
}

func (s *Store) reportCorrupt(key string, err error) {
	s.log.Error("corrupt value in storage; code stopped until repaired", "key", key, "err", err)
	s.obs.Corrupt(key, err)
}

// FreeCodes is how many codes of region Acquire could hand out now: not
// leased and with a decodable (or absent) HWM that did not go back.
func (s *Store) FreeCodes(ctx context.Context, region int) (int, error) {
	if err := validRegion(region); err != nil {
		return 0, err
	}
	v, err := s.freeCodes(ctx, region)
	if err != nil {
		return 0, err
	}
	return len(v.hwmRev), nil
}
