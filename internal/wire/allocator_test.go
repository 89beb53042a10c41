package wire

import (
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/grpctest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// fakeAlloc is an in-memory Allocator: one region, codes handed out in
// order, a per-code HWM, and an error to inject.
type fakeAlloc struct {
	mu     sync.Mutex
	next   int
	token  int64
	hwm    map[int]int64
	fail   error
	now    time.Time
	tokens map[int]int64
}

func newFake() *fakeAlloc {
	return &fakeAlloc{hwm: map[int]int64{}, tokens: map[int]int64{}, now: time.Unix(1_800_000_000, 123456789)}
}

func (f *fakeAlloc) Acquire(_ context.Context, region int, _ string) (segment.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return segment.Lease{}, f.fail
	}
	f.token += 10
	w := f.next
	f.next++
	f.tokens[w] = f.token
	return segment.Lease{Region: region, Worker: w, Token: f.token, LeaseID: 1000 + f.token, TTL: 3 * time.Second}, nil
}

func (f *fakeAlloc) Renew(_ context.Context, l segment.Lease) (segment.Lease, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return segment.Lease{}, f.fail
	}
	if f.tokens[l.Worker] != l.Token {
		return segment.Lease{}, fmt.Errorf("token %d: %w", l.Token, segment.ErrFenced)
	}
	l.TTL = 2500 * time.Millisecond
	return l, nil
}

func (f *fakeAlloc) Release(_ context.Context, l segment.Lease) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return f.fail
	}
	if f.tokens[l.Worker] != l.Token {
		return fmt.Errorf("token %d: %w", l.Token, segment.ErrFenced)
	}
	delete(f.tokens, l.Worker)
	return nil
}

func (f *fakeAlloc) Allocate(_ context.Context, l segment.Lease, n int) (segment.Block, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fail != nil {
		return segment.Block{}, f.fail
	}
	if f.tokens[l.Worker] != l.Token {
		return segment.Block{}, fmt.Errorf("worker %d token %d: %w", l.Worker, l.Token, segment.ErrFenced)
	}
	lo := max(f.hwm[l.Worker], 1) // L 0 is never granted (segment.Block.Check)
	f.hwm[l.Worker] = lo + int64(n)
	return segment.Block{Region: l.Region, Worker: l.Worker, Lo: lo, Hi: lo + int64(n),
		ServiceTime: f.now, ValidUntil: f.now.Add(time.Second)}, nil
}

// relay is a minimal RangeService over an Allocator, enough to exercise the
// adapter; internal/server/service is the real one (with validation).
type relay struct {
	idrangev1.UnimplementedRangeServiceServer
	a segment.Allocator
	// reply, if set, replaces AllocateBlock's answer (malformed replies).
	reply *idrangev1.AllocateBlockResponse
	// info, if set, is GetReplicaInfo's answer; nil leaves the RPC
	// Unimplemented, like a replica that predates it.
	info *idrangev1.GetReplicaInfoResponse
}

func (r *relay) GetReplicaInfo(ctx context.Context, req *idrangev1.GetReplicaInfoRequest) (*idrangev1.GetReplicaInfoResponse, error) {
	if r.info == nil {
		return r.UnimplementedRangeServiceServer.GetReplicaInfo(ctx, req)
	}
	return r.info, nil
}

func (r *relay) AcquireLease(ctx context.Context, req *idrangev1.AcquireLeaseRequest) (*idrangev1.AcquireLeaseResponse, error) {
	l, err := r.a.Acquire(ctx, int(req.GetRegion()), req.GetOwner())
	if err != nil {
		return nil, ToStatus(err)
	}
	return &idrangev1.AcquireLeaseResponse{Lease: LeaseToProto(l), TtlMs: l.TTL.Milliseconds()}, nil
}

func (r *relay) RenewLease(ctx context.Context, req *idrangev1.RenewLeaseRequest) (*idrangev1.RenewLeaseResponse, error) {
	l, err := r.a.Renew(ctx, LeaseFromProto(req.GetLease()))
	if err != nil {
		return nil, ToStatus(err)
	}
	return &idrangev1.RenewLeaseResponse{TtlMs: l.TTL.Milliseconds()}, nil
}

func (r *relay) ReleaseLease(ctx context.Context, req *idrangev1.ReleaseLeaseRequest) (*idrangev1.ReleaseLeaseResponse, error) {
	if err := r.a.Release(ctx, LeaseFromProto(req.GetLease())); err != nil {
		return nil, ToStatus(err)
	}
	return &idrangev1.ReleaseLeaseResponse{}, nil
}

