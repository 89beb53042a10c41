package faultsuite

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/faultsuite/faultproxy"
	"github.com/idrange/idrange/internal/faultsuite/history"
	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/etcdstore"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Timings of the harness. The raft timings follow the house rule for a
// shared 2-core machine; with them etcd's minimum lease TTL is
// 3/2 x election ticks x tick = 3 s, so the suite asks for 4 s.
const (
	tickMs     = 100
	electionMs = 2000
	region     = 1

	defaultLeaseTTL = 4 * time.Second
	defaultMargin   = time.Second

	startTimeout = 90 * time.Second // first start of a process on a loaded box
	stopTimeout  = 20 * time.Second
)

var (
	etcdReadyRE     = regexp.MustCompile(`^READY (\S+)`)
	rangesvcReadyRE = regexp.MustCompile(`msg=listening grpc=(\S+)`)
	minterReadyRE   = regexp.MustCompile(`^READY (\S+) (\d+)`)
)

// options shape one scenario's deployment.
type options struct {
	minters  int           // client processes (default 3)
	rate     int           // IDs/s per minter (default 4000)
	batch    int           // IDs per call (default 40)
	refill   time.Duration // minter --refill-interval (0: rangeclient's default, 1 s)
	leaseTTL time.Duration // rangesvc --lease-ttl (default 4 s)
	maxLead  time.Duration // rangesvc --max-lead (0: its default, 15 s)
	margin   time.Duration // minter --safety-margin (default 1 s)
	// clientDefaults runs the minters' clients on rangeclient's defaults:
	// no --safety-margin or --refill-interval is passed (margin and refill
	// are ignored), so the scenario sees what a new user's client does.
	clientDefaults bool
	// clockBack and clockAhead are the furthest the scenario moves a
	// service clock back and forward (replica.setClock): they widen the
	// time bound (timeBound) and the run's timestamp window by as much.
	clockBack, clockAhead time.Duration
	// mtls runs replicas and minters over mutual TLS (mtls_test.go).
	mtls bool
	// sharedMinters are started after the minters, with --codes 0: they
	// mint on the shared path (issue 27) while their rate stays below
	// rangeclient.DedicatedRate.
	sharedMinters int
	// timeBound holds every ID to the time bound users rely on
	// (history.Config.MaxBehind 1 s, MaxAhead the service's max lead),
	// widened by clockBack and clockAhead in runs that move a service clock.
	timeBound bool
}

// pacing is the time between the starts of two minting calls of one minter
// at its steady rate: cmd/minter's interval, batch / rate.
func (o options) pacing() time.Duration {
	return time.Duration(int64(time.Second) * int64(o.batch) / int64(o.rate))
}

func (o options) withDefaults() options {
	if o.minters == 0 {
		o.minters = 3
	}
	if o.rate == 0 {
		o.rate = 4000 * soakRateFactor
	}
	if o.batch == 0 {
		o.batch = 40
	}
	if o.leaseTTL == 0 {
		o.leaseTTL = defaultLeaseTTL
	}
	if o.margin == 0 {
		o.margin = defaultMargin
	}
	return o
}

// suite is one scenario's world: a 3-member etcd cluster, two rangesvc
// replicas (each reaching every member through its own faultproxy), and
// minter processes, all on loopback, all killed at the end of the test.
type suite struct {
	t      *testing.T
	name   string
	dir    string
	opt    options
	b      binaries
	start  time.Time
	mono0  int64
	faults int
	notes  []string

	members  []*member
	cli      *clientv3.Client   // straight to the members, for the test's own reads
	store    *store.Store       // test-held leases (no grants)
	keys     *etcdstore.Storage // key layout
	replicas []*replica
	minters  []*minter
	// corruptOK are values the corruption scenario planted in HWM keys on
	// purpose; the replay skips them (they were repaired before the check).
	corruptOK map[string]bool
	// pki holds the certificates of an options.mtls deployment.
	pki *suitePKI
	// replies are the IDs the scenario's own calls received from the
	// replicas (MintBatch, HTTP, Next): the checker puts them in the one
	// duplicate check with every minter's history.
	replies []history.Reply
}

type member struct {
	name, dir            string
	clientPort, peerPort int
	p                    *proc
}

