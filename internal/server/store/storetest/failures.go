package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// testFullRegionAndFencing leases all 256 codes of a region, checks the
// 257th acquire fails retryably without leaking a storage lease, then
// simulates one owner's lease expiring (revoking its lease directly): the
// code goes to a new owner with a bigger token, starting above the old HWM,
// and the old token is refused everything.
func testFullRegionAndFencing(t *testing.T, be Backend) {
	stg := be.Storage(t)
	obs := &Counter{}
	st := NewStore(t, stg, store.Config{Observer: obs, LeaseTTL: 60 * time.Second})
	ctx := Ctx(t)

	byWorker := map[int]segment.Lease{}
	for i := 0; i < 256; i++ {
		l, err := st.Acquire(ctx, 1, "filler")
		if err != nil {
			t.Fatalf("acquire %d: %v", i, err)
		}
		if _, dup := byWorker[l.Worker]; dup {
			t.Fatalf("worker %d handed out twice", l.Worker)
		}
		byWorker[l.Worker] = l
	}
	leasesBefore := be.Leases(t)
	_, err := st.Acquire(ctx, 1, "one too many")
	if !errors.Is(err, segment.ErrNoFreeCode) || !strings.Contains(err.Error(), "region 1") {
		t.Fatalf("257th acquire: %v, want ErrNoFreeCode naming region 1", err)
	}
	if leasesAfter := be.Leases(t); leasesAfter != leasesBefore {
		t.Fatalf("storage leases %d before, %d after the failed acquire: the unused lease leaked", leasesBefore, leasesAfter)
	}
	if free, err := st.FreeCodes(ctx, 1); err != nil || free != 0 {
		t.Fatalf("FreeCodes = %d, %v; want 0", free, err)
	}
	if obs.NAcquireFailed.Load() != 1 {
		t.Fatalf("observer saw %d failed acquisitions, want 1", obs.NAcquireFailed.Load())
	}

	old := byWorker[77]
	b, err := st.Allocate(ctx, old, 4096*500)
	if err != nil {
		t.Fatal(err)
	}
	// Expiry, without waiting for it: the storage deletes the owner entry.
	if err := stg.Revoke(ctx, old.LeaseID); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Allocate(ctx, old, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate on an expired lease: %v, want ErrLeaseLost", err)
	}
	// A second replica (fresh cache) acquires: code 77 is the only free one.
	other := NewStore(t, be.Storage(t), store.Config{LeaseTTL: 60 * time.Second})
	nl, err := other.Acquire(ctx, 1, "new owner")
	if err != nil {
		t.Fatal(err)
	}
	if nl.Worker != 77 || nl.Token <= old.Token {
		t.Fatalf("new owner got worker %d token %d; want worker 77 with a token above %d", nl.Worker, nl.Token, old.Token)
	}
	nb, err := other.Allocate(ctx, nl, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if nb.Lo < b.Hi {
		t.Fatalf("new owner's block starts at %d, below the old owner's Hi %d", nb.Lo, b.Hi)
	}
	// The old token, through either replica, is fenced from everything.
	for _, s := range []*store.Store{st, other} {
		if _, err := s.Allocate(ctx, old, 1); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Allocate: %v, want ErrFenced", err)
		}
		if _, err := s.Renew(ctx, old); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Renew: %v, want ErrFenced", err)
		}
		if err := s.Release(ctx, old); !errors.Is(err, segment.ErrFenced) {
			t.Fatalf("old token Release: %v, want ErrFenced", err)
		}
	}
	// The stale owner knowing the new lease id but not the token gets nothing.
	stale := old
	stale.LeaseID = nl.LeaseID
	if _, err := st.Allocate(ctx, stale, 1); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("old token with new lease id: %v, want ErrFenced", err)
	}
	// Never two live owners: exactly one lease key for code 77, the new one.
	infos, err := st.List(ctx, 1)
	if err != nil || len(infos) != 256 {
		t.Fatalf("List: %d, %v", len(infos), err)
	}
	for _, in := range infos {
		if in.Worker == 77 && (in.Token != nl.Token || in.Owner != "new owner") {
			t.Fatalf("code 77 listed as %+v, want the new owner", in)
		}
	}
	if _, err := other.Renew(ctx, nl); err != nil {
		t.Fatalf("new owner Renew after the stale calls: %v", err)
	}
	if _, err := st.Allocate(ctx, nl, 1); err != nil {
		t.Fatalf("new owner through the other replica: %v", err)
	}
}

