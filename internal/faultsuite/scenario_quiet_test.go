package faultsuite

import (
	"fmt"
	"syscall"
	"testing"
	"time"
)

// quietFor is how long TestSharedClientsQuietPastEveryInterval leaves the
// shared clients quiet (scaled in soak mode): past the replicas' minter
// idle timeout (30 s) plus the life of their last blocks (the reserve,
// about the lease TTL), and many lease renewals (every 1 s at TTL 4 s).
const quietFor = 45 * time.Second

// TestSharedClientsQuietPastEveryInterval is issue 32's fault scenario:
// three minters on the shared path (--codes 0) go quiet (SIGUSR1: their
// processes and clients stay up, idle) for longer than every block,
// renewal and idle interval of theirs and of the replicas' minters, while
// a dedicated minter goes on; then they mint again (SIGUSR2). Nothing but
// the shared clients used the replicas' own codes, so the replicas'
// minters saw no demand the whole time. Each shared minter's first call
// after the quiet must succeed (within its 200 ms call deadline), every ID
// within the checker's time bound (under 1 s behind its return), and the
// whole run free of duplicates. Until a carve counted as demand, every
// shared run after about 45 s of quiet was refused until something else
// minted through the replica.
func TestSharedClientsQuietPastEveryInterval(t *testing.T) {
	s := newSuite(t, options{minters: 1, sharedMinters: 3, timeBound: true})
	shared := s.minters[1:]
	s.waitMinting(s.mono0, 2000, time.Minute)
	for _, m := range shared {
		if h := m.progress(); len(h.Leases) != 0 || len(h.Shared) == 0 {
			t.Fatalf("%s: %d leases, %d shared runs; want a shared-path client (no lease)", m.name, len(h.Leases), len(h.Shared))
		}
	}
	q := s.fault("SIGUSR1 the %d shared minters: quiet for %v", len(shared), time.Duration(float64(quietFor)*soakHoldFactor))
	for _, m := range shared {
		m.p.signal(syscall.SIGUSR1)
	}
	s.hold(quietFor)
	r := s.mark("SIGUSR2 the shared minters: minting again")
	for _, m := range shared {
		m.p.signal(syscall.SIGUSR2)
	}
	s.waitMinting(r, 1000, time.Minute, shared...)
	s.hold(2 * time.Second)

	res := s.finish()
	var notes string
	for _, h := range res.hists[1:] {
		// Quiet means quiet: no call between the two signals.
		for _, m := range h.Mints {
			if m.T0 > q+int64(time.Second) && m.T0 < r {
				t.Fatalf("%s minted at %v, during its quiet (%v..%v)", h.Name, s.since(m.T0), s.since(q), s.since(r))
			}
		}
		first, ok := h.FirstMintAfter(r)
		if !ok {
			t.Fatalf("%s minted nothing after the quiet", h.Name)
		}
		for _, f := range h.Failures {
			if f.T0 >= r {
				t.Errorf("%s: a minting call failed %v after the quiet (%s), the first call that succeeded began %v after it",
					h.Name, time.Duration(f.T0-r).Round(time.Millisecond), f.Class, time.Duration(first.T0-r).Round(time.Millisecond))
				break
			}
		}
		took := time.Duration(first.T1 - first.T0)
		if took >= time.Second {
			t.Errorf("%s: its first call after the quiet took %v, want under 1 s", h.Name, took)
		}
		notes += fmt.Sprintf("%s's first call after the quiet took %v; ", h.Name, took.Round(time.Millisecond))
	}
	f := s.figures(res)
	f.notes += notes + fmt.Sprintf("IDs at most %v behind / %v ahead of their return",
		res.rep.MaxBehindSeen.Round(time.Millisecond), res.rep.MaxAheadSeen.Round(time.Millisecond))
	s.publish(f)
}
