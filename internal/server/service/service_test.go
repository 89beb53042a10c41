package service

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/grpctest"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// fakeAlloc counts calls and returns err (if set) or a fixed answer.
type fakeAlloc struct {
	calls atomic.Int64
	mu    sync.Mutex
	err   error
	ttl   time.Duration
	clk   func() time.Time
	hwm   int64
}

func (f *fakeAlloc) fail() error {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.err
}

func (f *fakeAlloc) setErr(err error) {
	f.mu.Lock()
	f.err = err
	f.mu.Unlock()
}

func (f *fakeAlloc) Acquire(_ context.Context, region int, _ string) (segment.Lease, error) {
	if err := f.fail(); err != nil {
		return segment.Lease{}, err
	}
	return segment.Lease{Region: region, Worker: 5, Token: 42, LeaseID: 77, TTL: 3 * time.Second}, nil
}

func (f *fakeAlloc) Renew(_ context.Context, l segment.Lease) (segment.Lease, error) {
	if err := f.fail(); err != nil {
		return segment.Lease{}, err
	}
	l.TTL = f.ttl
	return l, nil
}

func (f *fakeAlloc) Release(context.Context, segment.Lease) error { return f.fail() }

func (f *fakeAlloc) Allocate(_ context.Context, l segment.Lease, n int) (segment.Block, error) {
	if err := f.fail(); err != nil {
		return segment.Block{}, err
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clk()
	lo := max(f.hwm, snowflake.MsSince(now)<<12)
	f.hwm = lo + int64(n)
	return segment.Block{Region: l.Region, Worker: l.Worker, Lo: lo, Hi: lo + int64(n),
		ServiceTime: now, ValidUntil: now.Add(time.Second)}, nil
}

// manualClock is a wall clock that moves only when told.
type manualClock struct{ ns atomic.Int64 }

func newManualClock() *manualClock {
	c := &manualClock{}
	c.ns.Store(time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC).UnixNano())
	return c
}

func (c *manualClock) Now() time.Time      { return time.Unix(0, c.ns.Load()) }
func (c *manualClock) Add(d time.Duration) { c.ns.Add(int64(d)) }

type fixture struct {
	svc   *Service
	fake  *fakeAlloc
	clk   *manualClock
	reg   *prometheus.Registry
	cli   idrangev1.RangeServiceClient
	alloc segment.Allocator
	hc    healthpb.HealthClient
}

func newFixture(t *testing.T, mod func(*Config)) *fixture {
	t.Helper()
	clk := newManualClock()
	fake := &fakeAlloc{ttl: 3 * time.Second, clk: clk.Now}
	reg := prometheus.NewRegistry()
	cfg := Config{Region: 1, Allocator: fake, Now: clk.Now, Registerer: reg, MaxBlock: 1000}
	if mod != nil {
		mod(&cfg)
	}
	svc, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cc := grpctest.Dial(t, svc.Register)
	return &fixture{svc: svc, fake: fake, clk: clk, reg: reg, cli: idrangev1.NewRangeServiceClient(cc),
		alloc: wire.NewAllocator(cc), hc: healthpb.NewHealthClient(cc)}
}

func TestConfigValidate(t *testing.T) {
	ok := Config{Region: 0, Allocator: &fakeAlloc{}}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := map[string]Config{
		"Region":        {Region: 4, Allocator: &fakeAlloc{}},
		"Region -1":     {Region: -1, Allocator: &fakeAlloc{}},
		"Allocator":     {Region: 0},
		"MaxBlock":      {Allocator: &fakeAlloc{}, MaxBlock: -1},
		"RollbackBound": {Allocator: &fakeAlloc{}, RollbackBound: -time.Second},
		"RPCTimeout":    {Allocator: &fakeAlloc{}, RPCTimeout: -time.Second},
	}
	for name, c := range bad {
		if err := c.Validate(); err == nil {
			t.Errorf("%s: Validate accepted %+v", name, c)
		} else if !strings.Contains(err.Error(), strings.Fields(name)[0]) {
			t.Errorf("%s: message %q does not name the field", name, err)
		}
	}
}

