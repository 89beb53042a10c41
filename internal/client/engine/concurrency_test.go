package engine

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unsafe"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
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
	c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Tuning.FixedBlock = 50_000 })
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

// Callers racing on jumps at the block itself, all started together, 2,000
// takes each: most takes read a local instant 1 ms past the previous one
// (as a client reading the clock at 1 call per ms would), so they jump the
// cursor over a gap; a third of the callers go through Next's path (add1
// while the clock reading is before until, else take1, then take of one
// when it loses a race), half of those jumping and half reading an instant
// in the cursor's own millisecond (as a caller does while the cursor is
// ahead of the clock). No position twice, and the block's minted count is
// exact. (The client test above cannot make every call a jump: the client
// reads Go's monotonic clock only.)
func TestBlockTakesRacingOnJumps(t *testing.T) {
	const goroutines, per, ms = 33, 2000, 100_000 // the block outlasts the jumps
	sb := hourGrant(1<<seqBits, (ms+1)<<seqBits)
	b := newBlock(sb, openLease(), 0, 0)
	b.arm()
	var clock atomic.Int64       // local instant of the next take, ns
	var added, fast atomic.Int64 // positions add1 and take1 took
	out := make([][]int64, goroutines)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for g := range goroutines {
		out[g] = make([]int64, 0, 3*per) // no growth while racing
		wg.Go(func() {
			<-start
			for range per {
				var f, k int64
				var ok bool
				switch g % 3 {
				case 0:
					until := b.until()
					now := (b.cursor() + 1) >> seqBits * nsPerMs // offset 0
					if g%2 == 0 {
						now = clock.Add(nsPerMs)
					}
					k = 1
					switch {
					case now < until:
						if f, ok = b.add1(); ok {
							added.Add(1)
						}
					case now < b.stop.Load():
						if f, ok = b.take1(now); ok {
							fast.Add(1)
						} else {
							f, k, ok = b.take(now, 1)
						}
					}
				case 1:
					f, k, ok = b.take(clock.Add(nsPerMs), 1)
				default:
					f, k, ok = b.take(clock.Add(nsPerMs), 3)
				}
				if !ok {
					t.Errorf("goroutine %d: no position left in a block that outlasts the test", g)
					return
				}
				for p := f; p < f+k; p++ {
					out[g] = append(out[g], p)
				}
			}
		})
	}
	close(start)
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
	if added.Load() == 0 || fast.Load() == 0 {
		t.Fatalf("add1 took %d positions and take1 %d: Next's paths were not both raced", added.Load(), fast.Load())
	}
	t.Logf("add1 took %d positions, take1 %d, of %d", added.Load(), fast.Load(), len(seen))
}

