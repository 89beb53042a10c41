package engine

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// outageRun mints one ID per millisecond for warm, then makes the service
// unreachable and keeps minting (each call with a 1 ms context) until
// after the lease's safety deadline. It returns how long before the
// deadline the first failure came (0: none before it) and the IDs.
func outageRun(t *testing.T, svc *rangeclienttest.Service, edit func(*Config), warm time.Duration) (failedEarly time.Duration, ids []snowflake.ID) {
	t.Helper()
	conn := svc.Conn()
	c := newTestClient(t, conn, edit)
	for end := time.Now().Add(warm); time.Now().Before(end); time.Sleep(time.Millisecond) {
		ids = append(ids, mustNext(t, c))
	}
	conn.SetFault(rangeclienttest.Blackhole)
	deadline := time.Now().Add(c.Lease().SafeFor)
	for end := deadline.Add(time.Second); time.Now().Before(end); time.Sleep(time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Millisecond)
		id, err := c.Next(ctx)
		cancel()
		switch {
		case err == nil && !time.Now().Before(deadline):
			t.Fatalf("minted %v after the safety deadline", time.Since(deadline))
		case err == nil:
			ids = append(ids, id)
		case failedEarly == 0 && time.Now().Before(deadline):
			failedEarly = time.Until(deadline)
		}
	}
	return failedEarly, ids
}

// With the default configuration the client holds granted span past its
// safety deadline, so an outage of the service costs no minting until the
// deadline itself (docs/design.md case 6); without the reserve (MaxReserve
// < 0) the same outage stops it within about two RefillIntervals.
func TestReserveRidesThroughOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		early, ids := outageRun(t, svc, nil, 5*time.Second)
		if early != 0 {
			t.Fatalf("default client failed %v before its safety deadline", early)
		}
		checkUnique(t, ids)
		checkInGrants(t, svc, ids)
	})
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		early, _ := outageRun(t, svc, func(cfg *Config) { cfg.MaxReserve = -1 }, 5*time.Second)
		if early < 5*time.Second {
			t.Fatalf("without a reserve the client failed only %v before its deadline; the test no longer shows the difference", early)
		}
	})
}

// leadAhead is how far ahead of the service clock the highest grant of svc
// reaches, in ms.
func leadAhead(svc *rangeclienttest.Service) int64 {
	var hi int64
	for _, g := range svc.Grants() {
		hi = max(hi, g.Hi)
	}
	return (hi-1)>>snowflake.SequenceBits + 1 - snowflake.MsSince(svc.Now())
}

// The reserve's cost is the code's HWM running ahead of the clock: by
// default about TTL - SafetyMargin + renewal period (+ one RefillInterval),
// at most MaxReserve (+ one RefillInterval) when set, never past
// maxReserveAhead, and inside the service's MaxLead without polling a
// service that answers backpressure.
func TestReserveLead(t *testing.T) {
	for _, tc := range []struct {
		name            string
		ttl             time.Duration // service; 0: 10 s
		maxLead         time.Duration // service
		maxReserve      time.Duration // client
		minMs, maxMs    int64         // the HWM's lead at the end
		maxBackpressure uint64
	}{
		// TTL 10 s, margin 1 s, renewals every 3 s: the reserve reaches
		// 9..12 s + 4 latencies, a request adds a RefillInterval.
		{"default", 0, 0, 0, 8_000, 14_000, 0},
		{"MaxReserve 2s", 0, 0, 2 * time.Second, 1_000, 3_100, 0},
		// The service allows 6 s: one backpressure answer teaches the
		// client, which then stays a RefillInterval inside it.
		{"service MaxLead 6s", 0, 6 * time.Second, 0, 3_000, 6_000, 2},
		// A one-hour TTL under a two-hour MaxLead: the reserve stops at
		// maxReserveAhead, so the buffered block, into which the reserve
		// is merged, stays under maxSpan.
		{"TTL 1h", time.Hour, 2 * time.Hour, 0, 299_000, 302_000, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				ttl := cmp.Or(tc.ttl, 10*time.Second)
				svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: ttl, MaxLead: tc.maxLead})
				c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.MaxReserve = tc.maxReserve })
				var ids []snowflake.ID
				for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
					ids = append(ids, mustNext(t, c))
				}
				lead := leadAhead(svc)
				s := c.Stats()
				if lead < tc.minMs || lead > tc.maxMs {
					t.Fatalf("HWM %d ms ahead of the service clock; want %d..%d (%+v)", lead, tc.minMs, tc.maxMs, s)
				}
				if s.Backpressure > tc.maxBackpressure || s.Stalls > 1 {
					t.Fatalf("%d backpressure answers, %d stalls; want <= %d and <= 1", s.Backpressure, s.Stalls, tc.maxBackpressure)
				}
				checkUnique(t, ids)
				t.Logf("lead %d ms, %d refills in 30 s, %d backpressure", lead, s.Refills, s.Backpressure)
			})
		})
	}
}

// lostLease returns a client on svc whose lease has passed its safety
// deadline with the service unreachable (conn's fault), its deadline, and
// conn.
func lostLease(t *testing.T, svc *rangeclienttest.Service) (*Engine, *rangeclienttest.Conn) {
	t.Helper()
	conn := svc.Conn()
	c := newTestClient(t, conn, shortLease)
	mustNext(t, c)
	conn.SetFault(rangeclienttest.Unreachable)
	time.Sleep(c.Lease().SafeFor + time.Millisecond)
	if err := c.Lease().Err; !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("lease after its deadline: %v", err)
	}
	return c, conn
}

