package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// sharedFloodFor is how long TestSharedClientIDFloodMemory floods.
const sharedFloodFor = 30 * time.Second

// One identity sending a fresh client_id with every shared-run request for
// 30 s grows a real replica's memory by less than 50 MB: the client_ids it
// remembers (for shared_clients) are bounded per identity, the oldest
// going first. Before the bound (a map of up to 1,000,000 entries) the
// same flood took a replica from 35 to 538 MB.
func TestSharedClientIDFloodMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	t.Parallel()
	srv := testenv.StartServe(t, testenv.ServeConfig{Region: 1})
	cli := idrangev1.NewRangeServiceClient(regiontest.Dial(t, srv.GRPCAddr))
	ctx, cancel := context.WithTimeout(context.Background(), sharedFloodFor)
	defer cancel()
	call := func(id string) error {
		_, err := cli.AllocateShared(context.Background(), &idrangev1.AllocateSharedRequest{Count: 1, ClientId: id})
		return err
	}
	// Warm up (the minter's first blocks, gRPC's buffers), then measure.
	for i := range 1000 {
		if err := call(fmt.Sprintf("warm-%d", i%10)); err != nil {
			t.Fatal(err)
		}
	}
	before := rss(t, srv.Cmd.Process.Pid)
	var sent atomic.Int64
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			for i := 0; ctx.Err() == nil; i++ {
				// 128 bytes, the most a client_id may hold.
				id := fmt.Sprintf("flood-%d-%d-%s", w, i, strings.Repeat("x", 128))[:128]
				if err := call(id); err != nil && ctx.Err() == nil {
					t.Errorf("AllocateShared: %v", err)
					return
				}
				sent.Add(1)
			}
		})
	}
	wg.Wait()
	after := rss(t, srv.Cmd.Process.Pid)
	info, err := cli.GetReplicaInfo(context.Background(), &idrangev1.GetReplicaInfoRequest{})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("%d fresh client_ids in %v; replica RSS %d -> %d MB; %d client_ids remembered",
		sent.Load(), sharedFloodFor, before>>20, after>>20, info.GetSharedClients())
	if sent.Load() < 20_000 {
		t.Fatalf("only %d requests in %v: the flood did not pass the per-identity bound", sent.Load(), sharedFloodFor)
	}
	if grew := after - before; grew >= 50<<20 {
		t.Errorf("replica memory grew by %d MB under the flood, want under 50 MB", grew>>20)
	}
	if n := info.GetSharedClients(); n > 10_000+10 { // the flood's and the warm-up's
		t.Errorf("%d client_ids remembered for one identity, want at most 10,000", n)
	}
}

// rss is process pid's resident set size, in bytes (Linux /proc).
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			if err != nil {
				t.Fatalf("VmRSS line %q: %v", line, err)
			}
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
