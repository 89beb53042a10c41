package main

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/tlsfiles"
)

// The per-listener cap: --max-connections, lowered so that the caps of
// all listeners stay within the open-file limit minus fdReserve; an
// unknown limit (0) leaves the flag as it is, and a limit that leaves
// fewer than minConnsPerListener per listener is refused.
func TestConnCap(t *testing.T) {
	cases := []struct {
		files           uint64
		want, listeners int
		cap             int
		err             string
	}{
		{files: 0, want: 10000, listeners: 3, cap: 10000},
		{files: 1 << 20, want: 10000, listeners: 3, cap: 10000},
		{files: 20000, want: 10000, listeners: 3, cap: (20000 - fdReserve - probeReserve) / 3},
		{files: 256, want: 10000, listeners: 3, cap: 32},
		{files: 256, want: 10000, listeners: 2, cap: 49},
		{files: 256, want: 20, listeners: 3, cap: 20},
		{files: 1024, want: 1, listeners: 3, cap: 1},
		{files: fdReserve + probeReserve + 3*minConnsPerListener, want: 10000, listeners: 3, cap: minConnsPerListener},
		{files: fdReserve + probeReserve + 3*minConnsPerListener - 1, want: 10000, listeners: 3, err: "open-file limit 205 leaves 15 connections per listener"},
		{files: 150, want: 10000, listeners: 3, err: "open-file limit 150 leaves 0 connections"},
		{files: 20, want: 10000, listeners: 2, err: "raise the hard limit"},
		{files: ^uint64(0), want: maxMaxConnections, listeners: 2, cap: maxMaxConnections},
	}
	for _, tc := range cases {
		got, err := connCap(tc.files, tc.want, tc.listeners)
		switch {
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("connCap(%d, %d, %d) = %d, %v; want an error containing %q", tc.files, tc.want, tc.listeners, got, err, tc.err)
		case tc.err == "" && (err != nil || got != tc.cap):
			t.Errorf("connCap(%d, %d, %d) = %d, %v; want %d", tc.files, tc.want, tc.listeners, got, err, tc.cap)
		}
		if err == nil && tc.files > fdReserve && uint64(got*tc.listeners+probeReserve) > tc.files-fdReserve {
			t.Errorf("connCap(%d, %d, %d) = %d: %d listeners hold more than the limit minus the reserve", tc.files, tc.want, tc.listeners, got, tc.listeners)
		}
	}
}

