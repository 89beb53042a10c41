package engine

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"testing/synctest"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func TestConfigValidate(t *testing.T) {
	alloc := rangeclienttest.New(rangeclienttest.Options{}).Conn()
	ok := Config{Allocator: alloc}
	if err := ok.Validate(); err != nil {
		t.Fatalf("minimal config: %v", err)
	}
	if err := (Config{Targets: []string{"127.0.0.1:7400", "[::1]:7401"}}).Validate(); err != nil {
		t.Fatalf("two targets: %v", err)
	}
	if err := (Config{Targets: []string{"dns:///rangesvc.internal:7400"}}).Validate(); err != nil {
		t.Fatalf("dns target: %v", err)
	}
	for _, tc := range []struct {
		field string
		edit  func(*Config)
	}{
		{"Config.Targets", func(c *Config) { c.Allocator = nil }},
		{"mutually exclusive", func(c *Config) { c.Targets = []string{"127.0.0.1:1"} }},
		{"Config.TLS", func(c *Config) { c.TLS = &tls.Config{} }}, // TLS is for Targets, not an in-process Allocator
		{"Config.Targets[0]", func(c *Config) { c.Allocator, c.Targets = nil, []string{"nohost"} }},
		{"Config.Targets[1]", func(c *Config) { c.Allocator, c.Targets = nil, []string{"a:1", "b:99999"} }},
		{"Config.Targets[1]", func(c *Config) { c.Allocator, c.Targets = nil, []string{"a:1", "dns:///b:2"} }},
		{"Config.Region", func(c *Config) { c.Region = 4 }},
		{"Config.Region", func(c *Config) { c.Region = -1 }},
		{"Config.Owner", func(c *Config) { c.Owner = strings.Repeat("x", 300) }},
		{"Config.Owner", func(c *Config) { c.Owner = "\xff" }},
		{"Config.Owner", func(c *Config) { c.Owner = "two\nlines" }}, // the store's rule, checked before dialling
		{"Config.RefillInterval", func(c *Config) { c.RefillInterval = time.Microsecond }},
		{"tuning MinBlock", func(c *Config) { c.Tuning.MinBlock = -5 }},
		{"tuning MaxBlock", func(c *Config) { c.Tuning.MinBlock, c.Tuning.MaxBlock = 100, 50 }},
		{"tuning MaxBlock", func(c *Config) { c.Tuning.MaxBlock = math.MaxUint32 + 1 }},
		{"tuning MaxBlock", func(c *Config) { c.Tuning.MaxBlock = int(segment.MaxBlockLimit) + 1 }},
		{"tuning FixedBlock", func(c *Config) { c.Tuning.FixedBlock = int(segment.MaxBlockLimit) + 1 }},
		{"tuning FixedBlock", func(c *Config) { c.Tuning.FixedBlock = -1 }},
		{"tuning PrefetchThreshold", func(c *Config) { c.Tuning.PrefetchThreshold = 1.5 }},
		{"tuning PrefetchThreshold", func(c *Config) { c.Tuning.PrefetchThreshold = math.NaN() }},
		{"tuning RPCTimeout", func(c *Config) { c.Tuning.RPCTimeout = -time.Second }},
		{"Config.SafetyMargin", func(c *Config) { c.SafetyMargin = -time.Second }},
		{"tuning RenewPeriod", func(c *Config) { c.Tuning.RenewPeriod = -time.Second }},
		{"tuning BackoffMax", func(c *Config) { c.Tuning.BackoffBase, c.Tuning.BackoffMax = time.Second, time.Millisecond }},
	} {
		cfg := ok
		tc.edit(&cfg)
		err := cfg.Validate()
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
			t.Errorf("%s: Validate = %v; want ErrInvalidConfig naming the field", tc.field, err)
		}
		if _, nerr := New(context.Background(), cfg); !errors.Is(nerr, ErrInvalidConfig) {
			t.Errorf("%s: New = %v", tc.field, nerr)
		}
	}
}

