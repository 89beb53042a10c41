// Package segment defines blocks of (timestamp, sequence) space and the rule
// by which the range service grants them to fenced worker codes: what a
// client and a server both need to agree on.
//
// It holds Lease, Block, Policy (the grant rule, Plan), the Allocator
// interface a client talks to, and the sentinel errors every layer returns
// and matches with errors.Is. It imports only the standard library and
// snowflake. The grant loop that applies the rule over etcd is the server's
// (internal/server/store).
//
// For one worker code c = (region, worker) the space is numbered linearly:
//
//	L = ms<<12 | seq      (ms since snowflake.Epoch, seq in 0..4095)
//
// A Block is a half-open range [Lo, Hi) of L for one code. The ID for L is
// (L>>12)<<22 | region<<20 | worker<<12 | L&0xFFF (see Block.ID).
//
// The grant rule: for a request of n IDs on code c at service time now,
// Lo = max(HWM[c], now<<12), Hi = Lo + n' (n' sized by policy), and HWM[c] = Hi
// is committed to storage before the block is returned, in one transaction
// fenced by the caller's token and the HWM's revision. HWM[c] only grows, so two
// blocks of one code never overlap, whatever any clock says.
package segment

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idrange/idrange/snowflake"
)

// Sentinel errors. Callers branch on them with errors.Is; the gRPC layer maps
// them to status codes and back, so they survive the wire.
var (
	// ErrFenced: the caller's token is not the current owner's token (its
	// lease expired and the code may belong to someone else). Final for that
	// lease: stop minting and acquire a new lease.
	ErrFenced = errors.New("segment: fenced: token is not the code's current owner")
	// ErrLeaseLost: the lease no longer exists in the store (expired or
	// released).
	// Final for that lease.
	ErrLeaseLost = errors.New("segment: lease lost")
	// ErrNoFreeCode: every worker code of the region is leased. Retryable.
	ErrNoFreeCode = errors.New("segment: no free worker code in region")
	// ErrBackpressure: the code's HWM runs too far ahead of the service clock
	// (the code is at its 4,096 IDs/ms limit, or the service clock moved
	// back). Retryable after Backpressure.RetryAfter.
	ErrBackpressure = errors.New("segment: code is ahead of service time; retry later")
	// ErrCorrupt: a stored value does not decode. Grants for that code stop
	// until an operator repairs it; it is never treated as zero.
	ErrCorrupt = errors.New("segment: corrupt value in store")
	// ErrHighWaterRegressed: a code's stored high-water mark is below one
	// this Store already committed or read for it (a deleted mark reads as
	// 0): the store went back (restored without a restore fence, written
	// by hand, a bug). Grants on that code stop, and Acquire skips it,
	// until the stored mark is at or above the highest one seen again (a
	// restore fence lifts every mark). It is a kind of ErrCorrupt:
	// errors.Is(err, ErrCorrupt) is true for it too, so every caller that
	// stops on a corrupt value stops on it.
	ErrHighWaterRegressed error = &kindOf{"segment: high-water mark went back", ErrCorrupt}
	// ErrInvalid: a request field is out of range.
	ErrInvalid = errors.New("segment: invalid request")
	// ErrUnavailable: the store (etcd) could not be reached or did not answer
	// in time; the outcome of a write may be unknown. Retryable. Errors
	// wrapping it usually wrap the cause too (errors.Is sees both).
	ErrUnavailable = errors.New("segment: store unavailable")
	// ErrEpochExhausted: the block would run past snowflake.MaxTimestamp.
	ErrEpochExhausted = snowflake.ErrEpochExhausted
	// ErrPermissionDenied: the caller's identity (WithIdentity) does not
	// hold the lease it named (the code's live lease is another identity's,
	// or the code has none). Nothing was changed. Final for that caller and
	// lease.
	ErrPermissionDenied = errors.New("segment: permission denied: the caller's identity does not hold the lease")
	// ErrCodeCap: the caller's identity already holds
	// StoreConfig.MaxCodesPerIdentity worker codes of the region. Retryable
	// once one of them is released or expires.
	ErrCodeCap = errors.New("segment: identity holds its cap of worker codes")
)

