package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/etcdserverpb"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func TestAdminFlagErrors(t *testing.T) {
	const tgt = "127.0.0.1:7400"
	for _, tc := range []struct {
		args []string
		want string // the stderr must name it
	}{
		{[]string{"admin"}, "missing command"},
		{[]string{"admin", "bogus", "--target", tgt}, `"bogus"`},
		{[]string{"admin", "status"}, "--target"},
		{[]string{"admin", "status", "--target", "nohostport"}, "--target"},
		{[]string{"admin", "status", "--target", tgt, "-o", "yaml"}, "-o"},
		{[]string{"admin", "status", "--target", tgt, "--timeout", "0s"}, "--timeout"},
		{[]string{"admin", "leases", "--target", tgt, "extra"}, "unexpected arguments"},
		{[]string{"admin", "leases", "--target", tgt, "--worker", "3"}, "-worker"},
		{[]string{"admin", "fence", "--target", tgt}, "--worker is required"},
		{[]string{"admin", "fence", "--target", tgt, "--worker", "256"}, "--worker 256"},
		{[]string{"admin", "fence", "--target", tgt, "--worker", "-1"}, "--worker -1"},
		{[]string{"admin", "fence", "--target", tgt, "--worker", "3", "--token", "-5"}, "--token"},
		{[]string{"admin", "fence", "--target", tgt, "--worker", "x"}, "-worker"},
		{[]string{"admin", "alarm", "activate", "--target", tgt}, `"activate"`},
		{[]string{"admin", "alarm", "disarm", "--target", tgt, "--member", "zz"}, "-member"},
		{[]string{"admin", "alarm", "list", "--target", tgt, "--member", "1"}, "-member"},
	} {
		code, out, errs := runCmd(tc.args...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.want) {
			t.Errorf("%q: exit %d, stdout %q, stderr %q; want exit 2 naming %q", tc.args, code, out, errs, tc.want)
		}
	}
	c, err := parseAdminFlags([]string{"alarm", "--target", tgt + ",127.0.0.1:7401"}, &strings.Builder{})
	if err != nil || c.Command != "alarm list" || len(c.Targets) != 2 || c.Output != "table" {
		t.Fatalf("alarm without a verb: %+v, %v; want alarm list over 2 targets, table output", c, err)
	}
	c, err = parseAdminFlags([]string{"alarm", "disarm", "--target", tgt, "--member", "8e9e05c52164694d"}, &strings.Builder{})
	if err != nil || c.Member != 0x8e9e05c52164694d {
		t.Fatalf("alarm disarm --member: %+v, %v", c, err)
	}
	if code, _, _ := runCmd("admin", "-h"); code != cli.ExitOK {
		t.Fatalf("admin -h: exit %d, want 0", code)
	}
}

// adminJSON runs an admin command with -o json and decodes its output.
func adminJSON[T any](t *testing.T, args ...string) T {
	t.Helper()
	var v T
	code, out, errs := runCmd(append(append([]string{"admin"}, args...), "-o", "json")...)
	if code != cli.ExitOK {
		t.Fatalf("admin %q: exit %d, stderr %q", args, code, errs)
	}
	dec := json.NewDecoder(strings.NewReader(out))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&v); err != nil {
		t.Fatalf("admin %q -o json: %v; output %q", args, err, out)
	}
	return v
}

// adminTable runs an admin command with table output and checks that every
// one of want appears in it.
func adminTable(t *testing.T, want []string, args ...string) string {
	t.Helper()
	code, out, errs := runCmd(append([]string{"admin"}, args...)...)
	if code != cli.ExitOK {
		t.Fatalf("admin %q: exit %d, stderr %q", args, code, errs)
	}
	for _, w := range want {
		if !strings.Contains(out, w) {
			t.Errorf("admin %q table lacks %q:\n%s", args, w, out)
		}
	}
	return out
}

// minter mints from one rangeclient in the background and keeps what it
// saw: every ID and every error.
type minter struct {
	c     *rangeclient.Client
	mu    sync.Mutex
	ids   []snowflake.ID
	errs  []error
	calls int
}

