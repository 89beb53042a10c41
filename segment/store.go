package segment

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/snowflake"
)

// Store defaults and limits.
const (
	// DefaultPrefix is the etcd key prefix of format version 1.
	DefaultPrefix = "/idrange/v1/"
	// DefaultLeaseTTL is the etcd lease TTL asked for at Acquire. etcd may
	// grant more (its minimum depends on the election timeout); Lease.TTL
	// says what was granted.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultOpTimeout bounds every single etcd call the Store makes.
	DefaultOpTimeout = 3 * time.Second
	// DefaultMaxConflicts is how many failed grant transactions (lost HWM
	// races, yields to a contending replica) one Allocate retries before
	// giving up with ErrUnavailable.
	DefaultMaxConflicts = 64
)

// StoreConfig configures a Store. Zero fields take the documented defaults.
type StoreConfig struct {
	// Prefix of every key (must end in "/"). Default DefaultPrefix.
	Prefix string
	// LeaseTTL asked of etcd at Acquire: whole seconds, 1s..1h. Default
	// DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Policy is the grant rule; zero fields take their defaults.
	Policy Policy
	// Clock is the service clock grants are computed with. Default
	// clock.System{}. Uniqueness never depends on it; freshness does.
	Clock clock.Clock
	// OpTimeout bounds each etcd call. Default DefaultOpTimeout.
	OpTimeout time.Duration
	// MaxConflicts bounds failed grant transactions per Allocate. Default
	// DefaultMaxConflicts.
	MaxConflicts int
	// Logger receives warnings (corrupt values, failed clean-ups). Default:
	// discard.
	Logger *slog.Logger
	// Observer receives metric events. Default: NopObserver.
	Observer Observer
}

