package store

import (
	"context"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// This file holds the Store's own check of the invariant every grant rests
// on: a code's high-water mark only grows. The storage's compares keep it
// among the writers that go through a Store; the check here catches a
// store that went back behind every Store's back (restored without a
// restore fence, written with etcdctl, a bug), which the compares cannot
// see: a lowered mark is simply a new value with a new revision.
//
// Per code the Store remembers the highest mark it has committed or read
// (its floor). A mark read afterwards that is below the floor as it was
// when the read was sent means the store went back: the Store refuses to
// grant on the code (ErrHighWaterRegressed) rather than hand out a block
// that could overlap one it already granted. The floor is kept for the
// Store's life (forget drops only the view cache), never raised by a commit
// whose outcome is unknown, and lives in memory: a restarted replica starts
// without one (its restart floor, below, keeps it from granting over a
// block granted before it started; the region's revision check and the
// restore fence cover a restore that a restart would hide).
//
// Why "as it was when the read was sent": reads are linearizable, so a read
// sent after the Store learnt a mark returns that mark or a higher one
// unless the store went back. A read sent before another call of the Store
// raised the floor may legitimately return less; it proves nothing, and the
// storage's compares keep it from being granted on.

// The restart floor. The floor above lives in memory, so a replica that
// restarts has none, and cannot tell a mark that was lowered while it was
// down from one that was never higher. What it can prove without reading
// anything is an upper bound on every block granted before it started: a
// grant at service time n ends at or below (n + MaxLead)<<12 (the lead
// limit of Policy.Plan), and a grant made before this replica started was
// made at a clock reading at most the replica's own reading at its start
// (Config.StartedAt) plus the region's clock-skew bound. So with
// Config.RestartFloor every grant of the Store starts at or above
//
//	restartFloor = (ms(StartedAt) + MaxLead + MaxClockSkew + 1 ms)<<12
//
// (1 ms covers the rounding of the readings to whole milliseconds) and
// cannot overlap a block granted before the restart, whatever the stored
// mark says. A mark at or above the floor is used as it is; the first grant
// on a code that lies below it raises the mark past it, so the floor costs
// a jump of the code's timestamps of about MaxLead (they stay within the
// lead: the grant waits, as backpressure, until the clock allows it).
//
// Every code the replica first grants on after its start is thus at the
// lead, where a grant needs three quarters of the request to fit
// (Policy.MinGrantPercent): up to 7.5 s of waiting for the largest block,
// first for the first block and again when it runs out. Until its clock
// reaches the floor, the Store asks only restartGrantPercent of a request:
// the first grant comes about MaxClockSkew plus a tenth of the request's
// span after the start, and later ones whenever another tenth fits, at
// most one grant per tenth of a request's span, for MaxLead after a start.

// restartGrantPercent is the least share of a request a grant carries
// while the Store's clock is below its restart floor.
const restartGrantPercent = 10

// restartPolicy is the grant rule in force at now: the configured one, with
// the least share lowered to restartGrantPercent while now is below the
// restart floor.
func (s *Store) restartPolicy(now time.Time) segment.Policy {
	p := s.cfg.Policy
	if s.startFloor > 0 && snowflake.MsSince(now)<<snowflake.SequenceBits < s.startFloor && p.MinGrantPercent > restartGrantPercent {
		p.MinGrantPercent = restartGrantPercent
	}
	return p
}

// RestartFloor is the service time below which the Store grants nothing
// since its start (Config.RestartFloor): every ID it grants until its
// clock gets there is dated at or after it. Zero without a restart floor.
func (s *Store) RestartFloor() time.Time {
	if s.startFloor == 0 {
		return time.Time{}
	}
	return snowflake.MsTime(s.startFloor >> snowflake.SequenceBits)
}

// restartFloor is the restart floor (as L) of a Store started at now.
func restartFloor(now time.Time, maxLead, skew time.Duration) int64 {
	ms := snowflake.MsSince(now) + maxLead.Milliseconds() + (skew + time.Millisecond - 1).Milliseconds() + 1
	return min(max(ms, 0)<<snowflake.SequenceBits, segment.EndL)
}

// floorMark is what a Store remembers of one code's high-water mark.
type floorMark struct {
	hwm       int64 // highest mark committed or read; only grows
	regressed bool  // a read fell below the floor and none has reached it since
}

// floorOf is the floor of a code now: take it before sending a read whose
// mark seeHighWater then checks.
func (s *Store) floorOf(region, worker int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.floors[[2]int{region, worker}].hwm
}

// regionFloors is floorOf for every code of region.
func (s *Store) regionFloors(region int) (out [snowflake.MaxWorker + 1]int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for w := range out {
		out[w] = s.floors[[2]int{region, w}].hwm
	}
	return out
}

// atFloor reports whether hwm is at or above the code's floor now (for a
// cached view: below it, the view is older than what the Store knows).
func (s *Store) atFloor(region, worker int, hwm int64) bool {
	return hwm >= s.floorOf(region, worker)
}

// raiseFloor records hi as committed for a code (a grant's commit that
// succeeded; never one whose outcome is unknown).
func (s *Store) raiseFloor(region, worker int, hi int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]int{region, worker}
	if m := s.floors[k]; hi > m.hwm {
		m.hwm = hi
		s.floors[k] = m
	}
}

