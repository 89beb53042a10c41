// Package faultproxy is a loopback TCP proxy that a test puts between a
// client and a server to inject network faults on demand: a partition that
// silently drops every byte (Blackhole), a hard cut that closes every
// connection and refuses new ones (Cut), and added latency (SetDelay).
//
// The fault suite puts one Proxy in front of each etcd member for each
// range-service replica, so it can isolate one replica from etcd, or make
// etcd slow for it, while the other replica and the etcd cluster itself keep
// working.
//
// Why not go.etcd.io/etcd/pkg/v3/proxy: it listens on ":port" (every
// interface) when given a port, and cannot report the port it bound when
// given port 0, so a test can neither stay on loopback nor use random ports.
// This one always listens on 127.0.0.1 (port 0 by default) and reports
// Addr().
//
// Semantics:
//
//   - Pass (the initial mode, and after Heal): bytes are forwarded both ways,
//     each chunk held back by the current delay (SetDelay), order kept.
//   - Blackhole: connections stay open, bytes in both directions are read and
//     dropped, new connections are accepted but never reach the target — what
//     a client sees during a network partition (no RST, requests time out).
//     A connection that lost bytes can no longer carry its protocol, so Heal
//     closes it; peers reconnect through the healed proxy.
//   - Cut: every connection is closed at once and new ones are closed as soon
//     as they are accepted (the peer sees EOF/reset right away).
package faultproxy

import (
	"io"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
)

// Mode is the proxy's fault state.
type Mode int32

const (
	// Pass forwards bytes (with the configured delay).
	Pass Mode = iota
	// Blackhole drops every byte and keeps connections open.
	Blackhole
	// Cut closes every connection and refuses new ones.
	Cut
)

func (m Mode) String() string {
	switch m {
	case Pass:
		return "pass"
	case Blackhole:
		return "blackhole"
	case Cut:
		return "cut"
	}
	return "mode(" + strconv.Itoa(int(m)) + ")"
}

// DefaultDialTimeout bounds the dial to the target for one new connection.
const DefaultDialTimeout = 2 * time.Second

// chunkSize is the largest read forwarded as one chunk.
const chunkSize = 32 << 10

// queueLen is how many chunks may wait for their delay per direction before
// the reader stops reading (backpressure instead of unbounded memory).
const queueLen = 256

// Stats are cumulative counters of a Proxy.
type Stats struct {
	Accepted  int64 // connections accepted
	Forwarded int64 // bytes forwarded (both directions)
	Dropped   int64 // bytes dropped by Blackhole
	Refused   int64 // connections closed by Cut at accept
}

// Proxy forwards TCP connections from Addr() to a target address.
type Proxy struct {
	target string
	ln     net.Listener

	mode  atomic.Int32
	delay atomic.Int64 // ns

	mu     sync.Mutex
	links  map[*link]struct{}
	closed bool
	wg     sync.WaitGroup

	accepted, forwarded, dropped, refused atomic.Int64
}

// link is one proxied connection pair.
type link struct {
	client, upstream net.Conn // upstream is nil for a blackholed accept
	poisoned         atomic.Bool
	once             sync.Once
}

func (l *link) close() {
	l.once.Do(func() {
		l.client.Close()
		if l.upstream != nil {
			l.upstream.Close()
		}
	})
}

// New starts a proxy on a random port of 127.0.0.1 forwarding to target
// ("host:port").
func New(target string) (*Proxy, error) { return Listen("127.0.0.1:0", target) }

// Listen starts a proxy on addr, which must be a loopback address, forwarding
// to target.
func Listen(addr, target string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, errors.Wrapf(err, "faultproxy: listen address %q", addr)
	}
	if ip := net.ParseIP(host); ip == nil || !ip.IsLoopback() {
		return nil, errors.Newf("faultproxy: listen address %q is not a loopback IP", addr)
	}
	if _, _, err := net.SplitHostPort(target); err != nil {
		return nil, errors.Wrapf(err, "faultproxy: target %q", target)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, errors.Wrapf(err, "faultproxy: listen on %q", addr)
	}
	p := &Proxy{target: target, ln: ln, links: map[*link]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	return p, nil
}

// Addr is the proxy's listening address ("127.0.0.1:port").
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// Target is the address connections are forwarded to.
func (p *Proxy) Target() string { return p.target }

// Mode returns the current fault mode.
func (p *Proxy) Mode() Mode { return Mode(p.mode.Load()) }

// Delay returns the current one-way delay.
func (p *Proxy) Delay() time.Duration { return time.Duration(p.delay.Load()) }

