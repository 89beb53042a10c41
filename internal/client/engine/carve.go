package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// codeMask selects the region and worker bits of an ID.
const codeMask = (int64(1)<<timeShift - 1) &^ seqMask

// afterL is the first linear position of the code whose ID bits are base
// (region<<20 | worker<<12) with an ID greater than after: in after's
// millisecond if the code sorts above after's, or after after's sequence
// on the same code, else in the next millisecond. 0 when after is not
// positive.
func afterL(after snowflake.ID, base int64) int64 {
	a := int64(after)
	if a <= 0 {
		return 0
	}
	ms, code := a>>timeShift, a&codeMask
	switch {
	case base > code:
		return ms << seqBits
	case base == code:
		return ms<<seqBits | a&seqMask + 1
	}
	return (ms + 1) << seqBits
}

// carve takes a shared run for r from the client's current block with the
// same compare-and-swap Next uses: each position goes to one caller.
//
// A carve is demand, like a Next: while the client has no usable block or
// lease, or its current block ends (its validity or its lease's deadline)
// within r.MinLife with no next block buffered, the carve counts as a
// waiting caller, so the refill loop asks for a block whether or not the
// client's own Next was called lately (a replica's minter that only
// carves would otherwise let its blocks expire after IdleTimeout and
// never ask again), and it waits for that block within ctx. A run near the
// current block's end is carved from the buffered next block, made current
// first (promoteEarly). A run that cannot be carved otherwise (r.After
// beyond the current block, the lead) is refused at once with an error
// wrapping segment.ErrUnavailable.
//
// It never takes from the next block while it is buffered: that one must
// stay untouched so the reserve can be merged into it (merge), or every
// reserve grant after such a carve would be dropped and asked again.
func (c *lane) carve(ctx context.Context, r carve.Request) (segment.Block, error) {
	waiting := false
	defer func() {
		if waiting {
			c.waiters.Add(-1)
		}
	}()
	for {
		ch, rerr := c.waitState()
		if c.closed.Load() {
			return segment.Block{}, fmt.Errorf("rangeclient: carve: %w: %w", ErrClosed, segment.ErrUnavailable)
		}
		l := c.lease.Load()
		now := c.now()
		if cur := c.cur.Load(); l.err(now) == nil && cur != nil && cur.lease == l && !cur.finished(now) && now < cur.stop.Load() {
			if cur.offset == denseOffset {
				return segment.Block{}, fmt.Errorf("rangeclient: carve: the minter is on the shared path itself: %w", carve.ErrNotCarver)
			}
			sb, ok, err := c.carveFrom(cur, l, now, r)
			switch {
			case ok:
				return sb, nil
			case errors.Is(err, errNearEnd):
				if c.promoteEarly(cur) {
					continue
				}
				// No next block yet: wait for the one asked for below.
			case err != nil:
				return segment.Block{}, err
			default:
				return segment.Block{}, fmt.Errorf("rangeclient: carve: no position after ID %d in the current block [%d,%d) of code %d/%d: %w",
					r.After, cur.lo, cur.hi, l.seg.Region, l.seg.Worker, segment.ErrUnavailable)
			}
		} else if cur != nil {
			c.rotate(cur)
			if c.cur.Load() != cur {
				continue
			}
		}
		if !waiting {
			waiting = true
			c.waiters.Add(1) // before the kick: the plan must see it
		}
		c.kickRefill()
		select {
		case <-ch:
		case <-ctx.Done():
			err := fmt.Errorf("rangeclient: carve: no block: %w", join(ctx.Err(), segment.ErrUnavailable))
			if rerr != nil {
				err = fmt.Errorf("%w (last refill: %v)", err, rerr)
			}
			if lerr := l.err(now); lerr != nil {
				err = fmt.Errorf("%w (lease: %v)", err, lerr)
			}
			return segment.Block{}, err
		}
	}
}

