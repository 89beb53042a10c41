// Package mintpool is a replica's own minter: the worker codes it holds
// for MintBatch, Next and the shared path (AllocateShared), one minter per
// code, taken as demand needs them and given back when it falls.
//
// One code mints at most CodeRate (4,096 IDs per millisecond). Above that
// its cursor runs ahead of the clock, and the IDs it hands out carry
// timestamps from the future. The pool keeps every code within MaxLead of
// the clock (1 s by default, far below the store's MaxLead of 15 s): a
// caller that finds every code beyond it gets a *segment.Backpressure with
// the time until one is back within it, never an ID or run dated further
// ahead. Before it comes to that, the pool takes another code when the
// demand it measures nears what its codes sustain (growShare), up to
// MaxCodes, and gives one back when demand has stayed well below what one
// code fewer sustains for shrinkAfter (docs/design.md, "The shared path").
//
// Uniqueness does not depend on any of this: every ID and run comes from a
// block granted to one of the pool's minters under its own lease, below
// that code's committed high-water mark, and each position is taken once
// with the minter's atomic cursor. A code given back is released like any
// client's; its next owner starts above its mark, so above every run
// carved from it.
package mintpool

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// CodeRate is the most one worker code mints: 4,096 IDs per millisecond.
const CodeRate = float64(snowflake.MaxSequence+1) * 1000

// Defaults for Config fields left zero.
const (
	// DefaultMaxCodes bounds the codes one replica holds for its own
	// minting (rangesvc serve --shared-codes): 4 codes mint 16.4M IDs/s,
	// and cost 4 of the region's 256 codes per replica at most.
	DefaultMaxCodes = 4
	// DefaultMaxLead is how far ahead of the clock a code may run before
	// callers get backpressure.
	DefaultMaxLead = time.Second
)

// MaxCodesLimit bounds Config.MaxCodes: a region has 256 codes for all its
// clients and replicas.
const MaxCodesLimit = 64

const (
	// growShare: the pool takes another code when the demand it measured
	// (IDs/s, EWMA over rateWindow) is above this share of what its codes
	// mint, when its least advanced code is more than growLead of MaxLead
	// ahead of the clock (demand counts IDs, but the codes also lose the
	// positions a run jumps over to start above its client's last ID), or
	// when a caller found every code beyond MaxLead.
	growShare   = 0.75
	growLeadDiv = 4
	// shrinkShare and shrinkAfter: it gives a code back when demand has
	// stayed below this share of what one code fewer mints for this long.
	// The gap between the two shares keeps a steady demand from taking
	// and giving back a code in turn.
	shrinkShare = 0.5
	shrinkAfter = 30 * time.Second
	// adjustEvery is the period of Run's measurement.
	adjustEvery = 250 * time.Millisecond
	// rateWindow is the time constant of the demand estimate.
	rateWindow = time.Second
	// openTimeout bounds one attempt to take a code (lease and first
	// block); failed attempts back off from openRetryMin to openRetryMax.
	openTimeout  = 10 * time.Second
	openRetryMin = time.Second
	openRetryMax = 30 * time.Second
	// aheadSlack is how far past its lead bound an AppendN's last ID may
	// be when the code's lead was not known before it (the batch's own
	// span, up to 25 ms of a code, and the call's time).
	aheadSlack = 100 * time.Millisecond
)

// ErrClosed is returned by every method after Close.
var ErrClosed = errors.New("mintpool: closed")

// Minter mints from one worker code of its own. The replica's are
// rangeclient clients over its store, with Codes 1.
type Minter interface {
	// AppendN appends n new IDs to dst.
	AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error)
	// Carve carves a shared run (package carve's rules).
	Carve(ctx context.Context, r carve.Request) (segment.Block, error)
	// Close gives the code back.
	Close() error
}