func (r *relay) AllocateBlock(ctx context.Context, req *idrangev1.AllocateBlockRequest) (*idrangev1.AllocateBlockResponse, error) {
	if r.reply != nil {
		return r.reply, nil
	}
	b, err := r.a.Allocate(ctx, LeaseFromProto(req.GetLease()), int(req.GetCount()))
	if err != nil {
		return nil, ToStatus(err)
	}
	return BlockToProto(b), nil
}

// sharedRelay answers AllocateShared with a fixed reply (and counts calls).
type sharedRelay struct {
	relay
	shared *idrangev1.AllocateSharedResponse
	calls  int
}

func (r *sharedRelay) AllocateShared(ctx context.Context, req *idrangev1.AllocateSharedRequest) (*idrangev1.AllocateSharedResponse, error) {
	r.calls++
	return r.shared, nil
}

// AllocateShared checks its request before sending it (nothing is sent for
// a bad one: ErrInvalid) and the reply before returning it: a run that is
// not in the region asked, wider than asked, or not after after_id is
// ErrProtocol, never minted from.
func TestAllocateSharedChecks(t *testing.T) {
	ctx := context.Background()
	now := time.Now()
	good := func() *idrangev1.AllocateSharedResponse {
		return &idrangev1.AllocateSharedResponse{Region: 1, Worker: 9, Lo: 1000 << 12, Hi: 1000<<12 + 50,
			ServiceTimeUnixNano: now.UnixNano(), ValidUntilUnixNano: now.Add(time.Second).UnixNano()}
	}
	r := &sharedRelay{relay: relay{a: newFake()}, shared: good()}
	cc := grpctest.Dial(t, func(s grpc.ServiceRegistrar) { idrangev1.RegisterRangeServiceServer(s, r) })
	a := NewAllocator(cc).(segment.SharedAllocator)

	b, err := a.AllocateShared(ctx, 1, 50, 0, "c")
	if err != nil || b.Region != 1 || b.Worker != 9 || b.Len() != 50 {
		t.Fatalf("good run: %+v, %v", b, err)
	}
	for _, bad := range []struct {
		region, n int
		after     snowflake.ID
		client    string
	}{{4, 10, 0, "c"}, {1, 0, 0, "c"}, {1, segment.MaxShared + 1, 0, "c"}, {1, 10, -1, "c"},
		{1, 10, 0, string(make([]byte, segment.MaxClientID+1))}} {
		calls := r.calls
		if _, err := a.AllocateShared(ctx, bad.region, bad.n, bad.after, bad.client); !errors.Is(err, segment.ErrInvalid) || r.calls != calls {
			t.Fatalf("AllocateShared(%d, %d, %d, %d bytes): %v (calls %d -> %d), want ErrInvalid before sending",
				bad.region, bad.n, bad.after, len(bad.client), err, calls, r.calls)
		}
	}
	for name, edit := range map[string]func(*idrangev1.AllocateSharedResponse){
		"other region":   func(p *idrangev1.AllocateSharedResponse) { p.Region = 2 },
		"worker 256":     func(p *idrangev1.AllocateSharedResponse) { p.Worker = 256 },
		"wider":          func(p *idrangev1.AllocateSharedResponse) { p.Hi = p.Lo + 51 },
		"empty":          func(p *idrangev1.AllocateSharedResponse) { p.Hi = p.Lo },
		"no validity":    func(p *idrangev1.AllocateSharedResponse) { p.ValidUntilUnixNano = 0 },
		"not after":      func(p *idrangev1.AllocateSharedResponse) { p.Lo, p.Hi = 999<<12, 999<<12+50 },
		"huge worker id": func(p *idrangev1.AllocateSharedResponse) { p.Worker = 1 << 31 },
	} {
		r.shared = good()
		edit(r.shared)
		after := snowflake.ID(1000<<22 - 1) // the last ID of ms 999
		if _, err := a.AllocateShared(ctx, 1, 50, after, "c"); !errors.Is(err, ErrProtocol) || errors.Is(err, segment.ErrInvalid) {
			t.Fatalf("%s: %v, want ErrProtocol only", name, err)
		}
	}
}

