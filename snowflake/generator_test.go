package snowflake

import (
	"context"
	"errors"
	"math/rand/v2"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// shiftClock is the (possibly fake) system clock plus an adjustable offset.
// Inside a synctest bubble time.Now starts at 2000-01-01, so tests shift it
// into the epoch and then move it to inject rollbacks.
type shiftClock struct{ d atomic.Int64 }

func (c *shiftClock) Now() time.Time      { return time.Now().Add(time.Duration(c.d.Load())) }
func (c *shiftClock) add(d time.Duration) { c.d.Add(int64(d)) }
func (c *shiftClock) ms() int64           { return MsSince(c.Now()) }
func (c *shiftClock) setMs(ms int64) *shiftClock {
	c.d.Store(int64(MsTime(ms).Sub(time.Now())))
	return c
}

// clockAt returns a clock reading exactly millisecond ms (on a millisecond
// boundary inside a synctest bubble).
func clockAt(ms int64) *shiftClock { return new(shiftClock).setMs(ms) }

// newGen builds a generator that reads clk (nil: time.Now) and, when cfg has
// none, keeps its ceiling in memory.
func newGen(t *testing.T, clk *shiftClock, cfg Config) *Generator {
	t.Helper()
	if cfg.HighWater == nil {
		cfg.HighWater = NewMemHighWater()
	}
	now := time.Now
	if clk != nil {
		now = clk.Now
	}
	g, err := newGenerator(cfg, now)
	if err != nil {
		t.Fatalf("NewGenerator: %v", err)
	}
	return g
}

// docs/design.md validation case 1: frozen time, 4,096 IDs in one ms, all unique; the
// 4,097th fails fast with a short deadline and otherwise waits for the next ms.
func TestFrozenMillisecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const ms = 1_000_000
		exhausted := 0
		g := newGen(t, clockAt(ms), Config{Region: 2, Worker: 7, OnSequenceExhausted: func() { exhausted++ }})
		ctx := context.Background()
		seen := make(map[ID]bool, 4096)
		for i := 0; i < 4096; i++ {
			id, err := g.Next(ctx)
			if err != nil {
				t.Fatalf("id %d: %v", i, err)
			}
			if seen[id] {
				t.Fatalf("duplicate %d", id)
			}
			seen[id] = true
			p := id.Parts()
			if p.Ms != ms || p.Region != 2 || p.Worker != 7 || p.Sequence != i {
				t.Fatalf("id %d decodes to %+v", i, p)
			}
		}
		start := time.Now()
		short, cancel := context.WithTimeout(ctx, 500*time.Microsecond)
		defer cancel()
		if _, err := g.Next(short); !errors.Is(err, ErrSequenceExhausted) {
			t.Fatalf("4097th with short deadline: %v, want ErrSequenceExhausted", err)
		}
		if time.Since(start) != 0 {
			t.Fatal("the overload error must come without waiting")
		}
		id, err := g.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if id.Ms() != ms+1 || id.Sequence() != 0 {
			t.Fatalf("4097th = %+v, want ms %d seq 0", id.Parts(), ms+1)
		}
		if waited := time.Since(start); waited != time.Millisecond {
			t.Fatalf("waited %v, want exactly the rest of the millisecond", waited)
		}
		if exhausted != 2 || g.Stats().SequenceExhausted != 2 {
			t.Fatalf("exhausted hook %d, stats %d; want 2", exhausted, g.Stats().SequenceExhausted)
		}
	})
}

// docs/design.md validation case 2: concurrent callers never share an ID (run with -race).
func TestConcurrentUnique(t *testing.T) {
	g := newGen(t, nil, Config{Region: 1, Worker: 1})
	const goroutines, each = 8, 20_000
	out := make([][]ID, goroutines)
	var wg sync.WaitGroup
	for i := range out {
		wg.Go(func() {
			ids := make([]ID, 0, each)
			for len(ids) < each {
				if len(ids)%3 == 0 {
					batch, err := g.NextN(context.Background(), 5)
					if err != nil {
						t.Error(err)
						return
					}
					ids = append(ids, batch...)
					continue
				}
				id, err := g.Next(context.Background())
				if err != nil {
					t.Error(err)
					return
				}
				ids = append(ids, id)
			}
			out[i] = ids
		})
	}
	wg.Wait()
	seen := make(map[ID]int, goroutines*each)
	for i, ids := range out {
		for j, id := range ids {
			if j > 0 && id <= ids[j-1] {
				t.Fatalf("goroutine %d: id %d not above %d", i, id, ids[j-1])
			}
			if o, dup := seen[id]; dup {
				t.Fatalf("id %d minted by goroutines %d and %d", id, o, i)
			}
			seen[id] = i
		}
	}
}

