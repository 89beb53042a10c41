package engine

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/idrange/idrange/segment"
)

// codeSource is a lane's worker code of its own: blocks granted under its
// lease (the lease loop renews it, lease.go), sized to the measured rate
// and reaching past the lease's safety deadline (the reserve).
type codeSource struct {
	c *lane
	l *leaseState // the lease of the last fetch
}

func (s *codeSource) name() string { return "block refill" }

func (s *codeSource) plan(now int64) (<-chan struct{}, int, time.Duration) { return s.c.plan(now) }

// sleep aligns timed wake-ups to the wake grid (onGrid), so that the
// refills of many clients meet in one etcd Txn.
func (s *codeSource) sleep(d time.Duration) time.Duration { return onGrid(d) }

func (s *codeSource) fetch(n int) error {
	s.l = s.c.lease.Load()
	return s.c.refillOnce(s.l, n)
}

func (s *codeSource) recover(err error, _ *backoff) (bool, time.Duration) {
	c := s.c
	var bp *segment.Backpressure
	switch {
	case isUnsafeCode(err):
		c.stats.refillErrors.Add(1)
		c.dropCode(s.l, err)
		return true, 0
	case isFencedReply(err):
		c.stats.refillErrors.Add(1)
		c.fence(s.l, err, "block grant")
		return true, 0
	case errors.As(err, &bp):
		c.learnMaxAhead() // then the loop waits as for any backpressure
	}
	return false, 0
}

func (s *codeSource) switchTo(int64) source { return nil }

// plan decides whether to request a block now and of what size, and
// otherwise how long the refill loop may sleep. It also retires blocks
// whose time has passed.
func (c *lane) plan(now int64) (ch <-chan struct{}, n int, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch = c.waitCh
	wait = c.pol.maxSleep
	if c.closed.Load() {
		return ch, 0, time.Hour
	}
	c.normalizeLocked(now)
	l := c.lease.Load()
	if l.err(now) != nil {
		return ch, 0, wait // the lease loop broadcasts a new lease
	}
	count := int(c.pol.count.Load())
	cur, nx := c.cur.Load(), c.next.Load()
	// A caller waiting (a Next, or a carve for a shared run) is demand
	// whatever the client minted lately.
	idle := c.idle(now) && c.waiters.Load() == 0
	switch {
	case cur == nil:
		if !idle {
			return ch, max(count, c.reserveCount(now, c.reserveTarget(l, now))), wait
		}
		return ch, 0, wait
	case nx == nil && cur.kicked.Load():
		return ch, count, wait
	case idle:
		return ch, 0, wait
	}
	// The reserve: granted span up to reserveTarget, so an outage shorter
	// than the safe interval costs nothing. A block that extends the
	// buffered next one is merged into it (install).
	if r := c.reserveCount(c.horizon(), c.reserveTarget(l, now)); r > 0 {
		return ch, max(r, count), wait
	}
	if nx != nil {
		return ch, 0, min(wait, time.Duration(max(cur.validUntil-now, 0)))
	}
	left, lead := c.timeLeft(cur, now), c.lead(cur)
	if left <= lead {
		return ch, count, wait
	}
	return ch, 0, min(wait, time.Duration(left-lead))
}

// refillOnce requests one block of n units under l and installs it.
func (c *lane) refillOnce(l *leaseState, n int) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Tuning.RPCTimeout)
	sent := c.now()
	sb, err := c.alloc.Allocate(ctx, l.seg, n)
	arrive := c.now()
	cancel()
	c.observeLatency(arrive - sent)
	if err != nil {
		return fmt.Errorf("rangeclient: allocate %d IDs on code %d/%d: %w", n, l.seg.Region, l.seg.Worker, err)
	}
	if err := sb.Check(l.seg, int64(n)); err != nil {
		// Using it could overlap another block: never minted from.
		return fmt.Errorf("rangeclient: %w", err)
	}
	if err := c.ends.admit(sb, l.seg.Token); err != nil {
		c.stats.overlaps.Add(1)
		return fmt.Errorf("rangeclient: %w", err)
	}
	b := newBlock(sb, l, sent, arrive)
	b.kickAt = c.kickAt(b)
	c.stats.refills.Add(1)
	if !c.install(b) {
		c.stats.discarded.Add(1)
	}
	return nil
}
