package engine

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"time"
	"unicode/utf8"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// The shared path: a client with Config.Codes 0 over a service that grants
// shared runs (segment.SharedAllocator) mints from runs carved out of the
// replicas' own codes instead of holding a code, until its rate needs one.
const (
	// DedicatedRate is the rate, in IDs/s, above which a client on the
	// shared path takes a worker code of its own (once it has stayed
	// above it for dedicatedAfter): well under what the shared path serves
	// one client (segment.MaxShared positions a run, a run per sharedLife:
	// about 80,000 IDs/s). Below it a code would sit mostly idle (one code
	// mints 4,096,000 IDs/s); above it the client's shared grants grow
	// towards their cap, and a code of its own costs one etcd write every
	// few seconds instead of more than one grant a second.
	DedicatedRate = segment.MaxShared / 2
	// dedicatedAfter is how long the rate must stay above DedicatedRate:
	// a burst does not take a code.
	dedicatedAfter = 2 * time.Second
	// sharedLife is how long a shared run should last from its grant at
	// the measured rate: inside its validity (900 ms from its first
	// millisecond), with room for the lead at which the next one is asked
	// for. Runs are sized to it, not to the refill interval: a client
	// pays about one request per sharedLife whatever its rate, and a run
	// asked for early is a run whose validity runs out unused.
	sharedLife = 800 * time.Millisecond
	// sharedLeadMin and sharedLeadMax bound how long before the current
	// run runs out the next is asked for: latencyFactor round trips, but
	// never so early that the next run's validity is half spent when it
	// starts (a slow service then costs stalls, not twice the requests).
	sharedLeadMin = 20 * time.Millisecond
	sharedLeadMax = 200 * time.Millisecond
	// sharedKickShare: Next asks for the next run once this share of the
	// current one is left at the latest, whatever the measured rate, so
	// a client that mints in bursts (a batch of work at a time) does not
	// run past the end of a run before the next one arrives. Half: the
	// 10,000-client bench stalled on 0.26% of its calls at a quarter and
	// 0.06% at half, for 10% more requests.
	sharedKickShare = 0.5
	// sharedIdle: a shared client that has not minted for this long lets
	// its run expire instead of asking for another; its next Next waits
	// for one round trip. It is shorter than a run's validity, so a client
	// idle from New on (started early, used later) asks for nothing, and
	// one minting less often than once a sharedIdle asks at most once per
	// ID, never more often than an active one.
	sharedIdle = 500 * time.Millisecond
	// sharedMinRun and sharedFirstRun bound a run request from below, and
	// size the first one (no rate measured yet).
	sharedMinRun   = 64
	sharedFirstRun = 256
	// acquireRetryMax bounds the wait between attempts to take a code
	// while the region has none free (or the identity is at its cap).
	acquireRetryMax = 30 * time.Second
)

// sharedState is a shared-path client's own state; the shared loop owns
// every field but after, which the switch to a code reads under c.mu.
type sharedState struct {
	sa       segment.SharedAllocator
	clientID string
	lease    *leaseState // the stand-in lease of shared blocks: Token 0, no deadline

	// after is the last ID of the last run granted: the next run starts
	// above it (order per client, across replicas), and so does the
	// first block of a code the client takes.
	after snowflake.ID

	aboveSince int64 // local instant the rate went above DedicatedRate; 0 below it
	retryAt    int64 // local instant of the next attempt to take a code
	acquireBo  backoff
	// dedicated is set when the shared path is unusable (the service
	// stopped serving it): take a code as soon as possible.
	dedicated bool
}

// errSwitched ends the stand-in lease when the client takes a code.
var errSwitched = errors.New("rangeclient: left the shared path for a worker code")

// isShared reports whether l is the stand-in lease of the shared path.
func (l *leaseState) isShared() bool { return l.seg.Token == 0 }

// sharedUnsupported reports an answer meaning "no shared path here": a
// service or replica that predates AllocateShared or serves it without a
// minter (Unimplemented), or an allocator that cannot (ErrUnsupported).
func sharedUnsupported(err error) bool {
	return status.Code(err) == codes.Unimplemented || errors.Is(err, errors.ErrUnsupported)
}

