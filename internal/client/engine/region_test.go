package engine

import (
	"context"
	"errors"
	"net"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
)

// Region discovery: with Targets and Config.Region 0 the client takes the
// replica's region from GetReplicaInfo; a non-zero Region that disagrees is
// ErrInvalidConfig before any lease is taken. The replicas here are the real
// gRPC service (internal/server/service) on 127.0.0.1 over an in-memory store, so
// these run in well under a second without etcd.

// replicaInfoServer is a RangeService whose GetReplicaInfo answer can be
// replaced: info nil answers Unimplemented (a replica that predates the
// RPC), else info is the reply.
type replicaInfoServer struct {
	*service.Service
	info *idrangev1.GetReplicaInfoResponse
}

func (s replicaInfoServer) GetReplicaInfo(context.Context, *idrangev1.GetReplicaInfoRequest) (*idrangev1.GetReplicaInfoResponse, error) {
	if s.info == nil {
		return nil, status.Error(codes.Unimplemented, "method GetReplicaInfo not implemented")
	}
	return s.info, nil
}

// serveReplica starts a replica of region on 127.0.0.1 over its own
// connection to store and returns its address and that connection (which
// counts the replica's store calls); the server stops at the end of the
// test. wrap, if set, replaces the RangeService registered (to alter one
// RPC).
func serveReplica(t *testing.T, region int, store *rangeclienttest.Service, wrap func(*service.Service) idrangev1.RangeServiceServer) (string, *rangeclienttest.Conn) {
	t.Helper()
	conn := store.Conn()
	svc, err := service.New(service.Config{Region: region, Allocator: conn})
	if err != nil {
		t.Fatal(err)
	}
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	if wrap != nil {
		idrangev1.RegisterRangeServiceServer(srv, wrap(svc))
	} else {
		svc.Register(srv)
	}
	go srv.Serve(lis)
	t.Cleanup(srv.Stop)
	return lis.Addr().String(), conn
}

// newRegionClient is New with Targets, a short deadline and cleanup.
func newRegionClient(t *testing.T, region int, targets ...string) (*Engine, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := New(ctx, Config{Targets: targets, Region: region, Owner: t.Name()})
	if err == nil {
		t.Cleanup(func() { c.Close() })
	}
	return c, err
}

// checkMintsIn mints a few IDs and fails unless every one decodes to region.
func checkMintsIn(t *testing.T, c *Engine, region int) {
	t.Helper()
	if li := c.Lease(); li.Err != nil || li.Lease.Region != region {
		t.Fatalf("lease %+v (err %v), want region %d", li.Lease, li.Err, region)
	}
	ids, err := c.NextN(context.Background(), 100)
	if err != nil {
		t.Fatal(err)
	}
	for _, id := range ids {
		if id.Region() != region {
			t.Fatalf("ID %d decodes to region %d, want %d", id, id.Region(), region)
		}
	}
}

func TestRegionLearntFromService(t *testing.T) {
	for _, region := range []int{1, 3} {
		store := rangeclienttest.New(rangeclienttest.Options{Region: region})
		addr, _ := serveReplica(t, region, store, nil)
		c, err := newRegionClient(t, 0, addr)
		if err != nil {
			t.Fatalf("Region 0 against a region-%d replica: %v", region, err)
		}
		checkMintsIn(t, c, region)
	}
}

func TestRegionGivenMatchesService(t *testing.T) {
	store := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	addr, _ := serveReplica(t, 1, store, nil)
	c, err := newRegionClient(t, 1, addr)
	if err != nil {
		t.Fatal(err)
	}
	checkMintsIn(t, c, 1)
}

// A mismatch fails New with ErrInvalidConfig (standard errors.Is), names
// both regions on one line, and takes no lease.
func TestRegionMismatchIsInvalidConfig(t *testing.T) {
	store := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	addr, conn := serveReplica(t, 1, store, nil)
	_, err := newRegionClient(t, 2, addr)
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("Region 2 against a region-1 replica: %v, want ErrInvalidConfig", err)
	}
	msg := err.Error()
	if !strings.Contains(msg, "Config.Region is 2") || !strings.Contains(msg, "serves region 1") || strings.ContainsAny(msg, "\r\n") {
		t.Errorf("message %q should name both regions on one line", msg)
	}
	if IsRetryable(err) {
		t.Errorf("IsRetryable(%v) = true, want false", err)
	}
	if n := conn.Calls(rangeclienttest.Acquire); n != 0 {
		t.Fatalf("the failed New made %d Acquire calls, want 0", n)
	}
}

// A replica that predates GetReplicaInfo: Region is used as given, and the
// service still refuses a lease for a region it does not serve.
func TestRegionOlderReplica(t *testing.T) {
	store := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	addr, _ := serveReplica(t, 1, store, func(s *service.Service) idrangev1.RangeServiceServer {
		return replicaInfoServer{Service: s}
	})
	c, err := newRegionClient(t, 1, addr)
	if err != nil {
		t.Fatalf("Region 1 against an older region-1 replica: %v", err)
	}
	checkMintsIn(t, c, 1)
	if _, err := newRegionClient(t, 0, addr); !errors.Is(err, segment.ErrInvalid) {
		t.Fatalf("Region 0 against an older region-1 replica: %v, want the service's ErrInvalid", err)
	}
}

// The question goes through the replica set: a replica that is down or
// answers nonsense (region 9: ErrProtocol) is skipped for the next one,
// whichever the client starts with.
func TestRegionFailsOver(t *testing.T) {
	store := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	good, _ := serveReplica(t, 1, store, nil)
	bogus, _ := serveReplica(t, 1, store, func(s *service.Service) idrangev1.RangeServiceServer {
		return replicaInfoServer{Service: s, info: &idrangev1.GetReplicaInfoResponse{Region: 9}}
	})
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := lis.Addr().String()
	lis.Close()   // connections to it are refused
	for range 4 { // the first replica is picked at random
		c, err := newRegionClient(t, 0, down, bogus, good)
		if err != nil {
			t.Fatalf("Region 0 with a down and a bogus replica before a good one: %v", err)
		}
		checkMintsIn(t, c, 1)
		c.Close()
	}
}
