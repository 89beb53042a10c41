package segment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/idrange/idrange/internal/clock"
	"github.com/idrange/idrange/snowflake"
)

// Store defaults and limits.
const (
	// DefaultLeaseTTL is the lease TTL asked of the storage at Acquire.
	// etcd may grant more (its minimum depends on the election timeout);
	// Lease.TTL says what was granted.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultOpTimeout bounds every single storage call the Store makes.
	DefaultOpTimeout = 3 * time.Second
	// DefaultMaxConflicts is how many failed grant transactions (lost HWM
	// races, yields to a contending replica) one Allocate retries before
	// giving up with ErrUnavailable.
	DefaultMaxConflicts = 64
	// DefaultMaxCodesPerIdentity is how many worker codes of a region one
	// caller identity may hold at once (a quarter of the region), so one
	// misbehaving client cannot take every code.
	DefaultMaxCodesPerIdentity = 64
)

// StoreConfig configures a Store. Zero fields take the documented defaults.
type StoreConfig struct {
	// LeaseTTL asked of the storage at Acquire: whole seconds (etcd leases
	// are in seconds), 1s..1h. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Policy is the grant rule; zero fields take their defaults.
	Policy Policy
	// Now is the service clock grants are computed with. Default time.Now.
	// Uniqueness never depends on it; freshness does.
	Now func() time.Time
	// FirstCode picks the worker code Acquire tries first in region (it
	// then tries the next ones, wrapping at 256). Default: a random code,
	// which spreads concurrent acquirers over the region. A fixed choice
	// (the in-memory test service uses 0) makes tests reproducible.
	FirstCode func(region int) int
	// OpTimeout bounds each storage call. Default DefaultOpTimeout.
	OpTimeout time.Duration
	// MaxConflicts bounds failed grant transactions per Allocate. Default
	// DefaultMaxConflicts.
	MaxConflicts int
	// MaxCodesPerIdentity is how many codes of a region one caller identity
	// (WithIdentity) may hold at once, 1..256; Acquire past it fails with
	// ErrCodeCap. Callers without an identity are not capped. Default
	// DefaultMaxCodesPerIdentity.
	MaxCodesPerIdentity int
	// Logger receives warnings (corrupt values, failed clean-ups). Default:
	// discard.
	Logger *slog.Logger
	// Observer receives metric events. Default: NopObserver.
	Observer Observer
}

