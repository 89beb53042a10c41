package overlap

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestFind(t *testing.T) {
	for _, tc := range []struct {
		name  string
		spans []Span
		want  []Pair
	}{
		{"none", nil, nil},
		{"adjacent blocks do not overlap", []Span{{0, 1, 10, 20}, {0, 1, 0, 10}, {0, 1, 20, 30}}, nil},
		{"other codes do not overlap", []Span{{0, 1, 0, 10}, {0, 2, 0, 10}, {1, 1, 5, 15}}, nil},
		{"one overlap", []Span{{0, 1, 0, 10}, {0, 1, 9, 20}}, []Pair{{0, 1}}},
		{"paired with the span reaching furthest", []Span{{0, 1, 0, 100}, {0, 1, 10, 20}, {0, 1, 30, 40}},
			[]Pair{{0, 1}, {0, 2}}},
		{"same Lo: ties by index", []Span{{3, 7, 5, 6}, {3, 7, 5, 9}}, []Pair{{0, 1}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := Find(tc.spans); !slices.Equal(got, tc.want) {
				t.Fatalf("Find = %v, want %v", got, tc.want)
			}
		})
	}
}

// Find finds an overlap exactly when some pair of non-empty spans of
// one code intersects, and every pair it reports does intersect.
func TestFindMatchesPairwise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 2000 {
		spans := make([]Span, r.IntN(8))
		for i := range spans {
			lo := r.Int64N(50)
			spans[i] = Span{Region: r.IntN(2), Worker: r.IntN(2), Lo: lo, Hi: lo + 1 + r.Int64N(10)}
		}
		intersect := func(a, b Span) bool {
			return a.Region == b.Region && a.Worker == b.Worker && a.Lo < b.Hi && b.Lo < a.Hi
		}
		found := false
		for i := range spans {
			for j := i + 1; j < len(spans); j++ {
				found = found || intersect(spans[i], spans[j])
			}
		}
		got := Find(spans)
		if (len(got) > 0) != found {
			t.Fatalf("%v: Find = %v, pairwise overlap %t", spans, got, found)
		}
		for _, o := range got {
			if !intersect(spans[o.Earlier], spans[o.Later]) {
				t.Fatalf("%v: reported %v, which do not intersect", spans, o)
			}
		}
	}
}
