package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// The client measures time only on Go's monotonic clock, so a step of the
// host's wall clock cannot reach it: its time origin carries a monotonic
// reading (time.Time.String shows it as "m=..."), every local instant is
// time.Since that origin, and a wall-clock reading (Round(0), UTC, In, ...)
// in its place would strip it.
func TestClientTimeIgnoresTheWallClock(t *testing.T) {
	c := newTestClient(t, rangeclienttest.New(rangeclienttest.Options{Region: 1}).Conn(), nil)
	if !strings.Contains(c.origin.String(), " m=") {
		t.Fatalf("client time origin %v has no monotonic clock reading: a wall-clock step would move the client's deadlines", c.origin)
	}
	before := time.Since(c.origin)
	now := time.Duration(c.now())
	if after := time.Since(c.origin); now < before || now > after {
		t.Fatalf("Client.now() = %v, not between time.Since(origin) readings %v and %v", now, before, after)
	}
}

// IDs minted over 11 s stay inside granted blocks, unique and increasing,
// and no block is used past its validity on the service's clock. (This
// test used to also step an injected client clock back and forth; the
// client now reads only Go's monotonic clock, which a wall-clock step
// cannot move: see TestClientTimeIgnoresTheWallClock.)
func TestBlocksUsedOnlyInsideTheirValidity(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), nil)
		var ids []snowflake.ID
		var at []time.Time // service time of each mint
		mint := func(n int) {
			for range n {
				ids = append(ids, mustNext(t, c))
				at = append(at, svc.Now())
				time.Sleep(500 * time.Microsecond)
			}
		}
		mint(2000)
		for range 7 {
			mint(3000)
		}
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("ID %d not above the previous", i)
			}
		}
		checkUnique(t, ids)
		checkInGrants(t, svc, ids)
		// Nor is a block used past its validity on the service's clock.
		idx := rangeclienttest.Index(svc.Grants())
		for i, id := range ids {
			if g, _ := idx.Find(id); at[i].After(g.ValidUntil) {
				t.Fatalf("ID %d minted %v after its block's ValidUntil", i, at[i].Sub(g.ValidUntil))
			}
		}
	})
}

// While the service is unreachable or hangs (the refill loop is stuck in a
// call), the client mints up to its safety deadline and not past it, then
// fails with ErrLeaseLost. (This test used to also step an injected client
// clock back 2 s 150 ms before the deadline; the deadline is kept on Go's
// monotonic clock alone now, which no clock step moves.)
func TestMintsUntilTheSafetyDeadlineOnly(t *testing.T) {
	for _, fault := range []rangeclienttest.Fault{rangeclienttest.Unreachable, rangeclienttest.Blackhole} {
		synctest.Test(t, func(t *testing.T) {
			svc := fakeService(3 * time.Second)
			conn := svc.Conn()
			c := newTestClient(t, conn, shortLease)
			conn.SetFault(fault)
			deadline := time.Now().Add(c.Lease().SafeFor)
			time.Sleep(time.Until(deadline) - 150*time.Millisecond)
			minted := 0
			for time.Now().Before(deadline.Add(3 * time.Second)) {
				_, err := c.Next(expiredCtx())
				switch {
				case err == nil && !time.Now().Before(deadline):
					t.Fatalf("fault %v: minted %v after the safety deadline", fault, time.Since(deadline))
				case err == nil:
					minted++
				case time.Now().Before(deadline):
					t.Fatalf("fault %v: failed %v before the deadline: %v", fault, time.Until(deadline), err)
				case !errors.Is(err, ErrLeaseLost):
					t.Fatalf("fault %v: after the deadline: %v", fault, err)
				}
				time.Sleep(time.Millisecond)
			}
			if minted < 100 {
				t.Fatalf("fault %v: only %d IDs in the 150 ms before the deadline", fault, minted)
			}
		})
	}
}

