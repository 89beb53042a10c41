// Package segmenttest is the conformance suite of segment.Storage
// implementations: the grant rule, fencing, leases and corrupt values,
// checked through one segment.Store over the storage under test. etcdstore
// and memstore both run it, so the in-memory fake and production follow the
// same rules by construction and by test.
package segmenttest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Backend is one store under test, fresh for each test.
type Backend interface {
	// Storage returns a new handle on the backend's data: with etcd a new
	// client, so two handles behave like two service replicas.
	Storage(t testing.TB) segment.Storage
	// Put writes value under key (attached to lease, 0: none), bypassing
	// the Store: how tests write garbage behind its back.
	Put(t testing.TB, key string, value []byte, lease int64)
	// Delete deletes the value under key, bypassing the Store (as etcdctl
	// del would).
	Delete(t testing.TB, key string)
	// Get reads the value under key (ok false: absent).
	Get(t testing.TB, key string) (value []byte, ok bool)
	// LeaseKey and HighWaterKey name a code's owner and high-water entries.
	LeaseKey(region, worker int) string
	HighWaterKey(region, worker int) string
	// Leases is the number of live storage leases.
	Leases(t testing.TB) int
}

// TestTTL is the lease TTL tests ask for unless they test expiry: long
// enough that a slow run never loses a lease by accident.
const TestTTL = 60 * time.Second

// NewStore returns a Store over stg with cfg (LeaseTTL TestTTL if unset).
func NewStore(t testing.TB, stg segment.Storage, cfg segment.StoreConfig) *segment.Store {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = TestTTL
	}
	st, err := segment.NewStore(stg, cfg)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return st
}

// Ctx is a context for one test, cancelled at its end.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Counter is an Observer that counts events, to check that the hooks fire.
type Counter struct {
	segment.NopObserver
	NGranted, NGrantFailed, NConflicts, NAcquired, NAcquireFailed, NRenewed, NReleased, NCorrupt atomic.Int64
	NRegressed, NRecovered                                                                       atomic.Int64
	Size                                                                                         atomic.Int64
}

func (c *Counter) Granted(_, _ int, size int64, _ time.Duration) { c.NGranted.Add(1); c.Size.Add(size) }
func (c *Counter) GrantFailed(int, int, error, time.Duration)    { c.NGrantFailed.Add(1) }
func (c *Counter) Conflict(int, int)                             { c.NConflicts.Add(1) }
func (c *Counter) Acquired(int, int)                             { c.NAcquired.Add(1) }
func (c *Counter) AcquireFailed(int, error)                      { c.NAcquireFailed.Add(1) }
func (c *Counter) Renewed(_, _ int, err error) {
	if err == nil {
		c.NRenewed.Add(1)
	}
}
func (c *Counter) Released(int, int, error)                  { c.NReleased.Add(1) }
func (c *Counter) Corrupt(string, error)                     { c.NCorrupt.Add(1) }
func (c *Counter) HighWaterRegressed(int, int, int64, int64) { c.NRegressed.Add(1) }
func (c *Counter) HighWaterRecovered(int, int)               { c.NRecovered.Add(1) }

// CheckDisjoint sorts blocks and fails on any overlap.
func CheckDisjoint(t testing.TB, blocks []segment.Block) {
	t.Helper()
	slices.SortFunc(blocks, func(a, b segment.Block) int { return int(a.Lo - b.Lo) })
	for i := 1; i < len(blocks); i++ {
		if blocks[i].Lo < blocks[i-1].Hi {
			t.Fatalf("blocks overlap: [%d,%d) and [%d,%d)", blocks[i-1].Lo, blocks[i-1].Hi, blocks[i].Lo, blocks[i].Hi)
		}
	}
}

// Run runs the suite; open returns a fresh, empty backend for one test.
// Tests run in parallel.
func Run(t *testing.T, open func(t *testing.T) Backend) {
	tests := []struct {
		name string
		f    func(*testing.T, Backend)
	}{
		{"GrantRule", testGrantRule},
		{"Lifecycle", testLifecycle},
		{"ConcurrentReplicasNeverOverlap", testConcurrentReplicasNeverOverlap},
		{"ConcurrentAcquireDistinctCodes", testConcurrentAcquireDistinctCodes},
		{"ClockBackStillAboveHWM", testClockBackStillAboveHWM},
		{"FullRegionAndFencing", testFullRegionAndFencing},
		{"CorruptValuesStopTheCode", testCorruptValuesStopTheCode},
		{"InvalidFields", testInvalidFields},
		{"UnknownCommitNeverReturnsTheBlock", testUnknownCommit},
		{"BatchOneCompareFailsOthersCommit", testBatchOneCompareFails},
		{"ConcurrentCodesNeverOverlap", testConcurrentCodesNeverOverlap},
		{"SnapshotAndFence", testSnapshotAndFence},
		{"IdentityBindsTheLease", testIdentityBinding},
		{"IdentityCap", testIdentityCap},
		{"IdentityCapUnderConcurrency", testIdentityCapConcurrent},
		{"HighWaterRegressedStopsTheCode", testHighWaterRegressed},
		{"FailedCommitDoesNotRaiseTheFloor", testFailedCommitFloor},
		{"ConcurrentReadsNoFalseRegression", testNoFalseRegression},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each test has its own store
			tc.f(t, open(t))
		})
	}
}

// RunGroupCommit runs only the group-commit cases, on one backend, one
// after the other: for a store shared with other users (an external etcd
// under a fresh prefix), where the whole suite's lease counts would not
// hold.
func RunGroupCommit(t *testing.T, be Backend) {
	t.Run("BatchOneCompareFailsOthersCommit", func(t *testing.T) { testBatchOneCompareFails(t, be) })
	t.Run("ConcurrentCodesNeverOverlap", func(t *testing.T) { testConcurrentCodesNeverOverlap(t, be) })
}

