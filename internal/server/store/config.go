package store

import (
	"fmt"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Store defaults and limits.
const (
	// DefaultLeaseTTL is the lease TTL asked of the storage at Acquire.
	// etcd may grant more (its minimum depends on the election timeout);
	// Lease.TTL says what was granted.
	DefaultLeaseTTL = 10 * time.Second
	// DefaultOpTimeout bounds every single storage call the Store makes.
	DefaultOpTimeout = 3 * time.Second
	// DefaultMaxConflicts is how many failed grant transactions (lost HWM
	// races, yields to a contending replica) one Allocate retries before
	// giving up with ErrUnavailable.
	DefaultMaxConflicts = 64
	// DefaultMaxCodesPerIdentity is how many worker codes of a region one
	// caller identity may hold at once (a quarter of the region), so one
	// misbehaving client cannot take every code.
	DefaultMaxCodesPerIdentity = 64
)

// Config configures a Store. Zero fields take the documented defaults.
type Config struct {
	// LeaseTTL asked of the storage at Acquire: whole seconds (etcd leases
	// are in seconds), 1s..1h. Default DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Policy is the grant rule; zero fields take their defaults.
	Policy segment.Policy
	// Now is the service clock grants are computed with. Default time.Now.
	// Uniqueness never depends on it; freshness does.
	Now func() time.Time
	// FirstCode picks the worker code Acquire tries first in region (it
	// then tries the next ones, wrapping at 256). Default: a random code,
	// which spreads concurrent acquirers over the region. A fixed choice
	// (the in-memory test service uses 0) makes tests reproducible.
	FirstCode func(region int) int
	// OpTimeout bounds each storage call. Default DefaultOpTimeout.
	OpTimeout time.Duration
	// MaxConflicts bounds failed grant transactions per Allocate. Default
	// DefaultMaxConflicts.
	MaxConflicts int
	// MaxCodesPerIdentity is how many codes of a region one caller identity
	// (authz.WithIdentity) may hold at once, 1..256; Acquire past it fails with
	// ErrCodeCap. Callers without an identity are not capped. Default
	// DefaultMaxCodesPerIdentity.
	MaxCodesPerIdentity int
	// RestartFloor makes the Store grant nothing below the floor it can
	// prove when it starts, before it has read any mark: every block that
	// any replica of the region granted before then ended at or below
	// (StartedAt + Policy.MaxLead + MaxClockSkew), so a mark
	// lowered while this replica was down (by hand, or a restore without
	// the fence) cannot make it grant over one of them (floor.go,
	// docs/design.md "A floor that survives restarts"). The price: for
	// about MaxClockSkew plus a tenth of a request's span after StartedAt,
	// a grant on a code whose mark is below the floor is backpressure, and
	// until the clock reaches the floor (MaxLead later) grants carry a
	// tenth of a request when that is what the lead leaves (floor.go).
	// rangesvc serve sets it; default off (tests that freeze the clock at
	// New).
	RestartFloor bool
	// StartedAt is when the replica started, on the service clock (Now):
	// the restart floor covers the blocks granted before it. The earlier,
	// the lower the floor (rangesvc serve passes the time it started,
	// before its etcd was up). Default: Now at New.
	StartedAt time.Time
	// MaxClockSkew is the region's documented bound on how far the clocks
	// of its replicas (and one replica's clock across a restart) may
	// differ, 0..1h; only RestartFloor uses it. Every replica of a region
	// must also run the same Policy.MaxLead (or this one the largest).
	// Default 0.
	MaxClockSkew time.Duration
	// Logger receives warnings (corrupt values, failed clean-ups). Default:
	// discard.
	Logger *slog.Logger
	// Observer receives metric events. Default: NopObserver.
	Observer Observer
}

func (c Config) withDefaults() Config {
	if c.LeaseTTL == 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	c.Policy = c.Policy.WithDefaults()
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.FirstCode == nil {
		c.FirstCode = func(int) int { return rand.IntN(snowflake.MaxWorker + 1) }
	}
	if c.OpTimeout == 0 {
		c.OpTimeout = DefaultOpTimeout
	}
	if c.MaxConflicts == 0 {
		c.MaxConflicts = DefaultMaxConflicts
	}
	if c.MaxCodesPerIdentity == 0 {
		c.MaxCodesPerIdentity = DefaultMaxCodesPerIdentity
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Observer == nil {
		c.Observer = NopObserver{}
	}
	return c
}

// Validate reports the first bad field (after defaults are applied).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.LeaseTTL < time.Second || c.LeaseTTL > time.Hour:
		return fmt.Errorf("store LeaseTTL %v not in 1s..1h: %w", c.LeaseTTL, segment.ErrInvalid)
	case c.LeaseTTL%time.Second != 0:
		return fmt.Errorf("store LeaseTTL %v is not whole seconds (etcd leases are in seconds): %w", c.LeaseTTL, segment.ErrInvalid)
	case c.OpTimeout < 0:
		return fmt.Errorf("store OpTimeout %v is negative: %w", c.OpTimeout, segment.ErrInvalid)
	case c.MaxConflicts < 1:
		return fmt.Errorf("store MaxConflicts %d must be >= 1: %w", c.MaxConflicts, segment.ErrInvalid)
	case c.MaxClockSkew < 0 || c.MaxClockSkew > time.Hour:
		return fmt.Errorf("store MaxClockSkew %v not in 0..1h: %w", c.MaxClockSkew, segment.ErrInvalid)
	case c.MaxCodesPerIdentity < 1 || c.MaxCodesPerIdentity > snowflake.MaxWorker+1:
		return fmt.Errorf("store MaxCodesPerIdentity %d not in 1..%d: %w", c.MaxCodesPerIdentity, snowflake.MaxWorker+1, segment.ErrInvalid)
	}
	return c.Policy.Validate()
}
