package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/faultsuite/faultproxy"
	"github.com/idrange/idrange/internal/faultsuite/history"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Scenario tests. Each starts its own deployment (newSuite), lets the load
// run, injects its faults, then stops the minters and checks every history
// against etcd's record (suite.finish). Waits are on conditions read from
// the histories, bounded; the figures are printed, not asserted: an
// issue's acceptance bound on waits is checked as events in the histories
// (grantWaits, refusedEarly).

// maxStall is the longest time any minter went without a successful call
// between a and b (a gap in its I lines).
func maxStall(hs []*history.History, a, b int64) time.Duration {
	var worst time.Duration
	for _, h := range hs {
		prev := a
		for _, m := range h.Mints {
			if m.T1 < a || m.T0 > b {
				continue
			}
			worst = max(worst, time.Duration(m.T1-prev))
			prev = m.T1
		}
		worst = max(worst, time.Duration(b-prev))
	}
	return worst
}

// TestEtcdMemberKillAndRestart: kill -9 the etcd leader while grants run,
// then bring it back. The two survivors keep a quorum: after an election,
// grants and renewals go on; nothing is duplicated. Also proves on this
// run's real histories that the checker catches a planted duplicate, a
// planted ID handed out 1 ms after its client's safety deadline, and a
// planted late return (a call across that deadline).
func TestEtcdMemberKillAndRestart(t *testing.T) {
	s := newSuite(t, options{refill: 200 * time.Millisecond})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)

	li := s.leader()
	k := s.fault("kill -9 the etcd leader %s", s.members[li].name)
	s.members[li].p.kill()
	s.hold(3 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	q := s.mark("restart %s", s.members[li].name)
	s.members[li].p.start()
	s.members[li].p.waitReady(startTimeout)
	s.waitMinting(q, 1000, time.Minute)
	s.hold(2 * time.Second)

	res := s.finish()
	f := s.figures(res)
	f.notes += fmt.Sprintf("longest stall after the kill %v", maxStall(res.hists, k, q).Round(time.Millisecond))
	s.publish(f)
	checkPlantedFaults(t, s, res)
}

// deadlineSlack is how long before its own safety deadline (as
// ownDeadline estimates it from the history) a default-config client's
// first refused minting call after the quorum loss may start. A client
// that mints from its reserve until the deadline refuses only calls that
// read its clock after the deadline; what separates that reading from the
// history's is two pairs of adjacent clock readings in one process (the
// minter's t0 and the client's reading inside the call; the client's
// reading of a renewal's send time and the recorder's), microseconds
// unless the process is descheduled just there. 100 ms, the issue's
// figure, covers such a stall (68-108 ms ones were seen under a concurrent
// go build). The bound used to be on the start of the last successful
// call, which a stall of the minter anywhere in its last 10 ms sleep
// before the deadline pushed back by the stall's length; a refused call
// that starts late is not early. The pre-reserve client refused from ~1 s
// before the deadline on (it ran out of span).
const deadlineSlack = 100 * time.Millisecond

// retryGap is the longest time between a failed attempt of a call and its
// retry on the next replica: rangeclient retries at once (a few
// microseconds of bookkeeping, more under load), while a new call after a
// failure waits for backoff, at least 25 ms with the default BackoffBase.
const retryGap = 10 * time.Millisecond

// ownDeadline estimates the safety deadline a client computed for its
// lease token from the calls that had returned by t, for liveness checks.
// It is history's DeadlineBound (the checker's upper bound), except that a
// call that succeeded on a retry is dated from the first attempt of its
// chain: rangeclient reads the send time once, then retries at once on the
// next replica when one fails (each failed attempt is an X line that
// returned just before the next was sent), so its deadline may be earlier
// than the bound by the failed attempts' duration.
func ownDeadline(h *history.History, token, t int64) (int64, bool) {
	first := func(method string, tok, send int64) int64 {
		for again := true; again; {
			again = false
			for _, x := range h.Failed {
				if x.Method == method && x.Token == tok && x.Send < send && x.Ret <= send && send-x.Ret <= int64(retryGap) {
					send, again = x.Send, true
				}
			}
		}
		return send
	}
	var dl int64
	ok := false
	for _, l := range h.Leases {
		if l.Token == token && l.Ret <= t {
			dl, ok = first("acquire", 0, l.Send)+int64(l.TTL)-int64(h.Margin), true
		}
	}
	for _, r := range h.Renewals {
		if ok && r.Token == token && r.Ret <= t {
			dl = max(dl, first("renew", token, r.Send)+int64(r.TTL)-int64(h.Margin))
		}
	}
	return dl, ok
}

// gap is one client's longest interruption between handed-out IDs.
type gap struct {
	d    time.Duration
	name string
	at   int64         // when the call ending it returned
	call time.Duration // how long that call took
}

func (g gap) String() string {
	return fmt.Sprintf("%v (%s; the call ending it took %v)", g.d.Round(100*time.Microsecond), g.name, g.call.Round(100*time.Microsecond))
}

// longestWait is the longest time, over every history, a minter waited for
// IDs, counting calls that returned IDs in [a, b]: from the start of the
// first call (refused or not) after a successful one to the return of the
// next successful one. The minter's sleep before that first call is its
// pacing and not the client's doing, so it is left out; a call blocked on
// the client counts whole, and so do refused calls and the pauses after
// them.
func longestWait(hs []*history.History, a, b int64) gap {
	var worst gap
	for _, h := range hs {
		fi := 0
		prev := int64(-1)
		for _, m := range h.Mints {
			from := m.T0
			for fi < len(h.Failures) && h.Failures[fi].T0 < m.T0 {
				if h.Failures[fi].T0 > prev {
					from = min(from, h.Failures[fi].T0)
				}
				fi++
			}
			if m.T1 >= a && m.T1 <= b && prev >= 0 {
				if d := time.Duration(m.T1 - from); d > worst.d {
					worst = gap{d: d, name: h.Name, at: m.T1, call: time.Duration(m.T1 - m.T0)}
				}
			}
			prev = m.T1
		}
	}
	return worst
}