// docs/design.md validation case 3: rollbacks of 1, 5 and 2,000 ms.
func TestClockRollback(t *testing.T) {
	for _, tc := range []struct {
		back     time.Duration
		waitable bool // within MaxRollbackWait (5 ms)
	}{
		{time.Millisecond, true},
		{5 * time.Millisecond, true},
		{2000 * time.Millisecond, false},
	} {
		t.Run(tc.back.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				clk := clockAt(5_000_000)
				var alerted []time.Duration
				g := newGen(t, clk, Config{OnClockRollback: func(d time.Duration) { alerted = append(alerted, d) }})
				before, err := g.Next(context.Background())
				if err != nil {
					t.Fatal(err)
				}
				clk.add(-tc.back)

				// A caller whose deadline is shorter than the rollback fails at once.
				short, cancel := context.WithTimeout(context.Background(), tc.back/2)
				start := time.Now()
				_, err = g.Next(short)
				cancel()
				if !errors.Is(err, ErrClockMovedBack) || time.Since(start) != 0 {
					t.Fatalf("short deadline: err %v after %v, want ErrClockMovedBack at once", err, time.Since(start))
				}
				if herr := g.Health(); !errors.Is(herr, ErrClockMovedBack) {
					t.Fatalf("Health during rollback = %v, want ErrClockMovedBack", herr)
				}
				if s := g.Stats(); s.LastRollback != tc.back || s.MaxRollback != tc.back {
					t.Fatalf("recorded rollback %v/%v, want %v", s.LastRollback, s.MaxRollback, tc.back)
				}
				if len(alerted) == 0 || alerted[0] != tc.back {
					t.Fatalf("rollback hook got %v, want %v", alerted, tc.back)
				}

				// A caller with time to spare waits out a small rollback...
				start = time.Now()
				id, err := g.Next(context.Background())
				if tc.waitable {
					if err != nil {
						t.Fatalf("waitable rollback: %v", err)
					}
					if time.Since(start) != tc.back {
						t.Fatalf("waited %v, want %v", time.Since(start), tc.back)
					}
				} else {
					// ...but a large one is refused even with an unbounded context.
					if !errors.Is(err, ErrClockMovedBack) || time.Since(start) != 0 {
						t.Fatalf("large rollback: %v after %v, want ErrClockMovedBack at once", err, time.Since(start))
					}
					time.Sleep(tc.back) // the clock catches up
					if id, err = g.Next(context.Background()); err != nil {
						t.Fatalf("after catching up: %v", err)
					}
				}
				if id <= before {
					t.Fatalf("id %d after rollback is not above %d", id, before)
				}
				if herr := g.Health(); herr != nil {
					t.Fatalf("Health after catching up = %v", herr)
				}
			})
		})
	}
}

// docs/design.md validation case 7: at 2^41-1 the next millisecond is rejected, and the
// epoch warning fires.
func TestEpochEnd(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var warned time.Duration = -1
		g := newGen(t, clockAt(MaxTimestamp), Config{OnEpochWarning: func(r time.Duration) { warned = r }})
		if warned < 0 || warned > time.Millisecond {
			t.Fatalf("epoch warning got %v, want <= 1ms remaining", warned)
		}
		for i := 0; i < 4096; i++ {
			id, err := g.Next(context.Background())
			if err != nil {
				t.Fatalf("id %d in the last ms: %v", i, err)
			}
			if id.Ms() != MaxTimestamp {
				t.Fatalf("id in ms %d", id.Ms())
			}
		}
		if _, err := g.Next(context.Background()); !errors.Is(err, ErrEpochExhausted) {
			t.Fatalf("after the last ms: %v, want ErrEpochExhausted", err)
		}
		time.Sleep(time.Millisecond)
		if _, err := g.Next(context.Background()); !errors.Is(err, ErrEpochExhausted) {
			t.Fatalf("past the last ms: %v, want ErrEpochExhausted", err)
		}
		if !errors.Is(g.Health(), ErrEpochExhausted) {
			t.Fatalf("Health = %v", g.Health())
		}
		if _, err := newGenerator(Config{HighWater: NewMemHighWater()}, clockAt(MaxTimestamp+1).Now); !errors.Is(err, ErrEpochExhausted) {
			t.Fatalf("NewGenerator past the end: %v", err)
		}
	})
}

