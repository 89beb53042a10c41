package engine

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// sharedValidFor is what rangesvc gives a run (service.SharedValidity -
// service.SharedMargin; this package's tests do not link the service).
const sharedValidFor = 900 * time.Millisecond

// sharedConn is a connection to an in-memory service that also grants
// shared runs, carved as rangesvc carves them: from the blocks of a minter
// client of the same service.
type sharedConn struct {
	*rangeclienttest.Conn
	minter *Engine
	calls  atomic.Int64
	fail   atomic.Pointer[error] // if set, every AllocateShared returns it
}

func (s *sharedConn) AllocateShared(ctx context.Context, region, n int, after snowflake.ID, clientID string) (segment.Block, error) {
	s.calls.Add(1)
	if p := s.fail.Load(); p != nil {
		return segment.Block{}, *p
	}
	if region != s.minter.cfg.Region {
		return segment.Block{}, fmt.Errorf("region %d: %w", region, segment.ErrInvalid)
	}
	return s.minter.carve(ctx, sharedRequest(n, after))
}

func sharedRequest(n int, after snowflake.ID) carve.Request {
	return carve.Request{N: int64(n), After: after, MaxLead: segment.DefaultMaxLead, ValidFor: sharedValidFor, MinLife: 100 * time.Millisecond}
}

// newSharedConn starts a minter on svc (code 0: the lowest free) and
// returns a shared connection carving from it.
func newSharedConn(t *testing.T, svc *rangeclienttest.Service) *sharedConn {
	t.Helper()
	m := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1; c.Owner = "minter" })
	return &sharedConn{Conn: svc.Conn(), minter: m}
}

// checkTimes fails unless id's timestamp lies within [at - 1 s, at + lead]
// of service time at, the moment Next returned it.
func checkTime(t *testing.T, id snowflake.ID, at time.Time) {
	t.Helper()
	ms := snowflake.Epoch.Add(time.Duration(id.Ms()) * time.Millisecond)
	if ms.Before(at.Add(-time.Second)) || ms.After(at.Add(segment.DefaultMaxLead)) {
		t.Fatalf("ID %d has time %v, returned at %v: outside [-1 s, +%v]", id, ms, at, segment.DefaultMaxLead)
	}
}

func TestAfterL(t *testing.T) {
	base := func(region, worker int64) int64 { return region<<20 | worker<<12 }
	id := func(ms, region, worker, seq int64) snowflake.ID {
		return snowflake.ID(ms<<22 | region<<20 | worker<<12 | seq)
	}
	for _, tc := range []struct {
		after snowflake.ID
		base  int64
		want  int64
	}{
		{0, base(1, 5), 0},
		{-3, base(1, 5), 0},
		{id(100, 1, 5, 7), base(1, 5), 100<<12 | 8},         // same code: after its sequence
		{id(100, 1, 5, 4095), base(1, 5), 101 << 12},        // ... which carries into the next ms
		{id(100, 1, 4, 4095), base(1, 5), 100 << 12},        // a lower code: the same ms
		{id(100, 1, 6, 0), base(1, 5), 101 << 12},           // a higher code: the next ms
		{id(100, 2, 0, 0), base(1, 255), 101 << 12},         // region bits sort above worker bits
		{id(100, 0, 255, 4095), base(1, 0), 100 << seqBits}, // and below a higher region
	} {
		got := afterL(tc.after, tc.base)
		if got != tc.want {
			t.Errorf("afterL(%d, %#x) = %d, want %d", tc.after, tc.base, got, tc.want)
			continue
		}
		// The rule itself: the ID at got is above after, the one before it is not.
		b := &block{base: tc.base}
		if tc.after > 0 && (b.id(got) <= tc.after || (got > 0 && b.id(got-1) > tc.after)) {
			t.Errorf("afterL(%d, %#x) = %d is not the first position above it", tc.after, tc.base, got)
		}
	}
}

