package rangeclient

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
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
// at most MaxReserve (+ one RefillInterval) when set, and inside the
// service's MaxLead without polling a service that answers backpressure.
func TestReserveLead(t *testing.T) {
	for _, tc := range []struct {
		name            string
		maxLead         time.Duration // service
		maxReserve      time.Duration // client
		minMs, maxMs    int64         // the HWM's lead at the end
		maxBackpressure uint64
	}{
		// TTL 10 s, margin 1 s, renewals every 3 s: the reserve reaches
		// 9..12 s + 4 latencies, a request adds a RefillInterval.
		{"default", 0, 0, 8_000, 14_000, 0},
		{"MaxReserve 2s", 0, 2 * time.Second, 1_000, 3_100, 0},
		// The service allows 6 s: one backpressure answer teaches the
		// client, which then stays a RefillInterval inside it.
		{"service MaxLead 6s", 6 * time.Second, 0, 3_000, 6_000, 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: 10 * time.Second, MaxLead: tc.maxLead})
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
