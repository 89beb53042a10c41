package storetest

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// testHighWaterRegressed: an operator lowers a code's high-water mark
// behind the Store's back (to the start of the last block it granted, the
// issue's duplicate), then deletes it. Each time the next grant on the code
// is refused with ErrHighWaterRegressed (also ErrCorrupt) in one line naming
// the code, the key, the Store's floor and the stored value; the Observer
// hears of it once; the key is left as the operator wrote it; Acquire and
// FreeCodes skip the code; lifting the mark back to the floor makes the
// code grantable again, above every block granted before.
func testHighWaterRegressed(t *testing.T, be Backend) {
	const region, code = 0, 5
	obs := &Counter{}
	st := NewStore(t, be.Storage(t), store.Config{Observer: obs, FirstCode: func(int) int { return code }})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, region, "victim")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire = %+v, %v; want code %d", l, err, code)
	}
	var granted []segment.Block
	for range 3 {
		b, err := st.Allocate(ctx, l, 4096)
		if err != nil {
			t.Fatal(err)
		}
		granted = append(granted, b)
	}
	floor := granted[len(granted)-1].Hi
	hk := be.HighWaterKey(region, code)
	refused := func(what string, stored int64, want ...string) {
		t.Helper()
		b, err := st.Allocate(ctx, l, 4096)
		if !errors.Is(err, segment.ErrHighWaterRegressed) || !errors.Is(err, segment.ErrCorrupt) || b != (segment.Block{}) {
			t.Fatalf("Allocate after %s = %+v, %v; want no block and ErrHighWaterRegressed (and ErrCorrupt)", what, b, err)
		}
		msg := err.Error()
		want = append(want, fmt.Sprintf("worker %d", code), fmt.Sprint(floor), fmt.Sprint(stored))
		for _, w := range want {
			if !strings.Contains(msg, w) || strings.Contains(msg, "\n") {
				t.Fatalf("refusal after %s %q does not say %q on one line", what, msg, w)
			}
		}
		if _, err := st.HighWater(ctx, region, code); !errors.Is(err, segment.ErrHighWaterRegressed) {
			t.Fatalf("HighWater after %s: %v, want ErrHighWaterRegressed", what, err)
		}
	}

	lowered := granted[len(granted)-1].Lo
	be.Put(t, hk, []byte(store.EncodeHighWater(lowered)), 0)
	refused("lowering the mark", lowered, hk)
	refused("a second try", lowered, hk)
	if n := obs.NRegressed.Load(); n != 1 {
		t.Fatalf("observer heard of %d regressions, want 1 (once per regressed code, not per call)", n)
	}
	if v, ok := be.Get(t, hk); !ok || string(v) != store.EncodeHighWater(lowered) {
		t.Fatalf("HWM key now %q (present %v); the Store must not rewrite it", v, ok)
	}

	// Acquire skips the code: with l released, it would be the first tried.
	if err := st.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	if free, err := st.FreeCodes(ctx, region); err != nil || free != 255 {
		t.Fatalf("FreeCodes = %d, %v; want 255 (the regressed code is unusable)", free, err)
	}
	other, err := st.Acquire(ctx, region, "other")
	if err != nil || other.Worker == code {
		t.Fatalf("Acquire with code %d regressed = %+v, %v; want another code", code, other, err)
	}
	snap, err := st.Snapshot(ctx, region)
	if err != nil || !errors.Is(snap.Corrupt[code], segment.ErrHighWaterRegressed) || snap.Free != 254 {
		t.Fatalf("Snapshot: code %d error %v, %d free, %v; want ErrHighWaterRegressed and 254 free", code, snap.Corrupt[code], snap.Free, err)
	}

	// Lifted back to the floor (what a restore fence does, and more): usable.
	be.Put(t, hk, []byte(store.EncodeHighWater(floor)), 0)
	l, err = st.Acquire(ctx, region, "victim again")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire after the lift = %+v, %v; want code %d", l, err, code)
	}
	b, err := st.Allocate(ctx, l, 4096)
	if err != nil || b.Lo < floor {
		t.Fatalf("Allocate after the lift = %+v, %v; want a block at or above %d", b, err, floor)
	}
	granted = append(granted, b)
	CheckDisjoint(t, granted)
	if n := obs.NRecovered.Load(); n != 1 {
		t.Fatalf("observer heard of %d recoveries, want 1", n)
	}

	// A deleted mark reads as 0: below the floor too.
	floor = b.Hi
	be.Delete(t, hk)
	refused("deleting the mark", 0, "deleted")
	if n := obs.NRegressed.Load(); n != 2 {
		t.Fatalf("observer heard of %d regressions, want 2", n)
	}
}

