package benchrun

import (
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/client/engine"
	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Config configures a Run. Zero fields take the defaults above, except
// BurstSize and CPUHog, where 0 means none. Every field that rangesvc bench
// sets is one of its flags.
type Config struct {
	// Regions (1..4) and Workers per region (1..MaxWorkers). Each worker
	// is one rangeclient. Up to a region's 256 codes every worker holds a
	// code of its own (rangeclient Codes 1), as a fleet of separate
	// processes would. Beyond them (or for all workers with AutoCodes)
	// the many-clients mode starts: each region's replica serves the
	// shared path (its Next minter holds one code), the first
	// DedicatedWorkers() workers of a region keep a code each and the
	// rest use Codes 0 (automatic: the shared path, a code of their own
	// only when their rate needs one), over Conns gRPC connections per
	// region instead of one each.
	Regions, Workers int
	// AutoCodes gives every worker rangeclient Codes 0 (the shared path
	// unless its rate needs a code), however few workers there are.
	AutoCodes bool
	// Conns is the gRPC connections per region that the Codes-0 workers
	// share (10,000 connections would exhaust file descriptors; a real
	// host's clients would not each open one either). Default
	// DefaultConns. Workers with a code of their own keep one each.
	Conns int
	// SharedRate is the replicas' bound of the shared path per identity,
	// in IDs/s (rangesvc serve --shared-rate; every bench client is the
	// identity ""). 0: the service's default, or in the many-clients mode
	// 1.5 times the target rate per region if that is more, so the bound
	// (which meters the fleet, not the capacity) does not shape the run.
	SharedRate float64
	// Rate is the target aggregate IDs/s. Default 2,000,000.
	Rate float64
	// Duration of the paced run. Default 10 s.
	Duration time.Duration
	// Tick is each worker's pacing interval. Default DefaultTick up to
	// tickFleet workers in all, then proportionally longer up to
	// maxAutoTick, so the fleet's wake-ups stay near 16,000 a second
	// (40,000 at 10,000 workers): pacing is the load generator's own cost,
	// not the system's.
	Tick time.Duration
	// BurstSize IDs are asked for back to back by one worker every
	// BurstEvery (default 1 s); 0: no burst profile. DefaultBurstSize is
	// the burst docs/design.md budgets.
	BurstSize  int
	BurstEvery time.Duration
	// RefillInterval is the workers' rangeclient RefillInterval, the span
	// an adaptive block aims at (0: rangeclient's default).
	RefillInterval time.Duration
	// FixedBlock, PrefetchThreshold and RPCTimeout are the workers'
	// rangeclient tuning (0: rangeclient's defaults). FixedBlock > 0 pins
	// every block to that many units (Sweep varies it).
	FixedBlock        int
	PrefetchThreshold float64
	RPCTimeout        time.Duration
	// IdleTimeout is the workers' rangeclient idleness: after this long
	// without a minted ID a client stops refilling (0: rangeclient's
	// default, 30 s). A Codes-0 client counts as active from New on, so
	// until then it keeps renewing its shared run although it mints
	// nothing: shortening it shows what that costs a large fleet's setup.
	IdleTimeout time.Duration
	// EtcdPerRegion gives each region its own embedded etcd instead of one
	// shared by all.
	EtcdPerRegion bool
	// CPUHog is how many cores a child process keeps busy during the paced
	// run (0..MaxCPUHog()), so the overload case is reproducible instead of
	// depending on a busy machine. Default 0: no hog. The child is this
	// executable run again with HogSubcommand; it competes with the whole
	// process (etcd, services, clients, workers) as another program would,
	// and its CPU is not counted in Report.CPUCores.
	CPUHog int
	// Logger, if set, receives the regions' and the clients' logs.
	Logger *slog.Logger
	// SetupTimeout bounds the start of all clients. Default 2 min.
	SetupTimeout time.Duration
	// SetupConcurrency bounds concurrent client start-ups. Default 8.
	SetupConcurrency int
	// Progress, if set, receives a line every ProgressEvery (default 1 s).
	Progress      io.Writer
	ProgressEvery time.Duration
	// CPUProfile, if set, receives a CPU profile of the paced run
	// (runtime/pprof). Its samples carry a "role" label: "replica" (the
	// services and their Next minters), "etcd", "client" (the
	// rangeclients and their connections) and "pacer" (the load
	// generator); `go tool pprof -tags` shows each one's share.
	CPUProfile io.Writer
	// Sink is a test hook: it sees each batch of a worker's IDs before they
	// are verified and returns what is verified (a test plants a duplicate
	// this way). nil passes IDs through.
	Sink func(region, worker int, ids []snowflake.ID) []snowflake.ID
}

func (c Config) withDefaults() Config {
	if c.Regions == 0 {
		c.Regions = DefaultRegions
	}
	if c.Workers == 0 {
		c.Workers = DefaultWorkers
	}
	if c.Rate == 0 {
		c.Rate = DefaultRate
	}
	if c.Duration == 0 {
		c.Duration = DefaultDuration
	}
	if c.Tick == 0 {
		c.Tick = min(max(DefaultTick, DefaultTick*time.Duration(c.Regions*c.Workers)/tickFleet), maxAutoTick)
	}
	if c.SharedRate == 0 && c.manyClients() {
		c.SharedRate = max(service.DefaultSharedRate, 1.5*c.Rate/float64(c.Regions))
	}
	if c.BurstEvery == 0 {
		c.BurstEvery = DefaultBurstEvery
	}
	if c.SetupTimeout == 0 {
		c.SetupTimeout = 2 * time.Minute
	}
	if c.Conns == 0 {
		c.Conns = DefaultConns
	}
	if c.SetupConcurrency == 0 {
		c.SetupConcurrency = DefaultSetupConcurrency
	}
	if c.ProgressEvery == 0 {
		c.ProgressEvery = time.Second
	}
	if c.Progress == nil {
		c.Progress = io.Discard
	}
	return c
}

// Validate reports the first bad field (after defaults).
func (c Config) Validate() error {
	c = c.withDefaults()
	switch {
	case c.Regions < 1 || c.Regions > snowflake.MaxRegion+1:
		return errors.Newf("bench: Regions %d not in 1..%d", c.Regions, snowflake.MaxRegion+1)
	case c.Workers < 1 || c.Workers > MaxWorkers:
		return errors.Newf("bench: Workers %d not in 1..%d per region", c.Workers, MaxWorkers)
	case c.Conns < 1 || c.Conns > maxConns:
		return errors.Newf("bench: Conns %d not in 1..%d per region", c.Conns, maxConns)
	case c.SharedRate < 0:
		return errors.Newf("bench: SharedRate %v is negative (0: the service's default)", c.SharedRate)
	case !(c.Rate > 0) || c.Rate > 1e9:
		return errors.Newf("bench: Rate %v not in (0, 1e9] IDs/s", c.Rate)
	case c.Duration < 100*time.Millisecond || c.Duration > 24*time.Hour:
		return errors.Newf("bench: Duration %v not in 100ms..24h", c.Duration)
	case c.Tick < time.Millisecond || c.Tick > c.Duration:
		return errors.Newf("bench: Tick %v not in 1ms..Duration", c.Tick)
	case c.BurstSize < 0 || c.BurstSize > 1<<20:
		return errors.Newf("bench: BurstSize %d not in 0..%d", c.BurstSize, 1<<20)
	case c.BurstEvery < time.Millisecond:
		return errors.Newf("bench: BurstEvery %v below 1ms", c.BurstEvery)
	case c.SetupConcurrency < 1:
		return errors.Newf("bench: SetupConcurrency %d below 1", c.SetupConcurrency)
	case c.CPUHog < 0 || c.CPUHog > MaxCPUHog():
		return errors.Newf("bench: CPUHog %d not in 0..%d cores", c.CPUHog, MaxCPUHog())
	case c.ProgressEvery < 10*time.Millisecond:
		return errors.Newf("bench: ProgressEvery %v below 10ms", c.ProgressEvery)
	}
	// The workers' client settings (refill interval, tuning) are checked
	// where rangeclient checks them, for a worker of region 0.
	cc := c.baseClient()
	cc.Targets = []string{"127.0.0.1:1"}
	return cc.Validate()
}

// baseClient is the workers' client engine settings (tuning, logger),
// common to every worker.
func (c Config) baseClient() engine.Config {
	return engine.Config{RefillInterval: c.RefillInterval, Logger: c.Logger,
		Tuning: engine.Tuning{FixedBlock: c.FixedBlock, PrefetchThreshold: c.PrefetchThreshold, RPCTimeout: c.RPCTimeout,
			IdleTimeout: c.IdleTimeout}}
}

// codesPerRegion is how many worker codes a region has.
const codesPerRegion = snowflake.MaxWorker + 1

// SharedPath reports whether the run is in the many-clients mode: the
// replicas serve the shared path and some workers use Codes 0.
func (c Config) SharedPath() bool { return c.withDefaults().manyClients() }

// manyClients is SharedPath for a Config whose Workers default is applied
// (withDefaults uses it to pick the shared-path bound).
func (c Config) manyClients() bool { return c.AutoCodes || c.Workers > codesPerRegion }

// DedicatedWorkers is how many workers of each region hold a code of their
// own (Codes 1): all of them up to the region's 256 codes; in the
// many-clients mode the codes left by the replica's Next minter (255), or
// none with AutoCodes.
func (c Config) DedicatedWorkers() int {
	c = c.withDefaults()
	switch {
	case c.AutoCodes:
		return 0
	case c.Workers > codesPerRegion:
		return codesPerRegion - 1 // the replica's minter holds one
	}
	return c.Workers
}

// clientConfig is the rangeclient configuration of worker index of the
// region with code region. A worker with a code of its own dials addr
// itself (Codes 1); the others (Codes 0) use alloc, a connection of the
// region's pool.
func (c Config) clientConfig(addr string, alloc segment.Allocator, region, index int) engine.Config {
	cc := c.baseClient()
	if index < c.DedicatedWorkers() {
		cc.Targets = []string{addr}
		cc.Codes = 1
	} else {
		cc.Allocator = alloc
	}
	cc.Region = region
	cc.Owner = fmt.Sprintf("bench/r%d/%d", region, index)
	return cc
}

func etcdLayout(cfg Config) string {
	if cfg.EtcdPerRegion || cfg.Regions == 1 {
		return "one embedded etcd per region, fsync on"
	}
	return "one embedded etcd shared by all regions, fsync on"
}