// Next waits within its context for the client's own recovery: across a
// lease loss that heals in 1 s a 2 s context gets an ID; a 100 ms context
// gets a retryable ErrUnavailable that wraps the cause (ErrLeaseLost) and
// the context's error; a context without deadline waits until Close.
func TestNextWaitsForRecovery(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		c, conn := lostLease(t, svc)

		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := c.Next(ctx)
		switch {
		case !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrLeaseLost) || !errors.Is(err, context.DeadlineExceeded):
			t.Fatalf("Next with a 100 ms context: %v; want ErrUnavailable wrapping ErrLeaseLost and the deadline", err)
		case !IsRetryable(err):
			t.Fatalf("%v is not retryable", err)
		case time.Since(start) != 100*time.Millisecond:
			t.Fatalf("Next returned after %v, want its 100 ms", time.Since(start))
		case strings.Contains(err.Error(), "\n"):
			t.Fatalf("error spans lines: %q", err)
		}

		go func() {
			time.Sleep(time.Second)
			conn.SetFault(rangeclienttest.Healthy)
		}()
		ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel2()
		id, err := c.Next(ctx2)
		if err != nil {
			t.Fatalf("Next with a 2 s context across a 1 s outage: %v", err)
		}
		checkInGrants(t, svc, []snowflake.ID{id})
	})
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		c, _ := lostLease(t, svc)
		done := make(chan error)
		go func() { _, err := c.Next(context.Background()); done <- err }()
		time.Sleep(10 * time.Second)
		select {
		case err := <-done:
			t.Fatalf("Next without deadline returned %v while the service was down", err)
		default:
		}
		c.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("waiting Next after Close: %v; want ErrClosed", err)
		}
	})
}

// Close returns within RPCTimeout whatever the network does: here every
// call hangs until its context ends. With the lease alive Close's own
// release may take RPCTimeout; after the lease expired Close returns at
// once, cancelling the background loop's release.
func TestCloseIsBounded(t *testing.T) {
	for _, expired := range []bool{true, false} {
		synctest.Test(t, func(t *testing.T) {
			svc := fakeService(3 * time.Second)
			conn := svc.Conn()
			c := newTestClient(t, conn, shortLease)
			mustNext(t, c)
			conn.SetFault(rangeclienttest.Blackhole)
			if expired {
				time.Sleep(c.Lease().SafeFor + 10*time.Millisecond)
			}
			start := time.Now()
			c.Close()
			// An expired lease needs no release: the background one is
			// cancelled, so no (fake) time passes at all.
			limit := DefaultRPCTimeout
			if expired {
				limit = 0
			}
			if d := time.Since(start); d > limit {
				t.Fatalf("Close (lease expired: %t) took %v; want <= %v", expired, d, limit)
			}
		})
	}
}

// A refill that keeps failing is retried with backoff, also while the
// reserve is short (a failure must not wake the loop that just failed).
func TestFailingRefillsBackOff(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, nil)
		mustNext(t, c)
		conn.SetHook(func(_ context.Context, m rangeclienttest.Method) error {
			if m == rangeclienttest.Allocate {
				return fmt.Errorf("test: %w", segment.ErrCorrupt)
			}
			return nil
		})
		before := conn.Calls(rangeclienttest.Allocate)
		time.Sleep(10 * time.Second)
		// Backoff from 50 ms doubling to 2 s: about 10 calls in 10 s.
		if n := conn.Calls(rangeclienttest.Allocate) - before; n > 20 {
			t.Fatalf("%d grant requests in 10 s against a refusing service; want backoff", n)
		}
	})
}

// FixedBlock pins every request, those that build the reserve included:
// the reserve is then made of several blocks.
func TestFixedBlockPinsReserveRequests(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		const fixed = 100 * perMsCapacity // 100 ms
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Tuning.FixedBlock = fixed })
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
			mustNext(t, c)
		}
		gs := svc.Grants()
		for _, g := range gs {
			if g.Len() > fixed {
				t.Fatalf("grant of %d units; FixedBlock is %d", g.Len(), fixed)
			}
		}
		if lead := leadAhead(svc); lead < 8_000 {
			t.Fatalf("reserve of fixed blocks reaches only %d ms ahead (%d grants)", lead, len(gs))
		}
	})
}

// onGrid moves a timed wake-up to the next wakeGrid boundary of the wall
// clock, by less than one step, so clients' reserve requests meet at the
// service and share a Txn.
func TestOnGrid(t *testing.T) {
	base := time.Date(2030, 1, 1, 0, 0, 0, 0, time.UTC) // on a boundary
	for _, tc := range []struct{ now, d, want time.Duration }{
		{0, 0, 0},
		{0, time.Millisecond, wakeGrid},
		{7 * time.Millisecond, 0, wakeGrid - 7*time.Millisecond},
		{7 * time.Millisecond, 43 * time.Millisecond, 43 * time.Millisecond},
		{7 * time.Millisecond, 44 * time.Millisecond, 43*time.Millisecond + wakeGrid},
		{time.Microsecond, 250 * time.Millisecond, 300*time.Millisecond - time.Microsecond},
	} {
		if got := onGridFrom(base.Add(tc.now), tc.d); got != tc.want {
			t.Errorf("onGrid at +%v of %v = %v, want %v", tc.now, tc.d, got, tc.want)
		}
	}
}
