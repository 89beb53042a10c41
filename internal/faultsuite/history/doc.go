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
//	S <send> <ret> <region> <worker> <lo> <hi> <svc ns> <valid ns>         shared run granted
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
//   - Unique and in range: no ID twice across all histories and all
//     replies (Config.Replies: the IDs a replica handed out over MintBatch,
//     Next or HTTP, minted by a client no history records), every ID
//     positive, of the region's codes, with a timestamp inside the run's
//     window. Every ID that left the system goes through one exact,
//     sort-based duplicate check (internal/testing/measure); a duplicate is
//     reported with every call that handed it out.
//   - Per-client order: within one process, the IDs of one code strictly
//     increase in the order they were handed out.
//   - Safety deadline: an ID whose call returned (t1) at or after the
//     latest safety deadline the process could have known is a violation.
//     The deadline is bounded from the records alone: max over the
//     acquisition and the renewals that had returned by t1 of send + TTL -
//     margin. The client's own deadline is read from its own earlier clock
//     readings, so it can only be earlier than the bound.
//   - Fencing: no ID of a code returns (t1) after another owner's
//     acquisition of that code (a higher token) had returned, so every
//     position the old owner handed out was taken before the new owner
//     could take any: the two never mint one code at the same time, even
//     if the high-water mark failed. etcd gives a code to a new owner only
//     after the old lease is gone, so the old owner was past its deadline
//     by then.
//   - Blocks: every ID lies inside a block its process received under that
//     lease; blocks received by all processes for one code never overlap.
//     An ID returned after its block's validity (send + ValidUntil -
//     ServiceTime) is reported separately (Report.FreshnessErr): the block's
//     positions are the client's alone, so it cannot repeat an ID, but its
//     timestamp lags.
//   - etcd: given the high-water mark values each HWM key held (replayed
//     from etcd's MVCC history), every key only grows and every received
//     block [lo, hi) is one committed step: hi is a value the key took and lo
//     is at or above the value before it. HWM steps no client received are
//     counted as burned grants (allowed: an unknown commit is never used).
//   - Shared runs (S lines, issue 27): a client without a code of its own
//     mints from runs a replica carves out of its own minter's blocks, so
//     the run's code is leased by a process no history records. An ID in
//     a shared run its process had received by t1 is held to that run
//     instead of the lease rules: counted as a shared ID, and handed out
//     before the run's validity (a freshness finding, as for blocks).
//     Runs never overlap each other or any block, of any process (the
//     overlap check above); each lies inside one committed HWM step (the
//     first value at or above its end, with the value before it at or
//     below its start), else it counts as a block not in etcd. A shared
//     ID is above the process's previous ID whatever its code, and so is
//     the ID after it. Every existing rule holds unchanged for IDs not in
//     a shared run.
//   - Time bound (Config.MaxBehind, MaxAhead; opt-in): every ID's
//     millisecond began less than MaxBehind before the wall time at which
//     its call returned (the header's wall and start map the history's
//     clock to it) and at most MaxAhead after. Runs that move a service
//     clock leave it off.
//
// Gaps (positions of received blocks never handed out) are counted, not
// errors: docs/design.md allows them.
//
// # Which instant dates an ID
//
// A minting call takes its positions somewhere between t0 and t1, and
// nothing in a history says where: rangeclient reads its clock, checks it
// against the deadline and the block's validity and takes positions,
// possibly several times in one call (AppendN takes a run per block and
// may wait for a refill or a new lease in between, up to the call's
// timeout, 200 ms in cmd/minter). Two instants matter. An ID is minted when
// the client takes its position: the client's rule (never mint past the
// deadline) is about that instant, and so is the fencing argument (the old
// owner's takes all come before the new owner's). It is handed out when
// the call returns and the ID leaves the client: docs/design.md's
// "handed out", the moment the caller holds it.
//
// Check dates every ID by t1 for every rule about a moment (deadline, new
// owner, block validity). t1 is at or after both instants, so a pass
// proves each rule for both: an ID returned before the deadline was minted
// before it. Dated by t0, the check could only catch certain violations,
// and would pass every call that started before the deadline and returned
// after it, both the one that minted in time and returned late and the
// one that checked its deadline once at the start and then waited for a
// block and minted past it: the bug the check is there for. So a late
// return fails (TestCheckCatchesPlantedFaults, and the fault suite's
// planted controls on real histories).
//
// The price is a report against a correct client that took its last
// position just before its own deadline and then stalled, between the take
// and t1, past the bound. After the take the hand-out path is straight-line
// code (the IDs are appended; no lock, no wait, no network call) and
// cmd/minter reads t1 as soon as the call returns, while the client's own
// deadline lies before the bound: the stall has to hit those few hundred
// nanoseconds of one call, right at the deadline, and last past the bound
// (a SIGSTOP there, or a descheduling longer than what was left). Even then
// the report is true of what the caller saw: it received the ID after the
// client's deadline. Report.ClosestToDeadline says how near each run came.
package history