// offset is a service clock that can be moved.
type offset struct{ d atomic.Int64 }

func (o *offset) Now() time.Time      { return time.Now().Add(time.Duration(o.d.Load())) }
func (o *offset) Set(d time.Duration) { o.d.Store(int64(d)) }

// testGrantRule: the grant rule (docs/design.md) through the Store, from a
// stored high-water mark and a fixed service clock, on every storage.
func testGrantRule(t *testing.T, be Backend) {
	const lead = 15_000 // ms, the default MaxLead
	nowMs := int64(1_000_000_000)
	now := snowflake.MsTime(nowMs).Add(300 * time.Microsecond)
	at := nowMs << snowflake.SequenceBits
	cases := []struct {
		name    string
		hwm     int64 // -1: never granted (absent)
		now     time.Time
		n       int
		lo, hi  int64
		wantErr error
		retry   time.Duration
	}{
		{name: "fresh code starts at now", hwm: -1, now: now, n: 100, lo: at, hi: at + 100},
		{name: "hwm behind now", hwm: at - 5000, now: now, n: 100, lo: at, hi: at + 100},
		{name: "hwm ahead of now", hwm: at + 4096*1000, now: now, n: 7, lo: at + 4096*1000, hi: at + 4096*1000 + 7},
		{name: "shrunk to the lead", hwm: at + (lead-3)*4096, now: now, n: 4 * 4096, lo: at + (lead-3)*4096, hi: at + lead*4096},
		{name: "trimmed below the least share: backpressure", hwm: at + (lead-1)*4096, now: now, n: 3 * 4096,
			wantErr: segment.ErrBackpressure, retry: 2 * time.Millisecond},
		{name: "at the lead: backpressure", hwm: at + lead*4096, now: now, n: 1, wantErr: segment.ErrBackpressure, retry: time.Millisecond},
		{name: "far ahead: backpressure", hwm: at + (lead+999)*4096, now: now, n: 1, wantErr: segment.ErrBackpressure, retry: time.Second},
		{name: "clock before the epoch: Lo floor 1", hwm: -1, now: snowflake.Epoch.Add(-time.Second), n: 10, lo: 1, hi: 11},
		{name: "epoch used up", hwm: segment.EndL, now: now, n: 1, wantErr: segment.ErrEpochExhausted},
		{name: "last unit of the epoch", hwm: segment.EndL - 1, now: now, n: 10, wantErr: segment.ErrBackpressure},
	}
	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctx := Ctx(t)
			region := i % (snowflake.MaxRegion + 1)
			st := NewStore(t, be.Storage(t), segment.StoreConfig{Now: func() time.Time { return c.now }})
			l, err := st.Acquire(ctx, region, "rule")
			if err != nil {
				t.Fatal(err)
			}
			if c.hwm >= 0 {
				be.Put(t, be.HighWaterKey(region, l.Worker), []byte(segment.EncodeHighWater(c.hwm)), 0)
			}
			before, _ := st.HighWater(ctx, region, l.Worker)
			b, err := st.Allocate(ctx, l, c.n)
			if c.wantErr != nil {
				if !errors.Is(err, c.wantErr) {
					t.Fatalf("Allocate = %+v, %v; want %v", b, err, c.wantErr)
				}
				var bp *segment.Backpressure
				if c.retry != 0 && (!errors.As(err, &bp) || bp.RetryAfter != c.retry) {
					t.Fatalf("Allocate = %v; want RetryAfter %v", err, c.retry)
				}
				if hwm, err := st.HighWater(ctx, region, l.Worker); err != nil || hwm != before {
					t.Fatalf("HWM after refusal %d, %v; want it unchanged at %d", hwm, err, before)
				}
				return
			}
			if err != nil {
				t.Fatalf("Allocate: %v", err)
			}
			want := segment.Block{Region: region, Worker: l.Worker, Lo: c.lo, Hi: c.hi,
				ServiceTime: c.now, ValidUntil: segment.ValidUntil(c.hi)}
			if b != want {
				t.Fatalf("Allocate = %+v; want %+v", b, want)
			}
			if err := b.Check(l, int64(c.n)); err != nil && c.now.After(snowflake.Epoch) {
				t.Fatalf("granted block fails Block.Check: %v", err)
			}
			if hwm, err := st.HighWater(ctx, region, l.Worker); err != nil || hwm != c.hi {
				t.Fatalf("HWM after grant %d, %v; want %d", hwm, err, c.hi)
			}
		})
	}
}

