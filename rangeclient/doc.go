// Package rangeclient is idrange's Go client: it mints 64-bit IDs from
// blocks of (timestamp, sequence) space that the regional range service
// grants to a fenced worker code, so the hot path never crosses the
// network.
//
// Two lines are all a program needs:
//
//	c, err := rangeclient.New(ctx, rangeclient.Config{Targets: []string{"rangesvc:7070"}})
//	id, err := c.Next(ctx)
//
// # How it works
//
// A client holds a worker code of its own only when its rate needs one
// (Config.Codes 0, the default; see "The shared path" below): until then
// it mints from runs the service carves out of codes the replicas hold.
// What follows describes a client with a code.
//
// The client leases a worker code (region, worker) from the service and
// renews the lease in the background. For its code the service grants
// blocks [Lo, Hi) of the linear space L = ms<<12 | seq, committing the
// code's high-water mark Hi to etcd before replying, so blocks of one code
// never overlap whoever holds the code and whatever any clock says.
//
// Inside a block the cursor follows the service's time:
//
//	cursor = max(cursor+1, t<<12),  t = block's service time + local monotonic time since the reply
//
// so IDs carry fresh timestamps at low rates and are dense at high rates; a
// block is finished when the cursor reaches Hi or t passes the millisecond
// of Hi-1 (the rest of it is a gap). Next is one monotonic clock reading and
// one atomic add on the current block (a compare-and-swap for the first call
// after the clock leaves the cursor's millisecond, which jumps the cursor):
// no lock, no allocation, no network call. Only the refill path locks or
// calls the service.
//
// The client holds two blocks: the current one and the next, which the
// background refill loop requests before the current one runs out. At
// steady state Next therefore never waits ("stalls" counts the calls that
// did). When both are used up, Next waits for the refill until its context
// ends and then returns ErrUnavailable (retryable); it never mints outside
// a granted block.
//
// # Block sizing
//
// Because the cursor follows time, a block of n units lives about n/4096 ms
// whatever the rate (below 4,096 IDs/ms): block size is a time span, not a
// count of IDs. The policy, per request:
//
//	n = clamp(max(RefillInterval_ms*4096, rate*RefillInterval), 4096, 40,960,000)
//
// (benchmarks can pin n, or move the bounds, through the module's internal
// tuning hook; users choose RefillInterval).
//
// With the default RefillInterval of 1 s that is 4,096,000 units: one refill
// per second per client whatever its rate, so a slow client does not hold a
// long stretch of timestamp space (its IDs stay within ~1 s of the service's
// time and a restart wastes at most ~2 s of its code's space), and a burst of
// 3,000 IDs/ms fits without waiting, since 3,000 < 4,096 per millisecond.
// The rate (an EWMA of IDs/s over RefillInterval) matters when the client
// mints faster than 4,096 IDs/ms: the cursor then runs ahead of time and a
// span-sized block would last less than RefillInterval, so the block grows
// to rate*RefillInterval and still lasts about RefillInterval.
//
// The next block is requested when the current one's time left (until its
// validity ends, or until its units run out at the observed rate, whichever
// is sooner) drops below
//
//	max(0.5 * expected life of the block, 4 * observed refill latency)
//
// so a slow service or a fast client starts the prefetch earlier. The hot
// path helps with an ID-count form of the same threshold: when its cursor
// crosses it, it wakes the refill loop once per block.
//
// An idle client does not prefetch forever: when no ID was minted for
// IdleTimeout (default 30 s) it stops refreshing blocks (the lease is still
// renewed, so it keeps its code), and the next Next waits for one refill, a
// counted stall.
//
// # Reserve
//
// Etcd leader elections are routine and each stops grants and renewals for
// a second or two; a longer quorum loss stops them until it ends. The
// client rides through any such outage shorter than its safe interval: it
// keeps granted span (its reserve) reaching past its own safety deadline,
//
//	reserve target = safety deadline + renewal period + 4 * refill latency
//
// (capped by MaxReserve), so the deadline, not the buffer, decides when it
// stops. The renewal period is there because a renewal moves the deadline
// by up to that much at once. Blocks that extend the reserve start at the
// code's high-water mark, right after the buffered span, and are merged
// into the buffered next block. Each request extends the reserve by what
// it lacks plus one RefillInterval, so at steady state a client asks for a
// block about once per renewal period (3 s with the defaults) instead of
// once per RefillInterval: fewer etcd writes than without the reserve. The
// refill loop's timed wake-ups land on a 50 ms grid of the wall clock, so
// the requests of many clients meet at the service, which commits them in
// one etcd transaction.
//
// The cost is the lead of the code's high-water mark over the clock: about
// TTL - SafetyMargin + renewal period + RefillInterval (13 s with the
// service's 10 s TTL and the client defaults), inside the service's
// MaxLead (15 s). A client that crashes leaves its code's HWM that far
// ahead, so the next owner of the code mints timestamps up to that far in
// the future for that long (uniqueness is not affected). Set MaxReserve to
// keep the lead shorter (riding through shorter outages only), or negative
// to turn the reserve off. A service with a shorter MaxLead answers the
// reserve with backpressure once; the client then keeps its reserve a
// RefillInterval inside what the service allowed.
//
// # More than 4,096 IDs per millisecond
//
// One code holds 4,096 IDs per millisecond. A client that wants more runs
// ahead of time (its IDs carry future timestamps) until the service's
// bounded lead (default 15 s) refuses further grants with backpressure
// (*segment.Backpressure with RetryAfter) or shrinks them. The client then
// waits, retrying after RetryAfter; Next and NextN wait within their context
// and return ErrUnavailable if it ends first. Sustained demand above the
// capacity of one code needs more codes, not a bigger block: Config.Codes
// lets one Client hold several and spread its calls over them (10M IDs/s
// offered to a 4-code client: IDs within 5 ms of the clock; to a 1-code
// client: 8.6 s ahead; BenchmarkAppendNCodes).
//
// # Failing closed
//
// The client keeps a local safety deadline on the monotonic clock: the time
// the last successful renewal (or the acquisition) was sent plus the granted
// TTL minus SafetyMargin. Counting from the send, not from the reply, means
// a reply delayed by a pause or a slow network can never stretch the
// deadline past the moment the service itself may let the lease expire.
// Past the deadline minting stops at once, without any network call, and a
// renewal reply that arrives later does not revive the lease. A reply from
// the service saying the lease is fenced or gone (segment.ErrFenced,
// segment.ErrLeaseLost) stops minting at once too, even with full buffers.
// In both cases the client drops its blocks, acquires a fresh lease
// (possibly another code) in the background and resumes by itself; no
// restart is needed, and the new lease's blocks start above the code's
// high-water mark, so nothing is reissued. Meanwhile Next waits within its
// context; if the context ends first it returns ErrUnavailable wrapping
// ErrLeaseLost or ErrFenced.
//
// Uniqueness does not depend on the deadline alone: blocks of one code are
// disjoint by the high-water mark even if a stale owner kept minting from
// blocks it holds (a VM paused with its monotonic clock stopped cannot see
// that time passed). The deadline is the second line, and the one docs/design.md
// requires: stop without a network call once the lease may be gone.
//
// The client also checks that invariant itself, on what it receives: per
// code it has held (across leases, for its life) it remembers the end of
// the last block it was granted, and refuses a block that starts below it
// (ErrOverlap: a tampered or restored etcd, a bug). Nothing is minted from
// such a block; the client gives the code up at once, without releasing
// the lease (the code stays leased until its TTL ends, so it is not handed
// straight back), and takes another code in the background. It does the
// same when the service refuses the code because its high-water mark went
// back (segment.ErrHighWaterRegressed), rather than retry a code that
// cannot be granted.
//
// The client reads only Go's monotonic clock (time.Since), and only for
// elapsed times, never for the timestamps themselves: a wall-clock step on
// the client reaches neither the IDs nor the safety deadline.
//
// # The shared path
//
// A region has 256 worker codes. So that any number of client processes
// can mint in one region, a client with Config.Codes 0 over a service that
// serves the shared path (a current rangesvc; segment.SharedAllocator)
// holds no code: it asks a replica for a shared run (AllocateShared), a
// dense stretch of the code the replica's own minter holds, carved from a
// block whose high-water mark is committed, so the grant writes nothing
// to etcd and every position goes to one holder. The client mints a run
// densely from its first position (no jump to the clock: at low rates its
// IDs lag the clock, by less than 1 s) and drops it at its validity, about
// 0.9 s after the run's first millisecond, so no ID is 1 s old when Next
// returns it. It asks for about 0.5 s of IDs at its measured rate (64 to
// segment.MaxShared) and prefetches the next run as it does blocks; each
// request carries the last ID of the previous run, and the next run starts
// above it, so the client's IDs increase across runs and replicas.
//
// When the client's rate stays above DedicatedRate (32,768 IDs/s) for 2 s
// it acquires a code and its first block, starts that block above the last
// shared ID, and leaves the shared path without a stall; from then on it is
// a client with a code. While no code is free or the identity is at its
// cap, it stays on the shared path and tries again with backoff (1 s to
// 30 s): New never waits for a code. A service without the shared path
// (rangesvc serve --shared-rate 0, an older rangesvc) or an Allocator that
// does not implement segment.SharedAllocator gets a client with one code
// from New on, as Codes 1 does. Explicit Codes >= 1 never uses the shared
// path; use it for more than 4,096 IDs/ms (several codes).
//
// The service bounds the shared path per caller identity (backpressure,
// as for blocks). Stats.Shared and LeaseInfo.Shared tell the mode; a
// shared-path client has no lease to renew and reports none. Uniqueness
// and what stops a paused holder: docs/design.md, "The shared path".
//
// # Replicas
//
// With several Targets the client talks to one replica at a time (picked at
// random, which spreads a fleet over the replicas) and moves to the next
// one when a call finds it unavailable or slow, retrying the call there
// with the time left. The lease loop and the refill loop share that choice,
// so a replica that still answers renewals but cannot grant blocks (or the
// reverse) is left for both. Retrying a grant elsewhere is safe: a block
// whose commit is unknown is simply never used.
//
// # Errors
//
// ErrLeaseLost, ErrFenced, ErrUnavailable and ErrOverlap are retryable
// (IsRetryable): the client recovers in the background. ErrClosed, ErrEpochExhausted and
// ErrInvalidConfig are final, and so is segment.ErrPermissionDenied from New
// (under mutual TLS, the service refuses this client's identity: see
// Config.TLS); on a renewal or a grant it means the lease is gone, as ErrFenced.
// Match them with the standard library's errors.Is. Errors from the service keep their segment sentinels in the
// chain, also across gRPC (errors.Is(err, segment.ErrFenced) works, and
// errors.As finds a *segment.Backpressure). Error messages are one line.
//
// # Metrics
//
// With Config.Registerer set the client exports, in namespace idrange and
// subsystem client: ids_minted_total, refills_total, refill_errors_total,
// refill_latency_seconds, buffer_depth_ids, buffer_seconds, stalls_total,
// backpressure_total, lease_acquisitions_total, lease_renewals_total,
// lease_renewal_failures_total, safety_deadline_expiries_total,
// fenced_total, overlapping_blocks_total, codes_dropped_total,
// lease_safe_seconds, serving,
// rate_ids_per_second, lease_info (the lease series only while the client
// holds a code) and shared (1 on the shared path). They are read from atomic counters
// at scrape time; the number of IDs minted is derived from the blocks'
// cursors, so counting costs the hot path nothing.
package rangeclient
