package engine

import (
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
)

// collector exports the client's atomic counters at scrape time, so the hot
// path pays nothing for metrics: minted IDs are derived from the blocks'
// cursors rather than counted per ID.
type collector struct {
	c             *Engine
	refillLatency prometheus.Histogram

	minted, refills, refillErrors, backpressure, discarded, stalls *prometheus.Desc
	acquisitions, renewals, renewalFailures, expiries, fenced      *prometheus.Desc
	overlaps, dropped                                              *prometheus.Desc
	clockRollbacks, bufferIDs, bufferSeconds, rate, leaseSafe      *prometheus.Desc
	serving, worker, shared                                        *prometheus.Desc
}

const (
	metricNamespace = "idrange"
	metricSubsystem = "client"
)

func newCollector(c *Engine) *collector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(prometheus.BuildFQName(metricNamespace, metricSubsystem, name), help, labels, nil)
	}
	return &collector{
		c: c,
		refillLatency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: metricNamespace, Subsystem: metricSubsystem,
			Name:    "refill_latency_seconds",
			Help:    "Round trip of block grant requests (successful or not).",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14), // 0.5 ms .. ~4 s
		}),
		minted:          d("ids_minted_total", "IDs handed out by Next/NextN."),
		refills:         d("refills_total", "Blocks granted by the service."),
		refillErrors:    d("refill_errors_total", "Block requests that failed (backpressure excluded)."),
		backpressure:    d("backpressure_total", "Block requests refused with backpressure (code at its 4,096 IDs/ms limit)."),
		discarded:       d("blocks_discarded_total", "Granted blocks dropped unused (lease changed or block expired on arrival)."),
		stalls:          d("stalls_total", "Next/NextN calls that had to wait for a block."),
		acquisitions:    d("lease_acquisitions_total", "Worker-code leases acquired."),
		renewals:        d("lease_renewals_total", "Successful lease renewals."),
		renewalFailures: d("lease_renewal_failures_total", "Failed lease renewals, fenced replies included."),
		expiries:        d("safety_deadline_expiries_total", "Times the local safety deadline passed without a renewal (minting stopped)."),
		fenced:          d("fenced_total", "Leases the service fenced (minting stopped at once)."),
		overlaps:        d("overlapping_blocks_total", "Granted blocks refused because they overlap one the client was granted before (nothing minted from them)."),
		dropped:         d("codes_dropped_total", "Leases given up because their code cannot be granted on safely (overlap, or its high-water mark went back)."),
		bufferIDs:       d("buffer_depth_ids", "Linear positions left in the current and next block."),
		bufferSeconds:   d("buffer_seconds", "How long the buffered blocks last at the observed rate."),
		rate:            d("rate_ids_per_second", "Observed minting rate (EWMA)."),
		leaseSafe:       d("lease_safe_seconds", "Time left before the local safety deadline (0 when the lease is not usable)."),
		serving:         d("serving", "1 when the client can mint without waiting, else 0."),
		worker:          d("lease_info", "The current lease's code and fencing token (value 1).", "region", "worker", "token"),
		shared:          d("shared", "1 while the client mints from shared runs (no worker code of its own), else 0."),
	}
}

// Describe implements prometheus.Collector.
func (m *collector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{m.minted, m.refills, m.refillErrors, m.backpressure, m.discarded, m.stalls,
		m.acquisitions, m.renewals, m.renewalFailures, m.expiries, m.fenced, m.overlaps, m.dropped,
		m.bufferIDs, m.bufferSeconds, m.rate, m.leaseSafe, m.serving, m.worker, m.shared} {
		ch <- d
	}
	m.refillLatency.Describe(ch)
}

// Collect implements prometheus.Collector.
func (m *collector) Collect(ch chan<- prometheus.Metric) {
	s := m.c.Stats()
	counter := func(d *prometheus.Desc, v float64) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.CounterValue, v)
	}
	gauge := func(d *prometheus.Desc, v float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(d, prometheus.GaugeValue, v, labels...)
	}
	counter(m.minted, float64(s.Minted))
	counter(m.refills, float64(s.Refills))
	counter(m.refillErrors, float64(s.RefillErrors))
	counter(m.backpressure, float64(s.Backpressure))
	counter(m.discarded, float64(s.Discarded))
	counter(m.stalls, float64(s.Stalls))
	counter(m.acquisitions, float64(s.Acquisitions))
	counter(m.renewals, float64(s.Renewals))
	counter(m.renewalFailures, float64(s.RenewalFailures))
	counter(m.expiries, float64(s.Expiries))
	counter(m.fenced, float64(s.Fenced))
	counter(m.overlaps, float64(s.Overlaps))
	counter(m.dropped, float64(s.DroppedCodes))
	gauge(m.bufferIDs, float64(s.BufferedIDs))
	gauge(m.bufferSeconds, s.BufferedFor.Seconds())
	gauge(m.rate, s.Rate)
	li := m.c.Lease()
	shared := 0.0
	if li.Shared {
		shared = 1
	} else {
		// A shared-path client has no lease: no safe time to report.
		gauge(m.leaseSafe, li.SafeFor.Seconds())
	}
	gauge(m.shared, shared)
	serving := 0.0
	if m.c.Health() == nil {
		serving = 1
	}
	gauge(m.serving, serving)
	if li.Err == nil && !li.Shared {
		gauge(m.worker, 1, itoa(li.Lease.Region), itoa(li.Lease.Worker), itoa64(li.Lease.Token))
	}
	m.refillLatency.Collect(ch)
}

func itoa(v int) string     { return strconv.Itoa(v) }
func itoa64(v int64) string { return strconv.FormatInt(v, 10) }