// Runs carved concurrently by many callers while Next mints from the same
// minter: no position twice, every run after its caller's last ID, valid
// no longer than ValidFor after its first millisecond nor past the
// minter's lease deadline.
func TestCarveRunsDisjoint(t *testing.T) {
	svc := fakeService(10 * time.Second)
	m := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1 })
	const carvers, runs, minters, perMinter = 8, 300, 2, 20_000
	var mu sync.Mutex
	var all []snowflake.ID
	var wg sync.WaitGroup
	errc := make(chan error, carvers+minters)
	for w := range carvers {
		wg.Go(func() {
			var after snowflake.ID
			var mine []snowflake.ID
			for i := range runs {
				n := 1 + (w*runs+i)%500
				b, err := m.carve(context.Background(), sharedRequest(n, after))
				if err != nil {
					errc <- err
					return
				}
				firstMs := snowflake.Epoch.Add(time.Duration(b.Lo>>seqBits) * time.Millisecond)
				switch {
				case b.ID(b.Lo) <= after:
					errc <- fmt.Errorf("run [%d,%d) not after ID %d", b.Lo, b.Hi, after)
				case b.Len() < 1 || b.Len() > int64(n):
					errc <- fmt.Errorf("run of %d, asked %d", b.Len(), n)
				case b.ValidUntil.After(firstMs.Add(sharedValidFor)) || !b.ValidUntil.After(b.ServiceTime):
					errc <- fmt.Errorf("run from %v valid until %v (service time %v)", firstMs, b.ValidUntil, b.ServiceTime)
				case b.Region != 1 || b.Worker != m.Lease().Lease.Worker:
					errc <- fmt.Errorf("run of code %d/%d, minter holds %+v", b.Region, b.Worker, m.Lease().Lease)
				}
				for l := b.Lo; l < b.Hi; l++ {
					mine = append(mine, b.ID(l))
				}
				after = b.ID(b.Hi - 1)
			}
			mu.Lock()
			all = append(all, mine...)
			mu.Unlock()
		})
	}
	for range minters {
		wg.Go(func() {
			ids, err := m.NextN(context.Background(), perMinter)
			if err != nil {
				errc <- err
			}
			mu.Lock()
			all = append(all, ids...)
			mu.Unlock()
		})
	}
	wg.Wait()
	close(errc)
	for err := range errc {
		t.Fatal(err)
	}
	if len(all) < carvers*runs+minters*perMinter {
		t.Fatalf("%d IDs", len(all))
	}
	checkUnique(t, all)
	checkInGrants(t, svc, all)
}

// A carve is refused (Unavailable, nothing taken) once the minter's lease
// has less than MinLife left, and a run never outlives the lease.
func TestCarveRefusedNearLeaseDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		m := newTestClient(t, conn, func(c *Config) { c.Codes = 1; c.MaxReserve = -1 })
		conn.SetHook(func(ctx context.Context, meth rangeclienttest.Method) error {
			if meth == rangeclienttest.Renew {
				return fmt.Errorf("renewals refused by the test: %w", segment.ErrUnavailable)
			}
			return nil
		})
		// The deadline is 9 s after acquisition (TTL 10 s - margin 1 s).
		time.Sleep(8500 * time.Millisecond)
		b, err := m.carve(context.Background(), sharedRequest(100, 0))
		if err != nil {
			t.Fatalf("carve 500 ms before the deadline: %v", err)
		}
		if left := m.Lease().SafeFor; b.ValidUntil.Sub(b.ServiceTime) > left {
			t.Fatalf("run valid for %v, lease safe for %v", b.ValidUntil.Sub(b.ServiceTime), left)
		}
		time.Sleep(450 * time.Millisecond) // 50 ms left
		before := m.Stats().Minted
		if _, err := m.carve(context.Background(), sharedRequest(100, 0)); !errors.Is(err, segment.ErrUnavailable) {
			t.Fatalf("carve 50 ms before the deadline: %v, want ErrUnavailable", err)
		}
		if after := m.Stats().Minted; after != before {
			t.Fatalf("a refused carve took %d positions", after-before)
		}
	})
}

// Near the end of the minter's current block (its validity, not the
// lease), a carve is served from the buffered next block, made current,
// instead of refused: otherwise every shared client asking in the last
// MinLife of each block would be refused and stall.
func TestCarveNearBlockEndUsesTheNextBlock(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		m := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1; c.MaxReserve = -1 })
		for i := 0; m.next.Load() == nil; i++ {
			if i == 100 {
				t.Fatal("no next block buffered after 1 s")
			}
			m.kickRefill()
			time.Sleep(10 * time.Millisecond)
		}
		cur := m.cur.Load()
		if wait := time.Duration(cur.stop.Load()-m.now()) - 50*time.Millisecond; wait > 0 {
			time.Sleep(wait) // 50 ms left: under MinLife (100 ms)
		}
		if m.cur.Load() != cur {
			t.Fatal("the current block changed before its end")
		}
		nx := m.next.Load()
		if nx == nil {
			t.Fatal("no next block buffered at the end of the current one")
		}
		b, err := m.carve(context.Background(), sharedRequest(100, 0))
		if err != nil {
			t.Fatalf("carve 50 ms before the block's end with a next block buffered: %v", err)
		}
		if b.Lo < nx.lo || b.Hi > nx.hi || m.cur.Load() != nx {
			t.Fatalf("run [%d,%d) not from the next block [%d,%d), or that block not made current", b.Lo, b.Hi, nx.lo, nx.hi)
		}
	})
}

