package localregion

import (
	"context"
	"os"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
)

// rangeclientMinter is the minter rangesvc serve uses: a client engine
// over the replica's own store.
func rangeclientMinter(ctx context.Context, a segment.Allocator, region int) (mintpool.Minter, error) {
	return engine.New(ctx, engine.Config{Allocator: a, Region: region, Owner: "rangesvc/next-rpc"})
}

// A region started outside a test helper serves the gRPC API on loopback,
// counts the store's writes, serves Next only while enabled, and closes
// (twice) without leaking its etcd.
func TestRegionServesAndCounts(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	r, err := Start(ctx, Config{Region: 2, NextMinter: rangeclientMinter})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()

	cc, err := grpc.NewClient(r.Addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	a := wire.NewAllocator(cc)
	l, err := a.Acquire(ctx, 2, "region-test")
	if err != nil {
		t.Fatal(err)
	}
	for n := range 3 {
		if _, err := a.Allocate(ctx, l, 100+n); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := a.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := a.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	c := r.Counts()
	if c.Acquires != 1 || c.Grants != 3 || c.GrantedUnits != 100+101+102 || c.Renewals != 1 || c.Releases != 1 {
		t.Fatalf("counts %+v", c)
	}
	if c.Writes() != 5 || r.EtcdWrites() != 5 {
		t.Fatalf("writes %d/%d, want 5 (1 acquire + 3 grants + 1 release)", c.Writes(), r.EtcdWrites())
	}
	if c.Txns != 5 {
		t.Fatalf("write Txns %d, want 5 (one per sequential write)", c.Txns)
	}
	lat := r.RPCLatency()
	if lat["AllocateBlock"].Count() != 3 || lat["AcquireLease"].Count() != 1 || lat["RenewLease"].Max() <= 0 {
		t.Fatalf("server-side latency not recorded per method: %v", lat)
	}
	if d := c.Sub(Counts{Grants: 1}); d.Grants != 2 {
		t.Fatalf("Sub: %+v", d)
	}

	next := idrangev1.NewRangeServiceClient(cc)
	if _, err := next.Next(ctx, &idrangev1.NextRequest{}); err == nil {
		t.Fatal("Next answered before EnableNext")
	}
	stop, err := r.EnableNext(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.EnableNext(ctx); err == nil {
		t.Fatal("EnableNext twice accepted")
	}
	a1, err := next.Next(ctx, &idrangev1.NextRequest{})
	if err != nil {
		t.Fatal(err)
	}
	a2, err := next.Next(ctx, &idrangev1.NextRequest{})
	if err != nil {
		t.Fatal(err)
	}
	if a2.GetId() <= a1.GetId() || (a1.GetId()>>20)&3 != 2 {
		t.Fatalf("Next gave %d then %d (want increasing, region 2)", a1.GetId(), a2.GetId())
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	if _, err := next.Next(ctx, &idrangev1.NextRequest{}); err == nil {
		t.Fatal("Next answered after stop")
	}
	dir := r.Etcd().Dir()
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := os.Stat(dir); err == nil {
		t.Fatalf("temporary etcd dir %s left behind", dir)
	}
}

func TestStartRejectsBadRegion(t *testing.T) {
	if _, err := Start(context.Background(), Config{Region: 4}); err == nil {
		t.Fatal("region 4 accepted")
	}
}
