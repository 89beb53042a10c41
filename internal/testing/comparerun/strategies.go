package comparerun

import (
	"bytes"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
	"github.com/google/uuid"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/internal/wire"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// Names of the built-in strategies.
const (
	LocalName          = "local"
	BufferedName       = "buffered"
	PerIDRPCName       = "per-id-rpc"
	SegmentPerCallName = "segment-per-call"
	UUIDv7Name         = "uuidv7"
	BwmarrinName       = "bwmarrin"
	SonyflakeName      = "sonyflake"
)

// Info describes a strategy: its name and the properties it has by
// construction (the run measures the rest).
type Info struct {
	Name        string `json:"name"`
	Description string `json:"description"`
	// Bits is the ID's size: 64 or 128.
	Bits int `json:"bits"`
	// BytesPerID is the binary storage size of one ID (a database column).
	BytesPerID int `json:"bytes_per_id"`
	// Deterministic: uniqueness follows from the construction (codes,
	// fencing, high-water marks), not from the odds of a random collision.
	Deterministic bool `json:"deterministic"`
	// TimeOrdered: IDs carry a millisecond timestamp in their top bits, so
	// sorting by ID sorts by creation time (roughly, across minters).
	TimeOrdered bool `json:"time_ordered"`
	// NeedsRegion: the strategy talks to the range service.
	NeedsRegion bool `json:"-"`
}

// TimeDecoder is implemented by strategies whose 64-bit IDs are in a layout
// other than snowflake's (the peer libraries). IDTime is the instant an
// ID's timestamp names, decoded by the library; the check then covers
// uniqueness, the sign bit and that instant's range instead of snowflake's
// fields.
type TimeDecoder interface {
	IDTime(id int64) time.Time
}

// Env is what a strategy may use when it starts.
type Env struct {
	Region Region
}

// Strategy is one way of minting IDs.
type Strategy interface {
	Info() Info
	// Start prepares an instance (generator, client, connection, lease).
	Start(ctx context.Context, env Env) (Instance, error)
}

// Instance is a started strategy shared by the goroutines of a phase.
type Instance interface {
	// Worker returns the minter one goroutine uses. Workers of one instance
	// share its state (one code, one connection).
	Worker() Worker
	// Calls reports the network calls made so far.
	Calls() Calls
	// Close releases everything Start acquired.
	Close() error
}

// Calls counts what an instance sent over the network: gRPC calls, and
// message bytes each way (including gRPC's 5-byte framing, not HTTP/2 or
// TCP overhead).
type Calls struct {
	Calls, SentBytes, RecvBytes uint64
}

func callsOf(c *measure.RPCCounter) Calls {
	s := c.Snapshot()
	return Calls{Calls: s.Calls, SentBytes: s.SentBytes, RecvBytes: s.RecvBytes}
}

// Worker mints for one goroutine; it need not be safe for concurrent use.
type Worker interface {
	// Mint appends n IDs to out.IDs (64-bit strategies) or out.UUIDs.
	Mint(ctx context.Context, n int, out *Batch) error
}

// Batch receives the IDs of one call: 64-bit IDs in IDs (in snowflake's
// layout unless the strategy is a TimeDecoder), 128-bit ones in UUIDs.
type Batch struct {
	IDs   []snowflake.ID
	UUIDs [][16]byte
}

// Default returns the built-in strategies in report order: local minting
// and the two peer libraries a user would pick instead of it, then the
// service-backed strategies, then UUIDv7.
func Default() []Strategy {
	return []Strategy{Local(), Bwmarrin(), Sonyflake(), Buffered(rangeclient.Config{}), PerIDRPC(), SegmentPerCall(), UUIDv7()}
}

// ByName returns the built-in strategies named, in the order given.
func ByName(names []string) ([]Strategy, error) {
	all := map[string]Strategy{}
	var known []string
	for _, s := range Default() {
		all[s.Info().Name] = s
		known = append(known, s.Info().Name)
	}
	out := make([]Strategy, 0, len(names))
	for _, n := range names {
		s, ok := all[n]
		if !ok {
			return nil, errors.Newf("compare: unknown strategy %q (want one of %s)", n, strings.Join(known, ", "))
		}
		out = append(out, s)
	}
	return out, nil
}

// funcStrategy adapts a start function.
type funcStrategy struct {
	info  Info
	start func(ctx context.Context, env Env) (Instance, error)
}

func (f funcStrategy) Info() Info { return f.info }
func (f funcStrategy) Start(ctx context.Context, env Env) (Instance, error) {
	return f.start(ctx, env)
}

// NewStrategy builds a Strategy from its Info and a start function (tests
// and experiments add their own this way).
func NewStrategy(info Info, start func(ctx context.Context, env Env) (Instance, error)) Strategy {
	return funcStrategy{info, start}
}

// ---- local ----

// LocalRegion and LocalWorker are the static code of the local strategy
// (outside the codes the service hands out in region 0).
const (
	LocalRegion = snowflake.MaxRegion
	LocalWorker = snowflake.MaxWorker
)

// Local is pure local minting: one snowflake.Generator with a static code
// and an in-memory ceiling, shared by the phase's goroutines.
func Local() Strategy {
	return NewStrategy(Info{
		Name: LocalName, Description: "snowflake.Generator, static code, no network",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true,
	}, func(ctx context.Context, _ Env) (Instance, error) {
		g, err := snowflake.NewGenerator(snowflake.Config{Region: LocalRegion, Worker: LocalWorker, HighWater: snowflake.NewMemHighWater()})
		if err != nil {
			return nil, err
		}
		return &localInstance{g: g}, nil
	})
}

type localInstance struct{ g *snowflake.Generator }

func (l *localInstance) Worker() Worker { return localWorker{l.g} }
func (l *localInstance) Calls() Calls   { return Calls{} }
func (l *localInstance) Close() error   { return l.g.Close() }
func (l *localInstance) Waits() uint64  { return l.g.Stats().SequenceExhausted }

type localWorker struct{ g *snowflake.Generator }

func (w localWorker) Mint(ctx context.Context, n int, out *Batch) (err error) {
	out.IDs, err = w.g.AppendN(ctx, out.IDs, n)
	return err
}

// ---- uuidv7 ----

// UUIDv7 is github.com/google/uuid NewV7: 48-bit Unix ms, 12 bits of
// sub-millisecond order kept per process, 62 random bits.
func UUIDv7() Strategy {
	return NewStrategy(Info{
		Name: UUIDv7Name, Description: "github.com/google/uuid NewV7 (RFC 9562), no coordination",
		Bits: 128, BytesPerID: 16, Deterministic: false, TimeOrdered: true,
	}, func(context.Context, Env) (Instance, error) { return uuidInstance{}, nil })
}

type uuidInstance struct{}

func (uuidInstance) Worker() Worker { return uuidWorker{} }
func (uuidInstance) Calls() Calls   { return Calls{} }
func (uuidInstance) Close() error   { return nil }

type uuidWorker struct{}

func (uuidWorker) Mint(_ context.Context, n int, out *Batch) error {
	for range n {
		u, err := uuid.NewV7()
		if err != nil {
			return errors.Wrap(err, "uuid.NewV7")
		}
		out.UUIDs = append(out.UUIDs, u)
	}
	return nil
}

// uuidMs is the Unix millisecond of a version 7 UUID (its top 48 bits).
func uuidMs(u [16]byte) int64 {
	var ms int64
	for _, b := range u[:6] {
		ms = ms<<8 | int64(b)
	}
	return ms
}

func lessU(a, b [16]byte) bool { return bytes.Compare(a[:], b[:]) < 0 }

// uuidSet collects UUIDs for a sort-based duplicate check.
type uuidSet struct{ u [][16]byte }

func (s *uuidSet) add(u [][16]byte) { s.u = append(s.u, u...) }

func (s *uuidSet) check() (checked, dups int64) {
	slices.SortFunc(s.u, func(a, b [16]byte) int { return bytes.Compare(a[:], b[:]) })
	for i := 1; i < len(s.u); i++ {
		if s.u[i] == s.u[i-1] {
			dups++
		}
	}
	return int64(len(s.u)), dups
}

// ---- network strategies ----

// dialCounted connects to the region's service with a call counter.
func dialCounted(env Env) (*grpc.ClientConn, *measure.RPCCounter, error) {
	if env.Region == nil {
		return nil, nil, errors.New("compare: no region")
	}
	cnt := &measure.RPCCounter{}
	opts := append([]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())}, cnt.DialOptions()...)
	cc, err := grpc.NewClient(env.Region.Addr(), opts...)
	if err != nil {
		return nil, nil, errors.Wrapf(err, "dial %s", env.Region.Addr())
	}
	return cc, cnt, nil
}

