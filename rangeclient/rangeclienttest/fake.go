// Package rangeclienttest is an in-memory range service for tests and
// benchmarks of code built on rangeclient or any segment.Allocator user.
//
// Service applies the same grant rules as the etcd-backed service
// (segment): one lease per worker code with a TTL on the service's clock,
// a fencing token that strictly grows with every new owner, a per-code
// high-water mark that only grows, Lo = max(HWM, now<<12), a bounded lead
// (refuse with *segment.Backpressure, or shrink), ValidUntil = end of the
// millisecond of Hi-1. It keeps every grant, so tests can check that no two
// blocks of a code overlap.
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
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Defaults for Options fields left zero.
const (
	DefaultTTL      = 10 * time.Second
	DefaultMaxLead  = 15 * time.Second
	DefaultMaxBlock = 10_000 << snowflake.SequenceBits
	DefaultWorkers  = snowflake.MaxWorker + 1
)

// maxLinear is the end (exclusive) of a code's linear space.
const maxLinear = int64(snowflake.MaxTimestamp+1) << snowflake.SequenceBits

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
	// TTL of leases (default 10 s), MaxLead of grants ahead of the service
	// clock (default 15 s), MaxBlock per request (default 40,960,000) and
	// Workers codes available in the region (default 256).
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

// Service is the shared state of one in-memory regional range service.
type Service struct {
	opts   Options
	origin time.Time

	mu        sync.Mutex
	codes     []code
	nextToken int64
	nextLease int64
	grants    []Grant
	skew      time.Duration // added to the service clock (rollback tests)
}

type code struct {
	hwm   int64
	owner *leaseRec // nil when never leased
}

type leaseRec struct {
	lease    segment.Lease
	owner    string
	expires  time.Time
	released bool
}

func (r *leaseRec) alive(now time.Time) bool {
	return r != nil && !r.released && now.Before(r.expires)
}

// New returns a Service with opts' defaults applied.
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
	return &Service{opts: opts, origin: time.Now(), codes: make([]code, opts.Workers), nextToken: 100}
}

// Now is the service's clock.
func (s *Service) Now() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.nowLocked()
}

func (s *Service) nowLocked() time.Time {
	if s.opts.Start.IsZero() {
		return time.Now().Add(s.skew)
	}
	return s.opts.Start.Add(time.Since(s.origin) + s.skew)
}

// AdjustClock moves the service's clock by d (negative: a rollback).
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

// HWM returns code worker's high-water mark.
func (s *Service) HWM(worker int) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.codes[worker].hwm
}

// Owner returns the live lease of code worker, if any.
func (s *Service) Owner(worker int) (segment.Lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	r := s.codes[worker].owner
	if !r.alive(s.nowLocked()) {
		return segment.Lease{}, false
	}
	return r.lease, true
}