func (c StoreConfig) withDefaults() StoreConfig {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	c.Policy = c.Policy.WithDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.FirstCode == nil {
		c.FirstCode = func(int) int { return rand.IntN(snowflake.MaxWorker + 1) }
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.MaxConflicts == 0 {
		c.MaxConflicts = DefaultMaxConflicts
	}
	if c.MaxCodesPerIdentity == 0 {
		c.MaxCodesPerIdentity = DefaultMaxCodesPerIdentity
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
	case c.LeaseTTL < time.Second || c.LeaseTTL > time.Hour:
		return fmt.Errorf("store LeaseTTL %v not in 1s..1h: %w", c.LeaseTTL, ErrInvalid)
	case c.LeaseTTL%time.Second != 0:
		return fmt.Errorf("store LeaseTTL %v is not whole seconds (etcd leases are in seconds): %w", c.LeaseTTL, ErrInvalid)
	case c.OpTimeout < 0:
		return fmt.Errorf("store OpTimeout %v is negative: %w", c.OpTimeout, ErrInvalid)
	case c.MaxConflicts < 1:
		return fmt.Errorf("store MaxConflicts %d must be >= 1: %w", c.MaxConflicts, ErrInvalid)
	case c.MaxCodesPerIdentity < 1 || c.MaxCodesPerIdentity > snowflake.MaxWorker+1:
		return fmt.Errorf("store MaxCodesPerIdentity %d not in 1..%d: %w", c.MaxCodesPerIdentity, snowflake.MaxWorker+1, ErrInvalid)
	}
	return c.Policy.Validate()
}

// Store is the grant loop: worker-code leases, fencing tokens and per-code
// high-water marks, over any Storage (etcd in production, memory in tests:
// one rule for both). Any number of Stores (service replicas) may share one
// storage: its transactions serialise their grants. A Store does not own its
// storage.
//
// Safety argument, per code:
//   - A block is returned only after the transaction that raised HWM to its
//     Hi committed, and that transaction compared the HWM's ModRevision
//     with the one the block was computed from. So every committed block
//     starts at or above the previous committed Hi: blocks never overlap,
//     across replicas, restarts and owners, whatever any clock says.
//   - The same transaction compares the owner entry's CreateRevision (the
//     token) and ModRevision, so a caller whose lease expired (entry deleted
//     by the storage) or was replaced (new CreateRevision) gets nothing.
//   - A transaction that errors may still have committed: its block is
//     never returned (ErrUnavailable), and the cached view is dropped so the
//     next attempt re-reads the HWM. The space is a gap, not a reissue.
//   - A value that does not decode stops that code (ErrCorrupt); Acquire
//     skips codes whose HWM is corrupt (and reports them to the Observer and
//     the log) rather than hand out a code that could not be allocated.
//   - The compares hold only among writers that follow them. Against a
//     store that went back behind every Store's back (restored without a
//     restore fence, written by hand), the Store remembers per code the
//     highest HWM it committed or read, and refuses a code whose stored HWM
//     is below it (ErrHighWaterRegressed; see floor.go).
//
// Performance: the Store caches the last view of each code it granted on,
// so an uncontended grant is one round trip (the fenced commit; a stale
// cache only costs a failed compare, which returns the fresh view). Over a
// BatchStorage, grants for different codes that wait while a commit is in
// flight are committed together, each separately fenced, in one storage
// write (group commit, see batcher). Grants on
// one code through one Store take turns; across Stores they race in the
// storage, with a contention signal (see contentionAfter) so no replica
// starves.
type Store struct {
	stg Storage
	cfg StoreConfig
	obs Observer
	log *slog.Logger

	batch *batcher // group commit; nil if the storage is no BatchStorage

	mu     sync.Mutex
	cache  map[[2]int]CodeView      // last view seen per (region, worker)
	turns  map[[2]int]chan struct{} // one grant at a time per code per Store
	floors map[[2]int]floorMark     // highest HWM committed or read; never forgotten
}

// contentionAfter is how many lost races make a grant signal contention.
//
// Why a signal: the replica that just won a grant sends its next one as soon
// as its reply arrives, while the loser first learns it lost; under sustained
// load on one code the loser can lose round after round. A loser that has
// lost contentionAfter times writes the code's contention signal when its
// commit fails (HighWaterCommit.Signal). Every grant compares the signal's
// ModRevision, so the winner's next grant fails too; a grant that failed only
// because of the signal (HWM and owner unchanged) yields for about one round
// trip, letting the signalling replica through. Nothing is written on the
// normal path.
const contentionAfter = 2

var _ Allocator = (*Store)(nil)

// NewStore validates cfg and returns a Store over storage.
func NewStore(storage Storage, cfg StoreConfig) (*Store, error) {
	if storage == nil {
		return nil, fmt.Errorf("store: nil storage: %w", ErrInvalid)
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Store{
		stg:    storage,
		cfg:    cfg,
		obs:    cfg.Observer,
		log:    cfg.Logger,
		cache:  make(map[[2]int]CodeView),
		turns:  make(map[[2]int]chan struct{}),
		floors: make(map[[2]int]floorMark),
	}
	if bs, ok := storage.(BatchStorage); ok {
		s.batch = newBatcher(bs, cfg.OpTimeout)
	}
	return s, nil
}

// commitHighWater is Storage.CommitHighWater, through the group commit when
// the storage can batch.
func (s *Store) commitHighWater(ctx context.Context, region, worker int, c HighWaterCommit) (int64, bool, CodeView, error) {
	if s.batch == nil {
		return s.stg.CommitHighWater(ctx, region, worker, c)
	}
	r, err := s.batch.commit(ctx, GrantOp{Region: region, Worker: worker, Commit: c})
	return r.Rev, r.OK, r.Fresh, err
}

// Policy is the grant rule in force (defaults applied).
func (s *Store) Policy() Policy { return s.cfg.Policy }

// Config is the Store's configuration with defaults applied.
func (s *Store) Config() StoreConfig { return s.cfg }

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

// unavailable marks a storage error as ErrUnavailable, keeping the cause (so
// errors.Is(err, context.DeadlineExceeded) still works).
func unavailable(err error, format string, args ...any) error {
	return fmt.Errorf("%s: %w: %w", fmt.Sprintf(format, args...), ErrUnavailable, err)
}

func validRegion(region int) error {
	if region < 0 || region > snowflake.MaxRegion {
		return fmt.Errorf("region %d not in 0..%d: %w", region, snowflake.MaxRegion, ErrInvalid)
	}
	return nil
}

// Acquire leases a free worker code of region for owner (ValidateOwner: for
// operators). It grants a storage lease, then tries the free codes starting
// at a random one, creating the owner entry only if it does not exist. The
// token is the revision that created the entry. With every code leased (or
// unusable because its HWM is corrupt or went back, ErrHighWaterRegressed)
// it returns an error wrapping ErrNoFreeCode (retryable) and revokes the
// unused lease.
//
// With a caller identity in ctx (WithIdentity) the lease is bound to it
// (owner record version 2), and an identity that already holds
// MaxCodesPerIdentity codes gets ErrCodeCap (see keepUnderCap for how the
// cap holds against concurrent acquisitions on any replica).
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
	if err := ValidateOwner(owner); err != nil {
		return Lease{}, err
	}
	identity := IdentityFrom(ctx)
	if err := ValidateIdentity(identity); err != nil {
		return Lease{}, err
	}
	if identity != "" {
		// Refuse early, without a lease, when the cap is already reached.
		octx, cancel := s.opCtx(ctx)
		rv, err := s.stg.Scan(octx, region)
		cancel()
		if err != nil {
			return Lease{}, unavailable(err, "region %d: list codes", region)
		}
		if held := len(identityTokens(rv, identity)); held >= s.cfg.MaxCodesPerIdentity {
			return Lease{}, s.capErr(region, identity, held)
		}
	}
	octx, cancel := s.opCtx(ctx)
	leaseID, ttl, err := s.stg.Grant(octx, s.cfg.LeaseTTL)
	cancel()
	if err != nil {
		return Lease{}, unavailable(err, "acquire region %d: grant lease", region)
	}
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
			return Lease{}, fmt.Errorf("region %d: all %d codes leased (%d unusable: corrupt high-water mark; %d: high-water mark went back): %w",
				region, snowflake.MaxWorker+1, free.corrupt, free.regressed, ErrNoFreeCode)
		}
		start := s.cfg.FirstCode(region) & snowflake.MaxWorker
		for i := 0; i <= snowflake.MaxWorker; i++ {
			w := (start + i) % (snowflake.MaxWorker + 1)
			hwmRev, ok := free.hwmRev[w]
			if !ok {
				continue
			}
			rec := OwnerRecord{
				Version: recordVersion(identity), Region: region, Worker: w, LeaseID: leaseID,
				Owner: owner, Identity: identity, AcquiredUnixMs: max(time.Now().UnixMilli(), 1),
			}
			octx, cancel := s.opCtx(ctx)
			token, ok, err := s.stg.CreateOwner(octx, region, w, hwmRev, []byte(rec.Encode()), leaseID)
			cancel()
			if err != nil {
				// Unknown commit: the deferred revoke deletes the entry if it
				// was created, so the code is not left half-owned.
				return Lease{}, unavailable(err, "acquire region %d worker %d: commit unknown", region, w)
			}
			if !ok {
				continue // taken (or its HWM changed) since the snapshot
			}
			if identity != "" {
				// Over the cap: the deferred revoke deletes the new entry.
				if err := s.keepUnderCap(ctx, region, identity, token); err != nil {
					return Lease{}, err
				}
			}
			keep = true
			s.forget(region, w)
			return Lease{Region: region, Worker: w, Token: token, LeaseID: leaseID, TTL: ttl}, nil
		}
	}
	return Lease{}, fmt.Errorf("region %d: every free code was taken by a concurrent acquire: %w", region, ErrNoFreeCode)
}