func (c StoreConfig) withDefaults() StoreConfig {
	if c.Prefix == "" {
		c.Prefix = DefaultPrefix
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	c.Policy = c.Policy.WithDefaults()
	if c.Clock == nil {
		c.Clock = clock.System{}
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.MaxConflicts == 0 {
		c.MaxConflicts = DefaultMaxConflicts
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	return c
}

// Validate reports the first bad field (after defaults are applied).
func (c StoreConfig) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Prefix[len(c.Prefix)-1] != '/':
		return errors.Wrapf(ErrInvalid, "store Prefix %q must end in /", c.Prefix)
	case c.LeaseTTL < time.Second || c.LeaseTTL > time.Hour:
		return errors.Wrapf(ErrInvalid, "store LeaseTTL %v not in 1s..1h", c.LeaseTTL)
	case c.LeaseTTL%time.Second != 0:
		return errors.Wrapf(ErrInvalid, "store LeaseTTL %v is not whole seconds (etcd leases are in seconds)", c.LeaseTTL)
	case c.OpTimeout < 0:
		return errors.Wrapf(ErrInvalid, "store OpTimeout %v is negative", c.OpTimeout)
	case c.MaxConflicts < 1:
		return errors.Wrapf(ErrInvalid, "store MaxConflicts %d must be >= 1", c.MaxConflicts)
	}
	return c.Policy.Validate()
}

// Observer receives the Store's metric events (the service wires them to
// Prometheus; segment itself imports no metrics library). Every method must
// be cheap, non-blocking and safe for concurrent use. Embed NopObserver to
// implement only some. Events are only reported for requests whose region
// (and lease fields) are in range, so region and worker are always valid
// label values; requests rejected as ErrInvalid before touching etcd are
// not reported.
type Observer interface {
	// Granted: a block of size L units was committed; latency covers the
	// whole Allocate (reads, retries, commit).
	Granted(region, worker int, size int64, latency time.Duration)
	// GrantFailed: Allocate returned err (classify with errors.Is).
	GrantFailed(region, worker int, err error, latency time.Duration)
	// Conflict: a grant transaction failed its compare because another
	// replica committed first (or signalled contention) and is retried.
	Conflict(region, worker int)
	// Acquired: a code was leased; AcquireFailed: Acquire returned err.
	Acquired(region, worker int)
	AcquireFailed(region int, err error)
	// Renewed: Renew returned err (nil on success).
	Renewed(region, worker int, err error)
	// Released: Release returned err (nil on success).
	Released(region, worker int, err error)
	// Corrupt: a stored value under key does not decode; grants on that
	// code stop until it is repaired.
	Corrupt(key string, err error)
}

// NopObserver ignores every event. Its methods do nothing.
type NopObserver struct{}

func (NopObserver) Granted(int, int, int64, time.Duration)     {}
func (NopObserver) GrantFailed(int, int, error, time.Duration) {}
func (NopObserver) Conflict(int, int)                          {}
func (NopObserver) Acquired(int, int)                          {}
func (NopObserver) AcquireFailed(int, error)                   {}
func (NopObserver) Renewed(int, int, error)                    {}
func (NopObserver) Released(int, int, error)                   {}
func (NopObserver) Corrupt(string, error)                      {}

// Store is the etcd-backed Allocator: worker-code leases, fencing tokens and
// per-code high-water marks. Any number of Stores (service replicas) may
// share one etcd: etcd transactions serialise their grants. A Store does not
// own its client.
//
// Safety argument, per code:
//   - A block is returned only after the transaction that raised HWM to its
//     Hi committed, and that transaction compared the HWM key's ModRevision
//     with the one the block was computed from. So every committed block
//     starts at or above the previous committed Hi: blocks never overlap,
//     across replicas, restarts and owners, whatever any clock says.
//   - The same transaction compares the lease key's CreateRevision (the
//     token) and ModRevision, so a caller whose lease expired (key deleted
//     by etcd) or was replaced (new CreateRevision) gets nothing.
//   - A transaction that errors may still have committed: its block is
//     never returned (ErrUnavailable), and the cached view is dropped so the
//     next attempt re-reads the HWM. The space is a gap, not a reissue.
//   - A value that does not decode stops that code (ErrCorrupt); Acquire
//     skips codes whose HWM is corrupt (and reports them to the Observer and
//     the log) rather than hand out a code that could not be allocated.
//
// Performance: the Store caches the last view of each code it granted on,
// so an uncontended grant is one round trip (the fenced Txn; a stale cache
// only costs a failed compare whose Else returns the fresh view). Grants on
// one code through one Store take turns; across Stores they race in etcd,
// with a contention signal (see contentionAfter) so no replica starves.
type Store struct {
	cli  *clientv3.Client
	cfg  StoreConfig
	keys keys
	obs  Observer
	log  *slog.Logger

	mu    sync.Mutex
	cache map[[2]int]codeState     // last state seen per (region, worker)
	turns map[[2]int]chan struct{} // one grant at a time per code per Store
}

// codeState is a consistent view of one code's two keys at revision rev.
// A nil KeyValue means the key was absent.
type codeState struct {
	rev        int64
	lease      *mvccpb.KeyValue
	hwm        *mvccpb.KeyValue
	contendRev int64 // ModRevision of the contention key (0: absent)
}

// stateFrom builds a codeState from a Txn response whose first three ops
// were Get lease key, Get HWM key, Get contention key.
func stateFrom(resp *clientv3.TxnResponse) codeState {
	st := codeState{rev: resp.Header.Revision, lease: first(resp.Responses[0]), hwm: first(resp.Responses[1])}
	if c := first(resp.Responses[2]); c != nil {
		st.contendRev = c.ModRevision
	}
	return st
}

// contentionAfter is how many lost races make a grant signal contention.
//
// Why a signal: the replica that just won a grant sends its next one as soon
// as its reply arrives, while the loser first learns it lost; under sustained
// load on one code the loser can lose round after round. A loser that has
// lost contentionAfter times writes the code's contention key in the Else
// branch of its failed Txn. Every grant compares that key's ModRevision, so
// the winner's next grant fails too; a grant that failed only because of the
// signal (HWM and lease unchanged) yields for about one round trip, letting
// the signalling replica through. Nothing is written on the normal path.
const contentionAfter = 2

var _ Allocator = (*Store)(nil)

// NewStore validates cfg and returns a Store over cli.
func NewStore(cli *clientv3.Client, cfg StoreConfig) (*Store, error) {
	if cli == nil {
		return nil, errors.Wrap(ErrInvalid, "store: nil etcd client")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	return &Store{
		cli:   cli,
		cfg:   cfg,
		keys:  keys{prefix: cfg.Prefix},
		obs:   cfg.Observer,
		log:   cfg.Logger,
		cache: make(map[[2]int]codeState),
		turns: make(map[[2]int]chan struct{}),
	}, nil
}

// Policy is the grant rule in force (defaults applied).
func (s *Store) Policy() Policy { return s.cfg.Policy }

// Config is the Store's configuration with defaults applied.
func (s *Store) Config() StoreConfig { return s.cfg }

// LeaseKey is the etcd key holding the owner record of (region, worker).
func (s *Store) LeaseKey(region, worker int) string { return s.keys.lease(region, worker) }

// HighWaterKey is the etcd key holding the high-water mark of (region, worker).
func (s *Store) HighWaterKey(region, worker int) string { return s.keys.hwm(region, worker) }

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

// unavailable marks an etcd error as ErrUnavailable, keeping the cause (so
// errors.Is(err, context.DeadlineExceeded) still works).
func unavailable(err error, format string, args ...any) error {
	return errors.Wrapf(errors.Mark(err, ErrUnavailable), format, args...)
}

func validRegion(region int) error {
	if region < 0 || region > snowflake.MaxRegion {
		return errors.Wrapf(ErrInvalid, "region %d not in 0..%d", region, snowflake.MaxRegion)
	}
	return nil
}

func validLease(l Lease) error {
	if err := validRegion(l.Region); err != nil {
		return err
	}
	switch {
	case l.Worker < 0 || l.Worker > snowflake.MaxWorker:
		return errors.Wrapf(ErrInvalid, "worker %d not in 0..%d", l.Worker, snowflake.MaxWorker)
	case l.Token <= 0:
		return errors.Wrapf(ErrInvalid, "token %d must be positive", l.Token)
	case l.LeaseID == 0:
		return errors.Wrap(ErrInvalid, "lease_id must not be 0")
	}
	return nil
}

// Acquire leases a free worker code of region for owner (printable text up
// to MaxOwnerLen bytes, for operators). It grants an etcd lease, then tries
// the free codes starting at a random one, creating the lease key only if it
// does not exist (If CreateRevision == 0). The token is the revision that
// created the key. With every code leased (or unusable because its HWM is
// corrupt) it returns an error wrapping ErrNoFreeCode (retryable) and
// revokes the unused etcd lease.
func (s *Store) Acquire(ctx context.Context, region int, owner string) (Lease, error) {
	l, err := s.acquire(ctx, region, owner)
	if err != nil {
		if region >= 0 && region <= snowflake.MaxRegion {
			s.obs.AcquireFailed(region, err)
		}
		return Lease{}, err
	}
	s.obs.Acquired(region, l.Worker)
	return l, nil
}

func (s *Store) acquire(ctx context.Context, region int, owner string) (Lease, error) {
	if err := validRegion(region); err != nil {
		return Lease{}, err
	}
	if err := validOwner(owner); err != nil {
		return Lease{}, errors.Wrapf(ErrInvalid, "%v", err)
	}
	octx, cancel := s.opCtx(ctx)
	grant, err := s.cli.Grant(octx, int64(s.cfg.LeaseTTL/time.Second))
	cancel()
	if err != nil {
		return Lease{}, unavailable(err, "acquire region %d: grant etcd lease", region)
	}
	leaseID := grant.ID
	keep := false
	defer func() {
		if !keep {
			s.revoke(ctx, leaseID)
		}
	}()

	const passes = 3 // fresh snapshots before giving up on races
	for pass := 0; pass < passes; pass++ {
		free, err := s.freeCodes(ctx, region)
		if err != nil {
			return Lease{}, err
		}
		if len(free.hwmRev) == 0 {
			return Lease{}, errors.Wrapf(ErrNoFreeCode, "region %d: all %d codes leased (%d unusable: corrupt high-water mark)",
				region, snowflake.MaxWorker+1, free.corrupt)
		}
		start := rand.IntN(snowflake.MaxWorker + 1)
		for i := 0; i <= snowflake.MaxWorker; i++ {
			w := (start + i) % (snowflake.MaxWorker + 1)
			hwmRev, ok := free.hwmRev[w]
			if !ok {
				continue
			}
			rec := OwnerRecord{
				Version: ownerRecordVersion, Region: region, Worker: w,
				LeaseID: int64(leaseID), Owner: owner, AcquiredUnixMs: max(time.Now().UnixMilli(), 1),
			}
			lk, hk := s.keys.lease(region, w), s.keys.hwm(region, w)
			octx, cancel := s.opCtx(ctx)
			resp, err := s.cli.Txn(octx).
				If(clientv3.Compare(clientv3.CreateRevision(lk), "=", 0),
					clientv3.Compare(clientv3.ModRevision(hk), "=", hwmRev)).
				Then(clientv3.OpPut(lk, rec.Encode(), clientv3.WithLease(leaseID))).
				Commit()
			cancel()
			if err != nil {
				// Unknown commit: the deferred revoke deletes the key if it
				// was created, so the code is not left half-owned.
				return Lease{}, unavailable(err, "acquire region %d worker %d: commit unknown", region, w)
			}
			if !resp.Succeeded {
				continue // taken (or its HWM changed) since the snapshot
			}
			keep = true
			s.forget(region, w)
			return Lease{
				Region: region, Worker: w,
				Token:   resp.Header.Revision,
				LeaseID: int64(leaseID),
				TTL:     time.Duration(grant.TTL) * time.Second,
			}, nil
		}
	}
	return Lease{}, errors.Wrapf(ErrNoFreeCode, "region %d: every free code was taken by a concurrent acquire", region)
}

func (s *Store) revoke(ctx context.Context, id clientv3.LeaseID) {
	// Clean-up runs even if ctx is done: the lease would otherwise linger
	// for its TTL holding nothing (or a code).
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	if _, err := s.cli.Revoke(octx, id); err != nil && !errors.Is(err, rpctypes.ErrLeaseNotFound) {
		s.log.Warn("revoke etcd lease failed; it expires by its TTL", "lease_id", int64(id), "err", err)
	}
}

// regionView is a snapshot of a region's keys: the HWM ModRevision (0 when
// absent) of every free, usable code, and how many codes were unusable.
type regionView struct {
	hwmRev  map[int]int64
	leased  int
	corrupt int
}

func (s *Store) freeCodes(ctx context.Context, region int) (regionView, error) {
	lp, hp := s.keys.leasePrefix(region), s.keys.hwmPrefix(region)
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Txn(octx).Then(
		clientv3.OpGet(lp, clientv3.WithPrefix(), clientv3.WithKeysOnly()),
		clientv3.OpGet(hp, clientv3.WithPrefix()),
	).Commit()
	cancel()
	if err != nil {
		return regionView{}, unavailable(err, "region %d: list codes", region)
	}
	leased := make(map[int]bool)
	for _, kv := range resp.Responses[0].GetResponseRange().Kvs {
		w, ok := workerOf(kv.Key, lp)
		if !ok {
			s.log.Warn("unexpected key under lease prefix; ignored", "key", string(kv.Key))
			continue
		}
		leased[w] = true
	}
	v := regionView{hwmRev: make(map[int]int64), leased: len(leased)}
	hwms := make(map[int]*mvccpb.KeyValue)
	for _, kv := range resp.Responses[1].GetResponseRange().Kvs {
		w, ok := workerOf(kv.Key, hp)
		if !ok {
			s.log.Warn("unexpected key under high-water prefix; ignored", "key", string(kv.Key))
			continue
		}
		hwms[w] = kv
	}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		if leased[w] {
			continue
		}
		kv := hwms[w]
		if kv == nil {
			v.hwmRev[w] = 0
			continue
		}
		if _, err := DecodeHighWater(kv.Value); err != nil {
			s.reportCorrupt(string(kv.Key), err)
			v.corrupt++
			continue
		}
		v.hwmRev[w] = kv.ModRevision
	}
	return v, nil
}

func (s *Store) reportCorrupt(key string, err error) {
	s.log.Error("corrupt value in etcd; code stopped until repaired", "key", key, "err", err)
	s.obs.Corrupt(key, err)
}

// FreeCodes is how many codes of region Acquire could hand out now: not
// leased and with a decodable (or absent) HWM.
func (s *Store) FreeCodes(ctx context.Context, region int) (int, error) {
	if err := validRegion(region); err != nil {
		return 0, err
	}
	v, err := s.freeCodes(ctx, region)
	if err != nil {
		return 0, err
	}
	return len(v.hwmRev), nil
}

// LeaseInfo describes one live lease key, as List reports it.
type LeaseInfo struct {
	Lease    // TTL is zero: List does not ask etcd for remaining TTLs
	Owner    string
	Acquired time.Time
	// Err is non-nil (wrapping ErrCorrupt) if the owner record does not
	// decode; the other fields then hold only what the key itself says.
	Err error
}

// List returns the live leases of region, ordered by worker code.
func (s *Store) List(ctx context.Context, region int) ([]LeaseInfo, error) {
	if err := validRegion(region); err != nil {
		return nil, err
	}
	lp := s.keys.leasePrefix(region)
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Get(octx, lp, clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByKey, clientv3.SortAscend))
	cancel()
	if err != nil {
		return nil, unavailable(err, "region %d: list leases", region)
	}
	out := make([]LeaseInfo, 0, len(resp.Kvs))
	for _, kv := range resp.Kvs {
		w, ok := workerOf(kv.Key, lp)
		if !ok {
			continue
		}
		info := LeaseInfo{Lease: Lease{Region: region, Worker: w, Token: kv.CreateRevision, LeaseID: kv.Lease}}
		rec, err := s.checkRecord(kv, region, w)
		if err != nil {
			info.Err = err
		} else {
			info.Owner = rec.Owner
			info.Acquired = time.UnixMilli(rec.AcquiredUnixMs)
		}
		out = append(out, info)
	}
	return out, nil
}

