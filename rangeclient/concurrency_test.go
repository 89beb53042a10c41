package rangeclient

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// 64 goroutines share one client for 1,000,000 IDs (real time, so block
// rotation and background refills race with the callers): every ID is
// unique, inside a granted block, and each goroutine's IDs strictly increase.
func TestConcurrentCallersUniqueAndIncreasing(t *testing.T) {
	const goroutines, total = 64, 1_000_000
	per := total / goroutines
	if testing.Short() {
		per /= 10
	}
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	// Small blocks so that the run crosses many rotations and refills.
	c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.FixedBlock = 50_000 })
	out := make([][]snowflake.ID, goroutines)
	var wg sync.WaitGroup
	errs := make(chan error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			ids := make([]snowflake.ID, 0, per)
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			for len(ids) < per {
				if len(ids)%7 == 3 { // mix single and batched calls
					var err error
					ids, err = c.AppendN(ctx, ids, min(5, per-len(ids)))
					if err != nil {
						errs <- err
						return
					}
					continue
				}
				id, err := c.Next(ctx)
				if err != nil {
					errs <- err
					return
				}
				ids = append(ids, id)
			}
			out[g] = ids
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("minting failed: %v", err)
	}
	all := make([]snowflake.ID, 0, per*goroutines)
	for g, ids := range out {
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("goroutine %d: ID %d (%d) not above the previous (%d)", g, i, ids[i], ids[i-1])
			}
		}
		all = append(all, ids...)
	}
	if len(all) != per*goroutines {
		t.Fatalf("got %d IDs, want %d", len(all), per*goroutines)
	}
	checkUnique(t, all)
	checkInGrants(t, svc, all)
	s := c.Stats()
	if s.Minted != int64(len(all)) {
		t.Errorf("Stats.Minted = %d, minted %d", s.Minted, len(all))
	}
	if s.Refills < 2 {
		t.Errorf("only %d refills: the run did not cross a block boundary", s.Refills)
	}
	t.Logf("%d IDs over %d blocks, %d stalls", len(all), s.Refills, s.Stalls)
}

// Many callers wake at the same instant at every millisecond (synctest's
// clock), so they race on the cursor's jump to the new millisecond: still
// no ID twice, and each caller's IDs increase.
func TestConcurrentCallersAtMillisecondBoundaries(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), nil)
		const goroutines, rounds = 16, 500
		out := mintConcurrently(t, goroutines, rounds, func() (snowflake.ID, error) {
			time.Sleep(time.Millisecond)
			return c.Next(context.Background())
		})
		var all []snowflake.ID
		for g, ids := range out {
			for i := 1; i < len(ids); i++ {
				if ids[i] <= ids[i-1] {
					t.Fatalf("goroutine %d: not increasing at %d", g, i)
				}
			}
			all = append(all, ids...)
		}
		checkUnique(t, all)
		checkInGrants(t, svc, all)
		if got := c.Stats().Minted; got != goroutines*rounds {
			t.Fatalf("Stats.Minted = %d, want %d", got, goroutines*rounds)
		}
	})
}

// Callers racing on jumps: under synctest's fake time every caller sleeps
// 1 ms before each Next, so all of them wake in a new millisecond at once
// and race to jump the cursor there, the path where callers race on the gap
// count. No ID twice, and the minted count stays exact.
func TestConcurrentCallersRacingOnJumps(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: time.Hour, MaxLead: time.Hour})
		c := newTestClient(t, svc.Conn(), nil)
		const goroutines, per = 32, 2000
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		out := mintConcurrently(t, goroutines, per, func() (snowflake.ID, error) {
			time.Sleep(time.Millisecond)
			return c.Next(ctx)
		})
		var all []snowflake.ID
		for _, ids := range out {
			all = append(all, ids...)
		}
		checkUnique(t, all)
		checkInGrants(t, svc, all)
		if got := c.Stats().Minted; got != int64(len(all)) {
			t.Fatalf("Stats.Minted = %d, minted %d", got, len(all))
		}
	})
}

// Callers racing on jumps at the block itself: the takes read a local
// instant 1 ms past the previous one (as a client reading the clock at 1
// call per ms would), so every take is a jump of the cursor, the path where
// concurrent callers add and take back speculative gap counts; a third of
// the callers use Next's fast path (takeNext, then take of one when it
// declines) at the instant as it is, so it races with the jumps. No
// position twice, and the block's minted count is exact. (The client test
// above cannot make every call a jump: the client reads Go's monotonic
// clock only.)
func TestBlockTakesRacingOnJumps(t *testing.T) {
	const goroutines, ms = 33, 100_000
	sb := segment.Block{Region: 1, Worker: 7, Lo: 1 << seqBits, Hi: (ms + 1) << seqBits,
		ServiceTime: snowflake.Epoch, ValidUntil: snowflake.Epoch.Add(time.Hour)}
	l := &leaseState{}
	b := newBlock(sb, l, 0, 0)
	var clock atomic.Int64 // local instant of the next take, ns
	var fast atomic.Int64  // positions takeNext took
	out := make([][]int64, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		out[g] = make([]int64, 0, 4*ms/goroutines) // no growth while racing
		wg.Go(func() {
			for {
				var f, k int64
				var ok bool
				switch g % 3 {
				case 0:
					now := clock.Load()
					if f, ok = b.takeNext(now); ok {
						k = 1
						fast.Add(1)
					} else {
						f, k, ok = b.take(now, 1)
					}
				case 1:
					f, k, ok = b.take(clock.Add(nsPerMs), 1)
				default:
					f, k, ok = b.take(clock.Add(nsPerMs), 3)
				}
				if !ok {
					return
				}
				for p := f; p < f+k; p++ {
					out[g] = append(out[g], p)
				}
			}
		})
	}
	wg.Wait()
	seen := map[int64]bool{}
	for _, ps := range out {
		for _, p := range ps {
			if seen[p] || p < sb.Lo || p >= sb.Hi {
				t.Fatalf("position %d taken twice or outside [%d, %d)", p, sb.Lo, sb.Hi)
			}
			seen[p] = true
		}
	}
	if got := b.minted(); got != int64(len(seen)) {
		t.Fatalf("block minted = %d, taken %d", got, len(seen))
	}
	if fast.Load() == 0 {
		t.Fatal("takeNext never took a position: the fast path was not raced")
	}
}