// A margin that leaves no safe interval of the granted TTL is refused at
// New, and the lease is given back.
func TestNewRefusesUnsafeMargin(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(3 * time.Second)
		_, err := New(context.Background(), Config{Allocator: svc.Conn(), Region: 1, SafetyMargin: 3 * time.Second})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "SafetyMargin") {
			t.Fatalf("New = %v", err)
		}
		_, err = New(context.Background(), Config{Allocator: svc.Conn(), Region: 1, Tuning: Tuning{RenewPeriod: 5 * time.Second}})
		if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "RenewPeriod") {
			t.Fatalf("New = %v", err)
		}
		if _, ok := svc.Owner(0); ok {
			t.Fatal("refused lease not released")
		}
		// Wrong region for the service: final, not retried.
		_, err = New(context.Background(), Config{Allocator: svc.Conn(), Region: 2})
		if !errors.Is(err, segment.ErrInvalid) {
			t.Fatalf("New for region 2 on a region-1 service: %v", err)
		}
	})
}

// New retries while the service is unreachable, until its ctx ends.
func TestNewWaitsForTheService(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		conn := fakeService(10 * time.Second).Conn()
		conn.SetFault(rangeclienttest.Unreachable)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_, err := New(ctx, Config{Allocator: conn, Region: 1})
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, segment.ErrUnavailable) {
			t.Fatalf("New against an unreachable service: %v", err)
		}
		if n := conn.Calls(rangeclienttest.Acquire); n < 3 {
			t.Fatalf("only %d acquire attempts in 2 s", n)
		}
		go func() { time.Sleep(time.Second); conn.SetFault(rangeclienttest.Healthy) }()
		ctx2, cancel2 := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel2()
		c, err := New(ctx2, Config{Allocator: conn, Region: 1})
		if err != nil {
			t.Fatalf("New once the service is back: %v", err)
		}
		c.Close()
	})
}

func TestCloseReleasesAndStops(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(10 * time.Second)
		conn := svc.Conn()
		c, err := New(context.Background(), Config{Allocator: conn, Region: 1})
		if err != nil {
			t.Fatal(err)
		}
		mustNext(t, c)
		w := c.Lease().Lease.Worker
		if err := c.Close(); err != nil {
			t.Fatalf("Close: %v", err)
		}
		if _, ok := svc.Owner(w); ok {
			t.Fatal("lease not released by Close")
		}
		if conn.Calls(rangeclienttest.Release) != 1 {
			t.Fatalf("%d Release calls", conn.Calls(rangeclienttest.Release))
		}
		if _, err := c.Next(context.Background()); !errors.Is(err, ErrClosed) || IsRetryable(err) {
			t.Fatalf("Next after Close: %v", err)
		}
		if _, err := c.NextN(context.Background(), 3); !errors.Is(err, ErrClosed) {
			t.Fatalf("NextN after Close: %v", err)
		}
		if err := c.Health(); !errors.Is(err, ErrClosed) {
			t.Fatalf("Health after Close: %v", err)
		}
		if err := c.Close(); err != nil {
			t.Fatalf("second Close: %v", err)
		}
		calls := conn.TotalCalls()
		time.Sleep(time.Minute)
		if conn.TotalCalls() != calls {
			t.Fatal("closed client still calls the service")
		}
	})
}

// Close wakes a caller blocked waiting for a block.
func TestCloseWakesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		svc := fakeService(30 * time.Second)
		conn := svc.Conn()
		c := newTestClient(t, conn, func(cfg *Config) {
			cfg.RefillInterval = 10 * time.Millisecond
			cfg.MaxReserve = -1 // no reserve: the buffers run dry in 20 ms
		})
		conn.SetFault(rangeclienttest.Blackhole)
		time.Sleep(100 * time.Millisecond)
		done := make(chan error)
		go func() { _, err := c.Next(context.Background()); done <- err }()
		synctest.Wait()
		c.Close()
		if err := <-done; !errors.Is(err, ErrClosed) {
			t.Fatalf("blocked Next after Close: %v", err)
		}
	})
}

