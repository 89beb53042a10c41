package memstore_test

import (
	"context"
	"errors"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/memstore"
	"github.com/idrange/idrange/internal/server/store/storetest"
	"github.com/idrange/idrange/segment"
)

// backend is memstore under the conformance suite: every Storage call
// returns the same in-memory store (replicas share it as they share etcd).
type backend struct{ s *memstore.Storage }

func (b backend) Storage(testing.TB) store.Storage { return b.s }
func (b backend) Put(t testing.TB, key string, value []byte, lease int64) {
	t.Helper()
	if err := b.s.Put(key, value, lease); err != nil {
		t.Fatal(err)
	}
}
func (b backend) Delete(t testing.TB, key string) { b.s.Delete(key) }
func (b backend) Get(t testing.TB, key string) ([]byte, bool) {
	e := b.s.Get(key)
	if e == nil {
		return nil, false
	}
	return e.Value, true
}
func (backend) LeaseKey(r, w int) string     { return memstore.LeaseKey(r, w) }
func (backend) HighWaterKey(r, w int) string { return memstore.HighWaterKey(r, w) }
func (b backend) Leases(testing.TB) int      { return b.s.Leases() }

func TestConformance(t *testing.T) {
	storetest.Run(t, func(*testing.T) storetest.Backend { return backend{memstore.New()} })
}

// TestLeaseExpiresByTTL: with no renewal the lease's entries disappear
// once its TTL has passed on time.Now (synctest's fake clock here), and the
// owner is cut off; until then it holds.
func TestLeaseExpiresByTTL(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		st := storetest.NewStore(t, memstore.New(), store.Config{
			LeaseTTL: time.Second,
			Now:      func() time.Time { return time.Now().AddDate(30, 0, 0) }, // the bubble starts in 2000
		})
		l, err := st.Acquire(ctx, 2, "expiring")
		if err != nil || l.TTL != time.Second {
			t.Fatalf("Acquire = %+v, %v", l, err)
		}
		time.Sleep(999 * time.Millisecond)
		if _, err := st.Allocate(ctx, l, 10); err != nil {
			t.Fatalf("Allocate before the TTL: %v", err)
		}
		if l, err = st.Renew(ctx, l); err != nil {
			t.Fatalf("Renew before the TTL: %v", err)
		}
		time.Sleep(time.Second)
		if _, err := st.Allocate(ctx, l, 10); !errors.Is(err, segment.ErrLeaseLost) {
			t.Fatalf("Allocate after expiry: %v, want ErrLeaseLost", err)
		}
		if _, err := st.Renew(ctx, l); !errors.Is(err, segment.ErrLeaseLost) {
			t.Fatalf("Renew after expiry: %v, want ErrLeaseLost", err)
		}
	})
}
