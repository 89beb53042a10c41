package snowflake

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Defaults for Config fields left zero (documented at each field).
const (
	defaultWindow          = time.Second
	defaultMaxRollbackWait = 5 * time.Millisecond
	defaultEpochWarning    = 5 * 365 * 24 * time.Hour
)

// Config configures a Generator for one worker code. Region, Worker and
// HighWater are required; zero durations take the documented defaults.
type Config struct {
	// Region (0..3) and Worker (0..255) form the code. The caller guarantees
	// that no other generator uses the same code at the same time (a lease,
	// or static assignment).
	Region, Worker int

	// HighWater persists the timestamp ceiling. Required: there is no silent
	// in-memory fallback, because a restart without it could re-enter used
	// space. Pass NewMemHighWater() explicitly when that is acceptable.
	HighWater HighWaterStore

	// Window is how far ahead of the clock the persisted ceiling is kept
	// (default 1 s). The generator writes the store about twice per window
	// while it is busy, never per ID. A restart within Window of a crash
	// waits for the clock to pass the old ceiling.
	Window time.Duration

	// StartupWait bounds how far the clock may be behind the persisted
	// ceiling at start: further behind, NewGenerator refuses with
	// ErrClockBehindHighWater; less, Next waits (within its context) until
	// the clock passes it. Default: Window.
	StartupWait time.Duration

	// MaxRollbackWait is the longest clock rollback Next waits out (if its
	// context allows) instead of failing with ErrClockMovedBack. Default 5 ms.
	MaxRollbackWait time.Duration

	// EpochWarning is how long before MaxTimestamp OnEpochWarning starts to
	// fire. Default 5 years.
	EpochWarning time.Duration

	// OnClockRollback, when set, is called with the size of every rollback
	// detected (the clock_rollback_ms alert). It must be fast and must not
	// call back into the generator.
	OnClockRollback func(back time.Duration)
	// OnSequenceExhausted, when set, is called each time a caller finds the
	// current millisecond's 4,096 sequences used up.
	OnSequenceExhausted func()
	// OnEpochWarning, when set, is called at start and at each ceiling
	// extension while less than EpochWarning of epoch life remains.
	OnEpochWarning func(remaining time.Duration)
}

func (c *Config) setDefaults() {
	if c.Window == 0 {
		c.Window = defaultWindow
	}
	if c.StartupWait == 0 {
		c.StartupWait = c.Window
	}
	if c.MaxRollbackWait == 0 {
		c.MaxRollbackWait = defaultMaxRollbackWait
	}
	if c.EpochWarning == 0 {
		c.EpochWarning = defaultEpochWarning
	}
}

// errConfig marks configuration errors.
var errConfig = errors.New("snowflake: invalid config")

func (c *Config) validate() error {
	switch {
	case c.Region < 0 || c.Region > MaxRegion:
		return fmt.Errorf("Region %d not in 0..%d: %w", c.Region, MaxRegion, errConfig)
	case c.Worker < 0 || c.Worker > MaxWorker:
		return fmt.Errorf("Worker %d not in 0..%d: %w", c.Worker, MaxWorker, errConfig)
	case c.HighWater == nil:
		return fmt.Errorf("HighWater is required (use NewFileHighWater, or NewMemHighWater when losing it on restart is acceptable): %w", errConfig)
	case c.Window < 2*time.Millisecond:
		return fmt.Errorf("Window %v must be at least 2ms: %w", c.Window, errConfig)
	case c.StartupWait < 0:
		return fmt.Errorf("StartupWait %v is negative: %w", c.StartupWait, errConfig)
	case c.MaxRollbackWait < 0:
		return fmt.Errorf("MaxRollbackWait %v is negative: %w", c.MaxRollbackWait, errConfig)
	case c.EpochWarning < 0:
		return fmt.Errorf("EpochWarning %v is negative: %w", c.EpochWarning, errConfig)
	}
	return nil
}

