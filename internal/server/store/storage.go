package store

import (
	"context"
	"time"
)

// Storage is what the grant loop (Store) needs from a store: versioned bytes
// per code, compare-and-set transactions and TTL leases, in the shape of
// etcd's API. internal/server/store/etcdstore implements it on etcd, internal/server/store/memstore in
// memory. An implementation only stores and compares; every rule (who owns a
// code, what block to grant, what a value means) is decided by Store, once,
// for both.
//
// Per code (region, worker) a Storage holds up to three values:
//
//	owner       the encoded OwnerRecord, attached to a TTL lease: it
//	            disappears when that lease is revoked or expires
//	high water  the encoded high-water mark (EncodeHighWater), never expires
//	contention  a signal between replicas; only its revision matters
//
// Revisions: the store has one revision counter that every successful write
// (a whole transaction) raises; an entry records the revision that created
// it and the one that last modified it. Revisions are positive and never
// reused, so a CreateRevision identifies one owner for ever (it is the
// fencing token).
//
// Errors: any error means the storage did not answer (the Store reports it
// as ErrUnavailable, keeping the cause). For a write, an error means the
// outcome is unknown: the write may have been applied. Storage must not
// return the sentinels of this package for an ordinary answer such as
// "compare failed" or "no such lease"; those are results.
//
// Methods are called concurrently and must be safe for it.
type Storage interface {
	// Grant creates a lease that expires ttl after it was granted unless
	// kept alive, and returns its id (positive) and the TTL actually granted
	// (at least ttl; etcd may raise it to its minimum).
	Grant(ctx context.Context, ttl time.Duration) (id int64, granted time.Duration, err error)
	// KeepAlive renews lease id once and returns the TTL granted from now;
	// 0 (and no error) if the lease does not exist any more.
	KeepAlive(ctx context.Context, id int64) (time.Duration, error)
	// Revoke ends lease id now, deleting every value attached to it (as
	// expiry does). Revoking a lease that does not exist is not an error.
	Revoke(ctx context.Context, id int64) error

	// Scan returns one consistent view of every owner and high-water entry
	// of region.
	Scan(ctx context.Context, region int) (RegionView, error)
	// Code returns one consistent view of the three values of a code.
	Code(ctx context.Context, region, worker int) (CodeView, error)

	// CreateOwner writes value as the code's owner, attached to lease, if
	// and only if the code has no owner and its high-water entry's
	// ModRevision is still highWaterRev (0: absent). ok reports whether it
	// was written; token is then the revision of the write.
	CreateOwner(ctx context.Context, region, worker int, highWaterRev int64, value []byte, lease int64) (token int64, ok bool, err error)
	// CommitHighWater writes c.Value as the code's high-water mark if and
	// only if all of c's compares hold. On success rev is the revision of
	// the write. If a compare failed, nothing but (if c.Signal) the
	// contention signal is written, and fresh is the code's view after the
	// transaction (with Contention the revision of the signal if it was
	// written). An error means the outcome is unknown.
	CommitHighWater(ctx context.Context, region, worker int, c HighWaterCommit) (rev int64, ok bool, fresh CodeView, err error)
	// DeleteOwner deletes the code's owner if and only if its
	// CreateRevision is token and it is attached to lease. If not, fresh
	// holds the store revision and the owner entry (only those fields).
	DeleteOwner(ctx context.Context, region, worker int, token, lease int64) (ok bool, fresh CodeView, err error)
}

// Entry is one stored value and its versions, like etcd's KeyValue.
type Entry struct {
	// Key names the value in the storage (for errors and operators).
	Key   string
	Value []byte
	// CreateRevision is the revision of the write that created the entry;
	// ModRevision that of the last write to it.
	CreateRevision, ModRevision int64
	// Lease is the lease the entry is attached to (0: none).
	Lease int64
}

// CodeView is a consistent view of one code's values at store revision Rev.
// A nil entry is absent.
type CodeView struct {
	Rev       int64
	Owner     *Entry
	HighWater *Entry
	// Contention is the ModRevision of the contention signal (0: absent).
	Contention int64
}

// RegionView is a consistent view of a region's owner and high-water
// entries, by worker code. Absent entries are not in the maps.
type RegionView struct {
	Rev        int64
	Owners     map[int]Entry
	HighWaters map[int]Entry
}

// HighWaterCommit is the fenced write of a grant: the new high-water mark
// and the versions it was computed from.
type HighWaterCommit struct {
	// Value is the encoded new high-water mark.
	Value []byte
	// Token must be the owner's CreateRevision, OwnerRev its ModRevision.
	Token, OwnerRev int64
	// HighWaterRev must be the high-water entry's ModRevision (0: absent).
	HighWaterRev int64
	// ContentionRev must be the contention signal's ModRevision (0: absent).
	ContentionRev int64
	// Signal asks for the contention signal to be written if a compare
	// fails.
	Signal bool
}

// BatchStorage is an optional ability of a Storage: committing the grants of
// several codes in one write (group commit), so one raft entry and one fsync
// serve them all. The Store uses it when its Storage has it; every rule
// still runs in the Store, once per code, exactly as for CommitHighWater.
type BatchStorage interface {
	Storage
	// MaxBatch is the most ops one CommitHighWaters call accepts (>= 1).
	MaxBatch() int
	// CommitHighWaters commits ops, each for a different code, in one
	// atomic write. Each op is separately fenced: it succeeds or fails on
	// its own compares, exactly as CommitHighWater would, and one op's
	// failed compare does not fail the others. On success results[i] is
	// ops[i]'s outcome, with the meaning of CommitHighWater's (rev, ok,
	// fresh). An error means the outcome of every op is unknown.
	CommitHighWaters(ctx context.Context, ops []GrantOp) (results []GrantResult, err error)
}

// GrantOp is one code's fenced high-water commit in a batch.
type GrantOp struct {
	Region, Worker int
	Commit         HighWaterCommit
}

// GrantResult is the outcome of one GrantOp, as CommitHighWater reports it:
// on OK, Rev is the revision of the write; otherwise Fresh is the code's
// view after the batch.
type GrantResult struct {
	Rev   int64
	OK    bool
	Fresh CodeView
}

// HighWaterWatcher is an optional ability of a storage: a stream of every
// change to a region's high-water entries, so that a Store checks each mark
// when it is written (Store.WatchHighWaters), not only when it next reads
// that code. etcdstore and memstore have it.
type HighWaterWatcher interface {
	// WatchHighWaters calls f for every write and every delete of a
	// high-water entry of region made after revision after, in revision
	// order (a delete has a nil Value and the delete's revision as
	// ModRevision), until ctx ends (it then returns ctx's error) or the
	// stream breaks: the history after `after` is compacted, the
	// connection is lost. It then returns that error; the caller reads
	// the region again and watches from there. f must not block for long.
	WatchHighWaters(ctx context.Context, region int, after int64, f func(worker int, e Entry)) error
}
