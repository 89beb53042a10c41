package connlimit

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// An HTTP server over a Listener whose one slot a slow peer holds answers
// a probe on its reserve slot (and closes it after), and answers anything
// else there 503 and closes it at once, without waiting for the body it
// announced.
func TestHandlerServesOnlyProbesOnTheReserve(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(lis, Config{Name: "metrics", Max: 1, Reserve: 1, ShedAfter: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	probe := func(r *http.Request) bool { return r.Method == http.MethodGet && r.URL.Path == "/livez" }
	srv := &http.Server{ConnContext: ConnContext, ReadHeaderTimeout: 10 * time.Second,
		Handler: Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.Copy(io.Discard, r.Body)
			io.WriteString(w, "ok\n")
		}), probe)}
	go srv.Serve(l)
	defer srv.Close()
	addr := lis.Addr().String()

	// The slow peer: its request reached the handler (established), its
	// body trickles.
	slow, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer slow.Close()
	io.WriteString(slow, "POST /metrics HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\nx")
	waitFor(t, func() bool { l.mu.Lock(); defer l.mu.Unlock(); return len(l.pending) == 0 && l.used == 1 })

	request := func(req string) (status string, close bool, closedIn time.Duration) {
		t.Helper()
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		start := time.Now()
		io.WriteString(c, req)
		c.SetReadDeadline(start.Add(5 * time.Second))
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatalf("%q: %v", req, err)
		}
		io.Copy(io.Discard, resp.Body)
		if _, err := br.ReadByte(); err != io.EOF {
			t.Fatalf("%q: connection still open after the answer (%v)", req, err)
		}
		return resp.Status, resp.Close, time.Since(start)
	}
	if st, closed, _ := request("GET /livez HTTP/1.1\r\nHost: x\r\n\r\n"); st != "200 OK" || !closed {
		t.Fatalf("probe on the reserve: %s, Connection: close %v; want 200 and close", st, closed)
	}
	for _, req := range []string{
		"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
		"POST /livez HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nxx", // a probe path with a body
	} {
		st, _, took := request(req)
		if !strings.HasPrefix(st, "503") || took > 2*time.Second {
			t.Fatalf("%q on the reserve: %s after %v; want 503 at once", req, st, took)
		}
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for end := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(end) {
			t.Fatal("condition not met within 10 s")
		}
	}
}

// Once a write has timed out (the peer does not read), a later write with
// a fresh deadline fails at once instead of blocking for it: crypto/tls's
// Close writes a close_notify alert with a 5 s deadline of its own, and a
// stalled peer would hold the slot for all of it.
func TestStalledWriteNeverBlocksAgain(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(lis, Config{Name: "http", Max: 1})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	client, err := net.Dial("tcp", lis.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer client.Close()
	client.(*net.TCPConn).SetReadBuffer(4096)
	c, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	_, err = c.Write(make([]byte, 64<<20))
	var ne net.Error
	if !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("a 64 MB write to a peer that does not read: %v, want a timeout", err)
	}
	c.SetWriteDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := c.Write([]byte("close_notify")); err == nil {
		t.Fatal("a write after the timeout succeeded")
	}
	if took := time.Since(start); took > time.Second {
		t.Fatalf("a write after the timeout blocked %v for its new deadline; want it to fail at once", took)
	}
}
