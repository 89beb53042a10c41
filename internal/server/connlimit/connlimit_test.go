package connlimit

import (
	"errors"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"

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
	port   int
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn, 64), closed: make(chan struct{})}
}

// dial queues a connection for Accept (as the kernel's backlog would) and
// returns the client's end.
func (p *pipeListener) dial() net.Conn { return p.dialFrom("127.0.0.1") }

// dialFrom is dial from source host host (a fresh port each time).
func (p *pipeListener) dialFrom(host string) net.Conn {
	server, client := net.Pipe()
	p.port++
	p.conns <- addrConn{server, &net.TCPAddr{IP: net.ParseIP(host), Port: p.port}}
	return client
}

// addrConn is a net.Pipe end with a TCP remote address.
type addrConn struct {
	net.Conn
	remote net.Addr
}

func (c addrConn) RemoteAddr() net.Addr { return c.remote }

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

func newTestListener(t *testing.T, cfg Config) (*Listener, *pipeListener, *Metrics) {
	t.Helper()
	m, err := NewMetrics(prometheus.NewRegistry(), "test", "conn")
	if err != nil {
		t.Fatal(err)
	}
	inner := newPipeListener()
	cfg.Metrics, cfg.Name = m, "grpc"
	l, err := New(inner, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return l, inner, m
}

// mustAccept accepts the next connection, failing t if Accept waits.
func mustAccept(t *testing.T, l *Listener) *Conn {
	t.Helper()
	ch := acceptAsync(l)
	synctest.Wait()
	select {
	case r := <-ch:
		if r.err != nil {
			t.Fatal(r.err)
		}
		return r.c.(*Conn)
	default:
		t.Fatal("Accept waits; want a connection at once")
		return nil
	}
}

// waiting fails t if the Accept behind acc has returned: it must still be
// waiting (call after synctest.Wait).
func waiting(t *testing.T, acc <-chan accepted, why string) {
	t.Helper()
	select {
	case r := <-acc:
		t.Fatalf("%s: Accept returned %v, %v; want it to wait", why, r.c, r.err)
	default:
	}
}

// closedByServer reports whether the server closed the client end c.
func closedByServer(c net.Conn) bool {
	c.SetReadDeadline(time.Now())
	_, err := c.Read(make([]byte, 1))
	var ne net.Error
	return !(errors.As(err, &ne) && ne.Timeout())
}

// Without shedding, at the cap Accept holds the next connection until an
// admitted one closes (the others stay queued in the wrapped listener);
// closing one twice frees one slot, not two. The metrics follow.
func TestListenerWaitsAtCapWithoutShedding(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, inner, m := newTestListener(t, Config{Max: 2})
		defer l.Close()
		for range 4 {
			inner.dial()
		}
		a := mustAccept(t, l)
		mustAccept(t, l)
		third := acceptAsync(l)
		synctest.Wait()
		waiting(t, third, "at the cap")
		if got := len(inner.conns); got != 1 {
			t.Fatalf("%d connections queued in the wrapped listener, want 1 (and one held by the waiting Accept)", got)
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
		waiting(t, fourth, "a double Close freed two slots")
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
		l, inner, _ := newTestListener(t, Config{Max: 1, ShedAfter: time.Second})
		client := inner.dial()
		inner.dial()
		c := mustAccept(t, l)
		c.Establish() // not shed: the next Accept waits
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

// Issue 35: a crowd of connections that never start, from one address,
// reconnecting as soon as they are shed, does not keep a peer from another
// address out. At the cap each newcomer sheds the oldest pending
// connection of the busiest address once it has had ShedAfter; the other
// address's connection, pending as long as it likes, is never the one
// shed; an established connection never is; no connection is shed before
// ShedAfter.
func TestShedsTheBusiestAddressFirst(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const shedAfter = 100 * time.Millisecond
		l, inner, m := newTestListener(t, Config{Max: 4, ShedAfter: shedAfter})
		defer l.Close()
		est := inner.dialFrom("10.0.0.9")
		mustAccept(t, l).Establish()
		flood := map[net.Conn]time.Time{}
		for range 3 {
			flood[inner.dialFrom("10.0.0.66")] = time.Now()
			mustAccept(t, l)
		}
		time.Sleep(10 * time.Millisecond)
		legit := inner.dialFrom("10.0.0.7")
		start := time.Now()
		legitConn := acceptAsync(l)
		synctest.Wait()
		waiting(t, legitConn, "before any flood connection had ShedAfter")
		time.Sleep(shedAfter)
		synctest.Wait()
		r := <-legitConn
		if r.err != nil {
			t.Fatal(r.err)
		}
		if took := time.Since(start); took > shedAfter {
			t.Fatalf("the other address's peer waited %v, want at most ShedAfter %v", took, shedAfter)
		}
		// The flood goes on for a while: every newcomer sheds a flood
		// connection, never the other address's, never the established one.
		for i := range 40 {
			flood[inner.dialFrom("10.0.0.66")] = time.Now()
			acc := acceptAsync(l)
			synctest.Wait()
			time.Sleep(shedAfter)
			synctest.Wait()
			if r := <-acc; r.err != nil {
				t.Fatalf("flood accept %d: %v", i, r.err)
			}
			for c, at := range flood {
				if closedByServer(c) {
					if age := time.Since(at); age < shedAfter {
						t.Fatalf("a flood connection was shed %v after it connected, before ShedAfter %v", age, shedAfter)
					}
					delete(flood, c)
				}
			}
		}
		if closedByServer(legit) || closedByServer(est) {
			t.Fatal("the other address's pending connection or the established one was shed")
		}
		if shed := testutil.ToFloat64(m.Shed); shed != 41 {
			t.Fatalf("shed counter %v, want 41 (one per newcomer at the cap)", shed)
		}
		if open := testutil.ToFloat64(m.Open); open != 4 {
			t.Fatalf("open %v, want the cap 4", open)
		}
	})
}

// Connections from one address alone: each newcomer sheds the oldest, and
// never one that has had less than ShedAfter.
func TestShedsOldestOfOneAddressAfterShedAfter(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const shedAfter = 50 * time.Millisecond
		l, inner, _ := newTestListener(t, Config{Max: 2, ShedAfter: shedAfter})
		defer l.Close()
		first := inner.dial()
		mustAccept(t, l)
		time.Sleep(10 * time.Millisecond)
		second := inner.dial()
		mustAccept(t, l)
		inner.dial()
		acc := acceptAsync(l)
		synctest.Wait()
		time.Sleep(shedAfter - 11*time.Millisecond) // the oldest is 1 ms short of ShedAfter
		synctest.Wait()
		waiting(t, acc, "before the oldest had ShedAfter")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		if r := <-acc; r.err != nil {
			t.Fatal(r.err)
		}
		if !closedByServer(first) || closedByServer(second) {
			t.Fatal("want the oldest connection shed, and only it")
		}
	})
}

