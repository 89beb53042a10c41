package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/segment"
)

// killedDeadline poisons a lease's deadline: every local reading is past
// it, so the hot path's single comparison also covers fencing, close
// and expiry.
const killedDeadline = math.MinInt64

// acquireTimeoutFactor: Acquire may take this many RPCTimeouts.
const acquireTimeoutFactor = 5

// leaseState is one worker-code lease as the client holds it. The hot path
// reads the deadline only; everything else belongs to the lease loop.
type leaseState struct {
	seg segment.Lease

	// deadline is the safety deadline on the client's monotonic clock
	// (Client.now): the send time of the last successful renewal (or of
	// the acquisition) + TTL - margin. It only moves forward, and only
	// while it has not passed; kill sets it to killedDeadline for good.
	deadline atomic.Int64
	// why is the error a killed lease reports; set before the deadline is
	// poisoned.
	why atomic.Pointer[error]
	// expired is the error for "past the deadline", built once so that the
	// failing hot path does not allocate.
	expired error
	killed  chan struct{}
	once    sync.Once

	period    int64 // renewal period, ns
	nextRenew int64 // local instant of the next renewal; lease loop only
	lastErr   error // why the last renewal failed; lease loop only
}

func newLeaseState(sl segment.Lease, sent int64, margin, period time.Duration) *leaseState {
	l := &leaseState{
		seg: sl,
		expired: leaseLostError("code %d/%d (token %d, lease %x): no renewal succeeded within TTL %v - margin %v",
			sl.Region, sl.Worker, sl.Token, sl.LeaseID, sl.TTL, margin),
		killed:    make(chan struct{}),
		period:    int64(period),
		nextRenew: sent + int64(period),
	}
	l.deadline.Store(sent + int64(sl.TTL-margin))
	return l
}

// err is nil while the lease may be used at now, else why not.
func (l *leaseState) err(now int64) error {
	if now < l.deadline.Load() {
		return nil
	}
	if p := l.why.Load(); p != nil {
		return *p
	}
	return l.expired
}

// safeFor is the time left before the safety deadline.
func (l *leaseState) safeFor(now int64) time.Duration {
	return time.Duration(max(l.deadline.Load()-now, 0))
}

// kill ends the lease with err. Only the first call counts; it reports
// whether it was that call.
func (l *leaseState) kill(err error) bool {
	first := false
	l.once.Do(func() {
		l.why.Store(&err)
		l.deadline.Store(killedDeadline)
		close(l.killed)
		first = true
	})
	return first
}

func (l *leaseState) isKilled() bool {
	select {
	case <-l.killed:
		return true
	default:
		return false
	}
}

// extend moves the deadline to dl if the lease is still usable at now. A
// renewal that comes back after the deadline passed does not revive the
// lease: the client has already stopped minting and will take a fresh one.
func (l *leaseState) extend(dl, now int64) bool {
	if l.err(now) != nil {
		return false
	}
	return raise(&l.deadline, dl)
}

// raise sets a to v if v is larger, unless a was poisoned.
func raise(a *atomic.Int64, v int64) bool {
	for {
		old := a.Load()
		if old == killedDeadline {
			return false
		}
		if v <= old || a.CompareAndSwap(old, v) {
			return true
		}
	}
}

// acquire takes a new lease with one call to the service and checks it.
//
// The call gets acquireTimeoutFactor RPC timeouts: an Acquire that times
// out on the client may still have succeeded in the service, and such a
// lease holds a code until its TTL ends, so a loaded service (many clients
// starting at once) is better waited for than abandoned.
func (c *lane) acquire(ctx context.Context) (*leaseState, error) {
	rctx, cancel := context.WithTimeout(ctx, acquireTimeoutFactor*c.cfg.Tuning.RPCTimeout)
	defer cancel()
	sent := c.now()
	sl, err := c.alloc.Acquire(rctx, c.cfg.Region, c.cfg.Owner)
	if err != nil {
		return nil, fmt.Errorf("rangeclient: acquire a worker code in region %d: %w", c.cfg.Region, err)
	}
	safe := sl.TTL - c.cfg.SafetyMargin
	period := c.cfg.Tuning.RenewPeriod
	if period == 0 {
		period = safe / 3
	}
	bad := sl.Validate() // then the checks that need this client's config
	switch {
	case bad != nil:
	case sl.Region != c.cfg.Region:
		bad = fmt.Errorf("service leased region %d, asked for %d: %w", sl.Region, c.cfg.Region, segment.ErrInvalid)
	case sl.TTL <= 0:
		bad = fmt.Errorf("service granted TTL %v: %w", sl.TTL, segment.ErrInvalid)
	case safe <= 0:
		bad = fmt.Errorf("Config.SafetyMargin %v leaves no safe interval of the granted TTL %v: %w", c.cfg.SafetyMargin, sl.TTL, ErrInvalidConfig)
	case period <= 0 || period >= safe:
		bad = fmt.Errorf("tuning RenewPeriod %v must be positive and below TTL %v - SafetyMargin %v: %w", period, sl.TTL, c.cfg.SafetyMargin, ErrInvalidConfig)
	}
	if bad != nil {
		c.releaseQuietly(c.ctx, sl)
		return nil, fmt.Errorf("rangeclient: unusable lease: %w", bad)
	}
	c.stats.acquisitions.Add(1)
	c.log.Info("rangeclient: lease acquired", "region", sl.Region, "worker", sl.Worker, "token", sl.Token,
		"ttl", sl.TTL, "safe_for", safe, "renew_every", period)
	return newLeaseState(sl, sent, c.cfg.SafetyMargin, period), nil
}

