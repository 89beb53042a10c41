package engine

import (
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// MaxCodes bounds Config.Codes: 16 codes are 65M IDs/s, far beyond what one
// process can use, and a region has only 256 codes for its whole fleet.
const MaxCodes = 16

// Defaults for Config fields left zero.
const (
	// DefaultRefillInterval is the span of time one block should last: with
	// the time-following cursor a block of n linear units lives about
	// n/4096 ms whatever the rate, so 1 s is 4,096,000 units.
	DefaultRefillInterval = time.Second
	// DefaultSafetyMargin is subtracted from the granted TTL for the safety
	// deadline. It covers clock-rate differences between this host and the
	// etcd leader and the client's own detection delay.
	DefaultSafetyMargin = time.Second
)

// Config configures an Engine: rangeclient.Config, whose fields it has and
// where each is documented for users, plus Tuning. Exactly one of Targets
// and Allocator is required; every other field has a default for its zero
// value (withDefaults), and Validate holds every rule on them.
type Config struct {
	Targets     []string          // gRPC addresses of the region's replicas, or one target with a scheme
	TLS         *tls.Config       // secures the connections to Targets; nil: plaintext
	DialOptions []grpc.DialOption // appended to the engine's own gRPC options
	Allocator   segment.Allocator // an in-process range service, instead of Targets

	Region int    // the region code; with Targets, 0 is learnt from the service
	Codes  int    // worker codes held (0: the shared path while the rate allows)
	Owner  string // recorded with the lease; default "hostname/pid"

	RefillInterval time.Duration         // how long a block should last (default 1 s)
	MaxReserve     time.Duration         // the reserve past the safety deadline (0: default; < 0: off)
	SafetyMargin   time.Duration         // taken off the granted TTL (default 1 s)
	Registerer     prometheus.Registerer // receives the metrics; nil: none
	Logger         *slog.Logger          // receives lease and refill events; nil discards them

	// Tuning holds the knobs users of rangeclient do not see: block sizes,
	// prefetch, idleness, timeouts, renewal period, backoff. Zero fields
	// take the defaults every rangeclient runs with.
	Tuning Tuning
}

// withDefaults returns c with zero fields replaced by their defaults.
func (c Config) withDefaults() Config {
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Owner == "" {
		host, err := os.Hostname()
		if err != nil || host == "" {
			host = "unknown-host"
		}
		c.Owner = fmt.Sprintf("%s/%d", host, os.Getpid())
		if len(c.Owner) > segment.MaxOwnerLen {
			c.Owner = c.Owner[:segment.MaxOwnerLen]
			for !utf8.ValidString(c.Owner) {
				c.Owner = c.Owner[:len(c.Owner)-1]
			}
		}
	}
	if c.RefillInterval == 0 {
		c.RefillInterval = DefaultRefillInterval
	}
	if c.SafetyMargin == 0 {
		c.SafetyMargin = DefaultSafetyMargin
	}
	c.Tuning = c.Tuning.withDefaults()
	return c
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrInvalidConfig with the field's name and value.
func (c Config) Validate() error {
	c = c.withDefaults()
	bad := func(format string, args ...any) error {
		return fmt.Errorf(format+": %w", append(args, ErrInvalidConfig)...)
	}
	switch {
	case len(c.Targets) == 0 && c.Allocator == nil:
		return bad("one of Config.Targets and Config.Allocator is required")
	case len(c.Targets) > 0 && c.Allocator != nil:
		return bad("Config.Targets (%d entries) and Config.Allocator are mutually exclusive", len(c.Targets))
	case c.TLS != nil && c.Allocator != nil:
		return bad("Config.TLS applies to Targets, not to an in-process Config.Allocator")
	}
	if err := checkTargets(c.Targets); err != nil {
		return err
	}
	if err := segment.ValidateOwner(c.Owner); err != nil {
		return bad("Config.Owner: %w", err)
	}
	switch {
	case c.Region < 0 || c.Region > snowflake.MaxRegion:
		return bad("Config.Region %d not in 0..%d", c.Region, snowflake.MaxRegion)
	case c.RefillInterval < time.Millisecond:
		return bad("Config.RefillInterval %v must be at least 1ms", c.RefillInterval)
	case c.Tuning.MinBlock < 1:
		return bad("tuning MinBlock %d must be at least 1", c.Tuning.MinBlock)
	case c.Tuning.MaxBlock < c.Tuning.MinBlock:
		return bad("tuning MaxBlock %d is below tuning MinBlock %d", c.Tuning.MaxBlock, c.Tuning.MinBlock)
	case int64(c.Tuning.MaxBlock) > segment.MaxBlockLimit:
		return bad("tuning MaxBlock %d exceeds the limit %d", c.Tuning.MaxBlock, segment.MaxBlockLimit)
	case c.Tuning.FixedBlock < 0 || int64(c.Tuning.FixedBlock) > segment.MaxBlockLimit:
		return bad("tuning FixedBlock %d not in 0..%d (0 = adaptive)", c.Tuning.FixedBlock, segment.MaxBlockLimit)
	case !(c.Tuning.PrefetchThreshold > 0 && c.Tuning.PrefetchThreshold <= 1): // also rejects NaN
		return bad("tuning PrefetchThreshold %v not in (0, 1]", c.Tuning.PrefetchThreshold)
	case c.Tuning.RPCTimeout < 0:
		return bad("tuning RPCTimeout %v is negative", c.Tuning.RPCTimeout)
	case c.SafetyMargin < 0:
		return bad("Config.SafetyMargin %v is negative", c.SafetyMargin)
	case c.Tuning.RenewPeriod < 0:
		return bad("tuning RenewPeriod %v is negative", c.Tuning.RenewPeriod)
	case c.Tuning.BackoffBase <= 0:
		return bad("tuning BackoffBase %v must be positive", c.Tuning.BackoffBase)
	case c.Codes < 0 || c.Codes > MaxCodes:
		return bad("Config.Codes %d not in 0..%d (0 = automatic)", c.Codes, MaxCodes)
	case c.Tuning.BackoffMax < c.Tuning.BackoffBase:
		return bad("tuning BackoffMax %v is below tuning BackoffBase %v", c.Tuning.BackoffMax, c.Tuning.BackoffBase)
	}
	return nil
}

// checkTargets accepts "host:port" entries, or one entry with a gRPC scheme.
func checkTargets(ts []string) error {
	for i, t := range ts {
		if strings.Contains(t, "://") {
			if len(ts) != 1 {
				return fmt.Errorf("Config.Targets[%d] %q has a scheme; a target with a scheme must be the only one: %w", i, t, ErrInvalidConfig)
			}
			continue
		}
		host, port, err := net.SplitHostPort(t)
		if err != nil {
			return fmt.Errorf("Config.Targets[%d] %q is not host:port: %v: %w", i, t, err, ErrInvalidConfig)
		}
		p, err := strconv.Atoi(port)
		if err != nil || p < 1 || p > 65535 {
			return fmt.Errorf("Config.Targets[%d] %q: port %q not in 1..65535: %w", i, t, port, ErrInvalidConfig)
		}
		if host == "" {
			return fmt.Errorf("Config.Targets[%d] %q has no host: %w", i, t, ErrInvalidConfig)
		}
	}
	return nil
}

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

// withDefaults returns t with zero fields replaced by their defaults.
func (t Tuning) withDefaults() Tuning {
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
