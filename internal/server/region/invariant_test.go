package region_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// idSink is a rangeclient minting in the background, at a modest rate,
// keeping every ID it handed out.
type idSink struct {
	mu   sync.Mutex
	ids  []snowflake.ID
	err  error
	stop context.CancelFunc
	done chan struct{}
}

func startMinting(c *rangeclient.Client) *idSink {
	ctx, cancel := context.WithCancel(context.Background())
	s := &idSink{stop: cancel, done: make(chan struct{})}
	go func() {
		defer close(s.done)
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			ids, err := c.NextN(ctx, 100)
			s.mu.Lock()
			s.ids = append(s.ids, ids...)
			if err != nil && ctx.Err() == nil && s.err == nil {
				s.err = err
			}
			s.mu.Unlock()
		}
	}()
	return s
}

func (s *idSink) minted() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.ids)
}

// end stops minting and returns every ID handed out and the first error.
func (s *idSink) end() ([]snowflake.ID, error) {
	s.stop()
	<-s.done
	return s.ids, s.err
}

// Issue 24's acceptance: an operator mistake lowers the high-water mark of
// the code a client is minting on, through etcd with the store's own
// credentials and behind the replica's back, to the start of the block the
// client was just granted (the 4,096 duplicates). The next grant on
// the code is refused (the replica's hwm_regressions_total and
// hwm_regressed_codes say so, the key is left as the operator wrote it),
// the client never receives an overlapping block, gives the code up and
// keeps minting on another, and no ID of the whole run repeats. A restore
// fence then lifts the mark above the replica's floor and the code is
// usable again.
func TestLoweredHighWaterMarkIsRefused(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	start := time.Now().Add(-time.Second)
	r := regiontest.Start(t, localregion.Config{Region: 1})
	c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{r.Addr()}, Region: 1, Owner: t.Name()})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	sink := startMinting(c)
	defer sink.end() //nolint:errcheck // ended (and checked) below; this covers a t.Fatal on the way
	waitFor(t, 30*time.Second, "the client minting", func() bool { return sink.minted() >= 20_000 })

	// The operator's client: the test's etcd, its own connection and
	// credentials, not the replica's.
	op, err := r.Etcd().NewClient(nil)
	if err != nil {
		t.Fatal(err)
	}
	defer op.Close()
	stg, err := etcdstore.New(op, etcdstore.Config{})
	if err != nil {
		t.Fatal(err)
	}
	victim := c.Lease().Lease
	key := stg.HighWaterKey(1, victim.Worker)
	var floor, lowered int64
	waitFor(t, 30*time.Second, "lowering the mark to the start of the last block", func() bool {
		cur, err := op.Get(ctx, key)
		if err != nil || len(cur.Kvs) == 0 {
			return false
		}
		kv := cur.Kvs[0]
		prev, err := op.Get(ctx, key, clientv3.WithRev(kv.ModRevision-1))
		if err != nil || len(prev.Kvs) == 0 {
			return false // one grant so far: wait for the next
		}
		// Compared on the revision read, so exactly the last grant is undone.
		put, err := op.Txn(ctx).If(clientv3.Compare(clientv3.ModRevision(key), "=", kv.ModRevision)).
			Then(clientv3.OpPut(key, string(prev.Kvs[0].Value))).Commit()
		if err != nil || !put.Succeeded {
			return false
		}
		if floor, err = store.DecodeHighWater(kv.Value); err != nil {
			t.Fatal(err)
		}
		if lowered, err = store.DecodeHighWater(prev.Kvs[0].Value); err != nil {
			t.Fatal(err)
		}
		return true
	})
	t.Logf("code %d: mark moved back from %d to %d (%d positions)", victim.Worker, floor, lowered, floor-lowered)

	reg := r.Registry()
	waitFor(t, 30*time.Second, "the replica refusing the code", func() bool {
		return gauge(t, reg, "idrange_service_hwm_regressions_total", "region", "1") == 1
	})
	if g := gauge(t, reg, "idrange_service_hwm_regressed_codes", "region", "1"); g != 1 {
		t.Fatalf("hwm_regressed_codes = %v, want 1", g)
	}
	waitFor(t, 30*time.Second, "the client on another code", func() bool {
		l := c.Lease()
		return l.Err == nil && l.Lease.Worker != victim.Worker && c.Stats().DroppedCodes >= 1
	})
	moved := sink.minted()
	waitFor(t, 30*time.Second, "the client minting on its new code", func() bool { return sink.minted() >= moved+20_000 })
	ids, err := sink.end()
	if err != nil {
		t.Fatalf("a mint failed during the run: %v", err)
	}
	if s := c.Stats(); s.Overlaps != 0 {
		t.Fatalf("the client received %d overlapping blocks; the replica must refuse the code first", s.Overlaps)
	}
	chk, err := measure.NewChecker(measure.CheckConfig{NotBefore: start, NotAfter: time.Now().Add(time.Minute)})
	if err != nil {
		t.Fatal(err)
	}
	chk.Add(ids...)
	if err := chk.Check().Err(); err != nil {
		t.Fatalf("IDs of the run: %v", err)
	}
	if got, err := r.Store().HighWater(ctx, 1, victim.Worker); !errors.Is(err, segment.ErrHighWaterRegressed) {
		t.Fatalf("HighWater of the lowered code = %d, %v; want ErrHighWaterRegressed", got, err)
	}
	if cur, err := op.Get(ctx, key); err != nil || len(cur.Kvs) != 1 || string(cur.Kvs[0].Value) != store.EncodeHighWater(lowered) {
		t.Fatalf("the lowered mark was rewritten: %v, %v", cur.Kvs, err)
	}
	t.Logf("%d IDs minted, all unique; the client dropped %d code(s)", len(ids), c.Stats().DroppedCodes)
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}

	// The restore fence lifts every mark above what any replica granted:
	// the code is usable again and the gauge falls back.
	adm := idrangev1.NewAdminServiceClient(regiontest.Dial(t, r.Addr()))
	if _, err := adm.RestoreFence(ctx, &idrangev1.RestoreFenceRequest{MarginMs: 200}); err != nil {
		t.Fatal(err)
	}
	snap, err := r.Store().Snapshot(ctx, 1)
	if err != nil || snap.Corrupt[victim.Worker] != nil || snap.HighWaters[victim.Worker] < floor {
		t.Fatalf("after the fence: code %d mark %d (floor %d), error %v, %v", victim.Worker,
			snap.HighWaters[victim.Worker], floor, snap.Corrupt[victim.Worker], err)
	}
	if g := gauge(t, reg, "idrange_service_hwm_regressed_codes", "region", "1"); g != 0 {
		t.Fatalf("hwm_regressed_codes after the fence = %v, want 0", g)
	}
}