func testLifecycle(t *testing.T, be Backend) {
	obs := &Counter{}
	st := NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs})
	ctx := Ctx(t)

	l, err := st.Acquire(ctx, 2, "host-a/1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Region != 2 || l.Worker < 0 || l.Worker > 255 || l.Token <= 0 || l.LeaseID == 0 || l.TTL < TestTTL {
		t.Fatalf("Acquire returned %+v", l)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if b1.Len() != 4096 || b1.Region != 2 || b1.Worker != l.Worker || !b1.ValidUntil.After(b1.ServiceTime) {
		t.Fatalf("block %+v", b1)
	}
	if err := b1.Check(l, 4096); err != nil {
		t.Fatalf("granted block fails Block.Check: %v", err)
	}
	b2, err := st.Allocate(ctx, l, 100)
	if err != nil {
		t.Fatalf("Allocate 2: %v", err)
	}
	if b2.Lo < b1.Hi {
		t.Fatalf("blocks overlap: %+v then %+v", b1, b2)
	}
	hwm, err := st.HighWater(ctx, 2, l.Worker)
	if err != nil || hwm != b2.Hi {
		t.Fatalf("HighWater = %d, %v; want %d", hwm, err, b2.Hi)
	}
	l2, err := st.Renew(ctx, l)
	if err != nil || l2.TTL < TestTTL || l2.Token != l.Token {
		t.Fatalf("Renew = %+v, %v", l2, err)
	}
	infos, err := st.List(ctx, 2)
	if err != nil || len(infos) != 1 || infos[0].Worker != l.Worker || infos[0].Token != l.Token ||
		infos[0].LeaseID != l.LeaseID || infos[0].Owner != "host-a/1" || infos[0].Err != nil {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	if free, err := st.FreeCodes(ctx, 2); err != nil || free != 255 {
		t.Fatalf("FreeCodes = %d, %v; want 255", free, err)
	}
	if err := st.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := st.Allocate(ctx, l, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate after Release: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Renew after Release: %v, want ErrLeaseLost", err)
	}
	if err := st.Release(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("second Release: %v, want ErrLeaseLost", err)
	}
	if hwm, err := st.HighWater(ctx, 2, l.Worker); err != nil || hwm != b2.Hi {
		t.Fatalf("HWM after Release = %d, %v; want it kept at %d", hwm, err, b2.Hi)
	}
	if n := be.Leases(t); n != 0 {
		t.Fatalf("%d storage leases after Release; want none (revoked)", n)
	}
	if obs.NAcquired.Load() != 1 || obs.NGranted.Load() != 2 || obs.Size.Load() != b1.Len()+b2.Len() ||
		obs.NRenewed.Load() != 1 || obs.NReleased.Load() != 2 || obs.NGrantFailed.Load() != 1 {
		t.Fatalf("observer counts: acquired %d granted %d size %d renewed %d released %d grantFailed %d",
			obs.NAcquired.Load(), obs.NGranted.Load(), obs.Size.Load(), obs.NRenewed.Load(), obs.NReleased.Load(), obs.NGrantFailed.Load())
	}
}

// testConcurrentReplicasNeverOverlap: 8 callers on one code through two
// Stores on two storage handles (two service replicas) sharing one store.
func testConcurrentReplicasNeverOverlap(t *testing.T, be Backend) {
	obs := &Counter{}
	stores := []*segment.Store{
		NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs}),
		NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs}),
	}
	ctx := Ctx(t)
	l, err := stores[0].Acquire(ctx, 1, "shared")
	if err != nil {
		t.Fatal(err)
	}
	const callers, perCaller = 8, 25
	var (
		mu     sync.Mutex
		blocks []segment.Block
		wg     sync.WaitGroup
		errs   = make(chan error, callers)
	)
	for c := 0; c < callers; c++ {
		wg.Add(1)
		go func(c int) {
			defer wg.Done()
			st := stores[c%2]
			r := rand.New(rand.NewPCG(uint64(c), 9))
			var prevHi int64
			for i := 0; i < perCaller; i++ {
				before, err := st.HighWater(ctx, 1, l.Worker)
				if err != nil {
					errs <- err
					return
				}
				b, err := st.Allocate(ctx, l, 1+r.IntN(10*4096))
				if err != nil {
					errs <- fmt.Errorf("caller %d grant %d: %w", c, i, err)
					return
				}
				if b.Lo < before {
					errs <- fmt.Errorf("caller %d: block [%d,%d) starts below the HWM %d read before the call", c, b.Lo, b.Hi, before)
					return
				}
				if b.Lo < prevHi || b.Hi <= b.Lo {
					errs <- fmt.Errorf("caller %d: block [%d,%d) after its previous Hi %d", c, b.Lo, b.Hi, prevHi)
					return
				}
				prevHi = b.Hi
				mu.Lock()
				blocks = append(blocks, b)
				mu.Unlock()
			}
		}(c)
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if len(blocks) != callers*perCaller {
		t.Fatalf("%d blocks, want %d", len(blocks), callers*perCaller)
	}
	CheckDisjoint(t, blocks)
	hwm, err := stores[1].HighWater(ctx, 1, l.Worker)
	if err != nil || hwm != blocks[len(blocks)-1].Hi {
		t.Fatalf("final HWM %d, %v; want the highest Hi %d", hwm, err, blocks[len(blocks)-1].Hi)
	}
	if obs.NGranted.Load() != callers*perCaller {
		t.Fatalf("observer saw %d grants", obs.NGranted.Load())
	}
	if n := obs.NRegressed.Load(); n != 0 {
		t.Fatalf("observer saw %d regressions of a mark that only grew", n)
	}
	t.Logf("%d grants, %d failed attempts retried", obs.NGranted.Load(), obs.NConflicts.Load())
}

// testConcurrentAcquireDistinctCodes: acquisitions racing through two
// replicas never hand one code to two live owners.
func testConcurrentAcquireDistinctCodes(t *testing.T, be Backend) {
	stores := []*segment.Store{
		NewStore(t, be.Storage(t), segment.StoreConfig{}),
		NewStore(t, be.Storage(t), segment.StoreConfig{}),
	}
	ctx := Ctx(t)
	const n = 40
	leases := make([]segment.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			leases[i], errs[i] = stores[i%2].Acquire(ctx, 0, fmt.Sprintf("w%d", i))
		}(i)
	}
	wg.Wait()
	seen := map[int]int64{}
	for i := range leases {
		if errs[i] != nil {
			t.Fatalf("acquire %d: %v", i, errs[i])
		}
		if tok, dup := seen[leases[i].Worker]; dup {
			t.Fatalf("worker %d handed out twice (tokens %d and %d)", leases[i].Worker, tok, leases[i].Token)
		}
		seen[leases[i].Worker] = leases[i].Token
	}
	infos, err := stores[0].List(ctx, 0)
	if err != nil || len(infos) != n {
		t.Fatalf("List: %d entries, %v; want %d", len(infos), err, n)
	}
	for _, in := range infos {
		if seen[in.Worker] != in.Token {
			t.Fatalf("List says worker %d token %d, acquire said %d", in.Worker, in.Token, seen[in.Worker])
		}
	}
}

