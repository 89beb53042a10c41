package engine

import (
	"fmt"
	"time"

	"github.com/idrange/idrange/segment"
)

// Stats are the engine's counters and gauges: rangeclient.Stats, where
// each field is documented, has the same fields (the front converts one
// into the other, so the compiler keeps them in step).
type Stats struct {
	Minted                                          int64
	Refills, RefillErrors, Backpressure, Discarded  uint64
	Stalls, Acquisitions, Renewals, RenewalFailures uint64
	Expiries, Fenced, Overlaps, DroppedCodes        uint64
	Shared                                          bool
	BufferedIDs                                     int64
	BufferedFor                                     time.Duration
	Rate                                            float64
	RefillLatency                                   time.Duration
	NextBlock                                       int
}

// Stats returns a snapshot of the engine's counters, summed over its codes
// (BufferedFor is the shortest of them, RefillLatency the longest).
func (e *Engine) Stats() Stats {
	s := e.laneStats()
	for _, l := range e.more {
		o := l.laneStats()
		s.Minted += o.Minted
		s.Refills += o.Refills
		s.RefillErrors += o.RefillErrors
		s.Backpressure += o.Backpressure
		s.Discarded += o.Discarded
		s.Stalls += o.Stalls
		s.Acquisitions += o.Acquisitions
		s.Renewals += o.Renewals
		s.RenewalFailures += o.RenewalFailures
		s.Expiries += o.Expiries
		s.Fenced += o.Fenced
		s.Overlaps += o.Overlaps
		s.DroppedCodes += o.DroppedCodes
		s.BufferedIDs += o.BufferedIDs
		s.BufferedFor = min(s.BufferedFor, o.BufferedFor)
		s.Rate += o.Rate
		s.RefillLatency = max(s.RefillLatency, o.RefillLatency)
	}
	return s
}

// laneStats is Stats of one lane alone.
func (c *lane) laneStats() Stats {
	now := c.now()
	s := Stats{
		Minted:          c.mintedTotal(),
		Refills:         c.stats.refills.Load(),
		RefillErrors:    c.stats.refillErrors.Load(),
		Backpressure:    c.stats.backpressure.Load(),
		Discarded:       c.stats.discarded.Load(),
		Stalls:          c.stats.stalls.Load(),
		Acquisitions:    c.stats.acquisitions.Load(),
		Renewals:        c.stats.renewals.Load(),
		RenewalFailures: c.stats.renewalFailures.Load(),
		Expiries:        c.stats.expiries.Load(),
		Fenced:          c.stats.fenced.Load(),
		Overlaps:        c.stats.overlaps.Load(),
		DroppedCodes:    c.stats.dropped.Load(),
		Rate:            c.pol.ratePerSec(),
		RefillLatency:   time.Duration(c.pol.latency.Load()),
		NextBlock:       int(c.pol.count.Load()),
	}
	l := c.lease.Load()
	s.Shared = l != nil && l.isShared()
	if l == nil || l.err(now) != nil {
		return s
	}
	var until int64
	for _, b := range []*block{c.cur.Load(), c.next.Load()} {
		if b != nil && b.lease == l && !b.finished(now) {
			s.BufferedIDs += b.left(now)
			until = max(until, b.validUntil-now)
		}
	}
	until = min(until, int64(l.safeFor(now)))
	if s.Rate > 0 {
		until = min(until, int64(float64(s.BufferedIDs)/s.Rate*1e9))
	}
	s.BufferedFor = time.Duration(max(until, 0))
	return s
}

// LeaseInfo describes a lane's current lease: rangeclient.LeaseInfo, where
// each field is documented, has the same fields.
type LeaseInfo struct {
	Lease   segment.Lease
	Shared  bool
	SafeFor time.Duration
	Err     error
}

// Leases returns the current lease of each of the engine's codes (see
// Config.Codes), the first one first.
func (e *Engine) Leases() []LeaseInfo {
	out := make([]LeaseInfo, 0, len(e.more)+1)
	for _, l := range e.lanes() {
		out = append(out, l.leaseInfo())
	}
	return out
}

// Lease returns the current lease of the engine's first code and how long
// it is still safe.
func (e *Engine) Lease() LeaseInfo { return e.lane.leaseInfo() }

// leaseInfo is the lane's current lease and how long it is still safe.
func (c *lane) leaseInfo() LeaseInfo {
	l := c.lease.Load()
	if l == nil {
		return LeaseInfo{Err: ErrLeaseLost}
	}
	now := c.now()
	info := LeaseInfo{Lease: l.seg, Err: l.err(now), Shared: l.isShared()}
	if info.Err == nil && !info.Shared {
		info.SafeFor = l.safeFor(now)
	}
	return info
}

// Health is nil while the client can mint without waiting, else the reason
// it cannot: ErrClosed, the lease's error (ErrLeaseLost, ErrFenced), or
// ErrUnavailable (with the last refill error, if any) when no block is
// buffered. An idle client that let its buffers run out on purpose is
// healthy. With several codes, every one must be healthy (a call may land
// on any). Serve it on a readiness endpoint.
func (e *Engine) Health() error {
	for _, l := range e.more {
		if err := l.laneHealth(); err != nil {
			return err
		}
	}
	return e.laneHealth()
}

// laneHealth is Health of one lane alone.
func (c *lane) laneHealth() error {
	if c.closed.Load() {
		return ErrClosed
	}
	now := c.now()
	l := c.lease.Load()
	if err := l.err(now); err != nil {
		return err
	}
	for _, b := range []*block{c.cur.Load(), c.next.Load()} {
		if b != nil && c.usable(b, l, now) {
			return nil
		}
	}
	if _, rerr := c.waitState(); rerr != nil {
		return mark(fmt.Errorf("rangeclient: no block buffered: %w", rerr), ErrUnavailable)
	}
	if !c.idle(now) {
		return fmt.Errorf("rangeclient: no block buffered; refill in flight: %w", ErrUnavailable)
	}
	return nil
}