// keepUnderCap decides, after Acquire created the owner entry of token for
// identity, whether the identity may keep it: it re-reads the region and
// keeps the code only if token is among the MaxCodesPerIdentity smallest
// tokens the identity holds. Tokens are the revisions that created the
// entries, so the rule is the same on every replica: of several concurrent
// acquisitions by one identity, the later ones (larger tokens) give their
// code back. Each kept code saw every live code of its identity created
// before it (its read came after its own creation), so at most
// MaxCodesPerIdentity codes are ever held at once, however many replicas
// acquire for the identity concurrently. The price is that concurrent
// acquirers near the cap may all be refused (each counts codes the others
// are about to give back); ErrCodeCap is retryable.
func (s *Store) keepUnderCap(ctx context.Context, region int, identity string, token int64) error {
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return unavailable(err, "region %d: count the codes of identity %q", region, identity)
	}
	toks := identityTokens(rv, identity)
	smaller := 0
	for _, t := range toks {
		if t < token {
			smaller++
		}
	}
	if smaller >= s.cfg.MaxCodesPerIdentity {
		return s.capErr(region, identity, len(toks)-1)
	}
	return nil
}

func (s *Store) capErr(region int, identity string, held int) error {
	return fmt.Errorf("region %d: identity %q holds %d codes; the cap is %d (--max-codes-per-identity): %w",
		region, identity, held, s.cfg.MaxCodesPerIdentity, ErrCodeCap)
}

