// Package grpctest connects a test's gRPC client to a server over an
// in-memory listener (bufconn): no ports, no network, cleaned up with the
// test.
package grpctest

import (
	"context"
	"net"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// Dial starts a gRPC server with the services register installs, and
// returns a client connection to it; opts are added to the client's
// options (interceptors, say). Server and connection close at the end of
// the test.
func Dial(t testing.TB, register func(grpc.ServiceRegistrar), opts ...grpc.DialOption) *grpc.ClientConn {
	t.Helper()
	lis := bufconn.Listen(1 << 20)
	srv := grpc.NewServer()
	register(srv)
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	opts = append([]grpc.DialOption{
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
	}, opts...)
	cc, err := grpc.NewClient("passthrough:///bufnet", opts...)
	if err != nil {
		t.Fatalf("grpctest: dial: %v", err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}