// checkRecord decodes a lease key's value and checks it against the key.
func (s *Store) checkRecord(kv *mvccpb.KeyValue, region, worker int) (OwnerRecord, error) {
	rec, err := DecodeOwnerRecord(kv.Value)
	if err == nil && (rec.Region != region || rec.Worker != worker) {
		err = errors.Wrapf(ErrCorrupt, "owner record names region %d worker %d", rec.Region, rec.Worker)
	}
	if err == nil && rec.LeaseID != kv.Lease {
		err = errors.Wrapf(ErrCorrupt, "owner record names etcd lease %x but the key is attached to %x", rec.LeaseID, kv.Lease)
	}
	if err != nil {
		err = errors.Wrapf(err, "key %s", kv.Key)
		s.reportCorrupt(string(kv.Key), err)
	}
	return rec, err
}

// HighWater reads the committed HWM of a code: 0 if it never had a grant,
// ErrCorrupt if the value does not decode.
func (s *Store) HighWater(ctx context.Context, region, worker int) (int64, error) {
	if err := validRegion(region); err != nil {
		return 0, err
	}
	if worker < 0 || worker > snowflake.MaxWorker {
		return 0, errors.Wrapf(ErrInvalid, "worker %d not in 0..%d", worker, snowflake.MaxWorker)
	}
	hk := s.keys.hwm(region, worker)
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Get(octx, hk)
	cancel()
	if err != nil {
		return 0, unavailable(err, "read %s", hk)
	}
	if len(resp.Kvs) == 0 {
		return 0, nil
	}
	v, err := DecodeHighWater(resp.Kvs[0].Value)
	if err != nil {
		return 0, errors.Wrapf(err, "key %s", hk)
	}
	return v, nil
}

