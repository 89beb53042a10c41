// Package storetest is the conformance suite of store.Storage
// implementations: the grant rule, fencing, leases and corrupt values,
// checked through one store.Store over the storage under test. etcdstore
// and memstore both run it, so the in-memory fake and production follow the
// same rules by construction and by test.
package storetest

import (
	"context"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
)

// Backend is one store under test, fresh for each test.
type Backend interface {
	// Storage returns a new handle on the backend's data: with etcd a new
	// client, so two handles behave like two service replicas.
	Storage(t testing.TB) store.Storage
	// Put writes value under key (attached to lease, 0: none), bypassing
	// the Store: how tests write garbage behind its back.
	Put(t testing.TB, key string, value []byte, lease int64)
	// Delete deletes the value under key, bypassing the Store (as etcdctl
	// del would).
	Delete(t testing.TB, key string)
	// Get reads the value under key (ok false: absent).
	Get(t testing.TB, key string) (value []byte, ok bool)
	// LeaseKey and HighWaterKey name a code's owner and high-water entries.
	LeaseKey(region, worker int) string
	HighWaterKey(region, worker int) string
	// Leases is the number of live storage leases.
	Leases(t testing.TB) int
}

// TestTTL is the lease TTL tests ask for unless they test expiry: long
// enough that a slow run never loses a lease by accident.
const TestTTL = 60 * time.Second

// NewStore returns a Store over stg with cfg (LeaseTTL TestTTL if unset).
func NewStore(t testing.TB, stg store.Storage, cfg store.Config) *store.Store {
	t.Helper()
	if cfg.LeaseTTL == 0 {
		cfg.LeaseTTL = TestTTL
	}
	st, err := store.New(stg, cfg)
	if err != nil {
		t.Fatalf("store.New: %v", err)
	}
	return st
}

// Ctx is a context for one test, cancelled at its end.
func Ctx(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// Counter is an Observer that counts events, to check that the hooks fire.
type Counter struct {
	store.NopObserver
	NGranted, NGrantFailed, NConflicts, NAcquired, NAcquireFailed, NRenewed, NReleased, NCorrupt atomic.Int64
	NRegressed, NRecovered                                                                       atomic.Int64
	Size                                                                                         atomic.Int64
}

func (c *Counter) Granted(_, _ int, size int64, _ time.Duration) { c.NGranted.Add(1); c.Size.Add(size) }
func (c *Counter) GrantFailed(int, int, error, time.Duration)    { c.NGrantFailed.Add(1) }
func (c *Counter) Conflict(int, int)                             { c.NConflicts.Add(1) }
func (c *Counter) Acquired(int, int)                             { c.NAcquired.Add(1) }
func (c *Counter) AcquireFailed(int, error)                      { c.NAcquireFailed.Add(1) }
func (c *Counter) Renewed(_, _ int, err error) {
	if err == nil {
		c.NRenewed.Add(1)
	}
}
func (c *Counter) Released(int, int, error)                  { c.NReleased.Add(1) }
func (c *Counter) Corrupt(string, error)                     { c.NCorrupt.Add(1) }
func (c *Counter) HighWaterRegressed(int, int, int64, int64) { c.NRegressed.Add(1) }
func (c *Counter) HighWaterRecovered(int, int)               { c.NRecovered.Add(1) }

// CheckDisjoint sorts blocks and fails on any overlap.
func CheckDisjoint(t testing.TB, blocks []segment.Block) {
	t.Helper()
	slices.SortFunc(blocks, func(a, b segment.Block) int { return int(a.Lo - b.Lo) })
	for i := 1; i < len(blocks); i++ {
		if blocks[i].Lo < blocks[i-1].Hi {
			t.Fatalf("blocks overlap: [%d,%d) and [%d,%d)", blocks[i-1].Lo, blocks[i-1].Hi, blocks[i].Lo, blocks[i].Hi)
		}
	}
}

// Run runs the suite; open returns a fresh, empty backend for one test.
// Tests run in parallel.
func Run(t *testing.T, open func(t *testing.T) Backend) {
	tests := []struct {
		name string
		f    func(*testing.T, Backend)
	}{
		{"GrantRule", testGrantRule},
		{"Lifecycle", testLifecycle},
		{"ConcurrentReplicasNeverOverlap", testConcurrentReplicasNeverOverlap},
		{"ConcurrentAcquireDistinctCodes", testConcurrentAcquireDistinctCodes},
		{"ClockBackStillAboveHWM", testClockBackStillAboveHWM},
		{"FullRegionAndFencing", testFullRegionAndFencing},
		{"CorruptValuesStopTheCode", testCorruptValuesStopTheCode},
		{"InvalidFields", testInvalidFields},
		{"UnknownCommitNeverReturnsTheBlock", testUnknownCommit},
		{"BatchOneCompareFailsOthersCommit", testBatchOneCompareFails},
		{"ConcurrentCodesNeverOverlap", testConcurrentCodesNeverOverlap},
		{"SnapshotAndFence", testSnapshotAndFence},
		{"IdentityBindsTheLease", testIdentityBinding},
		{"IdentityNoOracle", testIdentityNoOracle},
		{"IdentityCap", testIdentityCap},
		{"IdentityCapUnderConcurrency", testIdentityCapConcurrent},
		{"HighWaterRegressedStopsTheCode", testHighWaterRegressed},
		{"FailedCommitDoesNotRaiseTheFloor", testFailedCommitFloor},
		{"ConcurrentReadsNoFalseRegression", testNoFalseRegression},
		{"RestartFloor", testRestartFloor},
		{"WatchSeesALowering", testWatchSeesALowering},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // each test has its own store
			tc.f(t, open(t))
		})
	}
}

// RunGroupCommit runs only the group-commit cases, on one backend, one
// after the other: for a store shared with other users (an external etcd
// under a fresh prefix), where the whole suite's lease counts would not
// hold.
func RunGroupCommit(t *testing.T, be Backend) {
	t.Run("BatchOneCompareFailsOthersCommit", func(t *testing.T) { testBatchOneCompareFails(t, be) })
	t.Run("ConcurrentCodesNeverOverlap", func(t *testing.T) { testConcurrentCodesNeverOverlap(t, be) })
}
