package service

import (
	"context"
	"errors"
	"io"
	"net"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/connectivity"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/emptypb"
)

// slowService has a unary method, /test.Slow/Wait, that answers after the
// duration it is sent (or when the call's context ends), and its
// streaming twin /test.Slow/WaitStream. Each Wait call's handler sends on
// started (if not nil) when it begins.
func slowService(started chan<- struct{}) *grpc.ServiceDesc {
	return &grpc.ServiceDesc{
		ServiceName: "test.Slow",
		HandlerType: (*any)(nil),
		Methods: []grpc.MethodDesc{{MethodName: "Wait", Handler: func(srv any, ctx context.Context, dec func(any) error,
			in grpc.UnaryServerInterceptor) (any, error) {
			req := new(durationpb.Duration)
			if err := dec(req); err != nil {
				return nil, err
			}
			h := func(ctx context.Context, req any) (any, error) {
				if started != nil {
					started <- struct{}{}
				}
				return &emptypb.Empty{}, wait(ctx, req.(*durationpb.Duration).AsDuration())
			}
			if in == nil {
				return h(ctx, req)
			}
			return in(ctx, req, &grpc.UnaryServerInfo{Server: srv, FullMethod: waitMethod}, h)
		}}},
		Streams: []grpc.StreamDesc{{StreamName: "WaitStream", ClientStreams: true, ServerStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				req := new(durationpb.Duration)
				if err := ss.RecvMsg(req); err != nil {
					return err
				}
				if err := wait(ss.Context(), req.AsDuration()); err != nil {
					return err
				}
				return ss.SendMsg(&emptypb.Empty{})
			}}},
	}
}

// wait returns after d, or with ctx's status when ctx ends first.
func wait(ctx context.Context, d time.Duration) error {
	select {
	case <-time.After(d):
		return nil
	case <-ctx.Done():
		return status.FromContextError(ctx.Err()).Err()
	}
}

const (
	waitMethod       = "/test.Slow/Wait"
	waitStreamMethod = "/test.Slow/WaitStream"
)

// limitedServer serves slowService(started) with ServerOptions(l) on a
// loopback port and returns its address.
func limitedServer(t *testing.T, l ConnLimits, started chan<- struct{}) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer(ServerOptions(l)...)
	srv.RegisterService(slowService(started), struct{}{})
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String()
}

func dialLimited(t *testing.T, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// slack is how late a timeout may act on a loaded 2-core machine under
// -race.
const slack = 3 * time.Second

// A peer that connects and sends nothing, or half of the HTTP/2 preface,
// is closed after HandshakeTimeout (gRPC's default would wait 120 s).
func TestServerOptionsHandshakeTimeout(t *testing.T) {
	const d = 500 * time.Millisecond
	addr := limitedServer(t, ConnLimits{HandshakeTimeout: d}, nil)
	for name, send := range map[string]string{"idle": "", "half preface": "PRI * HTTP/2.0\r\n"} {
		t.Run(name, func(t *testing.T) {
			c, err := net.Dial("tcp", addr)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if _, err := io.WriteString(c, send); err != nil {
				t.Fatal(err)
			}
			c.SetReadDeadline(start.Add(d + slack))
			_, err = io.Copy(io.Discard, c) // until the server closes
			took := time.Since(start)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				t.Fatalf("connection still open after %v, want it closed after the %v handshake timeout", took, d)
			}
			if took < d/2 {
				t.Fatalf("closed after %v (%v), before the %v handshake timeout", took, err, d)
			}
			t.Logf("closed after %v", took)
		})
	}
}

// A call whose request message never follows its headers ends with
// DEADLINE_EXCEEDED after HandshakeTimeout, and the connection keeps
// serving; a call whose request arrived is not cut off by that timer,
// however long its handler takes (unary or streaming).
func TestServerOptionsFirstMessageTimeout(t *testing.T) {
	const d = 500 * time.Millisecond
	cc := dialLimited(t, limitedServer(t, ConnLimits{HandshakeTimeout: d}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), d+2*slack)
	defer cancel()

	// NewStream sends the headers at once; no message follows.
	cs, err := cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, waitMethod)
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	err = cs.RecvMsg(new(emptypb.Empty))
	took := time.Since(start)
	if status.Code(err) != codes.DeadlineExceeded || took > d+slack {
		t.Fatalf("a call without a request: %v after %v; want DEADLINE_EXCEEDED after about %v", err, took, d)
	}
	t.Logf("a call without a request ended after %v: %v", took, err)

	if err := cc.Invoke(ctx, waitMethod, durationpb.New(3*d), new(emptypb.Empty)); err != nil {
		t.Fatalf("a call whose handler takes 3x the handshake timeout: %v", err)
	}
	cs, err = cc.NewStream(ctx, &grpc.StreamDesc{ClientStreams: true, ServerStreams: true}, waitStreamMethod)
	if err != nil {
		t.Fatal(err)
	}
	if err := cs.SendMsg(durationpb.New(3 * d)); err != nil {
		t.Fatal(err)
	}
	if err := cs.RecvMsg(new(emptypb.Empty)); err != nil {
		t.Fatalf("a stream whose handler takes 3x the handshake timeout after its request: %v", err)
	}
}

