package store

import (
	"context"
	"fmt"
	"math/rand/v2"
	"time"

	"errors"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/segment"
)

// Allocate grants a block of up to n L units on l's code. The block is
// computed by Policy.Plan from the code's HWM and the service clock, and is
// returned only after the transaction raising the HWM to its Hi committed,
// fenced by l.Token and the HWM's revision. Errors: ErrInvalid (bad field,
// named), ErrFenced / ErrLeaseLost (l no longer owns the code), ErrCorrupt
// (a stored value of the code does not decode; nothing is written),
// ErrHighWaterRegressed (also ErrCorrupt: the code's stored HWM is below
// one this Store committed or read; nothing is written),
// *Backpressure, ErrEpochExhausted, ErrUnavailable (the storage did not
// answer, or the outcome of the commit is unknown: no block, and the range
// is burned).
func (s *Store) Allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	start := time.Now()
	b, err := s.allocate(ctx, l, n)
	if l.Validate() == nil {
		if err != nil {
			s.obs.GrantFailed(l.Region, l.Worker, err, time.Since(start))
		} else {
			s.obs.Granted(l.Region, l.Worker, b.Len(), time.Since(start))
		}
	}
	return b, err
}

func (s *Store) allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	if err := l.Validate(); err != nil {
		return segment.Block{}, err
	}
	if n < 1 || int64(n) > s.cfg.Policy.MaxBlock {
		return segment.Block{}, fmt.Errorf("count %d not in 1..%d: %w", n, s.cfg.Policy.MaxBlock, segment.ErrInvalid)
	}
	done, err := s.takeTurn(ctx, l.Region, l.Worker)
	if err != nil {
		return segment.Block{}, err
	}
	defer done()
	// A cached view may be stale; it is only trusted as far as the commit's
	// compares go. A stale view that says "not yours" is re-read before it
	// is believed.
	identity := authz.IdentityFrom(ctx)
	v, fromCache := s.cached(l.Region, l.Worker)
	needRead := !fromCache
	var floor int64 // the code's floor when the view v was asked for (not from the cache)
	for conflicts := 0; ; {
		if needRead {
			floor = s.floorOf(l.Region, l.Worker)
			var err error
			if v, err = s.read(ctx, l.Region, l.Worker); err != nil {
				return segment.Block{}, err
			}
			needRead, fromCache = false, false
		}
		if err := s.fence(l, v, identity); err != nil {
			if fromCache {
				needRead = true
				continue
			}
			if !errors.Is(err, segment.ErrPermissionDenied) { // the view is right, and the owner's
				s.forget(l.Region, l.Worker)
			}
			return segment.Block{}, err
		}
		var hwm, hwmRev int64
		var key string
		if v.HighWater != nil {
			h, err := DecodeHighWater(v.HighWater.Value)
			if err != nil {
				s.forget(l.Region, l.Worker)
				err = fmt.Errorf("key %s: %w", v.HighWater.Key, err)
				s.reportCorrupt(v.HighWater.Key, err)
				return segment.Block{}, err
			}
			hwm, hwmRev, key = h, v.HighWater.ModRevision, v.HighWater.Key
		}
		if fromCache {
			if !s.atFloor(l.Region, l.Worker, hwm) {
				needRead = true // older than what the Store has seen since
				continue
			}
		} else if err := s.seeHighWater(l.Region, l.Worker, floor, hwm, key); err != nil {
			s.forget(l.Region, l.Worker)
			return segment.Block{}, err
		}
		now := s.cfg.Now()
		g, err := s.restartPolicy(now).Plan(max(hwm, s.startFloor), now, int64(n))
		if err != nil {
			s.remember(l.Region, l.Worker, v)
			return segment.Block{}, fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, err)
		}
		signal := conflicts >= contentionAfter
		value := []byte(EncodeHighWater(g.Hi))
		floor = s.floorOf(l.Region, l.Worker) // fresh, on a failed compare, is checked against it
		octx, cancel := s.opCtx(ctx)
		sent := time.Now()
		rev, ok, fresh, err := s.commitHighWater(octx, l.Region, l.Worker, HighWaterCommit{
			Value: value, Token: l.Token, OwnerRev: v.Owner.ModRevision,
			HighWaterRev: hwmRev, ContentionRev: v.Contention, Signal: signal,
		})
		rtt := time.Since(sent)
		cancel()
		if err != nil {
			// The write may or may not have committed. [g.Lo, g.Hi) is
			// burned: never returned, and the next call re-reads the HWM.
			s.forget(l.Region, l.Worker)
			return segment.Block{}, Unavailable(err, "allocate region %d worker %d: commit unknown, block [%d,%d) discarded",
				l.Region, l.Worker, g.Lo, g.Hi)
		}
		if ok {
			// Our write is the HWM at rev; the owner entry is unchanged
			// (the compare held).
			hw := &Entry{Key: key, Value: value, ModRevision: rev}
			s.raiseFloor(l.Region, l.Worker, g.Hi)
			s.remember(l.Region, l.Worker, CodeView{Rev: rev, Owner: v.Owner, HighWater: hw, Contention: v.Contention})
			return segment.Block{
				Region: l.Region, Worker: l.Worker, Lo: g.Lo, Hi: g.Hi,
				ServiceTime: g.ServiceTime, ValidUntil: g.ValidUntil,
			}, nil
		}
		// A compare failed: fresh is the view after it. Either l was fenced
		// (the next fence check says so) or another grant won.
		prev := v
		v = fresh
		fromCache = false
		if err := s.fence(l, v, identity); err != nil {
			s.forget(l.Region, l.Worker)
			return segment.Block{}, err
		}
		s.remember(l.Region, l.Worker, v)
		conflicts++
		s.obs.Conflict(l.Region, l.Worker)
		if conflicts >= s.cfg.MaxConflicts {
			return segment.Block{}, fmt.Errorf("allocate region %d worker %d: lost %d races on the high-water mark: %w",
				l.Region, l.Worker, conflicts, segment.ErrUnavailable)
		}
		if sameEntry(prev.HighWater, v.HighWater) && sameEntry(prev.Owner, v.Owner) {
			// Only another replica's contention signal failed us: yield a
			// random one to two round trips so it gets through (if both
			// signalled, the shorter wait wins), then go again.
			select {
			case <-time.After(rtt + rand.N(rtt+time.Millisecond)):
			case <-ctx.Done():
				return segment.Block{}, Unavailable(ctx.Err(), "allocate region %d worker %d: yielding to a contending replica", l.Region, l.Worker)
			}
			needRead = true // the HWM has most likely moved while we slept
		}
	}
}
