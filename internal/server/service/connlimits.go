package service

import (
	"context"
	"net"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/tap"
)

// Defaults of ConnLimits.
const (
	// DefaultHandshakeTimeout is ConnLimits.HandshakeTimeout's default
	// (gRPC's own is 120 s, during which an idle TCP connection holds a
	// file descriptor).
	DefaultHandshakeTimeout = 5 * time.Second
	// DefaultIdleTimeout is ConnLimits.IdleTimeout's default.
	DefaultIdleTimeout = 2 * time.Minute
	// DefaultMaxStreams is ConnLimits.MaxStreams's default: HTTP/2's
	// recommended minimum (RFC 9113, section 6.5.2).
	DefaultMaxStreams = 100
)

// ConnLimits bound what one peer can hold on a replica's gRPC server
// (ServerOptions). Zero fields take the defaults. The number of
// connections is bounded by the listener (rangesvc serve
// --max-connections, internal/server/connlimit).
type ConnLimits struct {
	// HandshakeTimeout bounds a new connection's TLS handshake and HTTP/2
	// preface (grpc.ConnectionTimeout): a peer that connects and sends
	// nothing, or half a handshake, is closed after it. It also bounds
	// the time from a call's headers to its first request message: a
	// call that never sends one ends with DEADLINE_EXCEEDED instead of
	// holding its stream. Default DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// IdleTimeout closes a connection that has had no call for this long
	// (keepalive.ServerParameters.MaxConnectionIdle, a graceful GOAWAY);
	// a client reconnects at its next call. Default DefaultIdleTimeout.
	IdleTimeout time.Duration
	// MaxStreams bounds the concurrent calls on one connection
	// (grpc.MaxConcurrentStreams); a gRPC client queues further calls
	// until a stream is free. Default DefaultMaxStreams.
	MaxStreams uint32
	// Established, if set, is told the remote address of a connection on
	// which a call arrives (its headers, before any authentication): the
	// listener's admission (internal/server/connlimit.Listener.Established)
	// stops counting the connection as one that may be shed at the cap.
	Established func(remote net.Addr)
}

func (l ConnLimits) withDefaults() ConnLimits {
	if l.HandshakeTimeout == 0 {
		l.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if l.IdleTimeout == 0 {
		l.IdleTimeout = DefaultIdleTimeout
	}
	if l.MaxStreams == 0 {
		l.MaxStreams = DefaultMaxStreams
	}
	return l
}

// firstMessageOptions end a call whose first request message does not
// arrive within d of its headers. gRPC reads a unary call's request
// before any interceptor runs, and without a deadline from the client it
// waits for it forever, holding the stream and a goroutine: an InTapHandle
// (which runs when the headers arrive) gives the stream a context that a
// timer ends, and interceptors stop the timer once the message is in.
//
// The same hook tells l.Established that a call arrived on its connection.
func firstMessageOptions(l ConnLimits) []grpc.ServerOption {
	d := l.HandshakeTimeout
	return []grpc.ServerOption{
		grpc.InTapHandle(func(ctx context.Context, _ *tap.Info) (context.Context, error) {
			if l.Established != nil {
				if p, ok := peer.FromContext(ctx); ok {
					l.Established(p.Addr)
				}
			}
			return newFirstMessageCtx(ctx, d), nil
		}),
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			firstMessageIn(ctx) // the request was decoded before any interceptor runs
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			return h(srv, &firstMessageStream{ServerStream: ss})
		}),
	}
}

// firstMessageCtx is a call's context until its first request message
// arrives. If the timer fires first, the context ends with
// context.DeadlineExceeded: gRPC's wait for the message returns, the
// caller gets DEADLINE_EXCEEDED, and the stream is freed.
type firstMessageCtx struct {
	context.Context // a cancel context under the stream's own
	timer           *time.Timer
	expired         atomic.Bool
}

type firstMessageKey struct{}

func newFirstMessageCtx(parent context.Context, d time.Duration) *firstMessageCtx {
	ctx, cancel := context.WithCancel(parent)
	c := &firstMessageCtx{Context: ctx}
	c.timer = time.AfterFunc(d, func() {
		c.expired.Store(true)
		cancel()
	})
	// When the stream ends first, ctx ends with it (its parent is
	// cancelled); the timer then fires into an ended context, harmlessly,
	// unless a message stopped it.
	return c
}

// Err is the wrapped context's, but DeadlineExceeded once the timer ended
// it: the call ran out of time, it was not cancelled by its caller.
func (c *firstMessageCtx) Err() error {
	err := c.Context.Err()
	if err != nil && c.expired.Load() {
		return context.DeadlineExceeded
	}
	return err
}

func (c *firstMessageCtx) Value(key any) any {
	if key == (firstMessageKey{}) {
		return c
	}
	return c.Context.Value(key)
}

// firstMessageIn stops the timer of ctx's call, if it has one (calls
// through the HTTP API have none: their transport does not run the tap).
func firstMessageIn(ctx context.Context) {
	if c, ok := ctx.Value(firstMessageKey{}).(*firstMessageCtx); ok {
		c.timer.Stop()
	}
}

// firstMessageStream stops the timer when the handler's first RecvMsg
// returns (every streaming handler of the services a replica registers,
// health Watch and reflection, reads its request first).
type firstMessageStream struct {
	grpc.ServerStream
	in bool
}

func (s *firstMessageStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if !s.in {
		s.in = true
		firstMessageIn(s.Context())
	}
	return err
}