func TestEpochWarningYearsAhead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		fired := false
		end := MsSince(EndOfLife())
		newGen(t, clockAt(end-int64(4*365*24*time.Hour/time.Millisecond)), Config{OnEpochWarning: func(time.Duration) { fired = true }})
		if !fired {
			t.Fatal("4 years before the end, the default 5-year warning must fire")
		}
		fired = false
		newGen(t, clockAt(1000), Config{OnEpochWarning: func(time.Duration) { fired = true }})
		if fired {
			t.Fatal("warning fired 69 years early")
		}
	})
}

// Restart safety: crash (no Close), restart on the same file with the clock
// 2 s back: the generator refuses; one allowed to wait mints only above the
// old ceiling.
func TestRestartAfterCrashWithClockBack(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "hwm")
		clk := clockAt(9_000_000)
		g1 := newGen(t, clk, Config{HighWater: NewFileHighWater(path)})
		var last ID
		for i := 0; i < 50; i++ {
			id, err := g1.Next(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			last = id
			time.Sleep(10 * time.Millisecond)
		}
		synctest.Wait() // let any background ceiling extension finish
		ceiling, ok, err := NewFileHighWater(path).Load()
		if err != nil || !ok || ceiling < last.Ms() {
			t.Fatalf("persisted ceiling %d (ok %v, err %v) below last minted ms %d", ceiling, ok, err, last.Ms())
		}
		// g1 "crashes": dropped without Close.

		back := clockAt(clk.ms() - 2000)
		if _, err := newGenerator(Config{HighWater: NewFileHighWater(path)}, back.Now); !errors.Is(err, ErrClockBehindHighWater) {
			t.Fatalf("restart 2 s back: %v, want ErrClockBehindHighWater", err)
		}
		g2 := newGen(t, back, Config{HighWater: NewFileHighWater(path), StartupWait: 10 * time.Second})
		short, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = g2.Next(short)
		cancel()
		if !errors.Is(err, ErrClockBehindHighWater) {
			t.Fatalf("Next below the floor with a short deadline: %v", err)
		}
		id, err := g2.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if id.Ms() <= ceiling || id <= last {
			t.Fatalf("restarted generator minted ms %d, not above the old ceiling %d", id.Ms(), ceiling)
		}
	})
}

func TestRestartWithinWindowWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := NewMemHighWater()
		clk := clockAt(42_000)
		g1 := newGen(t, clk, Config{HighWater: store})
		first, _ := g1.Next(context.Background())
		g2 := newGen(t, clk, Config{HighWater: store})
		id, err := g2.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if id.Ms() <= first.Ms()+int64(defaultWindow/time.Millisecond)-1 {
			t.Fatalf("restart minted ms %d inside the old window starting %d", id.Ms(), first.Ms())
		}
	})
}

func TestCorruptHighWaterRefusesToStart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hwm")
	if err := writeFile(path, "idrange-hwm v1 12x\n"); err != nil {
		t.Fatal(err)
	}
	if _, err := NewGenerator(Config{HighWater: NewFileHighWater(path)}); !errors.Is(err, ErrHighWaterCorrupt) {
		t.Fatalf("corrupt file: %v, want ErrHighWaterCorrupt", err)
	}
}