// longestGap is the longest gap, over every history, between successive
// successful minting calls that returned in [a, b]: the time between their
// returns (when the caller held the IDs) minus the pacing the minter
// sleeps between calls. Unlike longestWait it includes the minter being
// late (scheduling noise).
func longestGap(hs []*history.History, pacing time.Duration, a, b int64) gap {
	var worst gap
	for _, h := range hs {
		prev := int64(-1)
		for _, m := range h.Mints {
			if m.T1 < a || m.T1 > b {
				continue
			}
			if prev >= 0 {
				if d := time.Duration(m.T1-prev) - pacing; d > worst.d {
					worst = gap{d: d, name: h.Name, at: m.T1, call: time.Duration(m.T1 - m.T0)}
				}
			}
			prev = m.T1
		}
	}
	return worst
}

// grantWaits returns h's successful minting calls that handed out an ID
// from a block whose grant returned after the call began: the caller
// waited for a grant. A client whose reserve carries an outage never does
// (Next mints from buffered blocks, and refills run in the background), so
// this is an event check, free of scheduling noise, for what a wall-clock
// bound on the caller's wait measured before. An ID in no block of h is
// the checker's business (history.Check), not counted here.
func grantWaits(h *history.History) []history.Mint {
	type code struct{ region, worker int }
	blocks := map[code][]history.Block{}
	for _, b := range h.Blocks {
		k := code{b.Region, b.Worker}
		blocks[k] = append(blocks[k], b)
	}
	for _, bs := range blocks {
		sort.Slice(bs, func(i, j int) bool { return bs[i].Lo < bs[j].Lo })
	}
	var waited []history.Mint
	for _, m := range h.Mints {
		for _, v := range m.IDs {
			id := snowflake.ID(v)
			bs, l := blocks[code{id.Region(), id.Worker()}], segment.Linear(id)
			i := sort.Search(len(bs), func(i int) bool { return bs[i].Hi > l })
			if i < len(bs) && bs[i].Lo <= l && bs[i].Ret > m.T0 {
				waited = append(waited, m)
				break
			}
		}
	}
	return waited
}

// refusedEarly returns h's first failed minting call that started after
// k, and whether it started more than deadlineSlack before dl.
func refusedEarly(h *history.History, k, dl int64) (history.MintFailure, bool) {
	for _, f := range h.Failures {
		if f.T0 > k {
			return f, dl-f.T0 > int64(deadlineSlack)
		}
	}
	return history.MintFailure{}, false
}

// waitNewLeader waits until a member other than old leads the cluster and
// returns its index.
func (s *suite) waitNewLeader(old int, timeout time.Duration) int {
	s.t.Helper()
	leader := -1
	waitFor(s.t, timeout, "a new etcd leader", func() bool {
		for i, m := range s.members {
			if i == old {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			st, err := s.cli.Status(ctx, m.clientAddr())
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				leader = i
				return true
			}
		}
		return false
	})
	return leader
}

// TestEtcdLeaderKillDefaultClientsRideThrough: issue 9's acceptance for a
// routine etcd leader election. Clients on rangeclient's defaults mint at a
// steady rate; kill -9 the etcd leader, keep it down past the election,
// restart it. An election is far shorter than the safe interval, so each
// client's reserve of granted span carries it: during the whole run no
// minting call fails (each has cmd/minter's --call-timeout, 200 ms: a
// stalled call fails) and no call hands out IDs from a block that arrived
// after it began (grantWaits: no caller waits for a grant). How long
// callers waited is a figure, not a bound: a 50 ms bound failed correct
// clients when a concurrent build starved the box (a 108 ms paced gap was
// seen); the pre-reserve client made callers wait 0.46-1.5 s around the
// election, which fails both checks. A planted grant wait on this run's
// histories must be caught.
//
// The replicas run with the service's default lease TTL (10 s), not the
// suite's 4 s: with this suite's raft timing an election takes 2-4 s
// (election timeout 2 s, randomised up to twice that; 1.9-3.0 s
// measured from the kill to a new leader), while a 4 s lease
// renewed every second is safe for only 2-3 s after the kill, so no
// client could ride through. The default TTL is what a user runs.
func TestEtcdLeaderKillDefaultClientsRideThrough(t *testing.T) {
	// Two of the clients on the shared path (issue 32), every ID held to
	// the time bound.
	s := newSuite(t, options{clientDefaults: true, leaseTTL: store.DefaultLeaseTTL, sharedMinters: 2, timeBound: true})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)

	li := s.leader()
	k := s.fault("kill -9 the etcd leader %s", s.members[li].name)
	s.members[li].p.kill()
	nl := s.waitNewLeader(li, time.Minute)
	e := s.mark("%s leads", s.members[nl].name)
	s.hold(2 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	q := s.mark("restart %s", s.members[li].name)
	s.members[li].p.start()
	s.members[li].p.waitReady(startTimeout)
	s.waitMinting(q, 1000, time.Minute)
	s.hold(2 * time.Second)

	res := s.finish()
	pacing := s.opt.pacing()
	wait := longestWait(res.hists, 0, 1<<62)
	// The paced gaps, and the waits before the kill and from the restart
	// on (the rejoining member catching up loads the box), show the
	// scheduling noise.
	paced := longestGap(res.hists, pacing, 0, 1<<62)
	before, after := longestWait(res.hists, 0, k), longestWait(res.hists, q, 1<<62)
	failed := 0
	for _, h := range res.hists {
		failed += len(h.Failures)
		if n := len(h.Failures); n > 0 {
			fl := h.Failures[0]
			t.Errorf("%s: %d failed minting call(s), the first at %v (%v after the kill): %s", h.Name, n,
				s.since(fl.T0), time.Duration(fl.T0-k).Round(time.Millisecond), fl.Class)
		}
	}
	for _, h := range res.hists {
		if ws := grantWaits(h); len(ws) > 0 {
			m := ws[0]
			t.Errorf("%s: %d minting call(s) waited for a grant: the first began %v after the kill and took %v",
				h.Name, len(ws), time.Duration(m.T0-k).Round(time.Millisecond), time.Duration(m.T1-m.T0).Round(time.Millisecond))
		}
	}
	checkPlantedGrantWait(t, res.hists)
	f := s.figures(res)
	f.notes += fmt.Sprintf("election %v; failed Next calls %d; longest wait for IDs %v, %v after the kill "+
		"(before the kill %v; from the restart on %v); longest gap between IDs beyond the %v pacing %v, %v after the kill",
		time.Duration(e-k).Round(time.Millisecond), failed, wait, time.Duration(wait.at-k).Round(time.Millisecond),
		before, after, pacing, paced, time.Duration(paced.at-k).Round(time.Millisecond))
	s.publish(f)
}

