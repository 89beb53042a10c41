package store

import (
	"context"
	"fmt"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// This file holds what operators ask of a Store (rangesvc admin): a
// snapshot of a region and fencing one code. Both go through Storage's
// contract as it is (Scan, Code, DeleteOwner, Revoke); the strict decoding
// of stored values stays in this package.

// RegionSnapshot is one consistent view of a region's codes, for operators.
type RegionSnapshot struct {
	Region int
	// Rev is the storage revision the view was read at.
	Rev int64
	// Leases are the live leases, ordered by worker code (as List reports
	// them; TTL is zero).
	Leases []LeaseInfo
	// HighWaters holds the committed high-water mark (linear space, an
	// exclusive end) of every code that ever had a grant and whose value
	// decodes.
	HighWaters map[int]int64
	// Corrupt holds, by code, the error (wrapping ErrCorrupt) of every
	// high-water mark that does not decode or went back (below one this
	// Store committed or read: ErrHighWaterRegressed; such a mark is in
	// HighWaters too): those codes are stopped.
	Corrupt map[int]error
	// Free is how many codes Acquire could hand out: not leased, and with
	// a decodable (or absent) high-water mark that did not go back.
	// FreeCodes reports the same.
	Free int
}

// Snapshot reads region's owner and high-water entries in one consistent
// view and decodes them strictly.
func (s *Store) Snapshot(ctx context.Context, region int) (RegionSnapshot, error) {
	if err := validRegion(region); err != nil {
		return RegionSnapshot{}, err
	}
	floors := s.regionFloors(region)
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return RegionSnapshot{}, Unavailable(err, "region %d: snapshot", region)
	}
	snap := RegionSnapshot{
		Region: region, Rev: rv.Rev,
		Leases:     make([]LeaseInfo, 0, len(rv.Owners)),
		HighWaters: make(map[int]int64, len(rv.HighWaters)),
		Corrupt:    map[int]error{},
	}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		e, leased := rv.Owners[w]
		if leased {
			snap.Leases = append(snap.Leases, s.leaseInfo(&e, region, w))
		}
		h, ok := rv.HighWaters[w]
		var hwm int64
		if ok {
			var err error
			if hwm, err = DecodeHighWater(h.Value); err != nil {
				err = fmt.Errorf("key %s: %w", h.Key, err)
				s.reportCorrupt(h.Key, err)
				snap.Corrupt[w] = err
				continue
			}
			snap.HighWaters[w] = hwm
		}
		if err := s.seeHighWater(region, w, floors[w], hwm, h.Key); err != nil {
			snap.Corrupt[w] = err
			continue
		}
		if !leased {
			snap.Free++
		}
	}
	return snap, nil
}

// Fence ends a code's current lease on purpose: an operator taking a stuck
// or rogue owner out. It deletes the code's owner entry if and only if it
// is still the one created by token and attached to the same storage lease
// (one compare-and-delete: it cannot remove an owner that took the code
// after the read), then revokes that lease, which no other entry uses
// (every Acquire grants its own). token 0 means whichever owner holds the
// code when Fence reads it.
//
// The code's high-water mark stays, so whoever takes the code next starts
// above everything the fenced owner was granted. The fenced owner learns at
// its next renewal or grant (ErrLeaseLost: its lease key is gone) and stops
// minting; nothing stops it from acquiring another code. Fencing cannot
// cause a duplicate: it only removes an owner, and blocks are disjoint by
// the high-water mark whoever owns the code.
//
// It returns the lease it fenced. Errors: ErrInvalid (a bad argument,
// named), ErrLeaseLost (the code has no owner, or it went away during the
// call), ErrFenced (another token owns the code: nothing was done),
// ErrUnavailable (the storage did not answer; if the delete's outcome is
// unknown, calling Fence again with the same token is safe).
func (s *Store) Fence(ctx context.Context, region, worker int, token int64) (LeaseInfo, error) {
	if err := validRegion(region); err != nil {
		return LeaseInfo{}, err
	}
	switch {
	case worker < 0 || worker > snowflake.MaxWorker:
		return LeaseInfo{}, fmt.Errorf("worker %d not in 0..%d: %w", worker, snowflake.MaxWorker, segment.ErrInvalid)
	case token < 0:
		return LeaseInfo{}, fmt.Errorf("token %d is negative: %w", token, segment.ErrInvalid)
	}
	v, err := s.read(ctx, region, worker)
	if err != nil {
		return LeaseInfo{}, err
	}
	e := v.Owner
	switch {
	case e == nil:
		return LeaseInfo{}, fmt.Errorf("fence region %d worker %d: the code has no owner: %w", region, worker, segment.ErrLeaseLost)
	case token != 0 && e.CreateRevision != token:
		return LeaseInfo{}, fmt.Errorf("fence region %d worker %d: the code is owned by token %d, not %d; nothing fenced: %w",
			region, worker, e.CreateRevision, token, segment.ErrFenced)
	}
	info := s.leaseInfo(e, region, worker)
	octx, cancel := s.opCtx(ctx)
	ok, fresh, err := s.stg.DeleteOwner(octx, region, worker, e.CreateRevision, e.Lease)
	cancel()
	s.forget(region, worker)
	if err != nil {
		return LeaseInfo{}, Unavailable(err, "fence region %d worker %d token %d: outcome unknown", region, worker, e.CreateRevision)
	}
	if !ok {
		if fresh.Owner == nil {
			return LeaseInfo{}, fmt.Errorf("fence region %d worker %d: token %d went away meanwhile: %w",
				region, worker, e.CreateRevision, segment.ErrLeaseLost)
		}
		return LeaseInfo{}, fmt.Errorf("fence region %d worker %d: token %d was replaced by token %d meanwhile; nothing fenced: %w",
			region, worker, e.CreateRevision, fresh.Owner.CreateRevision, segment.ErrFenced)
	}
	if e.Lease > 0 {
		s.revoke(ctx, e.Lease)
	}
	s.log.Warn("lease fenced by an operator", "region", region, "worker", worker, "token", e.CreateRevision,
		"lease_id", e.Lease, "owner", info.Owner)
	return info, nil
}

