// Package memstore is store.Storage in memory: versioned bytes, a revision
// counter and TTL leases, for tests and the in-memory range service
// (rangeclient/rangeclienttest). It decides nothing: the grant rule, fencing
// and value checks run in store.Store, the same code as over etcd.
//
// Leases expire by time.Now, checked lazily on every call, so a Storage
// works inside a testing/synctest bubble.
package memstore

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/snowflake"
)

// Storage is an in-memory store.Storage. The zero value is not usable;
// call New. Safe for concurrent use.
type Storage struct {
	mu        sync.Mutex
	rev       int64
	kvs       map[string]*store.Entry
	leases    map[int64]*lease
	nextLease int64

	// The high-water history WatchHighWaters replays: the last
	// maxWatchLog writes and deletes of high-water entries, and the
	// revision below which the history is gone (as etcd's compaction).
	hwmLog    []hwmEvent
	compacted int64
	changed   chan struct{} // closed and replaced at every event
}

// hwmEvent is one write or delete (Value nil) of a high-water entry.
type hwmEvent struct {
	region, worker int
	e              store.Entry
}

// maxWatchLog bounds the high-water history a Storage keeps for watchers.
const maxWatchLog = 4096

type lease struct {
	ttl     time.Duration
	expires time.Time
	keys    map[string]bool
}

var (
	_ store.BatchStorage     = (*Storage)(nil)
	_ store.HighWaterWatcher = (*Storage)(nil)
)

// MaxBatch is the most grants one CommitHighWaters accepts: etcdstore's
// bound, so the Store forms the same batches over both.
const MaxBatch = 12

// New returns an empty Storage.
func New() *Storage {
	return &Storage{kvs: map[string]*store.Entry{}, leases: map[int64]*lease{}, nextLease: 0x1000, changed: make(chan struct{})}
}

// Key layout, as etcd's without a prefix.

// LeaseKey names the owner entry of (region, worker).
func LeaseKey(region, worker int) string { return fmt.Sprintf("r%d/lease/%03d", region, worker) }

// HighWaterKey names the high-water entry of (region, worker).
func HighWaterKey(region, worker int) string { return fmt.Sprintf("r%d/hwm/%03d", region, worker) }

// ContentionKey names the contention signal of (region, worker).
func ContentionKey(region, worker int) string {
	return fmt.Sprintf("r%d/contend/%03d", region, worker)
}

// expireLocked deletes the entries of every lease whose TTL has run out, as
// etcd's lessor does (one revision per lease).
func (s *Storage) expireLocked() {
	now := time.Now()
	for id, l := range s.leases {
		if now.Before(l.expires) {
			continue
		}
		s.revokeLocked(id)
	}
}

func (s *Storage) revokeLocked(id int64) {
	l, ok := s.leases[id]
	if !ok {
		return
	}
	delete(s.leases, id)
	if len(l.keys) == 0 {
		return
	}
	s.rev++
	for k := range l.keys {
		delete(s.kvs, k)
	}
}

// putLocked writes value under key at the current revision (the caller has
// raised it), attached to lease (0: none; it must exist).
func (s *Storage) putLocked(key string, value []byte, leaseID int64) {
	e := s.kvs[key]
	if e == nil {
		e = &store.Entry{Key: key, CreateRevision: s.rev}
		s.kvs[key] = e
	}
	if e.Lease != 0 && e.Lease != leaseID {
		if old := s.leases[e.Lease]; old != nil {
			delete(old.keys, key)
		}
	}
	e.Value = append([]byte(nil), value...)
	e.ModRevision = s.rev
	e.Lease = leaseID
	if leaseID != 0 {
		s.leases[leaseID].keys[key] = true
	}
	s.noteLocked(key, e)
}

// noteLocked records a write (or, with a nil Value, a delete) of key for
// the watchers, if key is a high-water entry.
func (s *Storage) noteLocked(key string, e *store.Entry) {
	var region, worker int
	if n, err := fmt.Sscanf(key, "r%d/hwm/%03d", &region, &worker); n != 2 || err != nil || key != HighWaterKey(region, worker) {
		return
	}
	ev := hwmEvent{region: region, worker: worker, e: *e}
	ev.e.Value = append([]byte(nil), e.Value...)
	if e.Value == nil {
		ev.e.Value = nil
	}
	if len(s.hwmLog) == maxWatchLog {
		s.compacted = s.hwmLog[0].e.ModRevision
		s.hwmLog = append(s.hwmLog[:0], s.hwmLog[1:]...)
	}
	s.hwmLog = append(s.hwmLog, ev)
	close(s.changed)
	s.changed = make(chan struct{})
}