// identityTokens returns the tokens of the codes of rv whose owner record
// names identity. Records that do not decode are left out (Acquire does not
// hand out such codes; List reports them).
func identityTokens(rv RegionView, identity string) []int64 {
	var toks []int64
	for _, e := range rv.Owners {
		if rec, err := DecodeOwnerRecord(e.Value); err == nil && rec.Identity == identity {
			toks = append(toks, e.CreateRevision)
		}
	}
	return toks
}

func (s *Store) revoke(ctx context.Context, id int64) {
	// Clean-up runs even if ctx is done: the lease would otherwise linger
	// for its TTL holding nothing (or a code).
	octx, cancel := context.WithTimeout(context.WithoutCancel(ctx), s.cfg.OpTimeout)
	defer cancel()
	if err := s.stg.Revoke(octx, id); err != nil {
		s.log.Warn("revoke lease failed; it expires by its TTL", "lease_id", id, "err", err)
	}
}

// regionView is a snapshot of a region's codes: the HWM ModRevision (0 when
// absent) of every free, usable code, and how many free codes were
// unusable (corrupt HWM, or one that went back).
type regionView struct {
	hwmRev    map[int]int64
	leased    int
	corrupt   int
	regressed int
}

func (s *Store) freeCodes(ctx context.Context, region int) (regionView, error) {
	floors := s.regionFloors(region)
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return regionView{}, unavailable(err, "region %d: list codes", region)
	}
	v := regionView{hwmRev: make(map[int]int64), leased: len(rv.Owners)}
	for w := 0; w <= snowflake.MaxWorker; w++ {
		_, leased := rv.Owners[w]
		e, ok := rv.HighWaters[w]
		var hwm int64
		if ok {
			var err error
			if hwm, err = DecodeHighWater(e.Value); err != nil {
				if !leased {
					s.reportCorrupt(e.Key, err)
					v.corrupt++
				}
				continue
			}
		}
		// Every code's mark is checked, leased or not: the scan is a read.
		if err := s.seeHighWater(region, w, floors[w], hwm, e.Key); err != nil {
			if !leased {
				v.regressed++
			}
			continue
		}
		if !leased {
			v.hwmRev[w] = e.ModRevision
		}
	}
	return v, nil
}

func (s *Store) reportCorrupt(key string, err error) {
	s.log.Error("corrupt value in storage; code stopped until repaired", "key", key, "err", err)
	s.obs.Corrupt(key, err)
}

