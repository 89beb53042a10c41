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
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

type ctxMarker struct{}

// markedCtx is the context the tests pass to Next; the fake's hook fails
// the test if any call to the service carries it (Next must not call the
// network, not even indirectly with the caller's context).
func markedCtx() context.Context {
	return context.WithValue(context.Background(), ctxMarker{}, true)
}

// expiredCtx is a markedCtx that is already cancelled: Next returns at once
// with the error it would otherwise wait out (a lost or fenced lease, no
// block), so a test can check that error without waiting for the client's
// own recovery.
func expiredCtx() context.Context {
	ctx, cancel := context.WithCancel(markedCtx())
	cancel()
	return ctx
}

func forbidCallerContext(t *testing.T, conn *rangeclienttest.Conn) {
	conn.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
		if ctx.Value(ctxMarker{}) != nil {
			t.Errorf("%v call to the service carries the caller's context", m)
		}
		return nil
	})
}

// shortLease is a client config for lease tests: TTL 3 s from the fake,
// margin 1 s (safe interval 2 s), blocks spanning 5 s so that the buffers
// outlast the safe interval and the deadline is what stops minting.
func shortLease(cfg *Config) {
	cfg.SafetyMargin = time.Second
	cfg.RefillInterval = 5 * time.Second
}

// Renewals fail: before the safety deadline Next keeps minting from the
// buffers; at the deadline it fails at once with ErrLeaseLost, without a
// network call and without waiting; when the service is back the client
// takes a fresh lease and resumes, with no duplicate.
func TestLeaseLossFailsClosedAndRecovers(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		conn := svc.Conn()
		forbidCallerContext(t, conn)
		c := newTestClient(t, conn, shortLease)
		old := c.Lease().Lease
		var ids []snowflake.ID
		for range 100 {
			ids = append(ids, mustNext(t, c))
			time.Sleep(10 * time.Millisecond)
		}

		conn.SetFault(rangeclienttest.Unreachable)
		li := c.Lease()
		if li.Err != nil || li.SafeFor <= 0 || li.SafeFor > 2*time.Second {
			t.Fatalf("lease before the fault: %+v", li)
		}
		deadline := time.Now().Add(li.SafeFor)

		// Inside the safe interval: minting goes on from the buffers.
		for time.Now().Before(deadline.Add(-5 * time.Millisecond)) {
			id, err := c.Next(markedCtx())
			if err != nil {
				t.Fatalf("Next %v before the deadline: %v", time.Until(deadline), err)
			}
			ids = append(ids, id)
			time.Sleep(5 * time.Millisecond)
		}
		if c.Stats().RenewalFailures == 0 {
			t.Fatal("no renewal failed during the fault")
		}
		time.Sleep(time.Until(deadline))

		// At the deadline: fail at once, no waiting, no network call.
		for range 3 {
			before, calls := time.Now(), conn.TotalCalls()
			id, err := c.Next(expiredCtx())
			if err == nil {
				t.Fatalf("Next at the safety deadline returned %d (%+v)", id, id.Parts())
			}
			if !errors.Is(err, ErrLeaseLost) || !errors.Is(err, segment.ErrLeaseLost) || !IsRetryable(err) {
				t.Fatalf("Next at the deadline: %v; want ErrLeaseLost (retryable)", err)
			}
			if d := time.Since(before); d != 0 {
				t.Fatalf("failing Next took %v of (fake) time", d)
			}
			if n := conn.TotalCalls(); n != calls {
				t.Logf("background loop made %d calls meanwhile", n-calls)
			}
			if _, err := c.NextN(expiredCtx(), 10); !errors.Is(err, ErrLeaseLost) {
				t.Fatalf("NextN at the deadline: %v", err)
			}
			time.Sleep(700 * time.Millisecond)
		}
		if err := c.Health(); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Health = %v, want ErrLeaseLost", err)
		}
		if s := c.Stats(); s.Expiries != 1 {
			t.Fatalf("Stats.Expiries = %d, want 1", s.Expiries)
		}

		// The service comes back: a fresh lease, minting resumes.
		conn.SetFault(rangeclienttest.Healthy)
		var err error
		for range 100 {
			time.Sleep(100 * time.Millisecond)
			var id snowflake.ID
			if id, err = c.Next(markedCtx()); err == nil {
				ids = append(ids, id)
				break
			}
		}
		if err != nil {
			t.Fatalf("client did not recover after 10 s: %v", err)
		}
		nl := c.Lease().Lease
		if nl.Token <= old.Token {
			t.Fatalf("new lease token %d not above the old %d", nl.Token, old.Token)
		}
		for range 1000 {
			ids = append(ids, mustNext(t, c))
		}
		checkUnique(t, ids)
		checkInGrants(t, svc, ids)
		for _, g := range svc.Grants() {
			if g.Token != old.Token && g.Token != nl.Token {
				t.Fatalf("grant under unexpected token %d", g.Token)
			}
		}
	})
}