func TestValidation(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	good := func() *idrangev1.Lease { return &idrangev1.Lease{Region: 1, Worker: 3, Token: 9, LeaseId: 11} }
	with := func(mod func(*idrangev1.Lease)) *idrangev1.Lease { l := good(); mod(l); return l }
	type validationCase struct {
		name  string
		call  func() error
		field string // the message must name it
	}
	cases := []validationCase{
		{"acquire wrong region", func() error {
			_, err := f.cli.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: 2})
			return err
		}, "region: 2 is not this replica's region 1"},
		{"acquire region out of range", func() error {
			_, err := f.cli.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: 7})
			return err
		}, "region: 7 not in 0..3"},
		{"acquire owner too long", func() error {
			_, err := f.cli.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: 1, Owner: strings.Repeat("x", segment.MaxOwnerLen+1)})
			return err
		}, "owner"},
	}
	leaseCases := []struct {
		name  string
		lease *idrangev1.Lease
		field string
	}{
		{"missing lease", nil, "lease: required"},
		{"wrong region", with(func(l *idrangev1.Lease) { l.Region = 0 }), "lease.region: 0 is not this replica's region 1"},
		{"region out of range", with(func(l *idrangev1.Lease) { l.Region = 4 }), "lease.region: 4 not in 0..3"},
		{"worker 256", with(func(l *idrangev1.Lease) { l.Worker = 256 }), "lease: worker 256 not in 0..255"},
		{"worker huge", with(func(l *idrangev1.Lease) { l.Worker = 1 << 31 }), "lease: worker 2147483648"},
		{"token 0", with(func(l *idrangev1.Lease) { l.Token = 0 }), "lease: token 0"},
		{"token negative", with(func(l *idrangev1.Lease) { l.Token = -3 }), "lease: token -3"},
		{"lease_id 0", with(func(l *idrangev1.Lease) { l.LeaseId = 0 }), "lease: lease_id 0"},
		{"lease_id negative", with(func(l *idrangev1.Lease) { l.LeaseId = -1 }), "lease: lease_id -1"},
	}
	for _, lc := range leaseCases {
		cases = append(cases,
			validationCase{"renew " + lc.name, func() error {
				_, err := f.cli.RenewLease(ctx, &idrangev1.RenewLeaseRequest{Lease: lc.lease})
				return err
			}, lc.field},
			validationCase{"release " + lc.name, func() error {
				_, err := f.cli.ReleaseLease(ctx, &idrangev1.ReleaseLeaseRequest{Lease: lc.lease})
				return err
			}, lc.field},
			validationCase{"allocate " + lc.name, func() error {
				_, err := f.cli.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: lc.lease, Count: 10})
				return err
			}, lc.field})
	}
	cases = append(cases,
		validationCase{"allocate count 0", func() error {
			_, err := f.cli.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: good(), Count: 0})
			return err
		}, "count: 0 not in 1..1000"},
		validationCase{"allocate count huge", func() error {
			_, err := f.cli.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: good(), Count: 1001})
			return err
		}, "count: 1001 not in 1..1000"},
	)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			before := f.fake.calls.Load()
			err := tc.call()
			if status.Code(err) != codes.InvalidArgument {
				t.Fatalf("code = %v (%v), want InvalidArgument", status.Code(err), err)
			}
			if msg := status.Convert(err).Message(); !strings.Contains(msg, tc.field) {
				t.Fatalf("message %q does not contain %q", msg, tc.field)
			}
			if f.fake.calls.Load() != before {
				t.Fatal("the allocator was called for an invalid request")
			}
		})
	}
	// And the good forms do reach the allocator.
	if _, err := f.cli.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: good(), Count: 1000}); err != nil {
		t.Fatalf("valid request refused: %v", err)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().Errors.WithLabelValues("AllocateBlock", "InvalidArgument")); got == 0 {
		t.Fatal("errors_total{AllocateBlock,InvalidArgument} not counted")
	}
}