// fence decides whether l owns its code in state st: nil if it does;
// otherwise ErrLeaseLost (no lease key: expired or released), ErrFenced
// (another token owns the code), ErrInvalid (a token never issued, or a
// lease_id that is not the one the code is attached to) or ErrCorrupt.
func (s *Store) fence(l Lease, st codeState) error {
	kv := st.lease
	if l.Token > st.rev {
		return errors.Wrapf(ErrInvalid, "token %d was never issued (store revision is %d)", l.Token, st.rev)
	}
	if kv == nil {
		return errors.Wrapf(ErrLeaseLost, "region %d worker %d token %d: lease key is gone (expired or released)",
			l.Region, l.Worker, l.Token)
	}
	if kv.CreateRevision != l.Token {
		return errors.Wrapf(ErrFenced, "region %d worker %d: token %d, but the code is owned by token %d",
			l.Region, l.Worker, l.Token, kv.CreateRevision)
	}
	if _, err := s.checkRecord(kv, l.Region, l.Worker); err != nil {
		return err
	}
	if kv.Lease != l.LeaseID {
		return errors.Wrapf(ErrInvalid, "lease_id %x is not the code's etcd lease", l.LeaseID)
	}
	return nil
}

// Renew keeps l's etcd lease alive once, after checking that l still owns its
// code. It returns l with the TTL etcd granted. A caller's safety deadline is
// (time it sent this request) + TTL - margin.
func (s *Store) Renew(ctx context.Context, l Lease) (Lease, error) {
	out, err := s.renew(ctx, l)
	if validLease(l) == nil {
		s.obs.Renewed(l.Region, l.Worker, err)
	}
	return out, err
}

