package storetest

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/fakeclock"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

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
			st := NewStore(t, be.Storage(t), store.Config{Now: func() time.Time { return c.now }})
			l, err := st.Acquire(ctx, region, "rule")
			if err != nil {
				t.Fatal(err)
			}
			if c.hwm >= 0 {
				be.Put(t, be.HighWaterKey(region, l.Worker), []byte(store.EncodeHighWater(c.hwm)), 0)
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
	st := NewStore(t, be.Storage(t), store.Config{Observer: obs})
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
	stores := []*store.Store{
		NewStore(t, be.Storage(t), store.Config{Observer: obs}),
		NewStore(t, be.Storage(t), store.Config{Observer: obs}),
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
					errs <- errors.Newf("caller %d grant %d: %w", c, i, err)
					return
				}
				if b.Lo < before {
					errs <- errors.Newf("caller %d: block [%d,%d) starts below the HWM %d read before the call", c, b.Lo, b.Hi, before)
					return
				}
				if b.Lo < prevHi || b.Hi <= b.Lo {
					errs <- errors.Newf("caller %d: block [%d,%d) after its previous Hi %d", c, b.Lo, b.Hi, prevHi)
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
	stores := []*store.Store{
		NewStore(t, be.Storage(t), store.Config{}),
		NewStore(t, be.Storage(t), store.Config{}),
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
	var off fakeclock.Offset
	st := NewStore(t, be.Storage(t), store.Config{Now: off.Now})
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