// The ceiling is written about twice a window, never per ID; when it cannot
// be written the generator stops at the durable ceiling.
func TestCeilingPersistence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		store := new(flakyHighWater)
		clk := clockAt(77_000)
		g := newGen(t, clk, Config{HighWater: store, Window: 100 * time.Millisecond})
		for i := 0; i < 1000; i++ { // 1 s of minting, 40 IDs per ms
			for j := 0; j < 40; j++ {
				if _, err := g.Next(context.Background()); err != nil {
					t.Fatal(err)
				}
			}
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		if n := store.stores(); n < 10 || n > 25 {
			t.Fatalf("%d ceiling writes for 40,000 IDs over 1 s with a 100 ms window, want ~20", n)
		}
		store.setFail(errors.New("disk full"))
		var last ID
		for {
			id, err := g.Next(context.Background())
			if err != nil {
				if !errors.Is(err, ErrPersist) {
					t.Fatalf("want ErrPersist, got %v", err)
				}
				break
			}
			last = id
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		if c, _, _ := store.Load(); last.Ms() > c {
			t.Fatalf("minted ms %d above the durable ceiling %d", last.Ms(), c)
		}
		if !errors.Is(g.Health(), ErrPersist) {
			t.Fatalf("Health = %v, want ErrPersist", g.Health())
		}
		store.setFail(nil)
		if _, err := g.Next(context.Background()); err != nil {
			t.Fatalf("after the store recovers: %v", err)
		}
	})
}

// Property: IDs from one generator strictly increase, whatever the clock does.
func TestStrictlyIncreasingUnderClockChaos(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		rng := rand.New(rand.NewPCG(1, 2))
		clk := clockAt(3_000_000)
		g := newGen(t, clk, Config{StartupWait: time.Hour})
		var last ID
		minted := 0
		for i := 0; i < 20_000; i++ {
			switch r := rng.IntN(100); {
			case r < 2:
				clk.add(-time.Duration(rng.IntN(20)) * time.Millisecond)
			case r < 4:
				clk.add(time.Duration(rng.IntN(20)) * time.Millisecond)
			case r < 30:
				time.Sleep(time.Duration(rng.IntN(1500)) * time.Microsecond)
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(8))*time.Millisecond)
			var ids []ID
			var err error
			if rng.IntN(4) == 0 {
				ids, err = g.NextN(ctx, 1+rng.IntN(5000))
			} else {
				var id ID
				if id, err = g.Next(ctx); err == nil {
					ids = []ID{id}
				}
			}
			cancel()
			if err != nil && !errors.Is(err, ErrClockMovedBack) && !errors.Is(err, ErrSequenceExhausted) {
				t.Fatalf("step %d: unexpected error %v", i, err)
			}
			for _, id := range ids {
				if id <= last {
					t.Fatalf("step %d: id %d not above %d", i, id, last)
				}
				last = id
				minted++
			}
		}
		if minted < 10_000 {
			t.Fatalf("only %d IDs minted; the test is not exercising the generator", minted)
		}
	})
}

func TestConfigValidation(t *testing.T) {
	mem := NewMemHighWater()
	for name, cfg := range map[string]Config{
		"region":    {Region: 4, HighWater: mem},
		"worker":    {Worker: -1, HighWater: mem},
		"highwater": {},
		"window":    {HighWater: mem, Window: time.Millisecond},
		"rollback":  {HighWater: mem, MaxRollbackWait: -1},
	} {
		if _, err := NewGenerator(cfg); !errors.Is(err, errConfig) {
			t.Errorf("%s: %v, want a config error", name, err)
		}
	}
}

func TestClose(t *testing.T) {
	g := newGen(t, nil, Config{})
	g.Close()
	if _, err := g.Next(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Next after Close: %v", err)
	}
}

func TestNextNCountsAndAllocs(t *testing.T) {
	g := newGen(t, nil, Config{})
	if _, err := g.NextN(context.Background(), 0); err == nil {
		t.Fatal("NextN(0) must fail")
	}
	ids, err := g.NextN(context.Background(), 10_000)
	if err != nil || len(ids) != 10_000 {
		t.Fatalf("NextN: %d ids, %v", len(ids), err)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("NextN ids not increasing at %d", i)
		}
	}
	ctx := context.Background()
	if a := testing.AllocsPerRun(1000, func() { g.Next(ctx) }); a != 0 {
		t.Fatalf("Next allocates %v per call", a)
	}
	buf := make([]ID, 0, 64)
	if a := testing.AllocsPerRun(100, func() { g.AppendN(ctx, buf[:0], 64) }); a != 0 {
		t.Fatalf("AppendN allocates %v per call", a)
	}
}

