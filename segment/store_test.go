package segment_test

import (
	"context"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/internal/embedetcd"
	"github.com/idrange/idrange/segment"
)

// testTTL is the lease TTL tests ask for. With the test raft timings
// (election 2 s, tick 200 ms) etcd's minimum is 3 s, so it grants 3 s.
const testTTL = 3 * time.Second

func newStore(t *testing.T, cli *clientv3.Client, cfg segment.StoreConfig) *segment.Store {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = testTTL
	}
	st, err := segment.NewStore(cli, cfg)
	if err != nil {
		t.Fatalf("NewStore: %v", err)
	}
	return st
}

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestLifecycle(t *testing.T) {
	srv := embedetcd.StartForTest(t)
	cli := srv.ClientForTest(t)
	var off clock.Offset
	st := newStore(t, cli, segment.StoreConfig{Clock: &off})
	ctx := testCtx(t)

	l, err := st.Acquire(ctx, 2, "host-a/1")
	if err != nil {
		t.Fatalf("Acquire: %v", err)
	}
	if l.Region != 2 || l.Worker < 0 || l.Worker > 255 || l.Token <= 0 || l.LeaseID == 0 || l.TTL < time.Second {
		t.Fatalf("Acquire returned %+v", l)
	}
	b1, err := st.Allocate(ctx, l, 4096)
	if err != nil {
		t.Fatalf("Allocate: %v", err)
	}
	if b1.Len() != 4096 || b1.Region != 2 || b1.Worker != l.Worker || !b1.ValidUntil.After(b1.ServiceTime) {
		t.Fatalf("block %+v", b1)
	}
	b2, err := st.Allocate(ctx, l, 100)
	if err != nil {
		t.Fatalf("Allocate 2: %v", err)
	}
	if b2.Lo < b1.Hi {
		t.Fatalf("blocks overlap: %+v then %+v", b1, b2)
	}
	hwm, err := st.HighWater(ctx, 2, l.Worker)
	if err != nil || hwm != b2.Hi {
		t.Fatalf("HighWater = %d, %v; want %d", hwm, err, b2.Hi)
	}
	l2, err := st.Renew(ctx, l)
	if err != nil || l2.TTL < time.Second || l2.Token != l.Token {
		t.Fatalf("Renew = %+v, %v", l2, err)
	}
	infos, err := st.List(ctx, 2)
	if err != nil || len(infos) != 1 || infos[0].Worker != l.Worker || infos[0].Token != l.Token || infos[0].Owner != "host-a/1" || infos[0].Err != nil {
		t.Fatalf("List = %+v, %v", infos, err)
	}
	free, err := st.FreeCodes(ctx, 2)
	if err != nil || free != 255 {
		t.Fatalf("FreeCodes = %d, %v; want 255", free, err)
	}
	if err := st.Release(ctx, l); err != nil {
		t.Fatalf("Release: %v", err)
	}
	if _, err := st.Allocate(ctx, l, 1); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Allocate after Release: %v, want ErrLeaseLost", err)
	}
	if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("Renew after Release: %v, want ErrLeaseLost", err)
	}
	if hwm, err := st.HighWater(ctx, 2, l.Worker); err != nil || hwm != b2.Hi {
		t.Fatalf("HWM after Release = %d, %v; want it kept at %d", hwm, err, b2.Hi)
	}
}