// Buffered is rangeclient over loopback gRPC to the region's service:
// leases, prefetched double-buffered blocks, an in-memory step per ID.
// base carries tuning (RefillInterval, FixedBlock, ...); Targets, Region
// and the counting dial options are filled in.
func Buffered(base rangeclient.Config) Strategy {
	return NewStrategy(Info{
		Name: BufferedName, Description: "rangeclient: prefetched blocks from rangesvc (embedded etcd, loopback gRPC)",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true, NeedsRegion: true,
	}, func(ctx context.Context, env Env) (Instance, error) {
		if env.Region == nil {
			return nil, errors.New("compare: buffered needs a region")
		}
		cnt := &measure.RPCCounter{}
		cfg := base
		cfg.Targets = []string{env.Region.Addr()}
		cfg.Region = env.Region.RegionID()
		cfg.DialOptions = append(slices.Clone(cfg.DialOptions), cnt.DialOptions()...)
		if cfg.Owner == "" {
			cfg.Owner = "compare/buffered"
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		c, err := rangeclient.New(sctx, cfg)
		if err != nil {
			return nil, err
		}
		return &bufferedInstance{c: c, cnt: cnt}, nil
	})
}

type bufferedInstance struct {
	c   *rangeclient.Client
	cnt *measure.RPCCounter
}

func (b *bufferedInstance) Worker() Worker { return bufferedWorker{b.c} }
func (b *bufferedInstance) Calls() Calls   { return callsOf(b.cnt) }
func (b *bufferedInstance) Close() error   { return b.c.Close() }
func (b *bufferedInstance) Waits() uint64  { return b.c.Stats().Stalls }

type bufferedWorker struct{ c *rangeclient.Client }

func (w bufferedWorker) Mint(ctx context.Context, n int, out *Batch) (err error) {
	out.IDs, err = w.c.AppendN(ctx, out.IDs, n)
	return err
}

// PerIDRPC calls the service's product mint API, MintBatch, with count 1
// once per ID: the centralised sequence docs/design.md rules out for hot
// paths, measured through the same RPC non-Go callers use. The service mints
// from its own buffered client.
func PerIDRPC() Strategy {
	return NewStrategy(Info{
		Name: PerIDRPCName, Description: "one MintBatch(count=1) RPC per ID to the central service",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true, NeedsRegion: true,
	}, func(ctx context.Context, env Env) (Instance, error) {
		cc, cnt, err := dialCounted(env)
		if err != nil {
			return nil, err
		}
		stop, err := env.Region.EnableNext(ctx)
		if err != nil {
			cc.Close()
			return nil, errors.Wrap(err, "enable the service's minter")
		}
		return &perIDInstance{cc: cc, cnt: cnt, c: idrangev1.NewRangeServiceClient(cc), stop: stop}, nil
	})
}

type perIDInstance struct {
	cc   *grpc.ClientConn
	cnt  *measure.RPCCounter
	c    idrangev1.RangeServiceClient
	stop func() error
}

func (p *perIDInstance) Worker() Worker { return perIDWorker{p.c} }
func (p *perIDInstance) Calls() Calls   { return callsOf(p.cnt) }
func (p *perIDInstance) Close() error {
	err := p.stop()
	if cerr := p.cc.Close(); err == nil {
		err = cerr
	}
	return err
}

type perIDWorker struct{ c idrangev1.RangeServiceClient }

func (w perIDWorker) Mint(ctx context.Context, n int, out *Batch) error {
	for range n {
		resp, err := w.c.MintBatch(ctx, &idrangev1.MintBatchRequest{Count: 1})
		if err != nil {
			return wire.FromStatus(err)
		}
		if len(resp.GetIds()) != 1 {
			return errors.Newf("compare: MintBatch(1) returned %d IDs", len(resp.GetIds()))
		}
		id := snowflake.ID(resp.GetIds()[0])
		if _, err := snowflake.Decode(id); err != nil {
			return errors.Newf("compare: MintBatch returned %d, not a valid ID", resp.GetIds()[0])
		}
		out.IDs = append(out.IDs, id)
	}
	return nil
}

// SegmentPerCall is the naive segment client: one lease, and one
// AllocateBlock (one etcd write) for every call, exactly as large as the
// call.
func SegmentPerCall() Strategy {
	return NewStrategy(Info{
		Name: SegmentPerCallName, Description: "AllocateBlock for every call of 1-16 IDs (no buffering)",
		Bits: 64, BytesPerID: 8, Deterministic: true, TimeOrdered: true, NeedsRegion: true,
	}, func(ctx context.Context, env Env) (Instance, error) {
		cc, cnt, err := dialCounted(env)
		if err != nil {
			return nil, err
		}
		a := wire.NewAllocator(cc)
		actx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		l, err := a.Acquire(actx, env.Region.RegionID(), "compare/segment-per-call")
		if err != nil {
			cc.Close()
			return nil, errors.Wrap(err, "acquire a lease")
		}
		s := &segmentInstance{cc: cc, cnt: cnt, a: a, lease: l, done: make(chan struct{})}
		s.wg.Add(1)
		go s.renew()
		return s, nil
	})
}

type segmentInstance struct {
	cc    *grpc.ClientConn
	cnt   *measure.RPCCounter
	a     segment.Allocator
	lease segment.Lease
	done  chan struct{}
	wg    sync.WaitGroup
	once  sync.Once
}

// renew keeps the lease alive every third of its TTL. A failure surfaces
// on the next Allocate as ErrFenced/ErrLeaseLost: the service fences.
func (s *segmentInstance) renew() {
	defer s.wg.Done()
	period := max(s.lease.TTL/3, 100*time.Millisecond)
	t := time.NewTicker(period)
	defer t.Stop()
	for {
		select {
		case <-s.done:
			return
		case <-t.C:
			ctx, cancel := context.WithTimeout(context.Background(), period)
			_, _ = s.a.Renew(ctx, s.lease)
			cancel()
		}
	}
}

func (s *segmentInstance) Worker() Worker { return segmentWorker{s} }
func (s *segmentInstance) Calls() Calls   { return callsOf(s.cnt) }
func (s *segmentInstance) Close() error {
	var err error
	s.once.Do(func() {
		close(s.done)
		s.wg.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		err = s.a.Release(ctx, s.lease)
		if cerr := s.cc.Close(); err == nil {
			err = cerr
		}
	})
	return err
}

type segmentWorker struct{ s *segmentInstance }

func (w segmentWorker) Mint(ctx context.Context, n int, out *Batch) error {
	for n > 0 {
		b, err := w.s.a.Allocate(ctx, w.s.lease, n)
		if err != nil {
			return err
		}
		for l := b.Lo; l < b.Hi && n > 0; l++ {
			out.IDs = append(out.IDs, b.ID(l))
			n--
		}
	}
	return nil
}

// String names a strategy for logs.
func (i Info) String() string { return fmt.Sprintf("%s (%d-bit)", i.Name, i.Bits) }
