// Command fuzzrun fuzzes every Fuzz target of the module, each for its share
// of a time budget, and fails only on a finding: an input the fuzzer wrote,
// or one under testdata/fuzz that fails. scripts/fuzz runs it; .ci/run runs
// scripts/fuzz.
//
//	fuzzrun                       every target; 4m split among them (8s at least each)
//	fuzzrun -each 2m              every target for 2 minutes
//	fuzzrun -targets 'Parse$'     the targets whose name matches
//
// The targets come from the tree: `go list` finds the packages whose test
// files declare a func Fuzz..., and `go test -list '^Fuzz'` names their
// targets, so a new target is fuzzed without editing anything. Every target
// is printed before the first one runs.
//
// Each package with targets is built once as an instrumented test binary
// (`go test -c -fuzz .`), and each target runs as that binary with
// -test.fuzz '^Name$' in the package's directory, as go test would run it,
// without -test.fuzztime. Once it has fuzzed for its time fuzzrun sends
// SIGINT to that one process, the fuzzing coordinator, which stops its
// workers through their pipes and exits cleanly. (A ^C to the whole process
// group, as a terminal sends it, is not clean: a worker can exit on the
// signal in the middle of an input before the coordinator sees it, and the
// coordinator then records that input as a crash, "fuzzing process hung or
// terminated unexpectedly: <nil>".) A wall-clock limit (its time plus -build
// for stopping) kills the process group if it does not stop. The outcome of
// a run is one of:
//
//   - ok: the binary passed after fuzzing had started;
//   - finding: the fuzzer wrote a new file under testdata/fuzz/<Name>/, or
//     the run failed on a file there (a planted or uncommitted input): the
//     files are named, and fuzzrun exits 1 (fix the code, commit the file);
//   - toolchain: the run failed with the fuzzing coordinator's own error
//     "context deadline exceeded" and wrote nothing. That is Go issue
//     golang/go#75804 (go1.26 still has it; go1.27 fixes it): when a
//     -fuzztime deadline expires, the coordinator can see it before its
//     workers stop. fuzzrun passes no -fuzztime, so the race should not
//     fire; if the signature shows anyway it retries once and then reports
//     it naming the Go issue, without failing;
//   - out of time: the wall-clock limit killed it and it wrote nothing: the
//     machine was too slow for the budget; reported, not failed;
//   - failed: anything else (the package does not build, a seed in the
//     code fails, the target did not fuzz): fuzzrun exits 1 with the
//     output.
//
// On Go 1.27 or later the retry and the toolchain outcome can go: pass
// -test.fuzztime (the time each target gets) instead of the SIGINT, and
// treat every failure as a finding or a failure.
package main

import (
	"bufio"
	"bytes"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/cockroachdb/errors"
)

func main() {
	cfg := config{goCmd: "go", budget: 4 * time.Minute, min: 8 * time.Second, build: 5 * time.Minute}
	flag.StringVar(&cfg.goCmd, "go", cfg.goCmd, "the go `command` to run (tests substitute a fake)")
	flag.DurationVar(&cfg.budget, "budget", cfg.budget, "the fuzzing time of the whole run, split equally among the targets")
	flag.DurationVar(&cfg.min, "min", cfg.min, "the least fuzzing time a target gets when the budget is split")
	flag.DurationVar(&cfg.each, "each", 0, "the fuzzing time of every target (instead of a share of -budget)")
	flag.DurationVar(&cfg.build, "build", cfg.build, "wall-clock limit on building a package's test binary, and allowance on top of a target's time for stopping it")
	flag.Func("targets", "a `regexp`: fuzz only the targets whose name matches", func(s string) error {
		re, err := regexp.Compile(s)
		cfg.targets = re
		return err
	})
	flag.Usage = func() {
		fmt.Fprintln(flag.CommandLine.Output(), "usage: fuzzrun [flags] [packages (default ./...)]")
		flag.PrintDefaults()
	}
	flag.Parse()
	cfg.patterns = flag.Args()
	if len(cfg.patterns) == 0 {
		cfg.patterns = []string{"./..."}
	}
	if err := cfg.validate(); err != nil {
		fmt.Fprintln(os.Stderr, "fuzzrun:", err)
		os.Exit(2)
	}
	if err := run(context.Background(), cfg, os.Stdout); err != nil {
		fmt.Fprintln(os.Stdout, "fuzzrun:", err)
		os.Exit(1)
	}
}

