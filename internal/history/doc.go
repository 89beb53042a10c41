// Package history is the evidence of the fault suite: what every minting
// process did, written as it happened, and a checker that proves from those
// records (and etcd's own record of the high-water marks) that no ID was
// handed out twice or unsafely.
//
// Modelled on etcd's robustness tests: real processes, injected faults, a
// recorded history, a checker. Each minter process (internal/faultsuite/cmd/
// minter) appends to its own file, one event per line, every time on the
// host's CLOCK_MONOTONIC (Now), so events of different processes and the
// faults the test injected can be ordered:
//
//	H name=<s> pid=<n> region=<n> margin=<ns> start=<t> wall=<unix ns>   header (first line)
//	A <send> <ret> <token> <region> <worker> <lease id> <ttl ns>          lease acquired
//	R <send> <ret> <token> <ttl ns>                                       lease renewed
//	L <send> <ret> <token>                                                lease released
//	B <send> <ret> <token> <region> <worker> <lo> <hi> <svc ns> <valid ns> block granted
//	X <send> <ret> <method> <token> <reason>                              call failed
//	I <t0> <t1> <id> <id> ...                                             IDs handed out
//	E <t0> <t1> <class>                                                   minting failed
//	N <t> <text>                                                          note (fault applied)
//
// The lease and block lines come from a gRPC client interceptor
// (Recorder.UnaryClientInterceptor) under the real client library, so they
// record what the service actually answered; <send> is read before the
// request leaves and <ret> after the reply arrived. I lines carry the time
// before the minting call started (t0) and after it returned (t1).
//
// A history that misses an event proves nothing, so the Recorder never
// drops one silently: the first write error sticks and Recorder.Err,
// Flush and Close report it, and cmd/minter stops minting and exits 1
// naming it (the fault suite fails a scenario on any minter that did not
// exit 0 when asked to stop). A file cut short mid-line does not parse.
//
// # What the checker proves (Check)
//
//   - Unique and in range: no ID twice across all histories, every ID
//     positive, of the region's codes, with a timestamp inside the run's
//     window (internal/idcheck does this part).
//   - Per-client order: within one process, the IDs of one code strictly
//     increase in the order they were handed out.
//   - Safety deadline: an ID handed out under a lease whose call started
//     (t0) at or after the latest safety deadline the process could have
//     known is a violation. The deadline is bounded from the records alone:
//     max over the acquisition and the renewals that had returned by t1 of
//     send + TTL - margin. The client's own deadline is read from its own
//     earlier clock readings, so it can only be earlier: a violation is
//     certain, never an artefact of the bound.
//   - Fencing: no ID of a code is handed out (t0) after another owner's
//     acquisition of that code (a higher token) had returned. etcd gives a
//     code to a new owner only after the old lease is gone, so the old owner
//     was past its deadline by then.
//   - Blocks: every ID lies inside a block its process received under that
//     lease; blocks received by all processes for one code never overlap.
//     An ID handed out after its block's validity (send + ValidUntil -
//     ServiceTime) is reported separately (Report.FreshnessErr): the block's
//     positions are the client's alone, so it cannot repeat an ID, but its
//     timestamp lags.
//   - etcd: given the high-water mark values each HWM key held (replayed
//     from etcd's MVCC history), every key only grows and every received
//     block [lo, hi) is one committed step: hi is a value the key took and lo
//     is at or above the value before it. HWM steps no client received are
//     counted as burned grants (allowed: an unknown commit is never used).
//
// Gaps (positions of received blocks never handed out) are counted, not
// errors: docs/design.md allows them.
package history
