package measure

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

func TestBucketsCoverEveryValueContiguously(t *testing.T) {
	// Every bucket's range starts right after the previous one ends, and
	// index maps each bound back to its bucket.
	prevHi := int64(-1)
	for i := range numBuckets {
		lo, hi := bounds(i)
		if lo != prevHi+1 || hi < lo {
			t.Fatalf("bucket %d = [%d, %d], previous ended at %d", i, lo, hi, prevHi)
		}
		if index(lo) != i || index(hi) != i {
			t.Fatalf("bucket %d = [%d, %d]: index(lo)=%d index(hi)=%d", i, lo, hi, index(lo), index(hi))
		}
		if w := hi - lo + 1; lo >= linearTop && float64(w)/float64(lo) > 1.0/subCount {
			t.Fatalf("bucket %d width %d is more than 1/%d of %d", i, w, subCount, lo)
		}
		prevHi = hi
	}
	if prevHi != int64(MaxTrackable) {
		t.Fatalf("top bucket ends at %d, want %d", prevHi, int64(MaxTrackable))
	}
}

func TestQuantilesMatchExactWithinPrecision(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var h Histogram
	vals := make([]int64, 100000)
	for i := range vals {
		// log-uniform from 10 ns to 10 s, like real latencies
		v := int64(10 * math.Pow(1e9, r.Float64()))
		vals[i] = v
		h.Record(time.Duration(v))
	}
	slices.Sort(vals)
	for _, q := range []float64{0.5, 0.9, 0.99, 0.999} {
		exact := vals[int(q*float64(len(vals)))-1]
		got := int64(h.Quantile(q))
		if got < exact || float64(got-exact) > float64(exact)/subCount+1 {
			t.Errorf("q%v: got %d, exact %d (allowed +%.2f%%)", q, got, exact, 100.0/subCount)
		}
	}
	if h.Max() != time.Duration(vals[len(vals)-1]) || h.Min() != time.Duration(vals[0]) {
		t.Errorf("min/max %v/%v, want %v/%v", h.Min(), h.Max(), vals[0], vals[len(vals)-1])
	}
	if h.Quantile(1) != h.Max() || h.Count() != uint64(len(vals)) {
		t.Errorf("Quantile(1)=%v Max=%v count=%d", h.Quantile(1), h.Max(), h.Count())
	}
}

func TestMergeAndHugeValues(t *testing.T) {
	var a, b Histogram
	a.RecordN(time.Millisecond, 999)
	b.Record(2 * time.Minute) // above MaxTrackable
	a.Merge(&b)
	if a.Count() != 1000 || a.Max() != 2*time.Minute {
		t.Fatalf("count %d max %v", a.Count(), a.Max())
	}
	if p := a.Quantile(0.5); p < time.Millisecond || p > time.Millisecond+time.Millisecond/subCount {
		t.Fatalf("p50 %v", p)
	}
	if p := a.Quantile(0.9999); p != MaxTrackable {
		t.Fatalf("p99.99 %v, want clamp to MaxTrackable %v", p, MaxTrackable)
	}
	s := a.Summary()
	if s.P50 > s.P99 || s.P99 > s.P999 || s.P999 > s.Max {
		t.Fatalf("summary not monotone: %+v", s)
	}
	var empty Histogram
	if empty.Quantile(0.99) != 0 || empty.Mean() != 0 {
		t.Fatal("empty histogram must report zeros")
	}
}

func TestSubtractLeavesTheLaterObservations(t *testing.T) {
	var h Histogram
	h.RecordN(time.Microsecond, 100)
	before := NewHistogram()
	before.Merge(&h)
	h.RecordN(time.Second, 10)
	h.Subtract(before)
	if h.Count() != 10 || h.Quantile(0.5) < time.Second || h.Quantile(0.5) > time.Second+time.Second/subCount {
		t.Fatalf("after Subtract: count %d, p50 %v", h.Count(), h.Quantile(0.5))
	}
	if m := h.Mean(); m < time.Second*99/100 || m > time.Second*101/100 {
		t.Fatalf("mean %v", m)
	}
	h.Subtract(&h)
	if h.Count() != 0 || h.Max() != 0 {
		t.Fatalf("self-subtract left %d", h.Count())
	}
}

func BenchmarkRecord(b *testing.B) {
	var h Histogram
	d := time.Duration(1)
	for b.Loop() {
		h.Record(d)
		d = d*7 + 13
		if d > time.Second {
			d = 1
		}
	}
}
