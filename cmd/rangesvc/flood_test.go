//go:build linux

package main

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/tlsfiles"
)

// Acceptance (issue 24, "a flood test"): a replica on its embedded etcd,
// serving mutual TLS, with its open-file limit at 256 (soft and hard). A
// rangeclient connects first and mints throughout; then each port (gRPC,
// HTTP API, metrics) gets more idle TCP connections than the process may
// hold files, plus half-open ones that send the start of a TLS
// ClientHello, and an authenticated connection on gRPC and a keep-alive
// one on metrics go idle. Checked: the client never fails and keeps
// minting (IDs/s before and during, and the longest gap between IDs, are
// logged), /livez and /readyz, probed from another loopback address as a
// kubelet probes from its node, answer within the time the caps and the
// handshake timeout need to work through the flood, the process never holds 256
// descriptors and does not exit, every flood connection is closed by the
// server within that time, the idle ones within the idle timeout, and
// after the flood a new client mints at once.
func TestFloodSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	const (
		openFiles    = 256
		idlePerPort  = openFiles + 44 // more than the process may hold files
		halfPerPort  = 30
		handshake    = time.Second
		idle         = 3 * time.Second
		slack        = 5 * time.Second // how late a timeout may act on a loaded 2-core machine
		maxMintGap   = 2 * time.Second // the bounded slowdown the client may see
		beforeWindow = 2 * time.Second // how long the rate before the flood is measured
	)
	needOpenFiles(t, 3*(idlePerPort+halfPerPort)+256)
	testenv.Binary(t) // build first: a cold build must not eat the test's deadline
	pki := newTestPKI(t, "minter")
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 1, OpenFiles: openFiles, Args: pki.serverFlags(
		"--handshake-timeout", handshake.String(), "--idle-timeout", idle.String())})
	perListener := loggedCap(t, p.Stderr())
	if p.HTTPAddr == "" {
		t.Fatalf("no HTTP API address in the log:\n%s", p.Stderr())
	}
	ports := map[string]string{"grpc": p.GRPCAddr, "http": p.HTTPAddr, "metrics": p.MetricsAddr}
	// Each round of the flood takes one handshake timeout and frees the
	// cap's slots (less two for the test's own connections).
	rounds := (idlePerPort+halfPerPort)/(perListener-2) + 1
	drainBound := time.Duration(rounds)*handshake + slack
	t.Logf("open files %d, %d connections per listener: the flood of %d per port takes %d rounds of %v (bound %v)",
		openFiles, perListener, idlePerPort+halfPerPort, rounds, handshake, drainBound)

	fds := watchFDs(t, p.Cmd.Process.Pid)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	clientTLS, err := tlsfiles.Files{Cert: pki.clients["minter"].Cert, Key: pki.clients["minter"].Key, CA: pki.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	c, err := engine.New(ctx, engine.Config{Targets: []string{p.GRPCAddr}, TLS: clientTLS, Owner: "flood-test",
		Tuning: engine.Tuning{RenewPeriod: time.Second}}) // a call every second: the connection is never idle for --idle-timeout
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	m := startMinter(ctx, c)
	defer m.stop()
	time.Sleep(beforeWindow) // the measurement window before the flood
	before := m.phase()

	// Connections that completed their handshake, then go idle: closed
	// after --idle-timeout.
	var idleWG sync.WaitGroup
	idleErrs := make(chan error, 3)
	for range 2 {
		cc := idleGRPC(t, ctx, p.GRPCAddr, clientTLS)
		idleWG.Go(func() { idleErrs <- waitGRPCClosed(ctx, cc, idle+slack) })
	}
	metricsTLS, err := tlsfiles.Files{CA: pki.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	keepAlive, idleSince := keepAliveConn(t, p.MetricsAddr, metricsTLS)
	idleWG.Go(func() {
		_, err := waitClosed(keepAlive, idleSince, idle+slack)
		idleErrs <- err
	})

	// The embedded etcd's own ports (loopback, client certificates
	// required) get the same number of idle connections, held through the
	// flood: etcd bounds them itself (its client listener at the limit
	// less 150, its peer listener with a 5 s read timeout), so they are
	// checked only for what they must not do: make the process run out of
	// descriptors or exit.
	etcdPorts := p.EmbeddedEtcd(t)
	var etcdConns []net.Conn
	defer func() {
		for _, c := range etcdConns {
			c.Close()
		}
	}()
	for _, u := range []string{etcdPorts.Endpoint, etcdPorts.Peer} {
		addr := strings.TrimPrefix(u, "https://")
		for range idlePerPort {
			c, err := net.DialTimeout("tcp", addr, drainBound)
			if err != nil {
				t.Fatalf("flood of the embedded etcd's port %s: %v", addr, err)
			}
			etcdConns = append(etcdConns, c)
		}
	}

	floodStart := time.Now()
	var floodWG sync.WaitGroup
	results := make(chan floodResult, 3*(idlePerPort+halfPerPort))
	for name, addr := range ports {
		for i := range idlePerPort + halfPerPort {
			send := ""
			if i >= idlePerPort {
				send = partialClientHello
			}
			floodWG.Go(func() { results <- floodConn(name, addr, send, drainBound) })
		}
	}
	// The probes come from another loopback address, as a kubelet's come
	// from its node: sharing the flood's address, a probe is one of the
	// flood's connections to the cap, shed like them if its handshake takes
	// longer than the shedding grace on a loaded machine.
	probeCtx, stopProbes := context.WithCancel(ctx)
	defer stopProbes()
	probes := probeEvery(probeCtx, p.MetricsAddr, net.IPv4(127, 0, 0, 3), metricsTLS, drainBound, 200*time.Millisecond)
	floodWG.Wait()
	close(results)
	during := m.phase()
	stopProbes()
	probed := probes.wait()
	idleWG.Wait()
	close(idleErrs)
	t.Logf("flood of %d connections per port closed after %v", idlePerPort+halfPerPort, time.Since(floodStart).Round(time.Millisecond))

	select {
	case <-p.Done():
		t.Fatalf("rangesvc exited during the flood: %v\nstderr:\n%s", p.ExitErr(), p.Stderr())
	default:
	}
	checkFlood(t, results, idlePerPort+halfPerPort, openFiles)
	for err := range idleErrs {
		if err != nil {
			t.Errorf("an idle connection: %v", err)
		}
	}
	t.Logf("/livez and /readyz: %d answers during the flood, slowest %v (bound %v)", len(probed.took), probed.slowest().Round(time.Millisecond), drainBound)
	if probed.err != nil || len(probed.took) == 0 {
		t.Errorf("probes during the flood: %d answered, then %v", len(probed.took), probed.err)
	}
	maxFDs := fds.stop()
	t.Logf("open descriptors: at most %d of the limit %d", maxFDs, openFiles)
	if maxFDs >= openFiles {
		t.Errorf("the process held %d descriptors, its limit is %d", maxFDs, openFiles)
	}

	t.Logf("legitimate client: %.0f IDs/s before the flood (%d IDs), %.0f IDs/s during it (%d IDs); longest gap between IDs %v before, %v during",
		before.rate(), before.n, during.rate(), during.n, before.maxGap.Round(time.Millisecond), during.maxGap.Round(time.Millisecond))
	if during.errs > 0 {
		t.Errorf("%d Next calls failed during the flood; first: %v", during.errs, during.firstErr)
	}
	if during.n == 0 || during.maxGap > maxMintGap {
		t.Errorf("the client minted %d IDs during the flood, longest gap %v; want it to keep minting (gaps below %v)",
			during.n, during.maxGap, maxMintGap)
	}

	// After the flood: a new client connects and mints at once, and the
	// metrics show the caps at work.
	if code, out, errs := mintCmd(t, append([]string{"--target", p.GRPCAddr, "-n", "3", "--timeout", "10s"},
		pki.clientFlags("minter")...)...); code != 0 || len(strings.Fields(out)) != 3 {
		t.Errorf("mint after the flood: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	metrics := httpsGet(t, metricsTLS, "https://"+p.MetricsAddr+"/metrics")
	for name := range ports {
		if v := metricValue(t, metrics, `idrange_service_connection_limit{listener="`+name+`"}`); v != float64(perListener) {
			t.Errorf("connection_limit{listener=%q} = %v, want %d", name, v, perListener)
		}
		if v := metricValue(t, metrics, `idrange_service_connection_limit_reached_total{listener="`+name+`"}`); v < 1 {
			t.Errorf("connection_limit_reached_total{listener=%q} = %v, want the flood to have reached the cap", name, v)
		}
	}
	if strings.Contains(p.Stderr(), "too many open files") {
		t.Errorf("the process ran out of descriptors:\n%s", p.Stderr())
	}
	m.stop()
	c.Close()
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM after the flood: %v\nstderr:\n%s", err, p.Stderr())
	}
}

// needOpenFiles fails t unless this test process may open n files (it
// holds the flood's client ends).
func needOpenFiles(t *testing.T, n uint64) {
	t.Helper()
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err != nil {
		t.Fatal(err)
	}
	if rl.Cur < n {
		t.Fatalf("this test opens about %d connections; its open-file limit is %d (raise ulimit -n)", n, rl.Cur)
	}
}

var capRE = regexp.MustCompile(`max_connections_per_listener=(\d+)`)

// loggedCap is the per-listener cap serve logged at start.
func loggedCap(t *testing.T, stderr string) int {
	t.Helper()
	m := capRE.FindStringSubmatch(stderr)
	if m == nil {
		t.Fatalf("serve did not log its connection limits:\n%s", stderr)
	}
	n, _ := strconv.Atoi(m[1])
	if n < 3 {
		t.Fatalf("per-listener cap %d: too small for this test", n)
	}
	return n
}

// fdWatch samples how many descriptors a process holds (/proc/PID/fd).
type fdWatch struct {
	max  atomic.Int64
	done chan struct{}
	wg   sync.WaitGroup
}

func watchFDs(t *testing.T, pid int) *fdWatch {
	t.Helper()
	dir := fmt.Sprintf("/proc/%d/fd", pid)
	if _, err := os.ReadDir(dir); err != nil {
		t.Fatalf("cannot count the process's descriptors: %v", err)
	}
	w := &fdWatch{done: make(chan struct{})}
	w.wg.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for {
			if fds, err := os.ReadDir(dir); err == nil && int64(len(fds)) > w.max.Load() {
				w.max.Store(int64(len(fds)))
			}
			select {
			case <-w.done:
				return
			case <-tick.C:
			}
		}
	})
	return w
}

