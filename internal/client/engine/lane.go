package engine

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// lane is one worker code's worth of the engine (or the shared path's): its
// buffer of blocks, its lease, its source of blocks and the refill loop
// over it. The lanes of an engine share its allocator and its record of
// the blocks granted per code (ends).
type lane struct {
	// The fields Next reads come first, in one cache line with the
	// Engine's more (TestClientLayout).

	cur atomic.Pointer[block] // block minted from
	// origin is the lane's start on Go's monotonic clock: every local
	// instant is nanoseconds since it (lane.now), so a step of the wall
	// clock cannot reach the engine.
	origin time.Time

	cfg   Config
	alloc segment.Allocator
	log   *slog.Logger

	next  atomic.Pointer[block] // prefetched block, promoted when cur ends
	lease atomic.Pointer[leaseState]

	mu        sync.Mutex    // serialises block installs, rotation and waitCh
	waitCh    chan struct{} // closed (and replaced) on every state change
	refillErr error         // last refill failure, nil after a success
	recent    []*block      // last retired blocks (sealed), counted live
	folded    int64         // IDs minted from older retired blocks

	kick      chan struct{} // wakes the refill loop (capacity 1)
	leaseKick chan struct{} // tells the lease loop a caller waits (capacity 1)

	ctx    context.Context // cancelled by close
	cancel context.CancelFunc
	wg     sync.WaitGroup
	closed atomic.Bool

	waiters atomic.Int64 // callers blocked waiting for a block
	stats   counters
	pol     policy     // refill loop state (rate, latency, idleness)
	metrics *collector // the engine's, on its first lane; nil on the others
	ends    *codeEnds  // per code held, the end of the blocks granted (shared by the lanes)
	// src is where the refill loop gets blocks: a code of the lane's own,
	// or shared runs (source_code.go, source_shared.go). The refill loop
	// owns it; it changes once at most, when a lane on the shared path
	// takes a code.
	src source
	// shared is the shared path's state: set when the lane started on it
	// (Config.Codes 0), kept after it takes a code.
	shared *sharedState
}

// counters are the client's monotonic counts. The hot path never touches
// them: minted IDs are derived from the blocks' cursors.
type counters struct {
	mintedHigh atomic.Int64 // largest Minted reported (keeps it monotonic)

	refills, refillErrors, backpressure, discarded atomic.Uint64
	stalls                                         atomic.Uint64
	acquisitions, renewals, renewalFailures        atomic.Uint64
	expiries, fenced, overlaps, dropped            atomic.Uint64
}

// init sets the lane up over alloc; nothing runs until start.
func (c *lane) init(cfg Config, alloc segment.Allocator, ends *codeEnds) {
	c.ends = ends
	c.cfg = cfg
	c.alloc = alloc
	c.log = cfg.Logger
	c.origin = time.Now()
	c.waitCh = make(chan struct{})
	c.recent = make([]*block, 0, 8)
	c.kick = make(chan struct{}, 1)
	c.leaseKick = make(chan struct{}, 1)
	c.ctx, c.cancel = context.WithCancel(context.Background())
	c.pol.init(c, c.now())
}

// start takes the lane's first block, from shared runs when it may use
// them and the service offers them, else under a lease of its own, and
// starts its loops.
func (c *lane) start(ctx context.Context) error {
	shared, err := c.startShared(ctx)
	if err != nil || shared {
		return err
	}
	l, err := c.firstLease(ctx)
	if err != nil {
		return err
	}
	c.lease.Store(l)
	c.src = &codeSource{c: c}
	c.wg.Add(2)
	go c.leaseLoop(l)
	go c.refillLoop()
	if err := c.waitFirstBlock(ctx); err != nil {
		c.close()
		return err
	}
	return nil
}

// abort undoes an init or a start that failed before the loops started.
func (c *lane) abort() {
	c.closed.Store(true)
	c.cancel()
}

// firstLease acquires the first lease, retrying retryable errors until ctx
// is done.
func (c *lane) firstLease(ctx context.Context) (l *leaseState, err error) {
	err = c.retryUntil(ctx, "acquire", "lease", func() (bool, error) {
		var err error
		l, err = c.acquire(ctx)
		final := err == nil || errors.Is(err, ErrInvalidConfig) || errors.Is(err, segment.ErrInvalid) ||
			errors.Is(err, segment.ErrCorrupt) || errors.Is(err, segment.ErrEpochExhausted) || errors.Is(err, wire.ErrProtocol) ||
			errors.Is(err, segment.ErrPermissionDenied)
		return final, err
	})
	return l, err
}

