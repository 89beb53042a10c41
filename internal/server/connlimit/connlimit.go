// Package connlimit caps how many connections a listener holds open at
// once, and decides fairly who gets a slot at the cap, so that neither a
// flood of idle peers nor a crowd of slow ones can use up the descriptors
// the rest of the process needs or keep legitimate peers out.
//
// At the cap a new connection is admitted by shedding (closing) a
// connection that has not started yet: one the server has not marked
// Established (gRPC: no call has arrived on it; HTTP: no request has
// reached the handler). The one shed is the oldest not yet started of the
// source address that holds the most slots, and only once it has had
// ShedAfter to start; a newcomer never sheds a connection of an address
// that holds no more slots than its own, except its own address's. So a
// flood that reconnects as soon as it is shed churns through its own
// connections, a peer from another address, once accepted, is left to
// finish its handshake, and every connection, whatever its address, has at
// least ShedAfter. The accept loop therefore keeps draining the kernel's
// listen backlog, and a new peer waits in it at most about (connections
// ahead of it) x ShedAfter / (slots not started). When no connection may
// be shed, Accept waits for a slot, as golang.org/x/net/netutil.LimitListener
// does.
//
// A listener may also keep a small reserve of slots beyond its cap for
// short requests the server answers at once (liveness and readiness
// probes): Reserved tells the server which connections got one, so it can
// serve them the probes only (Handler). Slow peers that hold every slot of
// the cap cannot reach the reserve for long.
package connlimit

