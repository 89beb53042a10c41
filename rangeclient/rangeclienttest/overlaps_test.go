package rangeclienttest

import (
	"testing"

	"github.com/idrange/idrange/segment"
)

func TestOverlaps(t *testing.T) {
	g := func(region, worker int, lo, hi int64) Grant {
		return Grant{Block: segment.Block{Region: region, Worker: worker, Lo: lo, Hi: hi}}
	}
	disjoint := []Grant{g(0, 1, 1, 10), g(0, 1, 10, 20), g(0, 2, 5, 15), g(1, 1, 5, 15)}
	if a, b, ok := Overlaps(disjoint); ok {
		t.Fatalf("Overlaps(disjoint) = %+v, %+v", a, b)
	}
	clash := append(disjoint, g(0, 1, 19, 30))
	a, b, ok := Overlaps(clash)
	if !ok || a != clash[1] || b != clash[4] {
		t.Fatalf("Overlaps = %+v, %+v, %t; want [10,20) and [19,30) of code 0/1", a, b, ok)
	}
}
