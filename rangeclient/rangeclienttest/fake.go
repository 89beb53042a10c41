// Package rangeclienttest is an in-memory range service for tests and
// benchmarks of code built on rangeclient or any segment.Allocator user.
//
// Service is the production grant loop (store.Store: one lease per worker
// code, fencing tokens, per-code high-water marks that only grow, the grant
// rule of segment.Policy) over in-memory storage (internal/server/store/memstore) instead
// of etcd, so tests against it test the rule production runs. It records
// every grant, so tests can check that no two blocks of a code overlap.
//
// Each client talks to the Service through its own Conn, which counts calls
// and injects faults (unreachable, blackholed, replies held, slow) for that
// client only, so one client can be "partitioned" or "paused" while another
// keeps working. Everything is driven by time.Now, so it works inside a
// testing/synctest bubble.
package rangeclienttest

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/idrange/idrange/internal/server/store"
	"github.com/idrange/idrange/internal/server/store/memstore"
	"github.com/idrange/idrange/internal/testing/overlap"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Defaults for Options fields left zero: production's.
const (
	DefaultTTL      = store.DefaultLeaseTTL
	DefaultMaxLead  = segment.DefaultMaxLead
	DefaultMaxBlock = int(segment.DefaultMaxBlock)
	DefaultWorkers  = snowflake.MaxWorker + 1
)

// Options configure a Service.
type Options struct {
	// Region is the only region the service serves (Acquire for another is
	// segment.ErrInvalid), like one regional rangesvc.
	Region int
	// Start, when set, is the service's clock at New; it then advances with
	// time.Since (monotonic, or synctest's fake time). Inside a synctest
	// bubble time starts in 2000, before snowflake.Epoch, so set it there.
	// Zero means the service clock is time.Now.
	Start time.Time
	// TTL of leases (whole seconds, default 10 s; leases expire on
	// time.Now, like etcd's own clock), MaxLead of grants ahead of the
	// service clock (default 15 s), MaxBlock per request (default
	// 40,960,000) and Workers codes available in the region (default 256;
	// the others are held by a lease that never expires).
	TTL      time.Duration
	MaxLead  time.Duration
	MaxBlock int
	Workers  int
}

// Grant is one block the service handed out, with the lease token it was
// granted under.
type Grant struct {
	segment.Block
	Token int64
}

// Service is one in-memory regional range service: a store.Store over a
// memstore.Storage.
type Service struct {
	opts   Options
	origin time.Time
	stg    *memstore.Storage
	store  *store.Store

	mu     sync.Mutex
	grants []Grant
	skew   time.Duration // added to the service clock (rollback tests)
}

// New returns a Service with opts' defaults applied. It panics if opts are
// out of range (a test's mistake).
func New(opts Options) *Service {
	if opts.TTL == 0 {
		opts.TTL = DefaultTTL
	}
	if opts.MaxLead == 0 {
		opts.MaxLead = DefaultMaxLead
	}
	if opts.MaxBlock == 0 {
		opts.MaxBlock = DefaultMaxBlock
	}
	if opts.Workers == 0 {
		opts.Workers = DefaultWorkers
	}
	s := &Service{opts: opts, origin: time.Now(), stg: memstore.New()}
	store, err := store.New(s.stg, store.Config{
		LeaseTTL: opts.TTL,
		Policy:   segment.Policy{MaxBlock: int64(opts.MaxBlock), MaxLead: opts.MaxLead},
		Now:      s.Now,
		// Lowest free code first, so tests know which code a client gets
		// (production starts at a random one).
		FirstCode: func(int) int { return 0 },
	})
	if err != nil {
		panic(fmt.Sprintf("rangeclienttest: %v", err))
	}
	s.store = store
	if err := s.reserve(opts.Workers); err != nil {
		panic(fmt.Sprintf("rangeclienttest: %v", err))
	}
	return s
}