func (s *Store) renew(ctx context.Context, l Lease) (Lease, error) {
	if err := validLease(l); err != nil {
		return Lease{}, err
	}
	st, err := s.read(ctx, l.Region, l.Worker)
	if err != nil {
		return Lease{}, err
	}
	if err := s.fence(l, st); err != nil {
		return Lease{}, err
	}
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.KeepAliveOnce(octx, clientv3.LeaseID(l.LeaseID))
	cancel()
	switch {
	case errors.Is(err, rpctypes.ErrLeaseNotFound):
		return Lease{}, errors.Wrapf(ErrLeaseLost, "region %d worker %d: etcd lease %x expired", l.Region, l.Worker, l.LeaseID)
	case err != nil:
		return Lease{}, unavailable(err, "renew region %d worker %d", l.Region, l.Worker)
	case resp.TTL <= 0:
		return Lease{}, errors.Wrapf(ErrLeaseLost, "region %d worker %d: etcd lease %x has no TTL left", l.Region, l.Worker, l.LeaseID)
	}
	l.TTL = time.Duration(resp.TTL) * time.Second
	return l, nil
}

// Release deletes l's lease key (only if l still owns it) and revokes its
// etcd lease. The code's HWM stays, so the next owner starts above it.
func (s *Store) Release(ctx context.Context, l Lease) error {
	err := s.release(ctx, l)
	if validLease(l) == nil {
		s.obs.Released(l.Region, l.Worker, err)
	}
	return err
}

