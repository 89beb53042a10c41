package wire

import (
	"context"
	"fmt"
	"math"
	"time"

	"google.golang.org/grpc"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// NewAllocator returns a segment.Allocator that calls the RangeService over
// cc. Requests are checked before they are sent (a negative worker must not
// wrap into a valid uint32), replies are checked before they are returned (a
// block is never wider than asked, never empty, never past segment.EndL: segment.Block.Check), and
// errors are mapped with FromStatus so errors.Is(err, segment.ErrFenced)
// works on the client. AllocateShared calls that wait while another is in
// flight on the same allocator go out together as one AllocateSharedBatch
// (sharedBatcher): share one allocator among the clients of a process that
// share a connection.
func NewAllocator(cc grpc.ClientConnInterface) segment.Allocator {
	c := idrangev1.NewRangeServiceClient(cc)
	return &allocator{c: c, shared: &sharedBatcher{c: c}}
}

// RegionReporter is implemented by the allocator NewAllocator returns:
// ReplicaRegion asks the replica behind it which region it serves (the
// GetReplicaInfo RPC), so a client need not be configured with it. It is a
// separate interface because segment.Allocator is also implemented by the
// store itself, which has no replica to ask; callers type-assert.
//
// The answer is checked: a region outside 0..3 is ErrProtocol. A replica
// that predates the RPC answers with status code Unimplemented (the error
// still carries it: status.Code(err)).
type RegionReporter interface {
	ReplicaRegion(ctx context.Context) (int, error)
}

var _ RegionReporter = (*allocator)(nil)

type allocator struct {
	c      idrangev1.RangeServiceClient
	shared *sharedBatcher // AllocateShared calls, batched when several wait
}

func (a *allocator) ReplicaRegion(ctx context.Context) (int, error) {
	resp, err := a.c.GetReplicaInfo(ctx, &idrangev1.GetReplicaInfoRequest{})
	if err != nil {
		return 0, FromStatus(err)
	}
	r := resp.GetRegion()
	if r > snowflake.MaxRegion {
		return 0, fmt.Errorf("GetReplicaInfo reply: region %d not in 0..%d: %w", r, snowflake.MaxRegion, ErrProtocol)
	}
	return int(r), nil
}

func (a *allocator) Acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	if err := segment.ValidateRegion(region); err != nil {
		return segment.Lease{}, err
	}
	resp, err := a.c.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: uint32(region), Owner: owner})
	if err != nil {
		return segment.Lease{}, FromStatus(err)
	}
	if resp.GetLease() == nil {
		return segment.Lease{}, fmt.Errorf("AcquireLease reply has no lease: %w", ErrProtocol)
	}
	l := LeaseFromProto(resp.GetLease())
	l.TTL = time.Duration(resp.GetTtlMs()) * time.Millisecond
	if err := l.Validate(); err != nil {
		return segment.Lease{}, malformed("AcquireLease", err)
	}
	if l.Region != region {
		return segment.Lease{}, fmt.Errorf("AcquireLease reply: region %d, asked for %d: %w", l.Region, region, ErrProtocol)
	}
	return l, nil
}

func (a *allocator) Renew(ctx context.Context, l segment.Lease) (segment.Lease, error) {
	pl, err := leaseRequest(l)
	if err != nil {
		return segment.Lease{}, err
	}
	resp, err := a.c.RenewLease(ctx, &idrangev1.RenewLeaseRequest{Lease: pl})
	if err != nil {
		return segment.Lease{}, FromStatus(err)
	}
	if resp.GetTtlMs() <= 0 {
		// etcd answers a keep-alive of an expired lease with TTL 0; a
		// server that forwards it must not be read as "renewed".
		return segment.Lease{}, fmt.Errorf("RenewLease reply: ttl_ms %d: %w", resp.GetTtlMs(), segment.ErrLeaseLost)
	}
	l.TTL = time.Duration(resp.GetTtlMs()) * time.Millisecond
	return l, nil
}

func (a *allocator) Release(ctx context.Context, l segment.Lease) error {
	pl, err := leaseRequest(l)
	if err != nil {
		return err
	}
	_, err = a.c.ReleaseLease(ctx, &idrangev1.ReleaseLeaseRequest{Lease: pl})
	return FromStatus(err)
}

func (a *allocator) Allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	pl, err := leaseRequest(l)
	if err != nil {
		return segment.Block{}, err
	}
	if n <= 0 || n > math.MaxUint32 {
		return segment.Block{}, fmt.Errorf("count %d not in 1..%d: %w", n, uint32(math.MaxUint32), segment.ErrInvalid)
	}
	resp, err := a.c.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: pl, Count: uint32(n)})
	if err != nil {
		return segment.Block{}, FromStatus(err)
	}
	b := BlockFromProto(l.Region, l.Worker, resp)
	if err := b.Check(l, int64(n)); err != nil {
		return segment.Block{}, malformed("AllocateBlock", err)
	}
	return b, nil
}

var _ segment.SharedAllocator = (*allocator)(nil)