// Config configures a Pool. Open is required.
type Config struct {
	// Open takes a new code: a minter holding its lease and first block.
	Open func(ctx context.Context) (Minter, error)
	// MaxCodes bounds the codes held at once (1..MaxCodesLimit). Default
	// DefaultMaxCodes.
	MaxCodes int
	// MaxLead bounds how far ahead of the clock a code runs. Default
	// DefaultMaxLead.
	MaxLead time.Duration
	// Keep makes Run take the first code at once, and retry until it has
	// one (the shared path carves from it: it must hold a code before
	// clients take every code of the region). Without it the first code
	// is taken by the first call that needs one.
	Keep bool
	// Now is the service clock, which stamps the minters' IDs. Default
	// time.Now.
	Now func() time.Time
	// NotBefore is the replica's restart floor (store.Store.RestartFloor;
	// zero: none): no block it grants starts before it, so until the
	// clock gets there every code's IDs are dated at or after it, and the
	// lead bound counts from it rather than from the clock.
	NotBefore time.Time
	// Logger receives a line per code taken or given back; nil discards.
	Logger *slog.Logger
}

// Validate reports the first field of c out of range.
func (c Config) Validate() error {
	switch {
	case c.Open == nil:
		return errors.New("mintpool: Config.Open is required")
	case c.MaxCodes < 0 || c.MaxCodes > MaxCodesLimit:
		return fmt.Errorf("mintpool: Config.MaxCodes %d not in 1..%d (0: default %d)", c.MaxCodes, MaxCodesLimit, DefaultMaxCodes)
	case c.MaxLead < 0:
		return fmt.Errorf("mintpool: Config.MaxLead %v is negative", c.MaxLead)
	}
	return nil
}