// testClockBackStillAboveHWM: with the service clock set back 2 s, the next
// grant starts exactly at the HWM; far beyond the lead it is backpressure,
// and nothing is written.
func testClockBackStillAboveHWM(t *testing.T, be Backend) {
	var off offset
	st := NewStore(t, be.Storage(t), segment.StoreConfig{Now: off.Now})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, 0, "clock")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096*1000) // ends ~1 s ahead of now
	if err != nil {
		t.Fatal(err)
	}
	off.Set(-2 * time.Second)
	b2, err := st.Allocate(ctx, l, 4096*1000)
	if err != nil {
		t.Fatalf("grant with the clock 2 s back: %v", err)
	}
	if b2.Lo != b1.Hi {
		t.Fatalf("grant with the clock back starts at %d, want the HWM %d", b2.Lo, b1.Hi)
	}
	if d := b1.ServiceTime.Sub(b2.ServiceTime); d < time.Second {
		t.Fatalf("service time moved by %v; the offset clock was not used", -d)
	}

	off.Set(-30 * time.Second) // beyond the 15 s lead
	_, err = st.Allocate(ctx, l, 1)
	var bp *segment.Backpressure
	if !errors.As(err, &bp) || !errors.Is(err, segment.ErrBackpressure) || bp.RetryAfter < 10*time.Second {
		t.Fatalf("grant 30 s back: %v, want *Backpressure with RetryAfter > 10 s", err)
	}
	if hwm, err := st.HighWater(ctx, 0, l.Worker); err != nil || hwm != b2.Hi {
		t.Fatalf("HWM after refusal %d, %v; want %d", hwm, err, b2.Hi)
	}
}

// testFullRegionAndFencing leases all 256 codes of a region, checks the
// 257th acquire fails retryably without leaking a storage lease, then
// simulates one owner's lease expiring (revoking its lease directly): the
// code goes to a new owner with a bigger token, starting above the old HWM,
// and the old token is refused everything.
func testFullRegionAndFencing(t *testing.T, be Backend) {
	stg := be.Storage(t)
	obs := &Counter{}
	st := NewStore(t, stg, segment.StoreConfig{Observer: obs, LeaseTTL: 60 * time.Second})
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
	other := NewStore(t, be.Storage(t), segment.StoreConfig{LeaseTTL: 60 * time.Second})
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
	for _, s := range []*segment.Store{st, other} {
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
	st := NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs})
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
		wrongWorker := segment.OwnerRecord{Version: 1, Region: 1, Worker: (l.Worker + 1) % 256, LeaseID: l.LeaseID,
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
		be.Put(t, be.HighWaterKey(2, 9), []byte(segment.EncodeHighWater(12345)), 0)
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
	st := NewStore(t, be.Storage(t), segment.StoreConfig{})
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
	segment.Storage
	armed       atomic.Bool
	lostRequest bool
}

var errLost = errors.New("injected: response lost after the commit")

func (x *lostReply) CommitHighWater(ctx context.Context, region, worker int, c segment.HighWaterCommit) (int64, bool, segment.CodeView, error) {
	if x.lostRequest && x.armed.CompareAndSwap(true, false) {
		return 0, false, segment.CodeView{}, errLost
	}
	rev, ok, fresh, err := x.Storage.CommitHighWater(ctx, region, worker, c)
	if err == nil && x.armed.CompareAndSwap(true, false) {
		return 0, false, segment.CodeView{}, errLost
	}
	return rev, ok, fresh, err
}

