package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/faultsuite/history"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// TestSharedPathClientsPauseReplicaAndLeaderKill is issue 27's fault
// scenario: three minters with --codes 0 at 4,000 IDs/s (far below
// rangeclient.DedicatedRate, so they stay on the shared path and hold no
// code), one minter with a code of its own, and a caller of MintBatch on
// both replicas, whose minters' codes the shared runs are carved from.
// Then: (a) SIGSTOP one shared minter past every bound (the lease TTL and
// its runs' validity) and SIGCONT it; (b) kill -9 the replica the shared
// minters use, and restart it; (c) kill -9 the etcd leader, and restart
// it. The check (suite.finish) holds every ID of every minter and reply in
// one duplicate check, every ID to the time bound (less than 1 s behind,
// at most the service's max lead ahead of the moment its call returned),
// the dedicated minter to every lease rule and the shared minters' IDs to
// the runs they received, which must lie inside committed HWM steps and
// never overlap. Planted controls: a shared ID repeated by another shared
// minter, by the dedicated minter and in a MintBatch reply, and a shared
// minter's last call re-dated 2 s later, must each fail the run.
func TestSharedPathClientsPauseReplicaAndLeaderKill(t *testing.T) {
	s := newSuite(t, options{minters: 1, sharedMinters: 3, timeBound: true})
	dedicated, shared := s.minters[0], s.minters[1:]
	replies := startMintBatchCaller(t, s)
	defer replies.stop()
	s.waitMinting(s.mono0, 2000, time.Minute)
	waitFor(t, time.Minute, "the MintBatch caller gets 10 replies", func() bool { return replies.ok() >= 10 })
	for _, m := range shared {
		if h := m.progress(); len(h.Leases) != 0 || len(h.Shared) == 0 {
			t.Fatalf("%s: %d leases, %d shared runs; want a shared-path client (no lease)", m.name, len(h.Leases), len(h.Shared))
		}
	}

	// (a) A shared minter stopped past the lease TTL and every run's
	// validity: when it resumes, every run it holds has expired.
	paused := shared[0]
	pause := s.opt.leaseTTL + 2*time.Second
	k1 := s.fault("SIGSTOP %s (shared path) for %v, past the lease TTL %v and the runs' validity", paused.name, pause, s.opt.leaseTTL)
	paused.p.pause()
	time.Sleep(pause)
	c1 := s.mark("SIGCONT %s", paused.name)
	paused.p.resume()
	s.waitMinting(c1, 1000, time.Minute)

	// (b) The replica whose minter's code carved the latest shared run:
	// its shared clients move to the other.
	r0, code := s.replicas[0], -1
	if w, i, ok := latestSharedReplica(shared, replies.codes()); ok {
		r0, code = s.replicas[i], w
	} else {
		t.Fatalf("no shared run on a code the replicas' MintBatch replies showed (codes %v)", replies.codes())
	}
	var moved []*minter // the shared minters whose latest run was on that code
	for _, m := range shared {
		if rs := m.progress().Shared; len(rs) > 0 && rs[len(rs)-1].Worker == code {
			moved = append(moved, m)
		}
	}
	k2 := s.fault("kill -9 %s (its minter's code %d carved the latest shared run, of %d minters)", r0.name, code, len(moved))
	r0.p.kill()
	s.waitMinting(k2, 1000, time.Minute)
	for _, m := range moved {
		waitFor(t, time.Minute, m.name+" gets a shared run from the other replica", func() bool {
			for _, r := range m.progress().Shared {
				if r.Ret > k2 && r.Worker != code {
					return true
				}
			}
			return false
		})
	}
	q2 := s.mark("restart %s", r0.name)
	r0.p.start()
	r0.p.waitReady(startTimeout)
	s.hold(time.Second)

	// (c) The etcd leader.
	li := s.leader()
	k3 := s.fault("kill -9 the etcd leader %s", s.members[li].name)
	s.members[li].p.kill()
	s.waitNewLeader(li, time.Minute)
	s.waitMinting(k3, 1000, time.Minute)
	q := s.mark("restart %s", s.members[li].name)
	s.members[li].p.start()
	s.members[li].p.waitReady(startTimeout)
	s.waitMinting(q, 1000, time.Minute)
	waitFor(t, time.Minute, "the MintBatch caller gets replies again", func() bool { return replies.okAfter(q) >= 5 })
	replies.stop()
	s.replies = replies.collect()

	res := s.finish()
	// The checker saw every ID: each history's, split into shared and
	// dedicated exactly as the minters were started, and every reply's.
	var all, sharedIDs, runs int64
	for i, h := range res.hists {
		all += h.IDs()
		if i == 0 {
			continue
		}
		if len(h.Leases) != 0 {
			t.Errorf("%s took a code (%d leases) at %d IDs/s: the scenario means it to stay on the shared path", h.Name, len(h.Leases), s.opt.rate)
		}
		sharedIDs += h.IDs()
		runs += int64(len(h.Shared))
	}
	var replyIDs int64
	for _, r := range s.replies {
		replyIDs += int64(len(r.IDs))
	}
	switch {
	case res.rep.IDs != all || res.rep.SharedIDs != sharedIDs || res.rep.SharedRuns != int(runs):
		t.Fatalf("the checker saw %d IDs (%d shared, %d runs); the histories hold %d (%d shared, %d runs)",
			res.rep.IDs, res.rep.SharedIDs, res.rep.SharedRuns, all, sharedIDs, runs)
	case res.rep.ReplyIDs != replyIDs || replyIDs == 0:
		t.Fatalf("the checker saw %d reply IDs; the caller received %d", res.rep.ReplyIDs, replyIDs)
	case len(res.hists[0].Leases) == 0:
		t.Fatalf("%s (dedicated) held no lease", dedicated.name)
	}
	h := res.hists[1]
	resumed, _ := h.FirstMintAfter(c1)
	// Everything the paused minter handed out after SIGCONT came from runs
	// granted after it: every run it held had expired while it was stopped.
	stale := 0
	for _, m := range h.Mints {
		if m.T1 <= c1 {
			continue
		}
		for _, v := range m.IDs {
			if !inRunAfter(h, v, c1) {
				stale++
			}
		}
	}
	if stale > 0 {
		t.Errorf("%s handed out %d IDs after SIGCONT from runs granted before its pause", h.Name, stale)
	}
	// Which replica codes the shared runs came from, around the replica
	// kill: the clients moved to the other replica's code.
	codes := func(a, b int64) []int {
		set := map[int]bool{}
		for _, h := range res.hists[1:] {
			for _, r := range h.Shared {
				if r.Ret >= a && r.Ret < b {
					set[r.Worker] = true
				}
			}
		}
		return keys(set)
	}
	before, during := codes(0, k2), codes(k2, q2)
	checkPlantedShared(t, s, res)

	f := s.figures(res)
	f.recovered = time.Duration(resumed.T1 - c1)
	f.notes += fmt.Sprintf("%d shared IDs in %d runs over %d shared minters, %d dedicated IDs, %d reply IDs; "+
		"%s paused %v (first IDs %v after SIGCONT); IDs at most %v behind / %v ahead of their return; "+
		"shared-run codes before the replica kill %v, while it was down %v, after %v; faults at +%v, +%v, +%v",
		sharedIDs, runs, len(shared), res.hists[0].IDs(), replyIDs, paused.name, pause,
		time.Duration(resumed.T1-c1).Round(time.Millisecond), res.rep.MaxBehindSeen.Round(time.Millisecond),
		res.rep.MaxAheadSeen.Round(time.Millisecond), before, during, codes(q2, 1<<62), s.since(k1), s.since(k2), s.since(k3))
	s.publish(f)
}

