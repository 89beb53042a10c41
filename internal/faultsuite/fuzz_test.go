package faultsuite

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Bad input, fuzzed. What the other packages already fuzz is not repeated
// here: snowflake has FuzzParse and FuzzComposeDecode, segment has
// FuzzDecodeHighWater, FuzzDecodeOwnerRecord and FuzzPlan, history has
// FuzzParse. These add the paths between them: arbitrary int64s through
// Decode, arbitrary RPC fields through the service's handlers, arbitrary
// replies through the client's allocator, and arbitrary bytes in etcd under
// a live store.Store.

// FuzzDecodeAnyInt64: Decode accepts exactly the positive values, every
// accepted value's fields are in range and compose back to it, and the text
// forms agree with Decode.
func FuzzDecodeAnyInt64(f *testing.F) {
	for _, v := range []int64{0, 1, -1, 1 << 62, -1 << 63, 1<<63 - 1, 4096, 1 << 22} {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, v int64) {
		id := snowflake.ID(v)
		p, err := snowflake.Decode(id)
		if (err == nil) != (v > 0) {
			t.Fatalf("Decode(%d) err = %v", v, err)
		}
		var back snowflake.ID
		terr := back.UnmarshalText([]byte(id.String()))
		if (terr == nil) != (v > 0) || (terr == nil && back != id) {
			t.Fatalf("UnmarshalText(%q) = %d, %v", id.String(), back, terr)
		}
		if err != nil {
			if !errors.Is(err, snowflake.ErrInvalidID) {
				t.Fatalf("Decode(%d) error %v is not ErrInvalidID", v, err)
			}
			return
		}
		if p.Ms < 0 || p.Ms > snowflake.MaxTimestamp || p.Region < 0 || p.Region > snowflake.MaxRegion ||
			p.Worker < 0 || p.Worker > snowflake.MaxWorker || p.Sequence < 0 || p.Sequence > snowflake.MaxSequence {
			t.Fatalf("Decode(%d) = %+v out of range", v, p)
		}
		if c, err := snowflake.Compose(p.Ms, p.Region, p.Worker, p.Sequence); err != nil || c != id {
			t.Fatalf("Compose(Decode(%d)) = %d, %v", v, c, err)
		}
		if (segment.Block{Region: p.Region, Worker: p.Worker}).ID(segment.Linear(id)) != id {
			t.Fatalf("Linear/IDAt of %d do not round-trip", v)
		}
	})
}

// recordingAlloc is a fake segment.Allocator that records what reached it.
type recordingAlloc struct {
	mu    sync.Mutex
	calls []any // segment.Lease, or [2]any{lease, n}, or [2]any{region, owner}
}

func (a *recordingAlloc) record(v any) {
	a.mu.Lock()
	a.calls = append(a.calls, v)
	a.mu.Unlock()
}

func (a *recordingAlloc) take() []any {
	a.mu.Lock()
	defer a.mu.Unlock()
	c := a.calls
	a.calls = nil
	return c
}

func (a *recordingAlloc) Acquire(_ context.Context, region int, owner string) (segment.Lease, error) {
	a.record([2]any{region, owner})
	return segment.Lease{Region: region, Worker: 9, Token: 11, LeaseID: 13, TTL: 4 * time.Second}, nil
}

func (a *recordingAlloc) Renew(_ context.Context, l segment.Lease) (segment.Lease, error) {
	a.record(l)
	l.TTL = 4 * time.Second
	return l, nil
}

func (a *recordingAlloc) Release(_ context.Context, l segment.Lease) error {
	a.record(l)
	return nil
}

func (a *recordingAlloc) Allocate(_ context.Context, l segment.Lease, n int) (segment.Block, error) {
	a.record([2]any{l, n})
	now := time.Unix(1_900_000_000, 0)
	lo := snowflake.MsSince(now) << snowflake.SequenceBits
	return segment.Block{Region: l.Region, Worker: l.Worker, Lo: lo, Hi: lo + int64(n), ServiceTime: now, ValidUntil: now.Add(time.Second)}, nil
}

