package faultsuite

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/faultsuite/history"
	"github.com/idrange/idrange/snowflake"
)

// replyCall is one call of the scenario's caller to a replica, on the
// history clock.
type replyCall struct {
	source    string // replica and path, e.g. "svc0 MintBatch"
	path      string
	send, ret int64
	ids       []snowflake.ID
	err       error
}

// mintPath is one way a replica hands out IDs outside every history: it
// mints with the replica's own client, whose leases and blocks no history
// records.
type mintPath struct {
	name string
	want int // IDs in a successful reply
	call func(ctx context.Context, r *replica) ([]snowflake.ID, error)
}

// replyTimeout bounds every call of the scenario's caller. A reply that
// returned IDs was therefore minted at most this long before it returned.
const replyTimeout = time.Second

// TestReplicaMintBatchSurvivesLeaseLoss: a caller mints through the three
// paths a replica offers callers without a Go client (the MintBatch RPC,
// HTTP GET /v1/ids and the deprecated Next RPC), alternating between the
// two replicas, whose IDs come from each replica's own rangeclient.
// SIGSTOP all three etcd members past the lease TTL, then SIGCONT them.
// Each replica's minter is a client like any other: it cannot renew, so
// its safety deadline is at most the TTL after the fault, and no reply may
// return IDs after that until etcd is back; after the repair the same
// replica processes mint again by themselves (a new lease, or the old one
// if etcd kept it). Every ID of every reply is in the run's one duplicate
// check with the minter's history (history.Config.Replies), and planted
// duplicates between a reply and the history, and between two paths, must
// fail it.
func TestReplicaMintBatchSurvivesLeaseLoss(t *testing.T) {
	s := newSuite(t, options{minters: 1})
	var ccs []*grpc.ClientConn
	for _, r := range s.replicas {
		cc, err := grpc.NewClient(r.addr(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		defer cc.Close()
		ccs = append(ccs, cc)
	}
	rpc := func(r *replica) idrangev1.RangeServiceClient {
		return idrangev1.NewRangeServiceClient(ccs[replicaIndex(s, r)])
	}
	hc := &http.Client{Timeout: replyTimeout}
	paths := []mintPath{
		{"MintBatch", 100, func(ctx context.Context, r *replica) ([]snowflake.ID, error) {
			p, err := rpc(r).MintBatch(ctx, &idrangev1.MintBatchRequest{Count: 100})
			return ids64(p.GetIds()), err
		}},
		{"HTTP", 100, func(ctx context.Context, r *replica) ([]snowflake.ID, error) {
			return httpMint(ctx, hc, r.httpAddr(), 100)
		}},
		{"Next", 1, func(ctx context.Context, r *replica) ([]snowflake.ID, error) {
			// Deprecated, but it still hands out IDs: its replies are checked too.
			p, err := rpc(r).Next(ctx, &idrangev1.NextRequest{})
			if err != nil {
				return nil, err
			}
			return []snowflake.ID{snowflake.ID(p.GetId())}, nil
		}},
	}

	var (
		mu    sync.Mutex
		calls []replyCall
	)
	snapshot := func() []replyCall { mu.Lock(); defer mu.Unlock(); return append([]replyCall(nil), calls...) }
	okAfter := func(path string, t0 int64) int {
		n := 0
		for _, c := range snapshot() {
			if c.path == path && c.err == nil && c.send > t0 {
				n++
			}
		}
		return n
	}
	everyPath := func(t0 int64, n int) func() bool {
		return func() bool {
			for _, p := range paths {
				if okAfter(p.name, t0) < n {
					return false
				}
			}
			return true
		}
	}
	ctx, stop := context.WithCancel(context.Background())
	var callers sync.WaitGroup
	for _, p := range paths {
		callers.Go(func() { // one caller per path, a call every 20 ms, each bounded
			tick := time.NewTicker(20 * time.Millisecond)
			defer tick.Stop()
			for i := 0; ; i++ {
				r := s.replicas[i%len(s.replicas)]
				cctx, cancel := context.WithTimeout(ctx, replyTimeout)
				c := replyCall{source: r.name + " " + p.name, path: p.name, send: history.Now()}
				c.ids, c.err = p.call(cctx, r)
				cancel()
				c.ret = history.Now()
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
		})
	}
	defer func() { stop(); callers.Wait() }()

	waitFor(t, time.Minute, "every path succeeds 10 times", everyPath(s.mono0, 10))
	k := s.fault("SIGSTOP all three etcd members past the lease TTL (%v)", s.opt.leaseTTL)
	for _, m := range s.members {
		m.p.pause()
	}
	// Each replica's minter renewed at the latest just before k, so its
	// deadline is before k + TTL - its safety margin; stay paused well
	// past k + TTL.
	deadline := k + int64(s.opt.leaseTTL)
	time.Sleep(time.Duration(deadline-history.Now()) + 2*time.Second)
	q := s.mark("SIGCONT the etcd members")
	for _, m := range s.members {
		m.p.resume()
	}
	waitFor(t, time.Minute, "every path succeeds again after the repair", everyPath(q, 5))
	stop()
	callers.Wait()

	all := snapshot()
	closed := map[string]int{}
	var lastBefore, firstAfter int64 = 0, -1
	workers := map[string]map[int]bool{"before": {}, "after": {}}
	for _, c := range all {
		if c.err != nil {
			if c.send > deadline && c.send < q {
				closed[c.path]++
			}
			continue
		}
		want := 0
		for _, p := range paths {
			if p.name == c.path {
				want = p.want
			}
		}
		if len(c.ids) != want {
			t.Fatalf("a successful %s call returned %d IDs, want %d", c.source, len(c.ids), want)
		}
		s.replies = append(s.replies, history.Reply{Source: c.source, Send: c.send, Ret: c.ret, IDs: int64s(c.ids)})
		// Dated by its return, the moment the IDs left the replica: they
		// were minted after ret - replyTimeout, which is past the
		// replica's deadline (k + TTL - its 1 s safety margin) when ret
		// is past k + TTL.
		switch {
		case c.ret > deadline && c.ret < q:
			t.Errorf("%s returned IDs %v after the fault (the replica's deadline was at most %v after it), before etcd came back",
				c.source, time.Duration(c.ret-k).Round(time.Millisecond), s.opt.leaseTTL)
		case c.ret < q:
			lastBefore = max(lastBefore, c.ret)
			workers["before"][c.ids[0].Worker()] = true
		case c.send > q:
			if firstAfter < 0 || c.ret < firstAfter {
				firstAfter = c.ret
			}
			workers["after"][c.ids[0].Worker()] = true
		}
	}
	var refused []string
	for _, p := range paths {
		if closed[p.name] == 0 {
			t.Fatalf("no %s call failed between the replicas' deadline and the repair: the check above proved nothing for it", p.name)
		}
		refused = append(refused, fmt.Sprintf("%s %d", p.name, closed[p.name]))
	}
	res := s.finish()
	if res.rep.ReplyIDs == 0 || res.rep.Replies != len(s.replies) {
		t.Fatalf("the checker saw %d replies with %d IDs, the caller received %d", res.rep.Replies, res.rep.ReplyIDs, len(s.replies))
	}
	checkPlantedReplies(t, s, res)
	f := s.figures(res)
	f.ranOn = time.Duration(lastBefore - k)
	f.recovered = time.Duration(firstAfter - q)
	f.notes += fmt.Sprintf("replica callers: %d IDs in %d replies, calls refused after the deadline bound: %s; last IDs %v after the fault, "+
		"first after the repair %v after it; replica minters' worker codes before %v, after %v "+
		"(their blocks are in no history, so they count as burned grants). ",
		res.rep.ReplyIDs, res.rep.Replies, strings.Join(refused, ", "), f.ranOn.Round(time.Millisecond), f.recovered.Round(time.Millisecond),
		keys(workers["before"]), keys(workers["after"]))
	s.publish(f)
}

// checkPlantedReplies plants, into copies of the run's replies, an ID of
// the minter's history into a MintBatch reply, and separately an ID of a
// Next reply into an HTTP reply: the checker must fail on each with
// history.ErrDuplicate, naming both calls.
func checkPlantedReplies(t *testing.T, s *suite, res result) {
	t.Helper()
	find := func(path string) int {
		for i, r := range s.replies {
			if strings.HasSuffix(r.Source, " "+path) {
				return i
			}
		}
		t.Fatalf("no %s reply to plant into", path)
		return -1
	}
	h := res.hists[0]
	if len(h.Mints) == 0 {
		t.Fatal("the minter handed out nothing to plant")
	}
	for _, tc := range []struct {
		name   string
		into   int   // reply to plant into
		id     int64 // the ID it repeats
		source string
	}{
		{"a MintBatch reply repeats a minter's ID", find("MintBatch"), h.Mints[len(h.Mints)/2].IDs[0], h.Name + " (call returned"},
		{"an HTTP reply repeats a Next reply's ID", find("HTTP"), s.replies[find("Next")].IDs[0], " Next (reply"},
	} {
		cfg := s.checkConfig(res.hwm)
		cfg.Replies = append([]history.Reply(nil), s.replies...)
		r := cfg.Replies[tc.into]
		r.IDs = append(append([]int64(nil), r.IDs[:len(r.IDs)-1]...), tc.id)
		cfg.Replies[tc.into] = r
		rep, err := history.Check(res.hists, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := rep.Err(); !errors.Is(err, history.ErrDuplicate) || rep.Duplicates != 1 ||
			!strings.Contains(err.Error(), tc.source) || !strings.Contains(err.Error(), r.Source+" (reply") {
			t.Fatalf("planted duplicate (%s: %d in %s) not caught and placed: duplicates=%d err=%v",
				tc.name, tc.id, r.Source, rep.Duplicates, err)
		}
		t.Logf("planted duplicate caught (%s): %v", tc.name, rep.Err())
	}
}

func replicaIndex(s *suite, r *replica) int {
	for i, x := range s.replicas {
		if x == r {
			return i
		}
	}
	panic("replica not in the suite")
}

// httpAddrRE finds the HTTP API's address in rangesvc serve's log.
var httpAddrRE = regexp.MustCompile(`msg="http api listening" http=(\S+)`)

// httpAddr is the address of the replica's HTTP API (--http 127.0.0.1:0),
// as its latest start logged it.
func (r *replica) httpAddr() string {
	b, err := os.ReadFile(r.p.logPath)
	if err != nil {
		return ""
	}
	m := httpAddrRE.FindAllSubmatch(b, -1)
	if len(m) == 0 {
		return ""
	}
	return string(m[len(m)-1][1])
}

// httpMint is GET /v1/ids?count=n on addr: {"ids": ["<decimal>", ...]}.
func httpMint(ctx context.Context, hc *http.Client, addr string, n int) ([]snowflake.ID, error) {
	if addr == "" {
		return nil, errors.New("the replica logged no HTTP API address")
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/v1/ids?count="+strconv.Itoa(n), nil)
	if err != nil {
		return nil, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("HTTP %d: %s", resp.StatusCode, body)
	}
	var out struct {
		IDs []string `json:"ids"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("HTTP reply %q: %w", body, err)
	}
	ids := make([]snowflake.ID, len(out.IDs))
	for i, v := range out.IDs {
		x, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return nil, fmt.Errorf("HTTP reply id %q: %w", v, err)
		}
		ids[i] = snowflake.ID(x)
	}
	return ids, nil
}

func ids64(vs []int64) []snowflake.ID {
	out := make([]snowflake.ID, len(vs))
	for i, v := range vs {
		out[i] = snowflake.ID(v)
	}
	return out
}

func int64s(ids []snowflake.ID) []int64 {
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = int64(id)
	}
	return out
}

func keys(m map[int]bool) []int {
	var ks []int
	for k := range m {
		ks = append(ks, k)
	}
	sort.Ints(ks)
	return ks
}