// kindOf is a sentinel that is also a kind of a broader one: errors.Is
// matches it against either.
type kindOf struct {
	msg  string
	kind error
}

func (e *kindOf) Error() string        { return e.msg }
func (e *kindOf) Is(target error) bool { return target == e.kind }

// Backpressure carries the delay after which a refused grant may succeed.
// It wraps ErrBackpressure; get it with errors.As.
type Backpressure struct {
	RetryAfter time.Duration
}

func (b *Backpressure) Error() string {
	return "segment: code is ahead of service time; retry after " + b.RetryAfter.String()
}

// Is makes errors.Is(err, ErrBackpressure) true for a *Backpressure.
func (b *Backpressure) Is(target error) bool { return target == ErrBackpressure }

// Lease is one owner's hold on one worker code. Token strictly grows with
// every new owner of the code (it is the storage revision that created the
// owner record: the etcd CreateRevision of the lease key).
type Lease struct {
	Region int
	Worker int
	Token  int64
	// LeaseID is the storage's TTL lease the owner record is attached to.
	// etcd lease ids are positive int64s, so 0 and negatives are invalid.
	LeaseID int64
	// TTL is the lease time granted by etcd at acquisition or renewal. A
	// client's safety deadline is (time the request was sent) + TTL - margin.
	TTL time.Duration
}

// Validate reports the first field of l out of range, wrapping ErrInvalid and
// naming the field (region, worker, token, lease_id). It checks only what a
// lease can be checked for without the store: whether the store issued it is
// the store's question.
func (l Lease) Validate() error {
	if err := ValidateRegion(l.Region); err != nil {
		return err
	}
	switch {
	case l.Worker < 0 || l.Worker > snowflake.MaxWorker:
		return fmt.Errorf("worker %d not in 0..%d: %w", l.Worker, snowflake.MaxWorker, ErrInvalid)
	case l.Token <= 0:
		return fmt.Errorf("token %d must be positive: %w", l.Token, ErrInvalid)
	case l.LeaseID <= 0:
		return fmt.Errorf("lease_id %d must be positive: %w", l.LeaseID, ErrInvalid)
	}
	return nil
}

// ValidateRegion reports a region code outside 0..snowflake.MaxRegion,
// wrapping ErrInvalid.
func ValidateRegion(region int) error {
	if region < 0 || region > snowflake.MaxRegion {
		return fmt.Errorf("region %d not in 0..%d: %w", region, snowflake.MaxRegion, ErrInvalid)
	}
	return nil
}

// Block is [Lo, Hi) of one code's linear space, granted at ServiceTime and
// usable until ValidUntil (both on the service's clock).
type Block struct {
	Region, Worker int
	Lo, Hi         int64
	ServiceTime    time.Time
	ValidUntil     time.Time
}

// Len is the number of IDs in the block.
func (b Block) Len() int64 { return b.Hi - b.Lo }

// ID returns the ID at linear position l of the block's code. l must lie in
// [Lo, Hi); that is the caller's invariant.
func (b Block) ID(l int64) snowflake.ID {
	return idAt(l, b.Region, b.Worker)
}

// Check reports why b cannot be a grant a correct service made for a
// request of asked IDs on lease l, wrapping ErrInvalid; nil if it can be. A
// block that fails it must never be minted from: it could overlap another.
// The rules: b is for l's code; 1 <= Lo < Hi <= EndL (L 0 is never granted:
// it would be ID 0 for code 0/0); Hi-Lo <= asked; ServiceTime is set and not
// before snowflake.Epoch; ValidUntil is after ServiceTime.
func (b Block) Check(l Lease, asked int64) error {
	if b.Region != l.Region || b.Worker != l.Worker {
		return fmt.Errorf("unusable block for code %d/%d: block is for code %d/%d: %w", l.Region, l.Worker, b.Region, b.Worker, ErrInvalid)
	}
	return b.check(asked)
}

