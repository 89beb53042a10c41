package main

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// sample is a package whose tests pass, fail (also in a subtest) and skip,
// and a package that does not build: what the filter reads is what the go
// command writes for them, not a hand-written imitation.
var sample = map[string]string{
	"go.mod": "module example.com/sample\n\ngo 1.26\n",
	"a_test.go": `package sample

import "testing"

func TestPass(t *testing.T) { t.Log("FIGURES 42 grants/s"); t.Log("chatter") }
func TestFail(t *testing.T) { t.Log("before"); t.Errorf("the reason: %d", 7) }
func TestSub(t *testing.T) {
	t.Run("good", func(t *testing.T) { t.Log("good sub") })
	t.Run("bad", func(t *testing.T) { t.Error("bad sub reason") })
}
func TestSkip(t *testing.T) { t.Skip("no tool here") }
func TestRaceSkip(t *testing.T) {
	t.Run("sub", func(t *testing.T) { t.Skip("` + raceSkipMarker + `too slow") })
}
`,
	"broken/b.go":      "package broken\n\nfunc X() { y }\n",
	"broken/b_test.go": "package broken\n\nimport \"testing\"\n\nfunc TestB(t *testing.T) {}\n",
}

// goTestJSON runs `go test -json -count=1 args...` in a copy of sample and
// returns its standard output.
func goTestJSON(t *testing.T, args ...string) []byte {
	t.Helper()
	goBin := testenv.LookTool(t, "go", "the filter is checked against the go command's own -json output")
	dir := t.TempDir()
	for name, text := range sample {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	cmd := exec.Command(goBin, append([]string{"test", "-json", "-count=1"}, args...)...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOFLAGS=", "GOWORK=off")
	out, _ := cmd.Output() // fails when a test fails; the events are what matter
	if !bytes.Contains(out, []byte(`"Action":"start"`)) {
		t.Fatalf("go test -json %v wrote no events:\n%s", args, out)
	}
	return out
}

func filterOut(t *testing.T, in []byte, cfg config) (string, error) {
	t.Helper()
	var out bytes.Buffer
	err := run(bytes.NewReader(in), &out, cfg)
	return out.String(), err
}

// A failing test's whole output is printed, its t.Errorf line included,
// subtests' too; passing and skipped tests' output is not (except what
// -show selects); and the run fails, listing the failures.
func TestFailuresKeepTheirOutput(t *testing.T) {
	out, err := filterOut(t, goTestJSON(t, "-run", "^Test(Pass|Fail|Sub|Skip)$", "."), config{show: regexp.MustCompile(`FIGURES`)})
	if err == nil {
		t.Fatalf("a failing test passed the filter:\n%s", out)
	}
	for _, want := range []string{
		"a_test.go:6: before", "a_test.go:6: the reason: 7", "--- FAIL: TestFail",
		"bad sub reason", "good sub", "--- FAIL: TestSub/bad",
		"FIGURES 42 grants/s",
		"FAIL\texample.com/sample",
		"failed:\n  example.com/sample TestFail\n  example.com/sample TestSub\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if _, after, _ := strings.Cut(out, "--- output of failed example.com/sample TestFail:\n"); !strings.HasPrefix(after, "=== RUN   TestFail\n") {
		t.Errorf("TestFail's output does not follow its heading:\n%s", out)
	}
	for _, unwanted := range []string{"chatter", "package failed outside a test", "not shown above"} {
		if strings.Contains(out, unwanted) {
			t.Errorf("output has %q:\n%s", unwanted, out)
		}
	}
}

// Every skip is listed at the end with its reason (the test's own lines),
// passing run or failing; a skip is no failure.
func TestSkipReasonsListed(t *testing.T) {
	for _, run := range []string{"^Test(Pass|Skip)$", "^Test(Fail|Skip)$"} {
		out, err := filterOut(t, goTestJSON(t, "-run", run, "."), config{})
		if (err != nil) != strings.Contains(run, "Fail") {
			t.Errorf("-run %s: err %v", run, err)
		}
		if !strings.Contains(out, "\nskipped (1):\n  example.com/sample TestSkip: a_test.go:11: no tool here\n") {
			t.Errorf("-run %s: the skip and its reason are not listed:\n%s", run, out)
		}
	}
}

// A test skipped under the race detector (testenv.SkipUnderRace's reason,
// here in a subtest) fails the filter unless its top-level test is pinned:
// nothing else would run it.
func TestRaceSkipMustBePinned(t *testing.T) {
	in := goTestJSON(t, "-run", "^TestRaceSkip$", ".")
	out, err := filterOut(t, in, config{pinned: []string{"TestOther"}})
	if err == nil || !strings.Contains(out, "example.com/sample TestRaceSkip/sub: skipped under -race, and not pinned") {
		t.Errorf("an unpinned race skip: err %v, output:\n%s", err, out)
	}
	out, err = filterOut(t, in, config{pinned: []string{"TestOther", "TestRaceSkip"}})
	if err != nil || !strings.Contains(out, "TestRaceSkip/sub: a_test.go:13: "+raceSkipMarker+"too slow") {
		t.Errorf("a pinned race skip: err %v, output:\n%s", err, out)
	}
}

// The marker the filter looks for is the one testenv.SkipUnderRace writes.
func TestRaceSkipMarker(t *testing.T) {
	if raceSkipMarker != testenv.RaceSkipPrefix {
		t.Errorf("testfilter looks for %q, testenv.SkipUnderRace writes %q", raceSkipMarker, testenv.RaceSkipPrefix)
	}
}

// A pinned test that matches nothing (renamed) fails the filter, although
// go test says ok; one that is skipped fails it too, with its reason; one
// that passes passes, with only its result line and what -show selects.
func TestRequire(t *testing.T) {
	renamed := goTestJSON(t, "-run", "^TestRenamed$", ".")
	out, err := filterOut(t, renamed, config{require: []string{"TestRenamed"}})
	if err == nil || !strings.Contains(out, "TestRenamed: pinned test did not run: no test by that name") {
		t.Errorf("a pinned test that did not run: err %v, output:\n%s", err, out)
	}
	if !strings.Contains(out, "[no tests to run]") {
		t.Errorf("go test's own result line is not shown:\n%s", out)
	}

	out, err = filterOut(t, goTestJSON(t, "-run", "^TestSkip$", "."), config{require: []string{"TestSkip"}})
	if err == nil || !strings.Contains(out, "no tool here") || !strings.Contains(out, "TestSkip: pinned test was skipped") {
		t.Errorf("a pinned test that skipped: err %v, output:\n%s", err, out)
	}

	out, err = filterOut(t, goTestJSON(t, "-run", "^TestPass$", "."), config{require: []string{"TestPass"}, show: regexp.MustCompile(`FIGURES`)})
	if err != nil {
		t.Errorf("a pinned test that passed: %v\n%s", err, out)
	}
	if !strings.Contains(out, "ok  \texample.com/sample") || !strings.Contains(out, "FIGURES 42") || strings.Contains(out, "chatter") {
		t.Errorf("want the result line and the FIGURES line only:\n%s", out)
	}
}

// A package that does not build fails the filter with the compiler's
// message.
func TestBuildFailure(t *testing.T) {
	out, err := filterOut(t, goTestJSON(t, "./broken"), config{})
	if err == nil || !strings.Contains(out, "undefined: y") || !strings.Contains(out, "(build failed)") {
		t.Errorf("a build failure: err %v, output:\n%s", err, out)
	}
}

// A package that fails outside any test (a panic in TestMain, a timeout)
// or never finishes (go test killed), and input without events, fail the
// filter, with the package's output shown.
func TestIncompleteRuns(t *testing.T) {
	for _, tc := range []struct {
		name, in, want string
	}{
		{"no events", "", "no go test -json events"},
		{"not json", "go: cannot find main module\n", "no go test -json events"},
		{"package failure", `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestHang"}
{"Action":"output","Package":"p","Test":"TestHang","Output":"=== RUN   TestHang\n"}
{"Action":"output","Package":"p","Output":"panic: test timed out after 1s\n"}
{"Action":"output","Package":"p","Output":"exit status 2\n"}
{"Action":"output","Package":"p","Output":"FAIL\tp\t1.0s\n"}
{"Action":"fail","Package":"p"}
`, "p (package failed outside a test)"},
		{"unfinished", `{"Action":"start","Package":"p"}
{"Action":"run","Package":"p","Test":"TestLong"}
{"Action":"output","Package":"p","Test":"TestLong","Output":"=== RUN   TestLong\n"}
`, "p (no result: go test stopped before the package finished)"},
	} {
		out, err := filterOut(t, []byte(tc.in), config{})
		if err == nil || !strings.Contains(out+err.Error(), tc.want) {
			t.Errorf("%s: err %v, want %q in output:\n%s", tc.name, err, tc.want, out)
		}
		if tc.name == "package failure" && (!strings.Contains(out, "panic: test timed out") || strings.Contains(out, "exit status")) {
			t.Errorf("%s: want the panic shown, the exit status line not:\n%s", tc.name, out)
		}
	}
}
