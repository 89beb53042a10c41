package history

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	idrangev1 "github.com/idrange/idrange/api/idrangev1"
	"github.com/idrange/idrange/internal/testing/grpctest"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// fakeService answers with fixed values; renewals of token 99 are fenced.
type fakeService struct {
	idrangev1.UnimplementedRangeServiceServer
}

func (fakeService) AcquireLease(_ context.Context, q *idrangev1.AcquireLeaseRequest) (*idrangev1.AcquireLeaseResponse, error) {
	return &idrangev1.AcquireLeaseResponse{Lease: &idrangev1.Lease{Region: q.GetRegion(), Worker: 7, Token: 42, LeaseId: 5}, TtlMs: 3000}, nil
}

func (fakeService) RenewLease(_ context.Context, q *idrangev1.RenewLeaseRequest) (*idrangev1.RenewLeaseResponse, error) {
	if q.GetLease().GetToken() == 99 {
		return nil, status.Error(codes.FailedPrecondition, "fenced")
	}
	return &idrangev1.RenewLeaseResponse{TtlMs: 2500}, nil
}

func (fakeService) ReleaseLease(context.Context, *idrangev1.ReleaseLeaseRequest) (*idrangev1.ReleaseLeaseResponse, error) {
	return &idrangev1.ReleaseLeaseResponse{}, nil
}

func (fakeService) AllocateBlock(_ context.Context, q *idrangev1.AllocateBlockRequest) (*idrangev1.AllocateBlockResponse, error) {
	return &idrangev1.AllocateBlockResponse{Lo: 4096, Hi: 4096 + int64(q.GetCount()), ServiceTimeUnixNano: 10, ValidUntilUnixNano: 20}, nil
}

// AllocateShared grants a run of code 1/9 for counts up to 500 and is
// unavailable beyond.
func (fakeService) AllocateShared(_ context.Context, q *idrangev1.AllocateSharedRequest) (*idrangev1.AllocateSharedResponse, error) {
	if q.GetCount() > 500 {
		return nil, status.Error(codes.Unavailable, "no block")
	}
	return &idrangev1.AllocateSharedResponse{Region: 1, Worker: 9, Lo: 8192, Hi: 8192 + int64(q.GetCount()),
		ServiceTimeUnixNano: 30, ValidUntilUnixNano: 40}, nil
}