// A carve whose after_id is further ahead of the clock than MaxLead is
// refused with backpressure (until the clock reaches it), and one beyond
// the current block as unavailable (the buffered next block
// is never carved from: the reserve merges into it); one inside the
// current block starts above after_id.
func TestCarveAfterBeyondTheLead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		m := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1 })
		now := snowflake.MsSince(svc.Now())
		far := snowflake.ID((now + 20_000) << timeShift)
		var bp *segment.Backpressure
		if _, err := m.carve(context.Background(), sharedRequest(10, far)); !errors.As(err, &bp) ||
			bp.RetryAfter < 20*time.Second-segment.DefaultMaxLead-time.Millisecond {
			t.Fatalf("carve after an ID 20 s ahead: %v, want backpressure until it is within the lead", err)
		}
		cur := m.cur.Load()
		beyond := snowflake.ID((cur.hi>>seqBits + 1) << timeShift)
		nx := m.next.Load()
		if _, err := m.carve(context.Background(), sharedRequest(10, beyond)); !errors.Is(err, segment.ErrUnavailable) {
			t.Fatalf("carve after an ID beyond the current block [%d,%d): %v, want ErrUnavailable", cur.lo, cur.hi, err)
		}
		if nx != nil && nx.state.Load() != 0 {
			t.Fatal("a carve took positions from the buffered next block")
		}
		inside := snowflake.ID((cur.hi>>seqBits - 2) << timeShift)
		b, err := m.carve(context.Background(), sharedRequest(10, inside))
		if err != nil || b.ID(b.Lo) <= inside || b.Hi > cur.hi {
			t.Fatalf("carve after an ID inside the current block: %+v, %v", b, err)
		}
	})
}

// A Codes-0 client over a service with the shared path holds no code while
// its rate is low, takes one when its rate stays above DedicatedRate, and
// keeps its IDs increasing and within the time bound throughout.
func TestSharedClientTakesACodeWhenItsRateRises(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		sc := newSharedConn(t, svc)
		c := startClient(t, Config{Allocator: sc, Region: 1, Owner: "auto"}, 10*time.Second, nil)
		if !c.Lease().Shared || !c.Stats().Shared || sc.Calls(rangeclienttest.Acquire) != 0 {
			t.Fatalf("Codes 0 over a shared service: lease %+v, acquisitions %d", c.Lease(), sc.Calls(rangeclienttest.Acquire))
		}
		var last snowflake.ID
		mint := func(perTick int, d time.Duration) {
			t.Helper()
			for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				ids, err := c.NextN(context.Background(), perTick)
				if err != nil {
					t.Fatal(err)
				}
				at := svc.Now()
				for _, id := range ids {
					if id <= last {
						t.Fatalf("ID %d after %d: not increasing", id, last)
					}
					checkTime(t, id, at)
					last = id
				}
			}
		}
		mint(10, 5*time.Second) // 1,000 IDs/s
		if !c.Stats().Shared || sc.Calls(rangeclienttest.Acquire) != 0 {
			t.Fatalf("at 1,000 IDs/s the client took a code: %+v", c.Stats())
		}
		if sc.calls.Load() < 5 {
			t.Fatalf("%d shared runs in 5 s", sc.calls.Load())
		}
		mint(1_000, 5*time.Second) // 100,000 IDs/s > DedicatedRate
		if c.Stats().Shared || c.Lease().Shared || c.Stats().Acquisitions != 1 {
			t.Fatalf("at 100,000 IDs/s the client is still shared: %+v, lease %+v", c.Stats(), c.Lease())
		}
		calls := sc.calls.Load()
		mint(1_000, time.Second)
		if sc.calls.Load() != calls {
			t.Fatal("shared runs requested after the client took a code")
		}
		if w := c.Lease().Lease.Worker; w == sc.minter.Lease().Lease.Worker {
			t.Fatalf("client took the minter's code %d", w)
		}
	})
}