// FuzzServiceRequestValidation drives the service's public handlers with
// arbitrary field values over a recording fake allocator. A request is
// valid exactly when its fields satisfy the service's documented rules
// (region this replica's, worker 0..255, token > 0, lease_id > 0, count
// 1..MaxBlock, owner segment.ValidateOwner's printable UTF-8 of at most 256
// bytes, lease present); an invalid
// one is InvalidArgument and never reaches the allocator; a valid one
// reaches it with exactly the fields sent.
func FuzzServiceRequestValidation(f *testing.F) {
	const svcRegion, maxBlock = 1, 1000
	alloc := &recordingAlloc{}
	svc, err := service.New(service.Config{Region: svcRegion, Allocator: alloc, MaxBlock: maxBlock})
	if err != nil {
		f.Fatal(err)
	}
	f.Add(uint8(0), uint32(1), uint32(5), int64(7), int64(8), uint32(10), "owner", false)
	f.Add(uint8(1), uint32(1), uint32(255), int64(1), int64(1), uint32(1), "", false)
	f.Add(uint8(2), uint32(1), uint32(256), int64(1), int64(1), uint32(1), "", false)
	f.Add(uint8(3), uint32(1), uint32(0), int64(1), int64(1), uint32(1001), "", false)
	f.Add(uint8(3), uint32(4), uint32(0), int64(-1), int64(0), uint32(0), "", true)
	f.Add(uint8(0), uint32(1), uint32(0), int64(0), int64(0), uint32(0), "\xff", false)
	f.Add(uint8(0), uint32(2), uint32(0), int64(0), int64(0), uint32(0), string(make([]byte, 257)), false)
	f.Fuzz(func(t *testing.T, method uint8, reg, worker uint32, token, leaseID int64, count uint32, owner string, nilLease bool) {
		ctx := context.Background()
		var pl *idrangev1.Lease
		if !nilLease {
			pl = &idrangev1.Lease{Region: reg, Worker: worker, Token: token, LeaseId: leaseID}
		}
		leaseOK := !nilLease && reg == svcRegion && worker <= snowflake.MaxWorker && token > 0 && leaseID > 0
		want := segment.Lease{Region: int(reg), Worker: int(worker), Token: token, LeaseID: leaseID}
		var (
			valid bool
			reply proto.Message
			rerr  error
			sent  any
		)
		switch method % 4 {
		case 0:
			valid = reg == svcRegion && segment.ValidateOwner(owner) == nil
			sent = [2]any{int(reg), owner}
			reply, rerr = svc.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: reg, Owner: owner})
		case 1:
			valid, sent = leaseOK, want
			reply, rerr = svc.RenewLease(ctx, &idrangev1.RenewLeaseRequest{Lease: pl})
		case 2:
			valid, sent = leaseOK, want
			reply, rerr = svc.ReleaseLease(ctx, &idrangev1.ReleaseLeaseRequest{Lease: pl})
		case 3:
			valid = leaseOK && count >= 1 && count <= maxBlock
			sent = [2]any{want, int(count)}
			reply, rerr = svc.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: pl, Count: count})
		}
		calls := alloc.take()
		if !valid {
			if status.Code(rerr) != codes.InvalidArgument {
				t.Fatalf("method %d: invalid request answered %v (code %v)", method%4, rerr, status.Code(rerr))
			}
			if len(calls) != 0 {
				t.Fatalf("method %d: invalid request reached the allocator: %v", method%4, calls)
			}
			return
		}
		if rerr != nil {
			t.Fatalf("method %d: valid request refused: %v", method%4, rerr)
		}
		if len(calls) != 1 || calls[0] != sent {
			t.Fatalf("method %d: allocator got %v, want %v", method%4, calls, sent)
		}
		if b, ok := reply.(*idrangev1.AllocateBlockResponse); ok && b.GetHi()-b.GetLo() != int64(count) {
			t.Fatalf("reply [%d,%d) is not the allocator's block of %d", b.GetLo(), b.GetHi(), count)
		}
	})
}

