package service

import (
	"strconv"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Namespace and Subsystem of every service metric: idrange_service_*.
const (
	Namespace = "idrange"
	Subsystem = "service"
)

// Metrics are the range service's Prometheus metrics. Fields are exported so
// tests and the store's observer can read or feed them.
type Metrics struct {
	// BlockGrants counts blocks granted (idrange_service_block_grants_total).
	BlockGrants prometheus.Counter
	// BlockSize is the size of granted blocks in IDs (L units)
	// (idrange_service_block_grant_size).
	BlockSize prometheus.Histogram
	// GrantLatency is the store time of a successful grant
	// (idrange_service_block_grant_latency_seconds).
	GrantLatency prometheus.Histogram
	// GrantConflicts counts grant transactions that lost a race on the HWM
	// revision to another caller or replica and were retried
	// (idrange_service_grant_conflicts_total); fed by the store's Observer.
	GrantConflicts prometheus.Counter
	// CorruptValues counts stored values that did not decode
	// (idrange_service_corrupt_values_total); fed by the store's Observer.
	// Any increase needs an operator.
	CorruptValues prometheus.Counter
	// HWMRegressions counts codes whose stored high-water mark was found
	// below one this replica had committed or read (the store went back),
	// once each time a code becomes refused
	// (idrange_service_hwm_regressions_total{region}); fed by the store's
	// Observer. Any increase needs an operator.
	HWMRegressions *prometheus.CounterVec
	// HWMRegressedCodes is the number of codes refused now because their
	// mark went back (idrange_service_hwm_regressed_codes{region}); it
	// falls when a mark is lifted again (restore fence).
	HWMRegressedCodes *prometheus.GaugeVec
	// LeaseAcquisitions counts leases granted (idrange_service_lease_acquisitions_total).
	LeaseAcquisitions prometheus.Counter
	// LeaseAcquireFailures counts refused acquisitions, including no free
	// code (idrange_service_lease_acquire_failures_total).
	LeaseAcquireFailures prometheus.Counter
	// LeaseRenewals counts renewal requests (idrange_service_lease_renewals_total).
	LeaseRenewals prometheus.Counter
	// LeaseRenewalFailures counts failed renewals (idrange_service_lease_renewal_failures_total).
	LeaseRenewalFailures prometheus.Counter
	// LeaseReleases counts released leases (idrange_service_lease_releases_total).
	LeaseReleases prometheus.Counter
	// FreeCodes is the number of unleased worker codes per region
	// (idrange_service_free_worker_codes{region}).
	FreeCodes *prometheus.GaugeVec
	// HWMLead is how far the last granted block's end runs ahead of the
	// service clock, in seconds (idrange_service_hwm_lead_seconds). Near
	// MaxLead means the code is at its 4,096/ms limit or the clock is behind.
	HWMLead prometheus.Gauge
	// ClockRollbackMs is how far the service clock is behind the highest
	// time it has seen, in ms (idrange_service_clock_rollback_ms).
	ClockRollbackMs prometheus.Gauge
	// RemainingEpochLife is snowflake.RemainingLife at the service clock, in
	// seconds (idrange_service_remaining_epoch_life_seconds).
	RemainingEpochLife prometheus.GaugeFunc
	// Errors counts failed RPCs by method and gRPC code
	// (idrange_service_errors_total{method,code}).
	Errors *prometheus.CounterVec
	// Serving is 1 while the health status is SERVING (idrange_service_serving).
	Serving prometheus.Gauge
	// MintedIDs counts the IDs handed out by MintBatch and Next
	// (idrange_service_minted_ids_total); a refused or failed call adds 0.
	MintedIDs prometheus.Counter
	// LeaseTTL is the worker-code lease TTL the store grants, in seconds
	// (idrange_service_lease_ttl_seconds); set by SetStoreConfig, 0 until
	// then. Alerts compare grant latency with it: a grant that takes a
	// sizeable part of the TTL eats the clients' reserve.
	LeaseTTL prometheus.Gauge
	// MaxLead is the grant policy's MaxLead, in seconds
	// (idrange_service_max_lead_seconds); set by SetStoreConfig. A
	// hwm_lead_seconds near it means the next grants on that code are
	// refused with backpressure.
	MaxLead prometheus.Gauge

	// The shared path (AllocateShared).
	//
	// SharedGrants counts AllocateShared calls by outcome, "granted" or
	// "refused" (idrange_service_shared_grants_total{outcome}).
	SharedGrants *prometheus.CounterVec
	// SharedIDs counts the positions granted in shared runs
	// (idrange_service_shared_ids_total).
	SharedIDs prometheus.Counter
	// SharedRefused counts refused AllocateShared calls by reason:
	// rate_limited (the identity is over --shared-rate), fair_share (the
	// replica's bound for all callers, --shared-rate-total, is spent and
	// the identity is at or above its fair share), lead (every code of the
	// replica's minter is 1 s ahead of the clock), unavailable (the
	// replica's minter cannot carve now), no_minter, off (--shared-rate
	// 0), invalid, error (idrange_service_shared_refused_total{reason}).
	// MintBatch and Next refused for the fair share or the lead count in
	// errors_total{code="ResourceExhausted"}.
	SharedRefused *prometheus.CounterVec
	// SharedClients is the number of distinct client_ids granted a run in
	// the last minute (idrange_service_shared_clients).
	SharedClients prometheus.Gauge
	// SharedRateLimit is the configured bound per identity, in IDs/s
	// (idrange_service_shared_rate_limit_ids_per_second; 0 when the shared
	// path is off).
	SharedRateLimit prometheus.Gauge
	// SharedUsage is the busiest identity's shared rate (over about 10 s)
	// divided by the bound (idrange_service_shared_usage_ratio): near 1
	// its clients are being refused.
	SharedUsage prometheus.Gauge
	// SharedRateTotal is the configured bound for all identities
	// together, in IDs/s (idrange_service_shared_rate_total_ids_per_second).
	SharedRateTotal prometheus.Gauge
	// SharedIdentities counts the identities by class
	// (idrange_service_shared_identities{class}): "active", those that
	// took IDs from the replica's codes in about the last second, among
	// which the aggregate bound is shared when it is spent. No series
	// names an identity or a client_id.
	SharedIdentities prometheus.Gauge

	// The replica's own minter (internal/server/mintpool).
	//
	// MinterCodes is the number of worker codes it holds
	// (idrange_service_minter_codes), MinterLead how far ahead of the
	// clock its least advanced code is (idrange_service_minter_lead_seconds:
	// at 1 s callers get backpressure), MinterDemand the IDs/s it hands
	// out (idrange_service_minter_demand_ids_per_second).
	MinterCodes, MinterLead, MinterDemand prometheus.Gauge
}

// NewMetrics creates the metrics and registers them on reg (nil: none).
// clk is read by the remaining-epoch-life gauge at scrape time.
func NewMetrics(reg prometheus.Registerer, clk func() time.Time) (*Metrics, error) {
	if clk == nil {
		clk = time.Now
	}
	o := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: Namespace, Subsystem: Subsystem, Name: name, Help: help}
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts(o(name, help)))
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts(o(name, help)))
	}
	m := &Metrics{
		BlockGrants: counter("block_grants_total", "Blocks granted."),
		BlockSize: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem, Name: "block_grant_size",
			Help:    "Size of granted blocks in IDs (linear units; 4096 = 1 ms of span).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 14),
		}),
		GrantLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: Namespace, Subsystem: Subsystem, Name: "block_grant_latency_seconds",
			Help:    "Time to grant a block, including the etcd transaction.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14),
		}),
		GrantConflicts: counter("grant_conflicts_total", "Grant transactions that lost a race on the HWM revision and were retried."),
		CorruptValues:  counter("corrupt_values_total", "Stored etcd values that did not decode (grants on that code stop)."),
		HWMRegressions: prometheus.NewCounterVec(prometheus.CounterOpts(o("hwm_regressions_total",
			"Codes found with a stored high-water mark below one this replica committed or read (grants on them stop).")), []string{"region"}),
		HWMRegressedCodes: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("hwm_regressed_codes",
			"Codes refused now because their stored high-water mark went back.")), []string{"region"}),
		LeaseAcquisitions:    counter("lease_acquisitions_total", "Worker-code leases granted."),
		LeaseAcquireFailures: counter("lease_acquire_failures_total", "Refused lease acquisitions (including no free code)."),
		LeaseRenewals:        counter("lease_renewals_total", "Lease renewal requests."),
		LeaseRenewalFailures: counter("lease_renewal_failures_total", "Failed lease renewals."),
		LeaseReleases:        counter("lease_releases_total", "Leases released."),
		FreeCodes: prometheus.NewGaugeVec(prometheus.GaugeOpts(o("free_worker_codes",
			"Unleased worker codes per region.")), []string{"region"}),
		HWMLead:         gauge("hwm_lead_seconds", "How far the last granted block's end runs ahead of the service clock."),
		ClockRollbackMs: gauge("clock_rollback_ms", "How far the service clock is behind the highest time it has seen (0 when not rolled back)."),
		RemainingEpochLife: prometheus.NewGaugeFunc(prometheus.GaugeOpts(o("remaining_epoch_life_seconds",
			"Time left until the 41-bit timestamp is exhausted.")), func() float64 {
			return snowflake.RemainingLife(clk()).Seconds()
		}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts(o("errors_total",
			"Failed RPCs by method and gRPC status code.")), []string{"method", "code"}),
		Serving:   gauge("serving", "1 while the replica reports SERVING on the health service."),
		MintedIDs: counter("minted_ids_total", "IDs handed out by MintBatch and Next (the replica's own minter)."),
		LeaseTTL:  gauge("lease_ttl_seconds", "Worker-code lease TTL the store grants."),
		MaxLead:   gauge("max_lead_seconds", "How far a grant may run ahead of the service clock before backpressure (the grant policy's MaxLead)."),
		SharedGrants: prometheus.NewCounterVec(prometheus.CounterOpts(o("shared_grants_total",
			"AllocateShared calls by outcome (granted, refused).")), []string{"outcome"}),
		SharedIDs: counter("shared_ids_total", "Positions granted in shared runs (AllocateShared)."),
		SharedRefused: prometheus.NewCounterVec(prometheus.CounterOpts(o("shared_refused_total",
			"Refused AllocateShared calls by reason (rate_limited, fair_share, lead, unavailable, no_minter, off, invalid, error).")), []string{"reason"}),
		SharedClients:   gauge("shared_clients", "Distinct client_ids granted a shared run in the last minute."),
		SharedRateLimit: gauge("shared_rate_limit_ids_per_second", "The shared path's bound per caller identity, in IDs/s (0: the shared path is off)."),
		SharedUsage:     gauge("shared_usage_ratio", "The busiest identity's shared rate (about 10 s) over the bound: near 1, its clients are refused."),
		SharedRateTotal: gauge("shared_rate_total_ids_per_second", "The bound for all identities together on the replica's own codes (shared runs, MintBatch, Next), in IDs/s (0: the shared path is off)."),
		SharedIdentities: func() prometheus.Gauge {
			opts := prometheus.GaugeOpts(o("shared_identities", "Identities taking IDs from the replica's own codes, by class (active: in about the last second)."))
			opts.ConstLabels = prometheus.Labels{"class": "active"}
			return prometheus.NewGauge(opts)
		}(),
		MinterCodes:  gauge("minter_codes", "Worker codes the replica's own minter holds (MintBatch, Next, the shared path)."),
		MinterLead:   gauge("minter_lead_seconds", "How far ahead of the clock the replica's least advanced own code is; at 1 s callers get backpressure."),
		MinterDemand: gauge("minter_demand_ids_per_second", "IDs/s the replica's own minter hands out (shared runs, MintBatch, Next)."),
	}
	for _, o := range []string{"granted", "refused"} {
		m.SharedGrants.WithLabelValues(o)
	}
	for _, r := range []string{sharedOff, sharedRateLimited, sharedFairShare, sharedLead, sharedUnavailable, sharedNoMinter, sharedInvalid, sharedOther} {
		m.SharedRefused.WithLabelValues(r)
	}
	// Create the error series that matter for alerts up front, so they
	// scrape as 0 (and rate() works) before the first failure.
	for _, method := range []string{"AcquireLease", "RenewLease", "ReleaseLease", "AllocateBlock", "MintBatch", "Next", "AllocateShared", "AllocateSharedBatch"} {
		for _, code := range []codes.Code{codes.InvalidArgument, codes.FailedPrecondition, codes.ResourceExhausted,
			codes.Unavailable, codes.DataLoss, codes.OutOfRange, codes.Internal} {
			m.Errors.WithLabelValues(method, code.String())
		}
	}
	if reg != nil {
		for _, c := range m.collectors() {
			if err := reg.Register(c); err != nil {
				return nil, errors.Newf("service: register metrics: %w", err)
			}
		}
	}
	return m, nil
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.BlockGrants, m.BlockSize, m.GrantLatency, m.GrantConflicts,
		m.CorruptValues, m.HWMRegressions, m.HWMRegressedCodes, m.LeaseAcquisitions, m.LeaseAcquireFailures, m.LeaseRenewals,
		m.LeaseRenewalFailures, m.LeaseReleases, m.FreeCodes, m.HWMLead, m.ClockRollbackMs,
		m.RemainingEpochLife, m.Errors, m.Serving, m.MintedIDs, m.LeaseTTL, m.MaxLead,
		m.SharedGrants, m.SharedIDs, m.SharedRefused, m.SharedClients, m.SharedRateLimit, m.SharedUsage,
		m.SharedRateTotal, m.SharedIdentities, m.MinterCodes, m.MinterLead, m.MinterDemand}
}