// testUnknownCommit: the grant commits but the Store sees an error.
// Allocate must return ErrUnavailable (keeping the cause) and no block; the
// next grant must start above what the lost commit wrote.
func testUnknownCommit(t *testing.T, be Backend) {
	lost := &lostReply{Storage: be.Storage(t)}
	st := NewStore(t, lost, segment.StoreConfig{})
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
	bs, ok := stg.(segment.BatchStorage)
	if !ok {
		t.Skip("storage has no group commit")
	}
	st := NewStore(t, stg, segment.StoreConfig{})
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
	ops := make([]segment.GrantOp, n)
	for i, l := range leases {
		v, err := stg.Code(ctx, 3, l.Worker)
		if err != nil {
			t.Fatal(err)
		}
		ops[i] = segment.GrantOp{Region: 3, Worker: l.Worker, Commit: segment.HighWaterCommit{
			Value: []byte(segment.EncodeHighWater(his[i] + 4096)), Token: l.Token, OwnerRev: v.Owner.ModRevision,
			HighWaterRev: v.HighWater.ModRevision, ContentionRev: v.Contention,
		}}
	}
	// Code 1: another grant moved its HWM. Code 2: its lease is gone.
	// Code 3: HWM moved, and this grant signals contention.
	moved := his[1] + 100
	be.Put(t, be.HighWaterKey(3, leases[1].Worker), []byte(segment.EncodeHighWater(moved)), 0)
	if err := stg.Revoke(ctx, leases[2].LeaseID); err != nil {
		t.Fatal(err)
	}
	be.Put(t, be.HighWaterKey(3, leases[3].Worker), []byte(segment.EncodeHighWater(his[3]+100)), 0)
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
	if hw := res[1].Fresh.HighWater; hw == nil || string(hw.Value) != segment.EncodeHighWater(moved) {
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
	stores := []*segment.Store{
		NewStore(t, be.Storage(t), segment.StoreConfig{}),
		NewStore(t, be.Storage(t), segment.StoreConfig{}),
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
					errs <- fmt.Errorf("code %d: %w", c, err)
					return
				}
				if b.Worker != leases[c].Worker || b.Region != 2 {
					errs <- fmt.Errorf("code %d: block for code %d/%d", c, b.Region, b.Worker)
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

// testSnapshotAndFence: an operator's view of a region matches what the
// Store granted, and Fence ends exactly the lease it names: never a newer
// owner's, even when that owner took the code after the operator looked.
func testSnapshotAndFence(t *testing.T, be Backend) {
	stg := be.Storage(t)
	st := NewStore(t, stg, segment.StoreConfig{})
	ctx := Ctx(t)

	var leases []segment.Lease
	his := map[int]int64{}
	for i := range 3 {
		l, err := st.Acquire(ctx, 3, fmt.Sprintf("owner-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Allocate(ctx, l, 4096*(i+1))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		his[l.Worker] = b.Hi
	}
	// A released code keeps its HWM and counts as free.
	gone, err := st.Acquire(ctx, 3, "released")
	if err != nil {
		t.Fatal(err)
	}
	gb, err := st.Allocate(ctx, gone, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// A corrupt HWM on a free code stops it: not free, reported.
	corruptCode := 0
	for _, held := his[corruptCode]; held || corruptCode == gone.Worker; _, held = his[corruptCode] {
		corruptCode++
	}
	be.Put(t, be.HighWaterKey(3, corruptCode), []byte("v1:-5"), 0)

	snap, err := st.Snapshot(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Region != 3 || snap.Rev <= 0 || len(snap.Leases) != 3 || snap.Free != 256-3-1 {
		t.Fatalf("snapshot region %d rev %d, %d leases, %d free; want region 3, 3 leases, %d free",
			snap.Region, snap.Rev, len(snap.Leases), snap.Free, 256-3-1)
	}
	if free, err := st.FreeCodes(ctx, 3); err != nil || free != snap.Free {
		t.Fatalf("FreeCodes = %d, %v; Snapshot says %d", free, err, snap.Free)
	}
	for i, li := range snap.Leases {
		if i > 0 && li.Worker <= snap.Leases[i-1].Worker {
			t.Fatalf("leases not ordered by worker: %+v", snap.Leases)
		}
		if li.Err != nil || li.Token <= 0 || li.LeaseID <= 0 || !strings.HasPrefix(li.Owner, "owner-") || li.Acquired.IsZero() {
			t.Fatalf("lease row %+v", li)
		}
		if got := snap.HighWaters[li.Worker]; got != his[li.Worker] {
			t.Fatalf("worker %d: snapshot HWM %d, granted up to %d", li.Worker, got, his[li.Worker])
		}
	}
	if got := snap.HighWaters[gone.Worker]; got != gb.Hi {
		t.Fatalf("released worker %d: snapshot HWM %d, want %d kept", gone.Worker, got, gb.Hi)
	}
	if err := snap.Corrupt[corruptCode]; !errors.Is(err, segment.ErrCorrupt) || len(snap.Corrupt) != 1 {
		t.Fatalf("corrupt HWMs %v; want only code %d, wrapping ErrCorrupt", snap.Corrupt, corruptCode)
	}

	// Fence with a stale token: nothing happens.
	victim, other := leases[0], leases[1]
	if _, err := st.Fence(ctx, 3, victim.Worker, victim.Token+1_000_000); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("Fence with a token that does not own the code: %v, want ErrFenced", err)
	}
	if _, err := st.Renew(ctx, victim); err != nil {
		t.Fatalf("victim after a refused fence: %v", err)
	}
	// Fence the victim by its token (a second replica, as an admin RPC
	// served by another replica would).
	admin := NewStore(t, be.Storage(t), segment.StoreConfig{})
	leasesBefore := be.Leases(t)
	info, err := admin.Fence(ctx, 3, victim.Worker, victim.Token)
	if err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if info.Worker != victim.Worker || info.Token != victim.Token || info.LeaseID != victim.LeaseID || info.Owner != "owner-0" {
		t.Fatalf("Fence returned %+v, want the victim's lease %+v", info, victim)
	}
	if n := be.Leases(t); n != leasesBefore-1 {
		t.Fatalf("%d storage leases after the fence, %d before: the victim's lease must be revoked", n, leasesBefore)
	}
	// The victim's next renewal and grant are refused; the others go on.
	if _, err := st.Renew(ctx, victim); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("fenced owner's Renew: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Allocate(ctx, victim, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("fenced owner's Allocate: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Allocate(ctx, other, 1); err != nil {
		t.Fatalf("another owner after the fence: %v", err)
	}
	if _, err := admin.Fence(ctx, 3, victim.Worker, 0); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Fence of a free code: %v, want ErrLeaseLost", err)
	}
	// Its HWM stays: the next owner of the code starts above the victim's
	// blocks. Hold every other free code so the new owner gets this one.
	snap, err = st.Snapshot(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.HighWaters[victim.Worker]; got != his[victim.Worker] {
		t.Fatalf("HWM after the fence %d, want %d kept", got, his[victim.Worker])
	}
	// A stale token (the victim's) must not fence the code's new owner.
	var newOwner segment.Lease
	for range 256 {
		l, err := st.Acquire(ctx, 3, "filler")
		if err != nil {
			t.Fatalf("acquire until the victim's code comes back: %v", err)
		}
		if l.Worker == victim.Worker {
			newOwner = l
			break
		}
	}
	if newOwner.Token <= victim.Token {
		t.Fatalf("new owner of code %d: %+v", victim.Worker, newOwner)
	}
	if _, err := admin.Fence(ctx, 3, victim.Worker, victim.Token); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("Fence with the old token after a new owner took the code: %v, want ErrFenced", err)
	}
	b, err := st.Allocate(ctx, newOwner, 1)
	if err != nil {
		t.Fatalf("new owner after a refused fence: %v", err)
	}
	if b.Lo < his[victim.Worker] {
		t.Fatalf("new owner's block starts at %d, below the fenced owner's HWM %d", b.Lo, his[victim.Worker])
	}
	for name, f := range map[string]func() error{
		"region": func() error { _, err := admin.Fence(ctx, 4, 0, 0); return err },
		"worker": func() error { _, err := admin.Fence(ctx, 3, 256, 0); return err },
		"token":  func() error { _, err := admin.Fence(ctx, 3, 0, -1); return err },
	} {
		if err := f(); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("Fence with a bad %s: %v, want ErrInvalid naming it", name, err)
		}
	}
	if _, err := admin.Snapshot(ctx, 4); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("Snapshot of region 4: %v, want ErrInvalid", err)
	}
}

// testIdentityBinding: a lease acquired with an identity is recorded with
// it (record version 2), and only that identity may renew, release or
// allocate on it; another identity, or none, is refused with
// ErrPermissionDenied and changes nothing in the storage. A lease acquired
// without an identity is stored as the version 1 record of old.
func testIdentityBinding(t *testing.T, be Backend) {
	st := NewStore(t, be.Storage(t), segment.StoreConfig{})
	ctx := Ctx(t)
	ctxA := segment.WithIdentity(ctx, "uri:spiffe://idrange.test/a")
	ctxB := segment.WithIdentity(ctx, "uri:spiffe://idrange.test/b")

	la, err := st.Acquire(ctxA, 1, "client a")
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := be.Get(t, be.LeaseKey(1, la.Worker))
	if !ok {
		t.Fatal("owner entry missing")
	}
	rec, err := segment.DecodeOwnerRecord(raw)
	if err != nil || rec.Version != 2 || rec.Identity != "uri:spiffe://idrange.test/a" || rec.Owner != "client a" {
		t.Fatalf("owner record %s = %+v, %v; want version 2 with A's identity", raw, rec, err)
	}
	if _, err := st.Allocate(ctxA, la, 4096); err != nil {
		t.Fatal(err)
	}
	hwm, _ := be.Get(t, be.HighWaterKey(1, la.Worker))

	other := NewStore(t, be.Storage(t), segment.StoreConfig{}) // a second replica, cold cache
	for _, s := range []*segment.Store{st, other} {
		for name, c := range map[string]context.Context{"identity B": ctxB, "no identity": ctx} {
			if _, err := s.Renew(c, la); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Renew of A's lease: %v, want ErrPermissionDenied", name, err)
			}
			if _, err := s.Allocate(c, la, 4096); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Allocate on A's lease: %v, want ErrPermissionDenied", name, err)
			}
			if err := s.Release(c, la); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Release of A's lease: %v, want ErrPermissionDenied", name, err)
			}
		}
	}
	if got, _ := be.Get(t, be.LeaseKey(1, la.Worker)); string(got) != string(raw) {
		t.Fatalf("owner entry changed by refused calls: %s -> %s", raw, got)
	}
	if got, _ := be.Get(t, be.HighWaterKey(1, la.Worker)); string(got) != string(hwm) {
		t.Fatalf("high-water mark changed by refused calls: %s -> %s", hwm, got)
	}
	infos, err := st.List(ctx, 1)
	if err != nil || len(infos) != 1 || infos[0].Identity != "uri:spiffe://idrange.test/a" {
		t.Fatalf("List = %+v, %v; want A's lease with its identity", infos, err)
	}
	for _, s := range []*segment.Store{st, other} {
		if _, err := s.Renew(ctxA, la); err != nil {
			t.Fatalf("A renews: %v", err)
		}
		if _, err := s.Allocate(ctxA, la, 4096); err != nil {
			t.Fatalf("A allocates: %v", err)
		}
	}
	if err := other.Release(ctxA, la); err != nil {
		t.Fatalf("A releases: %v", err)
	}

	// Without an identity: the record is version 1, byte for byte as before
	// identities existed, and an identified caller cannot touch it.
	ln, err := st.Acquire(ctx, 1, "anonymous")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = be.Get(t, be.LeaseKey(1, ln.Worker))
	want := fmt.Sprintf(`{"v":1,"region":1,"worker":%d,"lease_id":%d,"owner":"anonymous","acquired_unix_ms":`, ln.Worker, ln.LeaseID)
	if !strings.HasPrefix(string(raw), want) {
		t.Fatalf("anonymous owner record %s, want the version 1 form %s...", raw, want)
	}
	if _, err := st.Allocate(ctxB, ln, 4096); !errors.Is(err, segment.ErrPermissionDenied) {
		t.Fatalf("identity B on an anonymous lease: %v, want ErrPermissionDenied", err)
	}
	if _, err := st.Allocate(ctx, ln, 4096); err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, ln); err != nil {
		t.Fatal(err)
	}
}