func (a *allocator) AllocateShared(ctx context.Context, region, n int, after snowflake.ID, clientID string) (segment.Block, error) {
	if err := segment.ValidateRegion(region); err != nil {
		return segment.Block{}, err
	}
	switch {
	case n < 1 || n > segment.MaxShared:
		return segment.Block{}, fmt.Errorf("count %d not in 1..%d: %w", n, segment.MaxShared, segment.ErrInvalid)
	case after < 0:
		return segment.Block{}, fmt.Errorf("after ID %d is negative: %w", after, segment.ErrInvalid)
	case len(clientID) > segment.MaxClientID:
		return segment.Block{}, fmt.Errorf("client ID of %d bytes, more than %d: %w", len(clientID), segment.MaxClientID, segment.ErrInvalid)
	}
	resp, err := a.shared.do(ctx, &idrangev1.AllocateSharedRequest{Count: uint32(n), AfterId: int64(after), ClientId: clientID})
	if err != nil {
		return segment.Block{}, FromStatus(err)
	}
	b := SharedFromProto(resp)
	if err := b.CheckShared(region, int64(n), after); err != nil {
		return segment.Block{}, malformed("AllocateShared", err)
	}
	return b, nil
}

// SharedToProto converts a shared run for the AllocateShared reply.
func SharedToProto(b segment.Block) *idrangev1.AllocateSharedResponse {
	return &idrangev1.AllocateSharedResponse{
		Region:              uint32(b.Region),
		Worker:              uint32(b.Worker),
		Lo:                  b.Lo,
		Hi:                  b.Hi,
		ServiceTimeUnixNano: b.ServiceTime.UnixNano(),
		ValidUntilUnixNano:  b.ValidUntil.UnixNano(),
	}
}

// SharedFromProto converts an AllocateShared reply. A region or worker too
// large for an int32 becomes -1, which Block.CheckShared refuses. It does
// not validate.
func SharedFromProto(p *idrangev1.AllocateSharedResponse) segment.Block {
	code := func(v uint32) int {
		if v > math.MaxInt32 {
			return -1
		}
		return int(v)
	}
	return segment.Block{
		Region:      code(p.GetRegion()),
		Worker:      code(p.GetWorker()),
		Lo:          p.GetLo(),
		Hi:          p.GetHi(),
		ServiceTime: unixNano(p.GetServiceTimeUnixNano()),
		ValidUntil:  unixNano(p.GetValidUntilUnixNano()),
	}
}

// leaseRequest checks l's fields (segment.Lease.Validate) and converts it
// for a request.
func leaseRequest(l segment.Lease) (*idrangev1.Lease, error) {
	if err := l.Validate(); err != nil {
		return nil, fmt.Errorf("lease: %w", err)
	}
	return LeaseToProto(l), nil
}

// malformed marks a reply that fails segment's checks as ErrProtocol. The
// check's own sentinel (segment.ErrInvalid) is kept out of the chain: the
// caller's request was fine, the server's reply was not, and callers treat
// the two differently (a bad reply moves to another replica).
func malformed(rpc string, err error) error {
	return fmt.Errorf("%s reply: %v: %w", rpc, err, ErrProtocol)
}

// LeaseToProto converts a lease for the wire (TTL travels separately, as
// ttl_ms). Fields must already be in range; see the service for checks.
func LeaseToProto(l segment.Lease) *idrangev1.Lease {
	return &idrangev1.Lease{
		Region:  uint32(l.Region),
		Worker:  uint32(l.Worker),
		Token:   l.Token,
		LeaseId: l.LeaseID,
	}
}

// LeaseFromProto converts a wire lease (TTL left zero). It does not
// validate; servers check every field before use.
func LeaseFromProto(p *idrangev1.Lease) segment.Lease {
	return segment.Lease{
		Region:  int(p.GetRegion()),
		Worker:  int(p.GetWorker()),
		Token:   p.GetToken(),
		LeaseID: p.GetLeaseId(),
	}
}

// BlockToProto converts a granted block for the AllocateBlock reply.
func BlockToProto(b segment.Block) *idrangev1.AllocateBlockResponse {
	return &idrangev1.AllocateBlockResponse{
		Lo:                  b.Lo,
		Hi:                  b.Hi,
		ServiceTimeUnixNano: b.ServiceTime.UnixNano(),
		ValidUntilUnixNano:  b.ValidUntil.UnixNano(),
	}
}

// BlockFromProto converts an AllocateBlock reply for code (region, worker).
// Zero time fields stay the zero time.Time. It does not validate.
func BlockFromProto(region, worker int, p *idrangev1.AllocateBlockResponse) segment.Block {
	return segment.Block{
		Region:      region,
		Worker:      worker,
		Lo:          p.GetLo(),
		Hi:          p.GetHi(),
		ServiceTime: unixNano(p.GetServiceTimeUnixNano()),
		ValidUntil:  unixNano(p.GetValidUntilUnixNano()),
	}
}

func unixNano(ns int64) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}
