// Command testfilter reads `go test -json` on stdin and prints what a
// person reading a CI log needs: each package's result line as it comes,
// the full output of every failing test (its t.Errorf lines included), and
// a closing list of the skipped tests with their reasons and of the
// failures. It exits 1 when a test or a package failed, and when a test
// named with -require did not run and pass: a pinned `go test -run
// '^TestX$'` that matches nothing (the test was renamed) says "ok [no tests
// to run]" and exits 0, which must not pass. It exits 1 too when a test
// skipped under the race detector (testenv.SkipUnderRace) is not named
// with -pinned: nothing would run it.
//
//	go test -json -run '^TestX$' ./pkg | testfilter -require TestX
//	go test -json ./... | testfilter -show '^\s+FIGURES'
//	go test -json -race ./... | testfilter -pinned TestX -pinned TestY
//
// scripts/test runs every go test through it.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/cockroachdb/errors"
)

func main() {
	var cfg config
	flag.Func("require", "a test `name` (top level, or Test/sub) that must run and pass; repeatable", func(s string) error {
		if s == "" || strings.ContainsAny(s, " \t\n") {
			return errors.Newf("want a test name, got %q", s)
		}
		cfg.require = append(cfg.require, s)
		return nil
	})
	flag.Func("pinned", "a top-level test `name` run elsewhere without -race (scripts/test's pins); repeatable", func(s string) error {
		if s == "" || strings.ContainsAny(s, " \t\n/") {
			return errors.Newf("want a top-level test name, got %q", s)
		}
		cfg.pinned = append(cfg.pinned, s)
		return nil
	})
	flag.Func("show", "a `regexp`: the output lines of passing tests that match it are printed too (figures, progress)", func(s string) error {
		re, err := regexp.Compile(s)
		cfg.show = re
		return err
	})
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: go test -json ... | testfilter [-require TestName]... [-pinned TestName]... [-show regexp]")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() > 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(os.Stdin, os.Stdout, cfg); err != nil {
		fmt.Fprintln(os.Stdout, "testfilter:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	require []string       // tests that must run and pass
	pinned  []string       // tests run elsewhere without -race: they may skip under it
	show    *regexp.Regexp // extra lines to print from passing tests; nil: none
}

// raceSkipMarker is testenv.RaceSkipPrefix (TestRaceSkipMarker checks they
// agree; importing testenv would link etcd into this tool): a skip whose
// reason holds it is a test left to scripts/test's pinned runs.
const raceSkipMarker = "skipped under -race, pinned in scripts/test to run without it: "

// event is one line of `go test -json` (cmd/test2json's TestEvent, and the
// build events `go test -json` adds).
type event struct {
	Action     string
	Package    string
	ImportPath string // build-output, build-fail
	Test       string
	Output     string
}

// line is one output line and the test it belongs to ("" for the package).
type line struct {
	test, text string
}

// pkgState is what is known about one package while its events come in.
type pkgState struct {
	lines   []line            // every output line not printed yet
	results map[string]string // test -> pass, fail or skip
	done    bool              // the package's own pass, fail or skip came
}

type filter struct {
	cfg      config
	out      io.Writer
	pkgs     map[string]*pkgState
	order    []string // packages, first seen first
	failures []string // "pkg TestX", "pkg (package)", "pkg (build)"
	skips    []string // "pkg TestX: reason"
	events   int
}

func run(in io.Reader, out io.Writer, cfg config) error {
	f := &filter{cfg: cfg, out: out, pkgs: map[string]*pkgState{}}
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 64*1024), 64*1024*1024)
	for sc.Scan() {
		raw := sc.Bytes()
		var e event
		if len(raw) == 0 || raw[0] != '{' || json.Unmarshal(raw, &e) != nil {
			fmt.Fprintf(out, "%s\n", raw) // not an event (go vet, a build message): as is
			continue
		}
		f.events++
		f.handle(e)
	}
	if err := sc.Err(); err != nil {
		return errors.Newf("reading go test -json: %w", err)
	}
	return f.finish()
}

func (f *filter) pkg(name string) *pkgState {
	p := f.pkgs[name]
	if p == nil {
		p = &pkgState{results: map[string]string{}}
		f.pkgs[name] = p
		f.order = append(f.order, name)
	}
	return p
}