// checkPlantedShared plants, into copies of the run's records, a shared
// ID of one shared minter into another's history, into the dedicated
// minter's and into a MintBatch reply (each must fail with ErrDuplicate),
// and re-dates a shared minter's last call 2 s later (ErrTimeBound).
func checkPlantedShared(t *testing.T, s *suite, res result) {
	t.Helper()
	src := res.hists[1]
	if len(src.Mints) == 0 || len(s.replies) == 0 {
		t.Fatal("nothing to plant")
	}
	id := src.Mints[len(src.Mints)/2].IDs[0]
	with := func(i int, h *history.History) []*history.History {
		hs := append([]*history.History(nil), res.hists...)
		hs[i] = h
		return hs
	}
	appended := func(h *history.History, ids []int64) *history.History {
		c := *h
		last, _ := h.LastMint()
		c.Mints = append(append([]history.Mint(nil), h.Mints...), history.Mint{T0: last.T1, T1: last.T1 + 1, IDs: ids})
		return &c
	}
	check := func(name string, hs []*history.History, cfg history.Config, want error) {
		t.Helper()
		rep, err := history.Check(hs, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !errors.Is(rep.Err(), want) {
			t.Fatalf("planted %s not caught: %v\n%s", name, rep.Err(), rep.Summary())
		}
		t.Logf("planted %s caught: %v", name, rep.Err())
	}
	cfg := s.checkConfig(res.hwm)
	check("shared ID in another shared minter", with(2, appended(res.hists[2], []int64{id})), cfg, history.ErrDuplicate)
	check("shared ID in the dedicated minter", with(0, appended(res.hists[0], []int64{id})), cfg, history.ErrDuplicate)

	rcfg := cfg
	rcfg.Replies = append([]history.Reply(nil), s.replies...)
	r := rcfg.Replies[len(rcfg.Replies)/2]
	r.IDs = append(append([]int64(nil), r.IDs[1:]...), id)
	rcfg.Replies[len(rcfg.Replies)/2] = r
	check("shared ID in a MintBatch reply", res.hists, rcfg, history.ErrDuplicate)

	// Later by 2 s more than IDs ran ahead of their return: a replica's
	// codes start at its restart floor, up to the max lead ahead of the
	// clock, so 2 s alone may leave the IDs within 1 s of the return.
	late := *src
	late.Mints = append([]history.Mint(nil), src.Mints...)
	m := late.Mints[len(late.Mints)-1]
	shift := int64(2*time.Second + res.rep.MaxAheadSeen)
	m.T0, m.T1 = m.T0+shift, m.T1+shift
	late.Mints[len(late.Mints)-1] = m
	check("shared minter's last call returned 2 s after the IDs' lead", with(1, &late), cfg, history.ErrTimeBound)
}

// inRunAfter reports whether ID v lies in a shared run h received after t.
func inRunAfter(h *history.History, v, t int64) bool {
	id := snowflake.ID(v)
	l := segment.Linear(id)
	for _, r := range h.Shared {
		if r.Ret > t && r.Worker == id.Worker() && r.Lo <= l && l < r.Hi {
			return true
		}
	}
	return false
}

// latestSharedReplica finds the replica (index) whose minter's code
// (codes: worker code -> replica, from its MintBatch replies) carved the
// latest shared run any of ms received.
func latestSharedReplica(ms []*minter, codes map[int]int) (worker, replica int, ok bool) {
	var at int64 = -1
	for _, m := range ms {
		for _, r := range m.progress().Shared {
			if i, known := codes[r.Worker]; known && r.Ret > at {
				at, worker, replica, ok = r.Ret, r.Worker, i, true
			}
		}
	}
	return worker, replica, ok
}

// mintBatchCaller calls MintBatch(100) every 50 ms, alternating between
// the replicas, so the replicas' own minters hand out IDs from the codes
// the shared runs are carved from; its successful replies join the check.
type mintBatchCaller struct {
	s      *suite
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	calls  []replyCall
	once   sync.Once
}

func startMintBatchCaller(t *testing.T, s *suite) *mintBatchCaller {
	t.Helper()
	var rpcs []idrangev1.RangeServiceClient
	for _, r := range s.replicas {
		cc, err := grpc.NewClient(r.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		rpcs = append(rpcs, idrangev1.NewRangeServiceClient(cc))
	}
	ctx, cancel := context.WithCancel(context.Background())
	c := &mintBatchCaller{s: s, cancel: cancel}
	c.wg.Go(func() {
		tick := time.NewTicker(50 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			ri := i % len(rpcs)
			cctx, ccancel := context.WithTimeout(ctx, replyTimeout)
			call := replyCall{source: s.replicas[ri].name + " MintBatch", path: "MintBatch", send: history.Now()}
			p, err := rpcs[ri].MintBatch(cctx, &idrangev1.MintBatchRequest{Count: 100})
			ccancel()
			call.ret, call.ids, call.err = history.Now(), ids64(p.GetIds()), err
			if ctx.Err() != nil {
				return
			}
			c.mu.Lock()
			c.calls = append(c.calls, call)
			c.mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	return c
}

func (c *mintBatchCaller) stop() { c.once.Do(func() { c.cancel(); c.wg.Wait() }) }

func (c *mintBatchCaller) ok() int { return c.okAfter(0) }

// codes maps the worker codes of the successful replies so far to the
// replica (index) that minted them: each replica's own minter's code.
func (c *mintBatchCaller) codes() map[int]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[int]int{}
	for _, call := range c.calls {
		if call.err != nil || len(call.ids) == 0 {
			continue
		}
		for i, r := range c.s.replicas {
			if call.source == r.name+" MintBatch" {
				out[call.ids[0].Worker()] = i
			}
		}
	}
	return out
}

// okAfter counts successful calls sent after t.
func (c *mintBatchCaller) okAfter(t int64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, call := range c.calls {
		if call.err == nil && call.send > t {
			n++
		}
	}
	return n
}

// collect returns the successful calls as replies for the checker (call
// stop first).
func (c *mintBatchCaller) collect() []history.Reply {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []history.Reply
	for _, call := range c.calls {
		if call.err == nil && len(call.ids) > 0 {
			out = append(out, history.Reply{Source: call.source, Send: call.send, Ret: call.ret, IDs: int64s(call.ids)})
		}
	}
	return out
}