// Store errors cross the service with the right code and come back as the
// same sentinel through the wire adapter.
func TestErrorMappingThroughService(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	lease := segment.Lease{Region: 1, Worker: 3, Token: 9, LeaseID: 11}
	cases := []struct {
		err  error
		code codes.Code
	}{
		{fmt.Errorf("worker 3 token 9: %w", segment.ErrFenced), codes.FailedPrecondition},
		{fmt.Errorf("lease 11: %w", segment.ErrLeaseLost), codes.FailedPrecondition},
		{&segment.Backpressure{RetryAfter: 250 * time.Millisecond}, codes.ResourceExhausted},
		{fmt.Errorf("hwm key: %w", segment.ErrCorrupt), codes.DataLoss},
		{fmt.Errorf("etcd timeout: %w", segment.ErrUnavailable), codes.Unavailable},
		{fmt.Errorf("hi: %w", segment.ErrEpochExhausted), codes.OutOfRange},
		{fmt.Errorf("n: %w", segment.ErrInvalid), codes.InvalidArgument},
		{errors.New("surprise"), codes.Internal},
	}
	for _, tc := range cases {
		t.Run(tc.err.Error(), func(t *testing.T) {
			f.fake.setErr(tc.err)
			_, err := f.alloc.Allocate(ctx, lease, 10)
			if status.Code(err) != tc.code {
				t.Fatalf("code = %v, want %v", status.Code(err), tc.code)
			}
			if err.Error() != tc.err.Error() {
				t.Fatalf("message %q, want %q", err.Error(), tc.err.Error())
			}
			if r := wire.Reason(tc.err); r != "" && wire.Reason(err) != r {
				t.Fatalf("sentinel lost: client reason %q, want %q", wire.Reason(err), r)
			}
			var bp *segment.Backpressure
			if errors.As(tc.err, &bp) {
				var got *segment.Backpressure
				if !errors.As(err, &got) || got.RetryAfter != bp.RetryAfter {
					t.Fatalf("RetryAfter lost: %v", err)
				}
			}
		})
	}
	f.fake.setErr(fmt.Errorf("256 of 256: %w", segment.ErrNoFreeCode))
	if _, err := f.alloc.Acquire(ctx, 1, "x"); !errors.Is(err, segment.ErrNoFreeCode) || status.Code(err) != codes.ResourceExhausted {
		t.Fatalf("acquire: %v", err)
	}
	f.fake.setErr(fmt.Errorf("gone: %w", segment.ErrLeaseLost))
	if _, err := f.alloc.Renew(ctx, lease); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("renew: %v", err)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().LeaseRenewalFailures); got != 1 {
		t.Fatalf("renewal failures = %v, want 1", got)
	}
	if got := testutil.ToFloat64(f.svc.Metrics().Errors.WithLabelValues("AllocateBlock", "FailedPrecondition")); got != 2 {
		t.Fatalf("errors_total{AllocateBlock,FailedPrecondition} = %v, want 2", got)
	}
	// A store that "renews" with TTL 0 has not renewed.
	f.fake.setErr(nil)
	f.fake.mu.Lock()
	f.fake.ttl = 0
	f.fake.mu.Unlock()
	if _, err := f.alloc.Renew(ctx, lease); !errors.Is(err, segment.ErrLeaseLost) {
		t.Fatalf("renew with ttl 0: %v, want ErrLeaseLost", err)
	}
}

func TestHappyPathAndMetrics(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.FreeCodes = func(context.Context) (int, error) { return 200, nil } })
	ctx := context.Background()
	l, err := f.alloc.Acquire(ctx, 1, "me")
	if err != nil {
		t.Fatal(err)
	}
	if l.Worker != 5 || l.Token != 42 || l.LeaseID != 77 || l.TTL != 3*time.Second {
		t.Fatalf("lease = %+v", l)
	}
	b, err := f.alloc.Allocate(ctx, l, 800)
	if err != nil {
		t.Fatal(err)
	}
	if b.Len() != 800 || b.Region != 1 || b.Worker != 5 {
		t.Fatalf("block = %+v", b)
	}
	if _, err := f.alloc.Renew(ctx, l); err != nil {
		t.Fatal(err)
	}
	if err := f.alloc.Release(ctx, l); err != nil {
		t.Fatal(err)
	}
	runCtx, cancel := context.WithCancel(ctx)
	f.svc.refreshFreeCodes(runCtx)
	cancel()
	m := f.svc.Metrics()
	for name, want := range map[string]float64{
		"grants":       1,
		"acquisitions": 1,
		"renewals":     1,
		"releases":     1,
		"free":         200,
	} {
		var got float64
		switch name {
		case "grants":
			got = testutil.ToFloat64(m.BlockGrants)
		case "acquisitions":
			got = testutil.ToFloat64(m.LeaseAcquisitions)
		case "renewals":
			got = testutil.ToFloat64(m.LeaseRenewals)
		case "releases":
			got = testutil.ToFloat64(m.LeaseReleases)
		case "free":
			got = testutil.ToFloat64(m.FreeCodes.WithLabelValues("1"))
		}
		if got != want {
			t.Errorf("%s = %v, want %v", name, got, want)
		}
	}
	if life := testutil.ToFloat64(m.RemainingEpochLife); life < 60*365*24*3600 {
		t.Errorf("remaining epoch life %v s, want > 60 years", life)
	}
	// Every documented metric is registered.
	mfs, err := f.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	have := map[string]bool{}
	for _, mf := range mfs {
		have[mf.GetName()] = true
	}
	for _, n := range MetricNames {
		if !have[n] {
			t.Errorf("metric %s not exported", n)
		}
	}
	// Next without a minter is Unimplemented, and with one it mints.
	if _, err := f.cli.Next(ctx, &idrangev1.NextRequest{}); status.Code(err) != codes.Unimplemented {
		t.Fatalf("Next without minter: %v", err)
	}
	f.svc.SetMinter(minterFunc(func(context.Context) (snowflake.ID, error) { return 12345, nil }))
	if r, err := f.cli.Next(ctx, &idrangev1.NextRequest{}); err != nil || r.GetId() != 12345 {
		t.Fatalf("Next = %v, %v", r, err)
	}
}

