// This file counts what a gRPC client sends over the network: calls
// per method and payload bytes on the wire. The comparison module installs
// it on each strategy's connection, so "network calls per 1M IDs" is a
// count, not an estimate.

package measure

import (
	"context"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// RPCCounter accumulates calls and bytes. The zero value is ready; it is safe
// for concurrent use.
type RPCCounter struct {
	calls     atomic.Uint64
	failed    atomic.Uint64
	sentBytes atomic.Uint64
	recvBytes atomic.Uint64

	mu       sync.Mutex
	byMethod map[string]uint64
}

// RPCSnapshot is a point-in-time reading of an RPCCounter.
type RPCSnapshot struct {
	Calls     uint64            `json:"calls"`
	Failed    uint64            `json:"failed"`
	SentBytes uint64            `json:"sent_bytes"` // gRPC message bytes incl. 5-byte framing, not HTTP/2 or TCP
	RecvBytes uint64            `json:"recv_bytes"`
	ByMethod  map[string]uint64 `json:"by_method,omitempty"`
}

// Snapshot reads the counter.
func (c *RPCCounter) Snapshot() RPCSnapshot {
	s := RPCSnapshot{Calls: c.calls.Load(), Failed: c.failed.Load(), SentBytes: c.sentBytes.Load(), RecvBytes: c.recvBytes.Load()}
	c.mu.Lock()
	if len(c.byMethod) > 0 {
		s.ByMethod = make(map[string]uint64, len(c.byMethod))
		for m, n := range c.byMethod {
			s.ByMethod[m] = n
		}
	}
	c.mu.Unlock()
	return s
}

// DialOptions returns the options that feed c: a unary interceptor for
// calls and a stats handler for wire bytes.
func (c *RPCCounter) DialOptions() []grpc.DialOption {
	return []grpc.DialOption{
		grpc.WithChainUnaryInterceptor(c.intercept),
		grpc.WithStatsHandler(handler{c}),
	}
}

func (c *RPCCounter) intercept(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	c.calls.Add(1)
	c.mu.Lock()
	if c.byMethod == nil {
		c.byMethod = map[string]uint64{}
	}
	c.byMethod[method]++
	c.mu.Unlock()
	err := invoker(ctx, method, req, reply, cc, opts...)
	if err != nil {
		c.failed.Add(1)
	}
	return err
}

type handler struct{ c *RPCCounter }

func (h handler) TagRPC(ctx context.Context, _ *stats.RPCTagInfo) context.Context { return ctx }
func (h handler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context {
	return ctx
}
func (h handler) HandleConn(context.Context, stats.ConnStats) {}

func (h handler) HandleRPC(_ context.Context, s stats.RPCStats) {
	switch p := s.(type) {
	case *stats.OutPayload:
		h.c.sentBytes.Add(uint64(p.WireLength))
	case *stats.InPayload:
		h.c.recvBytes.Add(uint64(p.WireLength))
	}
}