// A crowd that holds its slots with started connections cannot shed the
// one pending connection of another address, however long it has been
// pending (a probe on a slow machine): the newcomer waits for a slot.
func TestNeverShedsASmallerAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, inner, m := newTestListener(t, Config{Max: 4, ShedAfter: 10 * time.Millisecond})
		defer l.Close()
		var crowd []*Conn
		for range 3 {
			inner.dialFrom("10.0.0.66")
			c := mustAccept(t, l)
			c.Establish()
			crowd = append(crowd, c)
		}
		probe := inner.dialFrom("10.0.0.3")
		mustAccept(t, l)
		inner.dialFrom("10.0.0.66")
		acc := acceptAsync(l)
		time.Sleep(time.Second)
		synctest.Wait()
		waiting(t, acc, "the crowd's newcomer, at the cap, with only another address's connection pending")
		if closedByServer(probe) || testutil.ToFloat64(m.Shed) != 0 {
			t.Fatal("the other address's only connection was shed")
		}
		crowd[0].Close()
		synctest.Wait()
		if r := <-acc; r.err != nil {
			t.Fatal(r.err)
		}
	})
}

// Established(addr) marks the connection with that remote address, as a
// gRPC server does on a connection's first call; an unknown address is
// ignored.
func TestEstablishedByAddress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		l, inner, _ := newTestListener(t, Config{Max: 1, ShedAfter: time.Millisecond})
		defer l.Close()
		inner.dial()
		c := mustAccept(t, l)
		l.Established(&net.TCPAddr{IP: net.IPv4(10, 1, 1, 1), Port: 1})
		l.Established(nil)
		l.Established(c.RemoteAddr())
		inner.dial()
		acc := acceptAsync(l)
		time.Sleep(time.Second)
		synctest.Wait()
		waiting(t, acc, "with only an established connection")
		c.Close()
		synctest.Wait()
		if r := <-acc; r.err != nil {
			t.Fatal(r.err)
		}
	})
}

// The reserve: with every slot of the cap held by established connections,
// a newcomer gets a reserve slot (Reserved), the next one waits; a pending
// reserve connection is shed like any other.
func TestReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const shedAfter = 20 * time.Millisecond
		l, inner, m := newTestListener(t, Config{Max: 1, Reserve: 1, ShedAfter: shedAfter})
		defer l.Close()
		inner.dial()
		slow := mustAccept(t, l)
		slow.Establish()
		if slow.Reserved() {
			t.Fatal("a connection within the cap is Reserved")
		}
		first := inner.dial()
		probe := mustAccept(t, l)
		if !probe.Reserved() {
			t.Fatal("the newcomer at the cap is not Reserved")
		}
		inner.dial()
		acc := acceptAsync(l)
		synctest.Wait()
		waiting(t, acc, "beyond the cap and the reserve")
		time.Sleep(shedAfter)
		synctest.Wait()
		r := <-acc
		if r.err != nil || !r.c.(*Conn).Reserved() || !closedByServer(first) {
			t.Fatalf("after ShedAfter: %v, %v; want the pending reserve connection shed for a new reserve one", r.c, r.err)
		}
		if open := testutil.ToFloat64(m.Open); open != 2 {
			t.Fatalf("open %v, want 2 (cap and reserve)", open)
		}
	})
}

func TestNewRejectsBadConfig(t *testing.T) {
	for _, cfg := range []Config{{Max: 0}, {Max: 1, Reserve: -1}, {Max: 1, ShedAfter: -time.Second}} {
		if _, err := New(newPipeListener(), cfg); err == nil {
			t.Errorf("New(%+v): no error", cfg)
		}
	}
}
