package service

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/idrange/idrange/snowflake"
)

type countingMinter struct {
	next   atomic.Int64
	closed atomic.Bool
}

func (c *countingMinter) AppendN(_ context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	for range n {
		dst = append(dst, snowflake.ID(c.next.Add(1)))
	}
	return dst, nil
}
func (c *countingMinter) Close() error { c.closed.Store(true); return nil }

func TestLazyMinter(t *testing.T) {
	ctx := context.Background()
	var opens atomic.Int64
	fail := true
	inner := &countingMinter{}
	lm := NewLazyMinter(func(context.Context) (MinterCloser, error) {
		opens.Add(1)
		if fail {
			return nil, errors.New("no lease")
		}
		return inner, nil
	})
	if _, err := lm.AppendN(ctx, nil, 1); err == nil {
		t.Fatal("AppendN succeeded although open failed")
	}
	fail = false
	var wg sync.WaitGroup
	for range 16 {
		wg.Go(func() {
			if _, err := lm.AppendN(ctx, nil, 1); err != nil {
				t.Error(err)
			}
		})
	}
	wg.Wait()
	if n := opens.Load(); n != 2 {
		t.Fatalf("open called %d times, want 2 (one failure, one success)", n)
	}
	if got := inner.next.Load(); got != 16 {
		t.Fatalf("inner minted %d, want 16", got)
	}
	if err := lm.Close(); err != nil || !inner.closed.Load() {
		t.Fatalf("Close: %v, inner closed %v", err, inner.closed.Load())
	}
	if _, err := lm.AppendN(ctx, nil, 1); !errors.Is(err, ErrMinterClosed) {
		t.Fatalf("AppendN after Close: %v", err)
	}
}