// replyConn is a grpc.ClientConnInterface whose AllocateBlock replies are
// whatever the fuzzer says: a malformed or hostile range service.
type replyConn struct {
	reply *idrangev1.AllocateBlockResponse
}

func (c replyConn) Invoke(_ context.Context, _ string, _, reply any, _ ...grpc.CallOption) error {
	proto.Merge(reply.(proto.Message), c.reply)
	return nil
}

func (replyConn) NewStream(context.Context, *grpc.StreamDesc, string, ...grpc.CallOption) (grpc.ClientStream, error) {
	return nil, status.Error(codes.Unimplemented, "no streams")
}

// FuzzAllocatorRejectsBadReplies: whatever a service answers to
// AllocateBlock, the client's allocator either refuses it or returns a
// block a correct service could have granted: non-empty, starting at L 1 or
// later, not past the end of the epoch, not wider than asked, served after
// the epoch and valid for some time after that. A block outside those rules could overlap
// another one; it must never reach the minting path.
func FuzzAllocatorRejectsBadReplies(f *testing.F) {
	t0 := snowflake.Epoch.UnixNano()
	f.Add(int64(4096), int64(8192), t0+1, t0+2, uint32(4096)) // a good reply
	f.Add(int64(4096), int64(8192), int64(1), int64(2), uint32(4096))
	f.Add(int64(-1), int64(10), int64(1), int64(2), uint32(100))
	f.Add(int64(10), int64(10), int64(1), int64(2), uint32(100))
	f.Add(int64(0), int64(1)<<62, int64(1), int64(2), uint32(1<<31))
	f.Add(int64(5), int64(10), int64(3), int64(2), uint32(100))
	f.Add(int64(5), int64(10), int64(0), int64(0), uint32(100))
	f.Fuzz(func(t *testing.T, lo, hi, svcNs, validNs int64, n uint32) {
		a := wire.NewAllocator(replyConn{reply: &idrangev1.AllocateBlockResponse{
			Lo: lo, Hi: hi, ServiceTimeUnixNano: svcNs, ValidUntilUnixNano: validNs}})
		l := segment.Lease{Region: 1, Worker: 2, Token: 3, LeaseID: 4}
		b, err := a.Allocate(context.Background(), l, int(n))
		if err != nil {
			return
		}
		switch {
		case n == 0:
			t.Fatal("a zero-count request was sent")
		case b.Lo < 1 || b.Hi <= b.Lo || b.Hi > segment.EndL || b.Hi-b.Lo > int64(n):
			t.Fatalf("accepted block [%d,%d) for %d IDs", b.Lo, b.Hi, n)
		case b.ServiceTime.Before(snowflake.Epoch) || !b.ValidUntil.After(b.ServiceTime):
			t.Fatalf("accepted validity %v..%v", b.ServiceTime, b.ValidUntil)
		case b.Region != l.Region || b.Worker != l.Worker:
			t.Fatalf("accepted block for code %d/%d on lease %d/%d", b.Region, b.Worker, l.Region, l.Worker)
		}
	})
}