// testCorruptValuesStopTheCode writes garbage behind the Store's back.
func testCorruptValuesStopTheCode(t *testing.T, be Backend) {
	obs := &Counter{}
	st := NewStore(t, be.Storage(t), store.Config{Observer: obs})
	ctx := Ctx(t)

	t.Run("hwm", func(t *testing.T) {
		l, err := st.Acquire(ctx, 0, "a")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Allocate(ctx, l, 100); err != nil { // warms the cache
			t.Fatal(err)
		}
		hk := be.HighWaterKey(0, l.Worker)
		for _, garbage := range []string{"v1:-5", "0", "", "v1:12abc"} {
			be.Put(t, hk, []byte(garbage), 0)
			before := obs.NCorrupt.Load()
			_, err := st.Allocate(ctx, l, 100)
			if !errors.Is(err, segment.ErrCorrupt) || !strings.Contains(err.Error(), hk) {
				t.Fatalf("Allocate over HWM %q: %v, want ErrCorrupt naming %s", garbage, err, hk)
			}
			if obs.NCorrupt.Load() == before {
				t.Fatalf("observer not told about corrupt %q", garbage)
			}
			if v, ok := be.Get(t, hk); !ok || string(v) != garbage {
				t.Fatalf("HWM key changed to %q (present %v); the Store must not overwrite it", v, ok)
			}
			if _, err := st.HighWater(ctx, 0, l.Worker); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("HighWater over %q: %v", garbage, err)
			}
		}
	})

	t.Run("lease record", func(t *testing.T) {
		l, err := st.Acquire(ctx, 1, "b")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := st.Allocate(ctx, l, 100); err != nil {
			t.Fatal(err)
		}
		hwm, _ := st.HighWater(ctx, 1, l.Worker)
		lk := be.LeaseKey(1, l.Worker)
		wrongWorker := store.OwnerRecord{Version: 1, Region: 1, Worker: (l.Worker + 1) % 256, LeaseID: l.LeaseID,
			Owner: "b", AcquiredUnixMs: 1}.Encode()
		for _, garbage := range []string{"not json", wrongWorker} {
			// Same lease: the key keeps its CreateRevision (the token).
			be.Put(t, lk, []byte(garbage), l.LeaseID)
			if _, err := st.Allocate(ctx, l, 100); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("Allocate over lease record %q: %v, want ErrCorrupt", garbage, err)
			}
			if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrCorrupt) {
				t.Fatalf("Renew over lease record %q: %v, want ErrCorrupt", garbage, err)
			}
			if got, _ := st.HighWater(ctx, 1, l.Worker); got != hwm {
				t.Fatalf("HWM moved to %d over a corrupt lease record", got)
			}
		}
		infos, err := st.List(ctx, 1)
		if err != nil || len(infos) != 1 || !errors.Is(infos[0].Err, segment.ErrCorrupt) {
			t.Fatalf("List over a corrupt record: %+v, %v", infos, err)
		}
	})

	t.Run("acquire skips corrupt hwm", func(t *testing.T) {
		// Region 2: every code's HWM is corrupt, so nothing may be handed out.
		for w := 0; w < 256; w++ {
			be.Put(t, be.HighWaterKey(2, w), []byte("bogus"), 0)
		}
		_, err := st.Acquire(ctx, 2, "c")
		if !errors.Is(err, segment.ErrNoFreeCode) || !strings.Contains(err.Error(), "corrupt") {
			t.Fatalf("Acquire in a region of corrupt HWMs: %v, want ErrNoFreeCode mentioning corrupt", err)
		}
		if free, err := st.FreeCodes(ctx, 2); err != nil || free != 0 {
			t.Fatalf("FreeCodes = %d, %v; want 0", free, err)
		}
		// Repair one: that code, and only it, is handed out.
		be.Put(t, be.HighWaterKey(2, 9), []byte(store.EncodeHighWater(12345)), 0)
		l, err := st.Acquire(ctx, 2, "c")
		if err != nil || l.Worker != 9 {
			t.Fatalf("Acquire after repair: %+v, %v; want worker 9", l, err)
		}
		b, err := st.Allocate(ctx, l, 1)
		if err != nil || b.Lo < 12345 {
			t.Fatalf("Allocate after repair: %+v, %v", b, err)
		}
	})
}

