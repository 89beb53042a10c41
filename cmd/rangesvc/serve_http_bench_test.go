package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/snowflake"
)

// BenchmarkMintBatch: IDs/s one caller gets from a real `rangesvc serve`
// (embedded etcd, loopback) per batch size, over MintBatch on gRPC, over
// GET /v1/ids on HTTP/JSON (body read, not decoded), and from the buffered
// Go client (rangeclient.AppendN) in this process. One op is one call of
// the batch size; ids/s is the figure to compare. docs/tradeoffs.md quotes
// it; rerun with
//
//	go test -run '^$' -bench BenchmarkMintBatch -benchtime 500x -count 3 ./cmd/rangesvc/
//
// A fixed call count keeps every path inside what one worker code may
// mint ahead of the clock (the service's 15 s lead at 4,096 IDs/ms):
// with -benchtime 2s the large Go-client batches run into that cap and
// measure the cap (about 4.1M IDs/s sustained per code), not the path.
//
// The figure is of valid IDs: the first keepIDs IDs of every path and batch
// size are kept (a copy next to a loopback round trip) and checked at the
// end with testenv.CheckIDs: all distinct across the paths, of region 1,
// dated within the run.
func BenchmarkMintBatch(b *testing.B) {
	start := time.Now()
	p := testenv.StartServe(b, testenv.ServeConfig{Region: 1})
	ctx := context.Background()
	cc, err := grpc.NewClient(p.GRPCAddr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		b.Fatal(err)
	}
	defer cc.Close()
	cli := idrangev1.NewRangeServiceClient(cc)
	gc, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{p.GRPCAddr}, Region: 1})
	if err != nil {
		b.Fatal(err)
	}
	defer gc.Close()
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}}
	defer hc.CloseIdleConnections()

	var kept []snowflake.ID // of every path; checked at the end
	var bodies [][]byte     // HTTP responses kept, decoded at the end
	sizes := []int{1, 100, 1000, 10_000}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("grpc/batch=%d", n), func(b *testing.B) {
			keep := keepIDs
			for b.Loop() {
				r, err := cli.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: int64(n)})
				if err != nil || len(r.GetIds()) != n {
					b.Fatalf("MintBatch(%d): %d IDs, %v", n, len(r.GetIds()), err)
				}
				if keep > 0 {
					for _, v := range r.GetIds() {
						kept = append(kept, snowflake.ID(v))
					}
					keep -= n
				}
			}
			idsPerSec(b, n)
		})
	}
	for _, n := range sizes {
		url := fmt.Sprintf("http://%s/v1/ids?count=%d", p.HTTPAddr, n)
		b.Run(fmt.Sprintf("http/batch=%d", n), func(b *testing.B) {
			keep := keepIDs
			var body bytes.Buffer
			for b.Loop() {
				resp, err := hc.Get(url)
				if err != nil {
					b.Fatal(err)
				}
				body.Reset()
				_, err = body.ReadFrom(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != http.StatusOK {
					b.Fatalf("GET %s: %d, %v", url, resp.StatusCode, err)
				}
				if keep > 0 {
					bodies = append(bodies, bytes.Clone(body.Bytes()))
					keep -= n
				}
			}
			idsPerSec(b, n)
		})
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("goclient/batch=%d", n), func(b *testing.B) {
			keep := keepIDs
			buf := make([]snowflake.ID, 0, n)
			for b.Loop() {
				var err error
				if buf, err = gc.AppendN(ctx, buf[:0], n); err != nil {
					b.Fatal(err)
				}
				if keep > 0 {
					kept = append(kept, buf...)
					keep -= n
				}
			}
			idsPerSec(b, n)
		})
	}
	for _, body := range bodies {
		var r struct {
			IDs []string `json:"ids"`
		}
		if err := json.Unmarshal(body, &r); err != nil {
			b.Fatalf("GET /v1/ids: %v in %.200q", err, body)
		}
		for _, s := range r.IDs {
			id, err := snowflake.Parse(s)
			if err != nil {
				b.Fatalf("GET /v1/ids: %v", err)
			}
			kept = append(kept, id)
		}
	}
	testenv.CheckIDs(b, kept, 1, start)
}

// keepIDs is how many IDs BenchmarkMintBatch keeps of each path and batch
// size (at least one call's) for its check: 1 MiB of them.
const keepIDs = 1 << 17

func idsPerSec(b *testing.B, batch int) {
	if s := b.Elapsed().Seconds(); s > 0 {
		b.ReportMetric(float64(b.N)*float64(batch)/s, "ids/s")
	}
}