// clientID names this client in shared-run requests: its Owner, cut to
// leave room, and a random suffix (several clients of one process).
func clientID(owner string) string {
	suffix := fmt.Sprintf("#%016x", rand.Uint64())
	if room := segment.MaxClientID - len(suffix); len(owner) > room {
		owner = owner[:room]
		for !utf8.ValidString(owner) {
			owner = owner[:len(owner)-1]
		}
	}
	return owner + suffix
}

// startShared tries the shared path for New: it reports false (and no
// error) when the allocator or the service does not offer it, so New
// takes a code as before. Otherwise it waits, within ctx, for the first
// run and starts the shared loop.
func (c *lane) startShared(ctx context.Context) (bool, error) {
	sa, ok := c.alloc.(segment.SharedAllocator)
	if c.cfg.Codes != 0 || !ok {
		return false, nil
	}
	sl := &leaseState{seg: segment.Lease{Region: c.cfg.Region}, expired: ErrLeaseLost, killed: make(chan struct{})}
	sl.deadline.Store(math.MaxInt64)
	c.shared = &sharedState{sa: sa, clientID: clientID(c.cfg.Owner), lease: sl,
		acquireBo: backoff{base: time.Second, max: acquireRetryMax}}
	c.lease.Store(sl)
	unsupported := false
	err := c.retryUntil(ctx, "shared run", "shared run", func() (bool, error) {
		err := c.refillShared(sharedFirstRun)
		switch {
		case err == nil && c.cur.Load() != nil:
			return true, nil
		case err == nil:
			return false, fmt.Errorf("rangeclient: the first shared run was over on arrival: %w", ErrUnavailable)
		case sharedUnsupported(err):
			unsupported = true
			return true, nil
		case isFinalRefillError(err):
			return true, err
		}
		return false, err
	})
	if err != nil || unsupported {
		c.shared = nil
		c.lease.Store(nil)
		return false, err
	}
	c.src = &sharedSource{c}
	c.wg.Add(1)
	go c.refillLoop()
	return true, nil
}

// sharedLead is how long before the current shared run runs out the next
// is asked for: latencyFactor refill latencies, within [sharedLeadMin,
// sharedLeadMax].
func (c *lane) sharedLead() time.Duration {
	return min(max(latencyFactor*time.Duration(c.pol.latency.Load()), sharedLeadMin), sharedLeadMax)
}

// sharedCount is the size of the next run request: what the measured rate
// mints in sharedLife less the lead, within [sharedMinRun,
// segment.MaxShared].
func (c *lane) sharedCount() int {
	n := c.pol.ratePerSec() * (sharedLife - c.sharedLead()).Seconds()
	return int(min(max(n, sharedMinRun), segment.MaxShared))
}

// sharedKickAt is the cursor position of b at which the hot path asks for
// the next run: sharedLead's worth of IDs at the measured rate before b's
// end (the ID-count form of the lead planShared uses), or sharedKickShare
// of b before it if that is more.
func (c *lane) sharedKickAt(b *block) int64 {
	n := float64(b.hi - b.lo)
	ids := max(c.pol.ratePerSec()*c.sharedLead().Seconds(), sharedKickShare*n, 1)
	return b.hi - int64(min(ids, n))
}

// sharedIdle reports whether the client has minted nothing for sharedIdle
// (or its IdleTimeout, if shorter); never with IdleTimeout < 0.
func (c *lane) sharedIdle(now int64) bool {
	t := c.cfg.Tuning.IdleTimeout
	return t >= 0 && now-c.pol.lastActive.Load() >= int64(min(t, sharedIdle))
}