// LeaseInfo describes one live lease, as List reports it.
type LeaseInfo struct {
	segment.Lease // TTL is zero: List does not ask the storage for remaining TTLs
	Owner         string
	// Identity is the verified identity the lease is bound to ("" if it
	// was acquired without one).
	Identity string
	Acquired time.Time
	// Err is non-nil (wrapping ErrCorrupt) if the owner record does not
	// decode; the other fields then hold only what the entry itself says.
	Err error
}

// List returns the live leases of region, ordered by worker code.
func (s *Store) List(ctx context.Context, region int) ([]LeaseInfo, error) {
	if err := validRegion(region); err != nil {
		return nil, err
	}
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return nil, Unavailable(err, "region %d: list leases", region)
	}
	out := make([]LeaseInfo, 0, len(rv.Owners))
	for w := 0; w <= snowflake.MaxWorker; w++ {
		e, ok := rv.Owners[w]
		if !ok {
			continue
		}
		out = append(out, s.leaseInfo(&e, region, w))
	}
	return out, nil
}

// leaseInfo describes a code's owner entry e; a record that does not decode
// is reported (and its error kept in Err).
func (s *Store) leaseInfo(e *Entry, region, worker int) LeaseInfo {
	info := LeaseInfo{Lease: segment.Lease{Region: region, Worker: worker, Token: e.CreateRevision, LeaseID: e.Lease}}
	rec, err := s.checkRecord(e, region, worker)
	if err != nil {
		info.Err = err
	} else {
		info.Owner = rec.Owner
		info.Identity = rec.Identity
		info.Acquired = time.UnixMilli(rec.AcquiredUnixMs)
	}
	return info
}

// checkRecord decodes an owner entry and checks it against the code and the
// lease it is attached to.
func (s *Store) checkRecord(e *Entry, region, worker int) (OwnerRecord, error) {
	rec, err := DecodeOwnerRecord(e.Value)
	if err == nil && (rec.Region != region || rec.Worker != worker) {
		err = fmt.Errorf("owner record names region %d worker %d: %w", rec.Region, rec.Worker, segment.ErrCorrupt)
	}
	if err == nil && rec.LeaseID != e.Lease {
		err = fmt.Errorf("owner record names lease %x but the entry is attached to %x: %w", rec.LeaseID, e.Lease, segment.ErrCorrupt)
	}
	if err != nil {
		err = fmt.Errorf("key %s: %w", e.Key, err)
		s.reportCorrupt(e.Key, err)
	}
	return rec, err
}

// HighWater reads the committed HWM of a code: 0 if it never had a grant,
// ErrCorrupt if the value does not decode, ErrHighWaterRegressed (also
// ErrCorrupt) if it is below one this Store committed or read before.
func (s *Store) HighWater(ctx context.Context, region, worker int) (int64, error) {
	if err := validRegion(region); err != nil {
		return 0, err
	}
	if worker < 0 || worker > snowflake.MaxWorker {
		return 0, fmt.Errorf("worker %d not in 0..%d: %w", worker, snowflake.MaxWorker, segment.ErrInvalid)
	}
	floor := s.floorOf(region, worker)
	octx, cancel := s.opCtx(ctx)
	v, err := s.stg.Code(octx, region, worker)
	cancel()
	if err != nil {
		return 0, Unavailable(err, "read region %d worker %d", region, worker)
	}
	var hwm int64
	var key string
	if v.HighWater != nil {
		key = v.HighWater.Key
		if hwm, err = DecodeHighWater(v.HighWater.Value); err != nil {
			return 0, fmt.Errorf("key %s: %w", key, err)
		}
	}
	if err := s.seeHighWater(region, worker, floor, hwm, key); err != nil {
		return 0, err
	}
	return hwm, nil
}
