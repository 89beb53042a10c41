package engine

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// overlapper is a misbehaving range service: once armed, it answers the
// next grant with a block over the range of the block it answered before
// (the service still commits the grant it asked for), as a service over a
// store whose high-water mark went back would. While armed, acquisitions
// wait for the test to let them through.
type overlapper struct {
	segment.Allocator

	mu     sync.Mutex
	armed  bool
	gate   chan struct{} // acquisitions wait on it while set
	last   segment.Block // the last block answered
	served []segment.Block
}

// hold makes acquisitions wait until release is called.
func (o *overlapper) hold() (release func()) {
	o.mu.Lock()
	defer o.mu.Unlock()
	gate := make(chan struct{})
	o.gate = gate
	return func() { close(gate) }
}

// arm makes the next grant overlap the one before, and holds acquisitions.
func (o *overlapper) arm() (release func()) {
	o.mu.Lock()
	o.armed = true
	o.mu.Unlock()
	return o.hold()
}

func (o *overlapper) Acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	o.mu.Lock()
	gate := o.gate
	o.mu.Unlock()
	if gate != nil {
		select {
		case <-gate:
		case <-ctx.Done():
			return segment.Lease{}, ctx.Err()
		}
	}
	return o.Allocator.Acquire(ctx, region, owner)
}

func (o *overlapper) Allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	b, err := o.Allocator.Allocate(ctx, l, n)
	if err != nil {
		return b, err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.armed && o.last.Worker == b.Worker && o.last.Hi > 0 {
		o.armed = false
		b.Lo, b.Hi = o.last.Lo, o.last.Lo+min(b.Len(), o.last.Len())
		o.served = append(o.served, b)
	}
	o.last = b
	return b, nil
}

// mintUntil mints one ID at a time with a cancelled context (so a call
// that would wait returns at once), letting the client's loops run
// (synctest.Wait) whenever nothing is buffered, until a call fails with an
// error stop accepts or limit IDs were minted. It returns the IDs and that
// error (nil if limit came first).
func mintUntil(t *testing.T, c *Engine, limit int, stop func(error) bool) ([]snowflake.ID, error) {
	t.Helper()
	var ids []snowflake.ID
	for len(ids) < limit {
		id, err := c.Next(expiredCtx())
		switch {
		case err == nil:
			ids = append(ids, id)
		case stop(err):
			return ids, err
		case errors.Is(err, ErrUnavailable):
			synctest.Wait() // a refill or a new lease is on its way
		default:
			t.Fatalf("Next: %v", err)
		}
	}
	return ids, nil
}

// denseBlocks: 4,096 IDs a block, no reserve. In a synctest bubble the
// clock stands still while the test mints, so each block is minted from
// its first position to its last, and a block over the range of an earlier
// one would mint the same IDs again.
func denseBlocks(cfg *Config) {
	cfg.Tuning.FixedBlock = snowflake.MaxSequence + 1
	cfg.MaxReserve = -1
}

// Issue 24: the service answers a grant with a block over the block it
// granted just before (a high-water mark moved back behind it). The client
// refuses it: no ID is minted from it (with the clock standing still the
// client mints every position of every block, so any would repeat), the
// error is ErrOverlap and segment.ErrCorrupt, the client gives the code
// up without releasing it (it stays leased until its TTL ends) and mints
// on another code.
func TestOverlappingBlockIsRefused(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		ov := &overlapper{Allocator: conn}
		c := startClient(t, Config{Allocator: ov, Region: 1, Owner: t.Name()}, 30*time.Second, denseBlocks)
		old := c.Lease().Lease
		never := func(error) bool { return false }
		ids, _ := mintUntil(t, c, 3*4096, never)

		release := ov.arm()
		more, err := mintUntil(t, c, 20*4096, func(err error) bool { return errors.Is(err, ErrOverlap) })
		ids = append(ids, more...)
		checkUnique(t, ids) // before anything else: an ID minted from the overlap repeats
		if len(ov.served) != 1 {
			t.Fatalf("the service answered %d overlapping blocks, want 1", len(ov.served))
		}
		if !errors.Is(err, ErrOverlap) || !errors.Is(err, segment.ErrCorrupt) || !IsRetryable(err) {
			t.Fatalf("Next after the overlapping block: %v; want ErrOverlap, segment.ErrCorrupt, retryable", err)
		}
		if s := c.Stats(); s.Overlaps != 1 || s.DroppedCodes != 1 || s.Fenced != 0 {
			t.Fatalf("Stats: %d overlaps, %d dropped codes, %d fenced; want 1, 1, 0", s.Overlaps, s.DroppedCodes, s.Fenced)
		}
		if n := conn.Calls(rangeclienttest.Release); n != 0 {
			t.Fatalf("%d Release calls: a code whose blocks overlap must stay leased until its TTL ends", n)
		}
		if _, held := svc.Owner(old.Worker); !held {
			t.Fatalf("code %d was given back", old.Worker)
		}

		release()
		mintsOnAnotherCode(t, c, svc, old, ids)
	})
}

