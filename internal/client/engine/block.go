package engine

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
// path needs to follow the service's time. Everything but state, stop and
// kicked is immutable once the client publishes the block.
type block struct {
	// The fields Next reads come first and fill one cache line: block's
	// size is a multiple of 64 bytes (blockPad), so the allocator's size
	// class starts every block on a line boundary, and a call after an
	// interrupt has flushed the caches misses one line of the block, not
	// two.

	// state holds the block's two counters in one word, so that one
	// compare-and-swap moves both and every load sees them consistent:
	//
	//	bits  0-31: used, the positions passed: taken or jumped over; the
	//	            cursor (the L of the last ID handed out) is lo-1+used
	//	bits 32-63: skipped, the positions the time-following cursor jumped
	//	            over (gaps)
	//
	// minted = used - skipped, used counted up to hi-lo. Both only grow.
	// skipped never exceeds hi-lo; used passes it only by the adds of
	// callers that found the block with a position left and lost it to
	// others (add1): at most one per caller in flight. hi-lo <= maxSpan
	// leaves both halves room for that.
	state atomic.Uint64
	lo    int64
	hi    int64 // exclusive end
	base  int64 // region<<20 | worker<<12, or'ed into every ID
	// offset turns a local monotonic reading into the service's time:
	// service ns since the epoch = now + offset (ServiceTime at grant +
	// local time elapsed since the reply arrived; for a merged block, since
	// the request was sent: see merge).
	offset int64
	// stop is the local instant from which the hot path no longer mints
	// from the block: min(validUntil, the lease's safety deadline) as of
	// when the client published the block or last renewed the lease, so
	// that Next checks both in this cache line instead of following the
	// lease pointer. It is 0 (never usable) until Client.install arms it,
	// and it is never above min(validUntil, lease deadline): the deadline
	// only moves forward until the lease is killed, and the client seals
	// every block of a lease before it kills the lease (Client.killLease).
	stop atomic.Int64
	// kickAt: once the cursor reaches it, the hot path wakes the refill
	// loop (the ID-based prefetch trigger), once: kicked says it did. From
	// kickAt on every Next reads kicked, so it shares this line too.
	kickAt int64
	kicked atomic.Bool

	// validUntil is the local monotonic instant the block stops being
	// usable: the sent time of the request plus (ValidUntil - ServiceTime).
	// Measuring from the send (not the arrival) errs on the early side.
	validUntil   int64
	lease        *leaseState
	sent, arrive int64 // local monotonic instants of request and reply
	seg          segment.Block

	_ [blockPad]byte
}

// blockPad brings block to a multiple of 64 bytes (TestBlockLayout checks
// it, and that the hot fields share the first line).
const blockPad = 15

// maxSpan is the most positions a block holds: half of what state's 32-bit
// halves can count, so that the adds past the end (see state) have 2^31 of
// room. It is 8.7 minutes of one code's time, far above one grant
// (segment.MaxBlockLimit is 100 s) and above the reserve a merged block
// holds (the refill loop keeps it within maxReserveAhead); newBlock keeps
// the first maxSpan positions of anything longer all the same.
const maxSpan = 1<<31 - 1

// used and skipped are the two halves of a state word.
func used(s uint64) int64    { return int64(uint32(s)) }
func skipped(s uint64) int64 { return int64(s >> 32) }

// advance is state word s after a take that jumps gap positions and then
// takes k: used grows by gap+k, skipped by gap.
func advance(s uint64, gap, k int64) uint64 { return s + uint64(gap+k) + uint64(gap)<<32 }

// newBlock is the block for grant sb. Should sb ever hold more than maxSpan
// positions, the block keeps the first maxSpan of them: the rest is never
// minted, which is safe (a position not used is never used by anyone
// else).
func newBlock(sb segment.Block, l *leaseState, sent, arrive int64) *block {
	hi := min(sb.Hi, sb.Lo+maxSpan)
	return &block{
		lo:         sb.Lo,
		hi:         hi,
		base:       int64(sb.Region)<<(snowflake.SequenceBits+snowflake.WorkerBits) | int64(sb.Worker)<<snowflake.SequenceBits,
		offset:     sb.ServiceTime.Sub(snowflake.Epoch).Nanoseconds() - arrive,
		validUntil: sent + sb.ValidUntil.Sub(sb.ServiceTime).Nanoseconds(),
		kickAt:     hi, // set properly by the refill loop
		lease:      l,
		sent:       sent,
		arrive:     arrive,
		seg:        sb,
	}
}