// reserve makes codes workers..255 unavailable by storing an owner for each
// under a lease that never expires: storage setup, not a second rule.
func (s *Service) reserve(workers int) error {
	if workers > snowflake.MaxWorker {
		return nil
	}
	ctx := context.Background()
	id, _, err := s.stg.Grant(ctx, 100*365*24*time.Hour)
	if err != nil {
		return err
	}
	for w := max(workers, 0); w <= snowflake.MaxWorker; w++ {
		rec := store.OwnerRecord{Version: 1, Region: s.opts.Region, Worker: w, LeaseID: id,
			Owner: "rangeclienttest: reserved (Options.Workers)", AcquiredUnixMs: 1}
		if _, ok, err := s.stg.CreateOwner(ctx, s.opts.Region, w, 0, []byte(rec.Encode()), id); err != nil || !ok {
			return fmt.Errorf("reserve code %d: %v", w, err)
		}
	}
	return nil
}

// Now is the service's clock.
func (s *Service) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.opts.Start.IsZero() {
		return time.Now().Add(s.skew)
	}
	return s.opts.Start.Add(time.Since(s.origin) + s.skew)
}

// AdjustClock moves the service's clock by d (negative: a rollback). Lease
// expiry does not follow it: leases run on time.Now, as etcd's do.
func (s *Service) AdjustClock(d time.Duration) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.skew += d
}

// Grants returns a copy of every block granted so far, in grant order.
func (s *Service) Grants() []Grant {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]Grant(nil), s.grants...)
}

// HWM returns code worker's high-water mark (0 if it cannot be read).
func (s *Service) HWM(worker int) int64 {
	hwm, _ := s.store.HighWater(context.Background(), s.opts.Region, worker)
	return hwm
}

// PutHighWater writes code worker's high-water mark behind the Store's
// back, as an operator with etcdctl would (lowering it is the mistake the
// Store and the client must catch): storage setup, not a second rule.
func (s *Service) PutHighWater(worker int, hwm int64) {
	// memstore.Put fails only for a lease that does not exist; none is given.
	_ = s.stg.Put(memstore.HighWaterKey(s.opts.Region, worker), []byte(store.EncodeHighWater(hwm)), 0)
}

// Owner returns the live lease of code worker, if any.
func (s *Service) Owner(worker int) (segment.Lease, bool) {
	infos, err := s.store.List(context.Background(), s.opts.Region)
	if err != nil {
		return segment.Lease{}, false
	}
	for _, in := range infos {
		if in.Worker == worker && in.Err == nil {
			l := in.Lease
			l.TTL = s.opts.TTL
			return l, true
		}
	}
	return segment.Lease{}, false
}

// Revoke ends code worker's current lease at once, as if its TTL ran out.
// The old owner's next call gets segment.ErrLeaseLost (or ErrFenced once a
// new owner holds the code).
func (s *Service) Revoke(worker int) {
	if l, ok := s.Owner(worker); ok {
		_ = s.stg.Revoke(context.Background(), l.LeaseID) // memstore only fails on a done ctx
	}
}

// Conn returns a new connection to the service for one client.
func (s *Service) Conn() *Conn {
	c := Wrap(serviceAllocator{s})
	c.s = s
	return c
}

// Wrap puts a Conn's fault injection and call counting in front of any
// allocator, for example the gRPC adapter to a real in-process region.
func Wrap(a segment.Allocator) *Conn {
	return &Conn{backend: a, changed: make(chan struct{})}
}

// serviceAllocator is the Service as a segment.Allocator (no faults): the
// Store, restricted to the service's region, recording grants.
type serviceAllocator struct{ s *Service }

func (a serviceAllocator) served(region int) error {
	if region != a.s.opts.Region {
		return fmt.Errorf("region %d: this service serves region %d: %w", region, a.s.opts.Region, segment.ErrInvalid)
	}
	return nil
}

func (a serviceAllocator) Acquire(ctx context.Context, region int, owner string) (segment.Lease, error) {
	if err := a.served(region); err != nil {
		return segment.Lease{}, err
	}
	return a.s.store.Acquire(ctx, region, owner)
}

