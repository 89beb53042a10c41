package etcdspace

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/server/embedetcd/embedetcdtest"
)

// The compaction target is the newest sample at least Retention old, and
// only the samples a later compaction can use are kept.
func TestTargetAndSamples(t *testing.T) {
	c, err := NewCompactor(CompactorConfig{Etcd: &clientv3.Client{}, Key: "/k", Interval: time.Minute, Retention: 5 * time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Date(2026, 12, 3, 6, 0, 0, 0, time.UTC)
	if got := c.target(t0); got != 0 {
		t.Fatalf("no samples: target %d, want 0", got)
	}
	for i := range 20 { // a sample a minute, revision 100 + 10 per minute
		c.record(t0.Add(time.Duration(i)*time.Minute), int64(100+10*i))
	}
	now := t0.Add(19 * time.Minute)
	if got := c.target(now); got != 240 { // the sample at minute 14
		t.Fatalf("target %d, want 240 (the sample 5 min before minute 19)", got)
	}
	if got := c.target(now.Add(30 * time.Second)); got != 240 {
		t.Fatalf("target half a minute later %d, want 240", got)
	}
	if n := len(c.samples); n != 6 {
		t.Fatalf("%d samples kept, want 6 (minutes 14..19)", n)
	}
	if got := c.target(t0.Add(4 * time.Minute)); got != 0 {
		t.Fatalf("target before any sample is 5 min old: %d, want 0", got)
	}
}

// A compaction to a revision etcd has already compacted past is not a
// failure; a compaction removes history but keeps every current value.
func TestCompactAlreadyCompacted(t *testing.T) {
	etcd := embedetcdtest.Start(t)
	cli := embedetcdtest.Client(t, etcd)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	now := time.Now()
	c, err := NewCompactor(CompactorConfig{Etcd: cli, Key: "/k/compactor", Interval: time.Second, Retention: time.Second,
		Registerer: reg, now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	var revs []int64
	for i := range 5 {
		r, err := cli.Put(ctx, "/k/hwm", strings.Repeat("x", i+1))
		if err != nil {
			t.Fatal(err)
		}
		revs = append(revs, r.Header.Revision)
	}
	c.record(now.Add(-2*time.Second), revs[1])
	c.compact(ctx)
	if testutil.ToFloat64(c.compactions) != 1 || testutil.ToFloat64(c.compacted) != float64(revs[1]) {
		t.Fatalf("compactions %v, compacted revision %v; want 1, %d", testutil.ToFloat64(c.compactions), testutil.ToFloat64(c.compacted), revs[1])
	}
	// etcd (or another replica) compacts further; our next target is below.
	if _, err := cli.Compact(ctx, revs[3]); err != nil {
		t.Fatal(err)
	}
	c.record(now.Add(-1500*time.Millisecond), revs[2])
	c.compact(ctx)
	if testutil.ToFloat64(c.errs) != 0 || testutil.ToFloat64(c.compactions) != 2 {
		t.Fatalf("errors %v, compactions %v after an already-compacted revision; want 0, 2", testutil.ToFloat64(c.errs), testutil.ToFloat64(c.compactions))
	}
	got, err := cli.Get(ctx, "/k/hwm")
	if err != nil || len(got.Kvs) != 1 || string(got.Kvs[0].Value) != "xxxxx" || got.Kvs[0].ModRevision != revs[4] {
		t.Fatalf("current value after compaction: %v, %v", got, err)
	}
}

// The monitor exports the member's backend size and quota, and the
// NOSPACE alarm: Err wraps ErrNoSpace (naming the member and the recovery)
// while it is raised, and is nil again once it is disarmed.
func TestMonitorNoSpace(t *testing.T) {
	const quota = 32 << 20
	etcd := embedetcdtest.StartConfig(t, embedetcd.Config{QuotaBackendBytes: quota})
	cli := embedetcdtest.Client(t, etcd)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	reg := prometheus.NewRegistry()
	m, err := NewMonitor(MonitorConfig{Etcd: cli, Registerer: reg, QuotaBytes: 1 << 30})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(ctx); err != nil || m.Err() != nil {
		t.Fatalf("refresh %v, err %v; want nil, nil", err, m.Err())
	}
	st, err := cli.Status(ctx, cli.Endpoints()[0])
	if err != nil {
		t.Fatal(err)
	}
	member := memberID(st.Header.MemberId)
	if got := testutil.ToFloat64(m.quota); got != quota {
		t.Fatalf("quota %v, want the member's %d", got, quota)
	}
	if got := testutil.ToFloat64(m.backend.WithLabelValues(member)); got <= 0 {
		t.Fatalf("backend bytes %v", got)
	}
	if got := testutil.ToFloat64(m.alarm.WithLabelValues("NOSPACE")); got != 0 {
		t.Fatalf("NOSPACE gauge %v before the alarm", got)
	}

	// Raise NOSPACE as etcd itself does when the quota is reached.
	mc := pb.NewMaintenanceClient(cli.ActiveConnection())
	if _, err := mc.Alarm(ctx, &pb.AlarmRequest{Action: pb.AlarmRequest_ACTIVATE, MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	err = m.Err()
	want := "etcd alarm NOSPACE on member " + member + ": backend over quota"
	if !errors.Is(err, ErrNoSpace) || !strings.HasPrefix(err.Error(), want) || !strings.Contains(err.Error(), "`etcdctl alarm disarm`") {
		t.Fatalf("Err() = %v; want ErrNoSpace starting %q", err, want)
	}
	if got := testutil.ToFloat64(m.alarm.WithLabelValues("NOSPACE")); got != 1 {
		t.Fatalf("NOSPACE gauge %v while raised", got)
	}
	if _, err := cli.AlarmDisarm(ctx, &clientv3.AlarmMember{MemberID: st.Header.MemberId, Alarm: pb.AlarmType_NOSPACE}); err != nil {
		t.Fatal(err)
	}
	if err := m.Refresh(ctx); err != nil || m.Err() != nil || testutil.ToFloat64(m.alarm.WithLabelValues("NOSPACE")) != 0 {
		t.Fatalf("after disarm: refresh %v, Err %v, gauge %v", err, m.Err(), testutil.ToFloat64(m.alarm.WithLabelValues("NOSPACE")))
	}
}