func (s *Store) release(ctx context.Context, l Lease) error {
	if err := validLease(l); err != nil {
		return err
	}
	lk := s.keys.lease(l.Region, l.Worker)
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Txn(octx).
		If(clientv3.Compare(clientv3.CreateRevision(lk), "=", l.Token),
			clientv3.Compare(clientv3.LeaseValue(lk), "=", clientv3.LeaseID(l.LeaseID))).
		Then(clientv3.OpDelete(lk)).
		Else(clientv3.OpGet(lk)).
		Commit()
	cancel()
	if err != nil {
		return unavailable(err, "release region %d worker %d", l.Region, l.Worker)
	}
	s.forget(l.Region, l.Worker)
	if !resp.Succeeded {
		st := codeState{rev: resp.Header.Revision, lease: first(resp.Responses[0])}
		if err := s.fence(l, st); err != nil {
			return err
		}
		return errors.Wrapf(ErrFenced, "release region %d worker %d: lease changed concurrently", l.Region, l.Worker)
	}
	s.revoke(ctx, clientv3.LeaseID(l.LeaseID))
	return nil
}

// first is the single key a Get op in a Txn returned, or nil.
func first(r *etcdserverpb.ResponseOp) *mvccpb.KeyValue {
	kvs := r.GetResponseRange().GetKvs()
	if len(kvs) == 0 {
		return nil
	}
	return kvs[0]
}

// sameKV reports whether two views of a key are the same version of it.
func sameKV(a, b *mvccpb.KeyValue) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ModRevision == b.ModRevision
}