// FreeCodes is how many codes of region Acquire could hand out now: not
// leased and with a decodable (or absent) HWM that did not go back.
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

// LeaseInfo describes one live lease, as List reports it.
type LeaseInfo struct {
	Lease // TTL is zero: List does not ask the storage for remaining TTLs
	Owner string
	// Identity is the verified identity the lease is bound to ("" if it
	// was acquired without one).
	Identity string
	Acquired time.Time
	// Err is non-nil (wrapping ErrCorrupt) if the owner record does not
	// decode; the other fields then hold only what the entry itself says.
	Err error
}

// List returns the live leases of region, ordered by worker code.
func (s *Store) List(ctx context.Context, region int) ([]LeaseInfo, error) {
	if err := validRegion(region); err != nil {
		return nil, err
	}
	octx, cancel := s.opCtx(ctx)
	rv, err := s.stg.Scan(octx, region)
	cancel()
	if err != nil {
		return nil, unavailable(err, "region %d: list leases", region)
	}
	out := make([]LeaseInfo, 0, len(rv.Owners))
	for w := 0; w <= snowflake.MaxWorker; w++ {
		e, ok := rv.Owners[w]
		if !ok {
			continue
		}
		out = append(out, s.leaseInfo(&e, region, w))
	}
	return out, nil
}

// leaseInfo describes a code's owner entry e; a record that does not decode
// is reported (and its error kept in Err).
func (s *Store) leaseInfo(e *Entry, region, worker int) LeaseInfo {
	info := LeaseInfo{Lease: Lease{Region: region, Worker: worker, Token: e.CreateRevision, LeaseID: e.Lease}}
	rec, err := s.checkRecord(e, region, worker)
	if err != nil {
		info.Err = err
	} else {
		info.Owner = rec.Owner
		info.Identity = rec.Identity
		info.Acquired = time.UnixMilli(rec.AcquiredUnixMs)
	}
	return info
}

// checkRecord decodes an owner entry and checks it against the code and the
// lease it is attached to.
func (s *Store) checkRecord(e *Entry, region, worker int) (OwnerRecord, error) {
	rec, err := DecodeOwnerRecord(e.Value)
	if err == nil && (rec.Region != region || rec.Worker != worker) {
		err = fmt.Errorf("owner record names region %d worker %d: %w", rec.Region, rec.Worker, ErrCorrupt)
	}
	if err == nil && rec.LeaseID != e.Lease {
		err = fmt.Errorf("owner record names lease %x but the entry is attached to %x: %w", rec.LeaseID, e.Lease, ErrCorrupt)
	}
	if err != nil {
		err = fmt.Errorf("key %s: %w", e.Key, err)
		s.reportCorrupt(e.Key, err)
	}
	return rec, err
}

// HighWater reads the committed HWM of a code: 0 if it never had a grant,
// ErrCorrupt if the value does not decode, ErrHighWaterRegressed (also
// ErrCorrupt) if it is below one this Store committed or read before.
func (s *Store) HighWater(ctx context.Context, region, worker int) (int64, error) {
	if err := validRegion(region); err != nil {
		return 0, err
	}
	if worker < 0 || worker > snowflake.MaxWorker {
		return 0, fmt.Errorf("worker %d not in 0..%d: %w", worker, snowflake.MaxWorker, ErrInvalid)
	}
	floor := s.floorOf(region, worker)
	octx, cancel := s.opCtx(ctx)
	v, err := s.stg.Code(octx, region, worker)
	cancel()
	if err != nil {
		return 0, unavailable(err, "read region %d worker %d", region, worker)
	}
	var hwm int64
	var key string
	if v.HighWater != nil {
		key = v.HighWater.Key
		if hwm, err = DecodeHighWater(v.HighWater.Value); err != nil {
			return 0, fmt.Errorf("key %s: %w", key, err)
		}
	}
	if err := s.seeHighWater(region, worker, floor, hwm, key); err != nil {
		return 0, err
	}
	return hwm, nil
}

