package rangeclient

import (
	"crypto/tls"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/segment"
)

// MaxCodes bounds Config.Codes: 16 codes are 65M IDs/s, far beyond what one
// process can use, and a region has only 256 codes for its whole fleet.
const MaxCodes = engine.MaxCodes

// Defaults for Config fields left zero.
const (
	// DefaultRefillInterval is the span of time one block should last: with
	// the time-following cursor a block of n linear units lives about
	// n/4096 ms whatever the rate, so 1 s is 4,096,000 units.
	DefaultRefillInterval = engine.DefaultRefillInterval
	// DefaultSafetyMargin is subtracted from the granted TTL for the safety
	// deadline. It covers clock-rate differences between this host and the
	// etcd leader and the client's own detection delay.
	DefaultSafetyMargin = engine.DefaultSafetyMargin
)

// Config configures a Client. Exactly one of Targets and Allocator is
// required; every other field has a documented default for its zero value.
type Config struct {
	// Targets are the gRPC addresses ("host:port") of the region's rangesvc
	// replicas, one connection each. The client sends every call to one
	// replica (picked at random, which spreads a fleet) and moves to the
	// next when a call finds it unavailable or slow, retrying the call
	// there at once; connections reconnect with exponential backoff
	// (BackoffBase..BackoffMax). A single entry with a scheme
	// ("dns:///rangesvc.internal:7070") is one gRPC connection balancing
	// round_robin over what the name resolves to.
	Targets []string
	// TLS, if set, secures the connections to Targets with it (the server
	// is verified against its RootCAs and ServerName; a certificate in it
	// is presented for mutual TLS). nil connects in plaintext, for a
	// service on loopback or inside a trusted network. The tlsfiles
	// package builds one from PEM files and re-reads the client
	// certificate when it is rotated:
	//
	//	tc, err := tlsfiles.Files{Cert: "client.crt", Key: "client.key", CA: "ca.crt"}.ClientConfig()
	//	cfg := rangeclient.Config{Targets: targets, TLS: tc}
	//
	// The Client uses tc as given and does not modify it.
	TLS *tls.Config
	// DialOptions are appended to the client's own gRPC options (transport
	// credentials from TLS, the resolver, backoff): options given later
	// win.
	DialOptions []grpc.DialOption
	// Allocator is an in-process range service (the service's own Next RPC,
	// tests, benchmarks). Mutually exclusive with Targets. Close does not
	// close it.
	Allocator segment.Allocator

	// Region is the region code (0..3) of the worker-code lease. With
	// Targets, zero means "the region the service serves": New asks a
	// replica (the GetReplicaInfo RPC) before acquiring the lease, and
	// Lease reports the answer. A non-zero Region is checked against the
	// answer; a mismatch fails New with ErrInvalidConfig. (To insist on
	// region 0, check Lease().Lease.Region after New.) Learning the region
	// is safe: uniqueness never depends on the region being the one the
	// caller expected, because the code is leased, and its IDs minted, in
	// the replica's own region, whose service keeps one owner per code.
	// With Allocator, Region is used as given (default 0). A replica too
	// old to answer leaves Region as given; the service refuses a lease for
	// a region it does not serve.
	Region int
	// Codes is how many worker codes the client holds (at most MaxCodes).
	//
	// 0 (the default) chooses by itself: over a service that serves the
	// shared path (rangesvc's AllocateShared; any gRPC Targets of a
	// current rangesvc) the client holds no code at all and mints from
	// runs the replicas carve out of their own codes, so a region serves
	// any number of such clients, not 256; when its rate stays above
	// DedicatedRate (32,768 IDs/s) it takes a code of its own, and while
	// the region has no free code (or the identity is at its cap) it stays
	// on the shared path and tries again later, so New never waits for a
	// code. IDs from shared runs may lag the clock by up to 1 s (never
	// more) where a code's IDs follow it. With an Allocator or service
	// without the shared path, 0 holds one code, as 1 does. See the
	// package doc, "The shared path".
	//
	// 1 or more holds that many codes from New on, and never uses the
	// shared path. One code mints at most 4,096 IDs per millisecond; with
	// several, Next, NextN and AppendN spread their calls over the codes (a
	// random code per call: no shared lock, no shared counter), so one
	// Client sustains Codes x 4.096M IDs/s with IDs that follow the clock
	// instead of running ahead of it. Each code has its own lease, blocks
	// and reserve, and recovers on its own. IDs of one code increase; IDs
	// of different codes interleave within a millisecond (they stay unique
	// and time-ordered to the millisecond). Every code is one of the
	// region's 256: hold only as many as the rate needs.
	Codes int
	// Owner is free text recorded with the lease for operators. Default:
	// "hostname/pid". At most 256 bytes of UTF-8.
	Owner string

	// RefillInterval is how long a block should last at steady state
	// (default 1 s). The adaptive block size is RefillInterval in ms x 4,096
	// units, grown when the client mints faster than 4,096 IDs/ms (see the
	// package doc), clamped to [MinBlock, MaxBlock].
	RefillInterval time.Duration
	// MaxReserve caps the reserve: how far ahead of the clock the client
	// keeps granted span. By default (0) the reserve reaches one renewal
	// period and four refill latencies past the lease's safety deadline, so
	// an outage of the service or etcd shorter than the safe interval costs
	// no minting at all (up to 5 minutes ahead, whatever the TTL); the price
	// is that the code's high-water mark runs that far ahead of the clock
	// (about TTL - SafetyMargin + RenewPeriod: 13 s with the defaults), so
	// a successor of a crashed client mints timestamps up to that far ahead
	// (package doc, "Reserve"). A positive
	// value keeps the reserve (and that lead) at most this long; a negative
	// value turns it off: blocks are then fetched only as the current one
	// runs low, as PrefetchThreshold says.
	MaxReserve time.Duration
	// SafetyMargin is subtracted from the TTL the service grants: the local
	// safety deadline is (monotonic time the successful renewal was sent) +
	// TTL - SafetyMargin. Default 1 s. It must leave room for at least one
	// renewal: New fails if TTL - SafetyMargin <= RenewPeriod.
	SafetyMargin time.Duration
	// Registerer receives the client's Prometheus metrics (namespace idrange,
	// subsystem client); nil means no metrics. Several clients in one process
	// need distinct labels: wrap it with prometheus.WrapRegistererWith.
	// Close unregisters them.
	Registerer prometheus.Registerer
	// Logger receives lease and refill events; nil discards them.
	Logger *slog.Logger
}

// Validate reports the first field of c (after defaults) that is out of
// range, wrapping ErrInvalidConfig with the field's name and value.
func (c Config) Validate() error { return c.engine().Validate() }

// engine is c as the engine's configuration, with the engine's default
// tuning.
func (c Config) engine() engine.Config {
	return engine.Config{
		Targets:        c.Targets,
		TLS:            c.TLS,
		DialOptions:    c.DialOptions,
		Allocator:      c.Allocator,
		Region:         c.Region,
		Codes:          c.Codes,
		Owner:          c.Owner,
		RefillInterval: c.RefillInterval,
		MaxReserve:     c.MaxReserve,
		SafetyMargin:   c.SafetyMargin,
		Registerer:     c.Registerer,
		Logger:         c.Logger,
	}
}