func (f *filter) handle(e event) {
	switch e.Action {
	case "build-output":
		fmt.Fprint(f.out, e.Output) // compiler errors: always shown
		return
	case "build-fail":
		f.failures = append(f.failures, e.ImportPath+" (build failed)")
		return
	}
	if e.Package == "" {
		return
	}
	p := f.pkg(e.Package)
	switch e.Action {
	case "output":
		switch {
		case e.Test == "" && isResultLine(e.Output):
			fmt.Fprint(f.out, e.Output)
			return
		case e.Test == "" && (e.Output == "PASS\n" || e.Output == "FAIL\n" || exitStatus.MatchString(e.Output)):
			return // the result line says it
		case f.cfg.show != nil && f.cfg.show.MatchString(strings.TrimRight(e.Output, "\n")):
			fmt.Fprint(f.out, e.Output)
		}
		p.lines = append(p.lines, line{e.Test, e.Output})
	case "pass", "skip":
		if e.Test == "" {
			p.done = true
			p.lines = nil
			return
		}
		p.results[e.Test] = e.Action
		if e.Action == "skip" {
			f.skipped(e.Package, e.Test, p.reason(e.Test))
		}
		if e.Action == "skip" && slices.Contains(f.cfg.require, e.Test) {
			fmt.Fprintf(f.out, "\n--- output of skipped pinned test %s %s:\n", e.Package, e.Test)
			p.print(f.out, e.Test)
			return
		}
		p.drop(e.Test)
	case "fail":
		if e.Test != "" {
			p.results[e.Test] = "fail"
			if !strings.Contains(e.Test, "/") { // a subtest's lines go with its top-level test
				f.failures = append(f.failures, e.Package+" "+e.Test)
				fmt.Fprintf(f.out, "\n--- output of failed %s %s:\n", e.Package, e.Test)
				p.print(f.out, e.Test)
			}
			return
		}
		p.done = true
		if !slices.ContainsFunc(f.failures, func(s string) bool { return strings.HasPrefix(s, e.Package+" ") }) {
			f.failures = append(f.failures, e.Package+" (package failed outside a test)")
		}
		if len(p.lines) > 0 { // a panic, a timeout, TestMain: everything not shown yet
			fmt.Fprintf(f.out, "\n--- output of failed package %s not shown above:\n", e.Package)
			p.print(f.out, "")
		}
	}
}

// skipped records a skip for the closing list, and fails a skip under the
// race detector of a test that is not pinned.
func (f *filter) skipped(pkg, test, reason string) {
	if reason == "" {
		reason = "(no reason given)"
	}
	f.skips = append(f.skips, pkg+" "+test+": "+reason)
	top, _, _ := strings.Cut(test, "/")
	if strings.Contains(reason, raceSkipMarker) && !slices.Contains(f.cfg.pinned, top) {
		f.failures = append(f.failures, fmt.Sprintf("%s %s: skipped under -race, and not pinned: add it to the pins in scripts/test, or nothing runs it", pkg, test))
	}
}

// reason is what a test said before it skipped: its own output lines,
// without go test's === and --- lines, trimmed and joined.
func (p *pkgState) reason(test string) string {
	var out []string
	for _, l := range p.lines {
		s := strings.TrimSpace(l.text)
		if l.test != test || s == "" || strings.HasPrefix(s, "=== ") || strings.HasPrefix(s, "--- ") {
			continue
		}
		out = append(out, s)
	}
	return strings.Join(out, " ")
}

// exitStatus is the test binary's exit line, which go test -fuzz prints.
var exitStatus = regexp.MustCompile(`^exit status \d+\n$`)

// isResultLine: the package's result as go test prints it ("ok  \tpkg",
// "FAIL\tpkg", "?   \tpkg\t[no test files]").
func isResultLine(s string) bool {
	return strings.HasPrefix(s, "ok  \t") || strings.HasPrefix(s, "FAIL\t") || strings.HasPrefix(s, "?   \t")
}

// within reports whether output of test belongs to top (itself or one of
// its subtests); top "" takes everything.
func within(test, top string) bool {
	return top == "" || test == top || strings.HasPrefix(test, top+"/")
}

// drop forgets the lines of a test that passed or skipped, once it is the
// top-level one (subtests' lines stay until their parent's result).
func (p *pkgState) drop(test string) {
	if strings.Contains(test, "/") {
		return
	}
	p.lines = slices.DeleteFunc(p.lines, func(l line) bool { return l.test != "" && within(l.test, test) })
}

// print writes and forgets the lines of top (and its subtests).
func (p *pkgState) print(out io.Writer, top string) {
	p.lines = slices.DeleteFunc(p.lines, func(l line) bool {
		if !within(l.test, top) {
			return false
		}
		fmt.Fprint(out, l.text)
		return true
	})
}

func (f *filter) finish() error {
	if f.events == 0 {
		return errors.Newf("no go test -json events on stdin (did go test run with -json?)")
	}
	for _, name := range f.order {
		if p := f.pkgs[name]; !p.done {
			f.failures = append(f.failures, name+" (no result: go test stopped before the package finished)")
			fmt.Fprintf(f.out, "\n--- output of unfinished package %s:\n", name)
			p.print(f.out, "")
		}
	}
	for _, want := range f.cfg.require {
		if r := f.result(want); r != "pass" {
			f.failures = append(f.failures, fmt.Sprintf("%s: pinned test %s", want, describe(r)))
		}
	}
	if len(f.skips) > 0 {
		fmt.Fprintf(f.out, "\nskipped (%d):\n", len(f.skips))
		for _, s := range f.skips {
			fmt.Fprintln(f.out, "  "+s)
		}
	}
	if len(f.failures) == 0 {
		return nil
	}
	fmt.Fprintln(f.out, "\nfailed:")
	for _, s := range f.failures {
		fmt.Fprintln(f.out, "  "+s)
	}
	return errors.Newf("%d failure(s), listed above", len(f.failures))
}

// result is the outcome of test in whichever package ran it: fail if it
// failed anywhere, else pass or skip, "" if it did not run.
func (f *filter) result(test string) string {
	got := ""
	for _, p := range f.pkgs {
		switch r := p.results[test]; {
		case r == "fail":
			return r
		case r != "" && got != "pass":
			got = r
		}
	}
	return got
}

func describe(result string) string {
	switch result {
	case "":
		return "did not run: no test by that name (renamed or removed? the script that pins it names it)"
	case "skip":
		return "was skipped (its reason is above)"
	}
	return result + "ed"
}