func (c Config) withDefaults() Config {
	if c.MaxCodes == 0 {
		c.MaxCodes = DefaultMaxCodes
	}
	if c.MaxLead == 0 {
		c.MaxLead = DefaultMaxLead
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Pool holds a replica's codes. It is safe for concurrent use.
type Pool struct {
	cfg Config

	list atomic.Pointer[[]*member] // the codes callers use; replaced, never changed

	openMu  sync.Mutex // serialises opening codes
	mu      sync.Mutex // guards closed, opening and list's replacement
	closed  bool
	opening bool

	demand atomic.Int64  // IDs handed out since Run last measured
	behind atomic.Bool   // a caller found every code beyond MaxLead since then
	kick   chan struct{} // wakes Run before its next tick: a code ran ahead
	rr     atomic.Uint64

	// Run's own.
	rate     float64   // demand, IDs/s
	measured time.Time // last measurement
	lowSince time.Time // start of the current spell of low demand
	retryAt  time.Time // next attempt at the first code (Keep)
	retry    time.Duration
	bg       sync.WaitGroup
}

// member is one code of the pool.
type member struct {
	m Minter
	// aheadMs is the latest millisecond the code handed out (an ID's or
	// a run's last): its lead at now is aheadMs - now.
	aheadMs atomic.Int64
	// use is held for reading by every call on m, and for writing to
	// retire it: a code given back waits for its calls in flight.
	use     sync.RWMutex
	retired bool
}

// New returns a Pool holding no code yet.
func New(cfg Config) (*Pool, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Pool{cfg: cfg.withDefaults(), kick: make(chan struct{}, 1)}, nil
}

func (p *Pool) members() []*member {
	if l := p.list.Load(); l != nil {
		return *l
	}
	return nil
}

// Codes is the number of codes the pool holds.
func (p *Pool) Codes() int { return len(p.members()) }

// Lead is how far ahead of the clock the pool's least advanced code is:
// the lead a caller gets now (0 when it holds none, or none is ahead).
func (p *Pool) Lead() time.Duration { return p.lead(p.cfg.Now()) }

func (p *Pool) lead(at time.Time) time.Duration {
	ms := p.members()
	if len(ms) == 0 {
		return 0
	}
	m, _ := pick(ms, p.rr.Load())
	return time.Duration(max(m.aheadMs.Load()-p.base(at), 0)) * time.Millisecond
}

// Rate is the demand the pool measured, in IDs/s.
func (p *Pool) Rate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// base is the millisecond leads are counted from at instant at: the
// clock's, or the restart floor's while the clock is below it (the codes
// cannot be behind it).
func (p *Pool) base(at time.Time) int64 {
	now := snowflake.MsSince(at)
	if !p.cfg.NotBefore.IsZero() {
		now = max(now, snowflake.MsSince(p.cfg.NotBefore))
	}
	return now
}

// pick is the least advanced member (the least lead, whatever the clock),
// scanning from start (the first of equal leads wins: callers rotate start
// to spread over codes); it also returns its index.
func pick(ms []*member, start uint64) (*member, int) {
	best, bi := (*member)(nil), 0
	for i := range ms {
		j := int((start + uint64(i)) % uint64(len(ms)))
		if best == nil || ms[j].aheadMs.Load() < best.aheadMs.Load() {
			best, bi = ms[j], j
		}
	}
	return best, bi
}

// ready returns the codes, taking the first one if the pool holds none.
func (p *Pool) ready(ctx context.Context) ([]*member, error) {
	if ms := p.members(); len(ms) > 0 {
		return ms, nil
	}
	if err := p.Open(ctx); err != nil {
		if errors.Is(err, ErrClosed) {
			return nil, err
		}
		// No code for now: the replica is unavailable to its callers,
		// whatever the reason (no free code, etcd down).
		return nil, fmt.Errorf("mintpool: no code to mint from: %w: %w", err, segment.ErrUnavailable)
	}
	return p.members(), nil
}

// Open takes the first code now if the pool holds none: a replica serving
// the shared path does so at start (Run does, with Keep).
func (p *Pool) Open(ctx context.Context) error {
	p.openMu.Lock()
	defer p.openMu.Unlock()
	if len(p.members()) > 0 {
		return nil
	}
	return p.add(ctx)
}

// add takes one more code; callers hold openMu.
func (p *Pool) add(ctx context.Context) error {
	p.mu.Lock()
	closed := p.closed
	p.mu.Unlock()
	if closed {
		return ErrClosed
	}
	m, err := p.cfg.Open(ctx)
	if err != nil {
		return fmt.Errorf("mintpool: take a code: %w", err)
	}
	mb := &member{m: m}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		m.Close()
		return ErrClosed
	}
	l := append(append([]*member(nil), p.members()...), mb)
	p.list.Store(&l)
	p.mu.Unlock()
	return nil
}

// do runs f on a code that is not retired: the least advanced first, then
// the others in turn while f reports that another code may serve
// (another). It returns f's last error, or ErrClosed.
func (p *Pool) do(ctx context.Context, f func(m *member) (another bool, err error)) error {
	ms, err := p.ready(ctx)
	if err != nil {
		return err
	}
	_, first := pick(ms, p.rr.Add(1))
	err = ErrClosed
	for i := range ms {
		mb := ms[(first+i)%len(ms)]
		mb.use.RLock()
		if mb.retired {
			mb.use.RUnlock()
			continue
		}
		var another bool
		another, err = f(mb)
		mb.use.RUnlock()
		if !another {
			return err
		}
	}
	return err
}

// AppendN appends n new IDs to dst from the least advanced code. When
// every code is beyond MaxLead it appends nothing and returns a
// *segment.Backpressure.
func (p *Pool) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	return p.AppendNWithin(ctx, dst, n, p.cfg.MaxLead)
}

// AppendNWithin is AppendN with a lead bound of its own, lowered to
// MaxLead: the service holds callers above their fair share to a lower
// one, keeping the rest of the lead for the others.
func (p *Pool) AppendNWithin(ctx context.Context, dst []snowflake.ID, n int, maxLead time.Duration) ([]snowflake.ID, error) {
	maxLead = min(maxLead, p.cfg.MaxLead)
	out := dst
	err := p.do(ctx, func(mb *member) (bool, error) {
		if bp := p.beyond(mb, maxLead); bp != nil {
			p.behind.Store(true)
			p.wake()
			return false, fmt.Errorf("mintpool: every code is ahead of the clock beyond %v: %w", maxLead, bp)
		}
		var err error
		out, err = mb.m.AppendN(ctx, dst, n)
		if k := len(out) - len(dst); k > 0 {
			last := out[len(out)-1].Ms()
			p.saw(mb, last)
			p.demand.Add(int64(k))
			// A code whose lead was not known yet (its first call: a
			// restarted replica's first block lies at its restart floor)
			// may have handed out IDs beyond the bound: they become a gap,
			// never the caller's.
			if bp := p.beyond(mb, maxLead+aheadSlack); bp != nil {
				out = dst
				p.behind.Store(true)
				p.wake()
				return false, fmt.Errorf("mintpool: the code is ahead of the clock beyond %v: %w", maxLead, bp)
			}
		}
		return false, err
	})
	return out, err
}