// read returns a consistent view of a code's lease and HWM keys.
func (s *Store) read(ctx context.Context, region, worker int) (codeState, error) {
	lk, hk, ck := s.keys.lease(region, worker), s.keys.hwm(region, worker), s.keys.contend(region, worker)
	octx, cancel := s.opCtx(ctx)
	resp, err := s.cli.Txn(octx).Then(clientv3.OpGet(lk), clientv3.OpGet(hk), clientv3.OpGet(ck, clientv3.WithKeysOnly())).Commit()
	cancel()
	if err != nil {
		return codeState{}, unavailable(err, "read region %d worker %d", region, worker)
	}
	return stateFrom(resp), nil
}

func (s *Store) cached(region, worker int) (codeState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st, ok := s.cache[[2]int{region, worker}]
	return st, ok
}

// remember keeps st unless a newer view is already cached.
func (s *Store) remember(region, worker int, st codeState) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]int{region, worker}
	if old, ok := s.cache[k]; !ok || old.rev < st.rev {
		s.cache[k] = st
	}
}

// takeTurn waits (or until ctx ends) for the right to run a grant on a code
// through this Store. Callers on one replica queue instead of racing each
// other in etcd, where all but one would lose every round; replicas still
// race, and the transaction's compares still decide.
func (s *Store) takeTurn(ctx context.Context, region, worker int) (release func(), err error) {
	s.mu.Lock()
	k := [2]int{region, worker}
	turn, ok := s.turns[k]
	if !ok {
		turn = make(chan struct{}, 1)
		s.turns[k] = turn
	}
	s.mu.Unlock()
	select {
	case turn <- struct{}{}:
		return func() { <-turn }, nil
	case <-ctx.Done():
		return nil, unavailable(ctx.Err(), "allocate region %d worker %d: waiting for the code's previous grant", region, worker)
	}
}

func (s *Store) forget(region, worker int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, [2]int{region, worker})
}

// Allocate grants a block of up to n L units on l's code. The block is
// computed by Policy.Plan from the code's HWM and the service clock, and is
// returned only after the transaction raising the HWM to its Hi committed,
// fenced by l.Token and the HWM's revision. Errors: ErrInvalid (bad field,
// named), ErrFenced / ErrLeaseLost (l no longer owns the code), ErrCorrupt
// (a stored value of the code does not decode; nothing is written),
// *Backpressure, ErrEpochExhausted, ErrUnavailable (etcd did not answer, or
// the outcome of the commit is unknown: no block, and the range is burned).
func (s *Store) Allocate(ctx context.Context, l Lease, n int) (Block, error) {
	start := time.Now()
	b, err := s.allocate(ctx, l, n)
	if validLease(l) == nil {
		if err != nil {
			s.obs.GrantFailed(l.Region, l.Worker, err, time.Since(start))
		} else {
			s.obs.Granted(l.Region, l.Worker, b.Len(), time.Since(start))
		}
	}
	return b, err
}