// The connection-limit flags: defaults, and impossible values exit 2
// naming the flag.
func TestConnLimitFlags(t *testing.T) {
	c, err := parseServeFlags([]string{"--region", "1"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxConnections != defaultMaxConnections || c.maxConnsSet || c.HandshakeTimeout != service.DefaultHandshakeTimeout ||
		c.IdleTimeout != service.DefaultIdleTimeout {
		t.Fatalf("defaults: --max-connections %d (set %v), --handshake-timeout %v, --idle-timeout %v",
			c.MaxConnections, c.maxConnsSet, c.HandshakeTimeout, c.IdleTimeout)
	}
	if c.HTTPReadTimeout != defaultHTTPReadTimeout || c.HTTPWriteTimeout != defaultHTTPWriteTimeout {
		t.Fatalf("defaults: --http-read-timeout %v, --http-write-timeout %v", c.HTTPReadTimeout, c.HTTPWriteTimeout)
	}
	c, err = parseServeFlags([]string{"--region", "1", "--max-connections", "500", "--handshake-timeout", "2s", "--idle-timeout", "30s",
		"--http-read-timeout", "3s", "--http-write-timeout", "4s"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.MaxConnections != 500 || !c.maxConnsSet || c.HandshakeTimeout != 2*time.Second || c.IdleTimeout != 30*time.Second ||
		c.HTTPReadTimeout != 3*time.Second || c.HTTPWriteTimeout != 4*time.Second {
		t.Fatalf("set: %+v", c)
	}
	// The flags map 1:1 onto the limits the listeners and servers get.
	lim, err := c.connLimits(0, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if lim.maxConns != 500 || lim.handshake != 2*time.Second || lim.idle != 30*time.Second || lim.read != 3*time.Second ||
		lim.write != 4*time.Second || lim.shedAfter != maxShedAfter {
		t.Fatalf("connLimits = %+v", lim)
	}
	if srv := lim.httpServer(http.NotFoundHandler(), noProbes, slog.New(slog.DiscardHandler)); srv.ReadHeaderTimeout != 2*time.Second ||
		srv.ReadTimeout != 3*time.Second || srv.WriteTimeout != 4*time.Second || srv.IdleTimeout != 30*time.Second {
		t.Fatalf("HTTP server timeouts: header %v, read %v, write %v, idle %v", srv.ReadHeaderTimeout, srv.ReadTimeout, srv.WriteTimeout, srv.IdleTimeout)
	}
	for _, tc := range []struct{ args, msg string }{
		{"--max-connections 0", "--max-connections 0 not in 1..1048576"},
		{"--max-connections -5", "--max-connections -5 not in"},
		{"--max-connections 2000000", "--max-connections 2000000 not in"},
		{"--handshake-timeout 0s", "--handshake-timeout 0s must be positive"},
		{"--handshake-timeout -1s", "--handshake-timeout -1s must be positive"},
		{"--idle-timeout 0s", "--idle-timeout 0s must be positive"},
		{"--http-read-timeout 0s", "--http-read-timeout 0s must be positive"},
		{"--http-write-timeout -1s", "--http-write-timeout -1s must be positive"},
	} {
		code, out, errs := runCmd(append([]string{"serve", "--region", "0"}, strings.Fields(tc.args)...)...)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, tc.msg) {
			t.Errorf("serve %s: exit %d, stdout %q, stderr %q; want exit %d naming %q", tc.args, code, out, errs, cli.ExitUsage, tc.msg)
		}
	}
}

// closedAfter waits until the server closes c (reads return EOF or a
// reset), at most within, and returns how long after start that was; it
// fails t if c is still open then.
func closedAfter(t *testing.T, c net.Conn, start time.Time, within time.Duration) time.Duration {
	t.Helper()
	took, err := waitClosed(c, start, within)
	if err != nil {
		t.Fatal(err)
	}
	return took
}

// waitClosed is closedAfter for any goroutine: an error when c is still
// open within after start.
func waitClosed(c net.Conn, start time.Time, within time.Duration) (time.Duration, error) {
	c.SetReadDeadline(start.Add(within))
	_, err := io.Copy(io.Discard, c)
	took := time.Since(start)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return took, fmt.Errorf("connection to %s still open %v after it was opened, want it closed by the server", c.RemoteAddr(), took)
	}
	return took, nil
}

// stalledReaderClosed reports (nil) whether the server has closed c, a
// connection whose peer stopped reading a response larger than the socket
// buffers hold (and whose receive buffer is small). Reading cannot tell:
// the server's kernel keeps delivering what it buffered, at the pace of a
// zero window, after the server closed. Writing can: a byte sent to a
// socket its server closed is answered with a reset, which the next reads
// return after at most the small receive buffer's data.
func stalledReaderClosed(c net.Conn, within time.Duration) error {
	c.SetDeadline(time.Now().Add(within))
	if _, err := io.WriteString(c, "x"); err != nil {
		return nil // reset already
	}
	_, err := io.Copy(io.Discard, c)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return fmt.Errorf("connection to %s still open: its stalled response was never cut", c.RemoteAddr())
	}
	return nil
}

// partialClientHello is the start of a TLS ClientHello: a record header
// announcing 512 bytes, and the first four of them.
const partialClientHello = "\x16\x03\x01\x02\x00\x01\x00\x01\xfc"

// The HTTP servers (metrics and --http) close a peer that sends nothing,
// half a TLS ClientHello or half its request headers within the handshake
// timeout (over TLS, net/http bounds the handshake by ReadHeaderTimeout),
// one whose body trickles within the read timeout, one that does not take
// its response within the write timeout, and a keep-alive connection after
// the idle timeout.
func TestHTTPServerTimeouts(t *testing.T) {
	const handshake, idle, read, write = 400 * time.Millisecond, 1200 * time.Millisecond, 800 * time.Millisecond, 800 * time.Millisecond
	lim := connLimits{maxConns: 16, handshake: handshake, idle: idle, read: read, write: write, shedAfter: 100 * time.Millisecond}
	const big = 64 << 20 // more than any socket buffers hold
	p := newTestPKI(t)
	tc, err := tlsfiles.Files{Cert: p.server.Cert, Key: p.server.Key}.ServerConfig()
	if err != nil {
		t.Fatal(err)
	}
	serveHTTP := func(secure bool) string {
		capped, err := lim.listen("--metrics", "127.0.0.1:0", "metrics", 0)
		if err != nil {
			t.Fatal(err)
		}
		var lis net.Listener = capped
		if secure {
			lis = tls.NewListener(lis, tc)
		}
		srv := lim.httpServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/big" {
				w.Write(make([]byte, big))
				return
			}
			io.WriteString(w, "ok\n")
		}), noProbes, slog.New(slog.DiscardHandler))
		go srv.Serve(lis)
		t.Cleanup(func() { srv.Close() })
		return lis.Addr().String()
	}
	plain, secure := serveHTTP(false), serveHTTP(true)
	const slack = 3 * time.Second
	for _, tc := range []struct {
		name, addr, send string
		after            time.Duration
	}{
		{"plaintext idle", plain, "", handshake},
		{"plaintext half headers", plain, "GET /livez HTTP/1.1\r\nHost: x\r\n", handshake},
		{"plaintext keep-alive", plain, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n", idle},
		{"plaintext slow body", plain, "POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx", read},
		{"TLS idle", secure, "", handshake},
		{"TLS half ClientHello", secure, partialClientHello, handshake},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", tc.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if _, err := io.WriteString(c, tc.send); err != nil {
				t.Fatal(err)
			}
			took := closedAfter(t, c, start, tc.after+slack)
			if took < tc.after/2 {
				t.Fatalf("closed after %v, before the %v timeout", took, tc.after)
			}
			t.Logf("closed after %v (timeout %v)", took, tc.after)
		})
	}
	t.Run("plaintext slow read", func(t *testing.T) {
		c, err := net.Dial("tcp", plain)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.(*net.TCPConn).SetReadBuffer(4096)
		if _, err := io.WriteString(c, "GET /big HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		time.Sleep(write + slack) // the peer does not read: the response stalls
		if err := stalledReaderClosed(c, slack); err != nil {
			t.Fatalf("%v (write timeout %v)", err, write)
		}
	})
	t.Run("TLS keep-alive", func(t *testing.T) {
		cc, err := tlsfiles.Files{CA: p.ca}.ClientConfig()
		if err != nil {
			t.Fatal(err)
		}
		c, err := tls.Dial("tcp", secure, cc)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := io.WriteString(c, "GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
			t.Fatal(err)
		}
		start := time.Now()
		took := closedAfter(t, c, start, idle+slack)
		if took < idle/2 {
			t.Fatalf("closed after %v, before the %v idle timeout", took, idle)
		}
		t.Logf("closed after %v (timeout %v)", took, idle)
	})
}

