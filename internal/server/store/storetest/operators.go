package storetest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/authz"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// testSnapshotAndFence: an operator's view of a region matches what the
// Store granted, and Fence ends exactly the lease it names: never a newer
// owner's, even when that owner took the code after the operator looked.
func testSnapshotAndFence(t *testing.T, be Backend) {
	stg := be.Storage(t)
	st := NewStore(t, stg, store.Config{})
	ctx := Ctx(t)

	var leases []segment.Lease
	his := map[int]int64{}
	for i := range 3 {
		l, err := st.Acquire(ctx, 3, fmt.Sprintf("owner-%d", i))
		if err != nil {
			t.Fatal(err)
		}
		b, err := st.Allocate(ctx, l, 4096*(i+1))
		if err != nil {
			t.Fatal(err)
		}
		leases = append(leases, l)
		his[l.Worker] = b.Hi
	}
	// A released code keeps its HWM and counts as free.
	gone, err := st.Acquire(ctx, 3, "released")
	if err != nil {
		t.Fatal(err)
	}
	gb, err := st.Allocate(ctx, gone, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, gone); err != nil {
		t.Fatal(err)
	}
	// A corrupt HWM on a free code stops it: not free, reported.
	corruptCode := 0
	for _, held := his[corruptCode]; held || corruptCode == gone.Worker; _, held = his[corruptCode] {
		corruptCode++
	}
	be.Put(t, be.HighWaterKey(3, corruptCode), []byte("v1:-5"), 0)

	snap, err := st.Snapshot(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if snap.Region != 3 || snap.Rev <= 0 || len(snap.Leases) != 3 || snap.Free != 256-3-1 {
		t.Fatalf("snapshot region %d rev %d, %d leases, %d free; want region 3, 3 leases, %d free",
			snap.Region, snap.Rev, len(snap.Leases), snap.Free, 256-3-1)
	}
	if free, err := st.FreeCodes(ctx, 3); err != nil || free != snap.Free {
		t.Fatalf("FreeCodes = %d, %v; Snapshot says %d", free, err, snap.Free)
	}
	for i, li := range snap.Leases {
		if i > 0 && li.Worker <= snap.Leases[i-1].Worker {
			t.Fatalf("leases not ordered by worker: %+v", snap.Leases)
		}
		if li.Err != nil || li.Token <= 0 || li.LeaseID <= 0 || !strings.HasPrefix(li.Owner, "owner-") || li.Acquired.IsZero() {
			t.Fatalf("lease row %+v", li)
		}
		if got := snap.HighWaters[li.Worker]; got != his[li.Worker] {
			t.Fatalf("worker %d: snapshot HWM %d, granted up to %d", li.Worker, got, his[li.Worker])
		}
	}
	if got := snap.HighWaters[gone.Worker]; got != gb.Hi {
		t.Fatalf("released worker %d: snapshot HWM %d, want %d kept", gone.Worker, got, gb.Hi)
	}
	if err := snap.Corrupt[corruptCode]; !errors.Is(err, segment.ErrCorrupt) || len(snap.Corrupt) != 1 {
		t.Fatalf("corrupt HWMs %v; want only code %d, wrapping ErrCorrupt", snap.Corrupt, corruptCode)
	}

	// Fence with a stale token: nothing happens.
	victim, other := leases[0], leases[1]
	if _, err := st.Fence(ctx, 3, victim.Worker, victim.Token+1_000_000); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("Fence with a token that does not own the code: %v, want ErrFenced", err)
	}
	if _, err := st.Renew(ctx, victim); err != nil {
		t.Fatalf("victim after a refused fence: %v", err)
	}
	// Fence the victim by its token (a second replica, as an admin RPC
	// served by another replica would).
	admin := NewStore(t, be.Storage(t), store.Config{})
	leasesBefore := be.Leases(t)
	info, err := admin.Fence(ctx, 3, victim.Worker, victim.Token)
	if err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if info.Worker != victim.Worker || info.Token != victim.Token || info.LeaseID != victim.LeaseID || info.Owner != "owner-0" {
		t.Fatalf("Fence returned %+v, want the victim's lease %+v", info, victim)
	}
	if n := be.Leases(t); n != leasesBefore-1 {
		t.Fatalf("%d storage leases after the fence, %d before: the victim's lease must be revoked", n, leasesBefore)
	}
	// The victim's next renewal and grant are refused; the others go on.
	if _, err := st.Renew(ctx, victim); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("fenced owner's Renew: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Allocate(ctx, victim, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("fenced owner's Allocate: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Allocate(ctx, other, 1); err != nil {
		t.Fatalf("another owner after the fence: %v", err)
	}
	if _, err := admin.Fence(ctx, 3, victim.Worker, 0); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Fence of a free code: %v, want ErrLeaseLost", err)
	}
	// Its HWM stays: the next owner of the code starts above the victim's
	// blocks. Hold every other free code so the new owner gets this one.
	snap, err = st.Snapshot(ctx, 3)
	if err != nil {
		t.Fatal(err)
	}
	if got := snap.HighWaters[victim.Worker]; got != his[victim.Worker] {
		t.Fatalf("HWM after the fence %d, want %d kept", got, his[victim.Worker])
	}
	// A stale token (the victim's) must not fence the code's new owner.
	var newOwner segment.Lease
	for range 256 {
		l, err := st.Acquire(ctx, 3, "filler")
		if err != nil {
			t.Fatalf("acquire until the victim's code comes back: %v", err)
		}
		if l.Worker == victim.Worker {
			newOwner = l
			break
		}
	}
	if newOwner.Token <= victim.Token {
		t.Fatalf("new owner of code %d: %+v", victim.Worker, newOwner)
	}
	if _, err := admin.Fence(ctx, 3, victim.Worker, victim.Token); !errors.Is(err, segment.ErrFenced) {
		t.Fatalf("Fence with the old token after a new owner took the code: %v, want ErrFenced", err)
	}
	b, err := st.Allocate(ctx, newOwner, 1)
	if err != nil {
		t.Fatalf("new owner after a refused fence: %v", err)
	}
	if b.Lo < his[victim.Worker] {
		t.Fatalf("new owner's block starts at %d, below the fenced owner's HWM %d", b.Lo, his[victim.Worker])
	}
	for name, f := range map[string]func() error{
		"region": func() error { _, err := admin.Fence(ctx, 4, 0, 0); return err },
		"worker": func() error { _, err := admin.Fence(ctx, 3, 256, 0); return err },
		"token":  func() error { _, err := admin.Fence(ctx, 3, 0, -1); return err },
	} {
		if err := f(); !errors.Is(err, segment.ErrInvalid) || !strings.Contains(err.Error(), name) {
			t.Errorf("Fence with a bad %s: %v, want ErrInvalid naming it", name, err)
		}
	}
	if _, err := admin.Snapshot(ctx, 4); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("Snapshot of region 4: %v, want ErrInvalid", err)
	}
}

