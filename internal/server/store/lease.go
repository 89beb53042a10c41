package store

import (
	"context"
	"fmt"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/segment"
)

// fence decides whether l owns its code in view v and the caller (identity)
// may act on it: nil if so; otherwise ErrPermissionDenied (the caller has
// an identity, or the lease is bound to one, and the code's live lease is
// not that identity's), ErrInvalid (a token never issued, or a lease_id that
// is not the one the owner is attached to), ErrLeaseLost (no owner: expired
// or released), ErrFenced (another token owns the code) or ErrCorrupt.
//
// Ownership first, and nothing else before it. Under mutual TLS a caller
// that is not the identity holding the code's live lease gets one answer,
// notOwner's, whatever it named: a right or wrong token, a right or wrong
// lease id, a token above the store's revision, a free code or a code whose
// owner record does not decode. So a second identity learns nothing by
// guessing: not whether a token or lease id was right, not the store's
// revision, not which codes are leased (issue 35). Only the identity that
// holds the live lease is told why a lease it names is not usable (fenced,
// never issued, wrong lease id): all of it is about its own lease. A
// client whose lease is gone is answered as a stranger would be (the record
// naming it is gone); rangeclient treats PermissionDenied on its lease as
// fenced. Without identities (no mutual TLS: any caller may act on any
// lease) the answers are the detailed ones, as there is nothing to hide.
// The details of a record that does not decode go to the log, never to the
// caller.
//
// The identity is checked against the owner record of the code's live
// lease, and every write that follows a fence is conditional on l.Token
// being that lease's CreateRevision (the grant compares the owner's
// CreateRevision and ModRevision, Release deletes only the entry created at
// l.Token, Renew keeps alive only the lease that record is attached to,
// which no other record can be). Owner records are immutable, so there is
// no read-then-act race.
func (s *Store) fence(l segment.Lease, v CodeView, identity string) error {
	e := v.Owner
	var rec OwnerRecord
	var recErr error
	if e != nil {
		// checkRecord logs the details of a bad record (key, lease ids).
		rec, recErr = s.checkRecord(e, l.Region, l.Worker)
	}
	if identity != "" || (e != nil && recErr == nil && rec.Identity != "") {
		if e == nil || recErr != nil || rec.Identity != identity {
			return notOwner(l)
		}
	}
	switch {
	case l.Token > v.Rev:
		return fmt.Errorf("region %d worker %d: the token was never issued: %w", l.Region, l.Worker, segment.ErrInvalid)
	case e == nil:
		return fmt.Errorf("region %d worker %d: the lease is gone (expired or released): %w",
			l.Region, l.Worker, segment.ErrLeaseLost)
	case e.CreateRevision != l.Token:
		return fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, segment.ErrFenced)
	case recErr != nil:
		return fmt.Errorf("region %d worker %d: the owner record is invalid (details in the replica's log): %w",
			l.Region, l.Worker, segment.ErrCorrupt)
	case e.Lease != l.LeaseID:
		return fmt.Errorf("region %d worker %d: lease_id %x is not the code's lease: %w", l.Region, l.Worker, l.LeaseID, segment.ErrInvalid)
	}
	return nil
}

// notOwner is the one answer to a caller that does not hold the code's live
// lease under identities: it names only the code the caller named.
func notOwner(l segment.Lease) error {
	return fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, segment.ErrPermissionDenied)
}

// Renew keeps l's storage lease alive once, after checking that l still
// owns its code. It returns l with the TTL granted. A caller's safety
// deadline is (time it sent this request) + TTL - margin.
func (s *Store) Renew(ctx context.Context, l segment.Lease) (segment.Lease, error) {
	out, err := s.renew(ctx, l)
	if l.Validate() == nil {
		s.obs.Renewed(l.Region, l.Worker, err)
	}
	return out, err
}

func (s *Store) renew(ctx context.Context, l segment.Lease) (segment.Lease, error) {
	if err := l.Validate(); err != nil {
		return segment.Lease{}, err
	}
	v, err := s.read(ctx, l.Region, l.Worker)
	if err != nil {
		return segment.Lease{}, err
	}
	if err := s.fence(l, v, authz.IdentityFrom(ctx)); err != nil {
		return segment.Lease{}, err
	}
	octx, cancel := s.opCtx(ctx)
	ttl, err := s.stg.KeepAlive(octx, l.LeaseID)
	cancel()
	switch {
	case err != nil:
		return segment.Lease{}, Unavailable(err, "renew region %d worker %d", l.Region, l.Worker)
	case ttl <= 0:
		return segment.Lease{}, fmt.Errorf("region %d worker %d: lease %x expired: %w", l.Region, l.Worker, l.LeaseID, segment.ErrLeaseLost)
	}
	l.TTL = ttl
	return l, nil
}

// Release deletes l's owner entry (only if l still owns it and the caller's
// identity is the one the lease is bound to) and revokes its storage lease.
// The code's HWM stays, so the next owner starts above it.
func (s *Store) Release(ctx context.Context, l segment.Lease) error {
	err := s.release(ctx, l)
	if l.Validate() == nil {
		s.obs.Released(l.Region, l.Worker, err)
	}
	return err
}

func (s *Store) release(ctx context.Context, l segment.Lease) error {
	if err := l.Validate(); err != nil {
		return err
	}
	// Check the caller against the record first: the delete below is
	// conditional on the same token, so it can only delete this record.
	identity := authz.IdentityFrom(ctx)
	v, err := s.read(ctx, l.Region, l.Worker)
	if err != nil {
		return err
	}
	if err := s.fence(l, v, identity); err != nil {
		return err
	}
	octx, cancel := s.opCtx(ctx)
	ok, fresh, err := s.stg.DeleteOwner(octx, l.Region, l.Worker, l.Token, l.LeaseID)
	cancel()
	if err != nil {
		return Unavailable(err, "release region %d worker %d", l.Region, l.Worker)
	}
	s.forget(l.Region, l.Worker)
	if !ok {
		if err := s.fence(l, fresh, identity); err != nil {
			return err
		}
		return fmt.Errorf("release region %d worker %d: lease changed concurrently: %w", l.Region, l.Worker, segment.ErrFenced)
	}
	s.revoke(ctx, l.LeaseID)
	return nil
}
