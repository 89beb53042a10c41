package rangeclient

import (
	"sync/atomic"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

const (
	seqBits   = snowflake.SequenceBits
	seqMask   = snowflake.MaxSequence
	timeShift = snowflake.SequenceBits + snowflake.WorkerBits + snowflake.RegionBits
	nsPerMs   = 1_000_000
)

// block is one granted [lo, hi) of a code's linear space plus what the hot
// path needs to follow the service's time. Everything but the atomics is
// immutable after newBlock.
type block struct {
	// The fields Next reads come first and fill one cache line: block's
	// size is a multiple of 64 bytes (blockPad), so the allocator's size
	// class starts every block on a line boundary, and a call after an
	// interrupt has flushed the caches misses one line of the block, not
	// two.

	// cursor is the L of the last ID handed out (lo-1 before the first).
	// It only grows: every successful CAS moves it forward.
	cursor atomic.Int64
	// skipped counts linear positions jumped over by the time-following
	// cursor (gaps); minted = (cursor - (lo-1)) - skipped. It changes only
	// on a jump (at most once per millisecond), never per ID, and is added
	// before the cursor moves, so minted never over-counts.
	skipped atomic.Int64

	hi   int64 // exclusive end
	base int64 // region<<20 | worker<<12, or'ed into every ID
	// offset turns a local monotonic reading into the service's time:
	// service ns since the epoch = now + offset (ServiceTime at grant +
	// local time elapsed since the reply arrived; for a merged block, since
	// the request was sent: see merge).
	offset int64
	// validUntil is the local monotonic instant the block stops being
	// usable: the sent time of the request plus (ValidUntil - ServiceTime).
	// Measuring from the send (not the arrival) errs on the early side.
	validUntil int64
	// kickAt: once the cursor reaches it, the hot path wakes the refill
	// loop (the ID-based prefetch trigger).
	kickAt int64
	lease  *leaseState

	lo           int64
	sent, arrive int64 // local monotonic instants of request and reply
	seg          segment.Block
	kicked       atomic.Bool

	_ [blockPad]byte
}

// blockPad brings block to a multiple of 64 bytes (TestBlockLayout checks
// it, and that the hot fields share the first line).
const blockPad = 15

func newBlock(sb segment.Block, l *leaseState, sent, arrive int64) *block {
	b := &block{
		hi:         sb.Hi,
		base:       int64(sb.Region)<<(snowflake.SequenceBits+snowflake.WorkerBits) | int64(sb.Worker)<<snowflake.SequenceBits,
		offset:     sb.ServiceTime.Sub(snowflake.Epoch).Nanoseconds() - arrive,
		validUntil: sent + sb.ValidUntil.Sub(sb.ServiceTime).Nanoseconds(),
		kickAt:     sb.Hi, // set properly by the refill loop
		lease:      l,
		lo:         sb.Lo,
		sent:       sent,
		arrive:     arrive,
		seg:        sb,
	}
	b.cursor.Store(sb.Lo - 1)
	return b
}

// merge returns one block for a, followed by the contiguous grant b, or nil
// when they cannot be one: b must follow a exactly ([a.lo, a.hi) then
// [a.hi, b.hi)) under the same lease, and a must not have minted yet (only
// the buffered next block is ever merged; the hot path mints from the
// current one).
//
// The merged block is valid until b's validity ends, and its time floor
// runs on the send-time offset (ServiceTime - sent) of whichever grant is
// later: that reading of the service clock is never behind either grant's
// own, so the floor passes a.hi no later than a's validity ends, and no
// position of a is handed out after a itself would have stopped.
func merge(a, b *block) *block {
	if a == nil || b == nil || a.lease != b.lease || a.hi != b.lo ||
		a.cursor.Load() != a.lo-1 || a.skipped.Load() != 0 {
		return nil
	}
	sb := b.seg
	sb.Lo = a.seg.Lo
	m := newBlock(sb, b.lease, b.sent, b.arrive)
	m.offset = max(sendOffset(a), sendOffset(b))
	m.validUntil = max(a.validUntil, b.validUntil)
	return m
}

// sendOffset is the service clock offset of b measured from the request's
// send time: ahead of (never behind) the reading offset gives.
func sendOffset(b *block) int64 {
	return max(b.offset, b.seg.ServiceTime.Sub(snowflake.Epoch).Nanoseconds()-b.sent)
}

// floorL is the first linear position of the service millisecond at local
// monotonic instant now: t<<12 with t = service time in ms.
func (b *block) floorL(now int64) int64 {
	return ((now + b.offset) / nsPerMs) << seqBits
}

// takeNext is the common case of take(now, 1), small enough to inline
// into Next: the position right after the cursor, when the service's
// millisecond at now has not passed it and the block still has it, taken
// with one compare-and-swap. It reports false otherwise (the cursor must
// jump to the clock, another call took the position first, or the block is
// at its end), and the caller goes to take, which handles every case.
func (b *block) takeNext(now int64) (int64, bool) {
	cur := b.cursor.Load()
	l := cur + 1
	return l, l >= b.floorL(now) && l < b.hi && b.cursor.CompareAndSwap(cur, l)
}

// take reserves up to n consecutive positions starting at
// max(cursor+1, t<<12), all below hi, with one compare-and-swap.
func (b *block) take(now, n int64) (first, k int64, ok bool) {
	tl := b.floorL(now)
	for {
		cur := b.cursor.Load()
		f := cur + 1
		if tl > f {
			f = tl
		}
		if f >= b.hi {
			return 0, 0, false
		}
		k := min(n, b.hi-f)
		gap := f - cur - 1
		if gap != 0 {
			b.skipped.Add(gap)
		}
		if b.cursor.CompareAndSwap(cur, f+k-1) {
			return f, k, true
		}
		if gap != 0 {
			b.skipped.Add(-gap)
		}
	}
}

// id is the ID at linear position l of the block's code.
func (b *block) id(l int64) snowflake.ID {
	return snowflake.ID(l>>seqBits<<timeShift | b.base | l&seqMask)
}

// finished reports whether no position can be taken any more at now: the
// block's validity ended, the cursor reached hi, or service time passed
// the millisecond of hi-1 (the rest of the block is a gap).
func (b *block) finished(now int64) bool {
	if now >= b.validUntil {
		return true
	}
	return max(b.cursor.Load()+1, b.floorL(now)) >= b.hi
}

// left is how many positions can still be taken at now.
func (b *block) left(now int64) int64 {
	if now >= b.validUntil {
		return 0
	}
	return max(0, b.hi-max(b.cursor.Load()+1, b.floorL(now)))
}

// seal ends the block: no take succeeds afterwards, so a caller still
// holding a pointer to it cannot mint once it was retired. The positions
// left are counted as skipped, so minted stays exact.
func (b *block) seal() {
	for {
		cur := b.cursor.Load()
		if cur >= b.hi-1 {
			return
		}
		gap := b.hi - 1 - cur
		b.skipped.Add(gap)
		if b.cursor.CompareAndSwap(cur, b.hi-1) {
			return
		}
		b.skipped.Add(-gap)
	}
}

// minted is how many IDs were handed out from the block. It is exact when
// no call is in flight on the block and never too high while calls run
// (the cursor is read before the gap count that precedes it).
func (b *block) minted() int64 {
	cur := b.cursor.Load()
	return max(0, cur-(b.lo-1)-b.skipped.Load())
}