// WatchHighWaters implements store.HighWaterWatcher over the Storage's
// recent high-water history (the last 4,096 changes; a watch from before
// them fails, as a watch from a compacted revision fails on etcd).
func (s *Storage) WatchHighWaters(ctx context.Context, region int, after int64, f func(worker int, e store.Entry)) error {
	for {
		s.mu.Lock()
		if after < s.compacted {
			s.mu.Unlock()
			return fmt.Errorf("memstore: watch from revision %d: history compacted up to %d", after+1, s.compacted)
		}
		var evs []hwmEvent
		for _, ev := range s.hwmLog {
			if ev.e.ModRevision > after && ev.region == region {
				evs = append(evs, ev)
			}
		}
		after = s.rev
		changed := s.changed
		s.mu.Unlock()
		for _, ev := range evs {
			f(ev.worker, ev.e)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}

func (s *Storage) getLocked(key string) *store.Entry {
	e := s.kvs[key]
	if e == nil {
		return nil
	}
	c := *e
	c.Value = append([]byte(nil), e.Value...)
	return &c
}

func (s *Storage) modRevLocked(key string) int64 {
	if e := s.kvs[key]; e != nil {
		return e.ModRevision
	}
	return 0
}

func (s *Storage) createRevLocked(key string) int64 {
	if e := s.kvs[key]; e != nil {
		return e.CreateRevision
	}
	return 0
}

func (s *Storage) codeLocked(region, worker int) store.CodeView {
	return store.CodeView{
		Rev:        s.rev,
		Owner:      s.getLocked(LeaseKey(region, worker)),
		HighWater:  s.getLocked(HighWaterKey(region, worker)),
		Contention: s.modRevLocked(ContentionKey(region, worker)),
	}
}

// begin locks s and applies expiry; it fails like a dead connection if ctx
// is done.
func (s *Storage) begin(ctx context.Context) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	s.mu.Lock()
	s.expireLocked()
	return nil
}

// Put writes value under key (a name from LeaseKey, HighWaterKey or
// ContentionKey) attached to lease (0: none), bypassing every compare, as
// `etcdctl put` would: tests use it to corrupt values.
func (s *Storage) Put(key string, value []byte, lease int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	if lease != 0 && s.leases[lease] == nil {
		return fmt.Errorf("memstore: lease %x not found", lease)
	}
	s.rev++
	s.putLocked(key, value, lease)
	return nil
}

// Delete deletes the value under key, bypassing every compare, as `etcdctl
// del` would: tests use it to lose a value behind the Store's back. Deleting
// an absent key is not an error and writes nothing.
func (s *Storage) Delete(key string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	e := s.kvs[key]
	if e == nil {
		return
	}
	s.rev++
	delete(s.kvs, key)
	if l := s.leases[e.Lease]; l != nil {
		delete(l.keys, key)
	}
	s.noteLocked(key, &store.Entry{Key: key, ModRevision: s.rev})
}

// Leases is the number of live leases.
func (s *Storage) Leases() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	return len(s.leases)
}

// Grant implements store.Storage; the TTL granted is ttl.
func (s *Storage) Grant(ctx context.Context, ttl time.Duration) (int64, time.Duration, error) {
	if err := s.begin(ctx); err != nil {
		return 0, 0, err
	}
	defer s.mu.Unlock()
	s.nextLease++
	s.leases[s.nextLease] = &lease{ttl: ttl, expires: time.Now().Add(ttl), keys: map[string]bool{}}
	return s.nextLease, ttl, nil
}

// KeepAlive implements store.Storage.
func (s *Storage) KeepAlive(ctx context.Context, id int64) (time.Duration, error) {
	if err := s.begin(ctx); err != nil {
		return 0, err
	}
	defer s.mu.Unlock()
	l := s.leases[id]
	if l == nil {
		return 0, nil
	}
	l.expires = time.Now().Add(l.ttl)
	return l.ttl, nil
}

// Revoke implements store.Storage.
func (s *Storage) Revoke(ctx context.Context, id int64) error {
	if err := s.begin(ctx); err != nil {
		return err
	}
	defer s.mu.Unlock()
	s.revokeLocked(id)
	return nil
}

// Scan implements store.Storage.
func (s *Storage) Scan(ctx context.Context, region int) (store.RegionView, error) {
	if err := s.begin(ctx); err != nil {
		return store.RegionView{}, err
	}
	defer s.mu.Unlock()
	v := store.RegionView{Rev: s.rev, Owners: map[int]store.Entry{}, HighWaters: map[int]store.Entry{}}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		if e := s.getLocked(LeaseKey(region, w)); e != nil {
			v.Owners[w] = *e
		}
		if e := s.getLocked(HighWaterKey(region, w)); e != nil {
			v.HighWaters[w] = *e
		}
	}
	return v, nil
}

// Code implements store.Storage.
func (s *Storage) Code(ctx context.Context, region, worker int) (store.CodeView, error) {
	if err := s.begin(ctx); err != nil {
		return store.CodeView{}, err
	}
	defer s.mu.Unlock()
	return s.codeLocked(region, worker), nil
}