// mintsOnAnotherCode checks that c, which gave old's code up, mints on
// another code, and that no ID of the run (ids, then these) repeats or lies
// outside the service's grants.
func mintsOnAnotherCode(t *testing.T, c *Engine, svc *rangeclienttest.Service, old segment.Lease, ids []snowflake.ID) {
	t.Helper()
	after, err := c.NextN(context.Background(), 3*4096)
	if err != nil {
		t.Fatalf("NextN on the next code: %v", err)
	}
	if nl := c.Lease().Lease; nl.Worker == old.Worker || nl.Token <= old.Token {
		t.Fatalf("lease after code %d was given up: %+v; want another code", old.Worker, nl)
	}
	ids = append(ids, after...)
	checkUnique(t, ids)
	checkInGrants(t, svc, ids)
}

// Issue 24: the operator lowers the high-water mark of the client's code
// behind the service's back; the service's Store refuses the next grant on
// it (segment.ErrHighWaterRegressed). The client does not retry a code that
// cannot be granted: it gives it up (without releasing it) and mints on
// another code, and no ID repeats.
func TestRegressedCodeIsDropped(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		ov := &overlapper{Allocator: conn} // only to hold acquisitions
		c := startClient(t, Config{Allocator: ov, Region: 1, Owner: t.Name()}, 30*time.Second, denseBlocks)
		old := c.Lease().Lease
		ids, _ := mintUntil(t, c, 3*4096, func(error) bool { return false })

		release := ov.hold()
		gs := svc.Grants()
		svc.PutHighWater(old.Worker, gs[len(gs)-1].Lo)
		more, err := mintUntil(t, c, 20*4096, func(err error) bool { return errors.Is(err, segment.ErrHighWaterRegressed) })
		ids = append(ids, more...)
		if !errors.Is(err, segment.ErrHighWaterRegressed) || !errors.Is(err, segment.ErrCorrupt) || !IsRetryable(err) {
			t.Fatalf("Next after the mark went back: %v; want segment.ErrHighWaterRegressed (ErrCorrupt), retryable", err)
		}
		if s := c.Stats(); s.DroppedCodes != 1 || s.Overlaps != 0 {
			t.Fatalf("Stats: %d dropped codes, %d overlaps; want 1, 0", s.DroppedCodes, s.Overlaps)
		}
		if n := conn.Calls(rangeclienttest.Release); n != 0 {
			t.Fatalf("%d Release calls: the dropped code must stay leased until its TTL ends", n)
		}

		release()
		mintsOnAnotherCode(t, c, svc, old, ids)
	})
}

// The record of granted blocks, alone: same lease and newer leases must
// start at or above the last end; a late block of an older lease must end
// at or below the newer lease's first block and moves nothing.
func TestCodeEndsAdmit(t *testing.T) {
	blk := func(lo, hi int64) segment.Block { return segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: hi} }
	e := newCodeEnds()
	steps := []struct {
		b     segment.Block
		token int64
		ok    bool
	}{
		{blk(100, 200), 5, true},
		{blk(200, 300), 5, true},  // adjacent
		{blk(250, 400), 5, false}, // overlaps [200,300)
		{blk(299, 300), 5, false},
		{blk(300, 350), 9, true},  // a newer lease above the old end
		{blk(280, 300), 5, true},  // a late block of the older lease, below the newer one's start
		{blk(290, 310), 5, false}, // ... that reaches into it
		{blk(340, 360), 9, false}, // the newer lease going back into its own block
		{blk(320, 330), 12, false},
		{blk(350, 400), 9, true},
		{segment.Block{Region: 1, Worker: 8, Lo: 1, Hi: 2}, 3, true}, // another code
	}
	for i, s := range steps {
		err := e.admit(s.b, s.token)
		if (err == nil) != s.ok {
			t.Fatalf("step %d: admit([%d,%d), token %d) = %v, want ok %v", i, s.b.Lo, s.b.Hi, s.token, err, s.ok)
		}
		if err != nil && (!errors.Is(err, ErrOverlap) || !errors.Is(err, segment.ErrCorrupt)) {
			t.Fatalf("step %d: %v does not match ErrOverlap and segment.ErrCorrupt", i, err)
		}
	}
}
