package store

import (
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
