package testenv

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
)

func TestCI(t *testing.T) {
	for _, tc := range []struct {
		ci, idrangeCI string
		want          bool
	}{
		{"", "", false},
		{"true", "", true},
		{"1", "", true},
		{"yes", "", true}, // unparsable: stricter, not looser
		{"false", "", false},
		{"0", "", false},
		{"", "1", true},
		{"false", "1", true},
		{"", "0", false},
	} {
		t.Setenv("CI", tc.ci)
		t.Setenv("IDRANGE_CI", tc.idrangeCI)
		if got := CI(); got != tc.want {
			t.Errorf("CI=%q IDRANGE_CI=%q: CI() = %v, want %v", tc.ci, tc.idrangeCI, got, tc.want)
		}
	}
}

// recorder is a testing.TB whose Fatalf and Skipf record what they were
// told and end the goroutine, as the real ones do.
type recorder struct {
	testing.TB
	fatal, skip string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(format string, args ...any) {
	r.fatal = fmt.Sprintf(format, args...)
	runtime.Goexit()
}
func (r *recorder) Skipf(format string, args ...any) {
	r.skip = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// run calls f with a recorder on its own goroutine (Goexit ends it).
func run(f func(testing.TB)) *recorder {
	r := &recorder{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	<-done
	return r
}

// A missing tool fails the test in CI mode and skips it otherwise, naming
// the tool and how to get it either way.
func TestLookToolMissing(t *testing.T) {
	const tool = "idrange-no-such-tool"
	for _, ci := range []string{"true", ""} {
		t.Setenv("CI", ci)
		t.Setenv("IDRANGE_CI", "")
		r := run(func(tb testing.TB) { LookTool(tb, tool, "apt-get install it") })
		msg := r.skip
		if ci != "" {
			msg = r.fatal
		}
		if msg == "" || (r.fatal != "") == (r.skip != "") {
			t.Errorf("CI=%q: fatal %q, skip %q; want exactly the %s", ci, r.fatal, r.skip, map[bool]string{true: "failure", false: "skip"}[ci != ""])
			continue
		}
		if !strings.Contains(msg, tool+" is missing") || !strings.Contains(msg, "apt-get install it") {
			t.Errorf("CI=%q: %q does not name the tool and how to get it", ci, msg)
		}
	}
}

// A tool that is there (this test binary, by its path) is found in CI
// mode.
func TestLookToolFound(t *testing.T) {
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	t.Setenv("CI", "true")
	r := run(func(tb testing.TB) {
		if p := LookTool(tb, self, "build it"); p != self {
			tb.Fatalf("LookTool(%q) = %q", self, p)
		}
	})
	if r.fatal != "" || r.skip != "" {
		t.Errorf("go is on PATH, yet fatal %q, skip %q", r.fatal, r.skip)
	}
}

// SkipUnderRace skips, with RaceSkipPrefix and the reason, exactly when the
// race detector is on, in CI mode too (the test runs pinned without it).
func TestSkipUnderRace(t *testing.T) {
	t.Setenv("CI", "true")
	ran := false
	r := run(func(tb testing.TB) { SkipUnderRace(tb, "too slow"); ran = true })
	if Race {
		if r.skip != RaceSkipPrefix+"too slow" || ran {
			t.Errorf("under -race: skip %q, went on %v; want a skip %q", r.skip, ran, RaceSkipPrefix+"too slow")
		}
		return
	}
	if r.skip != "" || r.fatal != "" || !ran {
		t.Errorf("without -race: skip %q, fatal %q, went on %v; want nothing", r.skip, r.fatal, ran)
	}
}

// CheckIDs passes distinct IDs of the region dated within the minting, and
// fails, naming the problem, on none, a duplicate, another region, or a
// timestamp before the start (less MaxBehind) or past the service's lead.
func TestCheckIDs(t *testing.T) {
	start := time.Now()
	ms := snowflake.MsSince(start)
	id := func(dms int64, region, seq int) snowflake.ID {
		v, err := snowflake.Compose(ms+dms, region, 7, seq)
		if err != nil {
			t.Fatal(err)
		}
		return v
	}
	for _, tc := range []struct {
		name string
		ids  []snowflake.ID
		want string // "" passes
	}{
		{"good", []snowflake.ID{id(0, 2, 0), id(0, 2, 1), id(-900, 2, 0), id(10_000, 2, 0)}, ""},
		{"none", nil, "no ids checked"},
		{"duplicate", []snowflake.ID{id(0, 2, 0), id(0, 2, 0)}, "duplicate"},
		{"other region", []snowflake.ID{id(0, 2, 0), id(0, 1, 1)}, "code r1/w7 not expected"},
		{"too old", []snowflake.ID{id(-1500, 2, 0)}, "before"},
		{"too far ahead", []snowflake.ID{id(segment.DefaultMaxLead.Milliseconds()+5000, 2, 0)}, "after"},
	} {
		r := run(func(tb testing.TB) { CheckIDs(tb, tc.ids, 2, start) })
		if (r.fatal == "") != (tc.want == "") || !strings.Contains(r.fatal, tc.want) {
			t.Errorf("%s: fatal %q, want %q", tc.name, r.fatal, tc.want)
		}
	}
}
