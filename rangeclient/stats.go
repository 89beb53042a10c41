package rangeclient

import (
	"fmt"
	"time"

	"github.com/idrange/idrange/segment"
)

// Stats are the client's counters and gauges, for tests and operators. The
// same values are exported as Prometheus metrics when Config.Registerer is
// set.
type Stats struct {
	Minted          int64  // IDs handed out
	Refills         uint64 // blocks granted
	RefillErrors    uint64 // failed grant requests (not counting backpressure)
	Backpressure    uint64 // grants refused with segment.ErrBackpressure
	Discarded       uint64 // granted blocks dropped unused (lease changed, expired on arrival)
	Stalls          uint64 // Next/NextN calls that had to wait for a block
	Acquisitions    uint64 // leases acquired
	Renewals        uint64 // successful renewals
	RenewalFailures uint64 // failed renewals (including fenced replies)
	Expiries        uint64 // safety deadlines passed without a renewal
	Fenced          uint64 // leases fenced by the service
	Overlaps        uint64 // granted blocks refused: they overlap one the client had (ErrOverlap)
	DroppedCodes    uint64 // leases given up: overlap, or the service's segment.ErrHighWaterRegressed
	// Shared is true while the client mints from shared runs (Config.Codes
	// 0) instead of a worker code of its own.
	Shared bool

	BufferedIDs   int64         // positions left in the current and next block
	BufferedFor   time.Duration // how long they last at the observed rate
	Rate          float64       // IDs/s, EWMA over RefillInterval
	RefillLatency time.Duration // EWMA of grant round trips
	NextBlock     int           // size the next request asks for
}

// Stats returns a snapshot of the client's counters, summed over its codes
// (BufferedFor is the shortest of them, RefillLatency the longest).
func (c *Client) Stats() Stats {
	s := c.laneStats()
	for _, l := range c.lanes {
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

// laneStats is Stats of the client's first code alone.
func (c *Client) laneStats() Stats {
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

// LeaseInfo describes the client's current worker-code lease.
type LeaseInfo struct {
	Lease segment.Lease // the code, token and etcd lease; zero before the first
	// Shared is true while the client mints from shared runs and holds no
	// code: Lease is then zero but for its Region, and SafeFor is 0.
	Shared bool
	// SafeFor is the time left before the local safety deadline (0 once
	// past it or when the lease is dead).
	SafeFor time.Duration
	// Err is nil while the lease may be used, else why not (ErrLeaseLost,
	// ErrFenced, ErrClosed).
	Err error
}

// Leases returns the current lease of each of the client's codes (see
// Config.Codes), the first one first.
func (c *Client) Leases() []LeaseInfo {
	out := []LeaseInfo{c.Lease()}
	for _, l := range c.lanes {
		out = append(out, l.Lease())
	}
	return out
}

// Lease returns the current lease of the client's first code and how long
// it is still safe.
func (c *Client) Lease() LeaseInfo {
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
func (c *Client) Health() error {
	for _, l := range c.lanes {
		if err := l.laneHealth(); err != nil {
			return err
		}
	}
	return c.laneHealth()
}

// laneHealth is Health of the client's first code alone.
func (c *Client) laneHealth() error {
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