// FuzzStoreCorruptValues writes arbitrary bytes into the high-water mark
// and then into the lease record of a code leased through a live
// store.Store (embedded etcd). A value that does not decode must stop the
// code with ErrCorrupt and be left exactly as it was (never reset, never
// overwritten), and so must a high-water mark that decodes but is below the
// one the Store committed (ErrHighWaterRegressed: the mark went back); one
// at or above it must be honoured (a grant starts at or above it).
func FuzzStoreCorruptValues(f *testing.F) {
	for _, s := range []string{"v1:0", "v1:4096", "v1:-1", "v1:01", "v1:", "", "garbage", "v1:99999999999999999999",
		`{"v":1}`, "v1:4096\n", "v2:4096"} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Add([]byte(`{"v":1,"region":1,"worker":0,"lease_id":1,"owner":"x","acquired_unix_ms":1}`), true)
	srv := embedetcdtest.Start(f)
	cli := embedetcdtest.Client(f, srv)
	stg, err := etcdstore.New(cli, etcdstore.Config{})
	if err != nil {
		f.Fatal(err)
	}
	st, err := store.New(stg, store.Config{LeaseTTL: 10 * time.Second})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, value []byte, leaseRecord bool) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		l, err := st.Acquire(ctx, region, "fuzz")
		if err != nil {
			t.Fatal(err)
		}
		defer st.Release(ctx, l) //nolint:errcheck // a corrupt record may refuse; the TTL ends it
		key := stg.HighWaterKey(region, l.Worker)
		opts := []clientv3.OpOption{}
		if leaseRecord {
			key = stg.LeaseKey(region, l.Worker)
			opts = append(opts, clientv3.WithIgnoreLease())
		} else if _, err := st.Allocate(ctx, l, 4096); err != nil { // give the code a real HWM first
			t.Fatal(err)
		}
		orig, err := cli.Get(ctx, key)
		if err != nil || len(orig.Kvs) != 1 {
			t.Fatalf("read %s: %v", key, err)
		}
		put, err := cli.Put(ctx, key, string(value), opts...)
		if err != nil {
			t.Fatal(err)
		}
		var decodes, regressed bool
		var hwm int64
		if leaseRecord {
			rec, err := store.DecodeOwnerRecord(value)
			decodes = err == nil && rec.Region == region && rec.Worker == l.Worker && rec.LeaseID == l.LeaseID
		} else {
			hwm, err = store.DecodeHighWater(value)
			decodes = err == nil
			committed, cerr := store.DecodeHighWater(orig.Kvs[0].Value)
			if cerr != nil {
				t.Fatal(cerr)
			}
			regressed = decodes && hwm < committed
		}
		// Restore the original so the code is usable again (a long fuzz run
		// must not use up the region's codes); a mark that was raised stays
		// (putting the original back would lower it, and the Store would
		// rightly refuse the code from then on).
		if !decodes || regressed || leaseRecord {
			defer func() {
				if _, err := cli.Put(ctx, key, string(orig.Kvs[0].Value), opts...); err != nil {
					t.Error(err)
				}
			}()
		}
		b, aerr := st.Allocate(ctx, l, 4096)
		_, rerr := st.Renew(ctx, l)
		if regressed && !errors.Is(aerr, segment.ErrHighWaterRegressed) {
			t.Fatalf("Allocate over %q, below the committed mark: %v, want ErrHighWaterRegressed", value, aerr)
		}
		if !decodes || regressed {
			if !errors.Is(aerr, segment.ErrCorrupt) && !errors.Is(aerr, segment.ErrInvalid) {
				t.Fatalf("Allocate over %q: %v, want ErrCorrupt", value, aerr)
			}
			if leaseRecord && !errors.Is(rerr, segment.ErrCorrupt) && !errors.Is(rerr, segment.ErrInvalid) {
				t.Fatalf("Renew over lease record %q: %v, want ErrCorrupt", value, rerr)
			}
			got, err := cli.Get(ctx, key)
			if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != string(value) || got.Kvs[0].ModRevision != put.Header.Revision {
				t.Fatalf("corrupt value %q was rewritten: %v %v", value, got.Kvs, err)
			}
			return
		}
		if aerr != nil && !errors.Is(aerr, segment.ErrBackpressure) && !errors.Is(aerr, segment.ErrEpochExhausted) {
			t.Fatalf("Allocate over valid %q: %v", value, aerr)
		}
		if aerr == nil && b.Lo < hwm {
			t.Fatalf("block [%d,%d) starts below the stored HWM %d", b.Lo, b.Hi, hwm)
		}
	})
}