// CheckShared is Check for a shared run (SharedAllocator) asked for in
// region: b's worker must be a valid code of region, and its first ID
// greater than after.
func (b Block) CheckShared(region int, asked int64, after snowflake.ID) error {
	switch {
	case b.Region != region:
		return fmt.Errorf("unusable shared run: code %d/%d is not in region %d: %w", b.Region, b.Worker, region, ErrInvalid)
	case b.Worker < 0 || b.Worker > snowflake.MaxWorker:
		return fmt.Errorf("unusable shared run: worker %d not in 0..%d: %w", b.Worker, snowflake.MaxWorker, ErrInvalid)
	}
	if err := b.check(asked); err != nil {
		return err
	}
	if first := b.ID(b.Lo); first <= after {
		return fmt.Errorf("unusable shared run for code %d/%d: first ID %d is not after %d: %w", b.Region, b.Worker, first, after, ErrInvalid)
	}
	return nil
}

// check is what Check and CheckShared have in common: the range and times.
func (b Block) check(asked int64) error {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("unusable block for code %d/%d: %s: %w", b.Region, b.Worker, fmt.Sprintf(format, args...), ErrInvalid)
	}
	switch {
	case b.Lo < 1:
		return bad("lo %d < 1", b.Lo)
	case b.Hi <= b.Lo:
		return bad("hi %d <= lo %d", b.Hi, b.Lo)
	case b.Hi > EndL:
		return bad("hi %d is past the end of the epoch %d", b.Hi, EndL)
	case b.Hi-b.Lo > asked:
		return bad("%d IDs, more than the %d asked", b.Hi-b.Lo, asked)
	case b.ServiceTime.IsZero() || b.ValidUntil.IsZero():
		return bad("service time or validity missing")
	case b.ServiceTime.Before(snowflake.Epoch):
		return bad("service time %v is before the epoch", b.ServiceTime)
	case !b.ValidUntil.After(b.ServiceTime):
		return bad("valid until %v is not after service time %v", b.ValidUntil, b.ServiceTime)
	}
	return nil
}

// Allocator is the range service as a client sees it. The etcd-backed
// service, the gRPC client stub and test fakes all implement it, so the
// buffering client (rangeclient) can run over any of them.
type Allocator interface {
	// Acquire leases a free worker code in region for owner (free text).
	Acquire(ctx context.Context, region int, owner string) (Lease, error)
	// Renew extends l once and returns it with the TTL granted.
	Renew(ctx context.Context, l Lease) (Lease, error)
	// Release gives the code back; its HWM stays.
	Release(ctx context.Context, l Lease) error
	// Allocate grants a block of about n IDs (the service may shrink it).
	Allocate(ctx context.Context, l Lease, n int) (Block, error)
}

// MaxShared is the most positions one shared run may hold (SharedAllocator,
// the AllocateShared RPC): 16 ms of one code's space, about half a second
// of IDs for a client at 131,072 IDs/s, far above the rate at which a
// client is better off with a worker code of its own.
const MaxShared = 1 << 16

// MaxClientID bounds the client_id of a shared-run request, in bytes.
const MaxClientID = 128

// SharedAllocator is an Allocator that also grants shared runs: dense runs
// of positions of a worker code the service itself holds, carved from a
// block whose high-water mark is already committed, for clients that do
// not need a code of their own. The gRPC client stub implements it; the
// store and most fakes do not, and a client over them takes a code.
type SharedAllocator interface {
	Allocator
	// AllocateShared grants a run of at most n (1..MaxShared) positions
	// in region whose first ID is greater than after; clientID (at most
	// MaxClientID bytes) names the caller for the service's metrics. The
	// block's code is the service's, not a lease of the caller: the
	// caller mints it densely from Lo (no jump to the clock) and stops at
	// ValidUntil.
	AllocateShared(ctx context.Context, region, n int, after snowflake.ID, clientID string) (Block, error)
}