// testIdentityCap: an identity holding MaxCodesPerIdentity codes is refused
// the next with ErrCodeCap naming the cap, without leaking a storage lease;
// other identities, and callers without one, still get codes; a released
// code makes room again.
func testIdentityCap(t *testing.T, be Backend) {
	const capN = 3
	st := NewStore(t, be.Storage(t), segment.StoreConfig{MaxCodesPerIdentity: capN})
	ctx := Ctx(t)
	ctxA := segment.WithIdentity(ctx, "cn:a")
	var held []segment.Lease
	for i := range capN {
		l, err := st.Acquire(ctxA, 2, "a")
		if err != nil {
			t.Fatalf("acquire %d of %d: %v", i+1, capN, err)
		}
		held = append(held, l)
	}
	leases := be.Leases(t)
	_, err := st.Acquire(ctxA, 2, "a")
	if !errors.Is(err, segment.ErrCodeCap) || !strings.Contains(err.Error(), fmt.Sprintf("cap is %d", capN)) {
		t.Fatalf("acquire %d: %v, want ErrCodeCap naming the cap %d", capN+1, err, capN)
	}
	if got := be.Leases(t); got != leases {
		t.Fatalf("storage leases %d before, %d after the refused acquire", leases, got)
	}
	if _, err := st.Acquire(segment.WithIdentity(ctx, "cn:b"), 2, "b"); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	if _, err := st.Acquire(ctx, 2, "anonymous"); err != nil {
		t.Fatalf("no identity: %v", err)
	}
	if _, err := st.Acquire(segment.WithIdentity(ctx, "cn:a"), 3, "a"); err != nil {
		t.Fatalf("the same identity in another region: %v", err)
	}
	if err := st.Release(ctxA, held[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Acquire(ctxA, 2, "a"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// testIdentityCapUnderConcurrency: many concurrent acquisitions by one
// identity through two replicas never leave it holding more than the cap,
// at least one succeeds, and the refused ones leave no code behind.
func testIdentityCapConcurrent(t *testing.T, be Backend) {
	const capN, tries = 2, 8
	stores := []*segment.Store{
		NewStore(t, be.Storage(t), segment.StoreConfig{MaxCodesPerIdentity: capN}),
		NewStore(t, be.Storage(t), segment.StoreConfig{MaxCodesPerIdentity: capN}),
	}
	ctx := segment.WithIdentity(Ctx(t), "dns:c.test")
	var (
		wg   sync.WaitGroup
		won  atomic.Int64
		errs = make(chan error, tries)
	)
	for i := range tries {
		wg.Go(func() {
			_, err := stores[i%2].Acquire(ctx, 0, "c")
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, segment.ErrCodeCap):
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("acquire: %v, want success or ErrCodeCap", err)
	}
	infos, err := stores[0].List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(infos)); won.Load() < 1 || won.Load() > capN || n != won.Load() {
		t.Fatalf("%d acquisitions succeeded and %d codes are held; want 1..%d, equal", won.Load(), n, capN)
	}
}

// testHighWaterRegressed: an operator lowers a code's high-water mark
// behind the Store's back (to the start of the last block it granted, the
// issue's duplicate), then deletes it. Each time the next grant on the code
// is refused with ErrHighWaterRegressed (also ErrCorrupt) in one line naming
// the code, the key, the Store's floor and the stored value; the Observer
// hears of it once; the key is left as the operator wrote it; Acquire and
// FreeCodes skip the code; lifting the mark back to the floor makes the
// code grantable again, above every block granted before.
func testHighWaterRegressed(t *testing.T, be Backend) {
	const region, code = 0, 5
	obs := &Counter{}
	st := NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs, FirstCode: func(int) int { return code }})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, region, "victim")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire = %+v, %v; want code %d", l, err, code)
	}
	var granted []segment.Block
	for range 3 {
		b, err := st.Allocate(ctx, l, 4096)
		if err != nil {
			t.Fatal(err)
		}
		granted = append(granted, b)
	}
	floor := granted[len(granted)-1].Hi
	hk := be.HighWaterKey(region, code)
	refused := func(what string, stored int64, want ...string) {
		t.Helper()
		b, err := st.Allocate(ctx, l, 4096)
		if !errors.Is(err, segment.ErrHighWaterRegressed) || !errors.Is(err, segment.ErrCorrupt) || b != (segment.Block{}) {
			t.Fatalf("Allocate after %s = %+v, %v; want no block and ErrHighWaterRegressed (and ErrCorrupt)", what, b, err)
		}
		msg := err.Error()
		want = append(want, fmt.Sprintf("worker %d", code), fmt.Sprint(floor), fmt.Sprint(stored))
		for _, w := range want {
			if !strings.Contains(msg, w) || strings.Contains(msg, "\n") {
				t.Fatalf("refusal after %s %q does not say %q on one line", what, msg, w)
			}
		}
		if _, err := st.HighWater(ctx, region, code); !errors.Is(err, segment.ErrHighWaterRegressed) {
			t.Fatalf("HighWater after %s: %v, want ErrHighWaterRegressed", what, err)
		}
	}

	lowered := granted[len(granted)-1].Lo
	be.Put(t, hk, []byte(segment.EncodeHighWater(lowered)), 0)
	refused("lowering the mark", lowered, hk)
	refused("a second try", lowered, hk)
	if n := obs.NRegressed.Load(); n != 1 {
		t.Fatalf("observer heard of %d regressions, want 1 (once per regressed code, not per call)", n)
	}
	if v, ok := be.Get(t, hk); !ok || string(v) != segment.EncodeHighWater(lowered) {
		t.Fatalf("HWM key now %q (present %v); the Store must not rewrite it", v, ok)
	}

	// Acquire skips the code: with l released, it would be the first tried.
	if err := st.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if free, err := st.FreeCodes(ctx, region); err != nil || free != 255 {
		t.Fatalf("FreeCodes = %d, %v; want 255 (the regressed code is unusable)", free, err)
	}
	other, err := st.Acquire(ctx, region, "other")
	if err != nil || other.Worker == code {
		t.Fatalf("Acquire with code %d regressed = %+v, %v; want another code", code, other, err)
	}
	snap, err := st.Snapshot(ctx, region)
	if err != nil || !errors.Is(snap.Corrupt[code], segment.ErrHighWaterRegressed) || snap.Free != 254 {
		t.Fatalf("Snapshot: code %d error %v, %d free, %v; want ErrHighWaterRegressed and 254 free", code, snap.Corrupt[code], snap.Free, err)
	}

	// Lifted back to the floor (what a restore fence does, and more): usable.
	be.Put(t, hk, []byte(segment.EncodeHighWater(floor)), 0)
	l, err = st.Acquire(ctx, region, "victim again")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire after the lift = %+v, %v; want code %d", l, err, code)
	}
	b, err := st.Allocate(ctx, l, 4096)
	if err != nil || b.Lo < floor {
		t.Fatalf("Allocate after the lift = %+v, %v; want a block at or above %d", b, err, floor)
	}
	granted = append(granted, b)
	CheckDisjoint(t, granted)
	if n := obs.NRecovered.Load(); n != 1 {
		t.Fatalf("observer heard of %d recoveries, want 1", n)
	}

	// A deleted mark reads as 0: below the floor too.
	floor = b.Hi
	be.Delete(t, hk)
	refused("deleting the mark", 0, "deleted")
	if n := obs.NRegressed.Load(); n != 2 {
		t.Fatalf("observer heard of %d regressions, want 2", n)
	}
}