// checkPlantedGrantWait plants, into a copy of a real history, a call that
// began 1 ms before a block's grant returned and handed out that block's
// first ID: grantWaits must report exactly it.
func checkPlantedGrantWait(t *testing.T, hs []*history.History) {
	t.Helper()
	for _, h := range hs {
		if len(h.Blocks) < 2 {
			continue
		}
		b := h.Blocks[len(h.Blocks)-1]
		c := *h
		id := segment.Block{Region: b.Region, Worker: b.Worker}.ID(b.Lo)
		m := history.Mint{T0: b.Ret - ms, T1: b.Ret + ms, IDs: []int64{int64(id)}}
		c.Mints = append(append([]history.Mint(nil), h.Mints...), m)
		if ws, was := grantWaits(&c), len(grantWaits(h)); len(ws) != was+1 || ws[len(ws)-1].T0 != m.T0 {
			t.Fatalf("planted grant wait in %s not caught: %d waits reported, %d before planting", h.Name, len(ws), was)
		}
		t.Logf("planted grant wait caught (%s)", h.Name)
		return
	}
	t.Fatal("no history with two blocks to plant a grant wait in")
}

// checkPlantedFaults plants a duplicate, separately an ID handed out 1 ms
// after the latest possible safety deadline, and separately one whose call
// started 1 ms before that deadline and returned 1 ms after it, into copies
// of real histories: the checker must fail on each, with the matching
// sentinel.
func checkPlantedFaults(t *testing.T, s *suite, res result) {
	t.Helper()
	if len(res.hists) < 2 {
		t.Fatal("need two histories to plant a duplicate")
	}
	cfg := s.checkConfig(res.hwm)
	copyWith := func(h *history.History, m history.Mint) *history.History {
		c := *h
		c.Mints = append(append([]history.Mint(nil), h.Mints...), m)
		return &c
	}
	others := func(i int, h *history.History) []*history.History {
		hs := append([]*history.History(nil), res.hists...)
		hs[i] = h
		return hs
	}

	// 1. A duplicate: m0 hands out an ID m1 handed out.
	h0, h1 := res.hists[0], res.hists[1]
	dup := h1.Mints[len(h1.Mints)/2].IDs[0]
	last, _ := h0.LastMint()
	rep, err := history.Check(others(0, copyWith(h0, history.Mint{T0: last.T1, T1: last.T1 + 1, IDs: []int64{dup}})), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rep.Err(), history.ErrDuplicate) || rep.Duplicates != 1 {
		t.Fatalf("planted duplicate %d not caught: duplicates=%d err=%v", dup, rep.Duplicates, rep.Err())
	}
	t.Logf("planted duplicate caught: %v", rep.Err())

	// 2. After the deadline: the next position of m0's last ID, in the same
	// block, handed out by a call that started 1 ms after the latest
	// deadline m0 could have known for that lease (its last renewal's send
	// + TTL - margin). 3. A late return: the position after that, by a call
	// that started 1 ms before that deadline and returned 1 ms after it.
	// Nothing shows it was minted before the deadline: the checker dates it
	// by its return.
	id := snowflake.ID(last.IDs[len(last.IDs)-1])
	var lease history.Lease
	for _, l := range h0.Leases {
		if l.Worker == id.Worker() && l.Ret <= last.T1 {
			lease = l
		}
	}
	bound := lease.Send + int64(lease.TTL) - int64(h0.Margin)
	for _, r := range h0.Renewals {
		if r.Token == lease.Token {
			bound = max(bound, r.Send+int64(r.TTL)-int64(h0.Margin))
		}
	}
	for i, tc := range []struct {
		name   string
		t0, t1 int64
	}{
		{"after-deadline ID", bound + ms, bound + 2*ms},
		{"late return", bound - ms, bound + ms},
	} {
		next := int64(segment.Block{Region: id.Region(), Worker: id.Worker()}.ID(segment.Linear(id) + int64(i) + 1))
		rep, err = history.Check(others(0, copyWith(h0, history.Mint{T0: tc.t0, T1: tc.t1, IDs: []int64{next}})), cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(rep.Err(), history.ErrAfterDeadline) || rep.AfterDeadline != 1 || rep.Duplicates != 0 {
			t.Fatalf("planted %s not caught: after_deadline=%d duplicates=%d err=%v", tc.name, rep.AfterDeadline, rep.Duplicates, rep.Err())
		}
		t.Logf("planted %s caught: %v", tc.name, rep.Err())
	}
}

// failing reports whether the minter's latest minting call failed: it is
// refusing right now.
func failing(h *history.History) bool {
	if len(h.Failures) == 0 {
		return false
	}
	f := h.Failures[len(h.Failures)-1]
	m, ok := h.LastMint()
	return !ok || f.T0 > m.T1
}

// waitAllFailClosed waits until every minter refuses to mint.
func (s *suite) waitAllFailClosed(timeout time.Duration) {
	s.t.Helper()
	for _, m := range s.minters {
		waitFor(s.t, timeout, m.name+" fails closed", func() bool { return failing(m.progress()) })
	}
}

// checkOutage asserts what docs/design.md requires of an isolated lease service:
// every client that held a usable lease and block when the fault hit at k
// went on minting from its buffers, every client failed closed before the
// repair at q, and minted again after q without being restarted. It fills
// in the figures.
func (s *suite) checkOutage(res result, k, q int64, f *figures) {
	s.t.Helper()
	ran := 0
	for i, h := range res.hists {
		if h.MintedWithin(k, q) > 0 {
			ran++
		} else if h.CouldMintAt(k, 500*time.Millisecond) {
			s.t.Errorf("%s held a lease and a block valid past the fault but handed out nothing: it should run on its buffers inside its safe interval", h.Name)
		}
		if h.PID != s.minters[i].p.pid() {
			s.t.Errorf("%s was restarted (pid %d, history says %d)", h.Name, s.minters[i].p.pid(), h.PID)
		}
	}
	ranOn, failClosed, recovered, closedAll, recoveredAll := outage(res.hists, k, q)
	if !closedAll {
		s.t.Error("a client did not fail closed during the outage")
	}
	if !recoveredAll {
		s.t.Error("a client did not recover after the repair")
	}
	f.ranOn, f.failClosed, f.recovered = ranOn, failClosed, recovered
	f.notes += fmt.Sprintf("%d/%d clients ran on their buffers after the fault. ", ran, len(res.hists))
}

// TestEtcdQuorumLossFailsClosedAndRecovers: kill -9 two of the three etcd
// members, with clients on rangeclient's defaults. Grants and renewals
// stop; each client goes on from its reserve until its own safety
// deadline (issue 9): its first refused call did not start before the
// deadline (less deadlineSlack for clock readings), then it fails closed.
// Restart the two: the same client processes recover by themselves. A
// refusal planted 1 ms before the slack must be caught.
func TestEtcdQuorumLossFailsClosedAndRecovers(t *testing.T) {
	s := newSuite(t, options{clientDefaults: true})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)

	li := s.leader()
	a, b := s.members[li], s.members[(li+1)%3]
	k := s.fault("kill -9 etcd members %s (leader) and %s: quorum lost", a.name, b.name)
	a.p.kill()
	b.p.kill()
	s.waitAllFailClosed(time.Minute)
	s.hold(2 * time.Second)
	// The quorum stays lost for longer than the TTL.
	if left := time.Duration(k + int64(s.opt.leaseTTL+time.Second) - history.Now()); left > 0 {
		time.Sleep(left)
	}
	q := s.mark("restart %s and %s", a.name, b.name)
	a.p.start()
	b.p.start()
	a.p.waitReady(startTimeout)
	b.p.waitReady(startTimeout)
	s.waitMinting(q, 1000, time.Minute)
	s.hold(time.Second)

	res := s.finish()
	// Grants and renewals stop: without a quorum nothing commits, so no
	// block or renewal sent after the kill can have come back before the
	// restart.
	for _, h := range res.hists {
		for _, b := range h.Blocks {
			if b.Send > k && b.Ret < q {
				t.Errorf("%s received block [%d,%d) during the quorum loss", h.Name, b.Lo, b.Hi)
			}
		}
		for _, r := range h.Renewals {
			if r.Send > k && r.Ret < q {
				t.Errorf("%s renewed token %d during the quorum loss", h.Name, r.Token)
			}
		}
	}
	f := s.figures(res)
	s.checkOutage(res, k, q, &f)
	var early []string
	planted := false
	for _, h := range res.hists {
		before, ok := h.LeaseAt(k)
		if !ok {
			t.Errorf("%s held no lease when the quorum was lost", h.Name)
			continue
		}
		dl, _ := ownDeadline(h, before.Token, q)
		if bound, _ := h.DeadlineBound(before.Token, q); bound != dl {
			s.logf("%s: a renewal succeeded on a retry; its deadline is dated from the first attempt, %v before the checker's bound",
				h.Name, time.Duration(bound-dl).Round(time.Millisecond))
		}
		last, ok := h.LastMintBefore(q)
		if !ok {
			t.Errorf("%s handed out nothing before the restart", h.Name)
			continue
		}
		early = append(early, fmt.Sprintf("%s %v", h.Name, time.Duration(dl-last.T0).Round(time.Millisecond)))
		if r, tooSoon := refusedEarly(h, k, dl); tooSoon {
			t.Errorf("%s refused a minting call (%s) that started %v before its safety deadline "+
				"(%v after the kill, deadline %v after it); want none before the deadline (less %v): it should mint from its reserve until then",
				h.Name, r.Class, time.Duration(dl-r.T0).Round(time.Millisecond), time.Duration(r.T0-k).Round(time.Millisecond),
				time.Duration(dl-k).Round(time.Millisecond), deadlineSlack)
		} else if !planted {
			// The control: a copy of h with a refusal 1 ms before the
			// slack must fail the same check (on a client that passed it).
			c := *h
			p := history.MintFailure{T0: dl - int64(deadlineSlack) - ms, T1: dl - int64(deadlineSlack), Class: "planted"}
			c.Failures = append(append([]history.MintFailure(nil), h.Failures...), p)
			sort.Slice(c.Failures, func(i, j int) bool { return c.Failures[i].T0 < c.Failures[j].T0 })
			if r, tooSoon := refusedEarly(&c, k, dl); !tooSoon || r.Class != "planted" {
				t.Fatalf("planted early refusal in %s not caught: first refusal %+v", h.Name, r)
			}
			planted = true
			t.Logf("planted early refusal caught (%s)", h.Name)
		}
	}
	f.notes += fmt.Sprintf("last ID before each client's safety deadline: %s. ", strings.Join(early, ", "))
	s.publish(f)
}