func (m *minter) mintOnce(timeout time.Duration) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	id, err := m.c.Next(ctx)
	cancel()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.calls++
	if err != nil {
		m.errs = append(m.errs, err)
		return
	}
	m.ids = append(m.ids, id)
}

func (m *minter) snapshot() (ids []snowflake.ID, errs []error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return append([]snowflake.ID(nil), m.ids...), append([]error(nil), m.errs...)
}

// maxLinear is the highest linear position of worker's IDs in ids (-1:
// none).
func maxLinear(ids []snowflake.ID, worker int) int64 {
	hi := int64(-1)
	for _, id := range ids {
		if id.Worker() == worker {
			hi = max(hi, segment.Linear(id))
		}
	}
	return hi
}

// The acceptance test of rangesvc admin: a region with three
// real clients; status and leases show them with HWMs at or above every ID
// they returned and 256-3 free codes; fencing one code stops exactly that
// client (the service answers it fenced at its next call) while the other
// two keep minting without an error.
func TestAdminThreeClientsStatusLeasesFence(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	rs := []*localregion.Region{
		regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd, Store: store.Config{LeaseTTL: 3 * time.Second}}),
		regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd, Store: store.Config{LeaseTTL: 3 * time.Second}}),
	}
	targets := rs[0].Addr() + "," + rs[1].Addr()

	ms := make([]*minter, 3)
	for i := range ms {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		c, err := rangeclient.New(ctx, rangeclient.Config{
			Targets: []string{rs[0].Addr(), rs[1].Addr()}, Region: 1, Owner: fmt.Sprintf("client-%d", i),
			SafetyMargin: time.Second, RefillInterval: 200 * time.Millisecond,
		})
		cancel()
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		ms[i] = &minter{c: c}
		for range 500 {
			ms[i].mintOnce(5 * time.Second)
		}
		if _, errs := ms[i].snapshot(); len(errs) > 0 {
			t.Fatalf("client %d before any fence: %v", i, errs[0])
		}
	}
	leaseOf := func(i int) segment.Lease { return ms[i].c.Lease().Lease }

	// leases -o json: one row per client, each HWM above everything the
	// client returned (the HWM is an exclusive end).
	ls := adminJSON[leasesJSON](t, "leases", "--target", targets)
	if ls.Region != 1 || len(ls.Leases) != 3 {
		t.Fatalf("leases: region %d, %d rows; want region 1, 3 rows: %+v", ls.Region, len(ls.Leases), ls.Leases)
	}
	for i, m := range ms {
		l := leaseOf(i)
		ids, _ := m.snapshot()
		hi := maxLinear(ids, l.Worker)
		if hi < 0 {
			t.Fatalf("client %d minted no ID on its worker %d", i, l.Worker)
		}
		var row *leaseJSON
		for j := range ls.Leases {
			if ls.Leases[j].Worker == l.Worker {
				row = &ls.Leases[j]
			}
		}
		switch {
		case row == nil:
			t.Fatalf("client %d's worker %d is not listed: %+v", i, l.Worker, ls.Leases)
		case row.Token != l.Token || row.Owner != fmt.Sprintf("client-%d", i) || row.Error != "":
			t.Fatalf("client %d (%+v) listed as %+v", i, l, *row)
		case row.HWM <= hi:
			t.Fatalf("client %d: HWM %d is not above its highest ID's position %d (%v)", i, row.HWM, hi,
				segment.Block{Region: 1, Worker: l.Worker}.ID(hi).Parts())
		case row.HWMTime == nil || row.HWMTime.Before(snowflake.MsTime(hi>>snowflake.SequenceBits)):
			t.Fatalf("client %d: HWM time %v before its highest ID's time %v", i, row.HWMTime, snowflake.MsTime(hi>>snowflake.SequenceBits))
		case row.TTLLeftMs <= 0 || row.TTLLeftMs > 3000 || row.Acquired == nil:
			t.Fatalf("client %d: TTL left %d ms, acquired %v; want 1..3000 ms and a time", i, row.TTLLeftMs, row.Acquired)
		}
	}
	adminTable(t, []string{"WORKER", "OWNER", "IDENTITY", "TOKEN", "LEASE", "TTL LEFT", "HWM TIME", "HWM LEAD", "ACQUIRED",
		"client-0", "client-1", "client-2", "3 held codes in region 1"}, "leases", "--target", targets)

	// status -o json: both replicas, 256-3 free codes, the lead and the
	// etcd member.
	st := adminJSON[statusJSON](t, "status", "--target", targets)
	if len(st.Replicas) != 2 || st.Region != 1 || !st.Serving || st.FreeCodes != 256-3 || st.HeldCodes != 3 ||
		st.CorruptCodes != 0 || len(st.Alarms) != 0 {
		t.Fatalf("status %+v; want 2 replicas, region 1, serving, 253 free, 3 held, no alarms", st)
	}
	for _, r := range st.Replicas {
		if r.Health != "SERVING" || r.Region == nil || *r.Region != 1 || r.Error != "" {
			t.Fatalf("replica row %+v; want SERVING region 1", r)
		}
	}
	if st.MaxHWMLeadWorker < 0 || st.MaxHWMLeadMs > 20_000 || st.EpochLifeLeftMs <= 0 ||
		!st.EpochEnd.Equal(snowflake.EndOfLife()) || st.StoreRevision <= 0 {
		t.Fatalf("status lead %d ms (worker %d), epoch left %d ms ending %v, revision %d", st.MaxHWMLeadMs,
			st.MaxHWMLeadWorker, st.EpochLifeLeftMs, st.EpochEnd, st.StoreRevision)
	}
	if len(st.EtcdEndpoints) == 0 || len(st.EtcdMembers) != len(st.EtcdEndpoints) || st.EtcdMembers[0].DBSize <= 0 ||
		st.EtcdMembers[0].MemberID == "" || st.EtcdMembers[0].Error != "" {
		t.Fatalf("status etcd endpoints %v members %+v", st.EtcdEndpoints, st.EtcdMembers)
	}
	adminTable(t, []string{"REPLICA", "REGION", "HEALTH", rs[0].Addr(), rs[1].Addr(), "free codes", "253",
		"held codes", "max HWM lead", "epoch life left", "2095-09-07T15:47:35.551Z", "ETCD ENDPOINT", "DB SIZE", "alarms"},
		"status", "--target", targets)

	// Fence client 0's code while all three mint.
	victim, others := leaseOf(0), []segment.Lease{leaseOf(1), leaseOf(2)}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for i, m := range ms {
		timeout := 5 * time.Second
		if i == 0 {
			timeout = 20 * time.Millisecond // let the fenced client's wait surface as an error
		}
		wg.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				m.mintOnce(timeout)
				time.Sleep(time.Millisecond)
			}
		})
	}
	fenced := adminJSON[struct {
		AnsweredBy string    `json:"answered_by"`
		Fenced     leaseJSON `json:"fenced"`
	}](t, "fence", "--target", targets, "--worker", fmt.Sprint(victim.Worker))
	if fenced.Fenced.Worker != victim.Worker || fenced.Fenced.Token != victim.Token || fenced.Fenced.Owner != "client-0" {
		t.Fatalf("fence reported %+v; want client 0's lease %+v", fenced.Fenced, victim)
	}
	// The victim learns at its next renewal or grant (each well within a
	// second here); give it a generous bound.
	deadline := time.Now().Add(15 * time.Second)
	for ms[0].c.Stats().Fenced == 0 || leaseOf(0).Token == victim.Token {
		if time.Now().After(deadline) {
			t.Fatalf("client 0 not fenced 15 s after the fence: stats %+v lease %+v", ms[0].c.Stats(), leaseOf(0))
		}
		time.Sleep(10 * time.Millisecond)
	}
	// Keep everyone minting a little longer on the new state.
	n0 := func() int { ms[0].mu.Lock(); defer ms[0].mu.Unlock(); return len(ms[0].ids) }
	after := n0()
	for deadline := time.Now().Add(10 * time.Second); n0() < after+200; {
		if time.Now().After(deadline) {
			t.Fatalf("fenced client did not resume minting on a new lease within 10 s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	close(stop)
	wg.Wait()

	var all []snowflake.ID
	for i, m := range ms {
		ids, errs := m.snapshot()
		all = append(all, ids...)
		s := m.c.Stats()
		if i == 0 {
			if s.Fenced != 1 {
				t.Errorf("client 0: %d fenced leases, want 1", s.Fenced)
			}
			// The client rides through a fence: it re-acquires in the
			// background, and a Next that waits past its context meanwhile
			// fails with a retryable error (ErrFenced while the lease is
			// dead, ErrUnavailable while the new lease waits for a block).
			nFenced := 0
			for _, err := range errs {
				if !rangeclient.IsRetryable(err) {
					t.Errorf("client 0 after the fence: %v; want a retryable error", err)
				}
				if errors.Is(err, rangeclient.ErrFenced) {
					nFenced++
				}
			}
			t.Logf("client 0: %d Next errors (%d ErrFenced) while it re-acquired; new lease %+v", len(errs), nFenced, leaseOf(0))
			continue
		}
		if len(errs) > 0 || s.Fenced != 0 || s.Expiries != 0 {
			t.Errorf("client %d (not fenced): %d errors (first %v), %d fenced, %d expiries", i, len(errs), errs, s.Fenced, s.Expiries)
		}
		if l := leaseOf(i); l.Token != others[i-1].Token {
			t.Errorf("client %d changed lease %+v -> %+v; only client 0 was fenced", i, others[i-1], l)
		}
	}
	checkNoDuplicates(t, all)
	// The victim's token is gone from the listing; the three clients are
	// listed again.
	ls = adminJSON[leasesJSON](t, "leases", "--target", targets)
	for _, r := range ls.Leases {
		if r.Token == victim.Token {
			t.Fatalf("fenced token %d still listed: %+v", victim.Token, r)
		}
	}
	if len(ls.Leases) != 3 {
		t.Fatalf("%d leases after the fence; want 3 (client 0 re-acquired)", len(ls.Leases))
	}
	// Fencing by a stale token or a free code does nothing and says so.
	code, _, errs := runCmd("admin", "fence", "--target", targets, "--worker", fmt.Sprint(victim.Worker),
		"--token", fmt.Sprint(victim.Token))
	if code != cli.ExitFailure || (!strings.Contains(errs, "NotFound") && !strings.Contains(errs, "FailedPrecondition")) {
		t.Fatalf("fence with the fenced token again: exit %d, stderr %q; want exit 1 (not held or fenced)", code, errs)
	}
}

func checkNoDuplicates(t *testing.T, ids []snowflake.ID) {
	t.Helper()
	seen := make(map[snowflake.ID]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("duplicate ID %d (%+v)", id, id.Parts())
		}
		seen[id] = true
	}
}

// An etcd NOSPACE alarm shows in admin alarm list and status, and admin
// alarm disarm clears it; disarming when none is active fails (exit 1).
func TestAdminAlarmListAndDisarm(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	r := regiontest.Start(t, localregion.Config{Region: 2, Etcd: etcd})
	tgt := r.Addr()
	al := adminJSON[struct {
		Alarms []alarmJSON `json:"alarms"`
	}](t, "alarm", "list", "--target", tgt)
	if len(al.Alarms) != 0 {
		t.Fatalf("alarms on a fresh etcd: %+v", al.Alarms)
	}
	if code, _, errs := runCmd("admin", "alarm", "disarm", "--target", tgt); code != cli.ExitFailure || !strings.Contains(errs, "no NOSPACE alarm") {
		t.Fatalf("disarm with no alarm: exit %d, stderr %q; want exit 1", code, errs)
	}

	// Raise NOSPACE as etcd would when its backend reaches the quota.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cli3 := embedetcdtest.Client(t, etcd)
	sr, err := cli3.Status(ctx, cli3.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	member := sr.Header.MemberId
	if _, err := etcdserverpb.NewMaintenanceClient(cli3.ActiveConnection()).Alarm(ctx, &etcdserverpb.AlarmRequest{
		Action: etcdserverpb.AlarmRequest_ACTIVATE, MemberID: member, Alarm: etcdserverpb.AlarmType_NOSPACE,
	}); err != nil {
		t.Fatalf("activate NOSPACE: %v", err)
	}
	want := alarmJSON{MemberID: fmt.Sprintf("%x", member), Type: "NOSPACE"}
	al = adminJSON[struct {
		Alarms []alarmJSON `json:"alarms"`
	}](t, "alarm", "--target", tgt)
	if len(al.Alarms) != 1 || al.Alarms[0] != want {
		t.Fatalf("alarm list %+v; want [%+v]", al.Alarms, want)
	}
	adminTable(t, []string{"ALARM", "MEMBER", "NOSPACE", want.MemberID}, "alarm", "list", "--target", tgt)
	st := adminJSON[statusJSON](t, "status", "--target", tgt)
	if len(st.Alarms) != 1 || st.Alarms[0] != want {
		t.Fatalf("status alarms %+v; want [%+v]", st.Alarms, want)
	}
	if code, _, errs := runCmd("admin", "alarm", "disarm", "--target", tgt, "--member", "1234"); code != cli.ExitFailure || !strings.Contains(errs, "member 1234") {
		t.Fatalf("disarm on another member: exit %d, stderr %q; want exit 1 naming it", code, errs)
	}
	dis := adminJSON[struct {
		Disarmed []alarmJSON `json:"disarmed"`
		Alarms   []alarmJSON `json:"alarms"`
	}](t, "alarm", "disarm", "--target", tgt)
	if len(dis.Disarmed) != 1 || dis.Disarmed[0] != want || len(dis.Alarms) != 0 {
		t.Fatalf("disarm: %+v; want %+v disarmed and no alarm left", dis, want)
	}
	// Grants work again (NOSPACE refuses writes while active).
	if _, err := r.Store().Acquire(ctx, 2, "after disarm"); err != nil {
		t.Fatalf("acquire after disarm: %v", err)
	}
}

func TestAdminBytes(t *testing.T) {
	for n, want := range map[int64]string{0: "-", 512: "512 B", 1536: "1.5 KiB", 14_400_000: "13.7 MiB", 2 << 30: "2.0 GiB"} {
		if got := bytesStr(n); got != want {
			t.Errorf("bytesStr(%d) = %q, want %q", n, got, want)
		}
	}
}

// With etcd down, admin status still prints the replicas' health (now
// NOT_SERVING) and then fails: there is no region view to show.
func TestAdminStatusEtcdDown(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	r := regiontest.Start(t, localregion.Config{Region: 3, Etcd: etcd})
	adminTable(t, []string{"SERVING", "free codes"}, "status", "--target", r.Addr())
	etcd.Stop()
	deadline := time.Now().Add(30 * time.Second)
	for {
		code, out, errs := runCmd("admin", "status", "--target", r.Addr(), "-o", "json")
		var v struct {
			Replicas []replicaJSON `json:"replicas"`
			Error    string        `json:"error"`
		}
		if code == cli.ExitFailure {
			if err := json.Unmarshal([]byte(out), &v); err != nil {
				t.Fatalf("status with etcd down: %v; stdout %q", err, out)
			}
			if len(v.Replicas) != 1 || v.Error == "" || !strings.Contains(errs, "Unavailable") {
				t.Fatalf("status with etcd down: %+v, stderr %q; want the replica row, the error, Unavailable", v, errs)
			}
			if v.Replicas[0].Health == "NOT_SERVING" && v.Replicas[0].Region != nil && *v.Replicas[0].Region == 3 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("status 30 s after etcd stopped: exit %d, stdout %q, stderr %q; want exit 1 and NOT_SERVING", code, out, errs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	code, out, _ := runCmd("admin", "status", "--target", r.Addr())
	if code != cli.ExitFailure || !strings.Contains(out, "NOT_SERVING") || !strings.Contains(out, "REPLICA") {
		t.Fatalf("status table with etcd down: exit %d, stdout %q", code, out)
	}
}

// admin status shows, per replica, the codes its own minter holds and the
// shared-path clients it served: three Codes-0 clients on the first
// replica (whose minter serves them) and none on the second (no minter).
func TestAdminStatusSharedPath(t *testing.T) {
	if testing.Short() {
		t.Skip("real region: skipped with -short")
	}
	etcd := embedetcdtest.Start(t)
	next := nextMinter("rangesvc/next", nil)
	rs := []*localregion.Region{
		regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd, NextMinter: next}),
		regiontest.Start(t, localregion.Config{Region: 1, Etcd: etcd}),
	}
	targets := rs[0].Addr() + "," + rs[1].Addr()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop, err := rs[0].EnableNext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stop() })

	// Before any shared client: the minter holds its code, nobody shares.
	st := adminJSON[statusJSON](t, "status", "--target", targets)
	checkReplicaCounts(t, st.Replicas, [][2]int{{1, 0}, {0, 0}})

	const clients = 3
	var all []snowflake.ID
	for i := range clients {
		c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{rs[0].Addr()}, Region: 1,
			Owner: fmt.Sprintf("shared-%d", i)})
		if err != nil {
			t.Fatalf("client %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		for range 100 {
			id, err := c.Next(ctx)
			if err != nil {
				t.Fatalf("client %d: Next: %v", i, err)
			}
			all = append(all, id)
		}
		if !c.Stats().Shared {
			t.Fatalf("client %d is not on the shared path: %+v", i, c.Stats())
		}
	}
	checkNoDuplicates(t, all)

	st = adminJSON[statusJSON](t, "status", "--target", targets)
	checkReplicaCounts(t, st.Replicas, [][2]int{{1, clients}, {0, 0}})
	// The shared clients hold no code: the region's one held code is the
	// replica's minter.
	if st.HeldCodes != 1 || st.FreeCodes != 255 {
		t.Fatalf("status: %d held, %d free codes; want 1 held (the replica's minter), 255 free", st.HeldCodes, st.FreeCodes)
	}
	// The replica without a minter has nothing to carve from: its shared
	// path is off.
	for i, want := range []bool{true, false} {
		if r := st.Replicas[i]; r.SharedPath == nil || *r.SharedPath != want {
			t.Fatalf("replica %s: shared path %v, want %v", r.Target, r.SharedPath, want)
		}
	}
	out := adminTable(t, []string{"CODES HELD", "SHARED PATH", "SHARED CLIENTS"}, "status", "--target", targets)
	for i, want := range [][]string{{rs[0].Addr(), "1", "SERVING", "1", "on", fmt.Sprint(clients)}, {rs[1].Addr(), "1", "SERVING", "0", "off", "0"}} {
		if got := tableRow(out, rs[i].Addr()); !slices.Equal(got, want) {
			t.Errorf("status table: replica row %q, want %q:\n%s", got, want, out)
		}
	}
}

// tableRow is the whitespace-separated fields of the first line of out
// that starts with first (nil: none).
func tableRow(out, first string) []string {
	for line := range strings.Lines(out) {
		if f := strings.Fields(line); len(f) > 0 && f[0] == first {
			return f
		}
	}
	return nil
}

// checkReplicaCounts checks status's replica rows against want: {codes
// held, shared clients} per replica, in --target order.
func checkReplicaCounts(t *testing.T, reps []replicaJSON, want [][2]int) {
	t.Helper()
	if len(reps) != len(want) {
		t.Fatalf("%d replica rows, want %d: %+v", len(reps), len(want), reps)
	}
	for i, r := range reps {
		if r.CodesHeld == nil || r.SharedClients == nil || r.Error != "" {
			t.Fatalf("replica %s: codes held %v, shared clients %v, error %q; want both counts", r.Target, r.CodesHeld, r.SharedClients, r.Error)
		}
		if got := [2]int{*r.CodesHeld, *r.SharedClients}; got != want[i] {
			t.Fatalf("replica %s: codes held %d, shared clients %d; want %d and %d", r.Target, got[0], got[1], want[i][0], want[i][1])
		}
	}
}