// minterFunc mints each ID of a batch with f.
type minterFunc func(context.Context) (snowflake.ID, error)

func (f minterFunc) AppendN(ctx context.Context, dst []snowflake.ID, n int) ([]snowflake.ID, error) {
	for range n {
		id, err := f(ctx)
		if err != nil {
			return dst, err
		}
		dst = append(dst, id)
	}
	return dst, nil
}

func healthOf(t *testing.T, f *fixture, svc string) healthpb.HealthCheckResponse_ServingStatus {
	t.Helper()
	r, err := f.hc.Check(context.Background(), &healthpb.HealthCheckRequest{Service: svc})
	if err != nil {
		t.Fatal(err)
	}
	return r.GetStatus()
}

func TestHealthClockRollback(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	serving, notServing := healthpb.HealthCheckResponse_SERVING, healthpb.HealthCheckResponse_NOT_SERVING
	if s := healthOf(t, f, HealthService); s != serving {
		t.Fatalf("initial status %v", s)
	}
	// Within the bound (1 ms < 5 ms): still serving.
	f.clk.Add(-time.Millisecond)
	f.svc.Check(ctx)
	if s := healthOf(t, f, ""); s != serving {
		t.Fatalf("after 1 ms rollback: %v, want SERVING", s)
	}
	// 2 s back: NOT_SERVING, rollback exported in ms.
	f.clk.Add(-2 * time.Second)
	f.svc.Check(ctx)
	for _, name := range []string{"", HealthService} {
		if s := healthOf(t, f, name); s != notServing {
			t.Fatalf("after 2 s rollback %q: %v, want NOT_SERVING", name, s)
		}
	}
	if ms := testutil.ToFloat64(f.svc.Metrics().ClockRollbackMs); ms != 2001 {
		t.Fatalf("clock_rollback_ms = %v, want 2001", ms)
	}
	if f.svc.Serving() {
		t.Fatal("Serving() true while rolled back")
	}
	if r := f.svc.NotServingReason(); !strings.Contains(r, "service clock 2.001s behind") {
		t.Fatalf("NotServingReason() = %q while rolled back", r)
	}
	// Grants still work (uniqueness does not depend on the clock) and also
	// notice the rollback.
	l := segment.Lease{Region: 1, Worker: 3, Token: 9, LeaseID: 11}
	if _, err := f.alloc.Allocate(ctx, l, 10); err != nil {
		t.Fatalf("grant during rollback: %v", err)
	}
	// Clock jumps forward past the old maximum: serving again.
	f.clk.Add(2002 * time.Millisecond)
	f.svc.Check(ctx)
	if s := healthOf(t, f, HealthService); s != serving {
		t.Fatalf("after recovery: %v, want SERVING", s)
	}
	if ms := testutil.ToFloat64(f.svc.Metrics().ClockRollbackMs); ms != 0 {
		t.Fatalf("clock_rollback_ms = %v after recovery, want 0", ms)
	}
	if r := f.svc.NotServingReason(); r != "" {
		t.Fatalf("NotServingReason() = %q while serving", r)
	}
	f.svc.Shutdown()
	if s := healthOf(t, f, HealthService); s != notServing {
		t.Fatalf("after Shutdown: %v, want NOT_SERVING", s)
	}
	if r := f.svc.NotServingReason(); r != "shutting down" {
		t.Fatalf("NotServingReason() = %q after Shutdown", r)
	}
}