// A fenced reply (the code has a new owner) stops minting at once, even
// with full buffers and time left before the safety deadline.
func TestFencedReplyStopsMintingAtOnce(t *testing.T) {
	for _, during := range []rangeclienttest.Method{rangeclienttest.Renew, rangeclienttest.Allocate} {
		t.Run(during.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				svc := fakeService(10 * time.Second)
				connA := svc.Conn()
				a := newTestClient(t, connA, func(cfg *Config) {
					cfg.RefillInterval = 5 * time.Second
					if during == rangeclienttest.Allocate {
						// With the reserve A would ask for no block before its
						// deadline (renewals fail here); without it a grant
						// comes within a block's life and carries the fence.
						cfg.MaxReserve = -1
					}
				})
				codeA := a.Lease().Lease
				mustNext(t, a)
				buffered := []*block{a.cur.Load(), a.next.Load()}

				// The old lease ends and another owner takes the code. Only
				// the call under test may carry the news (the other kind
				// fails as unreachable), and while the test looks A cannot
				// get a new code either.
				blockAcquire := make(chan struct{})
				connA.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
					switch {
					case m == rangeclienttest.Acquire:
						select {
						case <-blockAcquire:
							return nil
						default:
							return fmt.Errorf("test: no code for you yet: %w", segment.ErrNoFreeCode)
						}
					case m != during && (m == rangeclienttest.Renew || m == rangeclienttest.Allocate):
						return fmt.Errorf("test: only the call under test gets through: %w", segment.ErrUnavailable)
					}
					return nil
				})
				// Let a call already past the hook (the reserve may be
				// refilling) finish before the code changes owner.
				synctest.Wait()
				svc.Revoke(codeA.Worker)
				b := newTestClient(t, svc.Conn(), nil)
				if got := b.Lease().Lease; got.Worker != codeA.Worker || got.Token <= codeA.Token {
					t.Fatalf("B got %+v, want code %d with a larger token than %d", got, codeA.Worker, codeA.Token)
				}

				// Keep A busy until the fenced reply arrives (a renewal
				// comes within 3 s, a grant within a block's life).
				var minted int
				for end := time.Now().Add(10 * time.Second); a.Lease().Err == nil && time.Now().Before(end); {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
					if _, err := a.Next(ctx); err == nil {
						minted++
					}
					cancel()
					time.Sleep(time.Millisecond)
				}
				li := a.Lease()
				if li.Err == nil || li.SafeFor > 0 {
					t.Fatalf("A's lease still safe (%+v) 10 s after the code changed owner", li)
				}
				want := map[rangeclienttest.Method]string{rangeclienttest.Renew: "during renewal", rangeclienttest.Allocate: "during block grant"}[during]
				if !strings.Contains(li.Err.Error(), want) {
					t.Fatalf("A stopped with %q, want a fence %s", li.Err, want)
				}
				if li.Err != nil && errors.Is(li.Err, ErrLeaseLost) {
					t.Fatalf("A stopped by its deadline (%v), not by the fenced reply", li.Err)
				}
				before := time.Now()
				_, err := a.Next(expiredCtx())
				if !errors.Is(err, ErrFenced) || !errors.Is(err, segment.ErrFenced) || !IsRetryable(err) {
					t.Fatalf("Next after the fenced reply: %v; want ErrFenced", err)
				}
				if time.Since(before) != 0 {
					t.Fatal("failing Next waited")
				}
				if s := a.Stats(); s.Fenced != 1 {
					t.Fatalf("Stats.Fenced = %d", s.Fenced)
				}
				// The hot path reads a block's stop, not its lease: the
				// blocks A held under the fenced lease were sealed.
				for _, b := range buffered {
					if b == nil || b.lease.seg.Token != codeA.Token {
						continue
					}
					if p, ok := b.take1(a.now()); ok {
						t.Fatalf("a block of the fenced lease still hands out position %d", p)
					}
				}

				// A recovers on another code once one is free for it.
				close(blockAcquire)
				connA.SetHook(nil)
				var id snowflake.ID
				for range 100 {
					time.Sleep(100 * time.Millisecond)
					ctx, cancel := context.WithTimeout(context.Background(), time.Second)
					id, err = a.Next(ctx)
					cancel()
					if err == nil {
						break
					}
				}
				if err != nil {
					t.Fatalf("A did not recover: %v", err)
				}
				if id.Worker() == codeA.Worker {
					t.Fatalf("A minted on code %d, which B owns", id.Worker())
				}
			})
		})
	}
}

