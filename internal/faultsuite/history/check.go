package history

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Violations Report.Err wraps, one sentinel per property (see the package
// doc), so a test can tell which one a planted fault broke.
var (
	ErrDuplicate     = errors.New("history: an ID was handed out twice")
	ErrOutOfRange    = errors.New("history: an ID is out of range")
	ErrOrder         = errors.New("history: a client handed out the IDs of one code out of order")
	ErrAfterDeadline = errors.New("history: an ID was handed out after the client's safety deadline")
	ErrAfterNewOwner = errors.New("history: an ID was handed out after its code passed to a new owner")
	ErrOutsideBlock  = errors.New("history: an ID lies outside the blocks its client received")
	ErrBlockOverlap  = errors.New("history: two received blocks of one code overlap")
	ErrHWM           = errors.New("history: a received block is not a committed high-water-mark step")
	// ErrTimeBound: an ID's timestamp lies outside Config.MaxBehind /
	// Config.MaxAhead of the wall time at which its call returned.
	ErrTimeBound = errors.New("history: an ID's timestamp is outside the time bound of when it was handed out")
	// ErrStaleBlock is a freshness finding, not a safety one (FreshnessErr):
	// an ID was handed out from a block after the block's validity. The
	// block's positions are the client's alone (the HWM is past them), so
	// nothing can repeat, but the ID's timestamp lags the service's time.
	ErrStaleBlock = errors.New("history: an ID was handed out from a block after the block's validity")
	// ErrNothingChecked: no ID at all; an empty run proves nothing.
	ErrNothingChecked = errors.New("history: no ids to check")
)

// DefaultMaxExamples is how many example problems a Report keeps per kind.
const DefaultMaxExamples = 5

// Config says what the histories are checked against.
type Config struct {
	// Region is the region every process minted in; IDs of other regions
	// are out of range.
	Region int
	// NotBefore and NotAfter bound the IDs' timestamps (zero: unbounded).
	// Give NotAfter the service's maximum lead plus any forward clock jump
	// the run injected.
	NotBefore, NotAfter time.Time
	// Replies are the IDs that left the system outside every history (see
	// Reply). They join the one duplicate check with every history's IDs,
	// and the range check.
	Replies []Reply
	// HWM, when non-nil, is etcd's record of the region's high-water marks:
	// for each worker code, every value its HWM key held, in revision order
	// (see the faultsuite's replay). nil skips the etcd checks.
	HWM map[int][]int64
	// MaxBehind and MaxAhead, when positive, bound every ID's timestamp
	// against the wall time at which its call returned (a history's
	// header maps its clock to the wall clock; replies use the first
	// history's): the start of the ID's millisecond is less than
	// MaxBehind before that moment and at most MaxAhead after it. The
	// rule users rely on (1 s behind, the service's lead ahead); leave
	// them 0 in runs that move a service clock.
	MaxBehind, MaxAhead time.Duration
	// MaxExamples bounds the examples kept per kind of problem. Default
	// DefaultMaxExamples.
	MaxExamples int
}

// Reply is one call that returned IDs to a caller outside every history: a
// replica's MintBatch or Next RPC, or its HTTP GET /v1/ids. The replica
// mints them with its own client, whose leases and blocks no history
// records, so Check holds them to what needs no history: no ID twice among
// them and every history's IDs, and every ID in range. What else a
// scenario knows of them (e.g. none returned after the replica's deadline)
// is the scenario's to check.
type Reply struct {
	// Source names who answered and how, for reports ("svc0 MintBatch").
	Source string
	// Send and Ret are on Now's clock: before the request left and after
	// the reply arrived.
	Send, Ret int64
	IDs       []int64
}

// Report is the outcome of Check: counts of what was checked, of each
// violation (all must be 0), and of allowed losses.
type Report struct {
	Processes int `json:"processes"`
	// IDs are the IDs in the histories, held to every property; ReplyIDs
	// those of the Replies, held to uniqueness and range (with every
	// history's IDs in one duplicate check).
	IDs      int64 `json:"ids"`
	Replies  int   `json:"replies"`
	ReplyIDs int64 `json:"reply_ids"`
	Leases   int   `json:"leases"`
	Renewals int   `json:"renewals"`
	Blocks   int   `json:"blocks"`
	// SharedRuns are the shared runs received (S lines); SharedIDs the
	// histories' IDs handed out from them.
	SharedRuns int   `json:"shared_runs"`
	SharedIDs  int64 `json:"shared_ids"`

	Duplicates      int64 `json:"duplicates"`
	OutOfRange      int64 `json:"out_of_range"`
	OrderViolations int64 `json:"order_violations"`
	AfterDeadline   int64 `json:"after_deadline"`
	// MaxDeadlineOverrun is how far past the latest possible deadline the
	// worst such ID's call returned.
	MaxDeadlineOverrun time.Duration `json:"max_deadline_overrun"`
	// ClosestToDeadline is how near the run came to a deadline violation:
	// the least time by which any ID's call returned before the latest
	// possible deadline of its lease (0 when no ID was under a lease).
	ClosestToDeadline time.Duration `json:"closest_to_deadline"`
	AfterNewOwner     int64         `json:"after_new_owner"`
	OutsideBlock      int64         `json:"outside_block"`
	// AfterBlockValid counts IDs handed out from a block after its
	// validity, and MaxBlockOverrun is by how much at most: a freshness
	// finding (FreshnessErr), not a safety violation.
	AfterBlockValid int64         `json:"after_block_valid"`
	MaxBlockOverrun time.Duration `json:"max_block_overrun"`
	BlockOverlaps   int64         `json:"block_overlaps"`
	// OutsideTimeBound counts IDs outside Config.MaxBehind / MaxAhead;
	// MaxBehindSeen and MaxAheadSeen are the most any ID checked was
	// behind and ahead of its return (0 when none was; set only when a
	// bound is).
	OutsideTimeBound int64         `json:"outside_time_bound"`
	MaxBehindSeen    time.Duration `json:"max_behind_seen"`
	MaxAheadSeen     time.Duration `json:"max_ahead_seen"`

	HWMChecked      bool  `json:"hwm_checked"`
	HWMSteps        int   `json:"hwm_steps"`
	HWMDecreases    int64 `json:"hwm_decreases"`
	BlocksNotInEtcd int64 `json:"blocks_not_in_etcd"`
	// BurnedGrants are HWM steps committed in etcd that no client received
	// (a grant whose reply was lost or came too late): allowed gaps.
	BurnedGrants int64 `json:"burned_grants"`
	// BurnedLeasedGrants are the burned grants on codes some history
	// leased: grants a recorded client asked for and did not receive (the
	// rest are a replica's own client's, which no history records).
	BurnedLeasedGrants int64 `json:"burned_leased_grants"`
	// BurnedPosition counts the positions of the burned grants whose lower
	// end is known: a key's first step is left out, because its grant
	// started at the service's time, not at 0, and nothing records where
	// (a replica's own client's first grant, for MintBatch, is one).
	BurnedPosition int64 `json:"burned_positions"`
	// GapPositions are positions of received blocks never handed out
	// (the time-following cursor skips most of a block at low rates, and
	// blocks buffered when a lease died are dropped): allowed.
	GapPositions int64 `json:"gap_positions"`
	// UnusedBlocks are received blocks of which no ID was handed out.
	UnusedBlocks int64 `json:"unused_blocks"`

	// Examples are the first problems found, per kind.
	Examples map[string][]string `json:"examples,omitempty"`

	idErr error
}

// Err is nil when every property held; otherwise it joins one error per
// violated property, each wrapping that property's sentinel.
func (r Report) Err() error {
	var errs []error
	add := func(n int64, sentinel error, kind, what string) {
		if n > 0 {
			errs = append(errs, errors.Wrapf(sentinel, "%d %s; e.g. %s", n, what, strings.Join(r.Examples[kind], "; ")))
		}
	}
	if r.Duplicates > 0 {
		errs = append(errs, errors.Wrapf(ErrDuplicate, "%d duplicate(s): %v; where: %s", r.Duplicates, r.idErr,
			strings.Join(r.Examples["duplicate"], "; ")))
	}
	if r.OutOfRange > 0 {
		errs = append(errs, errors.Wrapf(ErrOutOfRange, "%d id(s) out of range: %v", r.OutOfRange, r.idErr))
	}
	add(r.OrderViolations, ErrOrder, "order", "id(s) not above the previous id of their code in the same process")
	add(r.AfterDeadline, ErrAfterDeadline, "deadline", fmt.Sprintf("id(s) whose call returned up to %v after the safety deadline", r.MaxDeadlineOverrun))
	add(r.AfterNewOwner, ErrAfterNewOwner, "owner", "id(s) whose call returned after a new owner acquired the code")
	add(r.OutsideBlock, ErrOutsideBlock, "block", "id(s) outside every block received under the lease")
	add(r.BlockOverlaps, ErrBlockOverlap, "overlap", "overlap(s) between received blocks")
	add(r.HWMDecreases, ErrHWM, "hwm", "decrease(s) of a high-water mark in etcd")
	add(r.BlocksNotInEtcd, ErrHWM, "etcd", "received block(s) or shared run(s) that are not (within) a committed high-water-mark step")
	add(r.OutsideTimeBound, ErrTimeBound, "time", fmt.Sprintf("id(s) outside the time bound of their return (extremes seen: %v behind, %v ahead)",
		r.MaxBehindSeen, r.MaxAheadSeen))
	if len(errs) == 0 && r.IDs+r.ReplyIDs == 0 {
		return ErrNothingChecked
	}
	return errors.Join(errs...)
}

// FreshnessErr is nil unless some ID was handed out from a block after the
// block's validity (ErrStaleBlock). That cannot duplicate anything; it shows
// a client trusting its own clock over the block's deadline.
func (r Report) FreshnessErr() error {
	if r.AfterBlockValid == 0 {
		return nil
	}
	return errors.Wrapf(ErrStaleBlock, "%d id(s) handed out up to %v after their block's validity; e.g. %s",
		r.AfterBlockValid, r.MaxBlockOverrun, strings.Join(r.Examples["valid"], "; "))
}

// Summary is a one-line account of the report for logs.
func (r Report) Summary() string {
	return fmt.Sprintf("processes=%d ids=%d replies=%d reply_ids=%d leases=%d renewals=%d blocks=%d shared_runs=%d shared_ids=%d "+
		"duplicates=%d out_of_range=%d order=%d "+
		"after_deadline=%d (closest return before a deadline %v) after_new_owner=%d outside_block=%d after_block_valid=%d (max %v) overlaps=%d "+
		"outside_time_bound=%d (max behind %v, max ahead %v) "+
		"hwm_checked=%t hwm_steps=%d hwm_decreases=%d blocks_not_in_etcd=%d burned_grants=%d (on leased codes %d) unused_blocks=%d gap_positions=%d",
		r.Processes, r.IDs, r.Replies, r.ReplyIDs, r.Leases, r.Renewals, r.Blocks, r.SharedRuns, r.SharedIDs,
		r.Duplicates, r.OutOfRange, r.OrderViolations,
		r.AfterDeadline, r.ClosestToDeadline, r.AfterNewOwner, r.OutsideBlock, r.AfterBlockValid, r.MaxBlockOverrun, r.BlockOverlaps,
		r.OutsideTimeBound, r.MaxBehindSeen, r.MaxAheadSeen,
		r.HWMChecked, r.HWMSteps, r.HWMDecreases, r.BlocksNotInEtcd, r.BurnedGrants, r.BurnedLeasedGrants, r.UnusedBlocks, r.GapPositions)
}

type codeKey struct{ region, worker int }

func (c codeKey) String() string { return fmt.Sprintf("r%d/w%d", c.region, c.worker) }

// boundPt: from ret on, the safety deadline is at most bound.
type boundPt struct{ ret, bound int64 }

type leaseInfo struct {
	Lease
	proc   *History
	bounds []boundPt    // by ret, bound non-decreasing
	blocks []*blockInfo // by Lo
	next   *leaseInfo   // the code's next owner (higher token), any process
}

// boundAt is the latest safety deadline the process could have known at t.
func (li *leaseInfo) boundAt(t int64) int64 {
	i := sort.Search(len(li.bounds), func(i int) bool { return li.bounds[i].ret > t })
	if i == 0 {
		return math.MinInt64
	}
	return li.bounds[i-1].bound
}

// blockAt returns the block containing linear position l that had arrived
// by t.
func (li *leaseInfo) blockAt(l, t int64) *blockInfo {
	i := sort.Search(len(li.blocks), func(i int) bool { return li.blocks[i].Hi > l })
	if i < len(li.blocks) && li.blocks[i].Lo <= l && li.blocks[i].Ret <= t {
		return li.blocks[i]
	}
	return nil
}

type blockInfo struct {
	Block
	proc   *History
	minted int64
}

// sharedInfo is a shared run received by proc.
type sharedInfo struct {
	SharedRun
	proc   *History
	minted int64
}

// sharedAt returns the run of rs (one process's runs of one code, by Lo)
// containing linear position l that had arrived by t.
func sharedAt(rs []*sharedInfo, l, t int64) *sharedInfo {
	i := sort.Search(len(rs), func(i int) bool { return rs[i].Hi > l })
	for ; i < len(rs) && rs[i].Lo <= l; i++ {
		if rs[i].Ret <= t {
			return rs[i]
		}
	}
	return nil
}

// Check verifies the histories (see the package doc for the properties).
// The error is for bad input (config, histories); violations are in the
// Report (Report.Err).
func Check(hs []*History, cfg Config) (Report, error) {
	if cfg.Region < 0 || cfg.Region > snowflake.MaxRegion {
		return Report{}, errors.Newf("history: Config.Region %d not in 0..%d", cfg.Region, snowflake.MaxRegion)
	}
	if cfg.MaxExamples <= 0 {
		cfg.MaxExamples = DefaultMaxExamples
	}
	c := &checker{
		cfg:       cfg,
		rep:       Report{Processes: len(hs), Replies: len(cfg.Replies), Examples: map[string][]string{}},
		perProc:   make([]map[codeKey][]*leaseInfo, len(hs)),
		perShared: make([]map[codeKey][]*sharedInfo, len(hs)),
		owners:    map[codeKey][]*leaseInfo{},
		allBlocks: map[codeKey][]*blockInfo{},
		closest:   math.MaxInt64,
	}
	for pi, h := range hs {
		if err := c.index(pi, h); err != nil {
			return Report{}, err
		}
	}
	c.linkOwners()
	if err := c.checkIDs(hs); err != nil {
		return Report{}, err
	}
	if c.closest != math.MaxInt64 {
		c.rep.ClosestToDeadline = time.Duration(c.closest)
	}
	c.checkBlocks()
	if cfg.HWM != nil {
		c.rep.HWMChecked = true
		c.checkHWM()
	}
	return c.rep, nil
}

// checker is the state of one Check: the histories indexed by process,
// code and lease, and the report being filled in.
type checker struct {
	cfg Config
	rep Report

	perProc   []map[codeKey][]*leaseInfo  // per process: its leases of each code, by Ret
	perShared []map[codeKey][]*sharedInfo // per process: its shared runs of each code, by Lo
	shared    []*sharedInfo               // every shared run, in history order
	owners    map[codeKey][]*leaseInfo    // per code: every process's leases
	allBlocks map[codeKey][]*blockInfo    // per code: every process's blocks
	blocks    []*blockInfo                // every block, in history order
	total     int64                       // IDs in all histories
	closest   int64                       // least deadline bound - T1 so far
}

// example keeps the first Config.MaxExamples problems of each kind.
func (c *checker) example(kind, format string, args ...any) {
	if len(c.rep.Examples[kind]) < c.cfg.MaxExamples {
		c.rep.Examples[kind] = append(c.rep.Examples[kind], fmt.Sprintf(format, args...))
	}
}

// index files process pi's leases (with the safety-deadline bounds its
// acquisition and renewals give) and blocks.
func (c *checker) index(pi int, h *History) error {
	if h.Region != c.cfg.Region {
		return errors.Newf("history: %s minted in region %d, the check is for region %d", h.Path, h.Region, c.cfg.Region)
	}
	c.total += h.IDs()
	byToken := map[int64]*leaseInfo{}
	c.perProc[pi] = map[codeKey][]*leaseInfo{}
	for _, l := range h.Leases {
		li := &leaseInfo{Lease: l, proc: h}
		li.bounds = []boundPt{{ret: l.Ret, bound: l.Send + int64(l.TTL) - int64(h.Margin)}}
		byToken[l.Token] = li
		k := codeKey{l.Region, l.Worker}
		c.perProc[pi][k] = append(c.perProc[pi][k], li)
		c.owners[k] = append(c.owners[k], li)
	}
	c.rep.Leases += len(h.Leases)
	c.rep.Renewals += len(h.Renewals)
	addRenewals(h, byToken)
	for _, b := range h.Blocks {
		bi := &blockInfo{Block: b, proc: h}
		c.rep.Blocks++
		k := codeKey{b.Region, b.Worker}
		c.allBlocks[k] = append(c.allBlocks[k], bi)
		c.blocks = append(c.blocks, bi)
		if li := byToken[b.Token]; li != nil && li.Region == b.Region && li.Worker == b.Worker {
			li.blocks = append(li.blocks, bi)
		}
	}
	c.perShared[pi] = map[codeKey][]*sharedInfo{}
	for _, r := range h.Shared {
		si := &sharedInfo{SharedRun: r, proc: h}
		c.rep.SharedRuns++
		k := codeKey{r.Region, r.Worker}
		c.perShared[pi][k] = append(c.perShared[pi][k], si)
		c.shared = append(c.shared, si)
	}
	for _, rs := range c.perShared[pi] {
		sort.Slice(rs, func(i, j int) bool { return rs[i].Lo < rs[j].Lo })
	}
	for _, ls := range c.perProc[pi] {
		sort.Slice(ls, func(i, j int) bool { return ls[i].Ret < ls[j].Ret })
		for _, li := range ls {
			sort.Slice(li.blocks, func(i, j int) bool { return li.blocks[i].Lo < li.blocks[j].Lo })
		}
	}
	return nil
}

// addRenewals extends the safety-deadline bounds of h's leases with its
// renewals, in the order their replies returned.
func addRenewals(h *History, byToken map[int64]*leaseInfo) {
	rens := append([]Renewal(nil), h.Renewals...)
	sort.Slice(rens, func(i, j int) bool { return rens[i].Ret < rens[j].Ret })
	for _, r := range rens {
		li := byToken[r.Token]
		if li == nil || r.Ret < li.Ret {
			continue // a renewal of no lease of ours extends nothing
		}
		last := li.bounds[len(li.bounds)-1].bound
		li.bounds = append(li.bounds, boundPt{ret: r.Ret, bound: max(last, r.Send+int64(r.TTL)-int64(h.Margin))})
	}
}

// linkOwners points every lease at the code's next owner (next higher
// token, any process).
func (c *checker) linkOwners() {
	for _, ls := range c.owners {
		sort.Slice(ls, func(i, j int) bool { return ls[i].Token < ls[j].Token })
		for i := 0; i+1 < len(ls); i++ {
			ls[i].next = ls[i+1]
		}
	}
}

// checkIDs checks every ID that left the system: unique and in range, the
// histories' and the replies' in one idcheck; and each history's IDs in
// order per process and code, and handed out under a lease and block that
// allowed it.
func (c *checker) checkIDs(hs []*History) error {
	replyIDs := 0
	for _, r := range c.cfg.Replies {
		replyIDs += len(r.IDs)
	}
	ic, err := measure.NewChecker(measure.CheckConfig{
		Expect:      measure.Codes([]int{c.cfg.Region}, snowflake.MaxWorker+1),
		NotBefore:   c.cfg.NotBefore,
		NotAfter:    c.cfg.NotAfter,
		MaxExamples: c.cfg.MaxExamples,
		Capacity:    int(c.total) + replyIDs,
	})
	if err != nil {
		return errors.Wrap(err, "history: id checker")
	}
	for _, r := range c.cfg.Replies {
		ic.AddInt64(r.IDs...)
		if len(hs) > 0 {
			for _, v := range r.IDs {
				c.checkTime(r.Source, hs[0], r.Ret, v)
			}
		}
	}
	c.rep.ReplyIDs = int64(replyIDs)
	for pi, h := range hs {
		last := map[codeKey]int64{}
		var prevID int64    // the process's last ID, any code
		prevShared := false // it came from a shared run
		for _, m := range h.Mints {
			ic.AddInt64(m.IDs...)
			for _, v := range m.IDs {
				c.rep.IDs++
				if v <= 0 {
					continue // out of range, counted by idcheck
				}
				c.checkTime(h.Name, h, m.T1, v)
				id := snowflake.ID(v)
				k := codeKey{id.Region(), id.Worker()}
				ordered := true
				if prev, ok := last[k]; ok && v <= prev {
					ordered = false
					c.rep.OrderViolations++
					c.example("order", "%s: %d after %d on %v", h.Name, v, prev, k)
				}
				last[k] = max(last[k], v)
				run := sharedAt(c.perShared[pi][k], segment.Linear(id), m.T1)
				// A shared ID is above the process's previous ID, whatever
				// its code, and so is the ID after it (a client leaving
				// the shared path starts its code above its last run).
				if ordered && (run != nil || prevShared) && prevID > 0 && v <= prevID {
					c.rep.OrderViolations++
					c.example("order", "%s: %d after %d across the shared path", h.Name, v, prevID)
				}
				prevID, prevShared = v, run != nil
				if run != nil {
					c.checkShared(h, run, m, id)
					continue
				}
				c.checkMinted(h, c.perProc[pi][k], m, id)
			}
		}
	}
	res := ic.Check()
	c.rep.Duplicates, c.rep.OutOfRange = res.Duplicates, res.OutOfRange
	c.rep.idErr = res.Err()
	if len(res.DuplicateExamples) > 0 {
		c.whereDuplicated(hs, res.DuplicateExamples)
	}
	return nil
}

// whereDuplicated names, for each example duplicate, every call that
// handed it out (process or reply source, and when the call returned, from
// the earliest history's start), so a report shows which paths collided.
func (c *checker) whereDuplicated(hs []*History, dups []measure.Duplicate) {
	where := make(map[int64][]string, len(dups))
	for _, d := range dups {
		where[d.ID] = nil
	}
	base := int64(math.MaxInt64)
	for _, h := range hs {
		base = min(base, h.Start)
	}
	if base == math.MaxInt64 {
		base = 0
	}
	at := func(t int64) time.Duration { return time.Duration(t - base).Round(time.Microsecond) }
	for _, h := range hs {
		for _, m := range h.Mints {
			for _, v := range m.IDs {
				if ws, ok := where[v]; ok {
					where[v] = append(ws, fmt.Sprintf("%s (call returned at +%v)", h.Name, at(m.T1)))
				}
			}
		}
	}
	for _, r := range c.cfg.Replies {
		for _, v := range r.IDs {
			if ws, ok := where[v]; ok {
				where[v] = append(ws, fmt.Sprintf("%s (reply at +%v)", r.Source, at(r.Ret)))
			}
		}
	}
	for _, d := range dups {
		c.example("duplicate", "%d in %s", d.ID, strings.Join(where[d.ID], ", "))
	}
}

// checkMinted checks one ID that h handed out in mint m against ls, h's
// leases of the ID's code (by Ret): it lies in a block received under one
// of them, and its call returned before the block's validity, before the
// lease's latest possible safety deadline and before the code's next owner
// acquired it.
func (c *checker) checkMinted(h *History, ls []*leaseInfo, m Mint, id snowflake.ID) {
	v, k := int64(id), codeKey{id.Region(), id.Worker()}
	li, blk, ok := mintedUnder(ls, segment.Linear(id), m.T1)
	if !ok {
		c.rep.OutsideBlock++
		c.example("block", "%s: %d of %v handed out with no lease of that code held", h.Name, v, k)
		return
	}
	// Every rule about a moment dates the ID by m.T1, the return of its
	// call: the one instant at which the ID is known to have existed (see
	// "Which instant dates an ID" in the package doc).
	if blk == nil {
		c.rep.OutsideBlock++
		c.example("block", "%s: %d (L=%d) of %v is in no block received under token %d", h.Name, v, segment.Linear(id), k, li.Token)
	} else {
		blk.minted++
		if validLocal := blk.Send + (blk.ValidUntil - blk.ServiceTime); m.T1 >= validLocal {
			c.rep.AfterBlockValid++
			c.rep.MaxBlockOverrun = max(c.rep.MaxBlockOverrun, time.Duration(m.T1-validLocal))
			c.example("valid", "%s: %d returned %v after its block [%d,%d) expired",
				h.Name, v, time.Duration(m.T1-validLocal), blk.Lo, blk.Hi)
		}
	}
	if dl := li.boundAt(m.T1); m.T1 >= dl {
		c.rep.AfterDeadline++
		c.rep.MaxDeadlineOverrun = max(c.rep.MaxDeadlineOverrun, time.Duration(m.T1-dl))
		started := fmt.Sprintf("%v after it", time.Duration(m.T0-dl))
		if m.T0 < dl {
			started = fmt.Sprintf("%v before it", time.Duration(dl-m.T0))
		}
		c.example("deadline", "%s: %d of %v (token %d) returned %v after the latest possible safety deadline (its call started %s)",
			h.Name, v, k, li.Token, time.Duration(m.T1-dl), started)
	} else {
		c.closest = min(c.closest, dl-m.T1)
	}
	if nx := li.next; nx != nil && m.T1 >= nx.Ret {
		c.rep.AfterNewOwner++
		c.example("owner", "%s: %d of %v (token %d) returned %v after %s acquired it (token %d)",
			h.Name, v, k, li.Token, time.Duration(m.T1-nx.Ret), nx.proc.Name, nx.Token)
	}
}

// checkShared checks one ID that h handed out in mint m from its shared
// run: counted, and handed out before the run's validity (a freshness
// finding, as for blocks; the time bound itself is checkTime's).
func (c *checker) checkShared(h *History, run *sharedInfo, m Mint, id snowflake.ID) {
	c.rep.SharedIDs++
	run.minted++
	if validLocal := run.Send + (run.ValidUntil - run.ServiceTime); m.T1 >= validLocal {
		c.rep.AfterBlockValid++
		c.rep.MaxBlockOverrun = max(c.rep.MaxBlockOverrun, time.Duration(m.T1-validLocal))
		c.example("valid", "%s: %d returned %v after its shared run [%d,%d) expired",
			h.Name, int64(id), time.Duration(m.T1-validLocal), run.Lo, run.Hi)
	}
}

// checkTime holds ID v, handed out by who at ret (h's clock), to
// Config.MaxBehind and MaxAhead, and keeps the extremes.
func (c *checker) checkTime(who string, h *History, ret, v int64) {
	if (c.cfg.MaxBehind <= 0 && c.cfg.MaxAhead <= 0) || v <= 0 {
		return
	}
	wall := h.Wall + (ret - h.Start)
	start := snowflake.MsTime(snowflake.ID(v).Ms()).UnixNano()
	behind := time.Duration(wall - start)
	c.rep.MaxBehindSeen = max(c.rep.MaxBehindSeen, behind)
	c.rep.MaxAheadSeen = max(c.rep.MaxAheadSeen, -behind)
	if (c.cfg.MaxBehind > 0 && behind >= c.cfg.MaxBehind) || (c.cfg.MaxAhead > 0 && -behind > c.cfg.MaxAhead) {
		c.rep.OutsideTimeBound++
		c.example("time", "%s: %d (millisecond %s) handed out at %s, %v behind",
			who, v, time.Unix(0, start).UTC().Format("15:04:05.000"), time.Unix(0, wall).UTC().Format("15:04:05.000000"), behind)
	}
}

// mintedUnder finds which of a process's leases of a code (ls, by Ret)
// handed out linear position l by t1: the latest lease acquired by t1 with
// a block holding l that had arrived by t1, or else the latest lease
// acquired by t1 and blk nil. ok is false when no lease had been acquired.
func mintedUnder(ls []*leaseInfo, l, t1 int64) (li *leaseInfo, blk *blockInfo, ok bool) {
	n := sort.Search(len(ls), func(i int) bool { return ls[i].Ret > t1 })
	if n == 0 {
		return nil, nil, false
	}
	li = ls[n-1]
	for i := n - 1; i >= 0 && blk == nil; i-- {
		if b := ls[i].blockAt(l, t1); b != nil {
			li, blk = ls[i], b
		}
	}
	return li, blk, true
}