// TestRangesvcReplicaKillMidGrants: with small blocks (a grant every few
// tens of ms per client), kill -9 one rangesvc replica, let the other serve,
// restart it on the same address, then kill the other so the restarted one
// must serve alone.
func TestRangesvcReplicaKillMidGrants(t *testing.T) {
	// Two clients on the shared path too (issue 32): each kill takes the
	// code their runs are carved from.
	s := newSuite(t, options{refill: 50 * time.Millisecond, sharedMinters: 2, timeBound: true})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)

	r0, r1 := s.replicas[0], s.replicas[1]
	k := s.fault("kill -9 %s mid-grants", r0.name)
	r0.p.kill()
	s.hold(2 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	s.mark("restart %s on %s", r0.name, r0.addr())
	r0.p.start()
	r0.p.waitReady(startTimeout)
	s.hold(2 * time.Second)
	k2 := s.fault("kill -9 %s: the restarted %s serves alone", r1.name, r0.name)
	r1.p.kill()
	s.hold(2 * time.Second)
	s.waitMinting(k2, 1000, time.Minute)
	s.mark("restart %s", r1.name)
	r1.p.start()
	r1.p.waitReady(startTimeout)
	s.hold(time.Second)

	res := s.finish()
	f := s.figures(res)
	f.notes += fmt.Sprintf("longest stall after a kill %v", max(maxStall(res.hists, k, k+int64(2*time.Second)),
		maxStall(res.hists, k2, k2+int64(2*time.Second))).Round(time.Millisecond))
	s.publish(f)
}