// releaseQuietly gives a lease back, best effort (the TTL ends it anyway),
// within RPCTimeout and until parent ends.
func (c *lane) releaseQuietly(parent context.Context, sl segment.Lease) error {
	ctx, cancel := context.WithTimeout(parent, c.cfg.Tuning.RPCTimeout)
	defer cancel()
	err := c.alloc.Release(ctx, sl)
	if err != nil {
		c.log.Debug("rangeclient: release failed (the lease will expire by itself)", "worker", sl.Worker, "token", sl.Token, "err", err)
	}
	return err
}

// leaseLoop renews the current lease, notices its expiry, and replaces a
// dead lease with a fresh one (possibly another code), until Close.
func (c *lane) leaseLoop(l *leaseState) {
	defer c.wg.Done()
	bo := c.newBackoff()
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	sleep := func(d time.Duration, killed <-chan struct{}) bool {
		timer.Reset(max(d, 0))
		select {
		case <-timer.C:
			return true
		case <-killed:
			timer.Stop() // Go >= 1.23: no stale tick can be received after Stop
			return true
		case <-c.ctx.Done():
			timer.Stop()
			return false
		}
	}
	for c.ctx.Err() == nil {
		if !l.isKilled() {
			now := c.now()
			if l.err(now) != nil {
				if c.killLease(l, l.expired) {
					c.stats.expiries.Add(1)
					c.log.Warn("rangeclient: safety deadline passed without a successful renewal; minting stopped",
						"worker", l.seg.Worker, "token", l.seg.Token, "cause", l.lastErr)
				}
				continue
			}
			if wait := min(time.Duration(l.nextRenew-now), l.safeFor(now)); wait > 0 {
				if !sleep(wait, l.killed) {
					return
				}
				continue
			}
			c.renew(l, bo)
			continue
		}
		// The lease is dead: give it back if it may still exist, then take
		// a fresh one. Next waits meanwhile, within its context.
		// A fenced lease is gone; a dropped code stays leased until its TTL
		// ends (dropCode).
		if p := l.why.Load(); p != nil && !errors.Is(*p, ErrFenced) && !errors.Is(*p, ErrClosed) && !isUnsafeCode(*p) {
			c.releaseQuietly(c.ctx, l.seg) // Close cancels it: Close stays bounded
		}
		bo.reset() // renewal failures grew it; a new lease is tried at once
		for c.ctx.Err() == nil {
			nl, err := c.acquire(c.ctx)
			if err == nil {
				if !c.installLease(nl) {
					c.releaseQuietly(context.Background(), nl.seg) // closing: acquired too late
					return
				}
				l = nl
				bo.reset()
				break
			}
			d := bo.next()
			c.log.Warn("rangeclient: cannot acquire a new lease; retrying", "retry_in", d, "err", err)
			if !c.acquireBackoff(d) {
				return
			}
		}
	}
}

// waitingRetry bounds the time between acquisition attempts while callers
// wait in Next for the new lease: they should not wait out a 2 s backoff
// when the service came back, and one attempt per 250 ms per client is a
// small load on a service that is still down.
const waitingRetry = 250 * time.Millisecond