// retryUntil calls try until it reports done (success or a final error,
// which it returns), waiting with backoff between tries and logging each
// retryable failure of what. When ctx ends first it returns ErrUnavailable
// ("no goal before the context ended") wrapping ctx's error and the last
// answer that was not ctx running out, so the cause stays matchable.
func (c *lane) retryUntil(ctx context.Context, what, goal string, try func() (done bool, err error)) error {
	bo := c.newBackoff()
	var cause error
	for {
		done, err := try()
		if done {
			return err
		}
		if cause == nil || ctx.Err() == nil {
			cause = err
		}
		c.log.Warn("rangeclient: "+what+" failed; retrying", "err", err)
		select {
		case <-time.After(bo.next()):
		case <-ctx.Done():
			return mark(fmt.Errorf("rangeclient: no %s before the context ended: %w", goal, join(ctx.Err(), cause)), ErrUnavailable)
		}
	}
}

// waitFirstBlock waits until a block is buffered.
func (c *lane) waitFirstBlock(ctx context.Context) error {
	for {
		ch, rerr := c.waitState()
		l := c.lease.Load()
		if err := l.err(c.now()); err != nil && !isUnsafeCode(err) {
			return err // a dropped code is replaced by the lease loop: wait for it
		}
		if c.cur.Load() != nil {
			return nil
		}
		if rerr != nil && isFinalRefillError(rerr) {
			return fmt.Errorf("rangeclient: first block: %w", rerr)
		}
		select {
		case <-ch:
		case <-ctx.Done():
			_, rerr = c.waitState()
			return unavailable(ctx.Err(), rerr)
		}
	}
}

// unavailable is the error for "no block before the caller's deadline":
// marked ErrUnavailable, with the context's error and the last refill
// error (backpressure, service unreachable) both in the chain.
func unavailable(ctxErr, refillErr error) error {
	if refillErr != nil {
		return mark(fmt.Errorf("rangeclient: no block available: %w", join(ctxErr, refillErr)), ErrUnavailable)
	}
	return mark(fmt.Errorf("rangeclient: no block available yet: %w", ctxErr), ErrUnavailable)
}

// now is the local time: nanoseconds since the client started, on Go's
// monotonic clock. It never goes backwards, and a wall-clock step does not
// move it.
func (c *lane) now() int64 {
	return int64(time.Since(c.origin))
}

// fresh reports whether b may mint at now: before its lease's safety
// deadline and before its own validity ends.
func (c *lane) fresh(b *block, now int64) bool {
	return now < b.lease.deadline.Load() && now < b.validUntil
}

// nextID is Engine.Next on this lane.
func (c *lane) nextID(ctx context.Context) (snowflake.ID, error) {
	if b := c.cur.Load(); b != nil {
		until := b.until()
		now := c.now()
		// Each path returns by itself (not through one shared tail), so
		// the common call's instructions stay in a few cache lines.
		if now < until {
			if l, ok := b.add1(); ok {
				if l >= b.kickAt {
					c.prefetch(b)
				}
				return b.id(l), nil
			}
		} else if now < b.stop.Load() {
			l, ok := b.take1(now)
			if !ok {
				l, _, ok = b.take(now, 1)
			}
			if ok {
				if l >= b.kickAt {
					c.prefetch(b)
				}
				return b.id(l), nil
			}
		}
	}
	b, l, _, err := c.reserveSlow(ctx, 1)
	if err != nil {
		return 0, err
	}
	return b.id(l), nil
}

// appendN is Engine.AppendN on this lane.
func (c *lane) appendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	for n > 0 {
		b, first, k, err := c.reserve(ctx, int64(n))
		if err != nil {
			return dst, err
		}
		for l := first; l < first+k; l++ {
			dst = append(dst, b.id(l))
		}
		n -= int(k)
	}
	return dst, nil
}