// CreateOwner implements store.Storage.
func (s *Storage) CreateOwner(ctx context.Context, region, worker int, highWaterRev int64, value []byte, leaseID int64) (int64, bool, error) {
	if err := s.begin(ctx); err != nil {
		return 0, false, err
	}
	defer s.mu.Unlock()
	lk := LeaseKey(region, worker)
	if s.createRevLocked(lk) != 0 || s.modRevLocked(HighWaterKey(region, worker)) != highWaterRev {
		return 0, false, nil
	}
	if s.leases[leaseID] == nil {
		return 0, false, fmt.Errorf("memstore: lease %x not found", leaseID)
	}
	s.rev++
	s.putLocked(lk, value, leaseID)
	return s.rev, true, nil
}

// CommitHighWater implements store.Storage.
func (s *Storage) CommitHighWater(ctx context.Context, region, worker int, c store.HighWaterCommit) (int64, bool, store.CodeView, error) {
	if err := s.begin(ctx); err != nil {
		return 0, false, store.CodeView{}, err
	}
	defer s.mu.Unlock()
	lk, hk, ck := LeaseKey(region, worker), HighWaterKey(region, worker), ContentionKey(region, worker)
	if s.createRevLocked(lk) == c.Token && s.modRevLocked(lk) == c.OwnerRev &&
		s.modRevLocked(hk) == c.HighWaterRev && s.modRevLocked(ck) == c.ContentionRev {
		s.rev++
		s.putLocked(hk, c.Value, 0)
		return s.rev, true, store.CodeView{}, nil
	}
	if c.Signal {
		s.rev++
		s.putLocked(ck, []byte("v1"), 0)
	}
	return 0, false, s.codeLocked(region, worker), nil
}

// MaxBatch implements store.BatchStorage.
func (s *Storage) MaxBatch() int { return MaxBatch }

// CommitHighWaters implements store.BatchStorage: every op's compares are
// checked against the state before the batch, and all writes (grants and
// contention signals) are applied at one new revision, as one etcd Txn of
// nested transactions would.
func (s *Storage) CommitHighWaters(ctx context.Context, ops []store.GrantOp) ([]store.GrantResult, error) {
	if len(ops) > MaxBatch {
		return nil, fmt.Errorf("memstore: batch of %d grants, more than %d", len(ops), MaxBatch)
	}
	if err := s.begin(ctx); err != nil {
		return nil, err
	}
	defer s.mu.Unlock()
	seen := map[[2]int]bool{}
	for _, op := range ops {
		k := [2]int{op.Region, op.Worker}
		if seen[k] {
			return nil, fmt.Errorf("memstore: two grants for region %d worker %d in one batch", op.Region, op.Worker)
		}
		seen[k] = true
	}
	res := make([]store.GrantResult, len(ops))
	write := false
	for i, op := range ops {
		c := op.Commit
		lk, hk, ck := LeaseKey(op.Region, op.Worker), HighWaterKey(op.Region, op.Worker), ContentionKey(op.Region, op.Worker)
		res[i].OK = s.createRevLocked(lk) == c.Token && s.modRevLocked(lk) == c.OwnerRev &&
			s.modRevLocked(hk) == c.HighWaterRev && s.modRevLocked(ck) == c.ContentionRev
		write = write || res[i].OK || c.Signal
	}
	if write {
		s.rev++
	}
	for i, op := range ops {
		switch {
		case res[i].OK:
			s.putLocked(HighWaterKey(op.Region, op.Worker), op.Commit.Value, 0)
			res[i].Rev = s.rev
		case op.Commit.Signal:
			s.putLocked(ContentionKey(op.Region, op.Worker), []byte("v1"), 0)
		}
	}
	for i, op := range ops {
		if !res[i].OK {
			res[i].Fresh = s.codeLocked(op.Region, op.Worker)
		}
	}
	return res, nil
}

// DeleteOwner implements store.Storage.
func (s *Storage) DeleteOwner(ctx context.Context, region, worker int, token, leaseID int64) (bool, store.CodeView, error) {
	if err := s.begin(ctx); err != nil {
		return false, store.CodeView{}, err
	}
	defer s.mu.Unlock()
	lk := LeaseKey(region, worker)
	e := s.kvs[lk]
	if e == nil || e.CreateRevision != token || e.Lease != leaseID {
		return false, store.CodeView{Rev: s.rev, Owner: s.getLocked(lk)}, nil
	}
	s.rev++
	delete(s.kvs, lk)
	if l := s.leases[e.Lease]; l != nil {
		delete(l.keys, lk)
	}
	return true, store.CodeView{}, nil
}

// Get returns a copy of the entry under key, or nil if it is absent.
func (s *Storage) Get(key string) *store.Entry {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.expireLocked()
	return s.getLocked(key)
}