// acquireBackoff waits d before the next acquisition attempt, or only
// waitingRetry (from the start of the wait) once a caller waits for the
// lease; it reports false when the client is closing.
func (c *lane) acquireBackoff(d time.Duration) bool {
	start := time.Now()
	timer := time.NewTimer(d)
	defer timer.Stop()
	for {
		if c.waiters.Load() > 0 {
			left := waitingRetry - time.Since(start)
			if left <= 0 {
				return true
			}
			if left < d-time.Since(start) {
				timer.Reset(left)
			}
		}
		select {
		case <-timer.C:
			return true
		case <-c.leaseKick:
		case <-c.ctx.Done():
			return false
		}
	}
}

// renew sends one renewal of l and applies its outcome.
//
// A renewal may take longer than RPCTimeout: up to one renewal period, but
// never past the safety deadline (a reply after it is useless). Cutting a
// slow renewal at RPCTimeout made an overloaded etcd (grants taking over a
// second) cost every client its lease although its deadline was seconds away.
func (c *lane) renew(l *leaseState, bo *backoff) {
	sent := c.now()
	timeout := max(c.cfg.Tuning.RPCTimeout, time.Duration(l.period))
	if left := l.safeFor(sent); left > 0 && left < timeout {
		timeout = left
	}
	ctx, cancel := context.WithTimeout(c.ctx, timeout)
	rl, err := c.alloc.Renew(ctx, l.seg)
	cancel()
	now := c.now()
	switch {
	case err == nil && rl.TTL > 0:
		safe := int64(rl.TTL - c.cfg.SafetyMargin)
		if l.extend(sent+safe, now) {
			c.armLeaseBlocks(l)
			c.stats.renewals.Add(1)
			l.nextRenew = sent + l.period
			bo.reset()
			return
		}
		// Too late: the deadline passed while the renewal was in flight.
		// The loop sees the expiry next.
		c.stats.renewalFailures.Add(1)
		c.log.Warn("rangeclient: renewal came back after the safety deadline", "worker", l.seg.Worker,
			"sent_ago", time.Duration(now-sent))
	case err == nil || isFencedReply(err):
		if err == nil {
			err = fmt.Errorf("renewal granted TTL %v: %w", rl.TTL, segment.ErrLeaseLost)
		}
		c.stats.renewalFailures.Add(1)
		c.fence(l, err, "renewal")
	case c.ctx.Err() != nil:
		return
	default:
		c.stats.renewalFailures.Add(1)
		l.lastErr = err
		d := bo.next()
		l.nextRenew = now + int64(d)
		c.log.Warn("rangeclient: lease renewal failed; minting continues until the safety deadline",
			"worker", l.seg.Worker, "safe_for", l.safeFor(now), "retry_in", d, "err", err)
	}
}

// fence kills l because the service no longer accepts it.
func (c *lane) fence(l *leaseState, cause error, during string) {
	err := fencedError(cause, "rangeclient: code %d/%d (token %d) fenced during %s", l.seg.Region, l.seg.Worker, l.seg.Token, during)
	if c.killLease(l, err) {
		c.stats.fenced.Add(1)
		c.log.Error("rangeclient: lease fenced by the service; minting stopped", "worker", l.seg.Worker,
			"token", l.seg.Token, "during", during, "err", cause)
	}
}

// killLease kills l with err and wakes waiters; it reports whether this
// call was the one that killed it. The hot path checks a block's stop, not
// its lease, so l's buffered blocks are sealed first, under the mutex that
// install holds to arm a block: once l is killed, no block of it can mint.
func (c *lane) killLease(l *leaseState, err error) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	first := c.killLeaseLocked(l, err)
	c.broadcastLocked()
	return first
}

// killLeaseLocked is killLease's seal-then-kill with c.mu held.
func (c *lane) killLeaseLocked(l *leaseState, err error) bool {
	c.dropLeaseBlocksLocked(l)
	return l.kill(err)
}

// armLeaseBlocks raises the stop of l's buffered blocks after a renewal
// moved its deadline.
func (c *lane) armLeaseBlocks(l *leaseState) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, b := range []*block{c.cur.Load(), c.next.Load()} {
		if b != nil && b.lease == l {
			b.arm()
		}
	}
}

// installLease makes nl the current lease unless the client is closing.
func (c *lane) installLease(nl *leaseState) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed.Load() {
		nl.kill(ErrClosed)
		return false
	}
	old := c.lease.Load()
	c.lease.Store(nl)
	c.dropLeaseBlocksLocked(old)
	c.broadcastLocked()
	c.kickRefill()
	return true
}
