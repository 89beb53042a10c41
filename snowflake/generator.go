package snowflake

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/clock"
)

// Clock is the generator's time source: anything with Now() time.Time.
// time.Now (the default) is right in production; tests inject offsets to
// simulate rollbacks and jumps.
type Clock = clock.Clock

// Defaults for Config fields left zero.
const (
	DefaultWindow          = time.Second
	DefaultMaxRollbackWait = 5 * time.Millisecond
	DefaultEpochWarning    = 5 * 365 * 24 * time.Hour
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

	// Clock is the wall clock; nil means time.Now.
	Clock Clock

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
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.Window == 0 {
		c.Window = DefaultWindow
	}
	if c.StartupWait == 0 {
		c.StartupWait = c.Window
	}
	if c.MaxRollbackWait == 0 {
		c.MaxRollbackWait = DefaultMaxRollbackWait
	}
	if c.EpochWarning == 0 {
		c.EpochWarning = DefaultEpochWarning
	}
}

// errConfig marks configuration errors.
var errConfig = errors.New("snowflake: invalid config")

func (c *Config) validate() error {
	switch {
	case c.Region < 0 || c.Region > MaxRegion:
		return errors.Wrapf(errConfig, "Region %d not in 0..%d", c.Region, MaxRegion)
	case c.Worker < 0 || c.Worker > MaxWorker:
		return errors.Wrapf(errConfig, "Worker %d not in 0..%d", c.Worker, MaxWorker)
	case c.HighWater == nil:
		return errors.Wrap(errConfig, "HighWater is required (use NewFileHighWater, or NewMemHighWater when losing it on restart is acceptable)")
	case c.Window < 2*time.Millisecond:
		return errors.Wrapf(errConfig, "Window %v must be at least 2ms", c.Window)
	case c.StartupWait < 0:
		return errors.Wrapf(errConfig, "StartupWait %v is negative", c.StartupWait)
	case c.MaxRollbackWait < 0:
		return errors.Wrapf(errConfig, "MaxRollbackWait %v is negative", c.MaxRollbackWait)
	case c.EpochWarning < 0:
		return errors.Wrapf(errConfig, "EpochWarning %v is negative", c.EpochWarning)
	}
	return nil
}

// Generator mints IDs for one worker code from local state only.
//
// The hot path is one compare-and-swap on the packed position
// L = ms<<12 | seq of the last ID handed out, so it is lock-free and does not
// allocate. A sequence is never reused within a millisecond (the CAS) and
// never wraps: when 4,096 are used, callers wait for the next millisecond.
// The generator never mints in a millisecond above its durable ceiling, so a
// restart (whose floor is that ceiling + 1) cannot repeat an ID.
type Generator struct {
	cfg  Config
	base int64 // region<<20 | worker<<12

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
// before returning.
func NewGenerator(cfg Config) (*Generator, error) {
	cfg.setDefaults()
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	hwm, ok, err := cfg.HighWater.Load()
	if err != nil {
		return nil, errors.Wrap(err, "snowflake: load high-water mark")
	}
	now := MsSince(cfg.Clock.Now())
	if now < 0 {
		return nil, errors.Wrapf(ErrFieldRange, "clock %v is before the epoch %v", cfg.Clock.Now(), Epoch)
	}
	if now > MaxTimestamp {
		return nil, errors.Wrapf(ErrEpochExhausted, "clock is %d ms past the epoch, the last is %d", now, int64(MaxTimestamp))
	}
	start := now
	if ok {
		if ok && hwm >= MaxTimestamp {
			return nil, errors.Wrapf(ErrEpochExhausted, "persisted ceiling is the last millisecond %d", hwm)
		}
		start = max(now, hwm+1)
		if behind := time.Duration(hwm-now) * time.Millisecond; behind > cfg.StartupWait {
			return nil, errors.Wrapf(ErrClockBehindHighWater,
				"clock is %v behind the persisted ceiling (ms %d, at %s); limit %v",
				behind, hwm, MsTime(hwm).Format(time.RFC3339Nano), cfg.StartupWait)
		}
	}
	g := &Generator{
		cfg:    cfg,
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
		return dst, errors.Newf("snowflake: count %d must be positive", n)
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
		now := MsSince(g.cfg.Clock.Now())
		last := old >> SequenceBits
		var first int64
		switch {
		case now > MaxTimestamp:
			return 0, 0, errors.Wrapf(ErrEpochExhausted, "clock is at ms %d, the last is %d", now, int64(MaxTimestamp))
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
				return 0, 0, errors.Wrap(ErrEpochExhausted, "the last millisecond's sequences are used up")
			}
			if err := g.waitFor(ctx, now+1, ErrSequenceExhausted); err != nil {
				return 0, 0, err
			}
			continue
		default:
			back := time.Duration(last-now) * time.Millisecond
			g.noteRollback(back)
			if back > g.cfg.MaxRollbackWait {
				return 0, 0, errors.Wrapf(ErrClockMovedBack, "clock is %v behind the last millisecond used; limit %v", back, g.cfg.MaxRollbackWait)
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

// waitFor sleeps until the clock reaches millisecond ms, unless ctx's
// deadline comes first, in which case it fails at once with kind.
func (g *Generator) waitFor(ctx context.Context, ms int64, kind error) error {
	d := MsTime(ms).Sub(g.cfg.Clock.Now())
	if dl, ok := ctx.Deadline(); ok && time.Until(dl) < d {
		return errors.Wrapf(kind, "would wait %v, context deadline is in %v", d, time.Until(dl))
	}
	if err := clock.Sleep(ctx, d); err != nil {
		return errors.Wrapf(kind, "waiting %v: %v", d, err)
	}
	return nil
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
		err = errors.Wrapf(ErrPersist, "ceiling %d: %v", next, err)
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
		if r := RemainingLife(g.cfg.Clock.Now()); r < g.cfg.EpochWarning {
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
	now := MsSince(g.cfg.Clock.Now())
	if now > MaxTimestamp {
		return ErrEpochExhausted
	}
	if last := old >> SequenceBits; old >= g.startL && now < last {
		return errors.Wrapf(ErrClockMovedBack, "clock is %v behind the last millisecond used", time.Duration(last-now)*time.Millisecond)
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
		RemainingLife:     RemainingLife(g.cfg.Clock.Now()),
	}
}

// Close stops the generator; later calls return ErrClosed. The persisted
// ceiling stays, so a successor starts above everything minted.
func (g *Generator) Close() error {
	g.closed.Store(true)
	return nil
}