// serve's gRPC server tells its listener when a call arrives
// (grpcLimits): at the cap, a connection that made a call is never shed for
// a newcomer, while one that made none is, once it has had shed-after.
func TestGRPCCallMarksTheConnectionStarted(t *testing.T) {
	const shedAfter = 20 * time.Millisecond
	lim := connLimits{maxConns: 1, handshake: 5 * time.Second, idle: time.Minute, shedAfter: shedAfter}
	gl, err := lim.listen("--listen", "127.0.0.1:0", "grpc", 0)
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(service.ServerOptions(lim.grpcLimits(gl))...)
	healthpb.RegisterHealthServer(srv, health.NewServer())
	go srv.Serve(gl)
	defer srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	dial := func() *grpc.ClientConn {
		cc, err := grpc.NewClient(gl.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { cc.Close() })
		cc.Connect()
		for s := cc.GetState(); s != connectivity.Ready; s = cc.GetState() {
			if !cc.WaitForStateChange(ctx, s) {
				t.Fatal("connection never ready")
			}
		}
		return cc
	}
	// keptAfterNewcomer: a newcomer (an idle TCP connection) arrives at the
	// cap once cc has had shed-after; is cc still ready 500 ms later?
	keptAfterNewcomer := func(cc *grpc.ClientConn) bool {
		time.Sleep(2 * shedAfter)
		newcomer, err := net.Dial("tcp", gl.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer newcomer.Close()
		wctx, wcancel := context.WithTimeout(ctx, 500*time.Millisecond)
		defer wcancel()
		return !cc.WaitForStateChange(wctx, connectivity.Ready)
	}

	called := dial()
	if _, err := healthpb.NewHealthClient(called).Check(ctx, &healthpb.HealthCheckRequest{}); err != nil {
		t.Fatal(err)
	}
	if !keptAfterNewcomer(called) {
		t.Fatal("a connection that made a call was shed for a newcomer")
	}
	called.Close()
	quiet := dial() // connected, no call
	if keptAfterNewcomer(quiet) {
		t.Fatal("a connection that made no call was kept at the cap: the newcomer should have shed it")
	}
}
