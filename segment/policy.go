package segment

import (
	"fmt"
	"time"

	"github.com/idrange/idrange/snowflake"
)

// Units of the linear space L = ms<<12 | seq.
const (
	// PerMs is the number of L units in one millisecond (4,096 sequences).
	PerMs = 1 << snowflake.SequenceBits
	// EndL is one past the last L any code can use: (MaxTimestamp+1)<<12.
	// A HWM equal to EndL means the code's epoch is used up.
	EndL int64 = (snowflake.MaxTimestamp + 1) << snowflake.SequenceBits
)

// Policy defaults and limits.
const (
	// DefaultMaxBlock is 10 s of span (10,000 ms x 4,096): the largest
	// block a single grant may cover.
	DefaultMaxBlock int64 = 10_000 * PerMs
	// DefaultMaxLead is how far (in service time) a grant's Hi may run ahead
	// of the service clock. 15 s means a 2 s service clock rollback still
	// grants (starting at the HWM) with a full default block.
	DefaultMaxLead = 15 * time.Second
	// DefaultMinGrantPercent is the smallest share of a request a grant
	// trimmed by the lead may carry: 75%. A client is never granted less
	// than three quarters of what it asked for because of the lead, so a
	// client minting flat out at the lead limit makes at most 4/3 as many
	// grants as the same client at normal speed (its requests are sized to
	// the same span), instead of one 1-2 ms grant per round trip.
	DefaultMinGrantPercent = 75

	// MaxBlockLimit is the largest MaxBlock any policy, service or client
	// accepts: 100 s of span (10 x DefaultMaxBlock), far inside the wire's
	// uint32 count. Larger blocks would only burn space faster.
	MaxBlockLimit int64 = 10 * DefaultMaxBlock

	// maxMaxLead keeps arithmetic far from overflow and forbids
	// configurations that would burn years of space per grant.
	maxMaxLead = 24 * time.Hour
)

// Policy is the grant rule's tuning. The zero value means "all defaults"
// (see WithDefaults); Validate checks an explicit policy.
type Policy struct {
	// MaxBlock is the largest request (in L units) a grant accepts; a larger
	// one is ErrInvalid, not silently shrunk, so a misconfigured client
	// notices. Default DefaultMaxBlock.
	MaxBlock int64
	// MaxLead bounds how far a grant may run ahead of service time: a grant
	// whose Lo is at or past (now+MaxLead)<<12 is refused with *Backpressure,
	// one whose Hi would pass it is shrunk to it. Whole milliseconds; default
	// DefaultMaxLead.
	MaxLead time.Duration
	// MinGrantPercent is the least share (1..100, percent) of a request
	// that a grant trimmed by MaxLead may carry: a request of n units whose
	// grant would be trimmed below ceil(n*MinGrantPercent/100) units is
	// refused with *Backpressure, RetryAfter being the service time until
	// that much fits. Without it a client that has run ahead to the lead
	// gets a block of the millisecond or two the clock freed since its
	// last grant and asks again at once, writing to etcd once per round
	// trip. A request that fits whole is granted whole whatever its size.
	// Default DefaultMinGrantPercent.
	MinGrantPercent int
}

// DefaultPolicy is the policy with every default.
func DefaultPolicy() Policy {
	return Policy{MaxBlock: DefaultMaxBlock, MaxLead: DefaultMaxLead, MinGrantPercent: DefaultMinGrantPercent}
}

// WithDefaults returns p with zero fields replaced by their defaults.
func (p Policy) WithDefaults() Policy {
	if p.MaxBlock == 0 {
		p.MaxBlock = DefaultMaxBlock
	}
	if p.MaxLead == 0 {
		p.MaxLead = DefaultMaxLead
	}
	if p.MinGrantPercent == 0 {
		p.MinGrantPercent = DefaultMinGrantPercent
	}
	return p
}

// Validate reports the first field out of range (zero fields are invalid
// here; call WithDefaults first to accept them as defaults).
func (p Policy) Validate() error {
	switch {
	case p.MaxBlock < 1 || p.MaxBlock > MaxBlockLimit:
		return fmt.Errorf("policy MaxBlock %d not in 1..%d: %w", p.MaxBlock, MaxBlockLimit, ErrInvalid)
	case p.MaxLead < time.Millisecond || p.MaxLead > maxMaxLead:
		return fmt.Errorf("policy MaxLead %v not in 1ms..%v: %w", p.MaxLead, maxMaxLead, ErrInvalid)
	case p.MaxLead%time.Millisecond != 0:
		return fmt.Errorf("policy MaxLead %v is not a whole number of milliseconds: %w", p.MaxLead, ErrInvalid)
	case p.MinGrantPercent < 1 || p.MinGrantPercent > 100:
		return fmt.Errorf("policy MinGrantPercent %d not in 1..100: %w", p.MinGrantPercent, ErrInvalid)
	}
	return nil
}

