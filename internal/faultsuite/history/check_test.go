package history

import (
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

const (
	sec    = int64(time.Second)
	region = 1
	worker = 3
	ms0    = int64(1_000_000) // ms since the epoch of the fake run
)

// fakeRun is a consistent two-owner story for one code:
//
//	p1 acquires w3 at 1 s (token 10, TTL 4 s, margin 1 s), renews at 2 s and
//	3 s, gets block A, mints; stops renewing after 3 s (its last renewal
//	was sent at 3 s - 100 ns: deadline 6 s - 100 ns); p2 acquires w3 at
//	10 s (reply at 10 s + 100 ns, token 20), gets block B above A, mints.
type fakeRun struct {
	p1, p2  *History
	hwm     map[int][]int64
	replies []Reply // IDs a replica handed out (none by default)
	blockA  [2]int64
	blockB  [2]int64
}

func linear(ms, seq int64) int64 { return ms<<12 | seq }

func idAt(l int64) int64 { return int64(segment.Block{Region: region, Worker: worker}.ID(l)) }

func newFakeRun(t *testing.T, plant func(r1, r2 *Recorder, f *fakeRun)) *fakeRun {
	t.Helper()
	dir := t.TempDir()
	f := &fakeRun{
		blockA: [2]int64{linear(ms0, 0), linear(ms0+1000, 0)},
		blockB: [2]int64{linear(ms0+9000, 0), linear(ms0+10000, 0)},
	}
	svc := time.Unix(0, 0).Add(time.Hour).UnixNano()
	r1, err := Create(filepath.Join(dir, "p1"), Header{Name: "p1", PID: 1, Region: region, Margin: time.Second, Start: 1})
	if err != nil {
		t.Fatal(err)
	}
	r2, err := Create(filepath.Join(dir, "p2"), Header{Name: "p2", PID: 2, Region: region, Margin: time.Second, Start: 1})
	if err != nil {
		t.Fatal(err)
	}
	r1.Acquired(1*sec, 1*sec+100, 10, region, worker, 1001, 4*time.Second)
	r1.Granted(1*sec+200, 1*sec+300, 10, region, worker, f.blockA[0], f.blockA[1], svc, svc+int64(10*time.Second))
	r1.Renewed(2*sec-100, 2*sec, 10, 4*time.Second)
	r1.Renewed(3*sec-100, 3*sec, 10, 4*time.Second)
	r1.Minted(1*sec+400, 1*sec+500, ids(f.blockA[0], 0, 1, 2))
	r1.Minted(5*sec, 5*sec+10, ids(f.blockA[0], 100, 101))
	r1.MintFailed(6*sec, 6*sec+1, "lease_lost")

	r2.Acquired(10*sec, 10*sec+100, 20, region, worker, 1002, 4*time.Second)
	r2.Granted(10*sec+200, 10*sec+300, 20, region, worker, f.blockB[0], f.blockB[1], svc, svc+int64(10*time.Second))
	r2.Minted(10*sec+400, 10*sec+500, ids(f.blockB[0], 0, 5))
	r2.Renewed(11*sec, 11*sec+100, 20, 4*time.Second)
	r2.Minted(11*sec+400, 11*sec+500, ids(f.blockB[0], 6))
	r2.Released(12*sec, 12*sec+100, 20)
	// The HWM key took: A.hi, a burned grant (reply lost), B.hi.
	f.hwm = map[int][]int64{worker: {f.blockA[1], linear(ms0+5000, 0), f.blockB[1]}}
	if plant != nil {
		plant(r1, r2, f)
	}
	for _, r := range []*Recorder{r1, r2} {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if f.p1, err = ReadFile(filepath.Join(dir, "p1")); err != nil {
		t.Fatal(err)
	}
	if f.p2, err = ReadFile(filepath.Join(dir, "p2")); err != nil {
		t.Fatal(err)
	}
	return f
}

// ids are the IDs at lo+offsets.
func ids(lo int64, offsets ...int64) []snowflake.ID {
	out := make([]snowflake.ID, len(offsets))
	for i, o := range offsets {
		out[i] = snowflake.ID(idAt(lo + o))
	}
	return out
}

func (f *fakeRun) check(t *testing.T) Report {
	t.Helper()
	rep, err := Check([]*History{f.p1, f.p2}, Config{
		Region:    region,
		NotBefore: snowflake.MsTime(ms0 - 1000),
		NotAfter:  snowflake.MsTime(ms0 + 20000),
		HWM:       f.hwm,
		Replies:   f.replies,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

func TestCheckCleanRun(t *testing.T) {
	f := newFakeRun(t, nil)
	rep := f.check(t)
	if err := rep.Err(); err != nil {
		t.Fatalf("clean run failed the check: %v\n%s", err, rep.Summary())
	}
	want := Report{Processes: 2, IDs: 8, Leases: 2, Renewals: 3, Blocks: 2, HWMChecked: true, HWMSteps: 3,
		ClosestToDeadline: time.Second - 110, // p1's call returning at 5 s + 10 ns
		BurnedGrants:      1, BurnedLeasedGrants: 1, BurnedPosition: linear(ms0+5000, 0) - f.blockA[1],
		GapPositions: (f.blockA[1] - f.blockA[0] - 5) + (f.blockB[1] - f.blockB[0] - 3)}
	rep.Examples, want.Examples = nil, nil
	rep.idErr = nil
	if !reflect.DeepEqual(rep, want) {
		t.Fatalf("report\n got %s\nwant %s", rep.Summary(), want.Summary())
	}
	if n := f.p1.MintedWithin(sec, 5*sec+5); n != 3 { // the 5 s call returns at 5 s + 10 ns
		t.Fatalf("MintedWithin = %d, want 3", n)
	}
	if n := f.p1.MintedBetween(sec, 5*sec+5); n != 5 {
		t.Fatalf("MintedBetween = %d, want 5", n)
	}
	if f.p1.IDs() != 5 || f.p2.IDs() != 3 || len(f.p1.Failures) != 1 || len(f.p2.Releases) != 1 {
		t.Fatalf("parsed p1 ids=%d failures=%d, p2 ids=%d releases=%d", f.p1.IDs(), len(f.p1.Failures), f.p2.IDs(), len(f.p2.Releases))
	}
}

// Each planted fault must make Check fail with its own sentinel.
func TestCheckCatchesPlantedFaults(t *testing.T) {
	for _, tc := range []struct {
		name  string
		plant func(r1, r2 *Recorder, f *fakeRun)
		hwm   func(f *fakeRun)
		want  error
	}{
		{"duplicate across processes", func(r1, r2 *Recorder, f *fakeRun) {
			r2.Minted(11*sec+600, 11*sec+700, ids(f.blockA[0], 1)) // p1's second ID
		}, nil, ErrDuplicate},
		{"duplicate within a process", func(r1, r2 *Recorder, f *fakeRun) {
			r2.Minted(11*sec+600, 11*sec+700, ids(f.blockB[0], 6))
		}, nil, ErrDuplicate},
		{"after the safety deadline", func(r1, r2 *Recorder, f *fakeRun) {
			// Last renewal sent at 3 s - 100 ns with TTL 4 s, margin 1 s:
			// the deadline is 6 s - 100 ns. An ID handed out by a call
			// started at 6 s is a violation even though it is unique and
			// in its block.
			r1.Minted(6*sec, 6*sec+10, ids(f.blockA[0], 200))
		}, nil, ErrAfterDeadline},
		{"returned after the safety deadline (late return)", func(r1, r2 *Recorder, f *fakeRun) {
			// The call started 100 ns before the deadline and returned
			// 10 ns after it: nothing shows the ID existed before the
			// deadline, so it is dated by its return.
			r1.Minted(6*sec-200, 6*sec+10, ids(f.blockA[0], 200))
		}, nil, ErrAfterDeadline},
		{"returned after a new owner took the code (late return)", func(r1, r2 *Recorder, f *fakeRun) {
			// p1 keeps renewing, and its call starts before p2's
			// acquisition returned (10 s + 100 ns) but returns after it.
			r1.Renewed(9*sec, 9*sec+100, 10, 4*time.Second)
			r1.Minted(10*sec+50, 10*sec+150, ids(f.blockA[0], 300))
		}, nil, ErrAfterNewOwner},
		{"after a new owner took the code", func(r1, r2 *Recorder, f *fakeRun) {
			// p1 keeps renewing (so its own deadline is not the issue) but
			// p2 acquired the code at 10 s.
			r1.Renewed(9*sec, 9*sec+100, 10, 4*time.Second)
			r1.Minted(10*sec+200, 10*sec+210, ids(f.blockA[0], 300))
		}, nil, ErrAfterNewOwner},
		{"out of order", func(r1, r2 *Recorder, f *fakeRun) {
			r2.Minted(11*sec+600, 11*sec+700, ids(f.blockB[0], 3))
		}, nil, ErrOrder},
		{"outside every block", func(r1, r2 *Recorder, f *fakeRun) {
			r2.Minted(11*sec+600, 11*sec+700, ids(f.blockB[1], 0))
		}, nil, ErrOutsideBlock},
		{"block used before it arrived", func(r1, r2 *Recorder, f *fakeRun) {
			r1.Minted(1*sec+150, 1*sec+160, ids(f.blockA[0], 50)) // block arrived at 1.3 s
		}, nil, ErrOutsideBlock},
		{"block used after its validity (freshness only)", func(r1, r2 *Recorder, f *fakeRun) {
			// Block B: sent at 10.2 s, valid 10 s; keep renewing so only
			// the block's validity is passed.
			r2.Renewed(19*sec, 19*sec+100, 20, 4*time.Second)
			r2.Minted(20*sec+300, 20*sec+310, ids(f.blockB[0], 50))
		}, nil, ErrStaleBlock},
		{"overlapping grants", func(r1, r2 *Recorder, f *fakeRun) {
			svc := time.Unix(0, 0).Add(time.Hour).UnixNano()
			r2.Granted(11*sec, 11*sec+10, 20, region, worker, f.blockA[1]-10, f.blockA[1]+10, svc, svc+int64(time.Second))
		}, func(f *fakeRun) {
			f.hwm[worker] = append(f.hwm[worker], f.blockA[1]+10)
		}, ErrBlockOverlap},
		{"block not committed in etcd", nil, func(f *fakeRun) {
			f.hwm[worker] = f.hwm[worker][:2] // B.hi never written
		}, ErrHWM},
		{"high-water mark went back", nil, func(f *fakeRun) {
			f.hwm[worker] = append(f.hwm[worker], f.blockA[1])
		}, ErrHWM},
		{"wrong region", func(r1, r2 *Recorder, f *fakeRun) {
			r2.Minted(11*sec+600, 11*sec+700, []snowflake.ID{segment.Block{Region: 2, Worker: worker}.ID(f.blockB[0] + 7)})
		}, nil, ErrOutOfRange},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, tc.plant)
			if tc.hwm != nil {
				tc.hwm(f)
			}
			rep := f.check(t)
			err := rep.Err()
			if tc.want == ErrStaleBlock {
				if err != nil {
					t.Fatalf("a stale block is not a safety violation, got %v", err)
				}
				err = rep.FreshnessErr()
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Err() = %v, want %v", err, tc.want)
			}
			t.Logf("caught: %v", err)
		})
	}
}

// Replies (IDs a replica handed out over MintBatch, Next or HTTP) are in
// the same duplicate check as every history's IDs, and in the range check.
func TestCheckRepliesJoinTheDuplicateCheck(t *testing.T) {
	// The replica minted on its own code, w9, which no history holds.
	own := func(offsets ...int64) []int64 {
		var out []int64
		for _, o := range offsets {
			out = append(out, int64(segment.Block{Region: region, Worker: 9}.ID(linear(ms0+3000, o))))
		}
		return out
	}
	histID := func(f *fakeRun) int64 { return f.p1.Mints[0].IDs[1] }
	for _, tc := range []struct {
		name    string
		replies func(f *fakeRun) []Reply
		want    error // nil: the run passes
		where   []string
	}{
		{"distinct", func(f *fakeRun) []Reply {
			return []Reply{{Source: "svc0 MintBatch", IDs: own(0, 1, 2)}, {Source: "svc1 HTTP", IDs: own(3, 4)}}
		}, nil, nil},
		{"a batch reply repeats a minter's ID", func(f *fakeRun) []Reply {
			return []Reply{{Source: "svc0 MintBatch", Send: 7 * sec, Ret: 7*sec + 5, IDs: append(own(0, 1), histID(f))}}
		}, ErrDuplicate, []string{"p1 (call returned at", "svc0 MintBatch (reply at"}},
		{"an HTTP reply repeats a batch reply's ID", func(f *fakeRun) []Reply {
			return []Reply{{Source: "svc0 MintBatch", IDs: own(0, 1)}, {Source: "svc1 HTTP", IDs: own(1)}}
		}, ErrDuplicate, []string{"svc0 MintBatch", "svc1 HTTP"}},
		{"a reply of another region", func(f *fakeRun) []Reply {
			return []Reply{{Source: "svc0 Next", IDs: []int64{int64(segment.Block{Region: 2, Worker: 9}.ID(linear(ms0+3000, 0)))}}}
		}, ErrOutOfRange, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeRun(t, nil)
			f.replies = tc.replies(f)
			rep := f.check(t)
			var n int64
			for _, r := range f.replies {
				n += int64(len(r.IDs))
			}
			if rep.Replies != len(f.replies) || rep.ReplyIDs != n || rep.IDs != 8 {
				t.Fatalf("counted replies=%d reply_ids=%d ids=%d, want %d, %d, 8", rep.Replies, rep.ReplyIDs, rep.IDs, len(f.replies), n)
			}
			err := rep.Err()
			if tc.want == nil {
				if err != nil {
					t.Fatalf("Err() = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, tc.want) {
				t.Fatalf("Err() = %v, want %v", err, tc.want)
			}
			for _, w := range tc.where {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Err() = %v\ndoes not say where the duplicate came from (%q)", err, w)
				}
			}
			t.Logf("caught: %v", err)
		})
	}
}

// A burned first step of a key (a code no history holds, whose first
// grant nobody recorded) is a burned grant whose positions are unknown:
// it started at the service's time, not at 0.
func TestCheckBurnedFirstStepHasNoKnownPositions(t *testing.T) {
	f := newFakeRun(t, nil)
	f.hwm[9] = []int64{linear(ms0+3000, 0), linear(ms0+3100, 0)}
	rep := f.check(t)
	if err := rep.Err(); err != nil {
		t.Fatal(err)
	}
	if want := linear(ms0+5000, 0) - f.blockA[1] + linear(ms0+3100, 0) - linear(ms0+3000, 0); rep.BurnedGrants != 3 || rep.BurnedPosition != want {
		t.Fatalf("burned grants %d positions %d, want 3 and %d (w3's step above A, w9's second step)", rep.BurnedGrants, rep.BurnedPosition, want)
	}
	if rep.BurnedLeasedGrants != 1 {
		t.Fatalf("burned grants on leased codes %d, want 1 (w3's; no history leased w9)", rep.BurnedLeasedGrants)
	}
}

func TestCheckEmptyProvesNothing(t *testing.T) {
	h := &History{Header: Header{Name: "p", Region: region}}
	rep, err := Check([]*History{h}, Config{Region: region})
	if err != nil {
		t.Fatal(err)
	}
	if !errors.Is(rep.Err(), ErrNothingChecked) {
		t.Fatalf("empty run: %v", rep.Err())
	}
	if _, err := Check([]*History{h}, Config{Region: 2}); err == nil {
		t.Fatal("a history of another region was accepted")
	}
}

func TestCouldMintAt(t *testing.T) {
	f := newFakeRun(t, nil)
	// p1: lease from 1 s, deadline bound 5.9 s; block A valid from its
	// send (1.2 s) for 10 s.
	for _, tc := range []struct {
		at   int64
		want bool
	}{{sec / 2, false}, {2 * sec, true}, {5*sec + sec/2, true}, {6 * sec, false}} {
		if got := f.p1.CouldMintAt(tc.at, 200*time.Millisecond); got != tc.want {
			t.Errorf("CouldMintAt(%v) = %v, want %v", time.Duration(tc.at), got, tc.want)
		}
	}
}

func TestLeaseAtAndDeadlineBound(t *testing.T) {
	f := newFakeRun(t, nil)
	// p1: acquired at 1 s (reply 1 s + 100 ns, TTL 4 s, margin 1 s: bound
	// 4 s), renewals sent at 1.9... s and 2.9... s (bounds 4.9 s and 5.9 s).
	for _, tc := range []struct {
		at    int64
		ok    bool
		bound int64
	}{{sec / 2, false, 0}, {sec + 100, true, 4 * sec}, {2 * sec, true, 5*sec - 100}, {5 * sec, true, 6*sec - 100}} {
		l, ok := f.p1.LeaseAt(tc.at)
		if ok != tc.ok || ok && l.Token != 10 {
			t.Errorf("LeaseAt(%v) = %+v, %v; want token 10: %v", time.Duration(tc.at), l, ok, tc.ok)
		}
		b, ok := f.p1.DeadlineBound(10, tc.at)
		if ok != tc.ok || b != tc.bound {
			t.Errorf("DeadlineBound(10, %v) = %v, %v; want %v, %v", time.Duration(tc.at), time.Duration(b), ok, time.Duration(tc.bound), tc.ok)
		}
	}
	if _, ok := f.p1.DeadlineBound(20, 20*sec); ok {
		t.Error("DeadlineBound found p2's lease in p1's history")
	}
	if l, ok := f.p2.LeaseAt(20 * sec); !ok || l.Token != 20 {
		t.Errorf("p2.LeaseAt(20 s) = %+v, %v; want token 20", l, ok)
	}
}
