package connlimit

import (
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
)

// pipeListener is a net.Listener whose connections are net.Pipe ends the
// test hands it with dial; inside a synctest bubble a goroutine waiting in
// its Accept is durably blocked, so synctest.Wait tells a blocked Accept
// from a slow one.
type pipeListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 16), closed: make(chan struct{})}
}

// dial queues a connection for Accept (as the kernel's backlog would) and
// returns the client's end.
func (p *pipeListener) dial() net.Conn {
	server, client := net.Pipe()
	p.conns <- server
	return client
}

func (p *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-p.conns:
		return c, nil
	case <-p.closed:
		return nil, net.ErrClosed
	}
}

func (p *pipeListener) Close() error {
	p.once.Do(func() { close(p.closed) })
	return nil
}

func (p *pipeListener) Addr() net.Addr { return &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1)} }

// accepter runs Accept in a goroutine and reports what it returned.
type accepted struct {
	c   net.Conn
	err error
}

func acceptAsync(l net.Listener) <-chan accepted {
	ch := make(chan accepted, 1)
	go func() {
		c, err := l.Accept()
		ch <- accepted{c, err}
	}()
	return ch
}

func newTestListener(t *testing.T, max int) (*Listener, *pipeListener, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry(), "test", "conn")
	if err != nil {
		t.Fatal(err)
	}
	inner := newPipeListener()
	l, err := Wrap(inner, max, m, "grpc")
	if err != nil {
		t.Fatal(err)
	}
	return l, inner, m
}

// At the cap, Accept waits (the pending connection stays queued in the
// wrapped listener) until an accepted connection is closed; closing one
// twice frees one slot, not two. The metrics follow.
func TestListenerBlocksAtCapReleasesOnClose(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, inner, m := newTestListener(t, 2)
		defer l.Close()
		for range 4 {
			inner.dial()
		}
		a, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		if _, err := l.Accept(); err != nil {
			t.Fatal(err)
		}
		third := acceptAsync(l)
		synctest.Wait()
		select {
		case r := <-third:
			t.Fatalf("Accept at the cap returned %v, %v; want it to wait", r.c, r.err)
		default:
		}
		if got := len(inner.conns); got != 2 {
			t.Fatalf("%d connections queued in the wrapped listener, want 2 (the cap leaves them there)", got)
		}
		if open, reached := testutil.ToFloat64(m.Open), testutil.ToFloat64(m.LimitReached); open != 2 || reached != 1 {
			t.Fatalf("open %v, limit reached %v; want 2 and 1", open, reached)
		}
		if limit := testutil.ToFloat64(m.Limit); limit != 2 {
			t.Fatalf("limit gauge %v, want 2", limit)
		}

		a.Close()
		a.Close() // a second Close gives nothing back
		synctest.Wait()
		r := <-third
		if r.err != nil {
			t.Fatalf("Accept after a close: %v", r.err)
		}
		fourth := acceptAsync(l)
		synctest.Wait()
		select {
		case r := <-fourth:
			t.Fatalf("a double Close freed two slots: a fourth Accept returned %v, %v", r.c, r.err)
		default:
		}
		if open := testutil.ToFloat64(m.Open); open != 2 {
			t.Fatalf("open %v after one close and one accept, want 2", open)
		}
		r.c.Close()
		synctest.Wait()
		if r := <-fourth; r.err != nil {
			t.Fatalf("fourth Accept: %v", r.err)
		}
	})
}

// Closing the listener ends an Accept waiting at the cap with
// net.ErrClosed, and later Accepts fail at once; accepted connections
// stay usable.
func TestListenerCloseEndsWaitingAccept(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, inner, _ := newTestListener(t, 1)
		client := inner.dial()
		inner.dial()
		c, err := l.Accept()
		if err != nil {
			t.Fatal(err)
		}
		waiting := acceptAsync(l)
		synctest.Wait()
		if err := l.Close(); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if r := <-waiting; !errors.Is(r.err, net.ErrClosed) {
			t.Fatalf("waiting Accept after Close: %v, %v; want net.ErrClosed", r.c, r.err)
		}
		if _, err := l.Accept(); !errors.Is(err, net.ErrClosed) {
			t.Fatalf("Accept after Close: %v, want net.ErrClosed", err)
		}
		go client.Write([]byte("x"))
		buf := make([]byte, 1)
		if _, err := c.Read(buf); err != nil || buf[0] != 'x' {
			t.Fatalf("accepted connection after the listener closed: read %q, %v", buf, err)
		}
	})
}

func TestWrapRejectsNoCap(t *testing.T) {
	if _, err := Wrap(newPipeListener(), 0, nil, "metrics"); err == nil {
		t.Fatal("Wrap with cap 0: no error")
	}
}