// config is what the flags set.
type config struct {
	goCmd    string
	patterns []string
	budget   time.Duration // split among the targets, unless each is set
	min      time.Duration // the least share of budget
	each     time.Duration // every target's time; 0: a share of budget
	build    time.Duration // the limit on a build; the allowance on top of a target's time
	targets  *regexp.Regexp
}

func (c config) validate() error {
	switch {
	case c.budget <= 0 && c.each <= 0:
		return errors.New("-budget or -each must be positive")
	case c.each < 0 || c.min < 0:
		return errors.New("-each and -min must not be negative")
	case c.build <= 0:
		return errors.New("-build must be positive")
	}
	return nil
}

// share is the fuzzing time of each of n targets.
func (c config) share(n int) time.Duration {
	if c.each > 0 || n == 0 {
		return c.each
	}
	return max(c.budget/time.Duration(n), c.min).Round(time.Second)
}

// target is one Fuzz function of one package.
type target struct {
	name, pkg, dir string // pkg: import path; dir: its directory
}

func (t target) corpusDir() string { return filepath.Join(t.dir, "testdata", "fuzz", t.name) }

// outcome is how one target's run ended (see the package doc).
type outcome int

const (
	ok outcome = iota
	finding
	toolchain
	outOfTime
	failed
)

func (o outcome) String() string {
	return [...]string{"ok", "FINDING", "toolchain error (golang/go#75804), not a finding", "out of time, not a finding", "FAILED"}[o]
}

// result is one target's outcome with what explains it.
type result struct {
	outcome outcome
	inputs  []string // finding: the input files, relative to the working directory
	execs   string   // the last "execs: N" the fuzzer printed
	output  string   // the run's whole output (shown for failed)
}

func run(ctx context.Context, cfg config, out io.Writer) error {
	targets, err := listTargets(ctx, cfg)
	if err != nil {
		return err
	}
	if len(targets) == 0 {
		return errors.Newf("no Fuzz targets in %s", strings.Join(cfg.patterns, " "))
	}
	each := cfg.share(len(targets))
	how := fmt.Sprintf("-budget %v split %d ways, at least %v", cfg.budget, len(targets), cfg.min)
	if cfg.each > 0 {
		how = "-each"
	}
	fmt.Fprintf(out, "fuzz: %d targets, %v each (%s):\n", len(targets), each, how)
	for _, t := range targets {
		fmt.Fprintf(out, "  %s %s\n", t.pkg, t.name)
	}
	b, err := newBuilder(ctx, cfg)
	if err != nil {
		return err
	}
	defer b.close()
	var bad, notes []string
	for _, t := range targets {
		fmt.Fprintf(out, "fuzz: %s (%s) for %v\n", t.name, t.pkg, each)
		r, err := b.fuzzOne(ctx, t, each, out)
		if err != nil {
			return err
		}
		if r.outcome == toolchain {
			fmt.Fprintf(out, "fuzz: %s: the coordinator's end-of-run error and no input (golang/go#75804): retrying once\n", t.name)
			if r, err = b.fuzzOne(ctx, t, each, out); err != nil {
				return err
			}
		}
		fmt.Fprintf(out, "fuzz: %s: %v%s\n", t.name, r.outcome, map[bool]string{true: ", execs " + r.execs, false: ""}[r.execs != ""])
		switch r.outcome {
		case finding:
			fmt.Fprintf(out, "--- output of %s (%s):\n%s", t.name, t.pkg, failureLines(r.output))
			for _, in := range r.inputs {
				bad = append(bad, fmt.Sprintf("%s (%s): failing input %s", t.name, t.pkg, in))
			}
		case failed:
			fmt.Fprintf(out, "--- output of %s (%s):\n%s", t.name, t.pkg, r.output)
			bad = append(bad, fmt.Sprintf("%s (%s): failed without a fuzz input (its output is above)", t.name, t.pkg))
		case toolchain:
			notes = append(notes, fmt.Sprintf("%s (%s): twice the fuzzing coordinator's end-of-run error \"context deadline exceeded\" "+
				"with no input written: Go issue golang/go#75804, not a finding", t.name, t.pkg))
		case outOfTime:
			notes = append(notes, fmt.Sprintf("%s (%s): killed after %v of wall time with no input written: the machine "+
				"was too slow for the budget (execs %s), not a finding", t.name, t.pkg, each+cfg.build, r.execs))
		}
	}
	if len(notes) > 0 {
		fmt.Fprintf(out, "fuzz: %d note(s), not failures:\n", len(notes))
		for _, n := range notes {
			fmt.Fprintln(out, "  "+n)
		}
	}
	if len(bad) > 0 {
		fmt.Fprintf(out, "fuzz: %d failure(s):\n", len(bad))
		for _, b := range bad {
			fmt.Fprintln(out, "  "+b)
		}
		return errors.New("fix the code, then commit each failing input as a regression seed (it then runs in every go test)")
	}
	fmt.Fprintf(out, "fuzz: %d targets fuzzed, no finding\n", len(targets))
	return nil
}

