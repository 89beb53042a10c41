package rangeclient

import (
	"context"
	"time"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// DedicatedRate is the rate, in IDs/s, above which a client on the shared
// path (Config.Codes 0) takes a worker code of its own, once it has stayed
// above it for 2 s. See the package doc, "The shared path".
const DedicatedRate = engine.DedicatedRate

// Client mints IDs from blocks granted by the range service. It is safe for
// concurrent use. Build it with New; Close it to give its lease back.
type Client struct {
	// e is held by value: Next reaches the engine's hot fields without
	// following a pointer.
	e engine.Engine
}

// New validates cfg, learns the service's region (with Targets; see
// Config.Region), acquires a worker-code lease and waits for the first
// block (or, on the shared path, the first run), so the first Next does
// not wait on the network. Retryable failures (service unreachable, no
// free code) are retried with backoff until ctx is done: pass a ctx with a
// deadline. Bad configuration, a region the service does not serve
// (ErrInvalidConfig when Config.Region disagrees with the service's
// answer) and similar final errors return at once.
func New(ctx context.Context, cfg Config) (*Client, error) {
	c := new(Client)
	if err := c.e.Start(ctx, cfg.engine()); err != nil {
		return nil, err
	}
	return c, nil
}

// Next returns a new ID. At steady state it is one clock reading and one
// atomic add on the current block (a compare-and-swap, once per
// millisecond at most, when the clock has left the cursor's millisecond
// and the cursor jumps to it), with no lock, no allocation and no network
// call.
//
// It never mints under a lease past its safety deadline or fenced by the
// service; it then waits, within ctx, for the client to acquire a new
// lease by itself, as it waits for a refill when both buffered blocks are
// used up. If ctx ends first it returns ErrUnavailable (retryable), which
// wraps the cause: ErrLeaseLost, ErrFenced or the last refill error, and
// ctx's error. A ctx without deadline waits until recovery or Close. After
// Close it fails at once with ErrClosed. Above 4,096 IDs/ms the client runs
// ahead of time until the service's bounded lead applies backpressure; Next
// then waits (within ctx) for the service to grant again.
func (c *Client) Next(ctx context.Context) (snowflake.ID, error) { return c.e.Next(ctx) }

// NextN returns n new IDs (n >= 0). Runs of consecutive IDs are reserved
// with one compare-and-swap each. On error the IDs returned so far are
// valid and unique.
func (c *Client) NextN(ctx context.Context, n int) ([]snowflake.ID, error) { return c.e.NextN(ctx, n) }

// AppendN appends n new IDs to dst and returns it, like NextN; it does not
// allocate when dst has room.
func (c *Client) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	return c.e.AppendN(ctx, dst, n)
}

// Close stops minting at once, stops the background loops (cancelling
// their calls), gives the lease back (best effort, within a second: it
// expires by its TTL anyway) and unregisters the metrics. It returns
// within about a second whatever the network does. Later calls return
// ErrClosed; Close is idempotent and returns the first call's result.
func (c *Client) Close() error { return c.e.Close() }

// Stats returns a snapshot of the client's counters, summed over its codes
// (BufferedFor is the shortest of them, RefillLatency the longest).
func (c *Client) Stats() Stats { return Stats(c.e.Stats()) }

// Lease returns the current lease of the client's first code and how long
// it is still safe.
func (c *Client) Lease() LeaseInfo { return LeaseInfo(c.e.Lease()) }

// Leases returns the current lease of each of the client's codes (see
// Config.Codes), the first one first.
func (c *Client) Leases() []LeaseInfo {
	ls := c.e.Leases()
	out := make([]LeaseInfo, len(ls))
	for i, l := range ls {
		out[i] = LeaseInfo(l)
	}
	return out
}

// Health is nil while the client can mint without waiting, else the reason
// it cannot: ErrClosed, the lease's error (ErrLeaseLost, ErrFenced), or
// ErrUnavailable (with the last refill error, if any) when no block is
// buffered. An idle client that let its buffers run out on purpose is
// healthy. With several codes, every one must be healthy (a call may land
// on any). Serve it on a readiness endpoint.
func (c *Client) Health() error { return c.e.Health() }

// Stats are the client's counters and gauges, for tests and operators. The
// same values are exported as Prometheus metrics when Config.Registerer is
// set.
type Stats struct {
	Minted          int64  // IDs handed out
	Refills         uint64 // blocks granted
	RefillErrors    uint64 // failed grant requests (not counting backpressure)
	Backpressure    uint64 // grants refused with segment.ErrBackpressure
	Discarded       uint64 // granted blocks dropped unused (lease changed, expired on arrival)
	Stalls          uint64 // Next/NextN calls that had to wait for a block
	Acquisitions    uint64 // leases acquired
	Renewals        uint64 // successful renewals
	RenewalFailures uint64 // failed renewals (including fenced replies)
	Expiries        uint64 // safety deadlines passed without a renewal
	Fenced          uint64 // leases fenced by the service
	Overlaps        uint64 // granted blocks refused: they overlap one the client had (ErrOverlap)
	DroppedCodes    uint64 // leases given up: overlap, or the service's segment.ErrHighWaterRegressed
	// Shared is true while the client mints from shared runs (Config.Codes
	// 0) instead of a worker code of its own.
	Shared bool

	BufferedIDs   int64         // positions left in the current and next block
	BufferedFor   time.Duration // how long they last at the observed rate
	Rate          float64       // IDs/s, EWMA over RefillInterval
	RefillLatency time.Duration // EWMA of grant round trips
	NextBlock     int           // size the next request asks for
}

// LeaseInfo describes the client's current worker-code lease.
type LeaseInfo struct {
	Lease segment.Lease // the code, token and etcd lease; zero before the first
	// Shared is true while the client mints from shared runs and holds no
	// code: Lease is then zero but for its Region, and SafeFor is 0.
	Shared bool
	// SafeFor is the time left before the local safety deadline (0 once
	// past it or when the lease is dead).
	SafeFor time.Duration
	// Err is nil while the lease may be used, else why not (ErrLeaseLost,
	// ErrFenced, ErrClosed).
	Err error
}