// stop ends the sampling and returns the most descriptors seen.
func (w *fdWatch) stop() int {
	select {
	case <-w.done:
	default:
		close(w.done)
	}
	w.wg.Wait()
	return int(w.max.Load())
}

// pacedMinter calls Next in a paced loop (10 IDs a millisecond) and keeps, per
// phase, how many IDs it got, the longest gap between two, and failures.
type pacedMinter struct {
	mu   sync.Mutex
	cur  mintPhase
	last time.Time
	done chan struct{}
	wg   sync.WaitGroup
	once sync.Once
}

// mintPhase is what the minter saw between two calls of phase.
type mintPhase struct {
	start, end time.Time
	n          int
	maxGap     time.Duration
	errs       int
	firstErr   error
}

func (p mintPhase) rate() float64 { return float64(p.n) / p.end.Sub(p.start).Seconds() }

func startMinter(ctx context.Context, c *engine.Engine) *pacedMinter {
	now := time.Now()
	m := &pacedMinter{cur: mintPhase{start: now}, last: now, done: make(chan struct{})}
	m.wg.Go(func() {
		tick := time.NewTicker(time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-m.done:
				return
			case <-tick.C:
			}
			for range 10 {
				cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				_, err := c.Next(cctx)
				cancel()
				m.record(err)
			}
		}
	})
	return m
}