// Grant is the outcome of the pure grant rule: [Lo, Hi) of one code's space
// and the service-clock instants that go with it.
type Grant struct {
	Lo, Hi int64
	// ServiceTime is the service clock reading the grant was computed at.
	ServiceTime time.Time
	// ValidUntil is the end of the millisecond of Hi-1: once service time
	// reaches it, no L of the block carries a current timestamp any more.
	ValidUntil time.Time
}

// Plan applies the grant rule to a code whose high-water mark is hwm, at
// service time now, for a request of n L units:
//
//	Lo = max(hwm, now<<12, 1)       (1: L 0 would be ID 0 for code 0/0)
//	Hi = min(Lo+n, (now+MaxLead)<<12, EndL)
//	refused if (now+MaxLead)<<12 - Lo < least
//	least = min(ceil(n*MinGrantPercent/100), MaxLead<<12, EndL-Lo)
//
// Errors: ErrInvalid (n not in 1..MaxBlock, hwm negative or past EndL),
// *Backpressure if the lead leaves less than the minimum share of the
// request (in particular if Lo >= (now+MaxLead)<<12; RetryAfter is the
// service-time wait until that share fits), ErrEpochExhausted if
// Lo >= EndL. Near the end of the epoch the block is shrunk to EndL rather
// than refused, so the last millisecond is usable and the next is rejected.
//
// Plan is pure: whatever now says, Lo >= hwm and Hi > Lo on success, so
// successive plans that each raise hwm to the previous Hi never overlap.
func (p Policy) Plan(hwm int64, now time.Time, n int64) (Grant, error) {
	lo, hi, err := p.planMs(hwm, snowflake.MsSince(now), n)
	if err != nil {
		return Grant{}, err
	}
	return Grant{Lo: lo, Hi: hi, ServiceTime: now, ValidUntil: ValidUntil(hi)}, nil
}

// planMs is Plan with the service time as milliseconds since snowflake.Epoch.
// The policy must be valid (Validate); an invalid one is ErrInvalid.
func (p Policy) planMs(hwm, nowMs, n int64) (lo, hi int64, err error) {
	if err := p.Validate(); err != nil {
		return 0, 0, err
	}
	switch {
	case n < 1 || n > p.MaxBlock:
		return 0, 0, fmt.Errorf("count %d not in 1..%d: %w", n, p.MaxBlock, ErrInvalid)
	case hwm < 0 || hwm > EndL:
		return 0, 0, fmt.Errorf("high-water mark %d not in 0..%d: %w", hwm, EndL, ErrInvalid)
	case nowMs > snowflake.MaxTimestamp:
		return 0, 0, fmt.Errorf("service time %d ms is past the last timestamp %d ms: %w",
			nowMs, int64(snowflake.MaxTimestamp), ErrEpochExhausted)
	}
	// A clock decades before the epoch is clamped: it only changes how long
	// RetryAfter says, never where a block starts (Lo >= hwm regardless).
	if nowMs < -snowflake.MaxTimestamp {
		nowMs = -snowflake.MaxTimestamp
	}
	lo = max(hwm, nowMs<<snowflake.SequenceBits, 1)
	if lo >= EndL {
		return 0, 0, fmt.Errorf("code's next position %d is at the end of the epoch: %w", lo, ErrEpochExhausted)
	}
	leadMs := p.MaxLead.Milliseconds()
	limit := (nowMs + leadMs) << snowflake.SequenceBits
	// The least grant worth a write: a share of the request, but never
	// more than the lead can ever hold (else a request larger than the
	// lead would wait for ever) or than is left of the epoch.
	least := min((n*int64(p.MinGrantPercent)+99)/100, leadMs<<snowflake.SequenceBits, EndL-lo)
	if limit-lo < least {
		// The first service ms at which (ms+lead)<<12 >= lo+least.
		readyMs := (lo+least+PerMs-1)>>snowflake.SequenceBits - leadMs
		return 0, 0, &Backpressure{RetryAfter: time.Duration(readyMs-nowMs) * time.Millisecond}
	}
	hi = min(lo+n, limit, EndL)
	return lo, hi, nil
}

// ValidUntil is the end of the millisecond that holds L = hi-1, as an
// instant: snowflake.MsTime((hi-1)>>12 + 1).
func ValidUntil(hi int64) time.Time {
	return snowflake.MsTime((hi-1)>>snowflake.SequenceBits + 1)
}
