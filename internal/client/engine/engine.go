// Package engine is the Go client's engine: everything rangeclient.Client
// does, built directly by the range service's own minter
// (internal/server/mintpool, through rangesvc serve), the bench and the
// fault suite, with every knob in Config.
//
// An Engine holds one lane per worker code (Config.Codes; one on the
// shared path). A lane is
//
//   - a buffer of two blocks, current and next (buffer.go), each with its
//     atomic cursor (block.go): Next takes positions with one atomic add
//     or compare-and-swap, and so does a carve of a shared run for another
//     client (carve.go), which is how the replica's minter serves the
//     shared path;
//   - a source of blocks: a worker code of its own under a lease session
//     that renews the lease and keeps its local safety deadline
//     (lease.go, source_code.go), or shared runs a replica carves out of
//     its own code (source_shared.go); a lane on the shared path switches
//     to a code of its own when its rate needs one;
//   - one refill loop over that source (refill.go), sizing its requests to
//     the measured rate and latency (policy.go).
//
// The engine talks to the service through a segment.Allocator: in process
// (the replica's store), or over gRPC (internal/wire) to the Targets it
// dials (dial.go). Its errors are the sentinels of errors.go, which
// rangeclient exports as its own.
package engine

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"

	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/carve"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Engine mints IDs from blocks granted by the range service. It is safe for
// concurrent use. Build it with New (or Start, in place); Close it to give
// its leases back.
type Engine struct {
	// more are the further codes' lanes (Config.Codes - 1 of them); nil
	// with one code. Next reads it first, in the cache line of the first
	// lane's hot fields (TestClientLayout).
	more []*lane
	// lane is the first code's lane, embedded so that Next on an engine of
	// one code reads the lane's hot fields without following a pointer.
	lane

	conns    []*grpc.ClientConn // none with Config.Allocator
	closeOne sync.Once
	closeErr error
}

// New validates cfg, learns the service's region (with Targets; see
// Config.Region), takes its first block (a worker-code lease and its
// block, or a shared run) and returns the running engine, so the first
// Next does not wait on the network. Retryable failures (service
// unreachable, no free code) are retried with backoff until ctx is done:
// pass a ctx with a deadline. Bad configuration, a region the service does
// not serve (ErrInvalidConfig when Config.Region disagrees with the
// service's answer) and similar final errors return at once.
func New(ctx context.Context, cfg Config) (*Engine, error) {
	e := new(Engine)
	if err := e.Start(ctx, cfg); err != nil {
		return nil, err
	}
	return e, nil
}

// Start is New for an Engine the caller holds by value (rangeclient.Client
// does, so that Next follows no pointer to reach it): it starts the zero
// Engine e in place. Call it once, and Close after it succeeded.
func (e *Engine) Start(ctx context.Context, cfg Config) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	cfg = cfg.withDefaults()
	log := cfg.Logger
	alloc := cfg.Allocator
	if alloc == nil {
		a, conns, err := dial(cfg, log)
		if err != nil {
			return fmt.Errorf("rangeclient: dial %v: %w", cfg.Targets, err)
		}
		alloc, e.conns = a, conns
	}
	e.lane.init(cfg, alloc, newCodeEnds())
	if len(e.conns) > 0 {
		// Before anything else reads the config (metrics, loops): Region
		// may change.
		if err := e.learnRegion(ctx); err != nil {
			e.abort()
			return err
		}
	}
	if cfg.Registerer != nil {
		e.metrics = newCollector(e) // the first lane's: refill latency is observed there
		if err := cfg.Registerer.Register(e.metrics); err != nil {
			e.abort()
			return fmt.Errorf("rangeclient: register metrics (wrap Config.Registerer with distinct labels per client): %w", err)
		}
	}
	if err := e.lane.start(ctx); err != nil {
		e.abort()
		return err
	}
	if err := e.startMore(ctx); err != nil {
		e.Close()
		return err
	}
	return nil
}

// startMore starts the further codes' lanes, over the same allocator, in
// the region the first one settled on.
func (e *Engine) startMore(ctx context.Context) error {
	lc := e.cfg
	lc.Codes, lc.Registerer = 1, nil
	lc.Region = e.lease.Load().seg.Region
	for i := 1; i < e.cfg.Codes; i++ {
		l := new(lane)
		l.init(lc, e.alloc, e.ends)
		if err := l.start(ctx); err != nil {
			l.abort()
			return fmt.Errorf("rangeclient: code %d of %d: %w", i+1, e.cfg.Codes, err)
		}
		e.more = append(e.more, l)
	}
	return nil
}