// SetStoreConfig exports the store's lease TTL and grant policy (pass
// store.Store.Config, defaults applied) as lease_ttl_seconds and
// max_lead_seconds, the scales alerts measure grant latency and HWM lead
// against.
func (m *Metrics) SetStoreConfig(cfg store.Config) {
	m.LeaseTTL.Set(cfg.LeaseTTL.Seconds())
	m.MaxLead.Set(cfg.Policy.MaxLead.Seconds())
}

// observeGrant records one successful grant at service time now.
func (m *Metrics) observeGrant(b segment.Block, took time.Duration, now time.Time) {
	m.BlockGrants.Inc()
	m.BlockSize.Observe(float64(b.Len()))
	m.GrantLatency.Observe(took.Seconds())
	endMs := (b.Hi - 1) >> snowflake.SequenceBits
	leadMs := endMs - snowflake.MsSince(now)
	m.HWMLead.Set(float64(leadMs) / 1000)
}

func regionLabel(r int) string { return strconv.Itoa(r) }

// MetricNames are the fully qualified names of every metric NewMetrics
// registers (for tests and dashboards).
var MetricNames = []string{
	"idrange_service_block_grants_total",
	"idrange_service_block_grant_size",
	"idrange_service_block_grant_latency_seconds",
	"idrange_service_grant_conflicts_total",
	"idrange_service_corrupt_values_total",
	"idrange_service_hwm_regressions_total",
	"idrange_service_hwm_regressed_codes",
	"idrange_service_lease_acquisitions_total",
	"idrange_service_lease_acquire_failures_total",
	"idrange_service_lease_renewals_total",
	"idrange_service_lease_renewal_failures_total",
	"idrange_service_lease_releases_total",
	"idrange_service_free_worker_codes",
	"idrange_service_hwm_lead_seconds",
	"idrange_service_clock_rollback_ms",
	"idrange_service_remaining_epoch_life_seconds",
	"idrange_service_errors_total",
	"idrange_service_serving",
	"idrange_service_minted_ids_total",
	"idrange_service_lease_ttl_seconds",
	"idrange_service_max_lead_seconds",
	"idrange_service_shared_grants_total",
	"idrange_service_shared_ids_total",
	"idrange_service_shared_refused_total",
	"idrange_service_shared_clients",
	"idrange_service_shared_rate_limit_ids_per_second",
	"idrange_service_shared_usage_ratio",
}