// Under mutual TLS the service answers a call on a lease its caller does
// not hold with PermissionDenied, whoever asks (issue 35: no oracle), also
// the client whose lease is gone. On a renewal or a grant that is a fence:
// minting stops at once, before the safety deadline.
func TestPermissionDeniedOnTheLeaseFences(t *testing.T) {
	for _, during := range []rangeclienttest.Method{rangeclienttest.Renew, rangeclienttest.Allocate} {
		t.Run(during.String(), func(t *testing.T) {
			synctest.Test(t, func(t *testing.T) {
				conn := fakeService(10 * time.Second).Conn()
				a := newTestClient(t, conn, func(cfg *Config) {
					cfg.RefillInterval = 5 * time.Second
					if during == rangeclienttest.Allocate {
						cfg.MaxReserve = -1 // a grant comes within a block's life
					}
				})
				mustNext(t, a)
				conn.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
					switch {
					case m == during:
						return fmt.Errorf("test: region 0 worker 0: %w", segment.ErrPermissionDenied)
					case m == rangeclienttest.Renew || m == rangeclienttest.Allocate || m == rangeclienttest.Acquire:
						return fmt.Errorf("test: unreachable: %w", segment.ErrUnavailable)
					}
					return nil
				})
				start := time.Now()
				for a.Lease().Err == nil && time.Since(start) < 10*time.Second {
					ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
					a.Next(ctx)
					cancel()
					time.Sleep(time.Millisecond)
				}
				li := a.Lease()
				if li.Err == nil || !errors.Is(li.Err, ErrFenced) || !errors.Is(li.Err, segment.ErrPermissionDenied) || errors.Is(li.Err, ErrLeaseLost) {
					t.Fatalf("lease after PermissionDenied on %v: %v; want a fence wrapping ErrPermissionDenied, not the deadline", during, li.Err)
				}
				if s := a.Stats(); s.Fenced != 1 {
					t.Fatalf("Stats.Fenced = %d, want 1", s.Fenced)
				}
			})
		})
	}
}

// The stop a buffered block carries for the hot path is min(its validity,
// its lease's deadline) from the moment the block is published, and it
// follows the deadline as renewals move it; without renewals it stays put,
// so minting ends at the deadline.
func TestBlockStopFollowsTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, shortLease)
		check := func(when string) int64 {
			t.Helper()
			synctest.Wait()
			var stop int64
			for _, b := range []*block{c.cur.Load(), c.next.Load()} {
				if b == nil {
					continue
				}
				want := min(b.validUntil, b.lease.deadline.Load())
				if got := b.stop.Load(); got != want {
					t.Fatalf("%s: block stop %v, want min(validity %v, deadline %v)", when,
						time.Duration(got), time.Duration(b.validUntil), time.Duration(b.lease.deadline.Load()))
				}
				stop = max(stop, want)
			}
			return stop
		}
		first := check("after New")
		for range 5 {
			time.Sleep(time.Second)
			mustNext(t, c)
		}
		later := check("after 5 s of renewals")
		if later <= first {
			t.Fatalf("stop did not move with the renewals: %v, then %v", time.Duration(first), time.Duration(later))
		}
		if s := c.Stats(); s.Renewals == 0 {
			t.Fatalf("no renewal in 5 s (%+v)", s)
		}
		// Renewals fail from now on: the stop stays where the last one
		// left it, and Next fails from there.
		conn.SetFault(rangeclienttest.Blackhole)
		last := check("renewals failing")
		time.Sleep(time.Duration(last-c.now()) - time.Millisecond)
		mustNext(t, c)
		time.Sleep(2 * time.Millisecond)
		if _, err := c.Next(expiredCtx()); err == nil {
			t.Fatal("Next minted past the stop its last renewal set")
		}
	})
}

