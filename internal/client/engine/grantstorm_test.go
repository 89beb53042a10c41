package engine

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/snowflake"
)

// grantsPerSecond runs one client (100 ms blocks) on a service with the
// default 15 s lead, minting either flat out (AppendN back to back: it runs ahead to the
// lead and stays there) or at 1,000 IDs/s, and returns the grants per
// second of service time after a 1 s warm-up.
func grantsPerSecond(t *testing.T, flatOut bool) (perSec float64, minted int) {
	synctest.Test(t, func(t *testing.T) {
		svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart})
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Tuning.FixedBlock = 409_600 })
		ctx := context.Background()
		buf := make([]snowflake.ID, 0, 4096)
		mint := func(until time.Time) {
			for time.Now().Before(until) {
				var err error
				if flatOut {
					buf, err = c.AppendN(ctx, buf[:0], 4096)
					minted += len(buf)
				} else {
					_, err = c.Next(ctx)
					minted++
					time.Sleep(time.Millisecond)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
		}
		mint(time.Now().Add(time.Second))
		g0, t0, m0 := len(svc.Grants()), time.Now(), minted
		mint(t0.Add(3 * time.Second))
		perSec = float64(len(svc.Grants())-g0) / time.Since(t0).Seconds()
		minted -= m0
	})
	return perSec, minted
}

// TestNoGrantStormAtTheLead: a client minting flat out on one
// code sits at the service's lead limit, where every grant would be
// trimmed to the millisecond or two the clock freed since the last one.
// The service refuses such grants with backpressure until most of the
// request fits (segment.Policy.MinGrantPercent), so the client asks for
// blocks no more often than the same client at 1,000 IDs/s (within 2x).
func TestNoGrantStormAtTheLead(t *testing.T) {
	slow, slowIDs := grantsPerSecond(t, false)
	fast, fastIDs := grantsPerSecond(t, true)
	t.Logf("grants/s: %.1f at 1,000 IDs/s (%d IDs), %.1f flat out (%d IDs, %.0f%% of one code's cap)",
		slow, slowIDs, fast, fastIDs, 100*float64(fastIDs)/3/4_096_000)
	if slow <= 0 {
		t.Fatal("no grants at 1,000 IDs/s")
	}
	if fast > 2*slow {
		t.Fatalf("flat out the client made %.1f grants/s, more than 2x the %.1f at 1,000 IDs/s", fast, slow)
	}
	if fastIDs < 3*4_096_000/2 {
		t.Fatalf("flat out the client minted %d IDs in 3 s, under half the code's cap", fastIDs)
	}
}
