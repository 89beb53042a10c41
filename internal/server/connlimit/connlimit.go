// Package connlimit caps how many connections a listener holds open at
// once. At the cap, Accept waits until one of them is closed: the
// connections that keep arriving queue in the kernel's listen backlog,
// where they cost the process no file descriptor, so a flood of idle
// peers cannot use up the descriptors the rest of the process (an
// embedded etcd, its data files) needs.
//
// It is golang.org/x/net/netutil.LimitListener with metrics: how many
// connections are open, the cap, and how often Accept had to wait at it.
package connlimit

import (
	"net"
	"sync"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are a process's connection metrics, one series per listener
// (label "listener").
type Metrics struct {
	// Open is the number of accepted connections not yet closed
	// (<namespace>_<subsystem>_connections{listener}).
	Open *prometheus.GaugeVec
	// Limit is the listener's cap (<namespace>_<subsystem>_connection_limit{listener}).
	Limit *prometheus.GaugeVec
	// LimitReached counts the times Accept found the cap reached and
	// waited for a connection to close
	// (<namespace>_<subsystem>_connection_limit_reached_total{listener}).
	LimitReached *prometheus.CounterVec
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
			"Most connections a listener holds open at once; more wait in the kernel's listen backlog.")), []string{"listener"}),
		LimitReached: prometheus.NewCounterVec(prometheus.CounterOpts(o("connection_limit_reached_total",
			"Times a listener was at its connection limit and stopped accepting until a connection closed.")), []string{"listener"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.Open, m.Limit, m.LimitReached} {
			if err := reg.Register(c); err != nil {
				return nil, errors.Newf("connlimit: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

// Listener is a net.Listener that holds at most its cap of accepted
// connections open at once. Close it (not only the listener it wraps), so
// that an Accept waiting at the cap returns.
type Listener struct {
	net.Listener
	slots  chan struct{} // one element per open connection
	closed chan struct{}
	once   sync.Once

	open    prometheus.Gauge
	reached prometheus.Counter
}

// Wrap caps l at max open connections, counted in m's series labelled
// name (m nil: no metrics). max must be at least 1.
func Wrap(l net.Listener, max int, m *Metrics, name string) (*Listener, error) {
	if max < 1 {
		return nil, errors.Newf("connlimit: listener %s: cap %d must be at least 1", name, max)
	}
	if m == nil {
		m, _ = NewMetrics(nil, "", "")
	}
	m.Limit.WithLabelValues(name).Set(float64(max))
	return &Listener{
		Listener: l,
		slots:    make(chan struct{}, max),
		closed:   make(chan struct{}),
		open:     m.Open.WithLabelValues(name),
		reached:  m.LimitReached.WithLabelValues(name),
	}, nil
}

// Accept waits for a free slot (at the cap: until an accepted connection
// is closed, or the listener is), then accepts the next connection.
func (l *Listener) Accept() (net.Conn, error) {
	if !l.acquire() {
		// Closed: the wrapped listener reports it as it always does.
		c, err := l.Listener.Accept()
		if err == nil {
			c.Close()
			err = net.ErrClosed
		}
		return nil, err
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.slots
		return nil, err
	}
	l.open.Inc()
	return &conn{Conn: c, l: l}, nil
}

// acquire takes a slot, waiting at the cap; false once the listener is
// closed.
func (l *Listener) acquire() bool {
	select {
	case <-l.closed:
		return false
	default:
	}
	select {
	case l.slots <- struct{}{}:
		return true
	default:
	}
	l.reached.Inc()
	select {
	case l.slots <- struct{}{}:
		return true
	case <-l.closed:
		return false
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

// conn gives its listener's slot back when it is closed (once, however
// often Close is called).
type conn struct {
	net.Conn
	l    *Listener
	once sync.Once
}

func (c *conn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		c.l.open.Dec()
		<-c.l.slots
	})
	return err
}