// fence decides whether l owns its code in view v and the caller (identity)
// may act on it: nil if so; otherwise ErrInvalid (a token never issued, or
// a lease_id that is not the one the owner is attached to), ErrLeaseLost
// (no owner: expired or released), ErrFenced (another token owns the code),
// ErrCorrupt, or ErrPermissionDenied (the lease is bound to another
// identity).
//
// Identity first. A caller names a lease by its code and token. When that
// is not the code's live lease, the answer (ErrInvalid, ErrLeaseLost or
// ErrFenced) is the same whoever asks and says nothing about the live
// lease: no token, revision or lease id. When it is the live lease, the
// caller's identity is checked before anything else about it is read or
// revealed: a caller of another identity gets ErrPermissionDenied and a
// message naming only the code, so a forged request learns neither the
// lease id nor whether its guess of it was right. The details of a record
// that does not decode go to the log, not to the caller.
//
// The identity is checked against the owner record whose CreateRevision is
// l.Token. That record is immutable: nothing rewrites an owner entry, and a
// new owner is a new entry with a new CreateRevision. Every write that
// follows a fence is conditional on that same token (the grant compares the
// owner's CreateRevision and ModRevision, Release deletes only the entry
// created at l.Token, Renew keeps alive only the lease that record is
// attached to, which no other record can be), so no other owner can slip in
// between the check and the act: there is no read-then-act race.
func (s *Store) fence(l Lease, v CodeView, identity string) error {
	e := v.Owner
	switch {
	case l.Token > v.Rev:
		return fmt.Errorf("region %d worker %d: the token was never issued: %w", l.Region, l.Worker, ErrInvalid)
	case e == nil:
		return fmt.Errorf("region %d worker %d: the lease is gone (expired or released): %w",
			l.Region, l.Worker, ErrLeaseLost)
	case e.CreateRevision != l.Token:
		return fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, ErrFenced)
	}
	rec, err := s.checkRecord(e, l.Region, l.Worker)
	if err != nil {
		// checkRecord logged the details (key, lease ids).
		return fmt.Errorf("region %d worker %d: the owner record is invalid (details in the replica's log): %w",
			l.Region, l.Worker, ErrCorrupt)
	}
	if rec.Identity != identity {
		return fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, ErrPermissionDenied)
	}
	if e.Lease != l.LeaseID {
		return fmt.Errorf("region %d worker %d: lease_id %x is not the code's lease: %w", l.Region, l.Worker, l.LeaseID, ErrInvalid)
	}
	return nil
}

// Renew keeps l's storage lease alive once, after checking that l still
// owns its code. It returns l with the TTL granted. A caller's safety
// deadline is (time it sent this request) + TTL - margin.
func (s *Store) Renew(ctx context.Context, l Lease) (Lease, error) {
	out, err := s.renew(ctx, l)
	if l.Validate() == nil {
		s.obs.Renewed(l.Region, l.Worker, err)
	}
	return out, err
}

func (s *Store) renew(ctx context.Context, l Lease) (Lease, error) {
	if err := l.Validate(); err != nil {
		return Lease{}, err
	}
	v, err := s.read(ctx, l.Region, l.Worker)
	if err != nil {
		return Lease{}, err
	}
	if err := s.fence(l, v, IdentityFrom(ctx)); err != nil {
		return Lease{}, err
	}
	octx, cancel := s.opCtx(ctx)
	ttl, err := s.stg.KeepAlive(octx, l.LeaseID)
	cancel()
	switch {
	case err != nil:
		return Lease{}, unavailable(err, "renew region %d worker %d", l.Region, l.Worker)
	case ttl <= 0:
		return Lease{}, fmt.Errorf("region %d worker %d: lease %x expired: %w", l.Region, l.Worker, l.LeaseID, ErrLeaseLost)
	}
	l.TTL = ttl
	return l, nil
}

// Release deletes l's owner entry (only if l still owns it and the caller's
// identity is the one the lease is bound to) and revokes its storage lease.
// The code's HWM stays, so the next owner starts above it.
func (s *Store) Release(ctx context.Context, l Lease) error {
	err := s.release(ctx, l)
	if l.Validate() == nil {
		s.obs.Released(l.Region, l.Worker, err)
	}
	return err
}