// A connection without calls for IdleTimeout is closed by the server (the
// client sees its channel go idle); the client reconnects at its next
// call.
func TestServerOptionsIdleTimeout(t *testing.T) {
	const idle = time.Second
	cc := dialLimited(t, limitedServer(t, ConnLimits{IdleTimeout: idle}, nil))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cc.Invoke(ctx, waitMethod, durationpb.New(0), new(emptypb.Empty)); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	wctx, wcancel := context.WithTimeout(ctx, idle+slack)
	defer wcancel()
	for s := cc.GetState(); s != connectivity.Idle; s = cc.GetState() {
		if !cc.WaitForStateChange(wctx, s) {
			t.Fatalf("connection still %v %v after its last call; want it closed after the %v idle timeout", s, time.Since(start), idle)
		}
	}
	if took := time.Since(start); took < idle/2 {
		t.Fatalf("connection closed %v after its last call, before the %v idle timeout", took, idle)
	}
	if err := cc.Invoke(ctx, waitMethod, durationpb.New(0), new(emptypb.Empty)); err != nil {
		t.Fatalf("a call after the idle close: %v", err)
	}
}

// At MaxStreams calls in flight on a connection, a further call waits for
// a free stream (it is not refused), and runs once one is.
func TestServerOptionsMaxStreams(t *testing.T) {
	started := make(chan struct{}, 8)
	cc := dialLimited(t, limitedServer(t, ConnLimits{MaxStreams: 2}, started))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := cc.Invoke(ctx, waitMethod, durationpb.New(0), new(emptypb.Empty)); err != nil {
		t.Fatal(err) // the client has learnt the server's settings
	}
	<-started
	hold, release := context.WithCancel(ctx)
	done := make(chan error, 2)
	for range 2 {
		go func() { done <- cc.Invoke(hold, waitMethod, durationpb.New(time.Minute), new(emptypb.Empty)) }()
	}
	<-started
	<-started
	// The third call cannot get a stream while both are held.
	qctx, qcancel := context.WithTimeout(ctx, time.Second)
	err := cc.Invoke(qctx, waitMethod, durationpb.New(0), new(emptypb.Empty))
	qcancel()
	if status.Code(err) != codes.DeadlineExceeded {
		t.Fatalf("a third call with two streams held: %v, want it to wait (DEADLINE_EXCEEDED after 1s)", err)
	}
	release()
	for range 2 {
		<-done
	}
	if err := cc.Invoke(ctx, waitMethod, durationpb.New(0), new(emptypb.Empty)); err != nil {
		t.Fatalf("a call after the streams were freed: %v", err)
	}
}

// Established hears the remote address of a connection as soon as a call
// arrives on it (before the handler runs), once per call, so the
// listener's admission stops counting the connection as one it may shed.
func TestServerOptionsEstablished(t *testing.T) {
	heard := make(chan net.Addr, 8)
	started := make(chan struct{}, 1)
	cc := dialLimited(t, limitedServer(t, ConnLimits{Established: func(a net.Addr) { heard <- a }}, started))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if len(heard) != 0 {
		t.Fatalf("Established heard %d connections before any call", len(heard))
	}
	done := make(chan error, 1)
	go func() { done <- cc.Invoke(ctx, waitMethod, durationpb.New(time.Hour), new(emptypb.Empty)) }()
	<-started
	select {
	case a := <-heard:
		if h, _, err := net.SplitHostPort(a.String()); err != nil || h != "127.0.0.1" {
			t.Fatalf("Established heard %v, want the client's loopback address", a)
		}
	default:
		t.Fatal("the handler runs, but Established was not told of the connection")
	}
	cancel()
	<-done
}
