package engine

import (
	"math"
	"sync/atomic"
	"time"

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

func (p *policy) init(c *lane, now int64) {
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
func (c *lane) blockCount(rate float64, latency time.Duration) int {
	if c.cfg.Tuning.FixedBlock > 0 {
		return c.cfg.Tuning.FixedBlock
	}
	span := max(c.cfg.RefillInterval, latencyFactor*latency)
	base := float64(span) / float64(time.Millisecond) * perMsCapacity
	want := max(base, rate*span.Seconds())
	want = min(max(want, float64(c.cfg.Tuning.MinBlock)), float64(c.cfg.Tuning.MaxBlock))
	return int(want)
}

// sample updates the activity mark and the rate estimate. It returns the
// local time it read.
func (c *lane) sample() int64 {
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

func (c *lane) idle(now int64) bool {
	return c.cfg.Tuning.IdleTimeout >= 0 && now-c.pol.lastActive.Load() >= int64(c.cfg.Tuning.IdleTimeout)
}

// timeLeft estimates how long b can still serve at the observed rate: until
// its validity ends, or until its positions run out if the client mints
// faster than time advances the cursor.
func (c *lane) timeLeft(b *block, now int64) int64 {
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
func (c *lane) lead(b *block) int64 {
	life := float64(b.validUntil - b.sent)
	if r := c.pol.ratePerSec(); r > 0 {
		life = min(life, float64(b.hi-b.lo)/r*1e9)
	}
	return max(int64(c.cfg.Tuning.PrefetchThreshold*life), latencyFactor*c.pol.latency.Load())
}

// kickAt is the cursor position at which the hot path asks for the next
// block: the ID-count form of lead.
func (c *lane) kickAt(b *block) int64 {
	n := float64(b.hi - b.lo)
	ids := c.cfg.Tuning.PrefetchThreshold * n
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
func (c *lane) reserveTarget(l *leaseState, now int64) int64 {
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
func (c *lane) reserveCount(horizon, target int64) int {
	if target <= horizon {
		return 0
	}
	if c.cfg.Tuning.FixedBlock > 0 {
		return c.cfg.Tuning.FixedBlock
	}
	span := time.Duration(target-horizon) + c.cfg.RefillInterval
	n := float64(span) / float64(time.Millisecond) * perMsCapacity
	return int(min(max(n, float64(c.cfg.Tuning.MinBlock)), float64(c.cfg.Tuning.MaxBlock)))
}

// learnMaxAhead records, after a backpressure answer, how far ahead of the
// clock the buffered span reached: the service's lead limit as seen from
// here. The reserve stays inside it from then on (reserveTarget). Refill
// loop only, like the rest of c.pol's plain fields: no lock.
func (c *lane) learnMaxAhead() {
	now := c.now()
	if ahead := c.horizon() - now; ahead > int64(c.cfg.RefillInterval) {
		c.pol.maxAhead, c.pol.maxAheadUntil = ahead, now+int64(maxAheadMemory)
	}
}