// testFailedCommitFloor: a commit whose outcome is unknown does not raise
// the Store's floor. When it was not applied, the stored mark is still the
// last known one and the next grant goes on from it (a floor raised to the
// lost block's end would stop a healthy code); when it was applied, the
// next read raises the floor to it, so lowering the mark below the burned
// range is caught.
func testFailedCommitFloor(t *testing.T, be Backend) {
	obs := &Counter{}
	failing := &lostReply{Storage: be.Storage(t), lostRequest: true}
	st := NewStore(t, failing, segment.StoreConfig{Observer: obs})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, 0, "unlucky")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	failing.armed.Store(true)
	if _, err := st.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Allocate over a failed commit: %v, want ErrUnavailable", err)
	}
	b2, err := st.Allocate(ctx, l, 4096)
	if err != nil || b2.Lo < b1.Hi {
		t.Fatalf("Allocate after a commit that was not applied = %+v, %v; want a block from %d", b2, err, b1.Hi)
	}
	if n := obs.NRegressed.Load(); n != 0 {
		t.Fatalf("observer heard of %d regressions after a commit that was not applied", n)
	}

	// Applied but unknown (lostReply): the burned range is above b2; the
	// next read raises the floor to it.
	lost := &lostReply{Storage: be.Storage(t)}
	st2 := NewStore(t, lost, segment.StoreConfig{Observer: obs})
	if _, err := st2.Allocate(ctx, l, 4096); err != nil {
		t.Fatal(err)
	}
	lost.armed.Store(true)
	if _, err := st2.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Allocate with a lost reply: %v, want ErrUnavailable", err)
	}
	burned, err := st2.HighWater(ctx, 0, l.Worker)
	if err != nil {
		t.Fatal(err)
	}
	be.Put(t, be.HighWaterKey(0, l.Worker), []byte(segment.EncodeHighWater(burned-1)), 0)
	if _, err := st2.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrHighWaterRegressed) {
		t.Fatalf("Allocate after lowering into the burned range: %v, want ErrHighWaterRegressed", err)
	}
}

