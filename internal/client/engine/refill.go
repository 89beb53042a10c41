package engine

import (
	"errors"
	"time"

	"github.com/idrange/idrange/segment"
)

// loopSleeper returns the sleep of the refill loop: until d passes, the
// hot path kicks, ch (a state change; nil: none) is closed or the lane
// closes, which it reports as false. Call stop when the loop ends.
func (c *lane) loopSleeper() (sleep func(d time.Duration, ch <-chan struct{}) bool, stop func()) {
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

// source is where a lane's refill loop gets blocks: a worker code of the
// lane's own (codeSource) or shared runs (sharedSource). The loop is the
// same for both; what differs is here.
type source interface {
	// name names the source's requests in logs.
	name() string
	// plan decides, at local instant now, whether to ask for n positions
	// now, else how long the loop may sleep; ch is the state channel that
	// cuts the sleep short. It also retires blocks whose time has passed.
	plan(now int64) (ch <-chan struct{}, n int, wait time.Duration)
	// sleep adjusts a sleep of d the plan asked for.
	sleep(d time.Duration) time.Duration
	// fetch asks for n positions and installs what it gets.
	fetch(n int) error
	// recover handles an error of fetch that concerns the source itself
	// (a code fenced or unsafe, a service without shared runs), with the
	// loop's backoff: it reports whether it did, and how long the loop
	// pauses before its next plan. Any other error is the loop's.
	recover(err error, bo *backoff) (handled bool, pause time.Duration)
	// switchTo returns the source the loop uses from now on instead of
	// this one, or nil: the shared path's move to a code of the lane's own.
	switchTo(now int64) source
}

// refillLoop keeps the lane's buffer filled from its source until close.
func (c *lane) refillLoop() {
	defer c.wg.Done()
	bo := c.newBackoff()
	sleep, stop := c.loopSleeper()
	defer stop()
	for c.ctx.Err() == nil {
		now := c.sample()
		if next := c.src.switchTo(now); next != nil {
			c.src = next
			bo.reset()
			continue
		}
		ch, n, wait := c.src.plan(now)
		if n == 0 {
			if !sleep(c.src.sleep(wait), ch) {
				return
			}
			continue
		}
		err := c.src.fetch(n)
		switch {
		case err == nil:
			bo.reset()
			continue
		case c.ctx.Err() != nil:
			return
		}
		if handled, pause := c.src.recover(err, bo); handled {
			if pause > 0 && !sleep(pause, nil) {
				return
			}
			continue
		}
		if !c.waitAfterRefillError(err, c.src.name(), bo, sleep) {
			return
		}
	}
}

// waitAfterRefillError records a failed refill (what names it in the log)
// and sleeps before the next: the service's RetryAfter for backpressure,
// else the next backoff step. It reports false when the client closes.
func (c *lane) waitAfterRefillError(err error, what string, bo *backoff, sleep func(time.Duration, <-chan struct{}) bool) bool {
	c.setRefillErr(err)
	var bp *segment.Backpressure
	if errors.As(err, &bp) {
		c.stats.backpressure.Add(1)
		c.log.Debug("rangeclient: service applies backpressure", "during", what, "retry_after", bp.RetryAfter)
		return sleep(min(max(bp.RetryAfter, time.Millisecond), c.cfg.Tuning.BackoffMax), nil)
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
func (c *lane) setRefillErr(err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refillErr = err
	if isFinalRefillError(err) {
		c.broadcastLocked()
	}
}

// observeLatency feeds one refill round trip into the latency estimate,
// the next block size and the latency histogram.
func (c *lane) observeLatency(lat int64) {
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
