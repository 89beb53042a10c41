// Package overlap finds blocks of one worker code that intersect. Blocks of
// one code must be disjoint (the high-water mark only grows), so any pair it
// reports is a violation. The history checker and the in-memory test
// service (rangeclienttest) both use it; it imports only the standard
// library, so the public test package stays lean.
package overlap

import (
	"cmp"
	"math"
	"slices"
)

// Span is one granted block of a worker code's linear space: positions
// [Lo, Hi) of code (Region, Worker). It is the least a caller needs to
// give Find.
type Span struct {
	Region, Worker int
	Lo, Hi         int64
}

// Pair names two spans of one code by their index in the slice given to
// Find: Later starts below the end of Earlier.
type Pair struct{ Earlier, Later int }

// Find returns every span that starts below the end of an earlier span
// of the same code (ordered by Lo, ties by index), paired with the earlier
// span that reaches furthest. Blocks of one code must be disjoint (the
// high-water mark only grows), so any result is a violation. The result is
// ordered by code, then by Lo; it is empty when no two spans overlap. It
// runs in O(n log n).
func Find(spans []Span) []Pair {
	idx := make([]int, len(spans))
	for i := range idx {
		idx[i] = i
	}
	slices.SortStableFunc(idx, func(a, b int) int {
		x, y := spans[a], spans[b]
		return cmp.Or(cmp.Compare(x.Region, y.Region), cmp.Compare(x.Worker, y.Worker), cmp.Compare(x.Lo, y.Lo))
	})
	var out []Pair
	hi, prev := int64(math.MinInt64), -1
	for n, i := range idx {
		s := spans[i]
		if n > 0 {
			if p := spans[idx[n-1]]; p.Region != s.Region || p.Worker != s.Worker {
				hi, prev = math.MinInt64, -1 // a new code
			}
		}
		if s.Lo < hi {
			out = append(out, Pair{Earlier: prev, Later: i})
		}
		if s.Hi > hi {
			hi, prev = s.Hi, i
		}
	}
	return out
}