import (
	"container/heap"
	"container/list"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a process's connection metrics, one series per listener
// (label "listener").
type Metrics struct {
	// Open is the number of admitted connections not yet closed, reserve
	// included (<namespace>_<subsystem>_connections{listener}).
	Open *prometheus.GaugeVec
	// Limit is the listener's cap, without the reserve
	// (<namespace>_<subsystem>_connection_limit{listener}).
	Limit *prometheus.GaugeVec
	// LimitReached counts the new connections that found the cap reached
	// (<namespace>_<subsystem>_connection_limit_reached_total{listener}):
	// each then shed a connection that had not started, took a reserve
	// slot, or waited for a slot.
	LimitReached *prometheus.CounterVec
	// Shed counts the connections closed at the cap, before they started,
	// to admit a new one (<namespace>_<subsystem>_connections_shed_total{listener}).
	Shed *prometheus.CounterVec
}

// NewMetrics creates the metrics under namespace and subsystem and
// registers them on reg (nil: none).
func NewMetrics(reg prometheus.Registerer, namespace, subsystem string) (*Metrics, error) {
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: namespace, Subsystem: subsystem, Name: name, Help: help}
	}
	m := &Metrics{
		Open: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("connections",
			"Open connections per listener.")), []string{"listener"}),
		Limit: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("connection_limit",
			"Most connections a listener holds open at once (its probe reserve aside).")), []string{"listener"}),
		LimitReached: prometheus.NewCounterVec(prometheus.CounterOpts(o("connection_limit_reached_total",
			"New connections that found the listener at its connection limit.")), []string{"listener"}),
		Shed: prometheus.NewCounterVec(prometheus.CounterOpts(o("connections_shed_total",
			"Connections closed at the connection limit, before their first call or request, to admit a new one.")), []string{"listener"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Open, m.Limit, m.LimitReached, m.Shed} {
			if err := reg.Register(c); err != nil {
				return nil, errors.Newf("connlimit: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Config is one listener's admission policy.
type Config struct {
	// Name labels the listener's metrics ("grpc", "http", "metrics").
	Name string
	// Max is the most connections the listener holds open at once, at
	// least 1.
	Max int
	// ShedAfter: at the cap, a connection that has not been Established
	// for this long may be shed to admit a new one (see the package doc).
	// 0: none is ever shed, and Accept waits at the cap for a connection
	// to close.
	ShedAfter time.Duration
	// Reserve is how many connections the listener admits beyond Max
	// when no connection can be shed (0: none). They are Reserved: the
	// server should answer them at once or close them (Handler).
	Reserve int
	// Metrics receive the listener's series; nil: none.
	Metrics *Metrics
}

// Listener is a net.Listener that holds at most Max (plus Reserve)
// accepted connections open at once, admitting new ones at the cap as the
// package doc says. Close it (not only the listener it wraps), so that an
// Accept waiting at the cap returns.
type Listener struct {
	net.Listener
	cfg Config

	mu       sync.Mutex
	used     int                   // slots of Max taken
	reserved int                   // reserve slots taken
	pending  addrHeap              // addresses with connections not started
	byAddr   map[string]*addrState // source host -> what it holds
	byRemote sync.Map              // remote address -> *Conn, while pending
	changed  chan struct{}         // closed and replaced when a slot frees or a connection starts
	closed   chan struct{}
	once     sync.Once

	open, limit  prometheus.Gauge
	reached, shd prometheus.Counter
}

// New wraps l with cfg's policy.
func New(l net.Listener, cfg Config) (*Listener, error) {
	switch {
	case cfg.Max < 1:
		return nil, errors.Newf("connlimit: listener %s: cap %d must be at least 1", cfg.Name, cfg.Max)
	case cfg.Reserve < 0:
		return nil, errors.Newf("connlimit: listener %s: reserve %d is negative", cfg.Name, cfg.Reserve)
	case cfg.ShedAfter < 0:
		return nil, errors.Newf("connlimit: listener %s: ShedAfter %v is negative", cfg.Name, cfg.ShedAfter)
	}
	m := cfg.Metrics
	if m == nil {
		m, _ = NewMetrics(nil, "", "")
	}
	ll := &Listener{
		Listener: l,
		cfg:      cfg,
		byAddr:   map[string]*addrState{},
		changed:  make(chan struct{}),
		closed:   make(chan struct{}),
		open:     m.Open.WithLabelValues(cfg.Name),
		limit:    m.Limit.WithLabelValues(cfg.Name),
		reached:  m.LimitReached.WithLabelValues(cfg.Name),
		shd:      m.Shed.WithLabelValues(cfg.Name),
	}
	ll.limit.Set(float64(cfg.Max))
	return ll, nil
}

// Accept accepts the next connection and admits it: to a free slot, to the
// slot of a connection it sheds, to a reserve slot, or, when every slot
// holds a connection that has started, once one closes (holding the
// accepted connection meanwhile: one descriptor beyond the cap).
func (l *Listener) Accept() (net.Conn, error) {
	select {
	case <-l.closed:
		return nil, net.ErrClosed
	default:
	}
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	ac, victim, ok := l.admit(c)
	if victim != nil {
		victim.Conn.Close()
	}
	if !ok {
		c.Close()
		return nil, net.ErrClosed
	}
	return ac, nil
}

// admit waits for a slot for c; it returns the admitted connection and the
// one shed for it (nil: none; the caller closes it), or ok false once the
// listener is closed.
func (l *Listener) admit(c net.Conn) (_ *Conn, victim *Conn, ok bool) {
	ac := &Conn{Conn: c, l: l, host: hostOf(c.RemoteAddr())}
	counted := false
	for {
		l.mu.Lock()
		now := time.Now()
		if l.used < l.cfg.Max {
			l.used++
			l.enterLocked(ac, now, false)
			l.mu.Unlock()
			return ac, nil, true
		}
		if !counted {
			counted = true
			l.reached.Inc()
		}
		v := l.victimLocked(ac.host)
		if v != nil && l.cfg.ShedAfter > 0 && now.Sub(v.admitted) >= l.cfg.ShedAfter {
			l.leaveLocked(v)
			l.dropLocked(v)
			v.state = shed
			l.shd.Inc()
			l.open.Dec()
			l.enterLocked(ac, now, v.reserve) // the slot changes hands
			l.mu.Unlock()
			return ac, v, true
		}
		if l.reserved < l.cfg.Reserve {
			l.reserved++
			l.enterLocked(ac, now, true)
			l.mu.Unlock()
			return ac, nil, true
		}
		// Wait for a slot, a change of who is pending, or the victim's
		// ShedAfter.
		changed := l.changed
		var timer *time.Timer
		var due <-chan time.Time
		if v != nil && l.cfg.ShedAfter > 0 {
			timer = time.NewTimer(v.admitted.Add(l.cfg.ShedAfter).Sub(now))
			due = timer.C
		}
		l.mu.Unlock()
		select {
		case <-changed:
		case <-due:
		case <-l.closed:
		}
		if timer != nil {
			timer.Stop()
		}
		select {
		case <-l.closed:
			return nil, nil, false
		default:
		}
	}
}

// victimLocked is the connection shedding would close for a newcomer from
// host, or nil: the oldest pending connection of the address that holds
// the most slots among those with a pending one, provided that address
// holds more slots than the newcomer's, or is the newcomer's own (which
// pays first when it would then hold the most).
func (l *Listener) victimLocked(host string) *Conn {
	own := l.byAddr[host]
	var v *addrState
	if len(l.pending) > 0 {
		v = l.pending[0]
	}
	switch {
	case own != nil && own.conns.Len() > 0 && (v == own || own.total+1 > v.total):
		v = own
	case v == nil:
		return nil
	case own != nil && v.total <= own.total:
		return nil // a smaller (or equal) address's only hope: leave it
	}
	return v.conns.Front().Value.(*Conn)
}

// enterLocked admits c now as pending, to a reserve slot or not.
func (l *Listener) enterLocked(c *Conn, now time.Time, reserve bool) {
	c.admitted, c.reserve, c.state = now, reserve, pending
	a := l.byAddr[c.host]
	if a == nil {
		a = &addrState{host: c.host, conns: list.New(), idx: -1}
		l.byAddr[c.host] = a
	}
	a.total++
	c.elem = a.conns.PushBack(c)
	l.fixLocked(a)
	l.byRemote.Store(remoteKey(c.Conn), c)
	l.open.Inc()
}

// leaveLocked takes c, pending, out of its address's pending list.
func (l *Listener) leaveLocked(c *Conn) {
	a := l.byAddr[c.host]
	a.conns.Remove(c.elem)
	c.elem = nil
	l.fixLocked(a)
	l.byRemote.CompareAndDelete(remoteKey(c.Conn), c)
}

// dropLocked gives up c's slot in its address's count (c closed or shed).
func (l *Listener) dropLocked(c *Conn) {
	a := l.byAddr[c.host]
	a.total--
	if a.total == 0 {
		delete(l.byAddr, c.host)
	}
	l.fixLocked(a)
}

// fixLocked restores the heap after a's counts changed: a is in it while it
// has a pending connection.
func (l *Listener) fixLocked(a *addrState) {
	switch in := a.idx >= 0; {
	case in && a.conns.Len() == 0:
		heap.Remove(&l.pending, a.idx)
		a.idx = -1
	case in:
		heap.Fix(&l.pending, a.idx)
	case a.conns.Len() > 0:
		heap.Push(&l.pending, a)
	}
}

// notifyLocked wakes an Accept waiting at the cap.
func (l *Listener) notifyLocked() {
	close(l.changed)
	l.changed = make(chan struct{})
}

// Established marks the pending connection whose remote address is addr
// as started: it is never shed (for servers that see a connection's
// address, not the connection: gRPC's interceptors). An unknown address
// is ignored. Cheap when the connection is not pending any more.
func (l *Listener) Established(addr net.Addr) {
	if addr == nil {
		return
	}
	if c, ok := l.byRemote.Load(addr.String()); ok {
		c.(*Conn).Establish()
	}
}

// Close closes the wrapped listener and ends an Accept waiting at the cap.
// Connections already accepted stay open.
func (l *Listener) Close() error {
	err := net.ErrClosed
	l.once.Do(func() {
		close(l.closed)
		err = l.Listener.Close()
	})
	return err
}

// connState is where a connection is in its life.
type connState int

const (
	pending     connState = iota // admitted, not started: may be shed
	established                  // started: never shed
	shed                         // closed by the listener; its slot went to another
	released                     // closed by its server; its slot is free
)

// Conn is a connection a Listener admitted. Its Close gives the slot back
// (once, however often it is called). Once a write on it has timed out,
// every later write fails at once (see Write).
type Conn struct {
	net.Conn
	l        *Listener
	host     string
	admitted time.Time
	reserve  bool
	state    connState     // under l.mu
	elem     *list.Element // in its address's pending list, while pending
	stalled  atomic.Bool   // a write timed out: the peer does not read
}

// Write is the connection's Write; a timeout marks the peer as one that
// does not read. crypto/tls's Close then still writes a close_notify alert
// with a deadline of its own (5 s), which a peer that stopped reading
// holds for all of it, with the slot: so on a stalled connection every
// deadline set for writing is the past, and that write fails at once.
func (c *Conn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		c.stalled.Store(true)
	}
	return n, err
}

// stalledDeadline is the write deadline of a stalled connection: the past.
var stalledDeadline = time.Unix(1, 0)

func (c *Conn) SetWriteDeadline(t time.Time) error {
	if c.stalled.Load() {
		t = stalledDeadline
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *Conn) SetDeadline(t time.Time) error {
	if c.stalled.Load() {
		if err := c.Conn.SetReadDeadline(t); err != nil {
			return err
		}
		return c.Conn.SetWriteDeadline(stalledDeadline)
	}
	return c.Conn.SetDeadline(t)
}

// Reserved reports whether c holds a reserve slot: the server should
// answer it at once, or close it.
func (c *Conn) Reserved() bool { return c.reserve }

// Establish marks c as started (a call or request arrived): it is never
// shed from now on.
func (c *Conn) Establish() {
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	if c.state != pending {
		return
	}
	l.leaveLocked(c)
	c.state = established
	l.notifyLocked() // the victim Accept waits for may have changed
}

func (c *Conn) Close() error {
	err := c.Conn.Close()
	l := c.l
	l.mu.Lock()
	defer l.mu.Unlock()
	switch c.state {
	case shed, released:
		return err
	case pending:
		l.leaveLocked(c)
	}
	l.dropLocked(c)
	c.state = released
	if c.reserve {
		l.reserved--
	} else {
		l.used--
	}
	l.open.Dec()
	l.notifyLocked()
	return err
}

// Of is the Conn under c (through TLS, or any wrapper with a NetConn
// method), or nil if c was not admitted by a Listener.
func Of(c net.Conn) *Conn {
	for c != nil {
		if ac, ok := c.(*Conn); ok {
			return ac
		}
		u, ok := c.(interface{ NetConn() net.Conn })
		if !ok {
			return nil
		}
		c = u.NetConn()
	}
	return nil
}

// addrState is what one source address holds: its slots (connections
// admitted and not closed) and, oldest first, those not started.
type addrState struct {
	host  string
	total int
	conns *list.List // pending *Conn
	idx   int        // in the heap; -1: not in it (nothing pending)
}

// addrHeap orders the addresses with pending connections by the slots
// they hold, most first, then by their oldest pending connection.
type addrHeap []*addrState

func (h addrHeap) Len() int { return len(h) }
func (h addrHeap) Less(i, j int) bool {
	a, b := h[i], h[j]
	if a.total != b.total {
		return a.total > b.total
	}
	return a.conns.Front().Value.(*Conn).admitted.Before(b.conns.Front().Value.(*Conn).admitted)
}
func (h addrHeap) Swap(i, j int) {
	h[i], h[j] = h[j], h[i]
	h[i].idx, h[j].idx = i, j
}
func (h *addrHeap) Push(x any) {
	a := x.(*addrState)
	a.idx = len(*h)
	*h = append(*h, a)
}
func (h *addrHeap) Pop() any {
	old := *h
	a := old[len(old)-1]
	*h = old[:len(old)-1]
	a.idx = -1
	return a
}

// hostOf is the host part of a remote address (the whole string when it
// has no port, as net.Pipe's "pipe").
func hostOf(a net.Addr) string {
	if a == nil {
		return ""
	}
	s := a.String()
	if h, _, err := net.SplitHostPort(s); err == nil {
		return h
	}
	return s
}

func remoteKey(c net.Conn) string {
	if a := c.RemoteAddr(); a != nil {
		return a.String()
	}
	return ""
}