func (m *pacedMinter) record(err error) {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		if m.cur.errs == 0 {
			m.cur.firstErr = err
		}
		m.cur.errs++
		return
	}
	m.cur.n++
	m.cur.maxGap = max(m.cur.maxGap, now.Sub(m.last))
	m.last = now
}

// phase returns the phase that ends now and starts the next.
func (m *pacedMinter) phase() mintPhase {
	now := time.Now()
	m.mu.Lock()
	defer m.mu.Unlock()
	p := m.cur
	p.end = now
	p.maxGap = max(p.maxGap, now.Sub(m.last)) // a gap still open counts
	m.cur = mintPhase{start: now}
	return p
}

func (m *pacedMinter) stop() {
	m.once.Do(func() { close(m.done) })
	m.wg.Wait()
}

// idleGRPC opens an authenticated gRPC connection to addr that makes no
// call, and waits until it is ready.
func idleGRPC(t *testing.T, ctx context.Context, addr string, tc *tls.Config) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(credentials.NewTLS(tc)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	cc.Connect()
	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(rctx, s) {
			t.Fatalf("authenticated gRPC connection not ready: %v", s)
		}
	}
	return cc
}

// waitGRPCClosed waits until the server closes cc's connection (it leaves
// READY), at most within.
func waitGRPCClosed(ctx context.Context, cc *grpc.ClientConn, within time.Duration) error {
	start := time.Now()
	wctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	for s := cc.GetState(); s == connectivity.Ready; s = cc.GetState() {
		if !cc.WaitForStateChange(wctx, s) {
			return fmt.Errorf("authenticated gRPC connection without calls still open after %v", time.Since(start).Round(time.Millisecond))
		}
	}
	return nil
}