// beyond is the backpressure for mb when its lead is beyond maxLead, else
// nil.
func (p *Pool) beyond(mb *member, maxLead time.Duration) *segment.Backpressure {
	lead := time.Duration(mb.aheadMs.Load()-p.base(p.cfg.Now())) * time.Millisecond
	if lead <= maxLead {
		return nil
	}
	return &segment.Backpressure{RetryAfter: lead - maxLead}
}

// Carve carves a shared run for r from the least advanced code, or from
// the others in turn when it cannot (beyond the lead, r.After beyond its
// block). The run starts within MaxLead of the clock
// (r.MaxLead is lowered to it). When every code is beyond the lead, the
// error is a *segment.Backpressure with the shortest wait.
func (p *Pool) Carve(ctx context.Context, r carve.Request) (segment.Block, error) {
	// The engine counts the lead from the clock: until the clock reaches
	// the restart floor, the bound counts from the floor.
	now := p.cfg.Now()
	r.MaxLead = min(r.MaxLead, p.cfg.MaxLead) + max(p.cfg.NotBefore.Sub(now), 0).Truncate(time.Millisecond)
	var (
		run     segment.Block
		wait    *segment.Backpressure
		refusal error
	)
	err := p.do(ctx, func(mb *member) (bool, error) {
		b, err := mb.m.Carve(ctx, r)
		var bp *segment.Backpressure
		switch {
		case err == nil:
			p.saw(mb, (b.Hi-1)>>snowflake.SequenceBits)
			p.demand.Add(b.Len())
			run = b
			return false, nil
		case errors.As(err, &bp):
			if wait == nil || bp.RetryAfter < wait.RetryAfter {
				wait = bp
			}
			return true, err
		case errors.Is(err, segment.ErrUnavailable):
			if refusal == nil {
				refusal = err
			}
			return true, err
		}
		return false, err
	})
	switch {
	case err == nil:
		return run, nil
	case refusal != nil:
		// Some code could not serve r at all (r.After beyond its block,
		// its lease ending): the caller asks another replica.
		return segment.Block{}, refusal
	case wait != nil:
		p.behind.Store(true)
		p.wake()
		return segment.Block{}, fmt.Errorf("mintpool: every code is ahead of the clock beyond %v: %w", r.MaxLead, wait)
	}
	return segment.Block{}, err
}

// saw records that mb handed out millisecond ms, and wakes Run at once
// when that puts mb more than MaxLead/growLeadDiv ahead of the clock: a
// burst should not wait for the next tick to get another code.
func (p *Pool) saw(mb *member, ms int64) {
	for {
		old := mb.aheadMs.Load()
		if ms <= old || mb.aheadMs.CompareAndSwap(old, ms) {
			break
		}
	}
	if time.Duration(ms-p.base(p.cfg.Now()))*time.Millisecond > p.cfg.MaxLead/growLeadDiv {
		p.wake()
	}
}

// wake makes Run measure now.
func (p *Pool) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// Run measures demand and takes or gives back codes until ctx ends or the
// pool is closed; with Keep it takes the first code at once and retries
// until it has one.
func (p *Pool) Run(ctx context.Context) {
	defer p.bg.Wait()
	t := time.NewTicker(adjustEvery)
	defer t.Stop()
	for {
		if !p.adjust(ctx) {
			return
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-p.kick:
		}
	}
}

