package history

import (
	"cmp"
	"math"
	"slices"
)

// Span is one granted block of a worker code's linear space: positions
// [Lo, Hi) of code (Region, Worker). It is the least a caller needs to
// give Overlaps.
type Span struct {
	Region, Worker int
	Lo, Hi         int64
}

// Overlap names two spans of one code by their index in the slice given
// to Overlaps: Later starts below the end of Earlier.
type Overlap struct{ Earlier, Later int }

// Overlaps returns every span that starts below the end of an earlier span
// of the same code (ordered by Lo, ties by index), paired with the earlier
// span that reaches furthest. Blocks of one code must be disjoint (the
// high-water mark only grows), so any result is a violation. The result is
// ordered by code, then by Lo; it is empty when no two spans overlap. It
// runs in O(n log n).
func Overlaps(spans []Span) []Overlap {
	idx := make([]int, len(spans))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		x, y := spans[a], spans[b]
		return cmp.Or(cmp.Compare(x.Region, y.Region), cmp.Compare(x.Worker, y.Worker), cmp.Compare(x.Lo, y.Lo))
	})
	var out []Overlap
	hi, prev := int64(math.MinInt64), -1
	for n, i := range idx {
		s := spans[i]
		if n > 0 {
			if p := spans[idx[n-1]]; p.Region != s.Region || p.Worker != s.Worker {
				hi, prev = math.MinInt64, -1 // a new code
			}
		}
		if s.Lo < hi {
			out = append(out, Overlap{Earlier: prev, Later: i})
		}
		if s.Hi > hi {
			hi, prev = s.Hi, i
		}
	}
	return out
}