// holdFreeCodes leases, from the test process, every worker code of the
// region nobody holds (with a long TTL, through store.Store like any
// replica), so the next code to become free is the one the test frees. It
// returns the leases for release.
func (s *suite) holdFreeCodes() []segment.Lease {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var (
		mu    sync.Mutex
		held  []segment.Lease
		wg    sync.WaitGroup
		fatal error
	)
	for range 4 {
		wg.Go(func() {
			for ctx.Err() == nil {
				l, err := s.store.Acquire(ctx, region, "faultsuite-filler")
				mu.Lock()
				if err == nil {
					held = append(held, l)
				}
				mu.Unlock()
				if errors.Is(err, segment.ErrNoFreeCode) {
					return
				}
				if err != nil {
					mu.Lock()
					fatal = err
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if fatal != nil {
		s.t.Fatalf("holding the free codes: %v", fatal)
	}
	// Concurrent acquirers can give up while a code is still free.
	for {
		n, err := s.store.FreeCodes(ctx, region)
		if err != nil {
			s.t.Fatal(err)
		}
		if n == 0 {
			break
		}
		l, err := s.store.Acquire(ctx, region, "faultsuite-filler")
		if err != nil {
			s.t.Fatalf("holding the last %d free codes: %v", n, err)
		}
		held = append(held, l)
	}
	return held
}

func (s *suite) release(ls []segment.Lease) {
	s.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, l := range ls {
		if err := s.store.Release(ctx, l); err != nil {
			s.t.Fatalf("release test-held code %d: %v", l.Worker, err)
		}
	}
}

// TestClientPausedPastLeaseIsFenced: SIGSTOP a client past its lease TTL;
// etcd expires its lease and its code goes to a new client process; SIGCONT
// the stale one: it hands out nothing more on that code (its safety
// deadline passed while it was stopped, decided locally with no network
// call), and resumes on a fresh code once one is free.
func TestClientPausedPastLeaseIsFenced(t *testing.T) {
	s := newSuite(t, options{minters: 2})
	s.waitMinting(s.mono0, 2000, time.Minute)
	stale := s.minters[0]
	w, tok := stale.currentCode()
	fillers := s.holdFreeCodes()
	s.logf("test holds %d free codes; %s owns code %d (token %d)", len(fillers), stale.name, w, tok)

	k := s.fault("SIGSTOP %s (code %d) past its lease TTL", stale.name, w)
	stale.p.pause()
	lk := s.keys.LeaseKey(region, w)
	waitFor(t, time.Minute, fmt.Sprintf("etcd expires %s's lease", stale.name), func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		r, err := s.cli.Get(ctx, lk, clientv3.WithCountOnly())
		return err == nil && r.Count == 0
	})
	expired := s.mark("etcd expired %s's lease %v after SIGSTOP", stale.name, s.since(history.Now())-s.since(k))
	owner := s.addMinter()
	if nw, ntok := owner.currentCode(); nw != w || ntok <= tok {
		t.Fatalf("new owner %s got code %d token %d; want code %d with a token above %d", owner.name, nw, ntok, w, tok)
	}
	s.waitMinting(expired, 1000, time.Minute, owner)

	c := s.fault("SIGCONT %s", stale.name)
	stale.p.resume()
	waitFor(t, time.Minute, stale.name+" refuses after SIGCONT", func() bool {
		_, ok := stale.progress().FirstFailureAfter(c)
		return ok
	})
	s.hold(time.Second)
	r := s.mark("release the %d test-held codes", len(fillers))
	s.release(fillers)
	s.waitMinting(r, 1000, time.Minute, stale)
	s.hold(time.Second)

	res := s.finish()
	h := res.hists[0]
	for _, m := range h.Mints {
		if m.T0 < c {
			continue
		}
		for _, v := range m.IDs {
			if snowflake.ID(v).Worker() == w && m.T0 < r {
				t.Errorf("stale %s handed out %d on its old code %d after SIGCONT", h.Name, v, w)
			}
		}
	}
	fl, _ := h.FirstFailureAfter(c)
	if fl.Class != "lease_lost" && fl.Class != "fenced" {
		t.Errorf("stale client's first refusal after SIGCONT was %q, want lease_lost or fenced", fl.Class)
	}
	f := s.figures(res)
	f.failClosed = time.Duration(fl.T1 - c)
	if m, ok := h.FirstMintAfter(r); ok {
		f.recovered = time.Duration(m.T1 - r)
	}
	f.notes += fmt.Sprintf("lease expired in etcd %v after SIGSTOP; stale client's first refusal: %s", time.Duration(expired-k).Round(time.Millisecond), fl.Class)
	s.publish(f)
}

// idLead is the largest amount by which an ID's timestamp ran ahead of the
// true wall time at which it was handed out.
func idLead(hs []*history.History) time.Duration {
	var lead time.Duration
	for _, h := range hs {
		for _, m := range h.Mints {
			wallMs := time.Duration(h.Wall + (m.T0 - h.Start)).Milliseconds()
			for _, v := range m.IDs {
				ms := snowflake.MsTime(snowflake.ID(v).Ms()).UnixMilli()
				lead = max(lead, time.Duration(ms-wallMs)*time.Millisecond)
			}
		}
	}
	return lead
}

// TestServiceClockJumps: a replica's service clock jumps back 2 s, then
// forward 10 s; the other follows it forward; then both jump back 10 s to
// the true time. Grants start at max(HWM, now), so nothing is reissued; the
// forward jump shows as IDs dated in the future (bounded by the service's
// max lead), never as duplicates.
//
// Every ID is held to the time bound of its return (timeBound), widened by
// the jumps: at most 1 s + 2 s behind, at most the lead + 10 s ahead; and
// IDs dated in the future must appear (the jump took effect).
func TestServiceClockJumps(t *testing.T) {
	const back, ahead = 2 * time.Second, 10 * time.Second
	s := newSuite(t, options{refill: 100 * time.Millisecond, timeBound: true, clockBack: back, clockAhead: ahead})
	s.waitMinting(s.mono0, 2000, time.Minute)
	r0, r1 := s.replicas[0], s.replicas[1]

	k := s.fault("%s's clock jumps back 2 s", r0.name)
	r0.setClock(-back)
	s.hold(3 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	k = s.fault("%s's clock jumps forward 10 s (to +10 s)", r0.name)
	r0.setClock(ahead)
	s.hold(3 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	k = s.fault("%s's clock jumps forward 10 s too", r1.name)
	r1.setClock(ahead)
	s.hold(2 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	k = s.fault("both clocks jump back 10 s, to the true time")
	r0.setClock(0)
	r1.setClock(0)
	s.hold(3 * time.Second)
	s.waitMinting(k, 1000, time.Minute)

	res := s.finish() // the checker holds every ID to the widened time bound
	lead := idLead(res.hists)
	if lead < ahead/2 {
		t.Errorf("IDs dated at most %v ahead of true time after a %v forward jump: the jump did not reach the IDs", lead, ahead)
	}
	f := s.figures(res)
	f.notes += fmt.Sprintf("IDs dated up to %v ahead of true time (bound %v)", lead.Round(time.Millisecond), segment.DefaultMaxLead+ahead)
	s.publish(f)
}

// TestReplicaEtcdPartition: cut one replica off etcd (its proxies drop
// every byte, connections stay open: a partition), then the other one too,
// so the lease service is isolated; then heal both.
//
// Progress while only one replica is cut off is required by
// TestOneReplicaCutOffStarvesNoClient; here it is reported as a figure
// (stall, starved clients) and safety is checked throughout.
func TestReplicaEtcdPartition(t *testing.T) {
	s := newSuite(t, options{refill: 200 * time.Millisecond})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)
	r0, r1 := s.replicas[0], s.replicas[1]

	k1 := s.fault("blackhole %s <-> etcd", r0.name)
	r0.eachProxy((*faultproxy.Proxy).Blackhole)
	s.hold(3 * time.Second)
	k := s.fault("blackhole %s <-> etcd too: the lease service is isolated", r1.name)
	r1.eachProxy((*faultproxy.Proxy).Blackhole)
	s.waitAllFailClosed(time.Minute)
	s.hold(time.Second)
	q := s.mark("heal both partitions")
	r0.eachProxy((*faultproxy.Proxy).Heal)
	r1.eachProxy((*faultproxy.Proxy).Heal)
	s.waitMinting(q, 1000, time.Minute)
	s.hold(time.Second)

	res := s.finish()
	f := s.figures(res)
	s.checkOutage(res, k, q, &f)
	starved := 0
	for _, h := range res.hists {
		if h.MintedWithin(k1+int64(time.Second), k) == 0 {
			starved++
		}
	}
	f.notes += fmt.Sprintf("with one replica cut off: longest client stall %v, %d/%d clients starved throughout",
		maxStall(res.hists, k1+int64(time.Second), k).Round(time.Millisecond), starved, len(res.hists))
	s.publish(f)
}

// calls lists up to n of h's service calls sent in [a, b), for diagnosis.
func (s *suite) calls(h *history.History, a, b int64, n int) string {
	type call struct {
		send int64
		text string
	}
	var cs []call
	add := func(send, ret int64, format string, args ...any) {
		if send >= a && send < b {
			cs = append(cs, call{send, fmt.Sprintf("  sent %v took %v: ", s.since(send), time.Duration(ret-send).Round(time.Millisecond)) + fmt.Sprintf(format, args...)})
		}
	}
	for _, r := range h.Renewals {
		add(r.Send, r.Ret, "renew ok")
	}
	for _, bl := range h.Blocks {
		add(bl.Send, bl.Ret, "allocate ok [%d,%d)", bl.Lo, bl.Hi)
	}
	for _, x := range h.Failed {
		add(x.Send, x.Ret, "%s failed: %s", x.Method, x.Reason)
	}
	sort.Slice(cs, func(i, j int) bool { return cs[i].send < cs[j].send })
	var out []string
	for i, c := range cs {
		if i == n {
			out = append(out, fmt.Sprintf("  ... %d more", len(cs)-n))
			break
		}
		out = append(out, c.text)
	}
	return strings.Join(out, "\n")
}

// TestOneReplicaCutOffStarvesNoClient: with one of two replicas cut off
// from etcd for several seconds, every client must keep minting through
// the other one.
//
// It found rangeclient starving clients: every RPC round-robined over both
// replicas with no health checking, renewals and refills alternating at the
// same period, so all refills of a client landed on the cut-off replica
// (timing out) while all its renewals succeeded on the healthy one: the
// lease stayed alive and the client minted nothing while the cut lasted.
func TestOneReplicaCutOffStarvesNoClient(t *testing.T) {
	s := newSuite(t, options{minters: 5, refill: 200 * time.Millisecond})
	s.waitMinting(s.mono0, 2000, time.Minute)
	k := s.fault("blackhole %s <-> etcd", s.replicas[0].name)
	s.replicas[0].eachProxy((*faultproxy.Proxy).Blackhole)
	s.hold(8 * time.Second)
	q := s.mark("heal")
	s.replicas[0].eachProxy((*faultproxy.Proxy).Heal)
	s.waitMinting(q, 1000, time.Minute)

	res := s.finish()
	for _, h := range res.hists {
		if n := h.MintedWithin(k+int64(2*time.Second), q); n == 0 {
			t.Errorf("%s minted nothing from 2 s after the cut until the heal (%v) although the other replica served; its calls:\n%s",
				h.Name, time.Duration(q-k-int64(2*time.Second)).Round(time.Millisecond), s.calls(h, k, q, 12))
		}
	}
	f := s.figures(res)
	f.notes += fmt.Sprintf("longest client stall during the cut %v", maxStall(res.hists, k, q).Round(time.Millisecond))
	s.publish(f)
}

// TestSlowEtcd: etcd becomes slow for both replicas: first 100 ms each way,
// then 300 ms each way (a grant's commit then outlasts the client's wait
// for it, so some grants commit after the client gave up: burned, never
// used), then fast again. In the slow phase every client has allocations
// fail and mints from what it holds, and etcd holds steps that nobody
// received (on the clients' codes or the replicas' own).
//
// A grant reads the code, then commits: two round trips to etcd. A grant
// burns when the client's wait (its 1 s RPC timeout) ends after the
// commit was sent (2 x delay) and before its answer (4 x delay): delay in
// 250..500 ms. At 600 ms the client often gave up before the commit was
// sent (no burned grant in one of two runs); at 400 ms the read left the
// commit 200 ms of room, which a loaded machine took (none in one full
// suite run); 300 ms leaves it 400 ms. The replicas run with a 2 s max
// lead, so that the clients' reserve is short and they ask for blocks
// throughout the slow phase: with the default 15 s a client started at the
// restart floor held span for the whole scenario and asked for nothing.
func TestSlowEtcd(t *testing.T) {
	// Default 1 s blocks; short blocks under latency are
	// TestSlowEtcdShortBlocksStillMint.
	s := newSuite(t, options{maxLead: 2 * time.Second})
	s.waitMinting(s.mono0, 2000, time.Minute)
	s.hold(time.Second)
	delay := func(d time.Duration) {
		for _, r := range s.replicas {
			r.eachProxy(func(p *faultproxy.Proxy) { p.SetDelay(d) })
		}
	}
	k := s.fault("etcd 100 ms slower each way")
	delay(100 * time.Millisecond)
	s.hold(3 * time.Second)
	s.waitMinting(k, 1000, time.Minute)
	k2 := s.fault("etcd 300 ms slower each way")
	delay(300 * time.Millisecond)
	s.hold(4 * time.Second)
	q := s.mark("latency removed")
	delay(0)
	s.waitMinting(q, 1000, time.Minute)
	s.hold(2 * time.Second)

	res := s.finish()
	// At +300 ms grants commit after their caller gave up: etcd's record
	// holds steps that nobody received (burned grants), on the clients'
	// codes or on the replicas' own minters' (which no history records;
	// which of the two a burn hits is a matter of timing, so the count is
	// of both), and every client saw allocations fail in that phase;
	// meanwhile each client kept minting from what it held.
	if res.rep.BurnedGrants == 0 {
		t.Errorf("no burned grant: every grant asked for at +300 ms reached its caller, although grants took longer than the clients' timeout")
	}
	for _, h := range res.hists {
		timedOut := 0
		for _, x := range h.Failed {
			if x.Method == "allocate" && x.Send >= k2 && x.Send < q {
				timedOut++
			}
		}
		if timedOut == 0 {
			t.Errorf("%s: no allocation failed at +300 ms; its calls:\n%s", h.Name, s.calls(h, k2, q, 8))
		}
		if h.MintedBetween(k2, q) == 0 {
			t.Errorf("%s minted nothing at +300 ms, although it held span when the latency rose; its calls:\n%s", h.Name, s.calls(h, k2, q, 8))
		}
	}
	f := s.figures(res)
	_, _, f.recovered, _, _ = outage(res.hists, k2, q)
	f.notes += fmt.Sprintf("longest stall at +100 ms %v, at +300 ms %v; %d grants burned on the clients' codes", maxStall(res.hists, k, k2).Round(time.Millisecond),
		maxStall(res.hists, k2, q).Round(time.Millisecond), res.rep.BurnedLeasedGrants)
	s.publish(f)
}

// TestCorruptEtcdValuesStopTheCode: overwrite the high-water mark of one
// client's code with a value that does not decode: grants on that code stop
// (the client fails closed once its buffer ends), the store never rewrites
// or resets the key, other codes carry on; an operator's repair (restoring
// exactly the value that was replaced) lets the same client resume. Then
// corrupt another client's lease record (kept on its etcd lease): renewals
// and grants refuse, the client stops on that code, and moves to a fresh
// code when its lease is gone; the code's HWM is never reset.
func TestCorruptEtcdValuesStopTheCode(t *testing.T) {
	s := newSuite(t, options{refill: 100 * time.Millisecond})
	s.waitMinting(s.mono0, 2000, time.Minute)
	victim, other := s.minters[0], s.minters[1]
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()

	// Phase 1: corrupt HWM.
	w, _ := victim.currentCode()
	hk := s.keys.HighWaterKey(region, w)
	const bad = "v1:not-a-number"
	s.corruptOK = map[string]bool{bad: true}
	var good []byte
	var badRev int64
	for attempt := 0; badRev == 0; attempt++ {
		if attempt == 100 {
			t.Fatal("could not swap the HWM value in 100 attempts")
		}
		cur, err := s.cli.Get(ctx, hk)
		if err != nil || len(cur.Kvs) == 0 {
			t.Fatalf("read %s: %v (%d keys)", hk, err, len(cur.Kvs))
		}
		// Swap atomically, so the repair restores exactly the value the
		// last grant committed.
		r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(hk), "=", cur.Kvs[0].ModRevision)).
			Then(clientv3.OpPut(hk, bad)).Commit()
		if err != nil {
			t.Fatal(err)
		}
		if r.Succeeded {
			good, badRev = cur.Kvs[0].Value, r.Header.Revision
		}
	}
	k := s.fault("overwrite the HWM of %s's code %d (%q) with %q", victim.name, w, good, bad)
	waitFor(t, time.Minute, victim.name+" fails closed", func() bool { return failing(victim.progress()) })
	s.hold(1500 * time.Millisecond)
	cur, err := s.cli.Get(ctx, hk)
	if err != nil {
		t.Fatal(err)
	}
	if len(cur.Kvs) != 1 || string(cur.Kvs[0].Value) != bad || cur.Kvs[0].ModRevision != badRev {
		t.Fatalf("the corrupt HWM was rewritten: %v", cur.Kvs)
	}
	s.waitMinting(k, 1000, time.Minute, s.minters[1:]...)
	q := s.mark("operator restores the HWM of code %d", w)
	r, err := s.cli.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(hk), "=", badRev)).Then(clientv3.OpPut(hk, string(good))).Commit()
	if err != nil || !r.Succeeded {
		t.Fatalf("repair: %v (succeeded %v)", err, r != nil && r.Succeeded)
	}
	s.waitMinting(q, 1000, time.Minute, victim)
	vh := victim.progress()
	fl, _ := vh.FirstFailureAfter(k)
	rm, _ := vh.FirstMintAfter(q)

	// Phase 2: corrupt lease record.
	w2, tok2 := other.currentCode()
	hk2, lk2 := s.keys.HighWaterKey(region, w2), s.keys.LeaseKey(region, w2)
	before, err := s.cli.Get(ctx, hk2)
	if err != nil || len(before.Kvs) != 1 {
		t.Fatalf("read %s: %v", hk2, err)
	}
	hwmBefore, err := store.DecodeHighWater(before.Kvs[0].Value)
	if err != nil {
		t.Fatal(err)
	}
	r, err = s.cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(lk2), "=", tok2)).
		Then(clientv3.OpPut(lk2, `{"v":1,"region":1,"worker":999}`, clientv3.WithIgnoreLease())).Commit()
	if err != nil || !r.Succeeded {
		t.Fatalf("corrupt %s: %v", lk2, err)
	}
	k2 := s.fault("overwrite the lease record of %s's code %d with an out-of-range record", other.name, w2)
	// Renewals now fail: the client stops minting on the code by its
	// deadline (the checker asserts nothing after it) and takes a fresh
	// code by itself. Its callers may see no failure at all: Next waits
	// for the new lease within their context.
	waitFor(t, time.Minute, other.name+" moves to a fresh code", func() bool {
		nw, ntok := other.currentCode()
		return ntok != tok2 && other.progress().MintedBetween(k2, 1<<62) > 0 && (nw != w2 || ntok > tok2)
	})
	s.hold(time.Second)
	after, err := s.cli.Get(ctx, hk2)
	if err != nil || len(after.Kvs) != 1 {
		t.Fatalf("read %s: %v", hk2, err)
	}
	if v, err := store.DecodeHighWater(after.Kvs[0].Value); err != nil || v < hwmBefore {
		t.Fatalf("HWM of code %d went from %d to %d (%v)", w2, hwmBefore, v, err)
	}

	res := s.finish()
	f := s.figures(res)
	f.failClosed = time.Duration(fl.T1 - k)
	f.recovered = time.Duration(rm.T1 - q)
	oh := res.hists[1]
	var lastOld, firstNew int64 // last ID on the corrupted code, first on another, after k2
	for _, m := range oh.Mints {
		if m.T0 < k2 {
			continue
		}
		for _, v := range m.IDs {
			if snowflake.ID(v).Worker() == w2 {
				lastOld = max(lastOld, m.T1)
			} else if firstNew == 0 {
				firstNew = m.T1
			}
		}
	}
	f.notes += fmt.Sprintf("corrupt HWM: fail closed %v, recover after repair %v; corrupt lease record: stopped on the code after %v, on a fresh code after %v",
		f.failClosed.Round(time.Millisecond), f.recovered.Round(time.Millisecond),
		time.Duration(max(lastOld-k2, 0)).Round(time.Millisecond), time.Duration(firstNew-k2).Round(time.Millisecond))
	s.publish(f)
}