// errNearEnd marks a carve refused because the block's validity ends
// within the run's least life: the next block (buffered, or asked for by
// the waiting carve) serves it. A lease whose safety deadline comes that
// soon is refused without errNearEnd: its renewals are failing, and the
// caller does better at another replica than waiting here.
var (
	errNearEnd     = errors.New("near the end of the block")
	errLeaseEnding = errors.New("near the lease's safety deadline")
)

// promoteEarly makes the buffered next block current before cur ends, when
// there is one under the same lease: a carve refused near cur's end is
// then carved from the next block instead of refused, which every shared
// client asking in the last MinLife of each of the minter's blocks would
// otherwise be, and would stall on. What cur had left is a gap, like the
// rest of any block the clock passed. It reports whether it promoted.
func (c *lane) promoteEarly(cur *block) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	nx := c.next.Load()
	if c.cur.Load() != cur || nx == nil || nx.lease != cur.lease || !c.usable(nx, nx.lease, c.now()) {
		return false
	}
	c.promoteLocked()
	c.broadcastLocked()
	c.kickRefill()
	return true
}

// carveFrom carves r from b at local instant now; ok is false when b has
// no position at or after where the run must start.
func (c *lane) carveFrom(b *block, l *leaseState, now int64, r carve.Request) (_ segment.Block, ok bool, _ error) {
	floor := b.floorL(now)
	tl := max(floor, afterL(r.After, b.base))
	if lead := time.Duration((tl>>seqBits)-(floor>>seqBits)) * time.Millisecond; lead > r.MaxLead {
		// No run above After can start within the lead, here or at any
		// replica, until the clock moves on: the caller waits.
		return segment.Block{}, false, fmt.Errorf("rangeclient: carve: after ID %d is %v ahead of the service clock, beyond the lead %v: %w",
			r.After, lead, r.MaxLead, &segment.Backpressure{RetryAfter: lead - r.MaxLead})
	}
	// The code's own lead: the minter and earlier runs took its positions
	// faster than the clock advances. Beyond r.MaxLead the caller waits
	// (backpressure) rather than get a run dated that far ahead. The
	// cursor may move on before takeFrom, so a run can start at most the
	// runs carved meanwhile beyond the bound.
	if next := b.lo + used(b.state.Load()); next > tl {
		if lead := time.Duration((next>>seqBits)-(floor>>seqBits)) * time.Millisecond; lead > r.MaxLead {
			return segment.Block{}, false, fmt.Errorf("rangeclient: carve: the minter's code %d/%d is %v ahead of the service clock, beyond the lead %v: %w",
				l.seg.Region, l.seg.Worker, lead, r.MaxLead, &segment.Backpressure{RetryAfter: lead - r.MaxLead})
		}
	}
	svcNow := now + b.offset // service ns since the epoch
	stop := b.stop.Load() + b.offset
	if stop-svcNow <= int64(r.MinLife) {
		why := errNearEnd
		if l.deadline.Load()+b.offset-svcNow <= int64(r.MinLife) {
			why = errLeaseEnding
		}
		return segment.Block{}, false, fmt.Errorf("rangeclient: carve: the minter's code %d/%d may be used for %v more, less than %v: %w: %w",
			l.seg.Region, l.seg.Worker, time.Duration(max(stop-svcNow, 0)), r.MinLife, why, segment.ErrUnavailable)
	}
	first, k, ok := b.takeFrom(tl, r.N)
	if !ok {
		return segment.Block{}, false, nil
	}
	if first+k > b.kickAt {
		c.prefetch(b)
	}
	valid := min((first>>seqBits)*nsPerMs+int64(r.ValidFor), stop)
	return segment.Block{
		Region:      l.seg.Region,
		Worker:      l.seg.Worker,
		Lo:          first,
		Hi:          first + k,
		ServiceTime: snowflake.Epoch.Add(time.Duration(svcNow)),
		ValidUntil:  snowflake.Epoch.Add(time.Duration(valid)),
	}, true, nil
}
