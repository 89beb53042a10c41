package engine

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/snowflake"
)

// IDs carry the leased code and follow the service's time inside a block.
func TestNextFollowsServiceTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, nil)
		li := c.Lease()
		if li.Err != nil || li.Lease.Region != 1 {
			t.Fatalf("lease %+v", li)
		}
		var ids []snowflake.ID
		for i := range 3000 {
			id := mustNext(t, c)
			if id.Region() != 1 || id.Worker() != li.Lease.Worker {
				t.Fatalf("ID %d decodes to region %d worker %d, leased %d/%d", id, id.Region(), id.Worker(), 1, li.Lease.Worker)
			}
			// The ID's millisecond is the service's (time does not move
			// inside the bubble unless we sleep).
			if want := snowflake.MsSince(svc.Now()); id.Ms() != want {
				t.Fatalf("ID %d has ms %d, service time is ms %d", i, id.Ms(), want)
			}
			ids = append(ids, id)
			if i%100 == 99 {
				time.Sleep(7 * time.Millisecond)
			}
		}
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("IDs not increasing at %d: %d then %d", i, ids[i-1], ids[i])
			}
		}
		checkUnique(t, ids)
		checkInGrants(t, svc, ids)
		if got := c.Stats().Minted; got != int64(len(ids)) {
			t.Fatalf("Stats.Minted = %d, minted %d", got, len(ids))
		}
	})
}

func TestNextNAndAppendN(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Tuning.FixedBlock = 10_000 })
		ids, err := c.NextN(context.Background(), 25_000) // spans 3 blocks
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) != 25_000 {
			t.Fatalf("NextN returned %d IDs", len(ids))
		}
		buf := make([]snowflake.ID, 0, 100)
		buf, err = c.AppendN(context.Background(), buf, 100)
		if err != nil || len(buf) != 100 {
			t.Fatalf("AppendN: %d IDs, %v", len(buf), err)
		}
		all := append(ids, buf...)
		// Single Next calls in a frozen millisecond run through blocks by
		// count, not by time.
		for range 25_000 {
			all = append(all, mustNext(t, c))
		}
		for i := 1; i < len(all); i++ {
			if all[i] <= all[i-1] {
				t.Fatalf("not increasing at %d", i)
			}
		}
		checkUnique(t, all)
		checkInGrants(t, svc, all)
		if got := c.Stats().Minted; got != int64(len(all)) {
			t.Fatalf("Stats.Minted = %d, want %d", got, len(all))
		}
		if _, err := c.NextN(context.Background(), -1); err == nil {
			t.Fatal("NextN(-1) succeeded")
		}
	})
}