// seeHighWater checks hwm, a code's mark as read from the storage (0 when
// the entry is absent; key names the entry, "" when absent), against
// before, the code's floor when the read was sent. Below it, the store went
// back: the code is refused and the error wraps ErrHighWaterRegressed (the
// Observer and the log hear of it once, when the code becomes refused). At
// or above the current floor, hwm becomes the floor and a refusal ends.
func (s *Store) seeHighWater(region, worker int, before, hwm int64, key string) error {
	k := [2]int{region, worker}
	s.mu.Lock()
	m := s.floors[k]
	if hwm < before {
		first := !m.regressed
		m.regressed = true
		s.floors[k] = m
		if first {
			s.obs.HighWaterRegressed(region, worker, before, hwm)
		}
		s.mu.Unlock()
		err := regressedErr(region, worker, before, hwm, key)
		if first {
			s.log.Error("high-water mark went back; no grant on the code until it is lifted again",
				"region", region, "worker", worker, "floor", before, "stored", hwm, "err", err)
		}
		return err
	}
	recovered := false
	if hwm >= m.hwm {
		recovered = m.regressed
		s.floors[k] = floorMark{hwm: hwm}
		if recovered {
			s.obs.HighWaterRecovered(region, worker)
		}
	}
	s.mu.Unlock()
	if recovered {
		s.log.Warn("high-water mark at or above the floor again; grants on the code resume",
			"region", region, "worker", worker, "floor", m.hwm, "stored", hwm)
	}
	return nil
}

// regressedErr is the one-line refusal of a code whose stored mark (hwm,
// under key) is below floor.
func regressedErr(region, worker int, floor, hwm int64, key string) error {
	where := "key " + key
	if key == "" {
		where = "no key: deleted, read as 0"
	}
	return errors.Newf("region %d worker %d: stored high-water mark %d (%s) is below %d, which this replica "+
		"already committed or read: the store went back (restored without a restore fence, or written by hand); "+
		"no grant on this code until it is lifted again (rangesvc admin restore-fence): %w",
		region, worker, hwm, where, floor, segment.ErrHighWaterRegressed)
}

// Watching the marks. A Store checks a mark when it reads it, and a replica
// reads a code it does not grant on only in its scans (free codes, every
// few seconds): a mark raised by another replica and lowered again between
// two scans was never seen high, so the lowering went unnoticed (issue 35).
// WatchHighWaters closes that gap: every write of a mark is checked as it
// happens, against the value the same stream showed before it (a value at
// an earlier revision: marks only grow, so a smaller one means the store
// went back), and raises the floor like a read, so the replica refuses the
// code from then on.

// watchRetry bounds the wait before WatchHighWaters reads the region again
// after its watch broke.
const (
	watchRetryMin = 100 * time.Millisecond
	watchRetryMax = 5 * time.Second
)

// WatchHighWaters checks every high-water mark of region that w reports,
// until ctx ends (it returns ctx's error): it reads the region's marks
// (checked as any read), then watches from that read's revision, and each
// change is checked against the mark the stream showed before: below it
// the code is refused and reported (ErrHighWaterRegressed, the Observer,
// the log) as if a grant's read had found it; at or above the floor it
// becomes the floor. When the watch breaks (compaction, a lost
// connection) it reads again, after a pause that grows to 5 s. Run it in
// its own goroutine; w is normally the Store's own storage (etcdstore).
func (s *Store) WatchHighWaters(ctx context.Context, region int, w HighWaterWatcher) error {
	if err := validRegion(region); err != nil {
		return err
	}
	wait := watchRetryMin
	for {
		start := time.Now()
		rev, last, err := s.checkRegionMarks(ctx, region)
		if err == nil {
			err = w.WatchHighWaters(ctx, region, rev, func(worker int, e Entry) {
				s.seeWatched(region, worker, &last[worker], e)
			})
		}
		if time.Since(start) > watchRetryMax {
			wait = watchRetryMin // it ran a while: a new break, not a failing retry
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		s.log.Warn("high-water watch interrupted; reading the marks again", "region", region, "err", err, "retry_in", wait)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return ctx.Err()
		case <-t.C:
		}
		wait = min(2*wait, watchRetryMax)
	}
}

// checkRegionMarks reads every mark of region and checks each against the
// floor, as any read; it returns the read's revision and the marks read (0
// for an absent or corrupt one).
func (s *Store) checkRegionMarks(ctx context.Context, region int) (int64, [snowflake.MaxWorker + 1]int64, error) {
	var last [snowflake.MaxWorker + 1]int64
	floors := s.regionFloors(region)
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return 0, last, Unavailable(err, "region %d: read the high-water marks", region)
	}
	for w, e := range rv.HighWaters {
		hwm, err := DecodeHighWater(e.Value)
		if err != nil {
			continue // reported by the reads that would use it
		}
		last[w] = hwm
		_ = s.seeHighWater(region, w, floors[w], hwm, e.Key) // a refusal is reported there
	}
	for w := range last {
		if _, ok := rv.HighWaters[w]; !ok {
			_ = s.seeHighWater(region, w, floors[w], 0, "")
		}
	}
	return rv.Rev, last, nil
}

// seeWatched checks e, a change of a code's mark from the watch, against
// *last, the mark the stream showed before it, and keeps it as the next
// one's.
func (s *Store) seeWatched(region, worker int, last *int64, e Entry) {
	var hwm int64
	key := ""
	if e.Value != nil {
		h, err := DecodeHighWater(e.Value)
		if err != nil {
			s.reportCorrupt(e.Key, errors.Newf("key %s: %w", e.Key, err))
			return
		}
		hwm, key = h, e.Key
	}
	_ = s.seeHighWater(region, worker, *last, hwm, key) // a refusal is reported there
	*last = hwm
}
