package engine

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

func TestBlockCountPolicy(t *testing.T) {
	c := &lane{cfg: Config{RefillInterval: time.Second, Tuning: Tuning{MinBlock: DefaultMinBlock, MaxBlock: DefaultMaxBlock}}}
	for _, tc := range []struct {
		rate float64
		want int
	}{
		{0, 4_096_000},         // idle: one second of span
		{1_000, 4_096_000},     // slow: still one second of span (the cursor follows time)
		{3_000_000, 4_096_000}, // 3,000 IDs/ms fits in the time-following span
		{8_192_000, 8_192_000}, // dense: 2x capacity -> a block that lasts ~1 s of IDs
		{1e9, DefaultMaxBlock}, // clamped
	} {
		if got := c.blockCount(tc.rate, 2*time.Millisecond); got != tc.want {
			t.Errorf("blockCount(%v/s) = %d, want %d", tc.rate, got, tc.want)
		}
	}
	// A slow service: the span covers four round trips.
	if got := c.blockCount(0, 400*time.Millisecond); got != 1600<<12 {
		t.Errorf("blockCount with 400 ms refills = %d, want 1.6 s of span", got)
	}
	c.cfg.RefillInterval = 10 * time.Millisecond
	c.cfg.Tuning.MinBlock = 100_000
	if got := c.blockCount(0, 0); got != 100_000 {
		t.Errorf("MinBlock clamp: %d", got)
	}
	c.cfg.Tuning.FixedBlock = 777
	if got := c.blockCount(1e9, time.Second); got != 777 {
		t.Errorf("FixedBlock: %d", got)
	}
}

// Steady state against a slow service (20 ms per call): a caller minting
// every millisecond, and one minting bursts of 3,000 IDs per millisecond,
// never wait for a block, because the next one is fetched in the background
// well before the current one ends.
func TestSteadyStateHasNoStalls(t *testing.T) {
	for _, tc := range []struct {
		name    string
		burst   int
		for_    time.Duration
		reserve time.Duration // Config.MaxReserve
	}{
		{"1 per ms", 1, 10 * time.Second, -1},
		{"3000 per ms", 3000, 4 * time.Second, -1},
		{"1 per ms with reserve", 1, 10 * time.Second, 0},
		{"3000 per ms with reserve", 3000, 4 * time.Second, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				svc := fakeService(10 * time.Second)
				conn := svc.Conn()
				conn.SetDelay(20 * time.Millisecond)
				c := newTestClient(t, conn, func(cfg *Config) { cfg.MaxReserve = tc.reserve })
				buf := make([]snowflake.ID, 0, tc.burst)
				var last snowflake.ID
				ctx := context.Background()
				for end := time.Now().Add(tc.for_); time.Now().Before(end); time.Sleep(time.Millisecond) {
					var err error
					buf, err = c.AppendN(ctx, buf[:0], tc.burst)
					if err != nil {
						t.Fatal(err)
					}
					for _, id := range buf {
						if id <= last {
							t.Fatalf("ID %d not above %d", id, last)
						}
						last = id
					}
					// At up to 3,000/ms the IDs carry the current service ms,
					// or up to one refill latency (20 ms) more: a block's
					// validity is counted from when its request was sent, so
					// it ends that much early and the next starts at its Hi.
					if got, now := buf[len(buf)-1].Ms(), snowflake.MsSince(svc.Now()); got < now || got > now+20 {
						t.Fatalf("burst ends at ms %d, service is at %d", got, now)
					}
				}
				s := c.Stats()
				if s.Stalls != 0 {
					t.Fatalf("%d stalls at steady state (%+v)", s.Stalls, s)
				}
				// Without the reserve a block lasts one RefillInterval; with it
				// blocks are larger (they extend the reserve by a renewal
				// period) and fewer.
				if min := uint64(tc.for_/time.Second) - 1; tc.reserve < 0 && s.Refills < min {
					t.Fatalf("%d refills in %v; want >= %d (one per RefillInterval)", s.Refills, tc.for_, min)
				}
				if s.Backpressure != 0 || s.RefillErrors != 0 {
					t.Fatalf("unexpected refill trouble: %+v", s)
				}
				t.Logf("%+v", s)
			})
		})
	}
}

// Minting faster than 4,096 IDs/ms makes the cursor run ahead of time; the
// client grows its blocks so that they still last about RefillInterval.
func TestDenseMintingGrowsBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), nil)
		buf := make([]snowflake.ID, 0, 12_000)
		for end := time.Now().Add(3 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			var err error
			if buf, err = c.AppendN(context.Background(), buf[:0], 12_000); err != nil {
				t.Fatal(err)
			}
		}
		s := c.Stats()
		if s.NextBlock <= 2*DefaultRefillIntervalCount {
			t.Fatalf("at %.0f IDs/s the next block is %d units; want it grown above %d", s.Rate, s.NextBlock, 2*DefaultRefillIntervalCount)
		}
		biggest := int64(0)
		for _, g := range svc.Grants() {
			biggest = max(biggest, g.Len())
		}
		if biggest <= DefaultRefillIntervalCount {
			t.Fatalf("largest grant %d; blocks did not grow", biggest)
		}
		t.Logf("rate %.0f/s, next block %d, largest grant %d, stalls %d", s.Rate, s.NextBlock, biggest, s.Stalls)
	})
}