func (a serviceAllocator) Renew(ctx context.Context, l segment.Lease) (segment.Lease, error) {
	if err := a.served(l.Region); err != nil {
		return segment.Lease{}, err
	}
	return a.s.store.Renew(ctx, l)
}

func (a serviceAllocator) Release(ctx context.Context, l segment.Lease) error {
	if err := a.served(l.Region); err != nil {
		return err
	}
	return a.s.store.Release(ctx, l)
}

func (a serviceAllocator) Allocate(ctx context.Context, l segment.Lease, n int) (segment.Block, error) {
	if err := a.served(l.Region); err != nil {
		return segment.Block{}, err
	}
	b, err := a.s.store.Allocate(ctx, l, n)
	if err == nil {
		a.s.mu.Lock()
		a.s.grants = append(a.s.grants, Grant{Block: b, Token: l.Token})
		a.s.mu.Unlock()
	}
	return b, err
}

// Method names one Allocator call, for Conn.Calls and Conn.Hook.
type Method int

// The Allocator methods.
const (
	Acquire Method = iota
	Renew
	Release
	Allocate
	numMethods
)

func (m Method) String() string {
	return [...]string{"Acquire", "Renew", "Release", "Allocate"}[m]
}

// Fault is what a Conn does to calls.
type Fault int32

// Faults a Conn can inject.
const (
	// Healthy: calls reach the service.
	Healthy Fault = iota
	// Unreachable: calls fail at once with segment.ErrUnavailable and do
	// not reach the service (connection refused).
	Unreachable
	// Blackhole: calls hang until the fault changes or their ctx ends, and
	// do not reach the service (a partition that drops packets).
	Blackhole
	// HoldReplies: calls reach the service and take effect, but the reply
	// is held until the fault changes, ignoring ctx: the worst case of a
	// process paused (SIGSTOP, VM pause) with requests in flight.
	HoldReplies
)

// Conn is one client's connection to a Service (or, made by Wrap, to any
// allocator): a segment.Allocator that counts calls and injects faults.
// Safe for concurrent use.
type Conn struct {
	s       *Service // nil for Wrap
	backend segment.Allocator

	mu      sync.Mutex
	fault   Fault
	delay   time.Duration
	changed chan struct{} // closed when fault changes
	hook    func(ctx context.Context, m Method) error

	calls [numMethods]atomic.Int64
}

// SetFault sets the fault applied to this connection's calls from now on;
// calls blocked by Blackhole or HoldReplies re-check it.
func (c *Conn) SetFault(f Fault) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fault = f
	close(c.changed)
	c.changed = make(chan struct{})
}

// SetDelay makes every call take d longer (before it reaches the service),
// bounded by the call's ctx.
func (c *Conn) SetDelay(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.delay = d
}

// SetHook installs f, called at the start of every call (after counting);
// a non-nil result is returned instead of calling the service. f may block.
func (c *Conn) SetHook(f func(ctx context.Context, m Method) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.hook = f
}

// Calls returns how many calls of m were made on this connection.
func (c *Conn) Calls(m Method) int64 { return c.calls[m].Load() }

// TotalCalls returns the number of calls of all methods.
func (c *Conn) TotalCalls() int64 {
	var n int64
	for i := range c.calls {
		n += c.calls[i].Load()
	}
	return n
}

// Service returns the in-memory service behind the connection (nil for a
// Conn made by Wrap).
func (c *Conn) Service() *Service { return c.s }

func (c *Conn) state() (Fault, time.Duration, <-chan struct{}, func(context.Context, Method) error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.fault, c.delay, c.changed, c.hook
}

