package service

import (
	"context"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/internal/server/mintpool"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

type countingMinter struct {
	next   atomic.Int64
	closed atomic.Bool
}

func (c *countingMinter) AppendN(_ context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	for range n {
		dst = append(dst, snowflake.ID(c.next.Add(1)))
	}
	return dst, nil
}
func (c *countingMinter) Close() error { c.closed.Store(true); return nil }
func (c *countingMinter) Carve(context.Context, carve.Request) (segment.Block, error) {
	return segment.Block{}, carve.ErrNotCarver
}

// MintBatch hands out exactly count IDs from the replica's minter for every
// count in 1..MaxMintBatch, and counts them.
func TestMintBatch(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	inner := &countingMinter{}
	f.svc.SetMinter(inner)
	var want float64
	for _, n := range []int64{1, 2, 1000, MaxMintBatch} {
		r, err := f.cli.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: n})
		if err != nil {
			t.Fatalf("MintBatch(%d): %v", n, err)
		}
		if int64(len(r.GetIds())) != n {
			t.Fatalf("MintBatch(%d) returned %d IDs", n, len(r.GetIds()))
		}
		seen := make(map[int64]bool, n)
		for _, id := range r.GetIds() {
			if id <= 0 || seen[id] {
				t.Fatalf("MintBatch(%d): ID %d repeated or not positive", n, id)
			}
			seen[id] = true
		}
		want += float64(n)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().MintedIDs); got != want {
		t.Fatalf("minted_ids_total = %v, want %v", got, want)
	}
}

// A count outside 1..MaxMintBatch is InvalidArgument naming the field and
// the limit, and it mints nothing: the minter is not even opened.
func TestMintBatchBadCount(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	opened := 0
	pool, err := mintpool.New(mintpool.Config{Open: func(context.Context) (mintpool.Minter, error) {
		opened++
		return &countingMinter{}, nil
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	f.svc.SetMinter(pool)
	for _, n := range []int64{0, -1, MaxMintBatch + 1, 1_000_000_000, -1 << 63} {
		_, err := f.cli.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: n})
		if status.Code(err) != codes.InvalidArgument {
			t.Fatalf("MintBatch(%d): %v, want InvalidArgument", n, err)
		}
		msg := status.Convert(err).Message()
		if !strings.HasPrefix(msg, "count: ") || !strings.Contains(msg, strconv.Itoa(MaxMintBatch)) {
			t.Errorf("MintBatch(%d): message %q does not name count and its limit %d", n, msg, MaxMintBatch)
		}
	}
	if opened != 0 {
		t.Fatalf("bad counts opened the minter %d times", opened)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().MintedIDs); got != 0 {
		t.Fatalf("minted_ids_total = %v after bad counts only", got)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().Errors.WithLabelValues("MintBatch", "InvalidArgument")); got != 5 {
		t.Fatalf("errors_total{MintBatch,InvalidArgument} = %v, want 5", got)
	}
}

// A batch is all or nothing: a minter failing part way gives the caller an
// error and none of the IDs minted before it; the replica's own lease
// troubles are Unavailable (the caller holds no lease), never
// FailedPrecondition.
func TestMintBatchErrors(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	for _, tc := range minterErrors {
		n := 0
		f.svc.SetMinter(minterFunc(func(context.Context) (snowflake.ID, error) {
			if n++; n > 10 {
				return 0, tc.err
			}
			return snowflake.ID(n), nil
		}))
		r, err := f.cli.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: 100})
		if status.Code(err) != tc.code || len(r.GetIds()) != 0 {
			t.Errorf("minter error %v after 10 IDs: %d IDs, code %v, want none and %v", tc.err, len(r.GetIds()), status.Code(err), tc.code)
		}
	}
	if got := testutil.ToFloat64(f.svc.Metrics().MintedIDs); got != 0 {
		t.Fatalf("minted_ids_total = %v after failed batches only", got)
	}
	f.svc.SetMinter(nil)
	if _, err := f.cli.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: 1}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("MintBatch without a minter: %v, want Unimplemented", err)
	}
}