// fuzzFuncRE matches a fuzz target's declaration in a test file.
var fuzzFuncRE = regexp.MustCompile(`(?m)^func Fuzz\w*\(`)

// listTargets finds the packages whose test files declare a func Fuzz...
// (go list, so build constraints hold) and asks go test -list for their
// targets.
func listTargets(ctx context.Context, cfg config) ([]target, error) {
	args := append([]string{"list", "-f", "{{.ImportPath}}\t{{.Dir}}\t{{join .TestGoFiles \" \"}} {{join .XTestGoFiles \" \"}}"}, cfg.patterns...)
	listed, err := goOutput(ctx, cfg.goCmd, args...)
	if err != nil {
		return nil, err
	}
	dirs := map[string]string{} // import path -> dir, of packages with a fuzz declaration
	var pkgs []string
	for _, line := range strings.Split(strings.TrimSpace(listed), "\n") {
		pkg, rest, _ := strings.Cut(line, "\t")
		dir, files, _ := strings.Cut(rest, "\t")
		for _, f := range strings.Fields(files) {
			b, err := os.ReadFile(filepath.Join(dir, f))
			if err != nil {
				return nil, err
			}
			if fuzzFuncRE.Match(b) {
				dirs[pkg] = dir
				pkgs = append(pkgs, pkg)
				break
			}
		}
	}
	if len(pkgs) == 0 {
		return nil, nil
	}
	names, err := goOutput(ctx, cfg.goCmd, append([]string{"test", "-list", "^Fuzz", "-run", "^$"}, pkgs...)...)
	if err != nil {
		return nil, err
	}
	var targets []target
	var pending []string
	for _, line := range strings.Split(names, "\n") {
		switch {
		case strings.HasPrefix(line, "Fuzz"):
			pending = append(pending, line)
		case strings.HasPrefix(line, "ok  \t"):
			pkg := strings.Fields(line)[1]
			for _, n := range pending {
				if cfg.targets == nil || cfg.targets.MatchString(n) {
					targets = append(targets, target{name: n, pkg: pkg, dir: dirs[pkg]})
				}
			}
			pending = nil
		}
	}
	if len(pending) > 0 {
		return nil, errors.Newf("go test -list printed targets %v outside a package's result:\n%s", pending, names)
	}
	return targets, nil
}

// goOutput runs the go command and returns its standard output; a failure
// is an error with its standard error.
func goOutput(ctx context.Context, goCmd string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, goCmd, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		return "", errors.Newf("%s %s: %v\n%s%s", goCmd, strings.Join(args, " "), err, stdout.String(), stderr.String())
	}
	return stdout.String(), nil
}

