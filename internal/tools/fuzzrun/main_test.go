package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
)

// The fake go command: the test binary run again with fakeGoEnv set. Asked
// to build a test binary (go test -c -o X) it copies itself to X; run as
// that binary with -test.fuzz, it ends the way a run hit by Go issue 75804
// ends (the coordinator's "context deadline exceeded", exit 1, no input)
// and counts those runs in the file fakeGoEnv names; anything else (go env,
// go list, go test -list) goes to the real go command.
const fakeGoEnv = "FUZZRUN_FAKE_GO_COUNT"

func TestMain(m *testing.M) {
	if count := os.Getenv(fakeGoEnv); count != "" {
		os.Exit(fakeGo(count, os.Args[1:]))
	}
	os.Exit(m.Run())
}

func fakeGo(count string, args []string) int {
	fuzzArg := slices.IndexFunc(args, func(a string) bool { return strings.HasPrefix(a, "-test.fuzz=") })
	switch {
	case fuzzArg >= 0:
		f, err := os.OpenFile(count, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
		if err == nil {
			f.WriteString("run\n")
			f.Close()
		}
		name := strings.Trim(strings.TrimPrefix(args[fuzzArg], "-test.fuzz="), "^$")
		fmt.Printf("fuzz: elapsed: 0s, gathering baseline coverage: 0/3 completed\n"+
			"fuzz: elapsed: 0s, gathering baseline coverage: 3/3 completed, now fuzzing with 2 workers\n"+
			"fuzz: elapsed: 3s, execs: 12345 (4115/sec), new interesting: 0 (total: 3)\n"+
			"--- FAIL: %s (3.01s)\n    context deadline exceeded\nFAIL\n", name)
		return 1
	case len(args) > 1 && args[0] == "test" && args[1] == "-c":
		self, err := os.Executable()
		if err != nil {
			fmt.Println(err)
			return 1
		}
		b, err := os.ReadFile(self)
		if err == nil {
			err = os.WriteFile(args[slices.Index(args, "-o")+1], b, 0o755)
		}
		if err != nil {
			fmt.Println(err)
			return 1
		}
		return 0
	}
	cmd := exec.Command(os.Getenv("FUZZRUN_REAL_GO"), args...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode()
		}
		return 1
	}
	return 0
}

func mustRE(t *testing.T, s string) *regexp.Regexp {
	t.Helper()
	re, err := regexp.Compile(s)
	if err != nil {
		t.Fatal(err)
	}
	return re
}

