package mintpool_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/idrange/idrange/internal/server/carve"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// bubbleStart is the service clock at the start of a synctest bubble.
var bubbleStart = time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC)

// region is a pool over real rangeclient minters (Codes 1, as a replica's)
// of an in-memory region, and what it counts.
type region struct {
	svc    *rangeclienttest.Service
	pool   *mintpool.Pool
	opened atomic.Int64
	fail   atomic.Int64 // the next fail opens fail
	cancel context.CancelFunc
}

func newRegion(t *testing.T, cfg mintpool.Config) *region {
	t.Helper()
	return newRegionOn(t, rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: 10 * time.Second}), cfg)
}

// newRegionOn is newRegion over svc.
func newRegionOn(t *testing.T, svc *rangeclienttest.Service, cfg mintpool.Config) *region {
	t.Helper()
	r := &region{svc: svc}
	cfg.Now = r.svc.Now
	cfg.Open = func(ctx context.Context) (mintpool.Minter, error) {
		if r.fail.Load() > 0 {
			r.fail.Add(-1)
			return nil, fmt.Errorf("planted failure: %w", segment.ErrUnavailable)
		}
		c, err := rangeclient.New(ctx, rangeclient.Config{Allocator: r.svc.Conn(), Region: 1, Codes: 1, Owner: "pool"})
		if err != nil {
			return nil, err
		}
		r.opened.Add(1)
		return mintpool.Carving(c), nil
	}
	p, err := mintpool.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	r.pool = p
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	done := make(chan struct{})
	go func() { p.Run(ctx); close(done) }()
	t.Cleanup(func() {
		cancel()
		<-done
		if err := p.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func request(n int64) carve.Request {
	return carve.Request{N: n, MaxLead: 15 * time.Second, ValidFor: 900 * time.Millisecond, MinLife: 100 * time.Millisecond}
}

// leadOf is how far ahead of the service clock ms is.
func (r *region) leadOf(ms int64) time.Duration {
	return time.Duration(ms-snowflake.MsSince(r.svc.Now())) * time.Millisecond
}

// drive carves runs of n every tick for d, checking every run's lead, and
// returns the runs and the backpressure answers.
func (r *region) drive(t *testing.T, n int64, tick, d time.Duration) (runs []segment.Block, refused int) {
	t.Helper()
	for end := time.Now().Add(d); time.Now().Before(end); time.Sleep(tick) {
		b, err := r.pool.Carve(context.Background(), request(n))
		var bp *segment.Backpressure
		switch {
		case errors.As(err, &bp):
			refused++
			continue
		case err != nil:
			t.Fatalf("carve: %v", err)
		}
		if lead := r.leadOf(b.Lo >> snowflake.SequenceBits); lead > time.Second {
			t.Fatalf("run [%d,%d) starts %v ahead of the clock, beyond 1 s", b.Lo, b.Hi, lead)
		}
		runs = append(runs, b)
	}
	return runs, refused
}

// checkDisjoint fails if two runs share a position of one code.
func checkDisjoint(t *testing.T, runs []segment.Block) {
	t.Helper()
	seen := map[snowflake.ID]bool{}
	for _, b := range runs {
		for _, l := range []int64{b.Lo, b.Hi - 1} {
			if id := b.ID(l); seen[id] {
				t.Fatalf("ID %d in two runs", id)
			} else {
				seen[id] = true
			}
		}
	}
	var gs []rangeclienttest.Grant
	for _, b := range runs {
		gs = append(gs, rangeclienttest.Grant{Block: b})
	}
	if a, b, bad := rangeclienttest.Overlaps(gs); bad {
		t.Fatalf("runs [%d,%d) and [%d,%d) of code %d overlap", a.Lo, a.Hi, b.Lo, b.Hi, a.Worker)
	}
}

// Shared demand above what one code mints makes the pool take a second
// code (5M IDs/s: 122% of one code, 61% of two), with no run dated more
// than 1 s ahead and no run overlapping another; once demand stops, the
// pool gives the second code back (its lease released) after shrinkAfter.
func TestPoolCapacityFollowsDemand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRegion(t, mintpool.Config{MaxCodes: 3, Keep: true})
		time.Sleep(time.Second)
		if got := r.pool.Codes(); got != 1 {
			t.Fatalf("Keep: %d codes after 1 s, want 1", got)
		}
		runs, refused := r.drive(t, 50_000, 10*time.Millisecond, 5*time.Second) // 5M IDs/s
		if got := r.pool.Codes(); got != 2 {
			t.Fatalf("at 5M IDs/s: %d codes, want 2 (rate %.0f)", got, r.pool.Rate())
		}
		codes := map[int]bool{}
		for _, b := range runs {
			codes[b.Worker] = true
		}
		if len(codes) != 2 {
			t.Fatalf("runs from codes %v, want 2 codes", codes)
		}
		checkDisjoint(t, runs)
		t.Logf("%d runs, %d refused with backpressure, lead now %v", len(runs), refused, r.pool.Lead())

		time.Sleep(40 * time.Second) // no demand: past shrinkAfter
		if got := r.pool.Codes(); got != 1 {
			t.Fatalf("after 40 s without demand: %d codes, want 1", got)
		}
		held := 0
		for w := range codes {
			if _, ok := r.svc.Owner(w); ok {
				held++
			}
		}
		if held != 1 {
			t.Fatalf("%d of the codes %v still leased, want 1 (the other given back)", held, codes)
		}
	})
}