var (
	// execsRE is the count in the fuzzer's progress lines.
	execsRE = regexp.MustCompile(`^fuzz: elapsed: .*, execs: (\d+)`)
	// inputRE names an input file of a target in go test's output: "Failing
	// input written to testdata/fuzz/FuzzX/abc" or "failure while testing
	// seed corpus entry: FuzzX/abc".
	inputRE = regexp.MustCompile(`(?:testdata/fuzz/|seed corpus entry: )(Fuzz\w*)/([^\s/]+)`)
)

// builder builds each package's instrumented test binary once and runs its
// targets.
type builder struct {
	cfg      config
	dir      string            // where the binaries go
	fuzzBase string            // $GOCACHE/fuzz, where go test keeps each package's generated corpus
	built    map[string]string // import path -> binary
}

func newBuilder(ctx context.Context, cfg config) (*builder, error) {
	gocache, err := goOutput(ctx, cfg.goCmd, "env", "GOCACHE")
	if err != nil {
		return nil, err
	}
	gocache = strings.TrimSpace(gocache)
	if gocache == "" || gocache == "off" {
		return nil, errors.New("fuzzing needs the go build cache (go env GOCACHE is off)")
	}
	dir, err := os.MkdirTemp("", "fuzzrun")
	if err != nil {
		return nil, err
	}
	return &builder{cfg: cfg, dir: dir, fuzzBase: filepath.Join(gocache, "fuzz"), built: map[string]string{}}, nil
}

func (b *builder) close() { os.RemoveAll(b.dir) }

// binary builds pkg's test binary with fuzzing instrumentation, once; a
// build failure returns its output.
func (b *builder) binary(ctx context.Context, pkg string) (string, string, error) {
	if bin, ok := b.built[pkg]; ok {
		return bin, "", nil
	}
	bin := filepath.Join(b.dir, fmt.Sprintf("pkg%d.test", len(b.built)))
	ctx, cancel := context.WithTimeout(ctx, b.cfg.build)
	defer cancel()
	out, err := exec.CommandContext(ctx, b.cfg.goCmd, "test", "-c", "-fuzz", ".", "-o", bin, pkg).CombinedOutput()
	if err != nil {
		return "", fmt.Sprintf("go test -c -fuzz . -o %s %s: %v\n%s", bin, pkg, err, out), nil
	}
	if _, err := os.Stat(bin); err != nil {
		return "", "", errors.Newf("go test -c built no binary for %s: %v", pkg, err)
	}
	b.built[pkg] = bin
	return bin, "", nil
}

// fuzzOne runs one target for each (after fuzzing starts) and classifies
// the run. Progress lines are copied to out as they come.
func (b *builder) fuzzOne(ctx context.Context, t target, each time.Duration, out io.Writer) (result, error) {
	bin, buildOutput, err := b.binary(ctx, t.pkg)
	if err != nil {
		return result{}, err
	}
	if bin == "" {
		return result{outcome: failed, output: buildOutput}, nil
	}
	before, err := corpusFiles(t)
	if err != nil {
		return result{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, each+b.cfg.build)
	defer cancel()
	cmd := exec.Command(bin, "-test.run=^$", "-test.fuzz=^"+t.name+"$", "-test.timeout=0",
		"-test.fuzzcachedir="+filepath.Join(b.fuzzBase, t.pkg),
		// go test minimizes every new interesting input for up to 60 s by
		// default, fuzzing nothing meanwhile; 2 s leaves the time to
		// fuzzing, and a failing input is still written, less minimized.
		"-test.fuzzminimizetime=2s")
	cmd.Dir = t.dir
	pr, pw := io.Pipe()
	cmd.Stdout, cmd.Stderr = pw, pw
	setGroup(cmd)
	if err := cmd.Start(); err != nil {
		return result{}, errors.Newf("start %s: %v", bin, err)
	}
	var (
		mu       sync.Mutex
		all      strings.Builder
		execs    string
		started  = make(chan struct{})
		readDone = make(chan struct{})
	)
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 16<<20)
		once := sync.OnceFunc(func() { close(started) })
		for sc.Scan() {
			line := sc.Text()
			mu.Lock()
			all.WriteString(line + "\n")
			if m := execsRE.FindStringSubmatch(line); m != nil {
				execs = m[1]
			}
			mu.Unlock()
			if strings.HasPrefix(line, "fuzz: elapsed: ") {
				fmt.Fprintln(out, "  "+line)
				once()
			}
		}
		io.Copy(io.Discard, pr)
	}()
	waitErr := make(chan error, 1)
	go func() { waitErr <- cmd.Wait(); pw.Close() }()

	killed := false
	stopTimer := time.NewTimer(time.Hour)
	stopTimer.Stop()
	var werr error
