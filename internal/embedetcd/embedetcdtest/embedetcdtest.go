// Package embedetcdtest starts embedded etcd servers for tests: quiet, in
// t.TempDir(), on random loopback ports, with raft timings for a busy
// machine, stopped by t.Cleanup. It is kept out of package embedetcd so that
// the server binary, which imports embedetcd, does not link package testing.
package embedetcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/embedetcd"
)

// StartTimeout bounds Start and StartConfig.
const StartTimeout = 60 * time.Second

// Start starts a quiet embedded etcd in t.TempDir() on random loopback
// ports with embedetcd.BusyTickMs/BusyElectionMs, and stops it at the end
// of the test. It fails the test if etcd does not start.
func Start(t testing.TB) *embedetcd.Server {
	t.Helper()
	return StartConfig(t, embedetcd.Config{})
}

// StartConfig is Start with overrides; zero fields get Start's defaults
// (Dir = t.TempDir(), the busy raft timings, a nop logger).
func StartConfig(t testing.TB, cfg embedetcd.Config) *embedetcd.Server {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	if cfg.TickMs == 0 && cfg.ElectionMs == 0 {
		cfg.TickMs, cfg.ElectionMs = embedetcd.BusyTickMs, embedetcd.BusyElectionMs
	}
	if cfg.Logger == nil {
		cfg.Logger = zap.NewNop()
	}
	ctx, cancel := context.WithTimeout(context.Background(), StartTimeout)
	defer cancel()
	s, err := embedetcd.Start(ctx, cfg)
	if err != nil {
		t.Fatalf("embedetcd: %v", err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Client returns a client for s that is closed at the end of the test.
// Each call returns a separate client (a separate connection), which is how
// tests model several service replicas sharing one etcd.
func Client(t testing.TB, s *embedetcd.Server) *clientv3.Client {
	t.Helper()
	cli, err := s.NewClient(nil)
	if err != nil {
		t.Fatalf("embedetcd: %v", err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}
