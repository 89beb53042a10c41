// This file holds a small log-linear latency histogram in the style of
// HdrHistogram: every power of two is split into 128 linear sub-buckets, so
// any recorded value is reported within 1/128 (< 0.8%) of its true value,
// from 1 ns to about 68 s, in a fixed 30 KiB of counters.
//
// Recording is one bits.Len64, a shift and an increment: cheap enough to
// time every ID a load generator mints. A Histogram is not safe for
// concurrent use; give each goroutine its own and Merge them at the end
// (that is also what keeps the hot path free of shared cache lines).

package measure

import (
	"math"
	"math/bits"
	"time"
)

const (
	subBits    = 7
	subCount   = 1 << subBits // sub-buckets per power of two
	linearTop  = 2 * subCount // values below this have their own bucket
	maxBits    = 36           // largest trackable value is 2^36-1 ns (~68.7 s)
	numBuckets = linearTop + (maxBits-subBits-1)*subCount
	// MaxTrackable is the largest value stored with full precision; larger
	// values land in the top bucket (Max still reports them exactly).
	MaxTrackable = time.Duration(1<<maxBits - 1)
)

// Histogram counts durations (in nanoseconds). The zero value is empty and
// ready to use.
type Histogram struct {
	counts [numBuckets]uint64
	n      uint64
	sum    float64
	min    int64
	max    int64
}

// NewHistogram returns an empty histogram.
func NewHistogram() *Histogram { return &Histogram{} }

func index(v int64) int {
	if v < linearTop {
		if v < 0 {
			return 0
		}
		return int(v)
	}
	if v > int64(MaxTrackable) {
		v = int64(MaxTrackable)
	}
	shift := bits.Len64(uint64(v)) - (subBits + 1)
	return linearTop + (shift-1)*subCount + int(uint64(v)>>shift) - subCount
}

// lowest and highest value that fall in bucket i.
func bounds(i int) (lo, hi int64) {
	if i < linearTop {
		return int64(i), int64(i)
	}
	shift := (i-linearTop)/subCount + 1
	m := int64((i-linearTop)%subCount + subCount)
	return m << shift, (m+1)<<shift - 1
}

// Record adds one observation. Negative durations count as 0.
func (h *Histogram) Record(d time.Duration) { h.RecordN(d, 1) }

// RecordN adds n observations of the same duration (a batch whose IDs all
// waited d).
func (h *Histogram) RecordN(d time.Duration, n uint64) {
	if n == 0 {
		return
	}
	v := max(int64(d), 0)
	h.counts[index(v)] += n
	if h.n == 0 || v < h.min {
		h.min = v
	}
	if v > h.max {
		h.max = v
	}
	h.n += n
	h.sum += float64(v) * float64(n)
}

// Merge adds every observation of o to h.
func (h *Histogram) Merge(o *Histogram) {
	if o.n == 0 {
		return
	}
	for i, c := range o.counts {
		h.counts[i] += c
	}
	if h.n == 0 || o.min < h.min {
		h.min = o.min
	}
	h.max = max(h.max, o.max)
	h.n += o.n
	h.sum += o.sum
}

// Subtract removes o's observations from h, where o is an earlier copy of
// h (so every bucket of o is at most h's): the result describes what was
// recorded after the copy. Min and Max stay h's (they cannot be undone),
// the mean is adjusted.
func (h *Histogram) Subtract(o *Histogram) {
	if o.n == 0 {
		return
	}
	var n uint64
	for i, c := range o.counts {
		h.counts[i] -= min(c, h.counts[i])
		n += h.counts[i]
	}
	h.n = n
	h.sum = max(h.sum-o.sum, 0)
	if n == 0 {
		h.min, h.max = 0, 0
	}
}

// Reset empties the histogram.
func (h *Histogram) Reset() { *h = Histogram{} }

// Count is the number of observations.
func (h *Histogram) Count() uint64 { return h.n }

// Min and Max are the exact extreme observations (0 when empty).
func (h *Histogram) Min() time.Duration { return time.Duration(h.min) }

// Max is the largest observation, exact even above MaxTrackable.
func (h *Histogram) Max() time.Duration { return time.Duration(h.max) }

// Mean is the exact mean of the observations.
func (h *Histogram) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Quantile returns the value at quantile q in [0, 1]: the highest value of
// the bucket holding the ceil(q*n)-th smallest observation, clamped to
// [Min, Max]. So it never under-reports by more than the bucket width
// (< 0.8%) and Quantile(1) == Max.
func (h *Histogram) Quantile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if math.IsNaN(q) || q <= 0 {
		return time.Duration(h.min)
	}
	if q >= 1 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q * float64(h.n)))
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			_, hi := bounds(i)
			return time.Duration(min(max(hi, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}

// Summary is the usual set of latency figures.
type Summary struct {
	Count uint64        `json:"count"`
	Mean  time.Duration `json:"mean_ns"`
	P50   time.Duration `json:"p50_ns"`
	P99   time.Duration `json:"p99_ns"`
	P999  time.Duration `json:"p999_ns"`
	Max   time.Duration `json:"max_ns"`
}

// Summary returns count, mean, p50, p99, p99.9 and max.
func (h *Histogram) Summary() Summary {
	return Summary{
		Count: h.n,
		Mean:  h.Mean(),
		P50:   h.Quantile(0.50),
		P99:   h.Quantile(0.99),
		P999:  h.Quantile(0.999),
		Max:   h.Max(),
	}
}