// testIdentityBinding: a lease acquired with an identity is recorded with
// it (record version 2), and only that identity may renew, release or
// allocate on it; another identity, or none, is refused with
// ErrPermissionDenied and changes nothing in the storage. A lease acquired
// without an identity is stored as the version 1 record of old.
func testIdentityBinding(t *testing.T, be Backend) {
	st := NewStore(t, be.Storage(t), store.Config{})
	ctx := Ctx(t)
	ctxA := authz.WithIdentity(ctx, "uri:spiffe://idrange.test/a")
	ctxB := authz.WithIdentity(ctx, "uri:spiffe://idrange.test/b")

	la, err := st.Acquire(ctxA, 1, "client a")
	if err != nil {
		t.Fatal(err)
	}
	raw, ok := be.Get(t, be.LeaseKey(1, la.Worker))
	if !ok {
		t.Fatal("owner entry missing")
	}
	rec, err := store.DecodeOwnerRecord(raw)
	if err != nil || rec.Version != 2 || rec.Identity != "uri:spiffe://idrange.test/a" || rec.Owner != "client a" {
		t.Fatalf("owner record %s = %+v, %v; want version 2 with A's identity", raw, rec, err)
	}
	if _, err := st.Allocate(ctxA, la, 4096); err != nil {
		t.Fatal(err)
	}
	hwm, _ := be.Get(t, be.HighWaterKey(1, la.Worker))

	other := NewStore(t, be.Storage(t), store.Config{}) // a second replica, cold cache
	for _, s := range []*store.Store{st, other} {
		for name, c := range map[string]context.Context{"identity B": ctxB, "no identity": ctx} {
			if _, err := s.Renew(c, la); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Renew of A's lease: %v, want ErrPermissionDenied", name, err)
			}
			if _, err := s.Allocate(c, la, 4096); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Allocate on A's lease: %v, want ErrPermissionDenied", name, err)
			}
			if err := s.Release(c, la); !errors.Is(err, segment.ErrPermissionDenied) {
				t.Fatalf("%s Release of A's lease: %v, want ErrPermissionDenied", name, err)
			}
		}
	}
	if got, _ := be.Get(t, be.LeaseKey(1, la.Worker)); string(got) != string(raw) {
		t.Fatalf("owner entry changed by refused calls: %s -> %s", raw, got)
	}
	if got, _ := be.Get(t, be.HighWaterKey(1, la.Worker)); string(got) != string(hwm) {
		t.Fatalf("high-water mark changed by refused calls: %s -> %s", hwm, got)
	}
	infos, err := st.List(ctx, 1)
	if err != nil || len(infos) != 1 || infos[0].Identity != "uri:spiffe://idrange.test/a" {
		t.Fatalf("List = %+v, %v; want A's lease with its identity", infos, err)
	}
	for _, s := range []*store.Store{st, other} {
		if _, err := s.Renew(ctxA, la); err != nil {
			t.Fatalf("A renews: %v", err)
		}
		if _, err := s.Allocate(ctxA, la, 4096); err != nil {
			t.Fatalf("A allocates: %v", err)
		}
	}
	if err := other.Release(ctxA, la); err != nil {
		t.Fatalf("A releases: %v", err)
	}

	// Without an identity: the record is version 1, byte for byte as before
	// identities existed, and an identified caller cannot touch it.
	ln, err := st.Acquire(ctx, 1, "anonymous")
	if err != nil {
		t.Fatal(err)
	}
	raw, _ = be.Get(t, be.LeaseKey(1, ln.Worker))
	want := fmt.Sprintf(`{"v":1,"region":1,"worker":%d,"lease_id":%d,"owner":"anonymous","acquired_unix_ms":`, ln.Worker, ln.LeaseID)
	if !strings.HasPrefix(string(raw), want) {
		t.Fatalf("anonymous owner record %s, want the version 1 form %s...", raw, want)
	}
	if _, err := st.Allocate(ctxB, ln, 4096); !errors.Is(err, segment.ErrPermissionDenied) {
		t.Fatalf("identity B on an anonymous lease: %v, want ErrPermissionDenied", err)
	}
	if _, err := st.Allocate(ctx, ln, 4096); err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctx, ln); err != nil {
		t.Fatal(err)
	}
}