// fixture writes a module example.com/fz with the given test file and
// extra files, and returns its directory.
func fixture(t *testing.T, test string, extra map[string]string) string {
	t.Helper()
	dir := t.TempDir()
	files := map[string]string{"go.mod": "module example.com/fz\n\ngo 1.26\n", "fz_test.go": test}
	for k, v := range extra {
		files[k] = v
	}
	for name, text := range files {
		path := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// fuzzrun runs the tool's run in dir (its working directory) with cfg's
// go command, time and patterns defaulted, and returns its output.
func fuzzrun(t *testing.T, dir string, cfg config) (string, error) {
	t.Helper()
	if cfg.goCmd == "" {
		cfg.goCmd = testenv.LookTool(t, "go", "fuzzrun runs the go command")
	}
	if cfg.each == 0 && cfg.budget == 0 {
		cfg.each = time.Second
	}
	if cfg.build == 0 {
		cfg.build = 3 * time.Minute
	}
	if len(cfg.patterns) == 0 {
		cfg.patterns = []string{"./..."}
	}
	t.Chdir(dir)
	t.Setenv("GOFLAGS", "")
	t.Setenv("GOWORK", "off")
	t.Setenv("GOPROXY", "off")
	var out bytes.Buffer
	err := run(context.Background(), cfg, &out)
	return out.String(), err
}

const twoTargets = `package fz

import "testing"

func FuzzFirst(f *testing.F) {
	f.Add([]byte("a"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if string(b) == "boom" {
			t.Fatal("boom")
		}
	})
}

func FuzzSecond(f *testing.F) {
	f.Add(1)
	f.Fuzz(func(t *testing.T, n int) {})
}
`

// Every target of the tree is listed and fuzzed, found by go list and go
// test -list (here in a package and a subpackage), a budget split among
// them; a clean run passes.
func TestEveryTargetFuzzed(t *testing.T) {
	dir := fixture(t, twoTargets, map[string]string{"sub/sub_test.go": "package sub\n\nimport \"testing\"\n\n" +
		"func FuzzThird(f *testing.F) { f.Fuzz(func(t *testing.T, s string) {}) }\n", "nofuzz/n_test.go": "package nofuzz\n"})
	out, err := fuzzrun(t, dir, config{budget: 3 * time.Second, min: time.Second})
	if err != nil {
		t.Fatalf("a clean run failed: %v\n%s", err, out)
	}
	for _, want := range []string{
		"fuzz: 3 targets, 1s each (-budget 3s split 3 ways, at least 1s):",
		"  example.com/fz FuzzFirst\n", "  example.com/fz FuzzSecond\n", "  example.com/fz/sub FuzzThird\n",
		"fuzz: FuzzFirst: ok, execs ", "fuzz: FuzzSecond: ok, execs ", "fuzz: FuzzThird: ok, execs ",
		"fuzz: 3 targets fuzzed, no finding",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}

// A failing input under testdata/fuzz (planted, not committed) fails the
// run, named; so does one the fuzzer finds and writes.
func TestFindingsNameTheInput(t *testing.T) {
	planted := filepath.Join("testdata", "fuzz", "FuzzFirst", "planted")
	dir := fixture(t, twoTargets, map[string]string{planted: "go test fuzz v1\n[]byte(\"boom\")\n"})
	out, err := fuzzrun(t, dir, config{})
	if err == nil || !strings.Contains(out, "FuzzFirst (example.com/fz): failing input "+planted+"\n") ||
		!strings.Contains(out, "fuzz: FuzzFirst: FINDING") || !strings.Contains(out, "fuzz: FuzzSecond: ok") {
		t.Errorf("a planted failing input: err %v, output:\n%s", err, out)
	}

	dir = fixture(t, `package fz

import "testing"

func FuzzAnyByte(f *testing.F) {
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) > 0 {
			t.Fatal("found one")
		}
	})
}
`, nil)
	out, err = fuzzrun(t, dir, config{each: 10 * time.Second})
	written, _ := filepath.Glob(filepath.Join(dir, "testdata", "fuzz", "FuzzAnyByte", "*"))
	if len(written) != 1 {
		t.Fatalf("the fuzzer wrote %v; want one input\n%s", written, out)
	}
	rel := filepath.Join("testdata", "fuzz", "FuzzAnyByte", filepath.Base(written[0]))
	if err == nil || !strings.Contains(out, "FuzzAnyByte (example.com/fz): failing input "+rel+"\n") {
		t.Errorf("a found input: err %v, output:\n%s", err, out)
	}
}

// Stopping a run stops the coordinator alone, which stops its workers in
// its own time. A worker that sees a ^C itself can exit in the middle of an
// input, and the coordinator then records that input as a crash ("fuzzing
// process hung or terminated unexpectedly: <nil>"): the workers here exit
// the moment they see SIGINT, in the middle of a 20 ms input, so a ^C to
// the process group would be taken for a finding in most runs.
func TestStopRecordsNoCrash(t *testing.T) {
	dir := fixture(t, `package fz

import (
	"os"
	"os/signal"
	"slices"
	"testing"
	"time"
)

func init() {
	if slices.Contains(os.Args, "-test.fuzzworker") {
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt)
		go func() { <-c; os.Exit(0) }()
	}
}

func FuzzSlow(f *testing.F) {
	f.Add([]byte("a"))
	f.Fuzz(func(t *testing.T, b []byte) { time.Sleep(20 * time.Millisecond) })
}
`, nil)
	for i := range 6 {
		out, err := fuzzrun(t, dir, config{each: time.Second})
		written, _ := filepath.Glob(filepath.Join(dir, "testdata", "fuzz", "FuzzSlow", "*"))
		if err != nil || len(written) > 0 || !strings.Contains(out, "fuzz: FuzzSlow: ok, execs ") {
			t.Fatalf("run %d: stopping the run was taken for a finding: err %v, inputs %v\n%s", i, err, written, out)
		}
	}
}

// The end-of-run race of the fuzzing coordinator (Go issue 75804: exit 1,
// "context deadline exceeded", no input), simulated by a fake go command,
// is retried once, then reported naming the Go issue, and does not fail
// the run.
func TestCoordinatorRaceIsNotAFinding(t *testing.T) {
	realGo := testenv.LookTool(t, "go", "fuzzrun runs the go command")
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	count := filepath.Join(t.TempDir(), "count")
	t.Setenv(fakeGoEnv, count)
	t.Setenv("FUZZRUN_REAL_GO", realGo)
	dir := fixture(t, twoTargets, nil)
	out, err := fuzzrun(t, dir, config{goCmd: self, targets: mustRE(t, "^FuzzFirst$")})
	if err != nil {
		t.Fatalf("the coordinator's race failed the run: %v\n%s", err, out)
	}
	for _, want := range []string{
		"fuzz: FuzzFirst: the coordinator's end-of-run error and no input (golang/go#75804): retrying once",
		"fuzz: FuzzFirst: toolchain error (golang/go#75804), not a finding",
		"FuzzFirst (example.com/fz): twice the fuzzing coordinator's end-of-run error \"context deadline exceeded\" with no input written: Go issue golang/go#75804, not a finding",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if b, _ := os.ReadFile(count); string(b) != "run\nrun\n" {
		t.Errorf("fuzz runs of the fake go: %q, want two (the run and one retry)", b)
	}
}

// A run that fails without writing an input, other than by the toolchain's
// race, still fails: here a seed in the code (not a file) fails.
func TestFailureWithoutInputFails(t *testing.T) {
	dir := fixture(t, `package fz

import "testing"

func FuzzBadSeed(f *testing.F) {
	f.Add("bad")
	f.Fuzz(func(t *testing.T, s string) {
		if s == "bad" {
			t.Fatal("the seed fails")
		}
	})
}
`, nil)
	out, err := fuzzrun(t, dir, config{})
	if err == nil || !strings.Contains(out, "FuzzBadSeed (example.com/fz): failed without a fuzz input") ||
		!strings.Contains(out, "the seed fails") {
		t.Errorf("a failing seed: err %v, output:\n%s", err, out)
	}
}

func TestShare(t *testing.T) {
	for _, tc := range []struct {
		cfg  config
		n    int
		want time.Duration
	}{
		{config{budget: 4 * time.Minute, min: 8 * time.Second}, 16, 15 * time.Second},
		{config{budget: 4 * time.Minute, min: 8 * time.Second}, 17, 14 * time.Second},
		{config{budget: 4 * time.Minute, min: 8 * time.Second}, 60, 8 * time.Second},
		{config{budget: 4 * time.Minute, each: time.Minute}, 17, time.Minute},
	} {
		if got := tc.cfg.share(tc.n); got != tc.want {
			t.Errorf("%+v: share(%d) = %v, want %v", tc.cfg, tc.n, got, tc.want)
		}
	}
}
