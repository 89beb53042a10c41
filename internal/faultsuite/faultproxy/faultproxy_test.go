package faultproxy

import (
	"bufio"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"
)

// echoServer answers every line with the same line, until the test ends.
func echoServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

func newProxy(t *testing.T) *Proxy {
	t.Helper()
	p, err := New(echoServer(t))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { p.Close() })
	return p
}

type conn struct {
	net.Conn
	r *bufio.Reader
}

func dial(t *testing.T, p *Proxy) *conn {
	t.Helper()
	c, err := net.Dial("tcp", p.Addr())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &conn{Conn: c, r: bufio.NewReader(c)}
}

// roundTrip sends msg and waits up to wait for the echo.
func (c *conn) roundTrip(msg string, wait time.Duration) (string, error) {
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write([]byte(msg + "\n")); err != nil {
		return "", err
	}
	line, err := c.r.ReadString('\n')
	return strings.TrimSuffix(line, "\n"), err
}

func TestPassThrough(t *testing.T) {
	p := newProxy(t)
	if !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr %q is not loopback", p.Addr())
	}
	c := dial(t, p)
	var want int64 // bytes both ways, newlines included
	for _, m := range []string{"a", "hello", strings.Repeat("x", 100_000)} {
		got, err := c.roundTrip(m, 5*time.Second)
		if err != nil || got != m {
			t.Fatalf("echo of %d bytes: got %d bytes, %v", len(m), len(got), err)
		}
		want += 2 * int64(len(m)+1)
	}
	// The proxy counts a chunk once it has written it, so the echo can
	// reach the client a moment before the count: give the count (bounded)
	// time to catch up; there is no event to wait on.
	for end := time.Now().Add(5 * time.Second); p.Stats().Forwarded < want && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
	if s := p.Stats(); s.Accepted != 1 || s.Forwarded != want || s.Dropped != 0 {
		t.Fatalf("stats %+v, want 1 accepted, %d forwarded, 0 dropped", s, want)
	}
}

func TestListenRefusesNonLoopback(t *testing.T) {
	if _, err := Listen("0.0.0.0:0", "127.0.0.1:1"); err == nil {
		t.Fatal("listening on every interface was accepted")
	}
	if _, err := Listen(":0", "127.0.0.1:1"); err == nil {
		t.Fatal("listening on an empty host was accepted")
	}
	if _, err := New("no-port"); err == nil {
		t.Fatal("a target without a port was accepted")
	}
}

func TestDelayIsAtLeastTheSetLatency(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := c.roundTrip("warm", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	const d = 150 * time.Millisecond
	p.SetDelay(d)
	start := time.Now()
	got, err := c.roundTrip("slow", 10*time.Second)
	if err != nil || got != "slow" {
		t.Fatalf("got %q, %v", got, err)
	}
	// A lower bound only: the delay is applied in each direction, so the
	// round trip cannot be shorter than 2d whatever the machine's load.
	if el := time.Since(start); el < 2*d {
		t.Fatalf("round trip took %v with a %v one-way delay", el, d)
	}
	p.SetDelay(0)
	if got, err := c.roundTrip("fast", 5*time.Second); err != nil || got != "fast" {
		t.Fatalf("after removing the delay: %q, %v", got, err)
	}
}

func TestBlackholeDropsThenHealClosesBrokenConnections(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Blackhole()
	// Nothing may come back: the proxy drops the bytes. The read deadline
	// only bounds the test; a correct proxy never delivers them.
	if got, err := c.roundTrip("lost", 300*time.Millisecond); err == nil {
		t.Fatalf("blackholed connection echoed %q", got)
	} else if !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("blackholed connection failed with %v, want a timeout (no RST)", err)
	}
	// A connection opened during the blackhole hangs too.
	c2 := dial(t, p)
	if got, err := c2.roundTrip("also lost", 300*time.Millisecond); err == nil {
		t.Fatalf("connection opened in a blackhole echoed %q", got)
	}
	if p.Stats().Dropped == 0 {
		t.Fatal("no bytes counted as dropped")
	}
	p.Heal()
	// Both connections lost bytes: Heal closes them.
	for i, cc := range []*conn{c, c2} {
		cc.SetDeadline(time.Now().Add(5 * time.Second))
		if _, err := cc.r.ReadString('\n'); err == nil {
			t.Fatalf("connection %d still delivers data after losing bytes", i)
		} else if errors.Is(err, os.ErrDeadlineExceeded) {
			t.Fatalf("connection %d was not closed by Heal", i)
		}
	}
	if got, err := dial(t, p).roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("new connection after Heal: %q, %v", got, err)
	}
}

func TestCutClosesAndRefuses(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := c.roundTrip("before", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	p.Cut()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.r.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("existing connection after Cut: %v, want EOF/reset", err)
	}
	c2 := dial(t, p)
	if _, err := c2.roundTrip("refused", 5*time.Second); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("new connection during Cut: %v, want EOF/reset", err)
	}
	p.Heal()
	if got, err := dial(t, p).roundTrip("after", 5*time.Second); err != nil || got != "after" {
		t.Fatalf("after Heal: %q, %v", got, err)
	}
	if p.Stats().Refused == 0 {
		t.Fatal("refused connection not counted")
	}
}

func TestCloseEndsEverything(t *testing.T) {
	p := newProxy(t)
	c := dial(t, p)
	if _, err := c.roundTrip("x", 5*time.Second); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.r.ReadString('\n'); err == nil || errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("connection after Close: %v", err)
	}
	if _, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		t.Fatal("proxy still accepts after Close")
	}
	if err := p.Close(); err != nil {
		t.Fatal("second Close:", err)
	}
}