func dialRelay(t *testing.T, r *relay) segment.Allocator {
	t.Helper()
	cc := grpctest.Dial(t, func(s grpc.ServiceRegistrar) { idrangev1.RegisterRangeServiceServer(s, r) })
	return NewAllocator(cc)
}

func TestAllocatorRoundTrip(t *testing.T) {
	ctx := context.Background()
	f := newFake()
	a := dialRelay(t, &relay{a: f})

	l, err := a.Acquire(ctx, 2, "test")
	if err != nil {
		t.Fatal(err)
	}
	want := segment.Lease{Region: 2, Worker: 0, Token: 10, LeaseID: 1010, TTL: 3 * time.Second}
	if l != want {
		t.Fatalf("lease = %+v, want %+v", l, want)
	}
	l2, err := a.Renew(ctx, l)
	if err != nil {
		t.Fatal(err)
	}
	if l2.TTL != 2500*time.Millisecond || l2.Token != l.Token || l2.Worker != l.Worker {
		t.Fatalf("renewed lease = %+v", l2)
	}
	b1, err := a.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	b2, err := a.Allocate(ctx, l, 100)
	if err != nil {
		t.Fatal(err)
	}
	if b1.Region != 2 || b1.Worker != 0 || b1.Lo != 1 || b1.Hi != 4097 || b2.Lo != 4097 || b2.Hi != 4197 {
		t.Fatalf("blocks = %+v %+v", b1, b2)
	}
	if !b1.ServiceTime.Equal(f.now) || !b1.ValidUntil.Equal(f.now.Add(time.Second)) {
		t.Fatalf("times = %v %v, want %v and +1s (nanosecond precision)", b1.ServiceTime, b1.ValidUntil, f.now)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatal(err)
	}

	// After release the old token is fenced, and errors.Is sees it on the client.
	_, err = a.Allocate(ctx, l, 10)
	if !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("Allocate after release: %v, want ErrFenced", err)
	}
	if err.Error() != "worker 0 token 10: "+segment.ErrFenced.Error() {
		t.Fatalf("server message not preserved: %q", err.Error())
	}

	f.mu.Lock()
	f.fail = fmt.Errorf("code 1: %w", &segment.Backpressure{RetryAfter: 40 * time.Millisecond})
	f.mu.Unlock()
	l3 := segment.Lease{Region: 2, Worker: 1, Token: 5, LeaseID: 9}
	_, err = a.Allocate(ctx, l3, 10)
	var bp *segment.Backpressure
	if !errors.As(err, &bp) || bp.RetryAfter != 40*time.Millisecond {
		t.Fatalf("Allocate under backpressure: %v (%+v)", err, bp)
	}
	f.mu.Lock()
	f.fail = fmt.Errorf("region 2: 256 of 256 leased: %w", segment.ErrNoFreeCode)
	f.mu.Unlock()
	if _, err := a.Acquire(ctx, 2, "x"); !errors.Is(err, segment.ErrNoFreeCode) {
		t.Fatalf("Acquire: %v, want ErrNoFreeCode", err)
	}
}

func TestAllocatorRejectsBadRequests(t *testing.T) {
	ctx := context.Background()
	a := dialRelay(t, &relay{a: newFake()})
	good := segment.Lease{Region: 1, Worker: 3, Token: 7, LeaseID: 8}
	bad := []struct {
		name string
		call func() error
	}{
		{"acquire region -1", func() error { _, err := a.Acquire(ctx, -1, ""); return err }},
		{"acquire region 4", func() error { _, err := a.Acquire(ctx, 4, ""); return err }},
		{"worker -1", func() error { l := good; l.Worker = -1; _, err := a.Allocate(ctx, l, 1); return err }},
		{"worker 256", func() error { l := good; l.Worker = 256; return a.Release(ctx, l) }},
		{"token 0", func() error { l := good; l.Token = 0; _, err := a.Renew(ctx, l); return err }},
		{"lease id 0", func() error { l := good; l.LeaseID = 0; _, err := a.Renew(ctx, l); return err }},
		{"count 0", func() error { _, err := a.Allocate(ctx, good, 0); return err }},
		{"count -5", func() error { _, err := a.Allocate(ctx, good, -5); return err }},
		{"count > uint32", func() error { _, err := a.Allocate(ctx, good, 1<<33); return err }},
	}
	for _, tc := range bad {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.call(); !errors.Is(err, segment.ErrInvalid) {
				t.Fatalf("err = %v, want ErrInvalid", err)
			}
		})
	}
}

