// Package segment defines blocks of (timestamp, sequence) space and the rules
// by which the range service grants them to fenced worker codes.
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
// is committed to etcd before the block is returned, in one transaction fenced
// by the caller's token and the HWM key's revision. HWM[c] only grows, so two
// blocks of one code never overlap, whatever any clock says.
package segment

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// Sentinel errors. Callers branch on them with errors.Is; the gRPC layer maps
// them to status codes and back, so they survive the wire.
var (
	// ErrFenced: the caller's token is not the current owner's token (its
	// lease expired and the code may belong to someone else). Final for that
	// lease: stop minting and acquire a new lease.
	ErrFenced = errors.New("segment: fenced: token is not the code's current owner")
	// ErrLeaseLost: the lease no longer exists in etcd (expired or released).
	// Final for that lease.
	ErrLeaseLost = errors.New("segment: lease lost")
	// ErrNoFreeCode: every worker code of the region is leased. Retryable.
	ErrNoFreeCode = errors.New("segment: no free worker code in region")
	// ErrBackpressure: the code's HWM runs too far ahead of the service clock
	// (the code is at its 4,096 IDs/ms limit, or the service clock moved
	// back). Retryable after Backpressure.RetryAfter.
	ErrBackpressure = errors.New("segment: code is ahead of service time; retry later")
	// ErrCorrupt: a value in etcd does not decode. Grants for that code stop
	// until an operator repairs it; it is never treated as zero.
	ErrCorrupt = errors.New("segment: corrupt value in store")
	// ErrInvalid: a request field is out of range.
	ErrInvalid = errors.New("segment: invalid request")
	// ErrUnavailable: the store (etcd) could not be reached or did not answer
	// in time; the outcome of a write may be unknown. Retryable.
	ErrUnavailable = errors.New("segment: store unavailable")
	// ErrEpochExhausted: the block would run past snowflake.MaxTimestamp.
	ErrEpochExhausted = snowflake.ErrEpochExhausted
)

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
// every new owner of the code (it is the etcd CreateRevision of the lease key).
type Lease struct {
	Region  int
	Worker  int
	Token   int64
	LeaseID int64
	// TTL is the lease time granted by etcd at acquisition or renewal. A
	// client's safety deadline is (time the request was sent) + TTL - margin.
	TTL time.Duration
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
	return IDAt(l, b.Region, b.Worker)
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