// docs/design.md case 4: pause the old owner, let its lease expire, let a new owner
// take the code, resume the old one. "Paused" is a process stopped with
// requests in flight: its calls take effect but their replies are held, and
// no Next runs; its monotonic clock keeps running (as under SIGSTOP). On
// resume it mints nothing under the old lease: the first Next fails on the
// local deadline while the replies are still held, and the held renewal
// reply ("renewed") does not revive it because its deadline counts from the
// time the renewal was sent.
func TestDesignCase4PausedOwnerIsFenced(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		connA := svc.Conn()
		// 10 s blocks outlive the pause: only the lease stops A.
		a := newTestClient(t, connA, func(cfg *Config) { shortLease(cfg); cfg.RefillInterval = 10 * time.Second })
		leaseA := a.Lease().Lease
		var idsA []snowflake.ID
		for range 500 {
			idsA = append(idsA, mustNext(t, a))
			time.Sleep(time.Millisecond)
		}
		pausedAt := time.Now()
		deadlineA := pausedAt.Add(a.Lease().SafeFor)
		connA.SetFault(rangeclienttest.HoldReplies)

		// The lease expires in the service; B takes the same code.
		time.Sleep(5 * time.Second)
		if _, ok := svc.Owner(leaseA.Worker); ok {
			t.Fatal("A's lease still alive in the service after 5 s of pause")
		}
		b := newTestClient(t, svc.Conn(), shortLease)
		leaseB := b.Lease().Lease
		if leaseB.Worker != leaseA.Worker || leaseB.Token <= leaseA.Token {
			t.Fatalf("B got %+v; want A's code %d with a token above %d", leaseB, leaseA.Worker, leaseA.Token)
		}
		var idsB []snowflake.ID
		for range 500 {
			idsB = append(idsB, mustNext(t, b))
		}

		// Resume A. Its first calls run while the replies it was waiting
		// for are still held: the local deadline alone must stop it.
		for range 3 {
			before := time.Now()
			id, err := a.Next(expiredCtx())
			if err == nil {
				t.Fatalf("resumed A minted %d (%+v) %v after its safety deadline", id, id.Parts(), time.Since(deadlineA))
			}
			if !errors.Is(err, ErrLeaseLost) || time.Since(before) != 0 {
				t.Fatalf("resumed A: %v after %v; want ErrLeaseLost at once", err, time.Since(before))
			}
		}
		// Then the held replies arrive (the renewal among them says
		// "renewed"): A must not use its old lease again.
		connA.SetFault(rangeclienttest.Healthy)
		for range 50 {
			id, err := a.Next(expiredCtx())
			if err == nil {
				idsA = append(idsA, id)
				if g, ok := rangeclienttest.Index(svc.Grants()).Find(id); !ok || g.Token == leaseA.Token {
					t.Fatalf("A minted %d under its old lease (grant %+v, found %v) after resuming", id, g, ok)
				}
			} else if !errors.Is(err, ErrLeaseLost) && !errors.Is(err, ErrFenced) && !errors.Is(err, ErrUnavailable) {
				t.Fatalf("resumed A: %v", err)
			}
			time.Sleep(20 * time.Millisecond)
			idsB = append(idsB, mustNext(t, b))
		}
		if got := a.Lease().Lease; got.Token == leaseA.Token {
			t.Fatalf("A still holds its old lease %+v", got)
		} else if got.Worker == leaseB.Worker {
			t.Fatalf("A's new lease %+v is on B's code", got)
		}
		all := append(append([]snowflake.ID(nil), idsA...), idsB...)
		checkUnique(t, all)
		checkInGrants(t, svc, all)
	})
}

// docs/design.md case 4 with the old owner kept from taking a new lease: after the
// pause it mints nothing from the blocks it still holds, because its
// safety deadline, on Go's monotonic clock, passed during the pause; and it
// holds no usable lease. (Were the host's monotonic clock frozen too, as in
// some VM pauses, it could mint from them until its first call to the
// service is fenced; those blocks lie below the code's high-water mark,
// which the new owner's blocks start above, so the IDs still would not
// overlap: the grants' overlap check below covers that.) This test used to
// freeze an injected client clock during the pause; the client has only
// the monotonic clock now, so the pause itself is the fault.
func TestDesignCase4PausedOwnerMintsNothingStale(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		connA := svc.Conn()
		a := newTestClient(t, connA, shortLease)
		leaseA := a.Lease().Lease
		var idsA []snowflake.ID
		for range 200 {
			idsA = append(idsA, mustNext(t, a))
			time.Sleep(time.Millisecond)
		}
		connA.SetFault(rangeclienttest.HoldReplies)
		time.Sleep(5 * time.Second)
		b := newTestClient(t, svc.Conn(), shortLease)
		if b.Lease().Lease.Worker != leaseA.Worker {
			t.Fatalf("B did not take A's code")
		}
		var idsB []snowflake.ID
		for range 200 {
			idsB = append(idsB, mustNext(t, b))
		}
		// A acquires nothing new while we look, so its stop is visible.
		connA.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
			if m == rangeclienttest.Acquire {
				return errors.New("test: no new lease for A")
			}
			return nil
		})
		connA.SetFault(rangeclienttest.Healthy)
		stale := 0
		for range 3000 {
			id, err := a.Next(expiredCtx())
			if err != nil {
				if !errors.Is(err, ErrFenced) && !errors.Is(err, ErrLeaseLost) {
					t.Fatalf("A after the pause: %v", err)
				}
				break
			}
			stale++
			idsA = append(idsA, id)
			idsB = append(idsB, mustNext(t, b))
			time.Sleep(time.Millisecond)
		}
		if stale != 0 {
			t.Fatalf("A minted %d IDs after the pause, past its safety deadline on the monotonic clock", stale)
		}
		if a.Lease().Err == nil {
			t.Fatal("A kept its lease after the pause")
		}
		all := append(append([]snowflake.ID(nil), idsA...), idsB...)
		checkUnique(t, all)
		checkInGrants(t, svc, all)
	})
}

