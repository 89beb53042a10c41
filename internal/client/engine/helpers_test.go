package engine

import (
	"context"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// bubbleStart is the service clock at the start of a synctest bubble
// (whose own clock starts in 2000, before the epoch).
var bubbleStart = time.Date(2030, time.March, 1, 12, 0, 0, 0, time.UTC)

// fakeService returns an in-memory service for region 1 with TTL ttl.
func fakeService(ttl time.Duration) *rangeclienttest.Service {
	return rangeclienttest.New(rangeclienttest.Options{Region: 1, Start: bubbleStart, TTL: ttl})
}

// hourGrant is a grant of [lo, hi) on code 1/7 whose reply read the
// service clock at the epoch (so local instant 0 is service time 0 for a
// block built with sent = arrive = 0) and which stays valid for an hour:
// the block tests' grant.
func hourGrant(lo, hi int64) segment.Block {
	return segment.Block{Region: 1, Worker: 7, Lo: lo, Hi: hi,
		ServiceTime: snowflake.Epoch, ValidUntil: snowflake.Epoch.Add(time.Hour)}
}

// openLease is a lease whose safety deadline never comes, for block tests
// that arm their blocks (stop is then the block's own validity).
func openLease() *leaseState {
	l := &leaseState{}
	l.deadline.Store(math.MaxInt64)
	return l
}

// newTestClient builds a client on conn with test-friendly defaults and
// closes it at the end of the test.
func newTestClient(t testing.TB, conn *rangeclienttest.Conn, edit func(*Config)) *Engine {
	t.Helper()
	return startClient(t, Config{Allocator: conn, Region: 1, Owner: t.Name()}, 30*time.Second, edit)
}

// startClient applies edit (if any) to cfg, builds a client within timeout
// and closes it at the end of the test.
func startClient(t testing.TB, cfg Config, timeout time.Duration, edit func(*Config)) *Engine {
	t.Helper()
	if edit != nil {
		edit(&cfg)
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	c, err := New(ctx, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// checkUnique fails if ids has a duplicate.
func checkUnique(t testing.TB, ids []snowflake.ID) {
	t.Helper()
	s := slices.Clone(ids)
	slices.Sort(s)
	for i := 1; i < len(s); i++ {
		if s[i] == s[i-1] {
			t.Fatalf("duplicate ID %d (%+v)", s[i], s[i].Parts())
		}
	}
}

// checkInGrants fails if an ID lies outside every block the service granted.
func checkInGrants(t testing.TB, svc *rangeclienttest.Service, ids []snowflake.ID) {
	t.Helper()
	idx := rangeclienttest.Index(svc.Grants())
	for _, id := range ids {
		if _, ok := idx.Find(id); !ok {
			t.Fatalf("ID %d (%+v, L=%d) is outside every granted block", id, id.Parts(), segment.Linear(id))
		}
	}
	if a, b, ok := rangeclienttest.Overlaps(svc.Grants()); ok {
		t.Fatalf("service granted overlapping blocks %+v and %+v", a, b)
	}
}

func mustNext(t testing.TB, c *Engine) snowflake.ID {
	t.Helper()
	id, err := c.Next(context.Background())
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	return id
}

// mintAtOnce has every client of clients (per region) mint perClient IDs
// with NextN, all released at the same moment, and returns what client
// clients[r][i] minted at index r*len(clients[0])+i (checkFleet's layout).
func mintAtOnce(t *testing.T, clients [][]*Engine, perClient int) [][]snowflake.ID {
	t.Helper()
	perRegion := len(clients[0])
	out := make([][]snowflake.ID, len(clients)*perRegion)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for r, cs := range clients {
		for i, c := range cs {
			wg.Go(func() {
				<-start
				ids, err := c.NextN(context.Background(), perClient)
				if err != nil {
					t.Errorf("region %d client %d: %v", r, i, err)
				}
				out[r*perRegion+i] = ids
			})
		}
	}
	close(start)
	wg.Wait()
	return out
}

// checkFleet checks the IDs out[r*perRegion+i] that client clients[r][i]
// minted (docs/design.md case 5): every client leased a distinct in-range
// code of its region, each ID decodes to that code with an in-range
// sequence and a millisecond msOK accepts (msOK describes the expected
// range for the message), there are want IDs, and no two are equal.
func checkFleet(t *testing.T, clients [][]*Engine, out [][]snowflake.ID, want int, msOK func(ms int64) bool, msWant string) {
	t.Helper()
	perRegion := len(clients[0])
	var all []snowflake.ID
	for r, cs := range clients {
		workers := map[int]bool{}
		for i, c := range cs {
			li := c.Lease().Lease
			if li.Region != r || li.Worker < 0 || li.Worker > snowflake.MaxWorker || workers[li.Worker] {
				t.Fatalf("region %d client %d leased %+v (duplicate or out of range)", r, i, li)
			}
			workers[li.Worker] = true
			for _, id := range out[r*perRegion+i] {
				p, err := snowflake.Decode(id)
				switch {
				case err != nil:
					t.Fatalf("ID %d: %v", id, err)
				case p.Region != r || p.Worker != li.Worker:
					t.Fatalf("ID %d decodes to %d/%d, leased %d/%d", id, p.Region, p.Worker, r, li.Worker)
				case !msOK(p.Ms):
					t.Fatalf("ID %d has ms %d, want %s", id, p.Ms, msWant)
				case p.Sequence < 0 || p.Sequence > snowflake.MaxSequence:
					t.Fatalf("ID %d sequence %d", id, p.Sequence)
				}
			}
			all = append(all, out[r*perRegion+i]...)
		}
	}
	if len(all) != want {
		t.Fatalf("%d IDs, want %d", len(all), want)
	}
	checkUnique(t, all)
}