// With one code and demand twice what it mints, callers get backpressure
// once the code is 1 s ahead, carves and AppendN alike: never a run or an
// ID dated further ahead.
func TestPoolBackpressureBeyondTheLead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRegion(t, mintpool.Config{MaxCodes: 1, Keep: true})
		time.Sleep(time.Second)
		runs, refused := r.drive(t, 65_536, 8*time.Millisecond, 5*time.Second) // 8.2M IDs/s
		if refused == 0 {
			t.Fatalf("%d runs at twice one code's rate and no backpressure", len(runs))
		}
		checkDisjoint(t, runs)
		var bp *segment.Backpressure
		var ids []snowflake.ID
		for range 100 {
			var err error
			ids, err = r.pool.AppendN(context.Background(), ids[:0], 100_000)
			if errors.As(err, &bp) {
				break
			}
			if err != nil {
				t.Fatal(err)
			}
			if lead := r.leadOf(ids[len(ids)-1].Ms()); lead > time.Second+25*time.Millisecond {
				t.Fatalf("AppendN handed out an ID %v ahead", lead)
			}
		}
		if bp == nil || bp.RetryAfter <= 0 {
			t.Fatalf("AppendN at the lead bound: backpressure %v, want a retry delay", bp)
		}
		t.Logf("%d runs, %d refused; AppendN retry after %v", len(runs), refused, bp.RetryAfter)
	})
}

// With Keep, Run takes the first code at once and retries with backoff
// while that fails; without it, the first AppendN takes it.
func TestPoolFirstCode(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRegion(t, mintpool.Config{Keep: true})
		r.fail.Store(2) // planted: the first two attempts fail
		// Attempts at 0 s, then 1 s and 2 s later (openRetryMin doubling).
		time.Sleep(2 * time.Second)
		if got := r.pool.Codes(); got != 0 {
			t.Fatalf("%d codes after two failed attempts, want 0", got)
		}
		time.Sleep(2 * time.Second)
		if got := r.pool.Codes(); got != 1 {
			t.Fatalf("%d codes after the third attempt, want 1", got)
		}

		lazy := newRegion(t, mintpool.Config{})
		time.Sleep(time.Second)
		if got := lazy.pool.Codes(); got != 0 {
			t.Fatalf("without Keep: %d codes before any call, want 0", got)
		}
		// A failed first take is that caller's error (unavailable), and
		// the next caller tries again; 16 callers at once take one code.
		lazy.fail.Store(1)
		if _, err := lazy.pool.AppendN(context.Background(), nil, 10); !errors.Is(err, segment.ErrUnavailable) {
			t.Fatalf("AppendN while the first code cannot be taken: %v, want ErrUnavailable", err)
		}
		var wg sync.WaitGroup
		for range 16 {
			wg.Go(func() {
				ids, err := lazy.pool.AppendN(context.Background(), nil, 10)
				if err != nil || len(ids) != 10 {
					t.Errorf("first AppendN: %d IDs, %v", len(ids), err)
				}
			})
		}
		wg.Wait()
		if got, opened := lazy.pool.Codes(), lazy.opened.Load(); got != 1 || opened != 1 {
			t.Fatalf("16 first callers at once: %d codes held, %d taken; want 1 and 1", got, opened)
		}
	})
}

