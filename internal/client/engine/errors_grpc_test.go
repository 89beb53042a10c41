package engine

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/server/service"
	"github.com/idrange/idrange/internal/testing/grpctest"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
)

// The errors New returns when the service refuses the first lease, after
// crossing a real gRPC server (internal/server/service over the in-memory fake):
// each matches its sentinels with the standard library's errors.Is, says
// whether it is retryable, and is one line.
func TestNewErrorsThroughGRPCMatchStdlibErrorsIs(t *testing.T) {
	cases := []struct {
		name      string
		refuse    error   // what the service's store answers Acquire with
		want      []error // sentinels errors.Is must find
		retryable bool
	}{
		{"epoch exhausted", segment.ErrEpochExhausted, []error{ErrEpochExhausted, segment.ErrEpochExhausted}, false},
		{"corrupt", segment.ErrCorrupt, []error{segment.ErrCorrupt}, false},
		{"invalid", segment.ErrInvalid, []error{segment.ErrInvalid}, false},
		{"no free code", segment.ErrNoFreeCode, []error{ErrUnavailable, context.DeadlineExceeded, segment.ErrNoFreeCode}, true},
		{"store unavailable", segment.ErrUnavailable, []error{ErrUnavailable, context.DeadlineExceeded, segment.ErrUnavailable}, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := rangeclienttest.New(rangeclienttest.Options{Region: 1})
			conn := fake.Conn()
			conn.SetHook(func(_ context.Context, m rangeclienttest.Method) error {
				if m == rangeclienttest.Acquire {
					return fmt.Errorf("test store: %w", tc.refuse)
				}
				return nil
			})
			svc, err := service.New(service.Config{Region: 1, Allocator: conn})
			if err != nil {
				t.Fatal(err)
			}
			alloc := wire.NewAllocator(grpctest.Dial(t, svc.Register))
			ctx, cancel := context.WithTimeout(context.Background(), time.Second) // room for a slow, shared machine
			defer cancel()
			c, err := New(ctx, Config{Allocator: alloc, Region: 1, Owner: t.Name()})
			if err == nil {
				c.Close()
				t.Fatal("New succeeded")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("errors.Is(%v, %v) = false", err, w)
				}
			}
			if IsRetryable(err) != tc.retryable {
				t.Errorf("IsRetryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err.Error())
			}
		})
	}
}

// The errors Next returns on each fault path, after the service's answers
// crossed a real gRPC server: each matches the documented sentinels with
// the standard library's errors.Is (and errors.As for *segment.Backpressure),
// says whether it is retryable, and is one line.
func TestNextErrorsThroughGRPCMatchStdlibErrorsIs(t *testing.T) {
	if testing.Short() {
		t.Skip("runs out a 1 s safe interval in real time")
	}
	type setup struct {
		hook func(m rangeclienttest.Method) error // the store's answer per call; nil: normal
		edit func(*Config)
	}
	cases := []struct {
		name      string
		setup     setup
		until     func(c *Engine) bool // the fault has taken effect
		want      []error
		retryable bool
		backoff   bool // errors.As finds a *segment.Backpressure
	}{
		{"lease lost", setup{hook: func(m rangeclienttest.Method) error {
			if m == rangeclienttest.Renew || m == rangeclienttest.Allocate || m == rangeclienttest.Acquire {
				return segment.ErrUnavailable
			}
			return nil
		}}, func(c *Engine) bool { return c.Lease().Err != nil },
			[]error{ErrUnavailable, ErrLeaseLost, segment.ErrLeaseLost, context.Canceled}, true, false},
		{"fenced", setup{hook: func(m rangeclienttest.Method) error {
			switch m {
			case rangeclienttest.Renew:
				return segment.ErrFenced
			case rangeclienttest.Acquire:
				return segment.ErrNoFreeCode
			}
			return nil
		}}, func(c *Engine) bool { return c.Lease().Err != nil },
			[]error{ErrUnavailable, ErrFenced, segment.ErrFenced, context.Canceled}, true, false},
		{"corrupt code", setup{hook: func(m rangeclienttest.Method) error {
			if m == rangeclienttest.Allocate {
				return segment.ErrCorrupt
			}
			return nil
		}, edit: func(cfg *Config) { cfg.MaxReserve, cfg.RefillInterval = -1, 50*time.Millisecond }},
			func(c *Engine) bool { return errors.Is(c.Health(), segment.ErrCorrupt) }, // buffers out, the refusal recorded
			[]error{segment.ErrCorrupt}, false, false},
		{"backpressure", setup{hook: func(m rangeclienttest.Method) error {
			if m == rangeclienttest.Allocate {
				return &segment.Backpressure{RetryAfter: time.Second}
			}
			return nil
		}, edit: func(cfg *Config) { cfg.MaxReserve, cfg.RefillInterval = -1, 50*time.Millisecond }},
			func(c *Engine) bool { return errors.Is(c.Health(), segment.ErrBackpressure) },
			[]error{ErrUnavailable, segment.ErrBackpressure, context.Canceled}, true, true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fake := rangeclienttest.New(rangeclienttest.Options{Region: 1, TTL: 2 * time.Second})
			conn := fake.Conn()
			svc, err := service.New(service.Config{Region: 1, Allocator: conn})
			if err != nil {
				t.Fatal(err)
			}
			alloc := wire.NewAllocator(grpctest.Dial(t, svc.Register))
			c := startClient(t, Config{Allocator: alloc, Region: 1, Owner: t.Name()}, 5*time.Second, func(cfg *Config) {
				cfg.SafetyMargin = time.Second
				if tc.setup.edit != nil {
					tc.setup.edit(cfg)
				}
			})
			mustNext(t, c)
			conn.SetHook(func(_ context.Context, m rangeclienttest.Method) error {
				if err := tc.setup.hook(m); err != nil {
					return fmt.Errorf("test store: %w", err)
				}
				return nil
			})
			for end := time.Now().Add(5 * time.Second); !tc.until(c); time.Sleep(5 * time.Millisecond) {
				if time.Now().After(end) {
					t.Fatal("the fault never took effect")
				}
			}
			_, err = c.Next(expiredCtx())
			if err == nil {
				t.Fatal("Next succeeded")
			}
			for _, w := range tc.want {
				if !errors.Is(err, w) {
					t.Errorf("errors.Is(%v, %v) = false", err, w)
				}
			}
			var bp *segment.Backpressure
			if errors.As(err, &bp) != tc.backoff {
				t.Errorf("errors.As(%v, *segment.Backpressure) = %v, want %v", err, !tc.backoff, tc.backoff)
			}
			if IsRetryable(err) != tc.retryable {
				t.Errorf("IsRetryable(%v) = %v, want %v", err, !tc.retryable, tc.retryable)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Errorf("error spans lines: %q", err.Error())
			}
			c.Close()
			if _, err := c.Next(context.Background()); !errors.Is(err, ErrClosed) || IsRetryable(err) {
				t.Errorf("Next after Close: %v; want ErrClosed, final", err)
			}
		})
	}
}
