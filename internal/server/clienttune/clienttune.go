// Package clienttune holds the rangeclient knobs that only benchmarks and
// tests turn: block sizes, prefetch, idleness, timeouts, renewal period and
// backoff. Users choose what rangeclient.Config offers (targets, region,
// owner, TLS, codes, refill interval, reserve, safety margin, logger,
// metrics); the defaults below are what every user gets. A benchmark that
// pins the block size, or a test that needs a short renewal period, sets
// them with With:
//
//	cfg := clienttune.With(rangeclient.Config{Targets: targets}, clienttune.Tuning{FixedBlock: 409_600})
//
// The package is a hook: rangeclient registers the function that puts a
// Tuning into a Config (an unexported field), so nothing outside this
// module can reach it.
//
// It sits with the server parts, not the test harnesses, because its
// defaults are production: every rangeclient, the Next minter of rangesvc
// serve included, runs with them, so the binary links this package
// (rangeclient already takes internal/server/wire from this group). It
// cannot live under rangeclient/internal: bench and the fault suite's
// minter, outside rangeclient's tree, set the knobs.
package clienttune

import (
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Defaults for Tuning fields left zero.
const (
	// DefaultMinBlock is the smallest block requested: one millisecond.
	DefaultMinBlock = 1 << snowflake.SequenceBits
	// DefaultMaxBlock is the largest block requested: 10 s of span, the
	// service's default limit (larger requests are refused there).
	DefaultMaxBlock = int(segment.DefaultMaxBlock)
	// DefaultPrefetchThreshold: the next block is requested when less than
	// half of the current one's expected life is left.
	DefaultPrefetchThreshold = 0.5
	// DefaultIdleTimeout: after this long without a minted ID the client
	// stops refreshing its blocks (its lease is still renewed).
	DefaultIdleTimeout = 30 * time.Second
	// DefaultRPCTimeout bounds every call to the service.
	DefaultRPCTimeout = time.Second
	// DefaultBackoffBase and DefaultBackoffMax bound the exponential backoff
	// (with jitter) between failed calls and gRPC reconnects.
	DefaultBackoffBase = 50 * time.Millisecond
	DefaultBackoffMax  = 2 * time.Second
)

// Tuning is the set of knobs; zero fields take the defaults above.
type Tuning struct {
	// MinBlock and MaxBlock bound the adaptive block size in linear units
	// (ms<<12|seq). Defaults: 4,096 (1 ms) and 40,960,000 (10 s).
	MinBlock, MaxBlock int
	// FixedBlock, when > 0, pins every request to this many units (MinBlock
	// and MaxBlock do not apply). The service may still shrink a grant.
	FixedBlock int
	// PrefetchThreshold is the fraction (0, 1] of the current block's
	// expected life left at which the next block is requested (default
	// 0.5); the client starts earlier when its rate and refill latency say
	// so (rangeclient's package doc).
	PrefetchThreshold float64
	// IdleTimeout: after this long without a minted ID the client stops
	// refreshing blocks (default 30 s; negative: never).
	IdleTimeout time.Duration
	// RPCTimeout bounds each call to the service (default 1 s); Acquire
	// gets five times as long, a renewal up to one RenewPeriod.
	RPCTimeout time.Duration
	// RenewPeriod is the time between lease renewals. Default: a third of
	// the safe interval (TTL - SafetyMargin) of the granted lease.
	RenewPeriod time.Duration
	// BackoffBase and BackoffMax bound the exponential backoff with jitter
	// between failed calls and gRPC reconnects (defaults 50 ms and 2 s).
	BackoffBase, BackoffMax time.Duration
}

// WithDefaults returns t with zero fields replaced by their defaults.
func (t Tuning) WithDefaults() Tuning {
	if t.MinBlock == 0 {
		t.MinBlock = DefaultMinBlock
	}
	if t.MaxBlock == 0 {
		t.MaxBlock = DefaultMaxBlock
	}
	if t.PrefetchThreshold == 0 {
		t.PrefetchThreshold = DefaultPrefetchThreshold
	}
	if t.IdleTimeout == 0 {
		t.IdleTimeout = DefaultIdleTimeout
	}
	if t.RPCTimeout == 0 {
		t.RPCTimeout = DefaultRPCTimeout
	}
	if t.BackoffBase == 0 {
		t.BackoffBase = DefaultBackoffBase
	}
	if t.BackoffMax == 0 {
		t.BackoffMax = DefaultBackoffMax
	}
	return t
}

// apply is registered by rangeclient: it returns its Config argument with
// the Tuning set.
var apply func(cfg any, t Tuning) any

// Register is called by rangeclient's init; nothing else calls it.
func Register(f func(cfg any, t Tuning) any) { apply = f }

// With returns cfg, a rangeclient.Config, with the knobs t.
func With[C any](cfg C, t Tuning) C { return apply(cfg, t).(C) }