// take1 takes exactly what take(now, 1) would, jumps included, or (only
// when the block has no position left at now) declines and changes
// nothing: from a cursor behind, at and ahead of the clock's floor, at the
// block's last position and past its end.
func TestTake1IsTakeOfOne(t *testing.T) {
	const lo, hi = 10 << seqBits, 12 << seqBits
	sb := hourGrant(lo, hi)
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

// until is the instant the clock leaves the cursor's millisecond: a
// clock reading before it means the next position is not behind the
// clock's floor (take1 takes it as it is), one at or after it means take1
// would jump; capped by stop, and 0 once no position is left. Checked on
// both sides of every boundary, with a service clock offset that is not a
// whole millisecond.
func TestUntilIsTheCursorsMillisecond(t *testing.T) {
	const lo, hi = 10 << seqBits, 14 << seqBits
	sb := hourGrant(lo, hi)
	sb.ServiceTime = snowflake.Epoch.Add(3*time.Millisecond + 12345)
	l := openLease()
	for _, cursor := range []int64{lo - 1, lo, lo + 4094, lo + 4095, 11<<seqBits + 7, hi - 2, hi - 1} {
		b := newBlock(sb, l, 0, 0)
		b.arm()
		if cursor >= lo {
			b.state.Store(advance(0, 0, cursor-lo+1))
		}
		until := b.until()
		if cursor == hi-1 {
			if until != 0 {
				t.Fatalf("cursor at the last position: until %d, want 0", until)
			}
			continue
		}
		for _, now := range []int64{until - nsPerMs, until - 1, until, until + 1, until + nsPerMs} {
			next := cursor + 1
			if asIs := next >= b.floorL(now); asIs != (now < until) {
				t.Fatalf("cursor %d, now %d: until %d says as-is %v, floorL %d says %v", cursor, now, until, now < until, b.floorL(now), asIs)
			}
		}
		// stop caps it.
		b.stop.Store(until - 5)
		if got := b.until(); got != until-5 {
			t.Fatalf("cursor %d with stop %d: until %d, want the stop", cursor, until-5, got)
		}
	}
}

// add1 takes what take1 would whenever the clock reading is before until,
// and past the block's end it fails, its adds counted beyond hi-lo without
// reaching skipped: minted and the cursor stay exact, sealing and take
// still see the block as used up. A block of maxSpan positions has room
// for a billion such adds.
func TestAdd1(t *testing.T) {
	const lo, hi = 10 << seqBits, 12 << seqBits
	sb := hourGrant(lo, hi)
	l := openLease()
	a, b := newBlock(sb, l, 0, 0), newBlock(sb, l, 0, 0)
	a.arm()
	b.arm()
	now := int64(9 * nsPerMs)
	jumps := 0
	for i := 0; ; i++ {
		if now >= a.until() {
			now += nsPerMs / 3 // take1 jumps from here: let both follow
			if p, ok1 := a.take1(now); ok1 {
				if q, _, ok2 := b.take(now, 1); !ok2 || p != q {
					t.Fatalf("take %d: take1 %d, take %d (%v)", i, p, q, ok2)
				}
				jumps++
				continue
			}
			break
		}
		p, ok1 := a.add1()
		q, ok2 := b.take1(now)
		if p != q || ok1 != ok2 || a.state.Load() != b.state.Load() {
			t.Fatalf("take %d at %d: add1 %d (%v), take1 %d (%v); states %x, %x", i, now, p, ok1, q, ok2, a.state.Load(), b.state.Load())
		}
		if !ok1 {
			break
		}
		// 1,000 IDs/ms (the cursor falls behind the clock's floor, take1
		// jumps at 11 ms) until 11.5 ms, then 20,000 IDs/ms to the end.
		if now < 23*nsPerMs/2 {
			now += 1000
		} else {
			now += 50
		}
	}
	if a.cursor() != hi-1 || a.minted() != b.minted() || jumps == 0 {
		t.Fatalf("used up: cursor %d, minted %d, %d jumps; want %d, %d and some", a.cursor(), a.minted(), jumps, hi-1, b.minted())
	}

	// Past the end: 64 racing callers, 1,000 adds each.
	minted := a.minted()
	var wg sync.WaitGroup
	for range 64 {
		wg.Go(func() {
			for range 1000 {
				if p, ok := a.add1(); ok {
					t.Errorf("add1 past the end took %d", p)
					return
				}
			}
		})
	}
	wg.Wait()
	if used(a.state.Load()) != hi-lo+64_000 || skipped(a.state.Load()) != skipped(b.state.Load()) {
		t.Fatalf("after 64,000 adds past the end: used %d skipped %d, want %d and %d",
			used(a.state.Load()), skipped(a.state.Load()), hi-lo+64_000, skipped(b.state.Load()))
	}
	if a.minted() != minted || a.cursor() != hi-1 || a.left(now) != 0 || !a.finished(now) {
		t.Fatalf("after adds past the end: minted %d cursor %d left %d finished %v", a.minted(), a.cursor(), a.left(now), a.finished(now))
	}
	a.seal()
	if _, _, ok := a.take(now, 1); ok || a.minted() != minted || skipped(a.state.Load()) != skipped(b.state.Load()) {
		t.Fatalf("sealed after adds past the end: take ok %v, minted %d, skipped %d", ok, a.minted(), skipped(a.state.Load()))
	}

	// The largest block, used up: 2^30 adds past its end still leave
	// skipped alone.
	big := newBlock(hourGrant(lo, lo+maxSpan+1), l, 0, 0)
	big.state.Store(advance(0, 0, maxSpan))
	big.state.Add(1<<30 - 1)
	if p, ok := big.add1(); ok || skipped(big.state.Load()) != 0 || big.minted() != maxSpan {
		t.Fatalf("maxSpan block 2^30 adds past its end: add1 %d (%v), skipped %d, minted %d", p, ok, skipped(big.state.Load()), big.minted())
	}
}

// A block counts what it hands out exactly at every step: takes, jumps
// over a gap, and sealing, which counts the rest as skipped so no take
// succeeds after it.
func TestBlockCountsExactly(t *testing.T) {
	const lo, hi = 10 << seqBits, 13 << seqBits
	sb := hourGrant(lo, hi)
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
	var e Engine
	// Next reads e.more, then the first lane's cur and origin (its clock).
	if end := unsafe.Offsetof(e.lane) + unsafe.Offsetof(e.lane.origin) + unsafe.Sizeof(e.lane.origin); unsafe.Offsetof(e.more) != 0 || end > 64 {
		t.Fatalf("Engine's hot fields (more at %d) end at byte %d: past the first cache line", unsafe.Offsetof(e.more), end)
	}
	t.Logf("Engine is %d bytes", unsafe.Sizeof(e))
}
