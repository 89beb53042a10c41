// This file verifies large sets of IDs after the fact: every ID
// unique, every field in range, every (region, worker) code one that was
// expected.
//
// It is built for tens of millions of IDs from a load test or a fault
// injection run. IDs are collected in one []int64 (8 bytes each, no map
// overhead), sorted in place once, and scanned: equal neighbours are
// duplicates. Per-code counts use a fixed array indexed by the 10-bit code,
// so checking costs one sort plus one linear pass and no allocation per ID.
//
// A Checker reports, never repairs: examples are kept (a bounded number) so
// a report can name the offending IDs and decode them.

package measure

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/snowflake"
)

// Sentinel errors of CheckResult.Err, one per kind of failure, so callers (bench
// exit status, fault suites) can branch with errors.Is.
var (
	// ErrDuplicate: some ID was seen more than once.
	ErrDuplicate = errors.New("idcheck: duplicate id")
	// ErrOutOfRange: some ID could not have been minted by this format in
	// this run: not positive, timestamp outside the allowed window, worker
	// above the allowed maximum, or a (region, worker) code not expected.
	ErrOutOfRange = errors.New("idcheck: id out of range")
	// ErrMissingCode: a code required by CheckConfig.RequireAll minted nothing.
	ErrMissingCode = errors.New("idcheck: expected code minted no id")
	// ErrNothingChecked: no ID was added; an empty run proves nothing.
	ErrNothingChecked = errors.New("idcheck: no ids checked")
)

// DefaultMaxExamples is how many example IDs of each kind a CheckResult keeps.
const DefaultMaxExamples = 10

// numCodes is the number of (region, worker) codes of format version 1.
const numCodes = (snowflake.MaxRegion + 1) * (snowflake.MaxWorker + 1)

// Code is a (region, worker) pair: the part of an ID that names its minter.
type Code struct {
	Region int `json:"region"`
	Worker int `json:"worker"`
}

func (c Code) String() string { return fmt.Sprintf("r%d/w%d", c.Region, c.Worker) }

func (c Code) index() int { return c.Region<<snowflake.WorkerBits | c.Worker }

func codeOf(id int64) int { return int(id>>snowflake.SequenceBits) & (numCodes - 1) }

// CheckConfig says what "in range" means for one check. The zero value checks
// uniqueness and positivity only.
type CheckConfig struct {
	// Expect, when non-empty, is the set of codes allowed to appear: an ID
	// of any other code is out of range.
	Expect []Code
	// RequireAll additionally demands that every code in Expect minted at
	// least one ID (ErrMissingCode otherwise).
	RequireAll bool
	// MaxWorker, when > 0, is the largest worker field allowed (docs/design.md: 200
	// workers per region, so 199). 0 allows the whole field (0..255).
	MaxWorker int
	// NotBefore and NotAfter, when non-zero, bound the timestamp field: an
	// ID naming a millisecond before NotBefore or after NotAfter is out of
	// range (a block can run ahead of the clock by the service's lead, so
	// give NotAfter that slack).
	NotBefore, NotAfter time.Time
	// MaxExamples bounds the examples kept per kind. Default
	// DefaultMaxExamples; negative keeps none.
	MaxExamples int
	// Capacity preallocates room for this many IDs (saves the copies of a
	// growing slice when the count is known roughly in advance).
	Capacity int
}

// Validate reports the first bad field.
func (c CheckConfig) Validate() error {
	for i, code := range c.Expect {
		if code.Region < 0 || code.Region > snowflake.MaxRegion || code.Worker < 0 || code.Worker > snowflake.MaxWorker {
			return errors.Newf("idcheck: CheckConfig.Expect[%d] %v is not a valid code (region 0..%d, worker 0..%d)",
				i, code, snowflake.MaxRegion, snowflake.MaxWorker)
		}
	}
	switch {
	case c.RequireAll && len(c.Expect) == 0:
		return errors.New("idcheck: CheckConfig.RequireAll needs CheckConfig.Expect")
	case c.MaxWorker < 0 || c.MaxWorker > snowflake.MaxWorker:
		return errors.Newf("idcheck: CheckConfig.MaxWorker %d not in 0..%d", c.MaxWorker, snowflake.MaxWorker)
	case !c.NotBefore.IsZero() && !c.NotAfter.IsZero() && c.NotAfter.Before(c.NotBefore):
		return errors.Newf("idcheck: CheckConfig.NotAfter %v is before CheckConfig.NotBefore %v", c.NotAfter, c.NotBefore)
	case c.Capacity < 0:
		return errors.Newf("idcheck: CheckConfig.Capacity %d is negative", c.Capacity)
	}
	return nil
}

