package benchrun

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cockroachdb/errors"
)

// HogSubcommand is the hidden subcommand that runs the CPU hog child
// (Config.CPUHog): a run with a hog starts its own executable again as
// `<exe> cpu-hog --cores N`, so the binary that calls Run must hand that
// subcommand to HogMain before anything else (rangesvc-bench does, and so
// does this package's TestMain). A binary that does not is refused: the
// child never says it is ready and the run fails before it starts.
const HogSubcommand = "cpu-hog"

// hogReady is the line the hog child writes on stdout once its busy
// goroutines run.
const hogReady = "cpu-hog ready"

const (
	// hogStartTimeout bounds how long the child may take to say it is ready.
	hogStartTimeout = 10 * time.Second
	// hogStopGrace is how long the child may take to exit after its stdin
	// closes before it is killed.
	hogStopGrace = 5 * time.Second
)

// MaxCPUHog is the largest Config.CPUHog accepted: four times the CPUs of
// this machine (more only adds scheduler churn, not load).
func MaxCPUHog() int { return runtime.NumCPU() * 4 }

// HogMain is the body of the CPU hog child: it keeps `--cores N` goroutines
// busy with GOMAXPROCS=N, writes a ready line on stdout, and returns when
// stdin reaches EOF (the parent stopped it, or died). SIGINT is ignored so a
// Ctrl-C at the terminal lets the parent stop the hog in order; on Linux the
// parent also sets Pdeathsig, so a parent killed outright takes the hog with
// it even before the EOF is seen.
func HogMain(args []string, stdin io.Reader, stdout io.Writer) error {
	fs := flag.NewFlagSet(HogSubcommand, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	cores := fs.Int("cores", 1, "busy goroutines (and GOMAXPROCS)")
	if err := fs.Parse(args); err != nil {
		return errors.Wrapf(err, "%s", HogSubcommand)
	}
	switch {
	case *cores < 1 || *cores > MaxCPUHog():
		return errors.Newf("%s: --cores %d not in 1..%d", HogSubcommand, *cores, MaxCPUHog())
	case fs.NArg() > 0:
		return errors.Newf("%s: unexpected arguments %q", HogSubcommand, fs.Args())
	}
	signal.Ignore(os.Interrupt)
	runtime.GOMAXPROCS(*cores)
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range *cores {
		wg.Add(1)
		go func() {
			defer wg.Done()
			spin(stop)
		}()
	}
	if _, err := io.WriteString(stdout, hogReady+"\n"); err != nil {
		close(stop)
		wg.Wait()
		return errors.Wrapf(err, "%s: write ready line", HogSubcommand)
	}
	_, err := io.Copy(io.Discard, stdin) // returns at EOF: the parent is done
	close(stop)
	wg.Wait()
	return errors.Wrapf(err, "%s: read stdin", HogSubcommand)
}

// spinSink keeps the busy loop's arithmetic observable.
var spinSink atomic.Uint64

// spin burns one core until stop closes, looking at stop every few
// microseconds of work.
func spin(stop <-chan struct{}) {
	x := uint64(1)
	for {
		for range 1 << 12 {
			x ^= x << 13
			x ^= x >> 7
			x ^= x << 17
		}
		select {
		case <-stop:
			spinSink.Add(x)
			return
		default:
		}
	}
}

// hog is a running CPU hog child.
type hog struct {
	cmd   *exec.Cmd
	stdin *os.File // write end of the child's stdin: closing it stops the child
	start time.Time
	done  chan struct{} // closed when the child exited (waitErr set)

	waitErr  error // set before done closes
	stopOnce sync.Once
	early    bool // the child had exited when stop was called
	killed   bool // the child ignored its stdin's EOF and was killed
	stderr   limitedBuffer
}

// hogResult is what a stopped hog measured.
type hogResult struct {
	// CPUCores is the child's CPU time (user + system) over its lifetime.
	CPUCores float64
	// Problem is non-empty when the child exited before it was stopped or
	// failed: the run was then not (entirely) under the hog.
	Problem string
}

// startHog starts the CPU hog child with cores busy goroutines and waits
// until it says it is ready.
func startHog(ctx context.Context, cores int) (*hog, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, errors.Wrap(err, "bench: cpu hog: find own executable")
	}
	stdinR, stdinW, err := os.Pipe()
	if err != nil {
		return nil, errors.Wrap(err, "bench: cpu hog: stdin pipe")
	}
	stdoutR, stdoutW, err := os.Pipe()
	if err != nil {
		stdinR.Close()
		stdinW.Close()
		return nil, errors.Wrap(err, "bench: cpu hog: stdout pipe")
	}
	defer stdoutR.Close()
	h := &hog{stdin: stdinW, done: make(chan struct{})}
	h.cmd = exec.Command(exe, HogSubcommand, "--cores", strconv.Itoa(cores))
	h.cmd.Env = append(os.Environ(), "GOMAXPROCS="+strconv.Itoa(cores))
	h.cmd.Stdin, h.cmd.Stdout, h.cmd.Stderr = stdinR, stdoutW, &h.stderr
	h.cmd.SysProcAttr = hogSysProcAttr()
	err = h.cmd.Start()
	stdinR.Close() // the child holds its own copies now
	stdoutW.Close()
	if err != nil {
		stdinW.Close()
		return nil, errors.Wrap(err, "bench: cpu hog: start child")
	}
	h.start = time.Now()
	go func() {
		h.waitErr = h.cmd.Wait()
		close(h.done)
	}()
	ready := make(chan error, 1)
	go func() {
		line, err := bufio.NewReader(stdoutR).ReadString('\n')
		if err == nil && strings.TrimSpace(line) != hogReady {
			err = errors.Newf("unexpected output %q", line)
		}
		ready <- err
	}()
	timer := time.NewTimer(hogStartTimeout)
	defer timer.Stop()
	select {
	case err = <-ready:
	case <-timer.C:
		err = errors.Newf("no ready line within %v", hogStartTimeout)
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		h.stop()
		return nil, errors.Wrapf(err, "bench: cpu hog child %q did not start (does this binary run the %s subcommand?); stderr %q",
			exe, HogSubcommand, strings.TrimSpace(h.stderr.String()))
	}
	return h, nil
}