// TestReplicasStoppedClientsFailClosed: the lease service is isolated by
// SIGSTOPping both replicas, so renewals and refills hang until their
// timeout instead of failing fast. Every client must stop by its safety
// deadline (the checker measures it on the host's monotonic clock) while
// its refill loop sits in a hanging call, and recover once the replicas
// resume.
//
// It began as a client clock rollback just before the deadline, which
// found rangeclient compensating a backward clock only in its refill loop
// (stuck in a hanging Allocate here): the client handed out IDs up to
// ~0.9 s past its deadline (margin 1 s). The client now reads only Go's
// monotonic clock, so a clock step cannot reach it; the hanging-service
// half of the scenario stays.
func TestReplicasStoppedClientsFailClosed(t *testing.T) {
	s := newSuite(t, options{minters: 2})
	s.waitMinting(s.mono0, 2000, time.Minute)
	m := s.minters[1]

	k := s.fault("SIGSTOP both replicas: the lease service is isolated")
	for _, r := range s.replicas {
		r.p.pause()
	}
	s.waitAllFailClosed(time.Minute)
	s.hold(time.Second)
	q := s.mark("SIGCONT both replicas")
	for _, r := range s.replicas {
		r.p.resume()
	}
	s.waitMinting(q, 1000, time.Minute)

	res := s.finish()
	f := s.figures(res)
	s.checkOutage(res, k, q, &f)
	// Every client stopped by its safety deadline: the latest one its
	// records allow for the lease it held at the SIGSTOP, from the renewals
	// whose replies came back before the SIGCONT (one in flight at the stop
	// returns only after it), read from the whole history after the run.
	for i, h := range res.hists {
		l, held := h.LeaseAt(k)
		last, minted := h.LastMintBefore(q)
		if !held || !minted {
			t.Errorf("%s: lease at the SIGSTOP %v, an ID before the SIGCONT %v; want both", h.Name, held, minted)
			continue
		}
		bound, _ := h.DeadlineBound(l.Token, q)
		if last.T1 > bound {
			t.Errorf("%s handed out its last ID before the SIGCONT %v after its safety deadline", h.Name,
				time.Duration(last.T1-bound).Round(time.Millisecond))
		}
		if i == 1 {
			f.notes += fmt.Sprintf("%s's last ID before the repair was handed out %v before its deadline. ", m.name,
				time.Duration(bound-last.T0).Round(time.Millisecond))
		}
	}
	s.publish(f)
}