// While the region has no free code, a fast Codes-0 client stays on the
// shared path (New and Next never wait for a code), retries with backoff,
// and takes a code once one is free.
func TestSharedClientStaysSharedWithoutACode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, Workers: 2})
		sc := newSharedConn(t, svc) // code 0
		other := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1 })
		c := startClient(t, Config{Allocator: sc, Region: 1, Owner: "auto"}, 10*time.Second, nil)
		var ids []snowflake.ID
		mint := func(d time.Duration) {
			t.Helper()
			for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				var err error
				if ids, err = c.AppendN(context.Background(), ids, 1_000); err != nil {
					t.Fatal(err)
				}
			}
		}
		mint(10 * time.Second)
		tries := sc.Calls(rangeclienttest.Acquire)
		if !c.Stats().Shared || tries < 2 || tries > 6 {
			t.Fatalf("no free code for 10 s: shared %v, %d acquisition attempts (want a few, with backoff)", c.Stats().Shared, tries)
		}
		other.Close() // frees code 1
		mint(40 * time.Second)
		if c.Stats().Shared || c.Lease().Lease.Worker != 1 {
			t.Fatalf("code 1 free for 40 s, client still shared: %+v", c.Lease())
		}
		if !slices.IsSorted(ids) {
			t.Fatal("IDs not increasing")
		}
		checkUnique(t, ids)
	})
}

// A service without the shared path (Unimplemented, or an allocator that
// does not offer it) gets a client that holds one code, at once.
func TestSharedPathUnsupportedTakesACode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		sc := newSharedConn(t, svc)
		unsupported := fmt.Errorf("AllocateShared: %w", errors.ErrUnsupported)
		sc.fail.Store(&unsupported)
		c := startClient(t, Config{Allocator: sc, Region: 1, Owner: "auto"}, 10*time.Second, nil)
		if c.Lease().Shared || c.Stats().Acquisitions != 1 || sc.calls.Load() != 1 {
			t.Fatalf("unsupported shared path: lease %+v, %d shared calls", c.Lease(), sc.calls.Load())
		}
		mustNext(t, c)
		plain := newTestClient(t, svc.Conn(), nil) // Codes 0, no SharedAllocator
		if plain.Lease().Shared || plain.Stats().Acquisitions != 1 {
			t.Fatalf("Codes 0 over a plain allocator: %+v", plain.Lease())
		}
	})
}

// A shared client pays about one request per sharedLife at a steady rate
// (runs sized to their validity, asked for shortly before they are
// needed), and none while idle: started and left alone it lets its run
// expire; its next Next waits for one round trip and gets a fresh ID.
func TestSharedClientCadenceAndIdle(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		sc := newSharedConn(t, svc)
		c := startClient(t, Config{Allocator: sc, Region: 1, Owner: "cadence"}, 10*time.Second, nil)
		start := sc.calls.Load()
		time.Sleep(5 * time.Second) // idle from New on
		if got := sc.calls.Load() - start; got != 0 {
			t.Fatalf("%d shared runs asked for by a client that never minted", got)
		}
		id, err := c.Next(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		checkTime(t, id, svc.Now())

		// 200 IDs/s, as each of 10,000 clients at 2M IDs/s, for 10 s.
		before, stalls := sc.calls.Load(), c.Stats().Stalls
		for range 200 {
			ids, err := c.NextN(context.Background(), 10)
			if err != nil {
				t.Fatal(err)
			}
			at := svc.Now()
			for _, id := range ids {
				checkTime(t, id, at)
			}
			time.Sleep(50 * time.Millisecond)
		}
		calls := sc.calls.Load() - before
		// One per sharedLife (800 ms) if each run were used to its end;
		// asked for with half of it left (sharedKickShare), a run waits
		// that long before its first use and is sized to what is then
		// left of its validity: 19 here. The sizing this replaced (runs
		// of 500 ms, asked for at half) made 23.
		if calls > 20 {
			t.Fatalf("%d shared runs in 10 s at 200 IDs/s, want at most 20", calls)
		}
		if s := c.Stats().Stalls - stalls; s > 2 {
			t.Fatalf("%d stalls in 10 s at 200 IDs/s: the next run was not asked for in time", s)
		}
	})
}