wait:
	for {
		select {
		case <-started:
			started = nil
			stopTimer.Reset(each)
		case <-stopTimer.C:
			interrupt(cmd) // fuzzed long enough: SIGINT to the coordinator alone
		case <-ctx.Done():
			killed = true
			kill(cmd)
		case werr = <-waitErr:
			break wait
		}
	}
	stopTimer.Stop()
	<-readDone
	after, err := corpusFiles(t)
	if err != nil {
		return result{}, err
	}
	mu.Lock()
	r := result{execs: execs, output: all.String()}
	mu.Unlock()
	r.outcome, r.inputs = classify(t, r.output, before, after, werr == nil, killed)
	return r, nil
}

// classify decides a run's outcome (the package doc lists them) from its
// output, the target's corpus files before and after, whether the binary
// exited 0, and whether the wall-clock limit killed it.
func classify(t target, output string, before, after []string, exited0, killed bool) (outcome, []string) {
	var inputs []string
	for _, f := range after {
		if !slices.Contains(before, f) {
			inputs = append(inputs, filepath.Join(t.corpusDir(), f))
		}
	}
	for _, m := range inputRE.FindAllStringSubmatch(output, -1) {
		p := filepath.Join(t.corpusDir(), m[2])
		if m[1] == t.name && slices.Contains(after, m[2]) && !slices.Contains(inputs, p) {
			inputs = append(inputs, p)
		}
	}
	if len(inputs) > 0 {
		for i, p := range inputs {
			if wd, err := os.Getwd(); err == nil {
				if rel, err := filepath.Rel(wd, p); err == nil && !strings.HasPrefix(rel, "..") {
					inputs[i] = rel
				}
			}
		}
		return finding, inputs
	}
	lines := strings.Split(output, "\n")
	fuzzed := slices.ContainsFunc(lines, func(l string) bool { return strings.HasPrefix(l, "fuzz: elapsed: ") })
	passed := exited0 && slices.Contains(lines, "PASS") && !strings.Contains(output, "--- FAIL")
	switch {
	case killed:
		return outOfTime, nil
	case passed && fuzzed:
		return ok, nil
	case isCoordinatorDeadline(t, lines):
		return toolchain, nil
	}
	return failed, nil
}

// isCoordinatorDeadline reports whether the run failed the way Go issue
// 75804 fails a run: the target's FAIL line followed by nothing but the
// coordinator's "context deadline exceeded", no subtest failing, no input.
func isCoordinatorDeadline(t target, lines []string) bool {
	i := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, "--- FAIL: "+t.name+" (") })
	if i < 0 || i+2 >= len(lines) {
		return false
	}
	return strings.TrimSpace(lines[i+1]) == "context deadline exceeded" && strings.TrimSpace(lines[i+2]) == "FAIL"
}

// failureLines is the output from the first --- FAIL line on (all of it if
// there is none): why the input fails and how to rerun it.
func failureLines(output string) string {
	if i := strings.Index(output, "--- FAIL"); i >= 0 {
		return output[i:]
	}
	return output
}

// corpusFiles lists the target's files under testdata/fuzz (none if the
// directory does not exist).
func corpusFiles(t target) ([]string, error) {
	es, err := os.ReadDir(t.corpusDir())
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var names []string
	for _, e := range es {
		names = append(names, e.Name())
	}
	return names, nil
}