// docs/design.md case 6: the regional service becomes unreachable (requests dropped)
// for several clients: they mint on inside their safe interval, then fail
// closed with ErrLeaseLost; when it returns they recover without restart
// and without duplicates.
func TestDesignCase6ServiceIsolated(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		const n = 3
		conns := make([]*rangeclienttest.Conn, n)
		clients := make([]*Engine, n)
		for i := range clients {
			conns[i] = svc.Conn()
			clients[i] = newTestClient(t, conns[i], shortLease)
		}
		var ids []snowflake.ID
		mintAll := func() {
			for _, c := range clients {
				ids = append(ids, mustNext(t, c))
			}
		}
		for range 200 {
			mintAll()
			time.Sleep(time.Millisecond)
		}
		deadlines := make([]time.Time, n)
		for i, c := range clients {
			conns[i].SetFault(rangeclienttest.Blackhole)
			deadlines[i] = time.Now().Add(c.Lease().SafeFor)
		}
		lost := make([]bool, n)
		for end := time.Now().Add(4 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			for i, c := range clients {
				id, err := c.Next(expiredCtx())
				switch {
				case err == nil && !time.Now().Before(deadlines[i]):
					t.Fatalf("client %d minted %v after its safety deadline", i, time.Since(deadlines[i]))
				case err == nil:
					if lost[i] {
						t.Fatalf("client %d minted again during the isolation", i)
					}
					ids = append(ids, id)
				case time.Now().Before(deadlines[i]):
					t.Fatalf("client %d failed %v before its deadline: %v", i, time.Until(deadlines[i]), err)
				case !errors.Is(err, ErrLeaseLost):
					t.Fatalf("client %d after its deadline: %v; want ErrLeaseLost", i, err)
				default:
					lost[i] = true
				}
			}
		}
		for i := range lost {
			if !lost[i] {
				t.Fatalf("client %d never failed closed", i)
			}
		}
		for _, conn := range conns {
			conn.SetFault(rangeclienttest.Healthy)
		}
		time.Sleep(3 * time.Second) // backoff is at most 2 s
		for range 200 {
			mintAll()
		}
		checkUnique(t, ids)
		checkInGrants(t, svc, ids)
		for i, c := range clients {
			if s := c.Stats(); s.Expiries != 1 || s.Acquisitions != 2 {
				t.Errorf("client %d: %d expiries, %d acquisitions; want 1 and 2", i, s.Expiries, s.Acquisitions)
			}
		}
	})
}

// docs/design.md case 5: 4 regions x 200 workers, each region its own service, the
// whole fleet in one millisecond: under synctest's fake time no time
// passes while the callers run, so every client mints its 1,000 IDs in the
// same millisecond. All decoded fields in range, region and worker as
// leased, every ID unique. TestRealDesignCase5Fleet runs the fleet over etcd.
func TestDesignCase5FleetInOneMillisecond(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const regions, perRegion, perClient = 4, 200, 1000
		svcs := make([]*rangeclienttest.Service, regions)
		clients := make([][]*Engine, regions)
		for r := range regions {
			svcs[r] = rangeclienttest.New(rangeclienttest.Options{Region: r, Start: bubbleStart})
			for range perRegion {
				clients[r] = append(clients[r], startClient(t,
					Config{Allocator: svcs[r].Conn(), Region: r, Owner: "fleet"}, 30*time.Second, nil))
			}
		}

		// All 800 mint at once, at one instant of fake time.
		ms := snowflake.MsSince(svcs[0].Now())
		out := mintAtOnce(t, clients, perClient)

		checkFleet(t, clients, out, regions*perRegion*perClient,
			func(m int64) bool { return m == ms }, fmt.Sprintf("the fleet's one ms %d", ms))
	})
}
