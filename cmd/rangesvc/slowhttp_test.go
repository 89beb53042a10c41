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
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/tlsfiles"
)

// Acceptance (issue 35, "deadlines on every HTTP connection"): a replica
// with mutual TLS and its open-file limit at 256 (32 connections per
// listener) gets, on its metrics port (HTTPS, no client certificate) and on
// its HTTP API (a client certificate), 48 slow peers each, more than its
// cap: slow-body peers (headers, then a byte of the body every 200 ms) and
// slow-read peers (pipelined requests for 4 MB of responses, never read:
// 12 on metrics, 4 on the HTTP API), reconnecting as soon as they are
// closed, for 10 s. Checked:
// /livez, probed every 100 ms on a new connection from another loopback
// address (127.0.0.3: a kubelet probes from its node), answers 200 within
// 1 s every time, and /readyz too; every slow connection that got a slot is
// closed by the replica within its deadline (--http-read-timeout for a
// body, --http-write-timeout for a response) plus slack; connections
// that found every slot taken are refused at once on the metrics port's
// probe reserve, or wait for a slot on the HTTP API; the process stays up
// and mints after the flood.
func TestSlowHTTPFloodSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	const (
		openFiles = 256
		// Slow peers per port: 48, more than the cap (32). Slow readers
		// are fewer: each makes the replica produce 4 MB of responses (all
		// that the socket buffers take before a write stalls), on the
		// HTTP API 200,000 IDs minted and encoded as JSON, CPU that on 2
		// cores the handlers (whose time the write deadline includes) and
		// the probes would wait for.
		peers    = 48
		floodFor = 10 * time.Second
		readTO   = 2 * time.Second // --http-read-timeout
		writeTO  = 2 * time.Second // --http-write-timeout
		slack    = 2 * time.Second // how late a deadline may act on a loaded 2-core machine
		probeTO  = time.Second     // the bound on /livez
		probeGap = 100 * time.Millisecond
	)
	needOpenFiles(t, 2*peers+256)
	testenv.Binary(t)
	pki := newTestPKI(t, "minter")
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 1, OpenFiles: openFiles, Args: pki.serverFlags(
		"--handshake-timeout", "1s", "--idle-timeout", "3s",
		"--http-read-timeout", readTO.String(), "--http-write-timeout", writeTO.String())})
	perListener := loggedCap(t, p.Stderr())
	if peers <= perListener || p.HTTPAddr == "" {
		t.Fatalf("cap %d, HTTP API %q: the flood (%d per port) must exceed the cap", perListener, p.HTTPAddr, peers)
	}
	metricsTLS, err := tlsfiles.Files{CA: pki.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	apiTLS, err := tlsfiles.Files{Cert: pki.clients["minter"].Cert, Key: pki.clients["minter"].Key, CA: pki.ca}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	// Warm up: the first mint waits for the replica's restart floor.
	if code, out, errs := mintCmd(t, append([]string{"--target", p.GRPCAddr, "-n", "1"}, pki.clientFlags("minter")...)...); code != 0 {
		t.Fatalf("mint before the flood: exit %d, %q, %s", code, out, errs)
	}

	type port struct {
		name, addr string
		tc         *tls.Config
		body, read string // a slow-body request's head; one pipelined request of a slow read
		pipelined  int
		readers    int // of the port's peers, the slow readers
		hasReserve bool
	}
	ports := []port{
		{name: "metrics", addr: p.MetricsAddr, tc: metricsTLS, hasReserve: true, pipelined: 180, readers: 12,
			body: "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
			read: "GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"},
		{name: "http", addr: p.HTTPAddr, tc: apiTLS, pipelined: 2, readers: 4,
			body: "GET /v1/ids?count=1 HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\n",
			read: "GET /v1/ids?count=100000 HTTP/1.1\r\nHost: x\r\n\r\n"},
	}
	deadline := map[string]time.Duration{"body": readTO, "read": writeTO}
	// How late past its deadline a connection may close: slack for the
	// machine, and for a slow reader the time the replica takes to produce
	// the pipelined responses the socket buffers take in before one stalls
	// (each response's deadline runs from its own request).
	allow := map[string]time.Duration{"body": slack, "read": 2 * slack}
	ctx, cancel := context.WithTimeout(context.Background(), floodFor)
	defer cancel()
	results := make(chan slowResult, 4096)
	var wg sync.WaitGroup
	for _, pt := range ports {
		for i := range peers {
			kind := map[bool]string{true: "read", false: "body"}[i < pt.readers] // the readers first: each takes 6 s
			wg.Go(func() {
				for ctx.Err() == nil {
					r := slowPeer(ctx, pt.addr, pt.tc, kind, pt.body, strings.Repeat(pt.read, pt.pipelined), deadline[kind]+allow[kind])
					r.port = pt.name
					select {
					case results <- r:
					default:
					}
					if r.refused {
						time.Sleep(50 * time.Millisecond) // a refused peer retries soon, not in a busy loop
					}
				}
			})
		}
	}
	probes := probeEvery(ctx, p.MetricsAddr, net.IPv4(127, 0, 0, 3), metricsTLS, probeTO, probeGap)
	wg.Wait()
	close(results)
	probed := probes.wait()

	select {
	case <-p.Done():
		t.Fatalf("rangesvc exited during the flood: %v\nstderr:\n%s", p.ExitErr(), p.Stderr())
	default:
	}
	t.Logf("probes: %d of /livez and /readyz in %v, slowest %v, median %v (bound %v)", len(probed.took), floodFor,
		probed.slowest().Round(time.Millisecond), probed.median().Round(time.Millisecond), probeTO)
	if probed.err != nil || len(probed.took) < int(floodFor/(probeGap+probeTO)) {
		t.Errorf("probes during the flood: %d answered, then %v", len(probed.took), probed.err)
	}
	type stats struct {
		held, refused, open int
		slowest             map[string]time.Duration
		errs                []error
	}
	byPort := map[string]*stats{}
	for r := range results {
		s := byPort[r.port]
		if s == nil {
			s = &stats{slowest: map[string]time.Duration{}}
			byPort[r.port] = s
		}
		switch {
		case r.err != nil:
			s.errs = append(s.errs, r.err)
		case r.refused:
			s.refused++
		case r.interrupted:
			s.open++ // the flood ended first
		default:
			s.held++
			s.slowest[r.kind] = max(s.slowest[r.kind], r.closedIn)
		}
	}
	for _, pt := range ports {
		s := byPort[pt.name]
		if s == nil {
			t.Errorf("%s: no flood connection got through", pt.name)
			continue
		}
		t.Logf("%s: %d slow connections held a slot and were closed by the replica (slowest: body %v, read %v), %d refused on the probe reserve, %d open when the flood ended",
			pt.name, s.held, s.slowest["body"].Round(time.Millisecond), s.slowest["read"].Round(time.Millisecond), s.refused, s.open)
		for _, err := range s.errs {
			t.Errorf("%s: %v", pt.name, err)
		}
		if s.held < perListener {
			t.Errorf("%s: %d slow connections held a slot, want more than the cap %d (the flood did not fill it)", pt.name, s.held, perListener)
		}
		for kind := range deadline {
			if _, ok := s.slowest[kind]; !ok {
				t.Errorf("%s: no slow-%s connection held a slot to its end: nothing checked its deadline", pt.name, kind)
			}
		}
		for kind, d := range s.slowest {
			if d > deadline[kind]+allow[kind] {
				t.Errorf("%s: a slow-%s connection closed %v after its request, beyond the deadline %v", pt.name, kind, d, deadline[kind])
			}
		}
		if s.refused > 0 && !pt.hasReserve {
			t.Errorf("%s: %d connections refused, but the port has no probe reserve", pt.name, s.refused)
		}
	}
	if code, out, errs := mintCmd(t, append([]string{"--target", p.GRPCAddr, "-n", "3"}, pki.clientFlags("minter")...)...); code != 0 || len(strings.Fields(out)) != 3 {
		t.Errorf("mint after the flood: exit %d, stdout %q, stderr %s", code, out, errs)
	}
	if err := p.Stop(30 * time.Second); err != nil {
		t.Fatalf("SIGTERM after the flood: %v\nstderr:\n%s", err, p.Stderr())
	}
}