// reserve takes up to n consecutive positions from the current block.
func (c *lane) reserve(ctx context.Context, n int64) (*block, int64, int64, error) {
	if b := c.cur.Load(); b != nil {
		now := c.now()
		if now < b.stop.Load() {
			if f, k, ok := b.take(now, n); ok {
				if f+k > b.kickAt {
					c.prefetch(b)
				}
				return b, f, k, nil
			}
		}
	}
	return c.reserveSlow(ctx, n)
}

// reserveSlow is the path off the fast one: it promotes the prefetched
// block when the current one is finished, and otherwise waits within ctx
// for a refill or, when the lease is lost or fenced, for the lease loop to
// acquire a new one. It never mints under a lease past its deadline.
func (c *lane) reserveSlow(ctx context.Context, n int64) (*block, int64, int64, error) {
	waiting := false
	defer func() {
		if waiting {
			c.waiters.Add(-1)
		}
	}()
	wait := func(ch <-chan struct{}, forLease bool) error {
		if !waiting {
			waiting = true
			c.waiters.Add(1)
			c.stats.stalls.Add(1)
		}
		if forLease {
			select {
			case c.leaseKick <- struct{}{}:
			default:
			}
		}
		select {
		case <-ch:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for {
		if c.closed.Load() {
			return nil, 0, 0, ErrClosed
		}
		l := c.lease.Load()
		now := c.now()
		if err := l.err(now); err != nil {
			if errors.Is(err, ErrClosed) {
				return nil, 0, 0, err
			}
			// Read the state channel, then check again: a new lease
			// installed in between closed the channel read before it.
			ch, _ := c.waitState()
			if c.lease.Load() != l {
				continue
			}
			// The lease loop replaces a lost or fenced lease by itself;
			// tell it a caller waits, so it retries sooner.
			if cerr := wait(ch, true); cerr != nil {
				return nil, 0, 0, mark(fmt.Errorf("rangeclient: no usable lease: %w", join(cerr, err)), ErrUnavailable)
			}
			continue
		}
		if b := c.cur.Load(); b != nil {
			if b.lease == l && c.fresh(b, now) {
				if f, k, ok := b.take(now, n); ok {
					if f+k > b.kickAt {
						c.prefetch(b)
					}
					return b, f, k, nil
				}
			}
			c.rotate(b)
			continue
		}
		// No block: read the state channel, then check again (a block
		// installed in between closed the channel read before it). The
		// rotation above needs neither, so switching to the next block
		// takes the mutex once.
		ch, rerr := c.waitState()
		if c.cur.Load() != nil {
			continue
		}
		if rerr != nil && isFinalRefillError(rerr) {
			return nil, 0, 0, fmt.Errorf("rangeclient: no block buffered and the service refuses to grant one: %w", rerr)
		}
		c.kickRefill()
		if cerr := wait(ch, false); cerr != nil {
			_, rerr = c.waitState()
			return nil, 0, 0, unavailable(cerr, rerr)
		}
	}
}

// prefetch wakes the refill loop once per block, when the cursor crosses
// the block's prefetch point. Only the load of kicked inlines into the
// hot path (see kickOnce).
func (c *lane) prefetch(b *block) {
	if !b.kicked.Load() {
		c.kickOnce(b)
	}
}

// kickOnce is prefetch's once-per-block part. It is kept out of line so
// that its compare-and-swap and channel send do not sit in Next's hot
// code: fewer instruction cache lines per call.
//
//go:noinline
func (c *lane) kickOnce(b *block) {
	if b.kicked.CompareAndSwap(false, true) {
		c.kickRefill()
	}
}

func (c *lane) kickRefill() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// close stops the lane: its loops and its lease. Engine.Close closes the
// connections and the metrics afterwards, once every lane is done.
func (c *lane) close() error {
	// Cancel first: a lease loop woken by the kill below must not acquire
	// a new lease on its way out.
	c.cancel()
	c.mu.Lock()
	c.closed.Store(true)
	l := c.lease.Load()
	alive := l != nil && l.err(c.now()) == nil && !l.isShared()
	if l != nil {
		c.killLeaseLocked(l, ErrClosed)
	}
	c.broadcastLocked()
	c.mu.Unlock()
	c.wg.Wait()

	var errs []error
	if alive {
		if err := c.releaseQuietly(context.Background(), l.seg); err != nil {
			errs = append(errs, fmt.Errorf("rangeclient: release lease: %w", err))
		}
	}
	return join(errs...)
}