// testIdentityNoOracle (issue 35): an identity that does not hold a lease
// gets one answer for every call that names it, ErrPermissionDenied with
// the same message, whatever it guessed: the right token and lease id, a
// wrong token below or above the store's revision, a wrong lease id, a
// released lease, a code nobody holds. So it learns neither whether a guess
// was right, nor the store's revision, nor which codes are leased. The
// identity that holds the live lease is still told what is wrong with a
// lease it names.
func testIdentityNoOracle(t *testing.T, be Backend) {
	st := NewStore(t, be.Storage(t), store.Config{})
	ctx := Ctx(t)
	ctxA := authz.WithIdentity(ctx, "cn:a")
	ctxB := authz.WithIdentity(ctx, "cn:b")
	gone, err := st.Acquire(ctxA, 1, "a, released") // first: la's token has older ones below it
	if err != nil {
		t.Fatal(err)
	}
	if err := st.Release(ctxA, gone); err != nil {
		t.Fatal(err)
	}
	la, err := st.Acquire(ctxA, 1, "a")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := st.Allocate(ctxA, la, 4096); err != nil {
		t.Fatal(err)
	}
	with := func(l segment.Lease, f func(*segment.Lease)) segment.Lease { f(&l); return l }
	guesses := map[string]segment.Lease{
		"the right lease":               la,
		"an older token":                with(la, func(l *segment.Lease) { l.Token-- }),
		"a newer token":                 with(la, func(l *segment.Lease) { l.Token++ }),
		"a token never issued":          with(la, func(l *segment.Lease) { l.Token += 1 << 40 }),
		"a wrong lease id":              with(la, func(l *segment.Lease) { l.LeaseID++ }),
		"the right token, lease id + 1": with(la, func(l *segment.Lease) { l.LeaseID += 1 << 20 }),
	}
	other := NewStore(t, be.Storage(t), store.Config{}) // a second replica, cold cache
	answers := map[string]string{}                      // message -> the first guess that got it
	ask := func(s *store.Store, what string, l segment.Lease) {
		t.Helper()
		_, rerr := s.Renew(ctxB, l)
		_, aerr := s.Allocate(ctxB, l, 4096)
		lerr := s.Release(ctxB, l)
		for op, err := range map[string]error{"Renew": rerr, "Allocate": aerr, "Release": lerr} {
			if !errors.Is(err, segment.ErrPermissionDenied) {
				t.Errorf("B's %s with %s: %v, want ErrPermissionDenied", op, what, err)
				continue
			}
			want := fmt.Sprintf("region %d worker %d: %v", l.Region, l.Worker, segment.ErrPermissionDenied)
			if err.Error() != want {
				t.Errorf("B's %s with %s: message %q, want %q (the code and nothing else)", op, what, err, want)
			}
			if l.Worker == la.Worker {
				if first, ok := answers[err.Error()]; ok && len(answers) > 1 {
					t.Errorf("B's %s with %s: a second message (the first was for %s)", op, what, first)
				}
				answers[err.Error()] = what
			}
		}
	}
	for _, s := range []*store.Store{st, other} {
		for what, l := range guesses {
			ask(s, what, l)
		}
		ask(s, "A's released lease", gone)
		free := with(la, func(l *segment.Lease) { l.Worker = (la.Worker + 7) % 256 })
		if free.Worker == gone.Worker {
			free.Worker = (free.Worker + 1) % 256
		}
		ask(s, "a code nobody holds", free)
	}
	if len(answers) != 1 {
		t.Errorf("B got %d different messages for A's code, want 1: %v", len(answers), answers)
	}
	// A, which holds the lease, is told what is wrong with what it named.
	if _, err := st.Allocate(ctxA, with(la, func(l *segment.Lease) { l.Token-- }), 4096); !errors.Is(err, segment.ErrFenced) {
		t.Errorf("A with an older token: %v, want ErrFenced", err)
	}
	if _, err := st.Renew(ctxA, with(la, func(l *segment.Lease) { l.LeaseID++ })); !errors.Is(err, segment.ErrInvalid) {
		t.Errorf("A with a wrong lease id: %v, want ErrInvalid", err)
	}
	if _, err := st.Renew(ctxA, la); err != nil {
		t.Fatalf("A's own lease after B's guesses: %v", err)
	}
}