// testNoFalseRegression: reads of a code's mark that race with grants on
// it, in the same Store and in another replica (Allocate, HighWater,
// FreeCodes, Snapshot, all at once), never count as a regression: a read
// is judged only against what the Store knew when it was sent.
func testNoFalseRegression(t *testing.T, be Backend) {
	obs := &Counter{}
	stores := []*segment.Store{
		NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs}),
		NewStore(t, be.Storage(t), segment.StoreConfig{Observer: obs}),
	}
	ctx := Ctx(t)
	const region, codes, grants = 3, 4, 30
	leases := make([]segment.Lease, codes)
	for i := range leases {
		l, err := stores[0].Acquire(ctx, region, fmt.Sprintf("code-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	var (
		wg      sync.WaitGroup
		granted atomic.Int64
		stop    = make(chan struct{})
		errs    = make(chan error, 4*codes+4)
	)
	for i := range 2 * codes { // grants: two callers per code, one per replica
		wg.Go(func() {
			st, l := stores[i%2], leases[i/2]
			for range grants {
				if _, err := st.Allocate(ctx, l, 4096); err != nil {
					errs <- err
					return
				}
				granted.Add(1)
			}
		})
	}
	var readers sync.WaitGroup
	for i := range 4 { // reads on both replicas until the grants end
		readers.Go(func() {
			st := stores[i%2]
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch n % 3 {
				case 0:
					_, err = st.HighWater(ctx, region, leases[n%codes].Worker)
				case 1:
					_, err = st.FreeCodes(ctx, region)
				default:
					var snap segment.RegionSnapshot
					if snap, err = st.Snapshot(ctx, region); err == nil && len(snap.Corrupt) > 0 {
						err = fmt.Errorf("snapshot reports %d stopped codes", len(snap.Corrupt))
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := obs.NRegressed.Load(); n != 0 {
		t.Fatalf("observer heard of %d regressions of marks that only grew", n)
	}
	t.Logf("%d grants raced with reads on two replicas; no regression reported", granted.Load())
}