func TestErrorIdentities(t *testing.T) {
	lost := leaseLostError("code %d", 3)
	if !errors.Is(lost, ErrLeaseLost) || !errors.Is(lost, segment.ErrLeaseLost) || errors.Is(lost, ErrFenced) {
		t.Errorf("lease lost error: %v", lost)
	}
	f := fencedError(fmt.Errorf("svc: %w", segment.ErrLeaseLost), "x")
	if !errors.Is(f, ErrFenced) || !errors.Is(f, segment.ErrLeaseLost) || errors.Is(f, ErrLeaseLost) {
		t.Errorf("fenced (lease gone in the service) error: %v", f)
	}
	f2 := fencedError(fmt.Errorf("svc: %w", segment.ErrFenced), "x")
	if !errors.Is(f2, ErrFenced) || !errors.Is(f2, segment.ErrFenced) {
		t.Errorf("fenced error: %v", f2)
	}
	if !errors.Is(ErrEpochExhausted, snowflake.ErrEpochExhausted) || IsRetryable(ErrEpochExhausted) {
		t.Error("ErrEpochExhausted")
	}
	if errors.Is(ErrLeaseLost, segment.ErrLeaseLost) {
		t.Error("the bare sentinel should be distinct from segment's")
	}
	u := unavailable(context.DeadlineExceeded, &segment.Backpressure{RetryAfter: time.Second})
	if !errors.Is(u, ErrUnavailable) || !errors.Is(u, context.DeadlineExceeded) || !IsRetryable(u) {
		t.Errorf("unavailable: %v", u)
	}
	for _, e := range []error{nil, ErrClosed, ErrInvalidConfig, errors.New("other")} {
		if IsRetryable(e) {
			t.Errorf("IsRetryable(%v) = true", e)
		}
	}
}

func TestMetrics(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		reg := prometheus.NewPedanticRegistry()
		svc := fakeService(10 * time.Second)
		c := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Registerer = reg })
		for range 1234 {
			mustNext(t, c)
		}
		time.Sleep(2 * time.Second)
		if got := gathered(t, reg, "idrange_client_ids_minted_total"); got != 1234 {
			t.Fatalf("ids_minted_total = %v", got)
		}
		problems, err := testutil.GatherAndLint(reg)
		if err != nil || len(problems) > 0 {
			t.Fatalf("lint: %v %v", problems, err)
		}
		mfs, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		names := map[string]bool{}
		for _, mf := range mfs {
			names[mf.GetName()] = true
		}
		for _, n := range []string{"ids_minted_total", "refills_total", "refill_latency_seconds", "buffer_depth_ids",
			"stalls_total", "lease_renewals_total", "lease_renewal_failures_total", "safety_deadline_expiries_total",
			"fenced_total", "serving", "lease_safe_seconds"} {
			if !names["idrange_client_"+n] {
				t.Errorf("metric idrange_client_%s missing", n)
			}
		}
		if got, err := testutil.GatherAndCount(reg, "idrange_client_refills_total"); err != nil || got != 1 {
			t.Fatalf("refills_total series: %d %v", got, err)
		}
		// A second client on the same registry must use distinct labels.
		if _, err := New(context.Background(), Config{Allocator: svc.Conn(), Region: 1, Registerer: reg}); err == nil {
			t.Fatal("second client registered the same metrics")
		}
		c.Close()
		c2 := newTestClient(t, svc.Conn(), func(cfg *Config) { cfg.Registerer = reg })
		c2.Close()
	})
}

// gathered returns the value of the named single-series counter.
func gathered(t *testing.T, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return mf.GetMetric()[0].GetCounter().GetValue()
		}
	}
	t.Fatalf("metric %s not gathered", name)
	return 0
}

// The hot path does not allocate.
func TestNextDoesNotAllocate(t *testing.T) {
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 1})
	c := newTestClient(t, svc.Conn(), nil)
	ctx := context.Background()
	mustNext(t, c)
	if a := testing.AllocsPerRun(10_000, func() { c.Next(ctx) }); a != 0 {
		t.Errorf("Next: %v allocs per ID", a)
	}
	buf := make([]snowflake.ID, 0, 64)
	if a := testing.AllocsPerRun(1_000, func() { buf, _ = c.AppendN(ctx, buf[:0], 64) }); a != 0 {
		t.Errorf("AppendN into a buffer with room: %v allocs per call", a)
	}
}
