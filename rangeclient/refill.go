package rangeclient

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

const (
	// latencyFactor: the next block is requested at least this many
	// observed refill latencies before the current one runs out.
	latencyFactor = 4
	// maxPlanSleep bounds the refill loop's sleep, so the rate estimate and
	// idleness stay fresh.
	maxPlanSleep = 250 * time.Millisecond
	// perMsCapacity is the number of linear positions per millisecond.
	perMsCapacity = 1 << snowflake.SequenceBits
)

// policy is the refill loop's picture of the client's demand. The plain
// fields belong to the refill loop; the atomics are read by Stats.
type policy struct {
	lastSample   int64
	sampleMinted int64
	activeMinted int64
	lastActive   atomic.Int64 // last instant minted IDs were seen to grow
	maxSleep     time.Duration

	rate    atomic.Uint64 // float64 bits: IDs per second, EWMA over RefillInterval
	latency atomic.Int64  // refill latency EWMA, ns
	count   atomic.Int64  // block size the next request asks for

	// maxAhead is how far ahead of the clock the service let the reserve
	// run before it answered with backpressure (its MaxLead, as seen from
	// here, or less during a service clock rollback); 0 until that happens.
	// The reserve stays a RefillInterval inside it until maxAheadUntil (a
	// local instant), so a client does not poll a service that has said no,
	// and a transient refusal does not shrink the reserve for good.
	maxAhead, maxAheadUntil int64
}

// wakeGrid aligns the refill loop's timed wake-ups to multiples of it on
// the wall clock. Clients on one machine, and on NTP-synchronised machines,
// then ask for their reserve blocks together, so the service commits them
// in one etcd Txn (group commit) instead of one each. Only timed wake-ups
// move, by less than one grid step: a kick (a block running low, a caller
// waiting, a new lease) still wakes the loop at once.
const wakeGrid = 50 * time.Millisecond

// onGrid stretches d so the wake-up lands on the next wakeGrid boundary.
func onGrid(d time.Duration) time.Duration { return onGridFrom(time.Now(), d) }

// onGridFrom is onGrid at wall-clock instant now.
func onGridFrom(now time.Time, d time.Duration) time.Duration {
	at := now.Add(d).UnixNano()
	return d + time.Duration((int64(wakeGrid)-at%int64(wakeGrid))%int64(wakeGrid))
}

// maxReserveAhead caps the reserve whatever the lease's TTL: the reserve
// is merged into the buffered next block, which must stay well under
// maxSpan positions (8.7 minutes of a code's time).
const maxReserveAhead = 5 * time.Minute

// maxAheadMemory is how long a learnt maxAhead is kept.
const maxAheadMemory = time.Minute

func (p *policy) init(c *Client, now int64) {
	p.lastSample = now
	p.lastActive.Store(now)
	p.maxSleep = min(max(c.cfg.RefillInterval/4, time.Millisecond), maxPlanSleep)
	p.count.Store(int64(c.blockCount(0, 0)))
}

func (p *policy) ratePerSec() float64 { return math.Float64frombits(p.rate.Load()) }

// blockCount is the size the next request asks for, given the observed rate
// in IDs/s and refill latency. See the package doc for the reasoning.
//
//	span = max(RefillInterval, latencyFactor*latency)
//	FixedBlock if set, else clamp(max(span_ms*4096, rate*span), MinBlock, MaxBlock)
//
// The latency term keeps a block alive for several round trips: a block
// whose span is shorter than the time its grant takes to arrive would be
// over on arrival, every time.
func (c *Client) blockCount(rate float64, latency time.Duration) int {
	if c.cfg.tune.FixedBlock > 0 {
		return c.cfg.tune.FixedBlock
	}
	span := max(c.cfg.RefillInterval, latencyFactor*latency)
	base := float64(span) / float64(time.Millisecond) * perMsCapacity
	want := max(base, rate*span.Seconds())
	want = min(max(want, float64(c.cfg.tune.MinBlock)), float64(c.cfg.tune.MaxBlock))
	return int(want)
}

// sample updates the activity mark and the rate estimate. It returns the
// local time it read.
func (c *Client) sample() int64 {
	p := &c.pol
	now := c.now()
	minted := c.mintedTotal()
	if minted != p.activeMinted {
		p.activeMinted = minted
		p.lastActive.Store(now)
	}
	if dt := now - p.lastSample; dt >= int64(time.Millisecond) {
		inst := float64(minted-p.sampleMinted) / (float64(dt) / 1e9)
		alpha := 1 - math.Exp(-float64(dt)/float64(c.cfg.RefillInterval))
		r := p.ratePerSec()
		r += alpha * (inst - r)
		p.rate.Store(math.Float64bits(r))
		p.lastSample, p.sampleMinted = now, minted
		p.count.Store(int64(c.blockCount(r, time.Duration(p.latency.Load()))))
	}
	return now
}