func TestInterceptorRecordsCalls(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h")
	before := Now()
	rec, err := Create(path, Header{Name: "m0", PID: 12, Region: 2, Margin: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cc := grpctest.Dial(t, func(s grpc.ServiceRegistrar) { idrangev1.RegisterRangeServiceServer(s, fakeService{}) },
		grpc.WithChainUnaryInterceptor(rec.UnaryClientInterceptor()))
	c := idrangev1.NewRangeServiceClient(cc)
	ctx := context.Background()
	if _, err := c.AcquireLease(ctx, &idrangev1.AcquireLeaseRequest{Region: 2}); err != nil {
		t.Fatal(err)
	}
	l := &idrangev1.Lease{Region: 2, Worker: 7, Token: 42, LeaseId: 5}
	if _, err := c.RenewLease(ctx, &idrangev1.RenewLeaseRequest{Lease: l}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.RenewLease(ctx, &idrangev1.RenewLeaseRequest{Lease: &idrangev1.Lease{Token: 99}}); err == nil {
		t.Fatal("token 99 renewed")
	}
	if _, err := c.AllocateBlock(ctx, &idrangev1.AllocateBlockRequest{Lease: l, Count: 100}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.ReleaseLease(ctx, &idrangev1.ReleaseLeaseRequest{Lease: l}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocateShared(ctx, &idrangev1.AllocateSharedRequest{Count: 64}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AllocateShared(ctx, &idrangev1.AllocateSharedRequest{Count: 501}); err == nil {
		t.Fatal("a shared run of 501 was granted")
	}
	rec.Minted(Now(), Now(), []snowflake.ID{segment.Block{Region: 2, Worker: 7}.ID(4096)})
	rec.Note(Now(), "client clock moved by -2s")
	if err := rec.Close(); err != nil {
		t.Fatal(err)
	}
	after := Now()

	h, err := ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if h.Name != "m0" || h.PID != 12 || h.Region != 2 || h.Margin != time.Second || h.Start < before {
		t.Fatalf("header %+v", h.Header)
	}
	if len(h.Leases) != 1 || h.Leases[0] != (Lease{Send: h.Leases[0].Send, Ret: h.Leases[0].Ret, Token: 42, Region: 2, Worker: 7, LeaseID: 5, TTL: 3 * time.Second}) {
		t.Fatalf("leases %+v", h.Leases)
	}
	if len(h.Renewals) != 1 || h.Renewals[0].Token != 42 || h.Renewals[0].TTL != 2500*time.Millisecond {
		t.Fatalf("renewals %+v", h.Renewals)
	}
	if len(h.Failed) != 2 || h.Failed[0].Method != "renew" || h.Failed[0].Token != 99 || h.Failed[0].Reason != "FailedPrecondition" ||
		h.Failed[1].Method != "shared" || h.Failed[1].Token != 0 || h.Failed[1].Reason != "Unavailable" {
		t.Fatalf("failed calls %+v", h.Failed)
	}
	if len(h.Shared) != 1 || h.Shared[0] != (SharedRun{Send: h.Shared[0].Send, Ret: h.Shared[0].Ret, Region: 1, Worker: 9,
		Lo: 8192, Hi: 8192 + 64, ServiceTime: 30, ValidUntil: 40}) || h.Shared[0].Ret < h.Shared[0].Send {
		t.Fatalf("shared runs %+v", h.Shared)
	}
	if len(h.Blocks) != 1 || h.Blocks[0].Lo != 4096 || h.Blocks[0].Hi != 4196 || h.Blocks[0].Worker != 7 || h.Blocks[0].ValidUntil != 20 {
		t.Fatalf("blocks %+v", h.Blocks)
	}
	if len(h.Releases) != 1 || len(h.Mints) != 1 || h.IDs() != 1 || len(h.Notes) != 1 || h.Notes[0].Text != "client clock moved by -2s" {
		t.Fatalf("releases %v mints %v notes %v", h.Releases, h.Mints, h.Notes)
	}
	for _, b := range []Block{h.Blocks[0]} {
		if b.Send < before || b.Ret < b.Send || b.Ret > after {
			t.Fatalf("times not bracketed: %+v in [%d,%d]", b, before, after)
		}
	}
}

func TestParseRejectsMalformed(t *testing.T) {
	const hdr = "H name=a pid=1 region=0 margin=0 start=1\n"
	for name, body := range map[string]string{
		"no header":        "A 1 2 3 0 1 5 100\n",
		"header dup field": "H name=a name=b pid=1 region=0 margin=0 start=1\n",
		"header missing":   "H name=a pid=1\n",
		"header region":    "H name=a pid=1 region=9 margin=0 start=1\n",
		"unknown tag":      hdr + "Z 1 2\n",
		"short A":          hdr + "A 1 2 3\n",
		"A bad ttl":        hdr + "A 1 2 3 0 1 5 0\n",
		"A bad worker":     hdr + "A 1 2 3 0 256 5 100\n",
		"B empty":          hdr + "B 1 2 3 0 1 10 10 0 0\n",
		"S empty":          hdr + "S 1 2 0 1 10 10 0 0\n",
		"S short":          hdr + "S 1 2 0 1 10 20 0\n",
		"S bad worker":     hdr + "S 1 2 0 256 10 20 0 0\n",
		"I no ids":         hdr + "I 1 2\n",
		"I not a number":   hdr + "I 1 2 x\n",
		"empty line":       hdr + "\n",
		"truncated":        hdr + "I 1 2 3",
		"empty":            "",
	} {
		if _, err := Parse(strings.NewReader(body), name); !errors.Is(err, ErrMalformed) {
			t.Errorf("%s: err = %v, want ErrMalformed", name, err)
		}
	}
}

func TestTailFollowsPartialLines(t *testing.T) {
	path := filepath.Join(t.TempDir(), "h")
	tl := NewTail(path)
	if h, err := tl.Poll(); err != nil || h.IDs() != 0 {
		t.Fatalf("missing file: %v", err)
	}
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	write := func(s string) {
		if _, err := f.WriteString(s); err != nil {
			t.Fatal(err)
		}
	}
	write("H name=a pid=1 region=0 margin=0 start=1\nI 1 2 4097 40")
	h, err := tl.Poll()
	if err != nil || h.IDs() != 0 || h.Name != "a" {
		t.Fatalf("after a partial line: ids=%d err=%v", h.IDs(), err)
	}
	write("98\nI 3 4 4099\n")
	if h, err = tl.Poll(); err != nil || h.IDs() != 3 || h.Mints[0].IDs[1] != 4098 {
		t.Fatalf("after completing it: %+v %v", h.Mints, err)
	}
}

// FuzzParse: no input makes the parser panic, and whatever it accepts is
// self-consistent (the ID count matches the mint lines, blocks are
// non-empty, codes in range).
func FuzzParse(f *testing.F) {
	f.Add("H name=a pid=1 region=0 margin=0 start=1\nI 1 2 4097 4098\n")
	f.Add("H name=a pid=1 region=1 margin=5 start=1 wall=3\nA 1 2 3 1 4 5 100\nB 1 2 3 1 4 10 20 0 0\nN 5 hello world\n")
	f.Add("H name=a pid=1 region=0 margin=0 start=1\nX 1 2 renew 3 Unavailable\nE 1 2 lease_lost\nR 1 2 3 4\nL 1 2 3\n")
	f.Add("H name=a pid=1 region=1 margin=0 start=1\nS 1 2 1 9 8192 8256 30 40\nX 1 2 shared 0 Unavailable\n")
	f.Fuzz(func(t *testing.T, s string) {
		h, err := Parse(strings.NewReader(s), "fuzz")
		if err != nil {
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("error %v is not ErrMalformed", err)
			}
			return
		}
		var n int64
		for _, m := range h.Mints {
			if len(m.IDs) == 0 {
				t.Fatal("accepted a mint line without ids")
			}
			n += int64(len(m.IDs))
		}
		if n != h.IDs() {
			t.Fatalf("IDs() = %d, lines hold %d", h.IDs(), n)
		}
		for _, b := range h.Blocks {
			if b.Hi <= b.Lo || b.Lo < 0 || b.Worker > snowflake.MaxWorker || b.Region > snowflake.MaxRegion {
				t.Fatalf("accepted block %+v", b)
			}
		}
		if h.Name == "" || h.Region < 0 || h.Region > snowflake.MaxRegion || h.Margin < 0 {
			t.Fatalf("accepted header %+v", h.Header)
		}
		// Whatever parses can be checked without panicking.
		_, _ = Check([]*History{h}, Config{Region: h.Region})
	})
}

// failAfter is a file that takes n bytes and then fails every write, as a
// full disk or a file size limit does.
type failAfter struct {
	n      int
	closed bool
}

var errDiskFull = errors.New("no space left on device (test)")

func (f *failAfter) Write(p []byte) (int, error) {
	if len(p) > f.n {
		k := f.n
		f.n = 0
		return k, errDiskFull
	}
	f.n -= len(p)
	return len(p), nil
}

func (f *failAfter) Close() error { f.closed = true; return nil }

// A write error sticks: Err, Flush and Close report it, and nothing is
// written after it, so a minter can stop instead of dropping IDs silently.
func TestRecorderReportsWriteErrors(t *testing.T) {
	f := &failAfter{n: 200}
	rec, err := newRecorder(f, Header{Name: "m0", PID: 1, Region: 1, Margin: time.Second, Start: 1, Wall: 1})
	if err != nil {
		t.Fatal(err)
	}
	if err := rec.Err(); err != nil {
		t.Fatalf("Err before any failure: %v", err)
	}
	for i := range 20 { // ~40 bytes each: past the 200 the file takes
		rec.Minted(int64(i), int64(i)+1, []snowflake.ID{segment.Block{Region: 1, Worker: 7}.ID(4096 + int64(i))})
	}
	if err := rec.Flush(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Flush = %v, want the write error", err)
	}
	if err := rec.Err(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Err after the failed flush = %v, want the write error", err)
	}
	rec.Minted(100, 101, []snowflake.ID{segment.Block{Region: 1, Worker: 7}.ID(5000)})
	if err := rec.Close(); !errors.Is(err, errDiskFull) {
		t.Fatalf("Close = %v, want the write error", err)
	}
	if !f.closed {
		t.Fatal("Close did not close the file")
	}
}

// A header that cannot be written fails Create's seam at once.
func TestRecorderHeaderWriteFails(t *testing.T) {
	f := &failAfter{n: 0}
	if _, err := newRecorder(f, Header{Name: "m0", Region: 1, Start: 1, Wall: 1}); !errors.Is(err, errDiskFull) {
		t.Fatalf("newRecorder = %v, want the write error", err)
	}
	if !f.closed {
		t.Fatal("the file of a failed recorder was left open")
	}
}