func (s *Store) release(ctx context.Context, l Lease) error {
	if err := l.Validate(); err != nil {
		return err
	}
	// Check the caller against the record first: the delete below is
	// conditional on the same token, so it can only delete this record.
	identity := IdentityFrom(ctx)
	v, err := s.read(ctx, l.Region, l.Worker)
	if err != nil {
		return err
	}
	if err := s.fence(l, v, identity); err != nil {
		return err
	}
	octx, cancel := s.opCtx(ctx)
	ok, fresh, err := s.stg.DeleteOwner(octx, l.Region, l.Worker, l.Token, l.LeaseID)
	cancel()
	if err != nil {
		return unavailable(err, "release region %d worker %d", l.Region, l.Worker)
	}
	s.forget(l.Region, l.Worker)
	if !ok {
		if err := s.fence(l, fresh, identity); err != nil {
			return err
		}
		return fmt.Errorf("release region %d worker %d: lease changed concurrently: %w", l.Region, l.Worker, ErrFenced)
	}
	s.revoke(ctx, l.LeaseID)
	return nil
}

// sameEntry reports whether two views of an entry are the same version of it.
func sameEntry(a, b *Entry) bool {
	if a == nil || b == nil {
		return a == b
	}
	return a.ModRevision == b.ModRevision
}

// read returns a consistent view of a code.
func (s *Store) read(ctx context.Context, region, worker int) (CodeView, error) {
	octx, cancel := s.opCtx(ctx)
	v, err := s.stg.Code(octx, region, worker)
	cancel()
	if err != nil {
		return CodeView{}, unavailable(err, "read region %d worker %d", region, worker)
	}
	return v, nil
}

func (s *Store) cached(region, worker int) (CodeView, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	v, ok := s.cache[[2]int{region, worker}]
	return v, ok
}

// remember keeps v unless a newer view is already cached.
func (s *Store) remember(region, worker int, v CodeView) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := [2]int{region, worker}
	if old, ok := s.cache[k]; !ok || old.Rev < v.Rev {
		s.cache[k] = v
	}
}

// takeTurn waits (or until ctx ends) for the right to run a grant on a code
// through this Store. Callers on one replica queue instead of racing each
// other in the storage, where all but one would lose every round; replicas
// still race, and the transaction's compares still decide.
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
// ErrHighWaterRegressed (also ErrCorrupt: the code's stored HWM is below
// one this Store committed or read; nothing is written),
// *Backpressure, ErrEpochExhausted, ErrUnavailable (the storage did not
// answer, or the outcome of the commit is unknown: no block, and the range
// is burned).
func (s *Store) Allocate(ctx context.Context, l Lease, n int) (Block, error) {
	start := time.Now()
	b, err := s.allocate(ctx, l, n)
	if l.Validate() == nil {
		if err != nil {
			s.obs.GrantFailed(l.Region, l.Worker, err, time.Since(start))
		} else {
			s.obs.Granted(l.Region, l.Worker, b.Len(), time.Since(start))
		}
	}
	return b, err
}