func testInvalidFields(t *testing.T, be Backend) {
	st := NewStore(t, be.Storage(t), store.Config{})
	ctx := Ctx(t)
	good, err := st.Acquire(ctx, 0, "ok")
	if err != nil {
		t.Fatal(err)
	}
	with := func(f func(*segment.Lease)) segment.Lease { l := good; f(&l); return l }
	leases := []struct {
		field string
		l     segment.Lease
	}{
		{"region", with(func(l *segment.Lease) { l.Region = -1 })},
		{"region", with(func(l *segment.Lease) { l.Region = 4 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = -1 })},
		{"worker", with(func(l *segment.Lease) { l.Worker = 256 })},
		{"token", with(func(l *segment.Lease) { l.Token = 0 })},
		{"token", with(func(l *segment.Lease) { l.Token = -3 })},
		{"token", with(func(l *segment.Lease) { l.Token = 1 << 40 })}, // never issued
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = 0 })},
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = -good.LeaseID })},
		{"lease_id", with(func(l *segment.Lease) { l.LeaseID = good.LeaseID + 1 })}, // right token, wrong lease
	}
	for _, c := range leases {
		if _, err := st.Allocate(ctx, c.l, 10); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Allocate(%s bad: %+v) = %v; want ErrInvalid naming %s", c.field, c.l, err, c.field)
		}
		if _, err := st.Renew(ctx, c.l); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), c.field) {
			t.Errorf("Renew(%s bad) = %v; want ErrInvalid naming %s", c.field, err, c.field)
		}
	}
	for _, n := range []int{0, -1, int(segment.DefaultMaxBlock) + 1} {
		if _, err := st.Allocate(ctx, good, n); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "count") {
			t.Errorf("Allocate(n=%d) = %v; want ErrInvalid naming count", n, err)
		}
	}
	for _, region := range []int{-1, 4} {
		if _, err := st.Acquire(ctx, region, "x"); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "region") {
			t.Errorf("Acquire(region %d) = %v", region, err)
		}
		if _, err := st.FreeCodes(ctx, region); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("FreeCodes(region %d) = %v", region, err)
		}
		if _, err := st.List(ctx, region); !errors.Is(err, segment.ErrInvalid) {
			t.Errorf("List(region %d) = %v", region, err)
		}
	}
	for _, owner := range []string{"bad\nowner", strings.Repeat("x", segment.MaxOwnerLen+1), "\xff"} {
		if _, err := st.Acquire(ctx, 0, owner); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "owner") {
			t.Errorf("Acquire(owner %q) = %v; want ErrInvalid naming owner", owner, err)
		}
	}
	if _, err := st.HighWater(ctx, 0, 256); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), "worker") {
		t.Errorf("HighWater(worker 256) = %v", err)
	}
	// The good lease still works: no invalid call damaged it.
	if _, err := st.Allocate(ctx, good, 10); err != nil {
		t.Fatalf("good lease after invalid calls: %v", err)
	}
}

// lostReply is a Storage whose next high-water commit, once armed, is
// applied and then reported as an error: the "commit unknown" case. With
// lostRequest set the armed commit is not applied at all, and reported as
// the same error: the Store cannot tell the two apart.
type lostReply struct {
	store.Storage
	armed       atomic.Bool
	lostRequest bool
}

