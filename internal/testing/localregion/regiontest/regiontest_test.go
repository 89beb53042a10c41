package regiontest

import (
	"context"
	"testing"
)

type closer struct{ closed int }

func (c *closer) Close() error { c.closed++; return nil }

// Get starts the resource once, however many tests ask, and hands every
// caller the same one.
func TestGetStartsOnce(t *testing.T) {
	starts := 0
	s := Shared[*closer]{What: "fake", Start: func(ctx context.Context) (*closer, error) {
		if _, ok := ctx.Deadline(); !ok {
			t.Error("Start got a context without a deadline")
		}
		starts++
		return &closer{}, nil
	}}
	a, b := s.Get(t), s.Get(t)
	if starts != 1 || a != b || a == nil {
		t.Fatalf("%d starts, %p and %p; want 1 start, one resource", starts, a, b)
	}
	if a.closed != 0 {
		t.Fatal("Get closed the resource")
	}
}