// Revoke ends code worker's current lease at once, as if its TTL ran out.
// The old owner's next call gets segment.ErrLeaseLost (or ErrFenced once a
// new owner holds the code).
func (s *Service) Revoke(worker int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if r := s.codes[worker].owner; r != nil {
		r.released = true
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

// serviceAllocator is the Service as a segment.Allocator (no faults).
type serviceAllocator struct{ s *Service }

func (a serviceAllocator) Acquire(_ context.Context, region int, owner string) (segment.Lease, error) {
	return a.s.acquire(region, owner)
}
func (a serviceAllocator) Renew(_ context.Context, l segment.Lease) (segment.Lease, error) {
	return a.s.renew(l)
}
func (a serviceAllocator) Release(_ context.Context, l segment.Lease) error { return a.s.release(l) }
func (a serviceAllocator) Allocate(_ context.Context, l segment.Lease, n int) (segment.Block, error) {
	return a.s.allocate(l, n)
}

func (s *Service) acquire(region int, owner string) (segment.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if region != s.opts.Region {
		return segment.Lease{}, errors.Wrapf(segment.ErrInvalid, "region %d: this service serves region %d", region, s.opts.Region)
	}
	now := s.nowLocked()
	for w := range s.codes {
		if s.codes[w].owner.alive(now) {
			continue
		}
		s.nextToken++
		s.nextLease++
		l := segment.Lease{Region: region, Worker: w, Token: s.nextToken, LeaseID: s.nextLease, TTL: s.opts.TTL}
		s.codes[w].owner = &leaseRec{lease: l, owner: owner, expires: now.Add(s.opts.TTL)}
		return l, nil
	}
	return segment.Lease{}, errors.Wrapf(segment.ErrNoFreeCode, "all %d codes of region %d are leased", len(s.codes), region)
}

// check finds l's record and reports fencing.
func (s *Service) checkLocked(l segment.Lease, now time.Time) (*leaseRec, error) {
	if l.Region != s.opts.Region || l.Worker < 0 || l.Worker >= len(s.codes) {
		return nil, errors.Wrapf(segment.ErrInvalid, "lease for code %d/%d not served here", l.Region, l.Worker)
	}
	r := s.codes[l.Worker].owner
	switch {
	case r != nil && (r.lease.Token != l.Token || r.lease.LeaseID != l.LeaseID):
		if r.alive(now) {
			return nil, errors.Wrapf(segment.ErrFenced, "code %d/%d: token %d, current owner has %d", l.Region, l.Worker, l.Token, r.lease.Token)
		}
		return nil, errors.Wrapf(segment.ErrLeaseLost, "code %d/%d: lease %d is gone", l.Region, l.Worker, l.LeaseID)
	case !r.alive(now):
		return nil, errors.Wrapf(segment.ErrLeaseLost, "code %d/%d: lease %d expired or released", l.Region, l.Worker, l.LeaseID)
	}
	return r, nil
}

func (s *Service) renew(l segment.Lease) (segment.Lease, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.nowLocked()
	r, err := s.checkLocked(l, now)
	if err != nil {
		return segment.Lease{}, err
	}
	r.expires = now.Add(s.opts.TTL)
	l.TTL = s.opts.TTL
	return l, nil
}

func (s *Service) release(l segment.Lease) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	r, err := s.checkLocked(l, s.nowLocked())
	if err != nil {
		return err
	}
	r.released = true
	return nil
}

func (s *Service) allocate(l segment.Lease, n int) (segment.Block, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if n < 1 || n > s.opts.MaxBlock {
		return segment.Block{}, errors.Wrapf(segment.ErrInvalid, "count %d not in 1..%d", n, s.opts.MaxBlock)
	}
	now := s.nowLocked()
	if _, err := s.checkLocked(l, now); err != nil {
		return segment.Block{}, err
	}
	ms := snowflake.MsSince(now)
	if ms < 0 {
		return segment.Block{}, errors.Wrapf(segment.ErrInvalid, "service clock %v is before the epoch", now)
	}
	c := &s.codes[l.Worker]
	lo := max(c.hwm, ms<<snowflake.SequenceBits)
	if lo >= maxLinear {
		return segment.Block{}, errors.Wrap(segment.ErrEpochExhausted, "code's space is used up")
	}
	leadMs := s.opts.MaxLead.Milliseconds()
	limit := (ms + leadMs + 1) << snowflake.SequenceBits
	if lo >= limit {
		ahead := lo>>snowflake.SequenceBits - (ms + leadMs)
		return segment.Block{}, &segment.Backpressure{RetryAfter: time.Duration(ahead) * time.Millisecond}
	}
	hi := min(lo+int64(n), limit, maxLinear)
	c.hwm = hi
	b := segment.Block{
		Region:      l.Region,
		Worker:      l.Worker,
		Lo:          lo,
		Hi:          hi,
		ServiceTime: now,
		ValidUntil:  snowflake.MsTime((hi-1)>>snowflake.SequenceBits + 1).Add(-time.Nanosecond),
	}
	s.grants = append(s.grants, Grant{Block: b, Token: l.Token})
	return b, nil
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
			return errors.Wrapf(segment.ErrUnavailable, "%v: %v", m, ctx.Err())
		}
	}
	for {
		switch f {
		case Unreachable:
			return errors.Wrapf(segment.ErrUnavailable, "%v: service unreachable", m)
		case Blackhole:
			select {
			case <-changed:
				f, _, changed, _ = c.state()
				continue
			case <-ctx.Done():
				return errors.Wrapf(segment.ErrUnavailable, "%v: %v", m, ctx.Err())
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
			return errors.Wrapf(segment.ErrUnavailable, "%v: %v", m, err)
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

// Overlaps returns the first pair of grants of one code whose ranges
// intersect, or ok=false if there is none.
func Overlaps(gs []Grant) (a, b Grant, ok bool) {
	byCode := map[[2]int][]Grant{}
	for _, g := range gs {
		k := [2]int{g.Region, g.Worker}
		byCode[k] = append(byCode[k], g)
	}
	for _, list := range byCode {
		for i := range list {
			for j := i + 1; j < len(list); j++ {
				if list[i].Lo < list[j].Hi && list[j].Lo < list[i].Hi {
					return list[i], list[j], true
				}
			}
		}
	}
	return Grant{}, Grant{}, false
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