// Generator mints IDs for one worker code from local state only.
//
// The hot path is one compare-and-swap on the packed position
// L = ms<<12 | seq of the last ID handed out, so it is lock-free and does not
// allocate. A sequence is never reused within a millisecond (the CAS) and
// never wraps: when 4,096 are used, callers wait for the next millisecond,
// spinning on the clock for that last fraction of a millisecond rather than
// sleeping past it, so one code sustains its full 4,096 IDs/ms.
// The generator never mints in a millisecond above its durable ceiling, so a
// restart (whose floor is that ceiling + 1) cannot repeat an ID.
type Generator struct {
	cfg  Config
	now  func() time.Time // time.Now; tests replace it to step the clock back
	base int64            // region<<20 | worker<<12

	state   atomic.Int64 // L of the last ID handed out
	ceiling atomic.Int64 // highest durable ms
	startL  int64        // first L this generator may use

	persistMu  sync.Mutex // serialises HighWater.Store
	extending  atomic.Bool
	persistErr atomic.Pointer[error]

	closed       atomic.Bool
	exhausted    atomic.Uint64
	rollbacks    atomic.Uint64
	lastRollback atomic.Int64
	maxRollback  atomic.Int64
}

// NewGenerator loads the persisted ceiling, refuses to start when the clock
// is behind it by more than cfg.StartupWait, and persists a fresh ceiling
// before returning. It fails when cfg is invalid; with the store's Load error
// (ErrHighWaterCorrupt for an unreadable FileHighWater); with
// ErrClockBehindHighWater; with ErrFieldRange before Epoch or
// ErrEpochExhausted after the last millisecond; or with ErrPersist.
func NewGenerator(cfg Config) (*Generator, error) { return newGenerator(cfg, time.Now) }

// newGenerator is NewGenerator reading the clock now (tests pass a clock
// they can move backwards, which testing/synctest cannot).
func newGenerator(cfg Config, now func() time.Time) (*Generator, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hwm, ok, err := cfg.HighWater.Load()
	if err != nil {
		return nil, fmt.Errorf("snowflake: load high-water mark: %w", err)
	}
	nowMs := MsSince(now())
	if nowMs < 0 {
		return nil, fmt.Errorf("clock %v is before the epoch %v: %w", now(), Epoch, ErrFieldRange)
	}
	if nowMs > MaxTimestamp {
		return nil, fmt.Errorf("clock is %d ms past the epoch, the last is %d: %w", nowMs, int64(MaxTimestamp), ErrEpochExhausted)
	}
	start := nowMs
	if ok {
		if ok && hwm >= MaxTimestamp {
			return nil, fmt.Errorf("persisted ceiling is the last millisecond %d: %w", hwm, ErrEpochExhausted)
		}
		start = max(nowMs, hwm+1)
		if behind := time.Duration(hwm-nowMs) * time.Millisecond; behind > cfg.StartupWait {
			return nil, fmt.Errorf("clock is %v behind the persisted ceiling (ms %d, at %s); limit %v: %w", behind, hwm, MsTime(hwm).Format(time.RFC3339Nano), cfg.StartupWait, ErrClockBehindHighWater)
		}
	}
	g := &Generator{
		cfg:    cfg,
		now:    now,
		base:   int64(cfg.Region)<<regionShift | int64(cfg.Worker)<<workerShift,
		startL: start << SequenceBits,
	}
	g.state.Store(g.startL - 1)
	g.ceiling.Store(start - 1)
	if err := g.extend(start); err != nil {
		return nil, err
	}
	return g, nil
}

// Next returns a new ID. It waits, within ctx, for the next millisecond when
// the current one is used up (ErrSequenceExhausted if ctx ends first), for a
// clock rollback of at most MaxRollbackWait (ErrClockMovedBack otherwise),
// and for the start floor after a restart. It fails with ErrEpochExhausted
// past MaxTimestamp.
func (g *Generator) Next(ctx context.Context) (ID, error) {
	l, _, err := g.reserve(ctx, 1)
	if err != nil {
		return 0, err
	}
	return g.id(l), nil
}

// NextN returns n new IDs, reserving each millisecond's run with a single
// compare-and-swap. On error the IDs returned so far are valid and unique.
func (g *Generator) NextN(ctx context.Context, n int) ([]ID, error) {
	return g.AppendN(ctx, make([]ID, 0, max(n, 0)), n)
}

// AppendN appends n new IDs to dst, like NextN without allocating when dst
// has room.
func (g *Generator) AppendN(ctx context.Context, dst []ID, n int) ([]ID, error) {
	if n <= 0 {
		return dst, fmt.Errorf("snowflake: count %d must be positive", n)
	}
	for n > 0 {
		first, k, err := g.reserve(ctx, n)
		if err != nil {
			return dst, err
		}
		for l := first; l < first+k; l++ {
			dst = append(dst, g.id(l))
		}
		n -= int(k)
	}
	return dst, nil
}

func (g *Generator) id(l int64) ID {
	return ID(l>>SequenceBits<<timeShift | g.base | l&MaxSequence)
}

