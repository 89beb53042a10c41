package store

import (
	"context"
	"fmt"
	"log/slog"
	"sync"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

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
	cfg Config
	obs Observer
	log *slog.Logger

	batch *batcher // group commit; nil if the storage is no BatchStorage
	// startFloor is the lowest L any grant of this Store starts at
	// (Config.RestartFloor; 0: none). Fixed at New.
	startFloor int64

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

var _ segment.Allocator = (*Store)(nil)

// New validates cfg and returns a Store over storage.
func New(storage Storage, cfg Config) (*Store, error) {
	if storage == nil {
		return nil, fmt.Errorf("store: nil storage: %w", segment.ErrInvalid)
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
	if cfg.RestartFloor {
		started := cfg.StartedAt
		if started.IsZero() {
			started = cfg.Now()
		}
		s.startFloor = restartFloor(started, cfg.Policy.MaxLead, cfg.MaxClockSkew)
		s.log.Info("restart floor: no grant below it on any code",
			"floor", s.startFloor, "floor_time", snowflake.MsTime(s.startFloor>>snowflake.SequenceBits).UTC(),
			"max_lead", cfg.Policy.MaxLead, "max_clock_skew", cfg.MaxClockSkew)
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
func (s *Store) Policy() segment.Policy { return s.cfg.Policy }

// Config is the Store's configuration with defaults applied.
func (s *Store) Config() Config { return s.cfg }

func (s *Store) opCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, s.cfg.OpTimeout)
}

func validRegion(region int) error {
	if region < 0 || region > snowflake.MaxRegion {
		return fmt.Errorf("region %d not in 0..%d: %w", region, snowflake.MaxRegion, segment.ErrInvalid)
	}
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
		return CodeView{}, Unavailable(err, "read region %d worker %d", region, worker)
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
		return nil, Unavailable(ctx.Err(), "allocate region %d worker %d: waiting for the code's previous grant", region, worker)
	}
}

func (s *Store) forget(region, worker int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.cache, [2]int{region, worker})
}