// Checker collects IDs and checks them. Add is safe for concurrent use;
// Check may be called more than once (it sorts the collected IDs in place
// and leaves them collected).
type Checker struct {
	cfg      CheckConfig
	expected []bool // by code index; nil when any code is allowed
	minMs    int64
	maxMs    int64 // inclusive bounds on the timestamp field

	mu  sync.Mutex
	ids []int64
}

// NewChecker validates cfg and returns an empty Checker.
func NewChecker(cfg CheckConfig) (*Checker, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxExamples == 0 {
		cfg.MaxExamples = DefaultMaxExamples
	}
	c := &Checker{cfg: cfg, minMs: 0, maxMs: snowflake.MaxTimestamp, ids: make([]int64, 0, cfg.Capacity)}
	if len(cfg.Expect) > 0 {
		c.expected = make([]bool, numCodes)
		for _, code := range cfg.Expect {
			c.expected[code.index()] = true
		}
	}
	if !cfg.NotBefore.IsZero() {
		c.minMs = max(0, snowflake.MsSince(cfg.NotBefore))
	}
	if !cfg.NotAfter.IsZero() {
		c.maxMs = min(int64(snowflake.MaxTimestamp), snowflake.MsSince(cfg.NotAfter))
	}
	return c, nil
}

// Add records ids for the check.
func (c *Checker) Add(ids ...snowflake.ID) {
	c.mu.Lock()
	for _, id := range ids {
		c.ids = append(c.ids, int64(id))
	}
	c.mu.Unlock()
}

// AddInt64 records raw values (for IDs read from a file or a database
// column); values that are not valid IDs are reported as out of range.
func (c *Checker) AddInt64(ids ...int64) {
	c.mu.Lock()
	c.ids = append(c.ids, ids...)
	c.mu.Unlock()
}

// Len is the number of IDs added so far.
func (c *Checker) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.ids)
}

// Duplicate is an ID seen more than once.
type Duplicate struct {
	ID    int64 `json:"id,string"`
	Count int   `json:"count"` // times seen (>= 2)
}

// Bad is an ID that is out of range, with the reason.
type Bad struct {
	ID     int64  `json:"id,string"`
	Reason string `json:"reason"`
}

// CodeCount is how many IDs one code minted.
type CodeCount struct {
	Code
	Count int64 `json:"count"`
}

// CheckResult is the outcome of a check.
type CheckResult struct {
	// Checked is how many IDs were examined (every ID added).
	Checked int64 `json:"checked"`
	// Unique is how many distinct values were seen.
	Unique int64 `json:"unique"`
	// Duplicates is how many IDs were surplus copies (Checked - Unique).
	Duplicates int64 `json:"duplicates"`
	// DuplicateExamples lists some duplicated IDs with their counts.
	DuplicateExamples []Duplicate `json:"duplicate_examples,omitempty"`
	// OutOfRange counts IDs (each copy) failing a range rule.
	OutOfRange int64 `json:"out_of_range"`
	// OutOfRangeExamples lists some of them with the rule they broke.
	OutOfRangeExamples []Bad `json:"out_of_range_examples,omitempty"`
	// MissingCodes are codes of CheckConfig.Expect that minted nothing (only
	// an error when CheckConfig.RequireAll is set).
	MissingCodes []Code `json:"missing_codes,omitempty"`
	// Codes counts IDs per code that appeared, sorted by code.
	Codes []CodeCount `json:"codes,omitempty"`
	// MinTime and MaxTime are the smallest and largest timestamps among the
	// valid IDs (zero if none).
	MinTime time.Time `json:"min_time"`
	MaxTime time.Time `json:"max_time"`

	requireAll bool
}

// OK reports whether the check passed (see Err).
func (r CheckResult) OK() bool { return r.Err() == nil }

// Err is nil when every ID was unique and in range, at least one ID was
// checked, and (with RequireAll) every expected code appeared. Otherwise it
// wraps the first applicable sentinel, in order ErrDuplicate,
// ErrOutOfRange, ErrMissingCode, ErrNothingChecked, with the counts and
// first examples in the message.
func (r CheckResult) Err() error {
	switch {
	case r.Duplicates > 0:
		ex := make([]string, 0, len(r.DuplicateExamples))
		for _, d := range r.DuplicateExamples {
			ex = append(ex, fmt.Sprintf("%s x%d", describe(d.ID), d.Count))
		}
		return errors.Wrapf(ErrDuplicate, "%d duplicate(s) among %d ids, e.g. %s", r.Duplicates, r.Checked, strings.Join(firstN(ex, 3), "; "))
	case r.OutOfRange > 0:
		ex := make([]string, 0, len(r.OutOfRangeExamples))
		for _, b := range r.OutOfRangeExamples {
			ex = append(ex, fmt.Sprintf("%d (%s)", b.ID, b.Reason))
		}
		return errors.Wrapf(ErrOutOfRange, "%d of %d ids out of range, e.g. %s", r.OutOfRange, r.Checked, strings.Join(firstN(ex, 3), "; "))
	case r.requireAll && len(r.MissingCodes) > 0:
		ex := make([]string, 0, len(r.MissingCodes))
		for _, c := range r.MissingCodes {
			ex = append(ex, c.String())
		}
		return errors.Wrapf(ErrMissingCode, "%d expected code(s) minted nothing: %s", len(r.MissingCodes), strings.Join(firstN(ex, 10), " "))
	case r.Checked == 0:
		return ErrNothingChecked
	}
	return nil
}