// reserve claims up to n consecutive positions in one millisecond and returns
// the first and how many.
func (g *Generator) reserve(ctx context.Context, n int) (int64, int64, error) {
	for {
		if g.closed.Load() {
			return 0, 0, ErrClosed
		}
		// Load the state before reading the clock: then a concurrent
		// caller's newer millisecond can never look like a rollback.
		old := g.state.Load()
		now := MsSince(g.now())
		last := old >> SequenceBits
		var first int64
		switch {
		case now > MaxTimestamp:
			return 0, 0, fmt.Errorf("clock is at ms %d, the last is %d: %w", now, int64(MaxTimestamp), ErrEpochExhausted)
		case now > last:
			first = now << SequenceBits
		case old < g.startL:
			if err := g.waitFor(ctx, g.startL>>SequenceBits, ErrClockBehindHighWater); err != nil {
				return 0, 0, err
			}
			continue
		case now == last && old&MaxSequence < MaxSequence:
			first = old + 1
		case now == last:
			g.exhausted.Add(1)
			if f := g.cfg.OnSequenceExhausted; f != nil {
				f()
			}
			if now == MaxTimestamp {
				return 0, 0, fmt.Errorf("the last millisecond's sequences are used up: %w", ErrEpochExhausted)
			}
			if err := g.waitFor(ctx, now+1, ErrSequenceExhausted); err != nil {
				return 0, 0, err
			}
			continue
		default:
			back := time.Duration(last-now) * time.Millisecond
			g.noteRollback(back)
			if back > g.cfg.MaxRollbackWait {
				return 0, 0, fmt.Errorf("clock is %v behind the last millisecond used; limit %v: %w", back, g.cfg.MaxRollbackWait, ErrClockMovedBack)
			}
			if err := g.waitFor(ctx, last, ErrClockMovedBack); err != nil {
				return 0, 0, err
			}
			continue
		}
		ms := first >> SequenceBits
		if err := g.ensureCeiling(ms); err != nil {
			return 0, 0, err
		}
		k := min(int64(n), MaxSequence+1-first&MaxSequence)
		if g.state.CompareAndSwap(old, first+k-1) {
			return first, k, nil
		}
	}
}

// maxSpin is the longest wait spent spinning on the clock instead of
// sleeping: the rest of a millisecond whose 4,096 sequences are used up.
// A timer wakes late (tens of microseconds to a millisecond past its time,
// more on a busy machine), and every microsecond slept past the boundary is
// capacity lost at the cap; spinning for the last fraction ends the wait on
// the boundary. Longer waits (a clock rollback, the start floor) sleep.
const maxSpin = time.Millisecond

// frozenReads is how many clock readings in a row may return the same time
// before spin gives up on the clock moving and sleeps instead (a clock with
// coarse resolution, or the fake clock of a testing/synctest bubble, which
// only moves while every goroutine in it is blocked).
const frozenReads = 64

// waitFor waits until the clock reaches millisecond ms, unless ctx's
// deadline comes first, in which case it fails at once with kind. A wait of
// up to maxSpin spins on the clock; a longer one sleeps. It may return
// before ms (the clock moved back meanwhile); callers re-read the clock.
func (g *Generator) waitFor(ctx context.Context, ms int64, kind error) error {
	target := MsTime(ms)
	d := target.Sub(g.now())
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return fmt.Errorf("would wait %v, context deadline is in %v: %w", d, time.Until(dl), kind)
	}
	if d > 0 && d <= maxSpin {
		frozen, err := g.spin(ctx, target)
		if err != nil {
			return fmt.Errorf("waiting %v: %v: %w", d, err, kind)
		}
		if !frozen {
			return nil
		}
		// The clock stood still: sleep the rest on a timer.
		if d = target.Sub(g.now()); d > maxSpin {
			return nil
		}
	}
	if err := sleep(ctx, d); err != nil {
		return fmt.Errorf("waiting %v: %v: %w", d, err, kind)
	}
	return nil
}

// spin yields the processor (runtime.Gosched) between clock readings until
// the clock reaches target, the clock moves back (the caller re-reads it and
// sees the rollback), or 2*maxSpin of real time has passed. It returns
// ctx's error if ctx ends first, and frozen when the clock stood still for
// frozenReads readings. Only a caller that must wait spins, for at most
// about a millisecond, so an idle generator costs no CPU.
func (g *Generator) spin(ctx context.Context, target time.Time) (frozen bool, err error) {
	done := ctx.Done()
	start := time.Now()
	prev := g.now()
	for still := 0; still < frozenReads; {
		select {
		case <-done:
			return false, ctx.Err()
		default:
		}
		runtime.Gosched()
		t := g.now()
		switch {
		case !t.Before(target), t.Before(prev), time.Since(start) > 2*maxSpin:
			return false, nil
		case t.Equal(prev):
			still++
		default:
			still = 0
		}
		prev = t
	}
	return true, nil
}