// keepAliveConn makes one HTTPS request on a connection it keeps, reads
// the answer, and returns the connection, idle from the returned time.
func keepAliveConn(t *testing.T, addr string, tc *tls.Config) (net.Conn, time.Time) {
	t.Helper()
	c, err := tls.Dial("tcp", addr, tc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: "+addr+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Close {
		t.Fatalf("/livez on a keep-alive connection: %s (close %v)", resp.Status, resp.Close)
	}
	return c, time.Now()
}

// floodResult is one flood connection's fate.
type floodResult struct {
	port      string
	connected bool
	closedIn  time.Duration // from connect to the server's close
	err       error
}

// floodConn connects to addr, sends send (nothing: an idle connection)
// and waits, at most bound, for the server to close it.
func floodConn(port, addr, send string, bound time.Duration) floodResult {
	r := floodResult{port: port}
	c, err := net.DialTimeout("tcp", addr, 20*time.Second)
	if err != nil {
		r.err = err // the kernel's backlog was full: not the server's doing
		return r
	}
	defer c.Close()
	r.connected = true
	start := time.Now()
	if _, err := io.WriteString(c, send); err != nil {
		r.closedIn = time.Since(start) // closed before the write
		return r
	}
	r.closedIn, r.err = waitClosed(c, start, bound)
	return r
}

// checkFlood checks that, on every port, more connections than the
// process's open-file limit connected and every one was closed by the
// server.
func checkFlood(t *testing.T, results <-chan floodResult, perPort, openFiles int) {
	t.Helper()
	type portStats struct {
		closed, refused int
		slowest         time.Duration
		errs            []error
	}
	stats := map[string]*portStats{}
	for r := range results {
		s := stats[r.port]
		if s == nil {
			s = &portStats{}
			stats[r.port] = s
		}
		switch {
		case !r.connected:
			s.refused++
		case r.err != nil:
			s.errs = append(s.errs, r.err)
		default:
			s.closed++
			s.slowest = max(s.slowest, r.closedIn)
		}
	}
	for port, s := range stats {
		connected := s.closed + len(s.errs)
		t.Logf("%s: %d of %d flood connections connected, %d closed by the server (the last %v after it connected)",
			port, connected, perPort, s.closed, s.slowest.Round(time.Millisecond))
		if len(s.errs) > 0 {
			t.Errorf("%s: %d flood connections not closed by the server; first: %v", port, len(s.errs), s.errs[0])
		}
		if connected <= openFiles {
			t.Errorf("%s: only %d flood connections connected (limit %d); is net.core.somaxconn below %d?",
				port, connected, openFiles, perPort)
		}
	}
}

// httpsGet GETs url with tc and returns the body of a 200 answer.
func httpsGet(t *testing.T, tc *tls.Config, url string) string {
	t.Helper()
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	resp, err := hc.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %s, %v", url, resp.Status, err)
	}
	return string(b)
}
