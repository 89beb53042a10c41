package comparerun

import (
	"bytes"
	"context"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/testing/localregion"
	"github.com/idrange/idrange/internal/testing/localregion/regiontest"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/rangeclient"
	"github.com/idrange/idrange/snowflake"
)

// sharedRegion is one in-process region for the package's tests (etcd
// start-up is the slow part); it lives until the test binary exits.
var sharedRegion = regiontest.Shared[*localregion.Region]{What: "region",
	Start: func(ctx context.Context) (*localregion.Region, error) {
		return localregion.Start(ctx, localregion.Config{Region: 1, NextMinter: nextMinter})
	}}

func TestMain(m *testing.M) { os.Exit(sharedRegion.Main(m)) }

// A short run of every built-in strategy produces a complete report: all
// seven present, positive rates and latencies, the network strategies
// counted (RPCs, etcd writes) and the local ones not, every 64-bit ID
// checked, JSON that decodes back, and Markdown with both tables.
func TestRunAllStrategies(t *testing.T) {
	r := sharedRegion.Get(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rep, err := Run(ctx, Config{Region: r, Duration: 600 * time.Millisecond, Goroutines: 3})
	if err != nil {
		t.Fatal(err)
	}
	if err := rep.Err(); err != nil {
		t.Fatalf("report error: %v", err)
	}

	back := measure.RoundTrip[Report](t, rep.WriteJSON)
	want := []string{LocalName, BwmarrinName, SonyflakeName, BufferedName, PerIDRPCName, SegmentPerCallName, UUIDv7Name}
	if len(back.Results) != len(want) {
		t.Fatalf("%d results, want %d", len(back.Results), len(want))
	}
	for i, name := range want {
		res := back.Results[i]
		if res.Name != name {
			t.Fatalf("result %d is %q, want %q", i, res.Name, name)
		}
		if res.Error != "" {
			t.Errorf("%s: %s", name, res.Error)
		}
		for _, ph := range []Phase{res.Single, res.Multi} {
			if ph.IDs <= 0 || ph.Calls <= 0 || ph.IDsPerSec <= 0 || ph.Latency.P50 <= 0 || ph.Latency.Max < ph.Latency.P999 {
				t.Errorf("%s at %d goroutines: non-positive figures %+v", name, ph.Goroutines, ph)
			}
		}
		if res.Single.Goroutines != 1 || res.Multi.Goroutines != 3 {
			t.Errorf("%s: goroutines %d/%d, want 1/3", name, res.Single.Goroutines, res.Multi.Goroutines)
		}
		if res.Verify.Checked <= 0 || res.Verify.Duplicates != 0 || res.Verify.Checked > res.Verify.Minted {
			t.Errorf("%s: verify %+v", name, res.Verify)
		}
		if res.RatioSingle <= 0 || res.RatioMulti <= 0 {
			t.Errorf("%s: ratios %v/%v", name, res.RatioSingle, res.RatioMulti)
		}
	}
	local, rpc, seg := back.Result(LocalName), back.Result(PerIDRPCName), back.Result(SegmentPerCallName)
	if local.RPCsPer1M != 0 || local.EtcdWritesPer1M != 0 || local.RatioSingle != 1 {
		t.Errorf("local: %v RPCs/1M, %v writes/1M, ratio %v", local.RPCsPer1M, local.EtcdWritesPer1M, local.RatioSingle)
	}
	// One MintBatch(1) RPC per ID, exactly (no failed calls in a healthy run).
	if rpc.RPCsPer1M != 1e6 {
		t.Errorf("per-id-rpc: %v RPCs per 1M IDs, want 1,000,000", rpc.RPCsPer1M)
	}
	// One AllocateBlock per call, so at least 1e6/BatchMax per 1M IDs,
	// and one etcd write (grant) each.
	if seg.RPCsPer1M < 1e6/DefaultBatchMax || seg.EtcdWritesPer1M < 1e6/DefaultBatchMax {
		t.Errorf("segment-per-call: %v RPCs and %v etcd writes per 1M IDs, want >= %v", seg.RPCsPer1M, seg.EtcdWritesPer1M, 1e6/DefaultBatchMax)
	}
	if buf := back.Result(BufferedName); buf.RPCsPer1M <= 0 || buf.EtcdWritesPer1M <= 0 || buf.RPCsPer1M >= seg.RPCsPer1M {
		t.Errorf("buffered: %v RPCs / %v writes per 1M IDs (segment-per-call %v)", buf.RPCsPer1M, buf.EtcdWritesPer1M, seg.RPCsPer1M)
	}
	if u := back.Result(UUIDv7Name); u.Bits != 128 || u.Deterministic || u.BytesPerID != 16 {
		t.Errorf("uuidv7 info %+v", u.Info)
	}
	for _, name := range []string{BwmarrinName, SonyflakeName} {
		p := back.Result(name)
		if p.Bits != 64 || p.BytesPerID != 8 || !p.Deterministic || !p.TimeOrdered {
			t.Errorf("%s info %+v", name, p.Info)
		}
		if p.RPCsPer1M != 0 || p.EtcdWritesPer1M != 0 {
			t.Errorf("%s: %v RPCs/1M, %v etcd writes/1M, want none", name, p.RPCsPer1M, p.EtcdWritesPer1M)
		}
		// The library's own decoding puts every ID within a second of the
		// call that got it (a wrong epoch or shift would be years off).
		for _, ph := range []Phase{p.Single, p.Multi} {
			if ph.MaxLeadMs > 1000 || ph.MaxLagMs > 1000 {
				t.Errorf("%s at %d goroutines: timestamps up to %d ms ahead / %d ms behind the clock", name, ph.Goroutines, ph.MaxLeadMs, ph.MaxLagMs)
			}
		}
	}
	// sonyflake's cap: 256 IDs per 10 ms unit per machine ID (plus what is
	// left of the unit in progress when a phase starts).
	for _, ph := range []Phase{back.Result(SonyflakeName).Single, back.Result(SonyflakeName).Multi} {
		if units := int64(time.Duration(ph.Elapsed)/(10*time.Millisecond)) + 2; ph.IDs > 256*units {
			t.Errorf("sonyflake at %d goroutines: %d IDs in %v, above its cap of 256 per 10 ms", ph.Goroutines, ph.IDs, time.Duration(ph.Elapsed))
		}
	}

	var md bytes.Buffer
	if err := rep.WriteMarkdown(&md); err != nil {
		t.Fatal(err)
	}
	for _, s := range append(want, "| strategy | goroutines | IDs/s |", "etcd writes / 1M IDs", "buffered vs local", "per-ID RPC vs buffered",
		"bwmarrin vs local", "sonyflake vs local", "25,600 IDs/s per machine ID") {
		if !strings.Contains(md.String(), s) {
			t.Errorf("markdown lacks %q:\n%s", s, md.String())
		}
	}
}

// dupStrategy wraps local minting and hands out one ID twice, to prove the
// check can fail.
type dupStrategy struct{ Strategy }

func (d dupStrategy) Info() Info {
	i := d.Strategy.Info()
	i.Name = "local-with-duplicate"
	return i
}

func (d dupStrategy) Start(ctx context.Context, env Env) (Instance, error) {
	inst, err := d.Strategy.Start(ctx, env)
	if err != nil {
		return nil, err
	}
	return &dupInstance{Instance: inst}, nil
}

type dupInstance struct {
	Instance
	once sync.Once
	prev snowflake.ID
	mu   sync.Mutex
}

func (d *dupInstance) Worker() Worker { return dupWorker{d, d.Instance.Worker()} }

type dupWorker struct {
	d *dupInstance
	w Worker
}

func (w dupWorker) Mint(ctx context.Context, n int, out *Batch) error {
	if err := w.w.Mint(ctx, n, out); err != nil {
		return err
	}
	w.d.mu.Lock()
	defer w.d.mu.Unlock()
	if w.d.prev == 0 {
		w.d.prev = out.IDs[0]
	} else {
		w.d.once.Do(func() { out.IDs[len(out.IDs)-1] = w.d.prev })
	}
	return nil
}

func TestDuplicateIsCaught(t *testing.T) {
	rep, err := Run(context.Background(), Config{Strategies: []Strategy{Local(), dupStrategy{Local()}}, Duration: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Result(LocalName).Verify.Duplicates != 0 {
		t.Fatal("clean local strategy reported duplicates")
	}
	res := rep.Result("local-with-duplicate")
	if res.Verify.Duplicates != 1 || res.Verify.Problem == "" {
		t.Fatalf("planted duplicate not found: %+v", res.Verify)
	}
	if !errors.Is(rep.Err(), ErrVerify) {
		t.Fatalf("Err = %v, want ErrVerify", rep.Err())
	}
	var md bytes.Buffer
	rep.WriteMarkdown(&md)
	if !strings.Contains(md.String(), "VERIFY FAILED") {
		t.Fatalf("markdown does not flag the failure:\n%s", md.String())
	}
}

// A strategy that checked no ID fails the report: an empty check proves
// nothing, whatever it minted.
func TestNothingCheckedFails(t *testing.T) {
	rep := &Report{Results: []Result{{Info: Info{Name: "silent"}, Verify: Verify{Minted: 10}}}}
	if err := rep.Err(); !errors.Is(err, ErrVerify) || !strings.Contains(err.Error(), "strategy silent: no IDs checked (10 minted)") {
		t.Fatalf("Err of a strategy that checked nothing: %v; want ErrVerify naming it", err)
	}
}

func TestIDsBoundAndConfig(t *testing.T) {
	rep, err := Run(context.Background(), Config{Strategies: []Strategy{Local(), UUIDv7()}, Duration: 10 * time.Second, IDs: 5000, Goroutines: 2})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range rep.Results {
		// each goroutine stops at its quota; a call may overshoot by < BatchMax
		for _, ph := range []Phase{res.Single, res.Multi} {
			if ph.IDs < 5000 || ph.IDs >= 5000+int64(ph.Goroutines*DefaultBatchMax) {
				t.Errorf("%s: %d IDs with a 5000 cap at %d goroutines", res.Name, ph.IDs, ph.Goroutines)
			}
			if time.Duration(ph.Elapsed) > 5*time.Second {
				t.Errorf("%s: the ID bound did not end the phase early (%v)", res.Name, time.Duration(ph.Elapsed))
			}
		}
	}
	for name, cfg := range map[string]Config{
		"needs region": {Strategies: []Strategy{Buffered(rangeclient.Config{})}},
		"batch":        {BatchMin: 5, BatchMax: 2},
		"goroutines":   {Goroutines: -1},
		"duration":     {Duration: time.Millisecond},
		"repeated":     {Strategies: []Strategy{Local(), Local()}},
	} {
		if _, err := Run(context.Background(), cfg); err == nil {
			t.Errorf("%s: bad config accepted", name)
		}
	}
	if _, err := ByName([]string{"local", "nope"}); err == nil || !strings.Contains(err.Error(), SonyflakeName) {
		t.Errorf("unknown strategy name: %v, want an error listing the names", err)
	}
	got, err := ByName([]string{SonyflakeName, BwmarrinName})
	if err != nil || len(got) != 2 || got[0].Info().Name != SonyflakeName || got[1].Info().Name != BwmarrinName {
		t.Errorf("ByName(sonyflake, bwmarrin) = %v, %v", got, err)
	}
}

// timeShifted reports a peer's IDs as minted two hours later than the
// library says, to prove the range check of a peer layout can fail.
type timeShifted struct{ Strategy }

func (s timeShifted) Info() Info {
	i := s.Strategy.Info()
	i.Name += "-shifted"
	return i
}

func (s timeShifted) IDTime(id int64) time.Time {
	return s.Strategy.(TimeDecoder).IDTime(id).Add(2 * time.Hour)
}

// dupPeer plants a duplicate among a peer's IDs (in the peer's layout).
type dupPeer struct {
	dupStrategy
	TimeDecoder
}

// The peers' IDs go through the same uniqueness check as ours (a planted
// duplicate is found), and their timestamps, decoded by the library, through
// a range check (a decoder two hours off is caught).
func TestPeerIDsVerified(t *testing.T) {
	rep, err := Run(context.Background(), Config{Strategies: []Strategy{
		Bwmarrin(), dupPeer{dupStrategy{Bwmarrin()}, Bwmarrin().(TimeDecoder)}, timeShifted{Sonyflake()}}, Duration: 100 * time.Millisecond, Goroutines: 2})
	if err != nil {
		t.Fatal(err)
	}
	if v := rep.Result(BwmarrinName).Verify; v.Duplicates != 0 || v.OutOfRange != 0 || v.Checked == 0 || v.Checked != v.Minted {
		t.Fatalf("clean bwmarrin run: %+v", v)
	}
	if v := rep.Result("local-with-duplicate").Verify; v.Duplicates != 1 || v.OutOfRange != 0 {
		t.Fatalf("planted duplicate among bwmarrin IDs not found: %+v", v)
	}
	if v := rep.Result(SonyflakeName + "-shifted").Verify; v.OutOfRange != v.Checked || v.Checked == 0 || !strings.Contains(v.Problem, "out of time range") {
		t.Fatalf("sonyflake IDs decoded two hours off: %+v, want all out of range", v)
	}
	if !errors.Is(rep.Err(), ErrVerify) {
		t.Fatalf("Err = %v, want ErrVerify", rep.Err())
	}
}

// The peers' TimeDecoders are the libraries' own decoders: an ID minted now
// decodes to now.
func TestPeerTimestamps(t *testing.T) {
	for _, s := range []Strategy{Bwmarrin(), Sonyflake()} {
		inst, err := s.Start(context.Background(), Env{})
		if err != nil {
			t.Fatal(err)
		}
		var b Batch
		before := time.Now()
		if err := inst.Worker().Mint(context.Background(), 3, &b); err != nil {
			t.Fatal(err)
		}
		after := time.Now()
		inst.Close()
		for _, id := range b.IDs {
			ts := s.(TimeDecoder).IDTime(int64(id))
			if ts.Before(before.Add(-10*time.Millisecond)) || ts.After(after) {
				t.Errorf("%s: id %d decodes to %v, minted between %v and %v", s.Info().Name, id, ts, before, after)
			}
		}
	}
}