var errLost = errors.New("injected: response lost after the commit")

func (x *lostReply) CommitHighWater(ctx context.Context, region, worker int, c store.HighWaterCommit) (int64, bool, store.CodeView, error) {
	if x.lostRequest && x.armed.CompareAndSwap(true, false) {
		return 0, false, store.CodeView{}, errLost
	}
	rev, ok, fresh, err := x.Storage.CommitHighWater(ctx, region, worker, c)
	if err == nil && x.armed.CompareAndSwap(true, false) {
		return 0, false, store.CodeView{}, errLost
	}
	return rev, ok, fresh, err
}

// testUnknownCommit: the grant commits but the Store sees an error.
// Allocate must return ErrUnavailable (keeping the cause) and no block; the
// next grant must start above what the lost commit wrote.
func testUnknownCommit(t *testing.T, be Backend) {
	lost := &lostReply{Storage: be.Storage(t)}
	st := NewStore(t, lost, store.Config{})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, 0, "lossy")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	lost.armed.Store(true)
	b, err := st.Allocate(ctx, l, 4096)
	if !errors.Is(err, segment.ErrUnavailable) || !errors.Is(err, errLost) || b != (segment.Block{}) {
		t.Fatalf("Allocate with a lost reply = %+v, %v; want no block and ErrUnavailable wrapping the cause", b, err)
	}
	burned, err := st.HighWater(ctx, 0, l.Worker)
	if err != nil || burned <= b1.Hi {
		t.Fatalf("HWM %d (%v): the lost commit should have raised it above %d", burned, err, b1.Hi)
	}
	b3, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	if b3.Lo < burned {
		t.Fatalf("grant after the lost commit starts at %d, inside the burned range below %d", b3.Lo, burned)
	}
}