// adjust is one measurement of Run: the demand estimate, then at most one
// code taken (in the background) or given back. It reports false once the
// pool is closed.
func (p *Pool) adjust(ctx context.Context) bool {
	now := p.cfg.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	d := float64(p.demand.Swap(0))
	if !p.measured.IsZero() {
		if dt := now.Sub(p.measured); dt > 0 {
			alpha := 1 - math.Exp(-dt.Seconds()/rateWindow.Seconds())
			p.rate += alpha * (d/dt.Seconds() - p.rate)
		}
	}
	p.measured = now
	n := len(p.members())
	behind := p.behind.Swap(false)
	lead := p.lead(now)
	switch {
	case p.opening || now.Before(p.retryAt):
	case n == 0 && p.cfg.Keep:
		p.grow(ctx, now, "the shared path carves from it")
	case n > 0 && n < p.cfg.MaxCodes && (behind || p.rate > growShare*float64(n)*CodeRate || lead > p.cfg.MaxLead/growLeadDiv):
		why := fmt.Sprintf("demand %.0f IDs/s is above %.0f%% of what %d code(s) mint", p.rate, 100*growShare, n)
		switch {
		case behind:
			why = fmt.Sprintf("every code was more than %v ahead of the clock", p.cfg.MaxLead)
		case lead > p.cfg.MaxLead/growLeadDiv:
			why = fmt.Sprintf("the least advanced code is %v ahead of the clock", lead)
		}
		p.grow(ctx, now, why)
	}
	if n > 1 && p.rate < shrinkShare*float64(n-1)*CodeRate && lead <= 0 {
		if p.lowSince.IsZero() {
			p.lowSince = now
		} else if now.Sub(p.lowSince) >= shrinkAfter {
			p.shrink()
			p.lowSince = now
		}
	} else {
		p.lowSince = time.Time{}
	}
	return true
}

// grow takes one more code in the background; p.mu is held.
func (p *Pool) grow(ctx context.Context, now time.Time, why string) {
	p.opening = true
	n := len(p.members())
	p.bg.Go(func() {
		octx, cancel := context.WithTimeout(ctx, openTimeout)
		p.openMu.Lock()
		err := p.add(octx)
		p.openMu.Unlock()
		cancel()
		p.mu.Lock()
		defer p.mu.Unlock()
		p.opening = false
		switch {
		case err == nil:
			p.retry = 0
			p.cfg.Logger.Info("mintpool: took a worker code", "codes", len(p.members()), "why", why)
		case errors.Is(err, ErrClosed) || ctx.Err() != nil:
		default:
			p.retry = min(max(2*p.retry, openRetryMin), openRetryMax)
			p.retryAt = now.Add(p.retry)
			p.cfg.Logger.Warn("mintpool: cannot take a worker code; retrying", "codes", n, "why", why, "retry_in", p.retry, "err", err)
		}
	})
}

// shrink gives the most recently taken code back; p.mu is held. The code
// leaves the list at once; its calls in flight finish before it closes.
func (p *Pool) shrink() {
	ms := p.members()
	last := ms[len(ms)-1]
	l := append([]*member(nil), ms[:len(ms)-1]...)
	p.list.Store(&l)
	p.cfg.Logger.Info("mintpool: gave a worker code back", "codes", len(l), "demand", p.rate)
	p.bg.Go(func() { retire(last) })
}

// retire waits for mb's calls in flight and closes it.
func retire(mb *member) error {
	mb.use.Lock()
	mb.retired = true
	mb.use.Unlock()
	return mb.m.Close()
}

// Close gives every code back and waits for the codes being taken or given
// back in the background (cancel Run's context first, or a code being
// taken may hold Close for up to openTimeout); later calls fail with
// ErrClosed.
func (p *Pool) Close() error {
	defer p.bg.Wait()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	ms := p.members()
	p.list.Store(nil)
	p.mu.Unlock()
	var errs []error
	for _, mb := range ms {
		if err := retire(mb); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}