func (s *Store) allocate(ctx context.Context, l Lease, n int) (Block, error) {
	if err := validLease(l); err != nil {
		return Block{}, err
	}
	if n < 1 || int64(n) > s.cfg.Policy.MaxBlock {
		return Block{}, errors.Wrapf(ErrInvalid, "count %d not in 1..%d", n, s.cfg.Policy.MaxBlock)
	}
	done, err := s.takeTurn(ctx, l.Region, l.Worker)
	if err != nil {
		return Block{}, err
	}
	defer done()
	// A cached view may be stale; it is only trusted as far as the commit's
	// compares go. A stale view that says "not yours" is re-read before it
	// is believed.
	st, fromCache := s.cached(l.Region, l.Worker)
	needRead := !fromCache
	lk, hk, ck := s.keys.lease(l.Region, l.Worker), s.keys.hwm(l.Region, l.Worker), s.keys.contend(l.Region, l.Worker)
	for conflicts := 0; ; {
		if needRead {
			var err error
			if st, err = s.read(ctx, l.Region, l.Worker); err != nil {
				return Block{}, err
			}
			needRead, fromCache = false, false
		}
		if err := s.fence(l, st); err != nil {
			if fromCache {
				needRead = true
				continue
			}
			s.forget(l.Region, l.Worker)
			return Block{}, err
		}
		var hwm, hwmRev int64
		if st.hwm != nil {
			v, err := DecodeHighWater(st.hwm.Value)
			if err != nil {
				s.forget(l.Region, l.Worker)
				err = errors.Wrapf(err, "key %s", hk)
				s.reportCorrupt(hk, err)
				return Block{}, err
			}
			hwm, hwmRev = v, st.hwm.ModRevision
		}
		now := s.cfg.Clock.Now()
		g, err := s.cfg.Policy.Plan(hwm, now, int64(n))
		if err != nil {
			s.remember(l.Region, l.Worker, st)
			return Block{}, errors.Wrapf(err, "region %d worker %d", l.Region, l.Worker)
		}
		orElse := []clientv3.Op{clientv3.OpGet(lk), clientv3.OpGet(hk), clientv3.OpGet(ck, clientv3.WithKeysOnly())}
		if conflicts >= contentionAfter {
			orElse = append(orElse, clientv3.OpPut(ck, "v1"))
		}
		octx, cancel := s.opCtx(ctx)
		sent := time.Now()
		resp, err := s.cli.Txn(octx).
			If(clientv3.Compare(clientv3.CreateRevision(lk), "=", l.Token),
				clientv3.Compare(clientv3.ModRevision(lk), "=", st.lease.ModRevision),
				clientv3.Compare(clientv3.ModRevision(hk), "=", hwmRev),
				clientv3.Compare(clientv3.ModRevision(ck), "=", st.contendRev)).
			Then(clientv3.OpPut(hk, EncodeHighWater(g.Hi))).
			Else(orElse...).
			Commit()
		rtt := time.Since(sent)
		cancel()
		if err != nil {
			// The put may or may not have committed. [g.Lo, g.Hi) is burned:
			// never returned, and the next call re-reads the HWM.
			s.forget(l.Region, l.Worker)
			return Block{}, unavailable(err, "allocate region %d worker %d: commit unknown, block [%d,%d) discarded",
				l.Region, l.Worker, g.Lo, g.Hi)
		}
		if resp.Succeeded {
			// Our put is the HWM at resp.Header.Revision; the lease key is
			// unchanged (the compare held).
			hwmKV := &mvccpb.KeyValue{Key: []byte(hk), Value: []byte(EncodeHighWater(g.Hi)),
				ModRevision: resp.Header.Revision}
			s.remember(l.Region, l.Worker, codeState{rev: resp.Header.Revision, lease: st.lease, hwm: hwmKV, contendRev: st.contendRev})
			return Block{
				Region: l.Region, Worker: l.Worker, Lo: g.Lo, Hi: g.Hi,
				ServiceTime: g.ServiceTime, ValidUntil: g.ValidUntil,
			}, nil
		}
		// The compare failed: the Else reads are a fresh view. Either l was
		// fenced (the next fence check says so) or another grant won.
		prev := st
		st = stateFrom(resp)
		if len(orElse) > 3 {
			// Our Else wrote the contention key at this revision.
			st.contendRev = resp.Header.Revision
		}
		fromCache = false
		if err := s.fence(l, st); err != nil {
			s.forget(l.Region, l.Worker)
			return Block{}, err
		}
		s.remember(l.Region, l.Worker, st)
		conflicts++
		s.obs.Conflict(l.Region, l.Worker)
		if conflicts >= s.cfg.MaxConflicts {
			return Block{}, errors.Wrapf(ErrUnavailable, "allocate region %d worker %d: lost %d races on the high-water mark",
				l.Region, l.Worker, conflicts)
		}
		if sameKV(prev.hwm, st.hwm) && sameKV(prev.lease, st.lease) {
			// Only another replica's contention signal failed us: yield a
			// random one to two round trips so it gets through (if both
			// signalled, the shorter wait wins), then go again.
			if err := clock.Sleep(ctx, rtt+rand.N(rtt+time.Millisecond)); err != nil {
				return Block{}, unavailable(err, "allocate region %d worker %d: yielding to a contending replica", l.Region, l.Worker)
			}
			needRead = true // the HWM has most likely moved while we slept
		}
	}
}