func (s *Store) allocate(ctx context.Context, l Lease, n int) (Block, error) {
	if err := l.Validate(); err != nil {
		return Block{}, err
	}
	if n < 1 || int64(n) > s.cfg.Policy.MaxBlock {
		return Block{}, fmt.Errorf("count %d not in 1..%d: %w", n, s.cfg.Policy.MaxBlock, ErrInvalid)
	}
	done, err := s.takeTurn(ctx, l.Region, l.Worker)
	if err != nil {
		return Block{}, err
	}
	defer done()
	// A cached view may be stale; it is only trusted as far as the commit's
	// compares go. A stale view that says "not yours" is re-read before it
	// is believed.
	identity := IdentityFrom(ctx)
	v, fromCache := s.cached(l.Region, l.Worker)
	needRead := !fromCache
	var floor int64 // the code's floor when the view v was asked for (not from the cache)
	for conflicts := 0; ; {
		if needRead {
			floor = s.floorOf(l.Region, l.Worker)
			var err error
			if v, err = s.read(ctx, l.Region, l.Worker); err != nil {
				return Block{}, err
			}
			needRead, fromCache = false, false
		}
		if err := s.fence(l, v, identity); err != nil {
			if fromCache {
				needRead = true
				continue
			}
			if !errors.Is(err, ErrPermissionDenied) { // the view is right, and the owner's
				s.forget(l.Region, l.Worker)
			}
			return Block{}, err
		}
		var hwm, hwmRev int64
		var key string
		if v.HighWater != nil {
			h, err := DecodeHighWater(v.HighWater.Value)
			if err != nil {
				s.forget(l.Region, l.Worker)
				err = fmt.Errorf("key %s: %w", v.HighWater.Key, err)
				s.reportCorrupt(v.HighWater.Key, err)
				return Block{}, err
			}
			hwm, hwmRev, key = h, v.HighWater.ModRevision, v.HighWater.Key
		}
		if fromCache {
			if !s.atFloor(l.Region, l.Worker, hwm) {
				needRead = true // older than what the Store has seen since
				continue
			}
		} else if err := s.seeHighWater(l.Region, l.Worker, floor, hwm, key); err != nil {
			s.forget(l.Region, l.Worker)
			return Block{}, err
		}
		g, err := s.cfg.Policy.Plan(hwm, s.cfg.Now(), int64(n))
		if err != nil {
			s.remember(l.Region, l.Worker, v)
			return Block{}, fmt.Errorf("region %d worker %d: %w", l.Region, l.Worker, err)
		}
		signal := conflicts >= contentionAfter
		value := []byte(EncodeHighWater(g.Hi))
		floor = s.floorOf(l.Region, l.Worker) // fresh, on a failed compare, is checked against it
		octx, cancel := s.opCtx(ctx)
		sent := time.Now()
		rev, ok, fresh, err := s.commitHighWater(octx, l.Region, l.Worker, HighWaterCommit{
			Value: value, Token: l.Token, OwnerRev: v.Owner.ModRevision,
			HighWaterRev: hwmRev, ContentionRev: v.Contention, Signal: signal,
		})
		rtt := time.Since(sent)
		cancel()
		if err != nil {
			// The write may or may not have committed. [g.Lo, g.Hi) is
			// burned: never returned, and the next call re-reads the HWM.
			s.forget(l.Region, l.Worker)
			return Block{}, unavailable(err, "allocate region %d worker %d: commit unknown, block [%d,%d) discarded",
				l.Region, l.Worker, g.Lo, g.Hi)
		}
		if ok {
			// Our write is the HWM at rev; the owner entry is unchanged
			// (the compare held).
			hw := &Entry{Key: key, Value: value, ModRevision: rev}
			s.raiseFloor(l.Region, l.Worker, g.Hi)
			s.remember(l.Region, l.Worker, CodeView{Rev: rev, Owner: v.Owner, HighWater: hw, Contention: v.Contention})
			return Block{
				Region: l.Region, Worker: l.Worker, Lo: g.Lo, Hi: g.Hi,
				ServiceTime: g.ServiceTime, ValidUntil: g.ValidUntil,
			}, nil
		}
		// A compare failed: fresh is the view after it. Either l was fenced
		// (the next fence check says so) or another grant won.
		prev := v
		v = fresh
		fromCache = false
		if err := s.fence(l, v, identity); err != nil {
			s.forget(l.Region, l.Worker)
			return Block{}, err
		}
		s.remember(l.Region, l.Worker, v)
		conflicts++
		s.obs.Conflict(l.Region, l.Worker)
		if conflicts >= s.cfg.MaxConflicts {
			return Block{}, fmt.Errorf("allocate region %d worker %d: lost %d races on the high-water mark: %w",
				l.Region, l.Worker, conflicts, ErrUnavailable)
		}
		if sameEntry(prev.HighWater, v.HighWater) && sameEntry(prev.Owner, v.Owner) {
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
