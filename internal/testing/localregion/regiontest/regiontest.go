// Package regiontest is internal/testing/localregion for tests: Start stands up an
// in-process replica that the test's cleanup closes, Dial and Allocator
// connect to it, and Shared shares regions among the tests of one package.
//
// Starting embedded etcd is the slow part of such tests, so a package can
// start its regions once, on the first test that asks, and close them when
// its test binary ends:
//
//	var regions = regiontest.Shared[*localregion.Region]{What: "region",
//		Start: func(ctx context.Context) (*localregion.Region, error) {
//			return localregion.Start(ctx, localregion.Config{Region: 1})
//		}}
//
//	func TestMain(m *testing.M) { os.Exit(regions.Main(m)) }
//
//	func TestX(t *testing.T) { r := regions.Get(t); ... }
package regiontest

import (
	"context"
	"io"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
)

// Start stands up an in-process replica (localregion.Start, over the construction
// rangesvc serve runs) and closes it at the end of the test.
func Start(t testing.TB, cfg localregion.Config) *localregion.Region {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	r, err := localregion.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("regiontest: start region %d: %v", cfg.Region, err)
	}
	t.Cleanup(func() { r.Close() })
	return r
}

// Dial connects to addr (insecure, loopback) and closes the connection at
// the end of the test.
func Dial(t testing.TB, addr string) *grpc.ClientConn {
	t.Helper()
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatalf("regiontest: dial %s: %v", addr, err)
	}
	t.Cleanup(func() { cc.Close() })
	return cc
}

// Allocator is the wire adapter over a new connection to r.
func Allocator(t testing.TB, r *localregion.Region) segment.Allocator {
	t.Helper()
	return wire.NewAllocator(Dial(t, r.Addr()))
}

// StartTimeout bounds Start and Shared.Start.
const StartTimeout = 60 * time.Second

// Shared is one resource (a region, a set of regions) shared by a
// package's tests: started on the first Get, closed by Main. Set What and
// Start; the zero value of the rest is ready.
type Shared[T io.Closer] struct {
	// What names the resource in the failure of a test that cannot get it
	// ("start <What>: <error>").
	What string
	// Start starts the resource, within StartTimeout. It is called once;
	// if it fails, every Get fails with its error.
	Start func(ctx context.Context) (T, error)

	once    sync.Once
	v       T
	err     error
	started bool
}

// Get returns the resource, starting it on the first call; it fails t if
// the resource could not be started.
func (s *Shared[T]) Get(t testing.TB) T {
	t.Helper()
	s.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
		defer cancel()
		s.v, s.err = s.Start(ctx)
		s.started = s.err == nil
	})
	if s.err != nil {
		t.Fatalf("start %s: %v", s.What, s.err)
	}
	return s.v
}

// Main runs the package's tests and then closes the resource if a test
// started it; TestMain passes its result to os.Exit.
func (s *Shared[T]) Main(m *testing.M) int {
	code := m.Run()
	if s.started {
		s.v.Close()
	}
	return code
}