// Config.Validate names the bad field.
func TestPoolConfig(t *testing.T) {
	open := func(context.Context) (mintpool.Minter, error) { return nil, nil }
	for _, tc := range []struct {
		cfg  mintpool.Config
		want string
	}{
		{mintpool.Config{}, "Config.Open is required"},
		{mintpool.Config{Open: open, MaxCodes: -1}, "Config.MaxCodes -1 not in 1..64 (0: default 4)"},
		{mintpool.Config{Open: open, MaxCodes: 65}, "Config.MaxCodes 65 not in 1..64 (0: default 4)"},
		{mintpool.Config{Open: open, MaxLead: -time.Second}, "Config.MaxLead -1s is negative"},
	} {
		_, err := mintpool.New(tc.cfg)
		if err == nil || err.Error() != "mintpool: "+tc.want {
			t.Errorf("New(%+v) = %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// Eight shared clients at 1M IDs/s each, every run after the client's
// last ID (as rangeclient asks): the pool takes the codes 8M IDs/s need
// (3: above 75% of two codes), no run is refused, and none starts 1 s or
// more ahead of the clock.
func TestPoolClientsInOrder(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRegion(t, mintpool.Config{MaxCodes: 4, Keep: true})
		time.Sleep(time.Second)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		var (
			wg      sync.WaitGroup
			mu      sync.Mutex
			runs    []segment.Block
			refused int
		)
		for c := range 8 {
			wg.Go(func() {
				var after snowflake.ID
				tick := time.NewTicker(65536 * time.Microsecond) // a run of 65,536 a tick: 1M IDs/s
				defer tick.Stop()
				for ctx.Err() == nil {
					rq := request(segment.MaxShared)
					rq.After, rq.MaxLead = after, time.Second
					b, err := r.pool.Carve(ctx, rq)
					var bp *segment.Backpressure
					switch {
					case errors.As(err, &bp):
						mu.Lock()
						refused++
						mu.Unlock()
						time.Sleep(bp.RetryAfter)
						continue
					case err != nil:
						if ctx.Err() == nil {
							t.Errorf("client %d: %v", c, err)
						}
						return
					}
					if b.ID(b.Lo) <= after {
						t.Errorf("client %d: run [%d,%d) not after its last ID %d", c, b.Lo, b.Hi, after)
					}
					if lead := r.leadOf(b.Lo >> snowflake.SequenceBits); lead >= time.Second {
						t.Errorf("client %d: run starts %v ahead of the clock", c, lead)
					}
					after = b.ID(b.Hi - 1)
					mu.Lock()
					runs = append(runs, b)
					mu.Unlock()
					select {
					case <-tick.C:
					case <-ctx.Done():
					}
				}
			})
		}
		wg.Wait()
		if got := r.pool.Codes(); got != 3 {
			t.Errorf("8 clients at 1M IDs/s: %d codes, want 3 (rate %.0f)", got, r.pool.Rate())
		}
		if refused > 0 {
			t.Errorf("%d runs refused with backpressure at 8M IDs/s on up to 4 codes", refused)
		}
		checkDisjoint(t, runs)
		t.Logf("%d runs, %d codes, lead now %v", len(runs), r.pool.Codes(), r.pool.Lead())
	})
}

// A code whose first block lies far ahead of the clock (as a restarted
// replica's first blocks lie at its restart floor) hands out nothing
// beyond the lead, even on its first call, when the pool does not know its
// lead yet: the IDs become a gap and the caller gets backpressure.
func TestPoolFirstBlockBeyondTheLead(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		r := newRegion(t, mintpool.Config{MaxCodes: 1})
		// Code 0, the one the pool's minter takes, already granted 10 s
		// ahead: its next block starts there.
		r.svc.PutHighWater(0, (snowflake.MsSince(r.svc.Now())+10_000)<<snowflake.SequenceBits)
		ids, err := r.pool.AppendN(context.Background(), nil, 100)
		var bp *segment.Backpressure
		if !errors.As(err, &bp) || len(ids) != 0 {
			t.Fatalf("first AppendN on a code 10 s ahead: %d IDs, %v; want none and backpressure", len(ids), err)
		}
		// 10 s ahead when the mark was set, less the grant's own wait at
		// the lead and the 1 s bound: several seconds.
		if bp.RetryAfter < 5*time.Second {
			t.Fatalf("retry after %v, want several seconds", bp.RetryAfter)
		}
		if _, err := r.pool.Carve(context.Background(), request(100)); !errors.As(err, &bp) {
			t.Fatalf("carve on a code 10 s ahead: %v, want backpressure", err)
		}
	})
}

// Until the clock reaches the replica's restart floor (Config.NotBefore),
// every block starts at or after it, so the lead bound counts from the
// floor: MintBatch and carves are served with IDs from the floor on,
// within the bound past it.
func TestPoolRestartFloor(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: 10 * time.Second})
		floor := svc.Now().Add(10 * time.Second).Truncate(time.Millisecond)
		// The store's floor: every code's next block starts there.
		svc.PutHighWater(0, snowflake.MsSince(floor)<<snowflake.SequenceBits)
		r := newRegionOn(t, svc, mintpool.Config{MaxCodes: 1, NotBefore: floor})
		ids, err := r.pool.AppendN(context.Background(), nil, 100)
		if err != nil || len(ids) != 100 {
			t.Fatalf("AppendN below the restart floor: %d IDs, %v", len(ids), err)
		}
		for _, id := range ids {
			if id.Time().Before(floor) || id.Time().After(floor.Add(time.Second)) {
				t.Fatalf("ID %d dated %v, want within [floor %v, floor + 1 s]", id, id.Time(), floor)
			}
		}
		b, err := r.pool.Carve(context.Background(), request(100))
		if err != nil {
			t.Fatalf("carve below the restart floor: %v", err)
		}
		if at := snowflake.MsTime(b.Lo >> snowflake.SequenceBits); at.Before(floor) || at.After(floor.Add(time.Second)) {
			t.Fatalf("run dated %v, want within [floor %v, floor + 1 s]", at, floor)
		}
		if lead := r.pool.Lead(); lead > time.Second {
			t.Fatalf("Lead %v counted from the clock, want from the floor", lead)
		}
	})
}