func TestAllocatorRejectsMalformedReplies(t *testing.T) {
	ctx := context.Background()
	now := time.Now().UnixNano()
	later := now + int64(time.Second) // a validity that breaks no rule
	cases := []struct {
		name  string
		reply *idrangev1.AllocateBlockResponse
	}{
		{"empty", &idrangev1.AllocateBlockResponse{Lo: 10, Hi: 10, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"reversed", &idrangev1.AllocateBlockResponse{Lo: 10, Hi: 5, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"negative", &idrangev1.AllocateBlockResponse{Lo: -5, Hi: 5, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"wider than asked", &idrangev1.AllocateBlockResponse{Lo: 1, Hi: 102, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"past epoch", &idrangev1.AllocateBlockResponse{Lo: segment.EndL - 1, Hi: segment.EndL + 1, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"lo zero", &idrangev1.AllocateBlockResponse{Lo: 0, Hi: 10, ServiceTimeUnixNano: now, ValidUntilUnixNano: later}},
		{"valid at grant", &idrangev1.AllocateBlockResponse{Lo: 1, Hi: 10, ServiceTimeUnixNano: now, ValidUntilUnixNano: now}},
		{"served before the epoch", &idrangev1.AllocateBlockResponse{Lo: 1, Hi: 10, ServiceTimeUnixNano: 1, ValidUntilUnixNano: later}},
		{"no times", &idrangev1.AllocateBlockResponse{Lo: 1, Hi: 10}},
		{"valid before grant", &idrangev1.AllocateBlockResponse{Lo: 1, Hi: 10, ServiceTimeUnixNano: now, ValidUntilUnixNano: now - 1}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := dialRelay(t, &relay{a: newFake(), reply: tc.reply})
			_, err := a.Allocate(ctx, segment.Lease{Region: 0, Worker: 1, Token: 2, LeaseID: 3}, 100)
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("err = %v, want ErrProtocol", err)
			}
			if errors.Is(err, segment.ErrInvalid) {
				t.Fatalf("err = %v: a bad reply must not read as the caller's invalid request", err)
			}
		})
	}
}

func TestAllocatorUnreachableIsUnavailable(t *testing.T) {
	lis := bufconn.Listen(1 << 10)
	lis.Close() // every dial fails
	cc, err := grpc.NewClient("passthrough:///bufnet",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, err = NewAllocator(cc).Acquire(ctx, 0, "x")
	if !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("err = %v, want ErrUnavailable", err)
	}
	_, err = NewAllocator(cc).(RegionReporter).ReplicaRegion(ctx)
	if !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("ReplicaRegion: err = %v, want ErrUnavailable", err)
	}
}

// ReplicaRegion returns the replica's region, rejects one outside 0..3 as
// ErrProtocol (never as the caller's ErrInvalid), and leaves a replica
// without the RPC recognisable by its Unimplemented code.
func TestReplicaRegion(t *testing.T) {
	ctx := context.Background()
	for _, region := range []uint32{0, 1, 2, 3} {
		a := dialRelay(t, &relay{a: newFake(), info: &idrangev1.GetReplicaInfoResponse{Region: region}})
		got, err := a.(RegionReporter).ReplicaRegion(ctx)
		if err != nil || got != int(region) {
			t.Fatalf("ReplicaRegion = %d, %v; want %d", got, err, region)
		}
	}
	for _, region := range []uint32{4, 1 << 31, math.MaxUint32} {
		a := dialRelay(t, &relay{a: newFake(), info: &idrangev1.GetReplicaInfoResponse{Region: region}})
		got, err := a.(RegionReporter).ReplicaRegion(ctx)
		if !errors.Is(err, ErrProtocol) || errors.Is(err, segment.ErrInvalid) {
			t.Fatalf("reply region %d: ReplicaRegion = %d, %v; want ErrProtocol only", region, got, err)
		}
		if !strings.Contains(err.Error(), fmt.Sprint(region)) {
			t.Errorf("message %q does not name the region %d", err, region)
		}
	}
	a := dialRelay(t, &relay{a: newFake()})
	_, err := a.(RegionReporter).ReplicaRegion(ctx)
	if status.Code(err) != codes.Unimplemented || errors.Is(err, ErrProtocol) || errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("replica without GetReplicaInfo: %v (code %v), want Unimplemented", err, status.Code(err))
	}
}