// DefaultRefillIntervalCount is the default block: 1 s of span.
const DefaultRefillIntervalCount = 1000 << snowflake.SequenceBits

// More than 4,096 IDs/ms for longer than the service's bounded lead: the
// service refuses with backpressure, the client waits within the caller's
// deadline (ErrUnavailable, retryable, if it is too short) and goes on.
func TestBackpressureWaits(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const lead = 200 * time.Millisecond
		svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, MaxLead: lead})
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Tuning.FixedBlock = 409_600 }) // 100 ms blocks
		// ~366 ms of capacity at once: more than the 200 ms lead allows.
		const want = 1_500_000
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		_, err := c.NextN(ctx, want)
		cancel()
		if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("NextN beyond the lead with a 10 ms deadline: %v; want ErrUnavailable", err)
		}
		// (The error carries the last refill error only if the last grant
		// failed: at its lead limit the service refuses a grant it would
		// trim below segment.Policy.MinGrantPercent of the request.)
		if s := c.Stats(); s.Backpressure == 0 {
			t.Fatalf("no backpressure seen by the 10 ms deadline: %+v", s)
		}
		start := time.Now()
		ids, err := c.NextN(context.Background(), want)
		if err != nil {
			t.Fatal(err)
		}
		if waited := time.Since(start); waited < 100*time.Millisecond {
			t.Fatalf("NextN beyond the lead waited only %v", waited)
		}
		// Never further ahead of the service clock than the lead allows.
		for _, id := range ids[len(ids)-10:] {
			if ahead := id.Time().Sub(svc.Now()); ahead > lead+time.Millisecond {
				t.Fatalf("ID %v ahead of the service clock", ahead)
			}
		}
	})
}

// Blocks shorter than a refill round trip would be over on arrival; the
// client grows their span to cover the observed latency and keeps minting.
func TestSlowServiceGrowsShortBlocks(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(30 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) { cfg.RefillInterval = 100 * time.Millisecond })
		conn.SetDelay(300 * time.Millisecond) // grants now take 3x a block's span
		minted := 0
		for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Millisecond)
			if _, err := c.Next(ctx); err == nil {
				minted++
			}
			cancel()
		}
		s := c.Stats()
		// After the first slow refills the span covers the latency and the
		// prefetch starts early enough: most milliseconds get their ID.
		if minted < 8000 {
			t.Fatalf("minted %d IDs in 10 s with a 300 ms service (%+v)", minted, s)
		}
		if s.NextBlock < 4*300<<12 {
			t.Fatalf("next block %d units, want >= 4 round trips of span", s.NextBlock)
		}
		t.Logf("minted %d, %+v", minted, s)
	})
}

// An idle client stops refreshing blocks after IdleTimeout; its next Next
// waits for one refill (a counted stall) and works.
func TestIdleClientStopsRefreshing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) { cfg.Tuning.IdleTimeout = 3 * time.Second })
		mustNext(t, c)
		time.Sleep(6 * time.Second) // idle detected, buffered blocks run out
		before := conn.Calls(rangeclienttest.Allocate)
		time.Sleep(30 * time.Second)
		if n := conn.Calls(rangeclienttest.Allocate) - before; n != 0 {
			t.Fatalf("idle client made %d grant requests in 30 s", n)
		}
		if conn.Calls(rangeclienttest.Renew) == 0 {
			t.Fatal("idle client stopped renewing its lease")
		}
		if err := c.Health(); err != nil {
			t.Fatalf("idle client unhealthy: %v", err)
		}
		stalls := c.Stats().Stalls
		id := mustNext(t, c)
		if got, want := id.Ms(), snowflake.MsSince(svc.Now()); got != want {
			t.Fatalf("first ID after idling has ms %d, service at %d", got, want)
		}
		if s := c.Stats(); s.Stalls != stalls+1 {
			t.Fatalf("stalls %d -> %d; want exactly one for the first Next after idling", stalls, s.Stalls)
		}
		// Busy again: back to prefetching, no more stalls.
		for range 3000 {
			mustNext(t, c)
			time.Sleep(time.Millisecond)
		}
		if s := c.Stats(); s.Stalls != stalls+1 {
			t.Fatalf("stalls %d after resuming; want %d", s.Stalls, stalls+1)
		}
	})
}

// Both buffers empty and the service hangs: Next waits up to its deadline,
// then returns ErrUnavailable (retryable), never an ID outside a block.
func TestEmptyBuffersWaitThenUnavailable(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(30 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) {
			cfg.RefillInterval = 100 * time.Millisecond
			cfg.MaxReserve = -1 // no reserve: TestReserve* covers the reserve
		})
		conn.SetFault(rangeclienttest.Blackhole)
		time.Sleep(time.Second) // both 100 ms blocks are over
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Next(ctx)
		if !errors.Is(err, ErrUnavailable) || !IsRetryable(err) {
			t.Fatalf("Next with empty buffers: %v; want ErrUnavailable", err)
		}
		if waited := time.Since(start); waited != 50*time.Millisecond {
			t.Fatalf("Next waited %v, want its 50 ms deadline", waited)
		}
		if err := c.Health(); !errors.Is(err, ErrUnavailable) {
			t.Fatalf("Health = %v", err)
		}
		conn.SetFault(rangeclienttest.Healthy)
		ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel2()
		if _, err := c.Next(ctx2); err != nil {
			t.Fatalf("after the service returned: %v", err)
		}
	})
}