// testBatchOneCompareFails: one group commit of five codes, three of whose
// compares fail (a stale HWM revision, a lease gone, a stale HWM with the
// contention signal asked): the other two commit at one revision, the
// failed ones write nothing but the signal and report the code's fresh
// view, and the Store then carries on per code (the stale one grants, the
// lost lease is refused).
func testBatchOneCompareFails(t *testing.T, be Backend) {
	stg := be.Storage(t)
	bs, ok := stg.(store.BatchStorage)
	if !ok {
		t.Fatalf("storage %T has no group commit (store.BatchStorage), which this case is about; "+
			"a backend without it must not run it", stg)
	}
	st := NewStore(t, stg, store.Config{})
	ctx := Ctx(t)
	const n = 5
	leases := make([]segment.Lease, n)
	his := make([]int64, n)
	for i := range leases {
		l, err := st.Acquire(ctx, 3, fmt.Sprintf("batch-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Allocate(ctx, l, 4096)
		if err != nil {
			t.Fatal(err)
		}
		leases[i], his[i] = l, b.Hi
	}
	ops := make([]store.GrantOp, n)
	for i, l := range leases {
		v, err := stg.Code(ctx, 3, l.Worker)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = store.GrantOp{Region: 3, Worker: l.Worker, Commit: store.HighWaterCommit{
			Value: []byte(store.EncodeHighWater(his[i] + 4096)), Token: l.Token, OwnerRev: v.Owner.ModRevision,
			HighWaterRev: v.HighWater.ModRevision, ContentionRev: v.Contention,
		}}
	}
	// Code 1: another grant moved its HWM. Code 2: its lease is gone.
	// Code 3: HWM moved, and this grant signals contention.
	moved := his[1] + 100
	be.Put(t, be.HighWaterKey(3, leases[1].Worker), []byte(store.EncodeHighWater(moved)), 0)
	if err := stg.Revoke(ctx, leases[2].LeaseID); err != nil {
		t.Fatal(err)
	}
	be.Put(t, be.HighWaterKey(3, leases[3].Worker), []byte(store.EncodeHighWater(his[3]+100)), 0)
	ops[3].Commit.Signal = true

	res, err := bs.CommitHighWaters(ctx, ops)
	if err != nil {
		t.Fatalf("CommitHighWaters: %v", err)
	}
	if len(res) != n {
		t.Fatalf("%d results for %d ops", len(res), n)
	}
	if !res[0].OK || !res[4].OK || res[0].Rev != res[4].Rev || res[0].Rev <= 0 {
		t.Fatalf("results 0 and 4 = %+v, %+v; want both committed at one revision", res[0], res[4])
	}
	for _, i := range []int{1, 2, 3} {
		if res[i].OK {
			t.Fatalf("op %d committed over a failed compare: %+v", i, res[i])
		}
		if res[i].Fresh.Rev < res[0].Rev {
			t.Fatalf("op %d: fresh view at revision %d, before the batch's %d", i, res[i].Fresh.Rev, res[0].Rev)
		}
	}
	if hw := res[1].Fresh.HighWater; hw == nil || string(hw.Value) != store.EncodeHighWater(moved) {
		t.Fatalf("op 1 fresh HWM %+v; want the moved value %d", hw, moved)
	}
	if res[2].Fresh.Owner != nil {
		t.Fatalf("op 2 fresh owner %+v; want none (lease revoked)", res[2].Fresh.Owner)
	}
	if res[3].Fresh.Contention != res[0].Rev {
		t.Fatalf("op 3 contention signal at %d; want written by the batch at %d", res[3].Fresh.Contention, res[0].Rev)
	}
	for i, want := range []int64{his[0] + 4096, moved, his[2], his[3] + 100, his[4] + 4096} {
		if got, err := st.HighWater(ctx, 3, leases[i].Worker); err != nil || got != want {
			t.Fatalf("code %d HWM %d, %v; want %d", i, got, err, want)
		}
	}
	// The Store goes on per code from what the batch left.
	if b, err := st.Allocate(ctx, leases[1], 4096); err != nil || b.Lo < moved {
		t.Fatalf("Allocate on the code whose compare failed: %+v, %v; want a block at or above %d", b, err, moved)
	}
	if _, err := st.Allocate(ctx, leases[2], 4096); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate on the code whose lease is gone: %v, want ErrLeaseLost", err)
	}
}

// testConcurrentCodesNeverOverlap: callers on many codes at once through
// two replicas (so grants are group-committed where the storage can): per
// code every block is disjoint, and the final HWM of each code is its
// highest Hi.
func testConcurrentCodesNeverOverlap(t *testing.T, be Backend) {
	stores := []*store.Store{
		NewStore(t, be.Storage(t), store.Config{}),
		NewStore(t, be.Storage(t), store.Config{}),
	}
	ctx := Ctx(t)
	const codes, perCaller = 24, 10
	leases := make([]segment.Lease, codes)
	for i := range leases {
		l, err := stores[i%2].Acquire(ctx, 2, fmt.Sprintf("code-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	var (
		mu     sync.Mutex
		blocks = make([][]segment.Block, codes)
		wg     sync.WaitGroup
		errs   = make(chan error, 2*codes)
	)
	for i := range 2 * codes { // two callers per code, one per replica
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, st := i%codes, stores[(i/codes)%2]
			for range perCaller {
				b, err := st.Allocate(ctx, leases[c], 1+i*100)
				if err != nil {
					errs <- errors.Newf("code %d: %w", c, err)
					return
				}
				if b.Worker != leases[c].Worker || b.Region != 2 {
					errs <- errors.Newf("code %d: block for code %d/%d", c, b.Region, b.Worker)
					return
				}
				mu.Lock()
				blocks[c] = append(blocks[c], b)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for c, bs := range blocks {
		if len(bs) != 2*perCaller {
			t.Fatalf("code %d: %d blocks, want %d", c, len(bs), 2*perCaller)
		}
		CheckDisjoint(t, bs)
		if hwm, err := stores[0].HighWater(ctx, 2, leases[c].Worker); err != nil || hwm != bs[len(bs)-1].Hi {
			t.Fatalf("code %d: HWM %d, %v; want the highest Hi %d", c, hwm, err, bs[len(bs)-1].Hi)
		}
	}
}