// refillShared asks for one run of n positions and installs it.
func (c *lane) refillShared(n int) error {
	s := c.shared
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Tuning.RPCTimeout)
	sent := c.now()
	sb, err := s.sa.AllocateShared(ctx, c.cfg.Region, n, s.after, s.clientID)
	arrive := c.now()
	cancel()
	c.observeLatency(arrive - sent)
	if err != nil {
		return fmt.Errorf("rangeclient: shared run of %d IDs after %d: %w", n, s.after, err)
	}
	if err := sb.CheckShared(c.cfg.Region, int64(n), s.after); err != nil {
		return fmt.Errorf("rangeclient: %w", err) // never minted from
	}
	if err := c.ends.admit(sb, 0); err != nil {
		c.stats.overlaps.Add(1)
		return fmt.Errorf("rangeclient: shared run: %w", err)
	}
	s.after = max(s.after, sb.ID(sb.Hi-1))
	b := newBlock(sb, s.lease, sent, arrive)
	b.offset = denseOffset
	b.kickAt = c.sharedKickAt(b)
	c.stats.refills.Add(1)
	if !c.install(b) {
		c.stats.discarded.Add(1)
	}
	return nil
}

// denseOffset is the service clock offset of a shared block: so far in the
// past that the block's time floor never passes its cursor. A shared run
// is minted densely from its first position (its IDs may lag the clock,
// by less than its validity) and ends at its validity, never by the clock.
const denseOffset = math.MinInt64 / 2

// planShared is plan for the shared path: whether to ask for a run now
// and of what size, else how long the loop may sleep.
func (c *lane) planShared(now int64) (ch <-chan struct{}, n int, wait time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch = c.waitCh
	// Longer than the refill loop's maxSleep: the loop wakes when its run
	// needs renewing (below) or when kicked (a run running low, a caller
	// waiting), and a timed wake-up with nothing to do costs thousands of
	// shared clients as much as their grants.
	wait = sharedIdle
	if c.closed.Load() {
		return ch, 0, time.Hour
	}
	c.normalizeLocked(now)
	cur, nx := c.cur.Load(), c.next.Load()
	switch {
	case cur == nil:
		if !c.sharedIdle(now) || c.waiters.Load() > 0 {
			return ch, c.sharedCount(), wait
		}
		return ch, 0, wait
	case nx != nil:
		cur.kicked.Store(true) // the next run is here: Next need not kick
		return ch, 0, min(wait, time.Duration(max(cur.validUntil-now, 0)))
	case cur.kicked.Load():
		return ch, c.sharedCount(), wait
	case c.sharedIdle(now):
		return ch, 0, wait
	}
	left, lead := c.timeLeft(cur, now), int64(c.sharedLead())
	if left <= lead {
		// Asked for on time: Next's kick (a channel send on its hot
		// path) is not needed for this run any more.
		cur.kicked.Store(true)
		return ch, c.sharedCount(), wait
	}
	return ch, 0, min(wait, time.Duration(left-lead))
}

// wantCode reports whether the shared loop should try to take a code now:
// the shared path is unusable, or the rate has stayed above DedicatedRate
// for dedicatedAfter; and the last failed attempt's backoff is over.
func (c *lane) wantCode(now int64) bool {
	s := c.shared
	if c.pol.ratePerSec() > DedicatedRate {
		if s.aboveSince == 0 {
			s.aboveSince = now
		}
	} else {
		s.aboveSince = 0
	}
	want := s.dedicated || (s.aboveSince != 0 && now-s.aboveSince >= int64(dedicatedAfter))
	return want && now >= s.retryAt
}

// sharedSource is the shared path: runs a replica carves out of its own
// code (AllocateShared), until the lane's rate needs a code of its own
// (switchTo) or the service turns out not to serve shared runs.
type sharedSource struct{ c *lane }

func (s *sharedSource) name() string { return "shared run" }

func (s *sharedSource) plan(now int64) (<-chan struct{}, int, time.Duration) {
	c := s.c
	ch, n, wait := c.planShared(now)
	if n == 0 && c.shared.dedicated {
		wait = min(wait, time.Duration(max(c.shared.retryAt-now, 0)))
	}
	return ch, n, wait
}