// slowResult is one slow peer's connection.
type slowResult struct {
	port, kind  string
	refused     bool          // answered 503 at once (a probe reserve slot)
	interrupted bool          // the flood ended while it was open
	closedIn    time.Duration // from its request to the replica's close
	err         error         // the replica misbehaved (still open past the deadline)
}

// slowPeer opens one connection to addr and is slow on it: kind "body"
// sends head and then the body one byte every 200 ms, kind "read" sends
// read (pipelined requests) and never reads, until the replica closes
// the connection. stall is its deadline plus slack (for a "read" peer,
// whose pipelined responses are produced one by one, each with the
// deadline from its own request, also the time to produce those the socket
// buffers take in): still open then is an error (a "body" peer, a second
// after it). A 503 first answer is a refusal.
func slowPeer(ctx context.Context, addr string, tc *tls.Config, kind, head, read string, stall time.Duration) slowResult {
	r := slowResult{kind: kind}
	d := tls.Dialer{NetDialer: &net.Dialer{Timeout: 20 * time.Second}, Config: tc}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		r.interrupted = true // the flood ended, or the backlog was full: not the replica's doing
		return r
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { c.SetDeadline(time.Now()) })
	defer stop()
	raw := c.(*tls.Conn).NetConn().(*net.TCPConn)
	start := time.Now()
	if kind == "read" {
		raw.SetReadBuffer(4096)
		if _, err := io.WriteString(c, read); err != nil {
			r.interrupted = ctx.Err() != nil
			r.closedIn = time.Since(start)
			return r
		}
		// A refusal comes at once; a served response stalls.
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		if resp, err := http.ReadResponse(bufio.NewReaderSize(c, 64), nil); err == nil && resp.StatusCode == http.StatusServiceUnavailable {
			r.refused = true
			return r
		}
		// Every 250 ms, is it closed? (A reading between two checks is no
		// progress the replica could mistake for taking the response: its
		// write deadline runs from the request, whatever is read.)
		for {
			err := stalledReaderClosed(c, 250*time.Millisecond)
			switch {
			case ctx.Err() != nil:
				r.interrupted = true
				return r
			case err == nil:
				r.closedIn = time.Since(start)
				return r
			case time.Since(start) > stall:
				r.err = fmt.Errorf("slow read: %w %v after its requests", err, time.Since(start).Round(time.Millisecond))
				return r
			}
		}
	}
	if _, err := io.WriteString(c, head); err != nil {
		r.interrupted = ctx.Err() != nil
		return r
	}
	answers := make(chan slowAnswer, 1)
	go func() {
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		status := 0
		if err == nil {
			status = resp.StatusCode
			io.Copy(io.Discard, resp.Body)
			_, err = br.ReadByte() // then the close
		}
		answers <- slowAnswer{status, err}
	}()
	tick := time.NewTicker(200 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case a := <-answers:
			r.closedIn = time.Since(start)
			switch {
			case a.status == http.StatusServiceUnavailable:
				r.refused = true
			case ctx.Err() != nil:
				r.interrupted = true
			}
			return r
		case <-tick.C:
			if open := time.Since(start); open > stall+time.Second {
				r.err = fmt.Errorf("slow body: connection to %s still open %v after its request", addr, open.Round(time.Millisecond))
				return r
			}
			c.SetWriteDeadline(time.Now().Add(time.Second))
			if _, err := io.WriteString(c, "x"); err != nil && ctx.Err() != nil {
				r.interrupted = true
				return r
			}
		}
	}
}