// abort undoes a Start that failed before the loops started.
func (e *Engine) abort() {
	e.lane.abort()
	if e.metrics != nil {
		e.cfg.Registerer.Unregister(e.metrics)
	}
	for _, conn := range e.conns {
		conn.Close()
	}
}

// pick is the lane a call mints from: the first or one of the others, at
// random (math/rand/v2's per-thread source: no shared state).
func (e *Engine) pick() *lane {
	if i := rand.IntN(len(e.more) + 1); i > 0 {
		return e.more[i-1]
	}
	return &e.lane
}

// lanes are all the engine's lanes, the first one first.
func (e *Engine) lanes() []*lane {
	return append([]*lane{&e.lane}, e.more...)
}

// Next returns a new ID. At steady state it is one clock reading and one
// atomic add on the current block (a compare-and-swap, once per
// millisecond at most, when the clock has left the cursor's millisecond
// and the cursor jumps to it), with no lock, no allocation and no network
// call; it reads one cache line of the Engine and one of the block (the
// block's stop stands for its lease's deadline: see block).
//
// It never mints under a lease past its safety deadline or fenced by the
// service; it then waits, within ctx, for the engine to acquire a new
// lease by itself, as it waits for a refill when both buffered blocks are
// used up. If ctx ends first it returns ErrUnavailable (retryable), which
// wraps the cause: ErrLeaseLost, ErrFenced or the last refill error, and
// ctx's error. A ctx without deadline waits until recovery or Close. After
// Close it fails at once with ErrClosed. Above 4,096 IDs/ms the engine runs
// ahead of time until the service's bounded lead applies backpressure; Next
// then waits (within ctx) for the service to grant again.
func (e *Engine) Next(ctx context.Context) (snowflake.ID, error) {
	if e.more != nil {
		return e.pick().nextID(ctx)
	}
	return e.lane.nextID(ctx)
}

// NextN returns n new IDs (n >= 0). Runs of consecutive IDs are reserved
// with one compare-and-swap each. On error the IDs returned so far are
// valid and unique.
func (e *Engine) NextN(ctx context.Context, n int) ([]snowflake.ID, error) {
	if n < 0 {
		return nil, fmt.Errorf("rangeclient: NextN count %d is negative", n)
	}
	return e.AppendN(ctx, make([]snowflake.ID, 0, n), n)
}

// AppendN appends n new IDs to dst and returns it, like NextN; it does not
// allocate when dst has room.
func (e *Engine) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	if n < 0 {
		return dst, fmt.Errorf("rangeclient: AppendN count %d is negative", n)
	}
	if e.more != nil {
		return e.pick().appendN(ctx, dst, n)
	}
	return e.lane.appendN(ctx, dst, n)
}

// Carve takes a shared run for r from the current block of the engine's
// first code (internal/carve has the request's rules): the replica's
// minter serves AllocateShared with it. See lane.carve.
func (e *Engine) Carve(ctx context.Context, r carve.Request) (segment.Block, error) {
	if err := r.Validate(); err != nil {
		return segment.Block{}, err
	}
	return e.lane.carve(ctx, r)
}

// Close stops minting at once, stops the background loops (cancelling
// their calls), gives the leases back (best effort, within RPCTimeout: they
// expire by their TTL anyway) and unregisters the metrics. It returns
// within about RPCTimeout whatever the network does. Later calls return
// ErrClosed; Close is idempotent and returns the first call's result.
func (e *Engine) Close() error {
	e.closeOne.Do(func() {
		errs := make([]error, len(e.more)+1)
		var wg sync.WaitGroup
		for i, l := range e.more {
			wg.Go(func() { errs[i+1] = l.close() })
		}
		errs[0] = e.lane.close()
		wg.Wait()
		if e.metrics != nil {
			e.cfg.Registerer.Unregister(e.metrics)
		}
		// The lanes release their leases over these connections: close
		// them only once every code is given back.
		for _, conn := range e.conns {
			if err := conn.Close(); err != nil {
				errs = append(errs, fmt.Errorf("rangeclient: close connection: %w", err))
			}
		}
		e.closeErr = join(errs...)
	})
	return e.closeErr
}