// sleep leaves timed wake-ups where they fall: the grid lines up refills
// so their etcd writes share a Txn, and shared runs write nothing; lined
// up, thousands of shared clients would wake as one herd.
func (s *sharedSource) sleep(d time.Duration) time.Duration { return d }

func (s *sharedSource) fetch(n int) error { return s.c.refillShared(n) }

func (s *sharedSource) recover(err error, bo *backoff) (bool, time.Duration) {
	c := s.c
	if !sharedUnsupported(err) {
		return false, 0
	}
	// A replica without the shared path (an older one, or one without a
	// minter): take a code; meanwhile keep asking.
	c.stats.refillErrors.Add(1)
	c.setRefillErr(err)
	if sh := c.shared; !sh.dedicated {
		sh.dedicated, sh.retryAt = true, 0
		c.log.Warn("rangeclient: the service does not serve shared runs; taking a worker code", "err", err)
	}
	return true, bo.next()
}

// switchTo is the lane's own code once it wants one (wantCode) and has
// taken it with its first block (takeCode); until then nil, and a failed
// attempt backs off.
func (s *sharedSource) switchTo(now int64) source {
	c := s.c
	if !c.wantCode(now) {
		return nil
	}
	if c.takeCode() {
		return &codeSource{c: c}
	}
	c.shared.retryAt = c.now() + int64(c.shared.acquireBo.next())
	return nil
}

// takeCode moves the client from the shared path to a worker code of its
// own: it acquires a lease and its first block before it leaves the shared
// runs, so Next does not wait, and starts that block above every shared
// position it was granted, so its IDs stay in order. It reports false
// (the client stays on the shared path) when the lease or the block cannot
// be had now: no free code, the identity's cap, the service unreachable.
func (c *lane) takeCode() bool {
	s := c.shared
	l, err := c.acquire(c.ctx)
	if err != nil {
		c.log.Info("rangeclient: no worker code for now; staying on the shared path", "err", err)
		return false
	}
	fail := func(err error) bool {
		c.log.Warn("rangeclient: first block on the new code failed; staying on the shared path", "worker", l.seg.Worker, "err", err)
		c.releaseQuietly(context.Background(), l.seg) // also when closing: bounded by RPCTimeout
		return false
	}
	n := c.blockCount(c.pol.ratePerSec(), time.Duration(c.pol.latency.Load()))
	ctx, cancel := context.WithTimeout(c.ctx, c.cfg.Tuning.RPCTimeout)
	sent := c.now()
	sb, err := c.alloc.Allocate(ctx, l.seg, n)
	arrive := c.now()
	cancel()
	if err != nil {
		return fail(err)
	}
	if err := sb.Check(l.seg, int64(n)); err != nil {
		return fail(err)
	}
	if err := c.ends.admit(sb, l.seg.Token); err != nil {
		c.stats.overlaps.Add(1)
		return fail(err)
	}
	b := newBlock(sb, l, sent, arrive)
	b.kickAt = c.kickAt(b)

	c.mu.Lock()
	if c.closed.Load() {
		c.mu.Unlock()
		l.kill(ErrClosed)
		return fail(ErrClosed)
	}
	if f := afterL(s.after, b.base); f > b.lo {
		if f >= b.hi {
			c.mu.Unlock()
			return fail(fmt.Errorf("block [%d,%d) ends below the shared runs' last ID %d", b.lo, b.hi, s.after))
		}
		b.takeFrom(f, 0) // jump the cursor: positions below f are a gap
	}
	old := c.lease.Load()
	c.killLeaseLocked(old, errSwitched) // seals the shared blocks
	c.lease.Store(l)
	b.arm()
	c.cur.Store(b)
	c.stats.refills.Add(1)
	c.refillErr = nil
	c.broadcastLocked()
	c.mu.Unlock()

	c.log.Info("rangeclient: the client's rate needs a worker code; left the shared path",
		"rate", c.pol.ratePerSec(), "worker", l.seg.Worker)
	c.wg.Add(1)
	go c.leaseLoop(l) // the refill loop goes on with the code as its source
	return true
}