// SetDelay makes every chunk wait d (each direction, so a request/response
// round trip gains 2d). Zero removes the delay. Chunks already queued keep
// the delay they were given.
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(max(d, 0))) }

// Blackhole drops every byte from now on, keeping connections open.
func (p *Proxy) Blackhole() { p.mode.Store(int32(Blackhole)) }

// Cut closes every connection now and refuses new ones until Heal.
func (p *Proxy) Cut() {
	p.mode.Store(int32(Cut))
	for _, l := range p.snapshot() {
		l.close()
	}
}

// Heal returns to Pass. Connections that lost bytes to a blackhole are
// closed (their byte streams are broken); the others carry on.
func (p *Proxy) Heal() {
	p.mode.Store(int32(Pass))
	for _, l := range p.snapshot() {
		if l.poisoned.Load() || l.upstream == nil {
			l.close()
		}
	}
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	return Stats{Accepted: p.accepted.Load(), Forwarded: p.forwarded.Load(),
		Dropped: p.dropped.Load(), Refused: p.refused.Load()}
}

// Close stops the proxy, closes every connection and waits for its
// goroutines.
func (p *Proxy) Close() error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil
	}
	p.closed = true
	p.mu.Unlock()
	err := p.ln.Close()
	for _, l := range p.snapshot() {
		l.close()
	}
	p.wg.Wait()
	return err
}

func (p *Proxy) snapshot() []*link {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*link, 0, len(p.links))
	for l := range p.links {
		out = append(out, l)
	}
	return out
}

func (p *Proxy) track(l *link) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	p.links[l] = struct{}{}
	return true
}

func (p *Proxy) untrack(l *link) {
	p.mu.Lock()
	delete(p.links, l)
	p.mu.Unlock()
}

func (p *Proxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return // listener closed
		}
		p.accepted.Add(1)
		switch p.Mode() {
		case Cut:
			p.refused.Add(1)
			c.Close()
			continue
		case Blackhole:
			l := &link{client: c}
			l.poisoned.Store(true)
			if !p.track(l) {
				c.Close()
				return
			}
			p.wg.Add(1)
			go p.sink(l)
			continue
		}
		p.wg.Add(1)
		go p.connect(c)
	}
}

// sink reads and drops what a client sends on a connection accepted during a
// blackhole, until it is closed (by Heal, Cut, Close or the client).
func (p *Proxy) sink(l *link) {
	defer p.wg.Done()
	defer p.untrack(l)
	defer l.close()
	n, _ := io.Copy(io.Discard, l.client)
	p.dropped.Add(n)
}

func (p *Proxy) connect(c net.Conn) {
	defer p.wg.Done()
	up, err := net.DialTimeout("tcp", p.target, DefaultDialTimeout)
	if err != nil {
		c.Close() // the client sees what it would see without the proxy: no server
		return
	}
	l := &link{client: c, upstream: up}
	if !p.track(l) {
		l.close()
		return
	}
	if p.Mode() == Cut { // cut while dialling
		p.untrack(l)
		l.close()
		return
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); p.pipe(l, c, up) }()
	go func() { defer wg.Done(); p.pipe(l, up, c) }()
	wg.Wait()
	p.untrack(l)
}

type chunk struct {
	b   []byte
	due time.Time
}

// pipe forwards src to dst through a delay queue; either side failing closes
// the link (both directions).
func (p *Proxy) pipe(l *link, src, dst net.Conn) {
	defer l.close()
	q := make(chan chunk, queueLen)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ch := range q {
			if d := time.Until(ch.due); d > 0 {
				time.Sleep(d)
			}
			// The mode may have changed while the chunk waited.
			if p.Mode() != Pass {
				p.drop(l, len(ch.b))
				continue
			}
			if _, err := dst.Write(ch.b); err != nil {
				l.close()
				for range q { // drain so the reader can finish
				}
				return
			}
			p.forwarded.Add(int64(len(ch.b)))
		}
	}()
	buf := make([]byte, chunkSize)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			if p.Mode() != Pass {
				p.drop(l, n)
			} else {
				b := make([]byte, n)
				copy(b, buf[:n])
				q <- chunk{b: b, due: time.Now().Add(p.Delay())}
			}
		}
		if err != nil {
			break
		}
	}
	close(q)
	<-done
}

func (p *Proxy) drop(l *link, n int) {
	l.poisoned.Store(true)
	p.dropped.Add(int64(n))
	if p.Mode() == Cut {
		l.close()
	}
}