// TestSlowEtcdShortBlocksStillMint: clients configured with 100 ms blocks
// while etcd is 100 ms slower each way must still mint.
//
// It found rangeclient sizing blocks by rate only: a block is valid for its
// span measured from the request's send, so once a refill took longer than
// RefillInterval every block arrived expired and the client minted nothing
// although every grant succeeded.
func TestSlowEtcdShortBlocksStillMint(t *testing.T) {
	s := newSuite(t, options{refill: 100 * time.Millisecond})
	s.waitMinting(s.mono0, 2000, time.Minute)
	k := s.fault("etcd 100 ms slower each way, clients use 100 ms blocks")
	for _, r := range s.replicas {
		r.eachProxy(func(p *faultproxy.Proxy) { p.SetDelay(100 * time.Millisecond) })
	}
	s.hold(6 * time.Second)
	q := s.mark("latency removed")
	for _, r := range s.replicas {
		r.eachProxy(func(p *faultproxy.Proxy) { p.SetDelay(0) })
	}
	s.waitMinting(q, 1000, time.Minute)
	res := s.finish()
	for _, h := range res.hists {
		if h.MintedWithin(k+int64(time.Second), q) == 0 {
			t.Errorf("%s minted nothing while etcd was 100 ms slower; its calls:\n%s", h.Name, s.calls(h, k+int64(time.Second), q, 8))
		}
	}
	s.publish(s.figures(res))
}