// readClock is a clock on a millisecond boundary that advances 1 ns per
// reading, and calls at(n) at every nth reading (under no lock: at must be
// safe for concurrent use).
type readClock struct {
	base  time.Time
	reads atomic.Int64
	at    func(n int64) time.Duration // extra offset from reading n on
}

func (c *readClock) Now() time.Time {
	n := c.reads.Add(1)
	t := c.base.Add(time.Duration(n))
	if c.at != nil {
		t = t.Add(c.at(n))
	}
	return t
}

// exhaust mints the 4,096 IDs of the generator's current millisecond.
func exhaust(t *testing.T, g *Generator) {
	t.Helper()
	if _, err := g.NextN(context.Background(), MaxSequence+1); err != nil {
		t.Fatal(err)
	}
}

// A caller that finds the millisecond used up spins on the clock (reads it
// again and again, ending on the boundary) instead of sleeping past it, and
// ctx still ends the wait with ErrSequenceExhausted.
func TestExhaustedWaitSpinsAndHonoursContext(t *testing.T) {
	clk := &readClock{base: MsTime(1_000_000)}
	g := newGenClock(t, clk.Now)
	exhaust(t, g)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	errc := make(chan error, 1)
	r0 := clk.reads.Load()
	go func() { _, err := g.Next(ctx); errc <- err }()
	// The clock needs 1M readings to reach the next millisecond. A caller
	// that spins reads it every few hundred nanoseconds (20,000 readings in
	// milliseconds, in under a second on a loaded machine); one that sleeps
	// reads it twice per timer wake-up, about once per millisecond.
	const reads = 20_000
	deadline := time.Now().Add(2 * time.Second)
	for clk.reads.Load()-r0 < reads {
		if time.Now().After(deadline) {
			t.Fatalf("the waiting caller read the clock %d times in 2 s, want %d: it is not spinning", clk.reads.Load()-r0, reads)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	select {
	case err := <-errc:
		if !errors.Is(err, ErrSequenceExhausted) {
			t.Fatalf("cancelled wait: %v, want ErrSequenceExhausted", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Next did not return after its context was cancelled")
	}
}

// A clock stepped back while a caller spins for the next millisecond ends
// the spin at once: the caller sees the rollback (ErrClockMovedBack beyond
// MaxRollbackWait) instead of sleeping it out.
func TestRollbackDuringSpin(t *testing.T) {
	var backAt atomic.Int64
	backAt.Store(1 << 62)
	clk := &readClock{base: MsTime(2_000_000)}
	clk.at = func(n int64) time.Duration {
		if n >= backAt.Load() {
			return -2 * time.Second
		}
		return 0
	}
	g := newGenClock(t, clk.Now)
	exhaust(t, g)
	backAt.Store(clk.reads.Load() + 100) // in the middle of the spin
	start := time.Now()
	_, err := g.Next(context.Background())
	if !errors.Is(err, ErrClockMovedBack) {
		t.Fatalf("rollback during the wait: %v, want ErrClockMovedBack", err)
	}
	if el := time.Since(start); el > time.Second {
		t.Fatalf("took %v: the wait slept instead of re-reading the clock", el)
	}
	if s := g.Stats(); s.ClockRollbacks == 0 || s.SequenceExhausted == 0 {
		t.Fatalf("stats %+v: want the exhaustion and the rollback counted", s)
	}
}

// On the real clock a caller waiting for the next millisecond gets an ID of
// that millisecond (sequence 0), so the wait ended on the boundary or after
// it, never before.
func TestExhaustedWaitRealClock(t *testing.T) {
	g := newGen(t, nil, Config{})
	ctx := context.Background()
	for range 50 {
		ids, err := g.NextN(ctx, MaxSequence+2)
		if err != nil {
			t.Fatal(err)
		}
		last := ids[len(ids)-1]
		if now := MsSince(time.Now()); last.Ms() > now {
			t.Fatalf("id of ms %d returned at ms %d: the wait ended early", last.Ms(), now)
		}
	}
}

func newGenClock(t *testing.T, now func() time.Time) *Generator {
	t.Helper()
	g, err := newGenerator(Config{HighWater: NewMemHighWater(), Window: time.Hour}, now)
	if err != nil {
		t.Fatal(err)
	}
	return g
}