// stop closes the child's stdin, waits for it to exit (killing it after
// hogStopGrace) and reports what it burnt. It is idempotent.
func (h *hog) stop() hogResult {
	h.stopOnce.Do(func() {
		select {
		case <-h.done:
			h.early = true
		default:
		}
		h.stdin.Close()
		timer := time.NewTimer(hogStopGrace)
		defer timer.Stop()
		select {
		case <-h.done:
		case <-timer.C:
			h.killed = true
			_ = h.cmd.Process.Kill()
			<-h.done
		}
	})
	var res hogResult
	if ps := h.cmd.ProcessState; ps != nil {
		res.CPUCores = float64(ps.UserTime()+ps.SystemTime()) / float64(time.Since(h.start))
	}
	var what []string
	if h.early {
		what = append(what, "exited before the end of the run")
	}
	if h.killed {
		what = append(what, fmt.Sprintf("killed: still running %v after its stdin closed", hogStopGrace))
	}
	if h.waitErr != nil {
		what = append(what, oneLine(h.waitErr.Error()))
	}
	if s := strings.TrimSpace(h.stderr.String()); s != "" && len(what) > 0 {
		what = append(what, "stderr "+strconv.Quote(oneLine(s)))
	}
	if len(what) > 0 {
		res.Problem = "cpu hog child " + strings.Join(what, "; ")
	}
	return res
}

// limitedBuffer keeps the first 4 KiB written to it (the child's stderr).
type limitedBuffer struct {
	mu sync.Mutex
	b  []byte
}

func (l *limitedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if room := 4096 - len(l.b); room > 0 {
		l.b = append(l.b, p[:min(room, len(p))]...)
	}
	return len(p), nil
}

func (l *limitedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return string(l.b)
}