// A replica's minter left quiet (no Next, no carve) for longer than its
// blocks live, its idle timeout and several lease renewals still serves
// the first carve after the quiet: the carve is demand, so it starts a
// grant and waits for it within its deadline, and is served within one
// grant round trip (docs/design.md, "The shared path": the demand rule).
func TestCarveAfterQuiet(t *testing.T) {
	for _, quiet := range []time.Duration{45 * time.Second, 75 * time.Second, 10 * time.Minute} {
		t.Run(quiet.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				const rtt = 20 * time.Millisecond // every call to the fake service takes this long
				svc := fakeService(10 * time.Second)
				conn := svc.Conn()
				conn.SetDelay(rtt)
				m := newTestClient(t, conn, func(c *Config) { c.Codes = 1 })
				if _, err := m.Next(context.Background()); err != nil {
					t.Fatal(err)
				}
				time.Sleep(quiet)
				if err := m.Lease().Err; err != nil {
					t.Fatalf("the minter's lease after %v of quiet: %v", quiet, err)
				}
				for i := range 3 {
					grants := conn.Calls(rangeclienttest.Allocate)
					start := time.Now()
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					b, err := m.carve(ctx, sharedRequest(256, 0))
					cancel()
					took := time.Since(start)
					if err != nil {
						t.Fatalf("carve %d after %v of quiet: %v", i+1, quiet, err)
					}
					if b.Len() < 1 {
						t.Fatalf("carve %d: an empty run", i+1)
					}
					// One round trip at most: the grant the carve asked for
					// (and, for the first, nothing else before it).
					if n := conn.Calls(rangeclienttest.Allocate) - grants; took > rtt || (i == 0 && n < 1) {
						t.Fatalf("carve %d after %v of quiet took %v (%d grants), want at most one round trip (%v)", i+1, quiet, took, n, rtt)
					}
					checkTime(t, b.ID(b.Lo), svc.Now())
				}
			})
		})
	}
}

// A carve near the end of an idle minter's block, with no next block
// buffered (idle, the minter asked for none), waits for the block it asks
// for instead of being refused.
func TestCarveNearEndOfAnIdleMinter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		m := newTestClient(t, svc.Conn(), func(c *Config) {
			c.Codes, c.MaxReserve = 1, -1
			c.Tuning.IdleTimeout = 100 * time.Millisecond
		})
		if _, err := m.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
		cur := m.cur.Load()
		time.Sleep(time.Duration(cur.stop.Load()-m.now()) - 50*time.Millisecond) // 50 ms left: under MinLife
		if m.cur.Load() != cur || m.next.Load() != nil {
			t.Fatal("the idle minter changed its blocks")
		}
		b, err := m.carve(context.Background(), sharedRequest(100, 0))
		if err != nil {
			t.Fatalf("carve 50 ms before the end of an idle minter's block: %v", err)
		}
		if b.Lo < cur.hi {
			t.Fatalf("run [%d,%d) from the block that was ending [%d,%d)", b.Lo, b.Hi, cur.lo, cur.hi)
		}
	})
}

// Carves faster than the minter's code follows the clock stop once its
// cursor is MaxLead ahead: the carve is refused with backpressure (the
// time until it is back within the lead), not served with a run dated
// further ahead; once that time has passed, carves are served again.
func TestCarveBeyondTheLeadIsBackpressure(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		m := newTestClient(t, svc.Conn(), func(c *Config) { c.Codes = 1 })
		r := sharedRequest(segment.MaxShared, 0)
		r.MaxLead = time.Second
		var bp *segment.Backpressure
		for i := 0; ; i++ {
			if i == 1000 {
				t.Fatal("1,000 runs of 65,536 carved in no time without backpressure")
			}
			b, err := m.carve(context.Background(), r)
			if errors.As(err, &bp) {
				break
			}
			if err != nil {
				t.Fatalf("run %d: %v", i, err)
			}
			// A run starts within the lead (plus nothing: no carve runs
			// concurrently here).
			if lead := time.Duration(b.Lo>>seqBits-snowflake.MsSince(svc.Now())) * time.Millisecond; lead > r.MaxLead {
				t.Fatalf("run %d starts %v ahead of the service clock, beyond %v", i, lead, r.MaxLead)
			}
		}
		if bp.RetryAfter <= 0 || bp.RetryAfter > 100*time.Millisecond {
			t.Fatalf("backpressure retry after %v, want (0, one run's time]", bp.RetryAfter)
		}
		time.Sleep(bp.RetryAfter + time.Millisecond)
		if _, err := m.carve(context.Background(), r); err != nil {
			t.Fatalf("carve after the retry delay: %v", err)
		}
	})
}