func (c *Client) idle(now int64) bool {
	return c.cfg.tune.IdleTimeout >= 0 && now-c.pol.lastActive.Load() >= int64(c.cfg.tune.IdleTimeout)
}

// timeLeft estimates how long b can still serve at the observed rate: until
// its validity ends, or until its positions run out if the client mints
// faster than time advances the cursor.
func (c *Client) timeLeft(b *block, now int64) int64 {
	left := b.validUntil - now
	if r := c.pol.ratePerSec(); r > 0 {
		byIDs := float64(b.left(now)) / r * 1e9
		if byIDs < float64(left) {
			left = int64(byIDs)
		}
	}
	return max(left, 0)
}

// lead is how long before b runs out the next block is requested:
// PrefetchThreshold of b's expected life, or latencyFactor refill latencies
// if that is longer.
func (c *Client) lead(b *block) int64 {
	life := float64(b.validUntil - b.sent)
	if r := c.pol.ratePerSec(); r > 0 {
		life = min(life, float64(b.hi-b.lo)/r*1e9)
	}
	return max(int64(c.cfg.tune.PrefetchThreshold*life), latencyFactor*c.pol.latency.Load())
}

// kickAt is the cursor position at which the hot path asks for the next
// block: the ID-count form of lead.
func (c *Client) kickAt(b *block) int64 {
	n := float64(b.hi - b.lo)
	ids := c.cfg.tune.PrefetchThreshold * n
	if r := c.pol.ratePerSec(); r > 0 {
		ids = max(ids, r*float64(latencyFactor*c.pol.latency.Load())/1e9)
	}
	return b.hi - int64(min(ids, n))
}

// reserveTarget is the local instant the client's granted span should
// reach at now: the lease's safety deadline plus one renewal period (a
// renewal moves the deadline by up to that much at once) plus
// latencyFactor refill latencies, capped by maxReserveAhead, MaxReserve
// and what the service allows (maxAhead). Zero when the reserve is off.
func (c *Client) reserveTarget(l *leaseState, now int64) int64 {
	if c.cfg.MaxReserve < 0 {
		return 0
	}
	t := l.deadline.Load() + l.period + latencyFactor*c.pol.latency.Load()
	t = min(t, now+int64(maxReserveAhead))
	if c.cfg.MaxReserve > 0 {
		t = min(t, now+int64(c.cfg.MaxReserve))
	}
	if a := c.pol.maxAhead; a > 0 && now < c.pol.maxAheadUntil {
		t = min(t, now+a-int64(c.cfg.RefillInterval))
	}
	return t
}

// reserveCount is the request size that brings the granted span from
// horizon (the local instant the buffered blocks run out) to target, plus
// one RefillInterval so the next reserve request comes a RefillInterval
// later rather than at once; 0 when the reserve already reaches target.
// With FixedBlock every request is FixedBlock: the reserve is then built
// from several of them.
func (c *Client) reserveCount(horizon, target int64) int {
	if target <= horizon {
		return 0
	}
	if c.cfg.tune.FixedBlock > 0 {
		return c.cfg.tune.FixedBlock
	}
	span := time.Duration(target-horizon) + c.cfg.RefillInterval
	n := float64(span) / float64(time.Millisecond) * perMsCapacity
	return int(min(max(n, float64(c.cfg.tune.MinBlock)), float64(c.cfg.tune.MaxBlock)))
}

// plan decides whether to request a block now and of what size, and
// otherwise how long the refill loop may sleep. It also retires blocks
// whose time has passed.
func (c *Client) plan(now int64) (ch <-chan struct{}, n int, wait time.Duration) {
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

// loopSleeper returns the sleep of a loop that fills the buffers (the
// refill loop, the shared loop): until d passes, the hot path kicks, ch
// (a state change; nil: none) is closed or the client closes, which it
// reports as false. Call stop when the loop ends.
func (c *Client) loopSleeper() (sleep func(d time.Duration, ch <-chan struct{}) bool, stop func()) {
	timer := time.NewTimer(time.Hour)
	return func(d time.Duration, ch <-chan struct{}) bool {
		timer.Reset(max(d, 0))
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-c.kick:
		case <-ch:
		case <-c.ctx.Done():
			return false
		}
		return true
	}, func() { timer.Stop() }
}

