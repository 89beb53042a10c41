package rangeclient_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/rangeclient/rangeclienttest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// The client's behaviour is tested where it lives, in its engine
// (internal/client/engine). These tests check the front: that Config
// reaches the engine field for field, that the engine's answers come back
// as the public types, and that the sentinels are the engine's.

// Config.Validate names the field that is out of range, and New refuses
// the same Config with the same error, before any network call.
func TestConfigValidateNamesTheField(t *testing.T) {
	conn := rangeclienttest.New(rangeclienttest.Options{}).Conn()
	for _, tc := range []struct {
		cfg  rangeclient.Config
		want string
	}{
		{rangeclient.Config{}, "one of Config.Targets and Config.Allocator is required"},
		{rangeclient.Config{Targets: []string{"a:1"}, Allocator: conn}, "Config.Targets (1 entries) and Config.Allocator are mutually exclusive"},
		{rangeclient.Config{Targets: []string{"no-port"}}, `Config.Targets[0] "no-port" is not host:port`},
		{rangeclient.Config{Allocator: conn, Region: 4}, "Config.Region 4 not in 0..3"},
		{rangeclient.Config{Allocator: conn, Codes: rangeclient.MaxCodes + 1}, "Config.Codes 17 not in 0..16"},
		{rangeclient.Config{Allocator: conn, RefillInterval: time.Microsecond}, "Config.RefillInterval 1µs must be at least 1ms"},
		{rangeclient.Config{Allocator: conn, SafetyMargin: -time.Second}, "Config.SafetyMargin -1s is negative"},
		{rangeclient.Config{Allocator: conn, Owner: strings.Repeat("o", 300)}, "Config.Owner"},
	} {
		err := tc.cfg.Validate()
		if !errors.Is(err, rangeclient.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("Validate(%+v) = %v, want ErrInvalidConfig naming %q", tc.cfg, err, tc.want)
			continue
		}
		if _, nerr := rangeclient.New(context.Background(), tc.cfg); nerr == nil || nerr.Error() != err.Error() {
			t.Errorf("New with the same Config: %v, want %v", nerr, err)
		}
	}
	if err := (rangeclient.Config{Allocator: conn}).Validate(); err != nil {
		t.Fatalf("a Config with defaults: %v", err)
	}
}

// A client over the in-memory service: what the engine answers comes back
// through the public types (Lease, Leases, Stats, Health), with the fields
// of Config applied (Region, Codes), and after Close every call
// fails with ErrClosed.
func TestClientFront(t *testing.T) {
	svc := rangeclienttest.New(rangeclienttest.Options{Region: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := rangeclient.New(ctx, rangeclient.Config{Allocator: svc.Conn(), Region: 2, Codes: 2})
	if err != nil {
		t.Fatal(err)
	}
	ids, err := c.NextN(ctx, 1000)
	if err != nil || len(ids) != 1000 {
		t.Fatalf("NextN: %d IDs, %v", len(ids), err)
	}
	id, err := c.Next(ctx)
	if err != nil {
		t.Fatal(err)
	}
	ids = append(ids, id)
	seen := map[snowflake.ID]bool{}
	for _, id := range ids {
		if seen[id] || id.Region() != 2 {
			t.Fatalf("ID %d repeated or of region %d", id, id.Region())
		}
		seen[id] = true
	}
	ls := c.Leases()
	if len(ls) != 2 || ls[0].Lease != c.Lease().Lease || ls[0].Lease.Worker == ls[1].Lease.Worker {
		t.Fatalf("Leases %+v, Lease %+v: want two codes, the first Lease's", ls, c.Lease())
	}
	for _, l := range ls {
		if l.Err != nil || l.Shared || l.SafeFor <= 0 || l.Lease.Region != 2 {
			t.Fatalf("lease %+v: want a live code of region 2", l)
		}
		if o, ok := svc.Owner(l.Lease.Worker); !ok || o.Token != l.Lease.Token {
			t.Fatalf("code %d held by %+v in the service, want the client's token %d", l.Lease.Worker, o, l.Lease.Token)
		}
	}
	if s := c.Stats(); s.Minted != 1001 || s.Acquisitions != 2 || s.Refills < 2 {
		t.Fatalf("Stats %+v: want 1,001 minted over 2 codes", s)
	}
	if err := c.Health(); err != nil {
		t.Fatalf("Health: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	for name, err := range map[string]error{
		"Next":   func() error { _, err := c.Next(ctx); return err }(),
		"Health": c.Health(),
		"Close":  c.Close(),
	} {
		if name == "Close" {
			if err != nil {
				t.Errorf("second Close: %v, want the first's (nil)", err)
			}
			continue
		}
		if !errors.Is(err, rangeclient.ErrClosed) || rangeclient.IsRetryable(err) {
			t.Errorf("%s after Close: %v, want ErrClosed (final)", name, err)
		}
	}
	if c.Lease().Err == nil {
		t.Fatal("Lease after Close has no error")
	}
}

// The sentinels keep their documented relations to segment's.
func TestSentinels(t *testing.T) {
	if !errors.Is(rangeclient.ErrEpochExhausted, snowflake.ErrEpochExhausted) {
		t.Fatal("ErrEpochExhausted is not snowflake's")
	}
	for _, err := range []error{rangeclient.ErrLeaseLost, rangeclient.ErrFenced, rangeclient.ErrUnavailable, rangeclient.ErrOverlap} {
		if !rangeclient.IsRetryable(err) {
			t.Errorf("%v is not retryable", err)
		}
	}
	for _, err := range []error{nil, rangeclient.ErrClosed, rangeclient.ErrEpochExhausted, rangeclient.ErrInvalidConfig, segment.ErrInvalid} {
		if rangeclient.IsRetryable(err) {
			t.Errorf("%v is retryable", err)
		}
	}
}