// cursor is the L of the last ID handed out from the block (lo-1 before
// the first).
func (b *block) cursor() int64 { return b.lo - 1 + b.passed(b.state.Load()) }

// passed is used in state word s, counted up to the block's end (add1 may
// have passed it).
func (b *block) passed(s uint64) int64 { return min(used(s), b.hi-b.lo) }

// arm raises stop to min(validUntil, the lease's deadline now). The client
// calls it under its mutex when it publishes the block and after each
// renewal of the block's lease; killLease seals blocks under the same
// mutex before it kills a lease, so an armed block is never usable past
// its lease.
func (b *block) arm() {
	raise(&b.stop, min(b.validUntil, b.lease.deadline.Load()))
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
	if a == nil || b == nil || a.lease != b.lease || a.hi != b.lo || a.state.Load() != 0 ||
		a.offset == denseOffset || b.offset == denseOffset { // shared runs are not merged
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

// until is the local instant before which the next position can be
// taken as it is, with no jump to the clock: the end of its service
// millisecond (the instant floorL passes it), capped by stop; 0 when no
// position is left. It reads no clock, so Next calls it before reading
// the clock, and only a comparison waits for the reading (see add1).
func (b *block) until() int64 {
	next := b.lo + used(b.state.Load())
	if next >= b.hi {
		return 0
	}
	return min(b.stop.Load(), ((next>>seqBits)+1)*nsPerMs-b.offset)
}

// add1 takes the next position with one atomic add, for a caller whose
// clock reading came before until(). The cursor only moves forward, so
// the position is at or after the one until saw: in the clock's
// millisecond or ahead of it, where take1 would have taken it too. It
// reports false past the block's end; such an add is counted in used
// beyond hi-lo (see state), and callers that come later find until() 0.
func (b *block) add1() (int64, bool) {
	l := b.lo - 1 + used(b.state.Add(1))
	return l, l < b.hi
}

// take1 is take(now, 1) in a single compare-and-swap attempt, with no
// loop and no branch for a jump to the clock (the state word moves the
// cursor and the gap count together), so that it inlines into Next: keep it
// under the compiler's inlining budget (cost 77 of 80 with Go 1.26; see
// `go build -gcflags=-m=2 ./internal/client/engine`). It reports false when the block
// has no position left at now or another call moved the block first; the
// caller then goes to take, which retries.
func (b *block) take1(now int64) (int64, bool) {
	s := b.state.Load()
	next := b.lo + used(s)
	l := max(next, b.floorL(now))
	return l, l < b.hi && b.state.CompareAndSwap(s, advance(s, l-next, 1))
}

// take reserves up to n consecutive positions starting at
// max(cursor+1, t<<12), all below hi, with one compare-and-swap: a jump to
// the clock and its gap count move together.
func (b *block) take(now, n int64) (first, k int64, ok bool) {
	return b.takeFrom(b.floorL(now), n)
}

// takeFrom is take with the clock's position given: up to n consecutive
// positions from max(cursor+1, tl), all below hi, in one compare-and-swap.
func (b *block) takeFrom(tl, n int64) (first, k int64, ok bool) {
	for {
		s := b.state.Load()
		next := b.lo + used(s)
		f := max(next, tl)
		if f >= b.hi {
			return 0, 0, false
		}
		k := min(n, b.hi-f)
		if b.state.CompareAndSwap(s, advance(s, f-next, k)) {
			return f, k, true
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
	return max(b.cursor()+1, b.floorL(now)) >= b.hi
}

// left is how many positions can still be taken at now.
func (b *block) left(now int64) int64 {
	if now >= b.validUntil {
		return 0
	}
	return max(0, b.hi-max(b.cursor()+1, b.floorL(now)))
}

// seal ends the block: no take succeeds afterwards, so a caller still
// holding a pointer to it cannot mint once it was retired. The positions
// left are counted as skipped, so minted stays exact.
func (b *block) seal() {
	for {
		s := b.state.Load()
		gap := b.hi - b.lo - used(s)
		if gap <= 0 || b.state.CompareAndSwap(s, advance(s, gap, 0)) {
			return
		}
	}
}

// minted is how many IDs were handed out from the block: exact at every
// instant, since one load reads both counters.
func (b *block) minted() int64 {
	s := b.state.Load()
	return b.passed(s) - skipped(s)
}