// testIdentityCap: an identity holding MaxCodesPerIdentity codes is refused
// the next with ErrCodeCap naming the cap, without leaking a storage lease;
// other identities, and callers without one, still get codes; a released
// code makes room again.
func testIdentityCap(t *testing.T, be Backend) {
	const capN = 3
	st := NewStore(t, be.Storage(t), store.Config{MaxCodesPerIdentity: capN})
	ctx := Ctx(t)
	ctxA := authz.WithIdentity(ctx, "cn:a")
	var held []segment.Lease
	for i := range capN {
		l, err := st.Acquire(ctxA, 2, "a")
		if err != nil {
			t.Fatalf("acquire %d of %d: %v", i+1, capN, err)
		}
		held = append(held, l)
	}
	leases := be.Leases(t)
	_, err := st.Acquire(ctxA, 2, "a")
	if !errors.Is(err, segment.ErrCodeCap) || !strings.Contains(err.Error(), fmt.Sprintf("cap is %d", capN)) {
		t.Fatalf("acquire %d: %v, want ErrCodeCap naming the cap %d", capN+1, err, capN)
	}
	if got := be.Leases(t); got != leases {
		t.Fatalf("storage leases %d before, %d after the refused acquire", leases, got)
	}
	if _, err := st.Acquire(authz.WithIdentity(ctx, "cn:b"), 2, "b"); err != nil {
		t.Fatalf("another identity: %v", err)
	}
	if _, err := st.Acquire(ctx, 2, "anonymous"); err != nil {
		t.Fatalf("no identity: %v", err)
	}
	if _, err := st.Acquire(authz.WithIdentity(ctx, "cn:a"), 3, "a"); err != nil {
		t.Fatalf("the same identity in another region: %v", err)
	}
	if err := st.Release(ctxA, held[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Acquire(ctxA, 2, "a"); err != nil {
		t.Fatalf("after a release: %v", err)
	}
}

// testIdentityCapUnderConcurrency: many concurrent acquisitions by one
// identity through two replicas never leave it holding more than the cap,
// at least one succeeds, and the refused ones leave no code behind.
func testIdentityCapConcurrent(t *testing.T, be Backend) {
	const capN, tries = 2, 8
	stores := []*store.Store{
		NewStore(t, be.Storage(t), store.Config{MaxCodesPerIdentity: capN}),
		NewStore(t, be.Storage(t), store.Config{MaxCodesPerIdentity: capN}),
	}
	ctx := authz.WithIdentity(Ctx(t), "dns:c.test")
	var (
		wg   sync.WaitGroup
		won  atomic.Int64
		errs = make(chan error, tries)
	)
	for i := range tries {
		wg.Go(func() {
			_, err := stores[i%2].Acquire(ctx, 0, "c")
			switch {
			case err == nil:
				won.Add(1)
			case !errors.Is(err, segment.ErrCodeCap):
				errs <- err
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatalf("acquire: %v, want success or ErrCodeCap", err)
	}
	infos, err := stores[0].List(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	if n := int64(len(infos)); won.Load() < 1 || won.Load() > capN || n != won.Load() {
		t.Fatalf("%d acquisitions succeeded and %d codes are held; want 1..%d, equal", won.Load(), n, capN)
	}
}