// refillLoop keeps the double buffer filled until Close.
func (c *Client) refillLoop() {
	defer c.wg.Done()
	bo := c.newBackoff()
	sleep, stop := c.loopSleeper()
	defer stop()
	for c.ctx.Err() == nil {
		now := c.sample()
		ch, n, wait := c.plan(now)
		if n == 0 {
			if !sleep(onGrid(wait), ch) {
				return
			}
			continue
		}
		l := c.lease.Load()
		err := c.refillOnce(l, n)
		var bp *segment.Backpressure
		switch {
		case err == nil:
			bo.reset()
			continue
		case c.ctx.Err() != nil:
			return
		case isUnsafeCode(err):
			c.stats.refillErrors.Add(1)
			c.dropCode(l, err)
			continue
		case isFencedReply(err):
			c.stats.refillErrors.Add(1)
			c.fence(l, err, "block grant")
			continue
		default:
			if errors.As(err, &bp) {
				c.learnMaxAhead()
			}
			if !c.waitAfterRefillError(err, "block refill", bo, sleep) {
				return
			}
		}
	}
}

// waitAfterRefillError records a failed refill (what names it in the log)
// and sleeps before the next: the service's RetryAfter for backpressure,
// else the next backoff step. It reports false when the client closes.
func (c *Client) waitAfterRefillError(err error, what string, bo *backoff, sleep func(time.Duration, <-chan struct{}) bool) bool {
	c.setRefillErr(err)
	var bp *segment.Backpressure
	if errors.As(err, &bp) {
		c.stats.backpressure.Add(1)
		c.log.Debug("rangeclient: service applies backpressure", "during", what, "retry_after", bp.RetryAfter)
		return sleep(min(max(bp.RetryAfter, time.Millisecond), c.cfg.tune.BackoffMax), nil)
	}
	c.stats.refillErrors.Add(1)
	d := bo.next()
	c.log.Warn("rangeclient: "+what+" failed; retrying", "retry_in", d, "err", err)
	// Wait on the state channel as it is now: setRefillErr may have closed
	// the one the plan returned, and the backoff must hold. A later change
	// (a new lease, Close) still cuts it short.
	ch, _ := c.waitState()
	return sleep(d, ch)
}

// setRefillErr records a failed refill; final ones wake the waiters so they
// fail at once instead of waiting out their deadline.
func (c *Client) setRefillErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refillErr = err
	if isFinalRefillError(err) {
		c.broadcastLocked()
	}
}

// horizon is the local instant the buffered blocks run out (the later
// validity of the current and the next block; 0 with none).
func (c *Client) horizon() int64 {
	var h int64
	for _, b := range []*block{c.cur.Load(), c.next.Load()} {
		if b != nil {
			h = max(h, b.validUntil)
		}
	}
	return h
}

// learnMaxAhead records, after a backpressure answer, how far ahead of the
// clock the buffered span reached: the service's lead limit as seen from
// here. The reserve stays inside it from then on (reserveTarget). Refill
// loop only, like the rest of c.pol's plain fields: no lock.
func (c *Client) learnMaxAhead() {
	now := c.now()
	if ahead := c.horizon() - now; ahead > int64(c.cfg.RefillInterval) {
		c.pol.maxAhead, c.pol.maxAheadUntil = ahead, now+int64(maxAheadMemory)
	}
}

// refillOnce requests one block of n units under l and installs it.
func (c *Client) refillOnce(l *leaseState, n int) error {
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.tune.RPCTimeout)
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

// observeLatency feeds one refill round trip into the latency estimate,
// the next block size and the latency histogram.
func (c *Client) observeLatency(lat int64) {
	if old := c.pol.latency.Load(); old == 0 {
		c.pol.latency.Store(lat)
	} else {
		c.pol.latency.Store(old + (lat-old)/4)
	}
	c.pol.count.Store(int64(c.blockCount(c.pol.ratePerSec(), time.Duration(c.pol.latency.Load()))))
	if c.metrics != nil {
		c.metrics.refillLatency.Observe(time.Duration(lat).Seconds())
	}
}

// install puts a fresh block into the buffers (current if empty, else next)
// and wakes waiters. It drops blocks of a lease that is no longer current
// and blocks that are already over: reporting false.
func (c *Client) install(b *block) bool {
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
func (c *Client) mintedTotal() int64 {
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