// StoreObserver returns a store.Observer that feeds m with the events
// only the store sees: HWM races (grant_conflicts_total), corrupt values
// (corrupt_values_total) and marks that went back (hwm_regressions_total,
// hwm_regressed_codes). Grants, leases and renewals are counted by the RPC
// handlers, so RPC-level numbers are not doubled.
func (m *Metrics) StoreObserver() store.Observer { return storeObserver{m: m} }

type storeObserver struct {
	store.NopObserver
	m *Metrics
}

func (o storeObserver) Conflict(int, int)     { o.m.GrantConflicts.Inc() }
func (o storeObserver) Corrupt(string, error) { o.m.CorruptValues.Inc() }
func (o storeObserver) HighWaterRegressed(region, _ int, _, _ int64) {
	o.m.HWMRegressions.WithLabelValues(regionLabel(region)).Inc()
	o.m.HWMRegressedCodes.WithLabelValues(regionLabel(region)).Inc()
}
func (o storeObserver) HighWaterRecovered(region, _ int) {
	o.m.HWMRegressedCodes.WithLabelValues(regionLabel(region)).Dec()
}

// initRegion creates region's series of the labelled store metrics, so they
// scrape as 0 (and increase() works) before the first event.
func (m *Metrics) initRegion(region int) {
	m.HWMRegressions.WithLabelValues(regionLabel(region))
	m.HWMRegressedCodes.WithLabelValues(regionLabel(region))
}