func (m *member) clientAddr() string { return fmt.Sprintf("127.0.0.1:%d", m.clientPort) }

type replica struct {
	s         *suite
	name      string
	port      int
	proxies   []*faultproxy.Proxy // one per etcd member
	clockFile string
	p         *proc
}

func (r *replica) addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

type minter struct {
	s    *suite
	name string
	path string
	p    *proc
	tail *history.Tail
}

// newSuite starts everything and returns once every minter is minting.
func newSuite(t *testing.T, opt options) *suite {
	t.Helper()
	s := &suite{t: t, name: t.Name(), dir: t.TempDir(), opt: opt.withDefaults(), b: bins(t), start: time.Now(), mono0: history.Now()}
	if s.opt.mtls {
		s.pki = newSuitePKI(t, s.dir)
	}
	s.startCluster()
	for i := range 2 {
		s.addReplica(fmt.Sprintf("svc%d", i))
	}
	for _, r := range s.replicas {
		r.p.waitReady(startTimeout)
	}
	for range s.opt.minters {
		s.addMinter()
	}
	for range s.opt.sharedMinters {
		s.addMinter("--codes", "0")
	}
	s.logf("deployment up: 3 etcd members, %d replicas, %d minters (%d on the shared path) at %d IDs/s each",
		len(s.replicas), len(s.minters), s.opt.sharedMinters, s.opt.rate)
	return s
}

// since is a history time as an offset from the suite's start, for logs.
func (s *suite) since(mono int64) time.Duration {
	return time.Duration(mono - s.mono0).Round(time.Millisecond)
}

func (s *suite) logf(format string, args ...any) {
	s.t.Helper()
	s.t.Logf("[%v] %s", s.since(history.Now()), fmt.Sprintf(format, args...))
}

// fault records that a fault was injected now and returns the time.
func (s *suite) fault(format string, args ...any) int64 {
	s.t.Helper()
	s.faults++
	now := history.Now()
	s.t.Logf("[%v] FAULT %d: %s", s.since(now), s.faults, fmt.Sprintf(format, args...))
	return now
}

// mark logs a non-fault event (a repair) and returns the time.
func (s *suite) mark(format string, args ...any) int64 {
	s.t.Helper()
	now := history.Now()
	s.t.Logf("[%v] %s", s.since(now), fmt.Sprintf(format, args...))
	return now
}

// ---- etcd ----

func (s *suite) startCluster() {
	s.t.Helper()
	s.members = make([]*member, 3)
	var initial []string
	for i := range s.members {
		m := &member{name: fmt.Sprintf("etcd%d", i), dir: filepath.Join(s.dir, fmt.Sprintf("etcd%d", i)),
			clientPort: freePort(s.t), peerPort: freePort(s.t)}
		s.members[i] = m
		initial = append(initial, fmt.Sprintf("%s=http://127.0.0.1:%d", m.name, m.peerPort))
	}
	for _, m := range s.members {
		args := []string{"--name", m.name, "--data-dir", m.dir,
			"--client-url", "http://" + m.clientAddr(), "--peer-url", fmt.Sprintf("http://127.0.0.1:%d", m.peerPort),
			"--initial-cluster", strings.Join(initial, ","), "--cluster-state", "new",
			"--tick-ms", strconv.Itoa(tickMs), "--election-ms", strconv.Itoa(electionMs), "--exit-on-stdin-eof"}
		m.p = newProc(s.t, m.name, s.b.etcdmember, args, nil, s.dir, etcdReadyRE)
		m.p.start()
	}
	for _, m := range s.members {
		m.p.waitReady(startTimeout)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: s.endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		s.t.Fatal(err)
	}
	s.t.Cleanup(func() { cli.Close() })
	s.cli = cli
	stg, err := etcdstore.New(cli, etcdstore.Config{})
	if err != nil {
		s.t.Fatal(err)
	}
	st, err := store.New(stg, store.Config{LeaseTTL: time.Minute})
	if err != nil {
		s.t.Fatal(err)
	}
	s.store, s.keys = st, stg
	s.waitEtcd(startTimeout)
}