type slowAnswer struct {
	status int
	err    error
}

// probeRun is a run of probes of /livez and /readyz.
type probeRun struct {
	done chan struct{}
	took []time.Duration
	err  error
}

// probeEvery GETs https://addr/livez and /readyz alternately, each on a
// new connection from the loopback address from (a kubelet probes from its
// node's address, not the flood's) with a timeout of bound, every gap,
// until ctx ends; the first failure (an error, a status other than 200, or
// no answer within bound) ends the run.
func probeEvery(ctx context.Context, addr string, from net.IP, tc *tls.Config, bound, gap time.Duration) *probeRun {
	r := &probeRun{done: make(chan struct{})}
	d := &net.Dialer{LocalAddr: &net.TCPAddr{IP: from}}
	hc := &http.Client{Timeout: bound, Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true, DialContext: d.DialContext}}
	go func() {
		defer close(r.done)
		for i := 0; ctx.Err() == nil; i++ {
			path := []string{"/livez", "/readyz"}[i%2]
			start := time.Now()
			resp, err := hc.Get("https://" + addr + path)
			if err == nil {
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					err = fmt.Errorf("%s answered %s", path, resp.Status)
				}
			}
			if err != nil {
				if ctx.Err() == nil {
					r.err = fmt.Errorf("probe %d (%s) after %v: %w", i+1, path, time.Since(start).Round(time.Millisecond), err)
				}
				return
			}
			r.took = append(r.took, time.Since(start))
			select {
			case <-ctx.Done():
			case <-time.After(gap):
			}
		}
	}()
	return r
}

func (r *probeRun) wait() *probeRun {
	<-r.done
	return r
}

func (r *probeRun) slowest() time.Duration {
	if len(r.took) == 0 {
		return 0
	}
	return slices.Max(r.took)
}

func (r *probeRun) median() time.Duration {
	if len(r.took) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(r.took))
	return s[len(s)/2]
}