// describe is the decode line of a positive value, or the bare number.
func describe(v int64) string {
	if v <= 0 {
		return fmt.Sprintf("%d (not a valid id)", v)
	}
	id := snowflake.ID(v)
	return id.Parts().Format(id)
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("... %d more examples", len(s)-n))
	}
	return s
}

// Check sorts the collected IDs and checks them. It holds the Checker's
// lock for the duration (Add waits).
func (c *Checker) Check() CheckResult {
	c.mu.Lock()
	defer c.mu.Unlock()
	slices.Sort(c.ids)
	ids := c.ids
	res := CheckResult{Checked: int64(len(ids)), requireAll: c.cfg.RequireAll}
	var perCode [numCodes]int64
	minMs, maxMs := int64(-1), int64(-1)
	for i := 0; i < len(ids); {
		v := ids[i]
		j := i + 1
		for j < len(ids) && ids[j] == v {
			j++
		}
		n := j - i
		res.Unique++
		if n > 1 {
			res.Duplicates += int64(n - 1)
			if len(res.DuplicateExamples) < c.cfg.MaxExamples {
				res.DuplicateExamples = append(res.DuplicateExamples, Duplicate{ID: v, Count: n})
			}
		}
		if reason := c.rangeProblem(v); reason != "" {
			res.OutOfRange += int64(n)
			if len(res.OutOfRangeExamples) < c.cfg.MaxExamples {
				res.OutOfRangeExamples = append(res.OutOfRangeExamples, Bad{ID: v, Reason: reason})
			}
		}
		if v > 0 {
			perCode[codeOf(v)] += int64(n)
			ms := snowflake.ID(v).Ms()
			if minMs < 0 || ms < minMs {
				minMs = ms
			}
			maxMs = max(maxMs, ms)
		}
		i = j
	}
	for idx, n := range perCode {
		code := Code{Region: idx >> snowflake.WorkerBits, Worker: idx & snowflake.MaxWorker}
		if n > 0 {
			res.Codes = append(res.Codes, CodeCount{Code: code, Count: n})
		} else if c.expected != nil && c.expected[idx] {
			res.MissingCodes = append(res.MissingCodes, code)
		}
	}
	if minMs >= 0 {
		res.MinTime, res.MaxTime = snowflake.MsTime(minMs), snowflake.MsTime(maxMs)
	}
	return res
}

// rangeProblem names the first range rule v breaks, or "".
func (c *Checker) rangeProblem(v int64) string {
	if v <= 0 {
		if v == 0 {
			return "0 is never minted"
		}
		return "sign bit set"
	}
	id := snowflake.ID(v)
	ms := id.Ms()
	switch {
	case ms < c.minMs:
		return fmt.Sprintf("timestamp %s before %s", id.Time().Format(time.RFC3339Nano), snowflake.MsTime(c.minMs).Format(time.RFC3339Nano))
	case ms > c.maxMs:
		return fmt.Sprintf("timestamp %s after %s", id.Time().Format(time.RFC3339Nano), snowflake.MsTime(c.maxMs).Format(time.RFC3339Nano))
	case c.cfg.MaxWorker > 0 && id.Worker() > c.cfg.MaxWorker:
		return fmt.Sprintf("worker %d above %d", id.Worker(), c.cfg.MaxWorker)
	case c.expected != nil && !c.expected[codeOf(v)]:
		return fmt.Sprintf("code r%d/w%d not expected", id.Region(), id.Worker())
	}
	return ""
}

// Codes returns the codes region × [0, workers) in order: the Expect set of
// a fleet whose regions each hold workers 0..workers-1.
func Codes(regions []int, workers int) []Code {
	out := make([]Code, 0, len(regions)*workers)
	for _, r := range regions {
		for w := range workers {
			out = append(out, Code{Region: r, Worker: w})
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].index() < out[j].index() })
	return out
}
