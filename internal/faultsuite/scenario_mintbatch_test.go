package faultsuite

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/history"
	"github.com/idrange/idrange/snowflake"
)

// batchCall is one MintBatch call of the scenario's caller, on the
// history clock.
type batchCall struct {
	send, ret int64
	ids       []snowflake.ID
	err       error
}

// TestReplicaMintBatchSurvivesLeaseLoss: a caller mints through a
// replica's MintBatch RPC (the product API for non-Go callers), whose IDs
// come from the replica's own rangeclient. SIGSTOP all three etcd members
// past the lease TTL, then SIGCONT them. The replica's minter is a client
// like any other: it cannot renew, so its safety deadline is at most the
// TTL after the fault, and no call sent after that may return IDs until
// etcd is back; after the repair the same replica process mints again by
// itself (a new lease, or the old one if etcd kept it).
func TestReplicaMintBatchSurvivesLeaseLoss(t *testing.T) {
	s := newSuite(t, options{minters: 1})
	svc := s.replicas[0]
	cc, err := grpc.NewClient(svc.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	cli := idrangev1.NewRangeServiceClient(cc)

	var (
		mu    sync.Mutex
		calls []batchCall
	)
	snapshot := func() []batchCall { mu.Lock(); defer mu.Unlock(); return append([]batchCall(nil), calls...) }
	okAfter := func(t0 int64) int {
		n := 0
		for _, c := range snapshot() {
			if c.err == nil && c.send > t0 {
				n++
			}
		}
		return n
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { // one caller, 100 IDs every 20 ms, each call bounded
		defer close(done)
		tick := time.NewTicker(20 * time.Millisecond)
		defer tick.Stop()
		for {
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			c := batchCall{send: history.Now()}
			r, err := cli.MintBatch(cctx, &idrangev1.MintBatchRequest{Count: 100})
			cancel()
			c.ret, c.err = history.Now(), err
			for _, id := range r.GetIds() {
				c.ids = append(c.ids, snowflake.ID(id))
			}
			if ctx.Err() != nil {
				return
			}
			mu.Lock()
			calls = append(calls, c)
			mu.Unlock()
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stop(); <-done }()

	waitFor(t, time.Minute, "MintBatch succeeds 20 times", func() bool { return okAfter(s.mono0) >= 20 })
	k := s.fault("SIGSTOP all three etcd members past the lease TTL (%v)", s.opt.leaseTTL)
	for _, m := range s.members {
		m.p.pause()
	}
	// The replica's minter renewed at the latest just before k, so its
	// deadline is before k + TTL; stay paused well past that.
	deadline := k + int64(s.opt.leaseTTL)
	time.Sleep(time.Duration(deadline-history.Now()) + 2*time.Second)
	q := s.mark("SIGCONT the etcd members")
	for _, m := range s.members {
		m.p.resume()
	}
	waitFor(t, time.Minute, "MintBatch succeeds again after the repair", func() bool { return okAfter(q) >= 5 })
	stop()
	<-done

	all := snapshot()
	seen := map[snowflake.ID]bool{}
	var closed int
	var lastBefore, firstAfter int64 = 0, -1
	workers := map[string]map[int]bool{"before": {}, "after": {}}
	for _, c := range all {
		if c.err != nil {
			if c.send > deadline && c.send < q {
				closed++
			}
			continue
		}
		if len(c.ids) != 100 {
			t.Fatalf("a successful MintBatch(100) returned %d IDs", len(c.ids))
		}
		for _, id := range c.ids {
			if seen[id] {
				t.Fatalf("duplicate ID %d", id)
			}
			seen[id] = true
			if _, err := snowflake.Decode(id); err != nil || id.Region() != region {
				t.Fatalf("ID %d: region %d, want %d: %v", id, id.Region(), region, err)
			}
		}
		switch {
		case c.send > deadline && c.ret < q:
			t.Errorf("MintBatch sent %v after the fault (the minter's deadline was at most %v after it) returned IDs before etcd came back",
				time.Duration(c.send-k).Round(time.Millisecond), s.opt.leaseTTL)
		case c.ret < q:
			lastBefore = max(lastBefore, c.ret)
			workers["before"][c.ids[0].Worker()] = true
		case c.send > q:
			if firstAfter < 0 {
				firstAfter = c.ret
			}
			workers["after"][c.ids[0].Worker()] = true
		}
	}
	if closed == 0 {
		t.Fatal("no MintBatch call failed between the minter's deadline and the repair: the check above proved nothing")
	}
	res := s.finish()
	f := s.figures(res)
	f.ranOn = time.Duration(lastBefore - k)
	f.recovered = time.Duration(firstAfter - q)
	f.notes += fmt.Sprintf("MintBatch caller: %d IDs, %d calls refused after the deadline bound, last IDs %v after the fault, "+
		"first after the repair %v after it; replica minter's worker codes before %v, after %v "+
		"(its blocks are in no history, so they count as burned grants). ",
		len(seen), closed, f.ranOn.Round(time.Millisecond), f.recovered.Round(time.Millisecond),
		keys(workers["before"]), keys(workers["after"]))
	s.publish(f)
}

func keys(m map[int]bool) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}
