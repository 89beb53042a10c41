package rangeclient

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Client mints IDs from blocks granted by the range service. It is safe for
// concurrent use. Build it with New; Close it to give its lease back.
type Client struct {
	// The fields Next reads come first, in one cache line (TestClientLayout).

	cur atomic.Pointer[block] // block minted from
	// origin is the client's start on Go's monotonic clock: every local
	// instant is nanoseconds since it (Client.now), so a step of the wall
	// clock cannot reach the client.
	origin time.Time
	// lanes are the client's further codes (Config.Codes - 1 of them), each
	// a single-code Client over the same allocator; nil with one code.
	lanes []*Client

	cfg   Config
	alloc segment.Allocator
	conns []*grpc.ClientConn // none with Config.Allocator
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

	ctx       context.Context // cancelled by Close
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	closed    atomic.Bool
	closeOnce sync.Once
	closeErr  error

	waiters atomic.Int64 // callers blocked waiting for a block
	stats   counters
	pol     policy // refill loop state (rate, latency, idleness)
	metrics *collector
	ends    *codeEnds // per code held, the end of the blocks granted (shared by the lanes)
	// shared is the shared path's state: set by New when the client
	// started on it (Config.Codes 0), kept after it takes a code.
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

// New validates cfg, learns the service's region (with Targets; see
// Config.Region), acquires a worker-code lease and waits for the first
// block, so the first Next does not wait on the network. Retryable failures
// (service unreachable, no free code) are retried with backoff until ctx is
// done: pass a ctx with a deadline. Bad configuration, a region the service
// does not serve (ErrInvalidConfig when Config.Region disagrees with the
// service's answer) and similar final errors return at once.
func New(ctx context.Context, cfg Config) (*Client, error) {
	return newClient(ctx, cfg, newCodeEnds())
}

// newClient is New with the record of blocks granted per code that the
// client's codes share (New makes one; the lanes get their first code's).
func newClient(ctx context.Context, cfg Config, ends *codeEnds) (*Client, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	c := &Client{
		ends:   ends,
		cfg:    cfg,
		log:    cfg.Logger,
		origin: time.Now(),
		waitCh: make(chan struct{}),
		recent: make([]*block, 0, 8),
		kick:   make(chan struct{}, 1),

		leaseKick: make(chan struct{}, 1),
	}
	if c.log == nil {
		c.log = slog.New(slog.DiscardHandler)
	}
	c.ctx, c.cancel = context.WithCancel(context.Background())
	if cfg.Allocator != nil {
		c.alloc = cfg.Allocator
	} else {
		alloc, conns, err := dial(cfg, c.log)
		if err != nil {
			c.cancel()
			return nil, fmt.Errorf("rangeclient: dial %v: %w", cfg.Targets, err)
		}
		c.alloc, c.conns = alloc, conns
		// Before anything else reads c.cfg (metrics, loops): Region may change.
		if err := c.learnRegion(ctx); err != nil {
			c.abort()
			return nil, err
		}
	}
	c.pol.init(c, c.now())
	if cfg.Registerer != nil {
		c.metrics = newCollector(c)
		if err := cfg.Registerer.Register(c.metrics); err != nil {
			c.abort()
			return nil, fmt.Errorf("rangeclient: register metrics (wrap Config.Registerer with distinct labels per client): %w", err)
		}
	}
	shared, err := c.startShared(ctx)
	if err != nil {
		c.abort()
		return nil, err
	}
	if !shared {
		l, err := c.firstLease(ctx)
		if err != nil {
			c.abort()
			return nil, err
		}
		c.lease.Store(l)
		c.wg.Add(2)
		go c.leaseLoop(l)
		go c.refillLoop()
		if err := c.waitFirstBlock(ctx); err != nil {
			c.Close()
			return nil, err
		}
	}
	if err := c.startLanes(ctx); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// startLanes starts the client's further codes: single-code clients over
// the same allocator, in the region the first one settled on.
func (c *Client) startLanes(ctx context.Context) error {
	lc := c.cfg
	lc.Codes, lc.Targets, lc.Allocator, lc.Registerer = 1, nil, c.alloc, nil
	lc.Region = c.lease.Load().seg.Region
	for i := 1; i < c.cfg.Codes; i++ {
		l, err := newClient(ctx, lc, c.ends)
		if err != nil {
			return fmt.Errorf("rangeclient: code %d of %d: %w", i+1, c.cfg.Codes, err)
		}
		c.lanes = append(c.lanes, l)
	}
	return nil
}

// lane picks the code a call mints from: c itself or one of its lanes, at
// random (math/rand/v2's per-thread source: no shared state).
func (c *Client) lane() *Client {
	if i := rand.IntN(len(c.lanes) + 1); i > 0 {
		return c.lanes[i-1]
	}
	return c
}

// abort undoes a New that failed before the loops started.
func (c *Client) abort() {
	c.closed.Store(true)
	c.cancel()
	if c.metrics != nil {
		c.cfg.Registerer.Unregister(c.metrics)
	}
	for _, conn := range c.conns {
		conn.Close()
	}
}

// firstLease acquires the first lease, retrying retryable errors until ctx
// is done.
func (c *Client) firstLease(ctx context.Context) (l *leaseState, err error) {
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
func (c *Client) retryUntil(ctx context.Context, what, goal string, try func() (done bool, err error)) error {
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
func (c *Client) waitFirstBlock(ctx context.Context) error {
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
func (c *Client) now() int64 {
	return int64(time.Since(c.origin))
}

// fresh reports whether b may mint at now: before its lease's safety
// deadline and before its own validity ends.
func (c *Client) fresh(b *block, now int64) bool {
	return now < b.lease.deadline.Load() && now < b.validUntil
}

// Next returns a new ID. At steady state it is one clock reading and one
// atomic add on the current block (a compare-and-swap, once per
// millisecond at most, when the clock has left the cursor's millisecond
// and the cursor jumps to it), with no lock, no allocation and no network
// call; it reads one cache line of the Client and one of the block (the
// block's stop stands for its lease's deadline: see block).
//
// It never mints under a lease past its safety deadline or fenced by the
// service; it then waits, within ctx, for the client to acquire a new
// lease by itself, as it waits for a refill when both buffered blocks are
// used up. If ctx ends first it returns ErrUnavailable (retryable), which
// wraps the cause: ErrLeaseLost, ErrFenced or the last refill error, and
// ctx's error. A ctx without deadline waits until recovery or Close. After
// Close it fails at once with ErrClosed. Above 4,096 IDs/ms the client runs
// ahead of time until the service's bounded lead applies backpressure; Next
// then waits (within ctx) for the service to grant again.
func (c *Client) Next(ctx context.Context) (snowflake.ID, error) {
	if c.lanes != nil {
		if l := c.lane(); l != c {
			return l.Next(ctx)
		}
	}
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

// NextN returns n new IDs (n >= 0). Runs of consecutive IDs are reserved
// with one compare-and-swap each. On error the IDs returned so far are
// valid and unique.
func (c *Client) NextN(ctx context.Context, n int) ([]snowflake.ID, error) {
	if n < 0 {
		return nil, fmt.Errorf("rangeclient: NextN count %d is negative", n)
	}
	return c.AppendN(ctx, make([]snowflake.ID, 0, n), n)
}

// AppendN appends n new IDs to dst and returns it, like NextN; it does not
// allocate when dst has room.
func (c *Client) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	if n < 0 {
		return dst, fmt.Errorf("rangeclient: AppendN count %d is negative", n)
	}
	if c.lanes != nil {
		if l := c.lane(); l != c {
			return l.AppendN(ctx, dst, n)
		}
	}
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
func (c *Client) reserve(ctx context.Context, n int64) (*block, int64, int64, error) {
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
func (c *Client) reserveSlow(ctx context.Context, n int64) (*block, int64, int64, error) {
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
func (c *Client) prefetch(b *block) {
	if !b.kicked.Load() {
		c.kickOnce(b)
	}
}

// kickOnce is prefetch's once-per-block part. It is kept out of line so
// that its compare-and-swap and channel send do not sit in Next's hot
// code: fewer instruction cache lines per call.
//
//go:noinline
func (c *Client) kickOnce(b *block) {
	if b.kicked.CompareAndSwap(false, true) {
		c.kickRefill()
	}
}

func (c *Client) kickRefill() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// waitState returns the channel closed at the next state change and the
// last refill error, read together.
func (c *Client) waitState() (<-chan struct{}, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.waitCh, c.refillErr
}

func (c *Client) broadcastLocked() {
	close(c.waitCh)
	c.waitCh = make(chan struct{})
}

// rotate replaces b if it is still the current block and cannot be used.
func (c *Client) rotate(b *block) {
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
func (c *Client) usable(b *block, l *leaseState, now int64) bool {
	return b.lease == l && l.err(now) == nil && !b.finished(now)
}

// normalizeLocked retires finished or stale blocks and promotes the
// prefetched one, keeping the invariant next != nil => cur != nil.
func (c *Client) normalizeLocked(now int64) {
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
func (c *Client) promoteLocked() {
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
func (c *Client) retireLocked(b *block) {
	b.seal()
	if len(c.recent) == cap(c.recent) {
		c.folded += c.recent[0].minted()
		copy(c.recent, c.recent[1:])
		c.recent = c.recent[:len(c.recent)-1]
	}
	c.recent = append(c.recent, b)
}

// dropLeaseBlocksLocked removes the blocks granted under l.
func (c *Client) dropLeaseBlocksLocked(l *leaseState) {
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

// Close stops minting at once, stops the background loops (cancelling
// their calls), gives the lease back (best effort, within RPCTimeout: it
// expires by its TTL anyway) and unregisters the metrics. It returns within
// about RPCTimeout whatever the network does. Later calls return
// ErrClosed; Close is idempotent and returns the first call's result.
func (c *Client) Close() error {
	c.closeOnce.Do(func() {
		errs := make([]error, len(c.lanes)+1)
		var wg sync.WaitGroup
		for i, l := range c.lanes {
			wg.Go(func() { errs[i+1] = l.Close() })
		}
		errs[0] = c.close()
		wg.Wait()
		// The lanes release their leases over these connections too:
		// close them only once every code is given back.
		for _, conn := range c.conns {
			if err := conn.Close(); err != nil {
				errs = append(errs, fmt.Errorf("rangeclient: close connection: %w", err))
			}
		}
		c.closeErr = join(errs...)
	})
	return c.closeErr
}

// close stops this code: loops, lease, metrics. Close closes the
// connections afterwards, once the lanes are done with them too.
func (c *Client) close() error {
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
	if c.metrics != nil {
		c.cfg.Registerer.Unregister(c.metrics)
	}
	return join(errs...)
}