// do runs one call through the fault injection; call gets the context to
// pass on.
func (c *Conn) do(ctx context.Context, m Method, call func(context.Context) error) error {
	c.calls[m].Add(1)
	f, delay, changed, hook := c.state()
	if hook != nil {
		if err := hook(ctx, m); err != nil {
			return err
		}
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%v: %v: %w", m, ctx.Err(), segment.ErrUnavailable)
		}
	}
	for {
		switch f {
		case Unreachable:
			return fmt.Errorf("%v: service unreachable: %w", m, segment.ErrUnavailable)
		case Blackhole:
			select {
			case <-changed:
				f, _, changed, _ = c.state()
				continue
			case <-ctx.Done():
				return fmt.Errorf("%v: %v: %w", m, ctx.Err(), segment.ErrUnavailable)
			}
		case HoldReplies:
			// The request goes out with a context that outlives the
			// caller's deadline (the paused caller's timers do not run).
			err := call(context.WithoutCancel(ctx))
			for f == HoldReplies {
				<-changed
				f, _, changed, _ = c.state()
			}
			return err
		}
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("%v: %v: %w", m, err, segment.ErrUnavailable)
		}
		return call(ctx)
	}
}

// Acquire implements segment.Allocator.
func (c *Conn) Acquire(ctx context.Context, region int, owner string) (l segment.Lease, err error) {
	err = c.do(ctx, Acquire, func(ctx context.Context) (err error) { l, err = c.backend.Acquire(ctx, region, owner); return err })
	return l, err
}

// Renew implements segment.Allocator.
func (c *Conn) Renew(ctx context.Context, l segment.Lease) (out segment.Lease, err error) {
	err = c.do(ctx, Renew, func(ctx context.Context) (err error) { out, err = c.backend.Renew(ctx, l); return err })
	return out, err
}

// Release implements segment.Allocator.
func (c *Conn) Release(ctx context.Context, l segment.Lease) error {
	return c.do(ctx, Release, func(ctx context.Context) error { return c.backend.Release(ctx, l) })
}

// Allocate implements segment.Allocator.
func (c *Conn) Allocate(ctx context.Context, l segment.Lease, n int) (b segment.Block, err error) {
	err = c.do(ctx, Allocate, func(ctx context.Context) (err error) { b, err = c.backend.Allocate(ctx, l, n); return err })
	return b, err
}

var _ segment.Allocator = (*Conn)(nil)

// Overlaps returns a pair of grants of one code whose ranges intersect
// (the first such pair by code, then by Lo), or ok=false if there is none.
func Overlaps(gs []Grant) (a, b Grant, ok bool) {
	spans := make([]overlap.Span, len(gs))
	for i, g := range gs {
		spans[i] = overlap.Span{Region: g.Region, Worker: g.Worker, Lo: g.Lo, Hi: g.Hi}
	}
	ps := overlap.Find(spans)
	if len(ps) == 0 {
		return Grant{}, Grant{}, false
	}
	return gs[ps[0].Earlier], gs[ps[0].Later], true
}

// GrantIndex finds the grant that holds an ID in O(log n).
type GrantIndex struct {
	byCode map[[2]int][]Grant // sorted by Lo
}

// Index builds a GrantIndex over gs.
func Index(gs []Grant) *GrantIndex {
	x := &GrantIndex{byCode: map[[2]int][]Grant{}}
	for _, g := range gs {
		k := [2]int{g.Region, g.Worker}
		x.byCode[k] = append(x.byCode[k], g)
	}
	for _, list := range x.byCode {
		slices.SortFunc(list, func(a, b Grant) int { return cmp.Compare(a.Lo, b.Lo) })
	}
	return x
}

// Find returns the grant of id's code with Lo <= segment.Linear(id) < Hi.
func (x *GrantIndex) Find(id snowflake.ID) (Grant, bool) {
	list := x.byCode[[2]int{id.Region(), id.Worker()}]
	l := segment.Linear(id)
	i := sort.Search(len(list), func(i int) bool { return list[i].Hi > l })
	if i < len(list) && list[i].Lo <= l {
		return list[i], true
	}
	return Grant{}, false
}