// A renewal whose reply arrives after the safety deadline must not give the
// lease more than (its send time + TTL - margin): here the service accepts
// a renewal that the network delayed past the client's deadline, and no
// later renewal gets through. No ID may be minted under the old lease past
// that send-based bound (a client that counted from the reply would mint
// for another 2 s).
func TestLateRenewalReplyDoesNotStretchTheDeadline(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) {
			shortLease(cfg)
			cfg.RefillInterval = 10 * time.Second   // blocks outlive the test: only the lease stops minting
			cfg.Tuning.RPCTimeout = 5 * time.Second // the delayed renewal is not abandoned by the client
		})
		old := c.Lease().Lease
		var firstSent time.Time
		renewals := 0
		conn.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
			if m != rangeclienttest.Renew {
				return nil
			}
			renewals++
			if renewals == 1 {
				firstSent = time.Now()
				time.Sleep(1500 * time.Millisecond) // reaches the service late, while its lease still lives
				return nil
			}
			<-ctx.Done() // later renewals are lost
			return fmt.Errorf("test: renewal lost: %w", segment.ErrUnavailable)
		})
		type minted struct {
			id snowflake.ID
			at time.Time
		}
		var got []minted
		for end := time.Now().Add(5 * time.Second); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
			if id, err := c.Next(context.Background()); err == nil {
				got = append(got, minted{id, time.Now()})
			}
		}
		if firstSent.IsZero() {
			t.Fatal("no renewal was sent")
		}
		bound := firstSent.Add(3*time.Second - time.Second) // send + TTL - margin
		idx := rangeclienttest.Index(svc.Grants())
		for _, m := range got {
			g, ok := idx.Find(m.id)
			if !ok {
				t.Fatalf("ID %d outside every grant", m.id)
			}
			if g.Token == old.Token && !m.at.Before(bound) {
				t.Fatalf("minted under the old lease %v after send+TTL-margin", m.at.Sub(bound))
			}
		}
	})
}

// A renewal slower than RPCTimeout but well inside the safe interval (an
// overloaded etcd) still renews the lease: the client does not give up a
// code that had seconds to live.
func TestSlowRenewalKeepsTheLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, nil) // RPCTimeout 1 s; safe interval 9 s, renewal every 3 s
		old := c.Lease().Lease
		conn.SetHook(func(ctx context.Context, m rangeclienttest.Method) error {
			if m == rangeclienttest.Renew {
				time.Sleep(1500 * time.Millisecond)
			}
			return nil
		})
		for end := time.Now().Add(30 * time.Second); time.Now().Before(end); time.Sleep(50 * time.Millisecond) {
			if _, err := c.Next(context.Background()); err != nil {
				t.Fatalf("Next at %v: %v", time.Until(end), err)
			}
		}
		st := c.Stats()
		if st.Renewals < 5 || st.RenewalFailures != 0 || st.Expiries != 0 {
			t.Fatalf("renewals %d, failures %d, expiries %d: slow renewals must succeed", st.Renewals, st.RenewalFailures, st.Expiries)
		}
		if c.Lease().Lease.Token != old.Token {
			t.Fatal("the client changed lease although every renewal succeeded")
		}
	})
}

// killLease seals the lease's buffered blocks, current and next, and only
// then kills the lease: the hot path checks a block's stop, which a kill
// does not touch, so a block left unsealed would go on minting.
func TestKillLeaseSealsItsBlocks(t *testing.T) {
	sl := segment.Lease{Region: 1, Worker: 7, Token: 3, TTL: 10 * time.Second}
	l := newLeaseState(sl, 0, time.Second, 3*time.Second)
	other := newLeaseState(segment.Lease{Region: 1, Worker: 8, Token: 4, TTL: 10 * time.Second}, 0, time.Second, 3*time.Second)
	grant := func(lo int64, of *leaseState) *block {
		sb := hourGrant(lo<<seqBits, (lo+5)<<seqBits)
		sb.Worker = of.seg.Worker
		b := newBlock(sb, of, 0, 0)
		b.arm()
		return b
	}
	c := &lane{waitCh: make(chan struct{}), recent: make([]*block, 0, 8)}
	cur, next, foreign := grant(1, l), grant(6, l), grant(1, other)
	c.cur.Store(cur)
	c.next.Store(next)
	for _, b := range []*block{cur, next, foreign} {
		if _, ok := b.take1(0); !ok {
			t.Fatal("setting up: an armed block does not mint")
		}
	}
	if !c.killLease(l, errors.New("test: fenced")) || l.err(0) == nil {
		t.Fatal("killLease did not kill the lease")
	}
	for name, b := range map[string]*block{"current": cur, "next": next} {
		if p, ok := b.take1(0); ok {
			t.Fatalf("the %s block of the killed lease still hands out position %d", name, p)
		}
	}
	if c.cur.Load() != nil || c.next.Load() != nil {
		t.Fatal("the killed lease's blocks are still buffered")
	}
	if _, ok := foreign.take1(0); !ok {
		t.Fatal("a block of another lease was sealed")
	}
}