// takeNext takes exactly what take(now, 1) would, or declines and changes
// nothing: from a cursor behind, at and ahead of the clock's floor, at the
// block's last position and past its end.
func TestTakeNextIsTakeOfOne(t *testing.T) {
	const lo, hi = 10 << seqBits, 12 << seqBits
	sb := segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: hi,
		ServiceTime: snowflake.Epoch, ValidUntil: snowflake.Epoch.Add(time.Hour)}
	for _, tc := range []struct {
		name     string
		cursor   int64 // last position taken
		ms       int64 // service millisecond at the take
		wantNext bool  // takeNext takes (no jump needed, room left)
	}{
		{"first position, clock behind", lo - 1, 9, true},
		{"first position, clock at it", lo - 1, 10, true},
		{"mid block, clock behind", lo + 100, 10, true},
		{"clock passed the cursor", lo + 100, 11, false},
		{"last position", hi - 2, 11, true},
		{"block used up", hi - 1, 11, false},
		{"clock past the block", lo + 5, 12, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.ms * nsPerMs
			a, b := newBlock(sb, &leaseState{}, 0, 0), newBlock(sb, &leaseState{}, 0, 0)
			a.cursor.Store(tc.cursor)
			b.cursor.Store(tc.cursor)
			got, ok := a.takeNext(now)
			if ok != tc.wantNext {
				t.Fatalf("takeNext ok = %v, want %v", ok, tc.wantNext)
			}
			if !ok {
				if a.cursor.Load() != tc.cursor || a.skipped.Load() != 0 {
					t.Fatalf("takeNext declined but moved the block: cursor %d, skipped %d", a.cursor.Load(), a.skipped.Load())
				}
				return
			}
			want, k, wok := b.take(now, 1)
			if !wok || k != 1 || got != want {
				t.Fatalf("takeNext = %d, take(now, 1) = %d, %d, %v", got, want, k, wok)
			}
			if a.cursor.Load() != b.cursor.Load() || a.skipped.Load() != b.skipped.Load() || a.minted() != b.minted() {
				t.Fatalf("after takeNext cursor %d skipped %d, after take %d %d", a.cursor.Load(), a.skipped.Load(), b.cursor.Load(), b.skipped.Load())
			}
		})
	}
}

// mintConcurrently runs goroutines callers that each call mint n times,
// stopping at their first error (reported with t.Error), and returns each
// caller's IDs in the order it got them.
func mintConcurrently(t *testing.T, goroutines, n int, mint func() (snowflake.ID, error)) [][]snowflake.ID {
	t.Helper()
	out := make([][]snowflake.ID, goroutines)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				id, err := mint()
				if err != nil {
					t.Error(err)
					return
				}
				out[g] = append(out[g], id)
			}
		}()
	}
	wg.Wait()
	return out
}

// The fields Next reads share the block's first cache line, and block's
// size is a multiple of 64 bytes, so every block starts on a line (see
// block and blockPad).
func TestBlockLayout(t *testing.T) {
	var b block
	if size := unsafe.Sizeof(b); size%64 != 0 {
		t.Fatalf("block is %d bytes, not a multiple of 64: set blockPad to %d", size, (64-(size-blockPad)%64)%64)
	}
	for name, off := range map[string]uintptr{
		"cursor": unsafe.Offsetof(b.cursor), "hi": unsafe.Offsetof(b.hi), "base": unsafe.Offsetof(b.base),
		"offset": unsafe.Offsetof(b.offset), "validUntil": unsafe.Offsetof(b.validUntil),
		"kickAt": unsafe.Offsetof(b.kickAt), "lease": unsafe.Offsetof(b.lease),
	} {
		if off >= 64 {
			t.Errorf("block.%s at offset %d: outside the first cache line", name, off)
		}
	}
}

// The Client fields Next reads share one cache line: the first, when the
// allocator starts the Client on one (its size class is a multiple of 64
// bytes).
func TestClientLayout(t *testing.T) {
	var c Client
	if end := unsafe.Offsetof(c.lanes) + unsafe.Sizeof(c.lanes); end > 64 {
		t.Fatalf("Client's hot fields end at byte %d: past the first cache line", end)
	}
	t.Logf("Client is %d bytes", unsafe.Sizeof(c))
}
