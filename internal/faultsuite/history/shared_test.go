package history

import (
	"path/filepath"
	"testing"
	"time"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

// replicaWorker is the code a replica's own minter holds in sharedFake;
// no history leases it.
const replicaWorker = 9

// sharedFake is a consistent shared-path story: a replica's minter
// committed the step [A.lo, A.hi) of code w9 (HWM values A.hi, then B.hi),
// and carved from it s1's run [A.lo, A.lo+100) at 1 s and s2's run
// [A.lo+100, A.lo+200) at 1 s; each client hands out a few IDs of its run
// 200 ms later. The histories' clocks map 1 s to the start of A's
// millisecond, so every ID is 200 ms behind when handed out.
type sharedFake struct {
	s1, s2 *History
	hwm    map[int][]int64
	lo     int64 // A.lo
}

func sharedID(l int64) snowflake.ID {
	return segment.Block{Region: region, Worker: replicaWorker}.ID(l)
}

func newSharedFake(t *testing.T, plant func(r1, r2 *Recorder, f *sharedFake)) *sharedFake {
	t.Helper()
	dir := t.TempDir()
	f := &sharedFake{lo: linear(ms0, 0)}
	stepHi := linear(ms0+1000, 0)
	f.hwm = map[int][]int64{replicaWorker: {stepHi, linear(ms0+2000, 0)}}
	wall := snowflake.MsTime(ms0).UnixNano() - sec + 1 // wall(1 s) = A's first millisecond
	svc := snowflake.MsTime(ms0).UnixNano()
	valid := svc + int64(900*time.Millisecond)
	var recs []*Recorder
	for _, name := range []string{"s1", "s2"} {
		r, err := Create(filepath.Join(dir, name), Header{Name: name, PID: 1, Region: region, Margin: time.Second, Start: 1, Wall: wall})
		if err != nil {
			t.Fatal(err)
		}
		recs = append(recs, r)
	}
	r1, r2 := recs[0], recs[1]
	r1.SharedGranted(1*sec, 1*sec+100, region, replicaWorker, f.lo, f.lo+100, svc, valid)
	r2.SharedGranted(1*sec, 1*sec+200, region, replicaWorker, f.lo+100, f.lo+200, svc, valid)
	r1.Minted(1*sec+200*ms, 1*sec+200*ms+10, sharedIDs(f.lo, 0, 1, 2))
	r2.Minted(1*sec+200*ms, 1*sec+200*ms+10, sharedIDs(f.lo, 100, 101))
	if plant != nil {
		plant(r1, r2, f)
	}
	for _, r := range recs {
		if err := r.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var err error
	if f.s1, err = ReadFile(filepath.Join(dir, "s1")); err != nil {
		t.Fatal(err)
	}
	if f.s2, err = ReadFile(filepath.Join(dir, "s2")); err != nil {
		t.Fatal(err)
	}
	return f
}

const ms = int64(time.Millisecond)

func sharedIDs(lo int64, offsets ...int64) []snowflake.ID {
	out := make([]snowflake.ID, len(offsets))
	for i, o := range offsets {
		out[i] = sharedID(lo + o)
	}
	return out
}

func (f *sharedFake) check(t *testing.T) Report {
	t.Helper()
	rep, err := Check([]*History{f.s1, f.s2}, Config{
		Region: region, NotBefore: snowflake.MsTime(ms0 - 1000), NotAfter: snowflake.MsTime(ms0 + 20000),
		HWM: f.hwm, MaxBehind: time.Second, MaxAhead: 15 * time.Second,
	})
	if err != nil {
		t.Fatal(err)
	}
	return rep
}

// IDs of shared runs are held to the runs their process received, the
// committed HWM steps and the time bound; none needs a lease.
func TestCheckSharedRunsCleanRun(t *testing.T) {
	f := newSharedFake(t, nil)
	rep := f.check(t)
	if err := rep.Err(); err != nil {
		t.Fatalf("clean shared run failed the check: %v\n%s", err, rep.Summary())
	}
	if err := rep.FreshnessErr(); err != nil {
		t.Fatalf("freshness: %v", err)
	}
	if rep.SharedRuns != 2 || rep.SharedIDs != 5 || rep.IDs != 5 || rep.Leases != 0 || rep.OutsideBlock != 0 {
		t.Fatalf("report %s; want 2 shared runs, 5 shared IDs, no lease", rep.Summary())
	}
	if rep.MaxBehindSeen != 200*time.Millisecond+10 || rep.MaxAheadSeen != 0 {
		t.Fatalf("extremes %v behind, %v ahead; want 200ms+10ns behind (the latest return), 0 ahead", rep.MaxBehindSeen, rep.MaxAheadSeen)
	}
	// The step the runs were carved from counts as received (by the
	// replica's minter); the later one is burned.
	if rep.HWMSteps != 2 || rep.BurnedGrants != 1 || rep.GapPositions != 200-5 {
		t.Fatalf("hwm steps %d, burned %d, gaps %d; want 2, 1, 195", rep.HWMSteps, rep.BurnedGrants, rep.GapPositions)
	}
}

// Each planted fault on the shared path must make Check fail with its own
// sentinel.
func TestCheckSharedRunsCatchPlantedFaults(t *testing.T) {
	svc := snowflake.MsTime(ms0).UnixNano()
	for _, tc := range []struct {
		name  string
		plant func(r1, r2 *Recorder, f *sharedFake)
		want  error
	}{
		{"a shared ID handed out by another process", func(r1, r2 *Recorder, f *sharedFake) {
			r2.Minted(1*sec+300*ms, 1*sec+300*ms+10, sharedIDs(f.lo, 1)) // s1's
		}, ErrDuplicate},
		{"a shared ID outside every run its process received", func(r1, r2 *Recorder, f *sharedFake) {
			r2.Minted(1*sec+300*ms, 1*sec+300*ms+10, sharedIDs(f.lo, 150+50)) // past s2's run
		}, ErrOutsideBlock},
		{"runs of two processes overlap", func(r1, r2 *Recorder, f *sharedFake) {
			r2.SharedGranted(1*sec+300*ms, 1*sec+310*ms, region, replicaWorker, f.lo+50, f.lo+60, svc, svc+int64(900*time.Millisecond))
		}, ErrBlockOverlap},
		{"a run beyond every committed step", func(r1, r2 *Recorder, f *sharedFake) {
			hi := linear(ms0+3000, 0)
			r2.SharedGranted(1*sec+300*ms, 1*sec+310*ms, region, replicaWorker, hi-10, hi, svc, svc+int64(900*time.Millisecond))
		}, ErrHWM},
		{"a run across two steps", func(r1, r2 *Recorder, f *sharedFake) {
			edge := linear(ms0+1000, 0)
			r2.SharedGranted(1*sec+300*ms, 1*sec+310*ms, region, replicaWorker, edge-10, edge+10, svc, svc+int64(900*time.Millisecond))
		}, ErrHWM},
		{"a shared ID handed out 1 s after its millisecond", func(r1, r2 *Recorder, f *sharedFake) {
			// Returned exactly 1 s, then 1 s + 1 ns, after A's millisecond began.
			r1.Minted(2*sec-10, 2*sec, sharedIDs(f.lo, 3))
			r1.Minted(2*sec, 2*sec+1, sharedIDs(f.lo, 4))
		}, ErrTimeBound},
		{"a shared ID below the process's previous ID", func(r1, r2 *Recorder, f *sharedFake) {
			// Another code sorting above w9 in the same millisecond.
			r1.Minted(1*sec+300*ms, 1*sec+300*ms+10, []snowflake.ID{segment.Block{Region: region, Worker: replicaWorker + 1}.ID(f.lo + 5)})
			r1.Minted(1*sec+400*ms, 1*sec+400*ms+10, sharedIDs(f.lo, 3))
		}, ErrOrder},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newSharedFake(t, tc.plant)
			rep := f.check(t)
			if err := rep.Err(); !errors.Is(err, tc.want) {
				t.Fatalf("Err() = %v, want %v\n%s", err, tc.want, rep.Summary())
			}
			t.Logf("caught: %v", rep.Err())
		})
	}
}