// sleep waits for d or until ctx is done, whichever is first, and returns
// ctx.Err() in the second case.
func sleep(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return ctx.Err()
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *Generator) noteRollback(back time.Duration) {
	g.rollbacks.Add(1)
	g.lastRollback.Store(int64(back))
	for {
		m := g.maxRollback.Load()
		if int64(back) <= m || g.maxRollback.CompareAndSwap(m, int64(back)) {
			break
		}
	}
	if f := g.cfg.OnClockRollback; f != nil {
		f(back)
	}
}

// ensureCeiling makes sure ms is at or below the durable ceiling, persisting
// synchronously if not, and starts a background extension when the ceiling
// is less than half a window ahead.
func (g *Generator) ensureCeiling(ms int64) error {
	c := g.ceiling.Load()
	if ms > c {
		return g.extend(ms)
	}
	if ms+int64(g.cfg.Window/time.Millisecond)/2 > c && c < MaxTimestamp && g.extending.CompareAndSwap(false, true) {
		go func() {
			defer g.extending.Store(false)
			_ = g.extend(ms) // a failure is recorded and surfaces on the sync path
		}()
	}
	return nil
}

// extend persists a ceiling one window above ms.
func (g *Generator) extend(ms int64) error {
	g.persistMu.Lock()
	defer g.persistMu.Unlock()
	if ms <= g.ceiling.Load()-int64(g.cfg.Window/time.Millisecond)/2 {
		return nil // someone else got there
	}
	next := min(ms+int64(g.cfg.Window/time.Millisecond), MaxTimestamp)
	if err := g.cfg.HighWater.Store(next); err != nil {
		err = fmt.Errorf("ceiling %d: %v: %w", next, err, ErrPersist)
		g.persistErr.Store(&err)
		if ms > g.ceiling.Load() {
			return err
		}
		return nil
	}
	g.persistErr.Store(nil)
	g.ceiling.Store(next)
	g.warnEpoch()
	return nil
}

func (g *Generator) warnEpoch() {
	if f := g.cfg.OnEpochWarning; f != nil {
		if r := RemainingLife(g.now()); r < g.cfg.EpochWarning {
			f(r)
		}
	}
}

// Health reports why the generator cannot mint right now, or nil: the clock
// is behind the last millisecond used (until it catches up), the ceiling
// could not be persisted, the epoch is over, or it was closed. Serve it on a
// health endpoint to take the worker out of rotation.
func (g *Generator) Health() error {
	if g.closed.Load() {
		return ErrClosed
	}
	if p := g.persistErr.Load(); p != nil {
		return *p
	}
	old := g.state.Load()
	now := MsSince(g.now())
	if now > MaxTimestamp {
		return ErrEpochExhausted
	}
	if last := old >> SequenceBits; old >= g.startL && now < last {
		return fmt.Errorf("clock is %v behind the last millisecond used: %w", time.Duration(last-now)*time.Millisecond, ErrClockMovedBack)
	}
	return nil
}

// Stats are counters for monitoring.
type Stats struct {
	SequenceExhausted uint64        // times a caller found a millisecond used up
	ClockRollbacks    uint64        // times a caller found the clock behind
	LastRollback      time.Duration // size of the latest rollback seen
	MaxRollback       time.Duration // largest rollback seen
	CeilingMs         int64         // durable ceiling, ms since Epoch
	RemainingLife     time.Duration // time left before MaxTimestamp
}

// Stats returns a snapshot of the counters.
func (g *Generator) Stats() Stats {
	return Stats{
		SequenceExhausted: g.exhausted.Load(),
		ClockRollbacks:    g.rollbacks.Load(),
		LastRollback:      time.Duration(g.lastRollback.Load()),
		MaxRollback:       time.Duration(g.maxRollback.Load()),
		CeilingMs:         g.ceiling.Load(),
		RemainingLife:     RemainingLife(g.now()),
	}
}

// Close stops the generator; later calls return ErrClosed. The persisted
// ceiling stays, so a successor starts above everything minted.
func (g *Generator) Close() error {
	g.closed.Store(true)
	return nil
}