// testFailedCommitFloor: a commit whose outcome is unknown does not raise
// the Store's floor. When it was not applied, the stored mark is still the
// last known one and the next grant goes on from it (a floor raised to the
// lost block's end would stop a healthy code); when it was applied, the
// next read raises the floor to it, so lowering the mark below the burned
// range is caught.
func testFailedCommitFloor(t *testing.T, be Backend) {
	obs := &Counter{}
	failing := &lostReply{Storage: be.Storage(t), lostRequest: true}
	st := NewStore(t, failing, store.Config{Observer: obs})
	ctx := Ctx(t)
	l, err := st.Acquire(ctx, 0, "unlucky")
	if err != nil {
		t.Fatal(err)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatal(err)
	}
	failing.armed.Store(true)
	if _, err := st.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Allocate over a failed commit: %v, want ErrUnavailable", err)
	}
	b2, err := st.Allocate(ctx, l, 4096)
	if err != nil || b2.Lo < b1.Hi {
		t.Fatalf("Allocate after a commit that was not applied = %+v, %v; want a block from %d", b2, err, b1.Hi)
	}
	if n := obs.NRegressed.Load(); n != 0 {
		t.Fatalf("observer heard of %d regressions after a commit that was not applied", n)
	}

	// Applied but unknown (lostReply): the burned range is above b2; the
	// next read raises the floor to it.
	lost := &lostReply{Storage: be.Storage(t)}
	st2 := NewStore(t, lost, store.Config{Observer: obs})
	if _, err := st2.Allocate(ctx, l, 4096); err != nil {
		t.Fatal(err)
	}
	lost.armed.Store(true)
	if _, err := st2.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrUnavailable) {
		t.Fatalf("Allocate with a lost reply: %v, want ErrUnavailable", err)
	}
	burned, err := st2.HighWater(ctx, 0, l.Worker)
	if err != nil {
		t.Fatal(err)
	}
	be.Put(t, be.HighWaterKey(0, l.Worker), []byte(store.EncodeHighWater(burned-1)), 0)
	if _, err := st2.Allocate(ctx, l, 4096); !errors.Is(err, segment.ErrHighWaterRegressed) {
		t.Fatalf("Allocate after lowering into the burned range: %v, want ErrHighWaterRegressed", err)
	}
}

