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

// Callers racing on jumps at the block itself: most takes read a local
// instant 1 ms past the previous one (as a client reading the clock at 1
// call per ms would), so they jump the cursor over a gap; a third of the
// callers go through Next's path (take1, then take of one when it loses a
// race), half of those jumping and half at the instant as it is. No
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
	var fast atomic.Int64  // positions take1 took
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
					if g%2 == 0 {
						now = clock.Add(nsPerMs)
					}
					if f, ok = b.take1(now); ok {
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
		t.Fatal("take1 never took a position: the fast path was not raced")
	}
}

// take1 takes exactly what take(now, 1) would, jumps included, or (only
// when the block has no position left at now) declines and changes
// nothing: from a cursor behind, at and ahead of the clock's floor, at the
// block's last position and past its end.
func TestTake1IsTakeOfOne(t *testing.T) {
	const lo, hi = 10 << seqBits, 12 << seqBits
	sb := segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: hi,
		ServiceTime: snowflake.Epoch, ValidUntil: snowflake.Epoch.Add(time.Hour)}
	for _, tc := range []struct {
		name   string
		cursor int64 // last position taken
		ms     int64 // service millisecond at the take
		want   int64 // position taken, 0 for none
	}{
		{"first position, clock behind", lo - 1, 9, lo},
		{"first position, clock at it", lo - 1, 10, lo},
		{"first position, clock past it", lo - 1, 11, 11 << seqBits},
		{"mid block, clock behind", lo + 100, 10, lo + 101},
		{"clock passed the cursor", lo + 100, 11, 11 << seqBits},
		{"last position", hi - 2, 11, hi - 1},
		{"block used up", hi - 1, 11, 0},
		{"clock past the block", lo + 5, 12, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := tc.ms * nsPerMs
			a, b := newBlock(sb, &leaseState{}, 0, 0), newBlock(sb, &leaseState{}, 0, 0)
			// An earlier take brings each block to the cursor: a jump to
			// the cursor's millisecond and the run up to it.
			for _, x := range []*block{a, b} {
				if tc.cursor >= lo {
					x.take((tc.cursor>>seqBits)*nsPerMs, tc.cursor&seqMask+1)
				}
				if x.cursor() != tc.cursor {
					t.Fatalf("setting up: cursor %d, want %d", x.cursor(), tc.cursor)
				}
			}
			before := a.state.Load()
			got, ok := a.take1(now)
			want, k, wok := b.take(now, 1)
			if ok != (tc.want != 0) || wok != ok {
				t.Fatalf("take1 ok = %v, take(now, 1) ok = %v, want %v", ok, wok, tc.want != 0)
			}
			if !ok {
				if a.state.Load() != before {
					t.Fatalf("take1 declined but moved the block: state %x, was %x", a.state.Load(), before)
				}
				return
			}
			if got != tc.want || want != tc.want || k != 1 {
				t.Fatalf("take1 = %d, take(now, 1) = %d+%d, want %d", got, want, k, tc.want)
			}
			if a.state.Load() != b.state.Load() {
				t.Fatalf("after take1 state %x, after take %x", a.state.Load(), b.state.Load())
			}
		})
	}
}

// A block counts what it hands out exactly at every step: takes, jumps
// over a gap, and sealing, which counts the rest as skipped so no take
// succeeds after it.
func TestBlockCountsExactly(t *testing.T) {
	const lo, hi = 10 << seqBits, 13 << seqBits
	sb := segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: hi,
		ServiceTime: snowflake.Epoch, ValidUntil: snowflake.Epoch.Add(time.Hour)}
	b := newBlock(sb, &leaseState{}, 0, 0)
	ms := func(m int64) int64 { return m * nsPerMs }
	steps := []struct {
		name          string
		do            func() (int64, int64, bool)
		first, k      int64
		minted, cur   int64
		leftAt11ms    int64
		finishedAt11m bool
	}{
		{"one at the start", func() (int64, int64, bool) { f, ok := b.take1(ms(10)); return f, 1, ok },
			lo, 1, 1, lo, 2*4096 - 0, false},
		{"five more", func() (int64, int64, bool) { return b.take(ms(10), 5) },
			lo + 1, 5, 6, lo + 5, 2 * 4096, false},
		{"jump to 11 ms", func() (int64, int64, bool) { return b.take(ms(11), 3) },
			11 << seqBits, 3, 9, 11<<seqBits + 2, 2*4096 - 3, false},
		{"past the end: up to hi", func() (int64, int64, bool) { return b.take(ms(12), 10_000) },
			12 << seqBits, 4096, 9 + 4096, hi - 1, 0, true},
	}
	for _, st := range steps {
		f, k, ok := st.do()
		if !ok || f != st.first || k != st.k {
			t.Fatalf("%s: took %d+%d (%v), want %d+%d", st.name, f, k, ok, st.first, st.k)
		}
		if b.minted() != st.minted || b.cursor() != st.cur {
			t.Fatalf("%s: minted %d cursor %d, want %d %d", st.name, b.minted(), b.cursor(), st.minted, st.cur)
		}
		if got := b.left(ms(11)); got != st.leftAt11ms {
			t.Fatalf("%s: left at 11 ms = %d, want %d", st.name, got, st.leftAt11ms)
		}
		if got := b.finished(ms(11)); got != st.finishedAt11m {
			t.Fatalf("%s: finished at 11 ms = %v, want %v", st.name, got, st.finishedAt11m)
		}
	}
	// A fresh block sealed part-way: the rest is skipped, nothing more.
	c := newBlock(sb, &leaseState{}, 0, 0)
	c.take(ms(10), 7)
	c.seal()
	if _, _, ok := c.take(ms(10), 1); ok {
		t.Fatal("take succeeded on a sealed block")
	}
	if _, ok := c.take1(ms(10)); ok {
		t.Fatal("take1 succeeded on a sealed block")
	}
	if c.minted() != 7 || c.cursor() != hi-1 {
		t.Fatalf("sealed block: minted %d cursor %d, want 7 and %d", c.minted(), c.cursor(), hi-1)
	}
	// A grant longer than a block can count keeps its first maxSpan
	// positions.
	long := sb
	long.Hi = lo + maxSpan + 5
	if got := newBlock(long, &leaseState{}, 0, 0); got.hi != lo+maxSpan || got.kickAt != got.hi {
		t.Fatalf("block of a %d-position grant: hi %d (kickAt %d), want %d", long.Hi-long.Lo, got.hi, got.kickAt, lo+maxSpan)
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
		"state": unsafe.Offsetof(b.state), "lo": unsafe.Offsetof(b.lo), "hi": unsafe.Offsetof(b.hi), "base": unsafe.Offsetof(b.base),
		"offset": unsafe.Offsetof(b.offset), "stop": unsafe.Offsetof(b.stop),
		"kickAt": unsafe.Offsetof(b.kickAt), "kicked": unsafe.Offsetof(b.kicked),
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
