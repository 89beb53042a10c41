package engine

// The buffer of a lane: the current and next blocks, their promotion and
// retirement, and the state channel callers wait on.

// waitState returns the channel closed at the next state change and the
// last refill error, read together.
func (c *lane) waitState() (<-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waitCh, c.refillErr
}

func (c *lane) broadcastLocked() {
	close(c.waitCh)
	c.waitCh = make(chan struct{})
}

// rotate replaces b if it is still the current block and cannot be used.
func (c *lane) rotate(b *block) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.cur.Load() != b {
		return
	}
	c.normalizeLocked(c.now())
	// A shared run promoted from next needs no wake-up: its own prefetch
	// point asks for the one after it (sharedKickAt), and this Next
	// would otherwise pay a goroutine wake-up once per run.
	if nc := c.cur.Load(); nc == nil || nc.offset != denseOffset {
		c.kickRefill()
	}
}

// usable reports whether b can still mint under the current lease l.
func (c *lane) usable(b *block, l *leaseState, now int64) bool {
	return b.lease == l && l.err(now) == nil && !b.finished(now)
}

// normalizeLocked retires finished or stale blocks and promotes the
// prefetched one, keeping the invariant next != nil => cur != nil.
func (c *lane) normalizeLocked(now int64) {
	l := c.lease.Load()
	for {
		cur := c.cur.Load()
		if cur != nil && c.usable(cur, l, now) {
			break
		}
		if cur == nil && c.next.Load() == nil {
			return
		}
		c.promoteLocked()
	}
	if nx := c.next.Load(); nx != nil && !c.usable(nx, l, now) {
		c.next.Store(nil)
		c.retireLocked(nx)
	}
}

// promoteLocked makes the buffered next block (nil: none) current and
// retires the current one.
func (c *lane) promoteLocked() {
	cur := c.cur.Load()
	c.cur.Store(c.next.Load())
	c.next.Store(nil)
	if cur != nil {
		c.retireLocked(cur)
	}
}

// retireLocked seals a block that has left the buffers and keeps it among
// the recent ones whose minted count is still read live (a loser of a
// compare-and-swap may be about to take back a speculative gap count).
func (c *lane) retireLocked(b *block) {
	b.seal()
	if len(c.recent) == cap(c.recent) {
		c.folded += c.recent[0].minted()
		copy(c.recent, c.recent[1:])
		c.recent = c.recent[:len(c.recent)-1]
	}
	c.recent = append(c.recent, b)
}

// dropLeaseBlocksLocked removes the blocks granted under l.
func (c *lane) dropLeaseBlocksLocked(l *leaseState) {
	if nx := c.next.Load(); nx != nil && nx.lease == l {
		c.next.Store(nil)
		c.retireLocked(nx)
	}
	if cur := c.cur.Load(); cur != nil && cur.lease == l {
		c.cur.Store(c.next.Load())
		c.next.Store(nil)
		c.retireLocked(cur)
	}
}

// horizon is the local instant the buffered blocks run out (the later
// validity of the current and the next block; 0 with none).
func (c *lane) horizon() int64 {
	var h int64
	for _, b := range []*block{c.cur.Load(), c.next.Load()} {
		if b != nil {
			h = max(h, b.validUntil)
		}
	}
	return h
}

// install puts a fresh block into the buffers (current if empty, else next)
// and wakes waiters. It drops blocks of a lease that is no longer current
// and blocks that are already over: reporting false.
func (c *lane) install(b *block) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	now := c.now()
	if c.closed.Load() || c.lease.Load() != b.lease || !c.usable(b, b.lease, now) {
		return false
	}
	c.refillErr = nil
	c.normalizeLocked(now)
	switch {
	case c.cur.Load() == nil:
		b.arm()
		c.cur.Store(b)
	case c.next.Load() == nil:
		b.arm()
		c.next.Store(b)
	default:
		m := merge(c.next.Load(), b)
		if m == nil {
			return false
		}
		m.kickAt = c.kickAt(m)
		m.arm()
		c.next.Store(m)
	}
	c.broadcastLocked()
	return true
}

// mintedTotal is the number of IDs handed out so far. Each block's count
// is exact when it is read (block.minted), the blocks are read one after
// another while calls go on, and the result is kept monotonic.
func (c *lane) mintedTotal() int64 {
	c.mu.Lock()
	v := c.folded
	for _, b := range c.recent {
		v += b.minted()
	}
	if b := c.cur.Load(); b != nil {
		v += b.minted()
	}
	c.mu.Unlock()
	for {
		old := c.stats.mintedHigh.Load()
		if v <= old || c.stats.mintedHigh.CompareAndSwap(old, v) {
			return max(v, old)
		}
	}
}