// testNoFalseRegression: reads of a code's mark that race with grants on
// it, in the same Store and in another replica (Allocate, HighWater,
// FreeCodes, Snapshot, all at once), never count as a regression: a read
// is judged only against what the Store knew when it was sent.
func testNoFalseRegression(t *testing.T, be Backend) {
	obs := &Counter{}
	stores := []*store.Store{
		NewStore(t, be.Storage(t), store.Config{Observer: obs}),
		NewStore(t, be.Storage(t), store.Config{Observer: obs}),
	}
	ctx := Ctx(t)
	const region, codes, grants = 3, 4, 30
	leases := make([]segment.Lease, codes)
	for i := range leases {
		l, err := stores[0].Acquire(ctx, region, fmt.Sprintf("code-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		leases[i] = l
	}
	var (
		wg      sync.WaitGroup
		granted atomic.Int64
		stop    = make(chan struct{})
		errs    = make(chan error, 4*codes+4)
	)
	for i := range 2 * codes { // grants: two callers per code, one per replica
		wg.Go(func() {
			st, l := stores[i%2], leases[i/2]
			for range grants {
				if _, err := st.Allocate(ctx, l, 4096); err != nil {
					errs <- err
					return
				}
				granted.Add(1)
			}
		})
	}
	var readers sync.WaitGroup
	for i := range 4 { // reads on both replicas until the grants end
		readers.Go(func() {
			st := stores[i%2]
			for n := 0; ; n++ {
				select {
				case <-stop:
					return
				default:
				}
				var err error
				switch n % 3 {
				case 0:
					_, err = st.HighWater(ctx, region, leases[n%codes].Worker)
				case 1:
					_, err = st.FreeCodes(ctx, region)
				default:
					var snap store.RegionSnapshot
					if snap, err = st.Snapshot(ctx, region); err == nil && len(snap.Corrupt) > 0 {
						err = errors.Newf("snapshot reports %d stopped codes", len(snap.Corrupt))
					}
				}
				if err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := obs.NRegressed.Load(); n != 0 {
		t.Fatalf("observer heard of %d regressions of marks that only grew", n)
	}
	t.Logf("%d grants raced with reads on two replicas; no regression reported", granted.Load())
}

// testRestartFloor (issue 35): a replica that restarts after its code's
// mark was lowered behind its back (by hand, while it was down) grants
// nothing that overlaps a block it or another replica granted before: with
// RestartFloor the new Store's first grant starts at or above every earlier
// block's end (the clock at start + MaxLead + MaxClockSkew), whatever the
// stored mark says, and until the clock lets that block fit within the
// lead the grant is backpressure, not a block ahead of the lead.
func testRestartFloor(t *testing.T, be Backend) {
	const region, code, lead, skew = 2, 9, 2 * time.Second, 300 * time.Millisecond
	var nowNs atomic.Int64
	nowNs.Store(time.Date(2027, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	clock := func() time.Time { return time.Unix(0, nowNs.Load()) }
	advance := func(d time.Duration) { nowNs.Add(int64(d)) }
	cfg := store.Config{Now: clock, FirstCode: func(int) int { return code }, RestartFloor: true, MaxClockSkew: skew,
		Policy: segment.Policy{MaxLead: lead}}
	ctx := Ctx(t)

	// The first life: blocks that run up to the lead ahead of the clock,
	// as a client holding a reserve has them.
	first := NewStore(t, be.Storage(t), cfg)
	advance(lead + skew + time.Second) // past the first Store's own floor
	l, err := first.Acquire(ctx, region, "victim")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire = %+v, %v; want code %d", l, err, code)
	}
	var granted []segment.Block
	for range 3 { // 1.8 s of span from now: up to the lead
		b, err := first.Allocate(ctx, l, 600*segment.PerMs)
		if err != nil {
			t.Fatal(err)
		}
		granted = append(granted, b)
	}
	end := granted[len(granted)-1].Hi
	if end <= segment.PerMs*snowflake.MsSince(clock()) {
		t.Fatalf("the blocks end at %d, not ahead of the clock: the test would prove nothing", end)
	}

	// The replica stops; the mark is lowered to the start of its first
	// block; the replica restarts 100 ms later.
	be.Put(t, be.HighWaterKey(region, code), []byte(store.EncodeHighWater(granted[0].Lo)), 0)
	advance(100 * time.Millisecond)
	restarted := NewStore(t, be.Storage(t), cfg)
	var b segment.Block
	var waited time.Duration
	for tries := 0; ; tries++ {
		b, err = restarted.Allocate(ctx, l, 1000*segment.PerMs)
		var bp *segment.Backpressure
		if !errors.As(err, &bp) || tries == 100 {
			break
		}
		if b.Lo != 0 {
			t.Fatalf("a block with backpressure: %+v", b)
		}
		advance(bp.RetryAfter)
		waited += bp.RetryAfter
	}
	if err != nil {
		t.Fatalf("the restarted replica's grant: %v", err)
	}
	// The price: about the skew, plus a tenth of the request's 1 s span.
	if waited > skew+120*time.Millisecond {
		t.Fatalf("the restarted replica's first grant waited %v of backpressure, want about the skew %v", waited, skew)
	}
	// The code is now at the lead; until the clock reaches the floor, the
	// next grant waits only for a tenth of the request, not three quarters.
	next, nextWait := b, time.Duration(0)
	for tries := 0; tries < 100; tries++ {
		next, err = restarted.Allocate(ctx, l, 1000*segment.PerMs)
		var bp *segment.Backpressure
		if !errors.As(err, &bp) {
			break
		}
		advance(bp.RetryAfter)
		nextWait += bp.RetryAfter
	}
	if err != nil || nextWait > 120*time.Millisecond {
		t.Fatalf("the next grant at the lead after the restart: %v after %v of backpressure; want it within a tenth of the request", err, nextWait)
	}
	CheckDisjoint(t, append(slices.Clone(granted), b, next))
	if lead := time.Duration(b.Hi>>12-snowflake.MsSince(clock())) * time.Millisecond; lead > cfg.Policy.MaxLead {
		t.Fatalf("the block [%d,%d) runs %v ahead of the clock, more than the lead %v", b.Lo, b.Hi, lead, cfg.Policy.MaxLead)
	}

	// Without the floor the same restart grants over the first life's
	// blocks: what the floor is for.
	be.Put(t, be.HighWaterKey(region, code), []byte(store.EncodeHighWater(granted[0].Lo)), 0)
	cfg.RestartFloor = false
	bare := NewStore(t, be.Storage(t), cfg)
	if b, err := bare.Allocate(ctx, l, 1000*segment.PerMs); err != nil || b.Lo >= end {
		t.Fatalf("without the floor: %+v, %v; want a block below %d (the test's control)", b, err, end)
	}
}

// testWatchSeesALowering (issue 35): replica B never grants on a code; A
// raises its mark and an operator lowers it again at once, long before any
// scan of B's would read it. B watches the marks, so it reports the
// regression (once), refuses the code from then on, and lifts the refusal
// when a mark at or above what it saw is written. A deleted mark is a
// regression too. Control: a Store that does not watch notices nothing.
func testWatchSeesALowering(t *testing.T, be Backend) {
	const region, code = 3, 77
	ctx := Ctx(t)
	a := NewStore(t, be.Storage(t), store.Config{FirstCode: func(int) int { return code }})
	obs := &Counter{}
	stg := be.Storage(t)
	w, ok := stg.(store.HighWaterWatcher)
	if !ok {
		t.Fatalf("%T cannot watch its high-water marks", stg)
	}
	b := NewStore(t, stg, store.Config{Observer: obs})
	blind := NewStore(t, be.Storage(t), store.Config{})
	wctx, cancel := context.WithCancel(ctx)
	watched := make(chan error, 1)
	sw := &startedWatcher{HighWaterWatcher: w, started: make(chan struct{})}
	go func() { watched <- b.WatchHighWaters(wctx, region, sw) }()
	// B runs from before A's grants, as a replica watches from its start
	// (a replica started after the lowering has only its restart floor).
	select {
	case <-sw.started:
	case <-ctx.Done():
		t.Fatal("B never started watching")
	}
	defer func() {
		cancel()
		if err := <-watched; !errors.Is(err, context.Canceled) {
			t.Errorf("WatchHighWaters returned %v, want context.Canceled", err)
		}
	}()
	waitFor := func(what string, cond func() bool) {
		t.Helper()
		for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
			if time.Now().After(end) {
				t.Fatalf("B did not %s within 10 s", what)
			}
		}
	}

	l, err := a.Acquire(ctx, region, "a")
	if err != nil || l.Worker != code {
		t.Fatalf("Acquire = %+v, %v; want code %d", l, err, code)
	}
	var blk segment.Block
	for range 3 {
		if blk, err = a.Allocate(ctx, l, 4096); err != nil {
			t.Fatal(err)
		}
	}
	hk := be.HighWaterKey(region, code)
	be.Put(t, hk, []byte(store.EncodeHighWater(blk.Lo)), 0) // at once: no scan of B's in between
	waitFor("report the lowered mark", func() bool { return obs.NRegressed.Load() == 1 })
	if _, err := b.HighWater(ctx, region, code); !errors.Is(err, segment.ErrHighWaterRegressed) {
		t.Fatalf("B's read of the lowered mark: %v, want ErrHighWaterRegressed", err)
	}
	if got, err := blind.HighWater(ctx, region, code); err != nil || got != blk.Lo {
		t.Fatalf("a Store that does not watch: %d, %v; want the lowered mark %d without an error (the control)", got, err, blk.Lo)
	}

	be.Put(t, hk, []byte(store.EncodeHighWater(blk.Hi)), 0) // lifted back: B grants on it again
	waitFor("lift the refusal", func() bool { return obs.NRecovered.Load() == 1 })
	if got, err := b.HighWater(ctx, region, code); err != nil || got != blk.Hi {
		t.Fatalf("B after the lift: %d, %v; want %d", got, err, blk.Hi)
	}
	be.Delete(t, hk)
	waitFor("report the deleted mark", func() bool { return obs.NRegressed.Load() == 2 })
}

// startedWatcher tells when a Store has read the marks and starts watching
// from there: changes after that are in its stream.
type startedWatcher struct {
	store.HighWaterWatcher
	started chan struct{}
	once    sync.Once
}

func (w *startedWatcher) WatchHighWaters(ctx context.Context, region int, after int64, f func(int, store.Entry)) error {
	w.once.Do(func() { close(w.started) })
	return w.HighWaterWatcher.WatchHighWaters(ctx, region, after, f)
}