func TestHealthStoreUnreachable(t *testing.T) {
	var down atomic.Bool
	f := newFixture(t, func(c *Config) {
		c.StoreCheck = func(context.Context) error {
			if down.Load() {
				return errors.New("etcd: connection refused")
			}
			return nil
		}
	})
	ctx := context.Background()
	f.svc.Check(ctx)
	if s := healthOf(t, f, HealthService); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("status %v", s)
	}
	down.Store(true)
	f.svc.Check(ctx)
	if s := healthOf(t, f, HealthService); s != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("store down: %v, want NOT_SERVING", s)
	}
	if r := f.svc.NotServingReason(); r != "store check failed: etcd: connection refused" {
		t.Fatalf("NotServingReason() = %q while the store is down", r)
	}
	down.Store(false)
	f.svc.Check(ctx)
	if s := healthOf(t, f, HealthService); s != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("store back: %v, want SERVING", s)
	}
}

// Run's loop notices a rollback by itself (no explicit Check call).
func TestRunDetectsRollback(t *testing.T) {
	f := newFixture(t, func(c *Config) { c.CheckInterval = 5 * time.Millisecond })
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	done := make(chan struct{})
	go func() { f.svc.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	stream, err := f.hc.Watch(ctx, &healthpb.HealthCheckRequest{Service: HealthService})
	if err != nil {
		t.Fatal(err)
	}
	first, err := stream.Recv()
	if err != nil || first.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("first watch status %v, %v", first, err)
	}
	f.clk.Add(-time.Second)
	next, err := stream.Recv() // blocks until Run reports the change
	if err != nil || next.GetStatus() != healthpb.HealthCheckResponse_NOT_SERVING {
		t.Fatalf("watch after rollback: %v, %v", next, err)
	}
}

// minterErrors are errors of the replica's own minter and the status code
// a caller of Next or MintBatch gets for each: the replica's lease troubles
// are Unavailable (the caller holds no lease), never FailedPrecondition.
var minterErrors = []struct {
	err  error
	code codes.Code
}{
	{fmt.Errorf("own lease: %w", segment.ErrLeaseLost), codes.Unavailable},
	{fmt.Errorf("own lease: %w", segment.ErrFenced), codes.Unavailable},
	{errors.New("no block yet"), codes.Unavailable},
	{fmt.Errorf("end: %w", snowflake.ErrEpochExhausted), codes.OutOfRange},
	// Every code of the replica's minter is at its lead bound: wait.
	{fmt.Errorf("pool: %w", &segment.Backpressure{RetryAfter: time.Millisecond}), codes.ResourceExhausted},
}

// The replica's own minting troubles are Unavailable to a Next caller (who
// holds no lease), never FailedPrecondition.
func TestNextErrors(t *testing.T) {
	f := newFixture(t, nil)
	ctx := context.Background()
	for _, tc := range minterErrors {
		f.svc.SetMinter(minterFunc(func(context.Context) (snowflake.ID, error) { return 0, tc.err }))
		_, err := f.cli.Next(ctx, &idrangev1.NextRequest{})
		if status.Code(err) != tc.code {
			t.Errorf("minter error %v: code %v, want %v", tc.err, status.Code(err), tc.code)
		}
	}
}

// GetReplicaInfo answers the replica's region without touching the store,
// so a client can learn it while etcd is down.
func TestGetReplicaInfo(t *testing.T) {
	for _, region := range []int{0, 1, 3} {
		f := newFixture(t, func(c *Config) {
			c.Region = region
			c.StoreCheck = func(context.Context) error { return errors.New("etcd: connection refused") }
		})
		f.fake.setErr(fmt.Errorf("etcd down: %w", segment.ErrUnavailable))
		f.svc.Check(context.Background())
		if f.svc.Serving() {
			t.Fatal("replica with its store down reports SERVING")
		}
		r, err := f.cli.GetReplicaInfo(context.Background(), &idrangev1.GetReplicaInfoRequest{})
		if err != nil {
			t.Fatalf("region %d: GetReplicaInfo: %v", region, err)
		}
		if got := int(r.GetRegion()); got != region {
			t.Errorf("GetReplicaInfo region = %d, want %d", got, region)
		}
		if n := f.fake.calls.Load(); n != 0 {
			t.Errorf("region %d: GetReplicaInfo made %d store calls, want 0", region, n)
		}
	}
}
