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

// MaxLinear is the end (exclusive) of every code's linear space:
// (snowflake.MaxTimestamp+1)<<12. No block may reach past it.
const MaxLinear = segment.EndL

// NewAllocator returns a segment.Allocator that calls the RangeService over
// cc. Requests are checked before they are sent (a negative worker must not
// wrap into a valid uint32), replies are checked before they are returned (a
// block is never wider than asked, never empty, never past MaxLinear), and
// errors are mapped with FromStatus so errors.Is(err, segment.ErrFenced)
// works on the client.
func NewAllocator(cc grpc.ClientConnInterface) segment.Allocator {
	return &allocator{c: idrangev1.NewRangeServiceClient(cc)}
}

type allocator struct {
	c idrangev1.RangeServiceClient
}

func (a *allocator) Acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	if region < 0 || region > snowflake.MaxRegion {
		return segment.Lease{}, fmt.Errorf("region %d not in 0..%d: %w", region, snowflake.MaxRegion, segment.ErrInvalid)
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
	if err := checkLease(l, ErrProtocol); err != nil {
		return segment.Lease{}, fmt.Errorf("AcquireLease reply: %w", err)
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
	if err := checkBlock(b, n); err != nil {
		return segment.Block{}, err
	}
	return b, nil
}

// leaseRequest checks l's fields and converts it for a request.
func leaseRequest(l segment.Lease) (*idrangev1.Lease, error) {
	if err := checkLease(l, segment.ErrInvalid); err != nil {
		return nil, err
	}
	return LeaseToProto(l), nil
}

// checkLease reports the first out-of-range field of l, wrapping sentinel
// (ErrInvalid for a caller's request, ErrProtocol for a server's reply).
func checkLease(l segment.Lease, sentinel error) error {
	switch {
	case l.Region < 0 || l.Region > snowflake.MaxRegion:
		return fmt.Errorf("lease region %d not in 0..%d: %w", l.Region, snowflake.MaxRegion, sentinel)
	case l.Worker < 0 || l.Worker > snowflake.MaxWorker:
		return fmt.Errorf("lease worker %d not in 0..%d: %w", l.Worker, snowflake.MaxWorker, sentinel)
	case l.Token <= 0:
		return fmt.Errorf("lease token %d not > 0: %w", l.Token, sentinel)
	case l.LeaseID <= 0:
		return fmt.Errorf("lease_id %d not > 0: %w", l.LeaseID, sentinel)
	}
	return nil
}

// checkBlock refuses a reply a correct service cannot send. Using such a
// block could overlap another one, so it is dropped (a gap), never trusted.
func checkBlock(b segment.Block, asked int) error {
	switch {
	case b.Lo < 0:
		return fmt.Errorf("AllocateBlock reply: lo %d < 0: %w", b.Lo, ErrProtocol)
	case b.Hi <= b.Lo:
		return fmt.Errorf("AllocateBlock reply: hi %d <= lo %d: %w", b.Hi, b.Lo, ErrProtocol)
	case b.Hi > MaxLinear:
		return fmt.Errorf("AllocateBlock reply: hi %d past the end of the epoch %d: %w", b.Hi, MaxLinear, ErrProtocol)
	case b.Hi-b.Lo > int64(asked):
		return fmt.Errorf("AllocateBlock reply: %d IDs, more than the %d asked: %w", b.Hi-b.Lo, asked, ErrProtocol)
	case b.ServiceTime.IsZero() || b.ValidUntil.IsZero():
		return fmt.Errorf("AllocateBlock reply: service time or validity missing: %w", ErrProtocol)
	case b.ValidUntil.Before(b.ServiceTime):
		return fmt.Errorf("AllocateBlock reply: valid until %v before service time %v: %w", b.ValidUntil, b.ServiceTime, ErrProtocol)
	}
	return nil
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