func (s *suite) endpoints() []string {
	var eps []string
	for _, m := range s.members {
		eps = append(eps, m.clientAddr())
	}
	return eps
}

// waitEtcd waits until the cluster commits a write.
func (s *suite) waitEtcd(timeout time.Duration) {
	s.t.Helper()
	deadline := time.Now().Add(timeout)
	var err error
	for time.Now().Before(deadline) {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_, err = s.cli.Put(ctx, "/faultsuite/probe", time.Now().String())
		cancel()
		if err == nil {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatalf("etcd cluster not writable within %v: %v", timeout, err)
}

// leader returns the index of the member that leads the cluster.
func (s *suite) leader() int {
	s.t.Helper()
	for range 50 {
		for i, m := range s.members {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			st, err := s.cli.Status(ctx, m.clientAddr())
			cancel()
			if err == nil && st.Leader != 0 && st.Leader == st.Header.MemberId {
				return i
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("no etcd leader found")
	return -1
}

// ---- rangesvc replicas ----

func (s *suite) addReplica(name string) *replica {
	s.t.Helper()
	r := &replica{s: s, name: name, port: freePort(s.t), clockFile: filepath.Join(s.dir, name+".clock")}
	var eps []string
	for _, m := range s.members {
		px, err := faultproxy.New(m.clientAddr())
		if err != nil {
			s.t.Fatal(err)
		}
		s.t.Cleanup(func() { px.Close() })
		r.proxies = append(r.proxies, px)
		eps = append(eps, px.Addr())
	}
	if err := os.WriteFile(r.clockFile, []byte("0s\n"), 0o644); err != nil {
		s.t.Fatal(err)
	}
	args := []string{"serve", "--region", strconv.Itoa(region), "--listen", r.addr(), "--metrics", "127.0.0.1:0", "--http", "127.0.0.1:0",
		"--etcd", strings.Join(eps, ","), "--init-region", "--lease-ttl", s.opt.leaseTTL.String(),
		"--etcd-timeout", "2s", "--shutdown-timeout", "3s", "--log-level", "info",
		"--fault-clock-file", r.clockFile,
		// The checker replays every HWM value from etcd's history after the
		// run: keep it (a soak scenario outlasts the default retention).
		"--compaction-interval", "0"}
	if s.opt.maxLead > 0 {
		args = append(args, "--max-lead", s.opt.maxLead.String())
	}
	args = append(args, s.pki.replicaArgs()...)
	r.p = newProc(s.t, name, s.b.rangesvc, args, nil, s.dir, rangesvcReadyRE)
	r.p.start()
	s.replicas = append(s.replicas, r)
	return r
}

func (s *suite) targets() string {
	var ts []string
	for _, r := range s.replicas {
		ts = append(ts, r.addr())
	}
	return strings.Join(ts, ",")
}

// setClock moves the replica's service clock to offset d (TEST-ONLY hook of
// rangesvc serve: --fault-clock-file, re-read on SIGUSR1) and waits until
// the replica logged that it applied it.
func (r *replica) setClock(d time.Duration) {
	r.s.t.Helper()
	if err := os.WriteFile(r.clockFile, []byte(d.String()+"\n"), 0o644); err != nil {
		r.s.t.Fatal(err)
	}
	applied := func() int {
		b, _ := os.ReadFile(r.p.logPath)
		return strings.Count(string(b), "service clock offset set")
	}
	before := applied()
	r.p.signal(sigUSR1)
	waitFor(r.s.t, 10*time.Second, r.name+" applies the clock offset", func() bool { return applied() > before })
}

func (r *replica) eachProxy(f func(p *faultproxy.Proxy)) {
	for _, p := range r.proxies {
		f(p)
	}
}

// ---- minters ----

// addMinter starts one more minter, with extra flags for cmd/minter.
func (s *suite) addMinter(extra ...string) *minter {
	s.t.Helper()
	name := fmt.Sprintf("m%d", len(s.minters))
	m := &minter{s: s, name: name, path: filepath.Join(s.dir, name+".hist")}
	m.tail = history.NewTail(m.path)
	args := []string{"--targets", s.targets(), "--region", strconv.Itoa(region), "--name", name, "--history", m.path,
		"--rate", strconv.Itoa(s.opt.rate), "--batch", strconv.Itoa(s.opt.batch),
		"--exit-on-stdin-eof", "--duration", "30m"}
	args = append(args, s.pki.minterArgs(name)...)
	args = append(args, extra...)
	if !s.opt.clientDefaults {
		args = append(args, "--safety-margin", s.opt.margin.String())
		if s.opt.refill > 0 {
			args = append(args, "--refill-interval", s.opt.refill.String())
		}
	}
	m.p = newProc(s.t, name, s.b.minter, args, nil, s.dir, minterReadyRE)
	m.p.start()
	m.p.waitReady(startTimeout)
	s.minters = append(s.minters, m)
	return m
}

// progress is the minter's history so far.
func (m *minter) progress() *history.History {
	m.s.t.Helper()
	h, err := m.tail.Poll()
	if err != nil {
		m.s.t.Fatalf("%s: %v", m.name, err)
	}
	return h
}

// currentCode is the worker code of the minter's latest lease.
func (m *minter) currentCode() (worker int, token int64) {
	m.s.t.Helper()
	h := m.progress()
	if len(h.Leases) == 0 {
		m.s.t.Fatalf("%s holds no lease", m.name)
	}
	l := h.Leases[len(h.Leases)-1]
	return l.Worker, l.Token
}

// waitFor polls cond every 50 ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting until %s", timeout, what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitMinting waits until every given minter (default: all) handed out at
// least n IDs in calls that started at or after t.
func (s *suite) waitMinting(t int64, n int64, timeout time.Duration, ms ...*minter) {
	s.t.Helper()
	if len(ms) == 0 {
		ms = s.minters
	}
	for _, m := range ms {
		waitFor(s.t, timeout, fmt.Sprintf("%s mints %d IDs after %v", m.name, n, s.since(t)), func() bool {
			return m.progress().MintedBetween(t, 1<<62) >= n
		})
	}
}

// hold lets the load run for d (scaled up in soak mode).
func (s *suite) hold(d time.Duration) { time.Sleep(time.Duration(float64(d) * soakHoldFactor)) }

// ---- the check ----

// result is what finish found.
type result struct {
	rep   history.Report
	hists []*history.History
	hwm   map[int][]int64
}

// finish stops the minters cleanly, reads every history and etcd's HWM
// record, runs the checker and fails the test on any violation (collect).
func (s *suite) finish() result {
	s.t.Helper()
	res, err := s.collect()
	if err != nil {
		s.t.Fatal(err)
	}
	return res
}

// collect is finish without failing the test: the planted controls call it
// to show that the run fails. The error joins everything that went wrong.
func (s *suite) collect() (result, error) {
	s.t.Helper()
	var errs []error
	errs = append(errs, s.stopMinters())
	var res result
	for _, m := range s.minters {
		h, err := history.ReadFile(m.path)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", m.name, err))
			continue
		}
		res.hists = append(res.hists, h)
	}
	if len(res.hists) < len(s.minters) {
		return res, errors.Join(errs...) // a partial set proves nothing
	}
	hwm, err := s.replayHWM()
	if err != nil {
		return res, errors.Join(append(errs, fmt.Errorf("replay of the high-water marks from etcd: %w", err))...)
	}
	res.hwm = hwm
	rep, err := history.Check(res.hists, s.checkConfig(hwm))
	if err != nil {
		return res, errors.Join(append(errs, err)...)
	}
	res.rep = rep
	s.logf("check: %s", rep.Summary())
	if err := rep.Err(); err != nil {
		errs = append(errs, fmt.Errorf("CHECK FAILED: %w", err))
	}
	if err := rep.FreshnessErr(); err != nil {
		// It cannot duplicate an ID, but it breaks the time bound clients
		// rely on (a block is dropped at its validity): a failure.
		errs = append(errs, fmt.Errorf("FRESHNESS FAILED: %w", err))
	}
	if !rep.HWMChecked || rep.HWMSteps == 0 {
		errs = append(errs, errors.New("the etcd high-water-mark record was not checked"))
	}
	return res, errors.Join(errs...)
}

// errMinterExit: a minter did not mint until the scenario asked it to stop
// and then exit 0. It crashed, stopped by itself (cmd/minter exits 1 when
// its history cannot record what it hands out) or hung: IDs it handed out
// may be missing from its history, so the run proves nothing.
var errMinterExit = errors.New("a minter did not run to the end and exit 0")

// stopMinters stops every minter still running (SIGCONT first if it is
// stopped) and checks every minter's exit: one error, wrapping
// errMinterExit with its exit status and the tail of its stderr, per
// minter that had exited before it was asked to, exited non-zero, or did
// not exit within stopTimeout.
func (s *suite) stopMinters() error {
	errs := make([]error, len(s.minters))
	var wg sync.WaitGroup
	for i, m := range s.minters {
		if m.p.exited() {
			errs[i] = fmt.Errorf("%w: %s exited before the end of the scenario (%s)\n%s",
				errMinterExit, m.name, m.p.exitStatus(), m.p.logTail(40))
			continue
		}
		if m.p.isStopped() {
			m.p.resume()
		}
		wg.Go(func() {
			if err := m.p.stop(stopTimeout); err != nil {
				errs[i] = fmt.Errorf("%w: %w", errMinterExit, err)
			}
		})
	}
	wg.Wait()
	return errors.Join(errs...)
}

func (s *suite) checkConfig(hwm map[int][]int64) history.Config {
	cfg := history.Config{
		Region:    region,
		NotBefore: s.start.Add(-2 * time.Second),
		NotAfter:  time.Now().Add(segment.DefaultMaxLead + 2*time.Second + s.opt.clockAhead),
		HWM:       hwm,
		Replies:   s.replies,
	}
	if s.opt.timeBound {
		cfg.MaxBehind, cfg.MaxAhead = maxBehind+s.opt.clockBack, segment.DefaultMaxLead+s.opt.clockAhead
	}
	return cfg
}

// maxBehind is how far behind the moment it is handed out an ID's
// timestamp may be (docs/design.md; issue 27 keeps it for shared runs).
const maxBehind = time.Second

// replayHWM reads every value each HWM key of the region ever held, in
// revision order, from etcd's MVCC history (a watch from revision 1; the
// members run without compaction). A deleted or undecodable HWM value is an
// error: HWMs are never deleted and only this code writes them.
func (s *suite) replayHWM() (map[int][]int64, error) {
	keys := map[string]int{}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		keys[s.keys.HighWaterKey(region, w)] = w
	}
	prefix := commonPrefix(s.keys.HighWaterKey(region, 0), s.keys.HighWaterKey(region, snowflake.MaxWorker))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cur, err := s.cli.Get(ctx, prefix, clientv3.WithPrefix())
	if err != nil {
		return nil, err
	}
	out := map[int][]int64{}
	var last int64
	for _, kv := range cur.Kvs {
		last = max(last, kv.ModRevision)
	}
	if last == 0 {
		return out, nil
	}
	// A group commit puts several codes' HWMs at one revision; etcd delivers
	// all events of a revision in one response, so the last revision is
	// complete once the response holding it has been read whole.
	wch := s.cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithRev(1))
	for resp := range wch {
		if err := resp.Err(); err != nil {
			return nil, err
		}
		done := false
		for _, ev := range resp.Events {
			w, ok := keys[string(ev.Kv.Key)]
			if !ok {
				return nil, fmt.Errorf("unexpected key %q under the HWM prefix", ev.Kv.Key)
			}
			if ev.Type != clientv3.EventTypePut {
				return nil, fmt.Errorf("HWM key %q was deleted at revision %d", ev.Kv.Key, ev.Kv.ModRevision)
			}
			done = done || ev.Kv.ModRevision >= last
			v, err := store.DecodeHighWater(ev.Kv.Value)
			if err != nil {
				if s.corruptOK[string(ev.Kv.Value)] {
					continue // planted by the corruption scenario, repaired since
				}
				return nil, fmt.Errorf("revision %d: %w", ev.Kv.ModRevision, err)
			}
			out[w] = append(out[w], v)
		}
		if done {
			return out, nil
		}
	}
	return nil, fmt.Errorf("watch ended before revision %d: %v", last, ctx.Err())
}

func commonPrefix(a, b string) string {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return a[:n]
}
