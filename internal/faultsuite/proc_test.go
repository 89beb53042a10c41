package faultsuite

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

const sigUSR1 = syscall.SIGUSR1

// Packages of the helper binaries, built once per test process, with
// faultsTag so that rangesvc serve has its test-only fault flags.
const (
	faultsTag     = "idrange_faults"
	pkgRangesvc   = "github.com/idrange/idrange/cmd/rangesvc"
	pkgEtcdMember = "github.com/idrange/idrange/internal/faultsuite/cmd/etcdmember"
	pkgMinter     = "github.com/idrange/idrange/internal/faultsuite/cmd/minter"
)

type binaries struct{ rangesvc, etcdmember, minter string }

var (
	binDir    string // set by TestMain
	buildOnce sync.Once
	built     binaries
	buildErr  error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "idrange-faultsuite-bin-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = dir
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// bins builds the three binaries with one go build (so they share the
// compile work) the first time a test needs them.
func bins(t *testing.T) binaries {
	t.Helper()
	buildOnce.Do(func() {
		goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
		if p, err := exec.LookPath("go"); err == nil {
			goTool = p
		}
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
		defer cancel()
		start := time.Now()
		cmd := exec.CommandContext(ctx, goTool, "build", "-tags", faultsTag, "-o", binDir+string(os.PathSeparator), pkgRangesvc, pkgEtcdMember, pkgMinter)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
			return
		}
		built = binaries{
			rangesvc:   filepath.Join(binDir, "rangesvc"),
			etcdmember: filepath.Join(binDir, "etcdmember"),
			minter:     filepath.Join(binDir, "minter"),
		}
		fmt.Fprintf(os.Stderr, "faultsuite: built helper binaries in %v\n", time.Since(start).Round(time.Millisecond))
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return built
}

// Ports that must survive a process restart (etcd members, rangesvc
// replicas) are picked below the kernel's ephemeral range (32768+), so no
// outgoing connection can take one while its owner is down, and are never
// handed out twice by this test process.
var (
	portMu   sync.Mutex
	portUsed = map[int]bool{}
)

func freePort(t *testing.T) int {
	t.Helper()
	portMu.Lock()
	defer portMu.Unlock()
	for range 1000 {
		p := 20000 + rand.IntN(12000)
		if portUsed[p] {
			continue
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue
		}
		ln.Close()
		portUsed[p] = true
		return p
	}
	t.Fatal("no free loopback port in 20000..32000")
	return 0
}

// proc is one child process. Its stdout and stderr go to a log file (kept
// in the test's temp dir and printed on failure); readiness is a line on
// either stream matching a pattern.
type proc struct {
	t       *testing.T
	name    string
	bin     string
	args    []string
	env     []string
	logPath string
	ready   *regexp.Regexp

	mu      sync.Mutex
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	done    chan struct{}
	exitErr error
	readyCh chan []string // submatches of the ready line, once per start
	stopped bool          // SIGSTOPped
}

func newProc(t *testing.T, name, bin string, args, env []string, logDir string, ready *regexp.Regexp) *proc {
	p := &proc{t: t, name: name, bin: bin, args: args, env: env, ready: ready,
		logPath: filepath.Join(logDir, name+".log")}
	t.Cleanup(p.cleanup)
	return p
}

// start launches the process (again, after a kill).
func (p *proc) start() {
	p.t.Helper()
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil && !p.exited() {
		p.t.Fatalf("%s: start while running", p.name)
	}
	logf, err := os.OpenFile(p.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		p.t.Fatal(err)
	}
	fmt.Fprintf(logf, "=== %s start %s %s\n", time.Now().Format(time.RFC3339Nano), p.bin, strings.Join(p.args, " "))
	cmd := exec.Command(p.bin, p.args...)
	cmd.Env = append(os.Environ(), p.env...)
	// The child dies with the test process even if cleanup never runs (a
	// test binary killed by its timeout).
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		p.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		p.t.Fatalf("%s: start: %v", p.name, err)
	}
	readyCh := make(chan []string, 1)
	var once sync.Once
	var lw sync.Mutex
	var streams sync.WaitGroup
	scan := func(r io.Reader) {
		defer streams.Done()
		sc := bufio.NewScanner(r)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		for sc.Scan() {
			line := sc.Text()
			lw.Lock()
			fmt.Fprintln(logf, line)
			lw.Unlock()
			if p.ready != nil {
				if m := p.ready.FindStringSubmatch(line); m != nil {
					once.Do(func() { readyCh <- m })
				}
			}
		}
	}
	streams.Add(2)
	go scan(stdout)
	go scan(stderr)
	done := make(chan struct{})
	p.cmd, p.stdin, p.done, p.readyCh, p.stopped = cmd, stdin, done, readyCh, false
	go func() {
		streams.Wait() // read everything before Wait closes the pipes
		err := cmd.Wait()
		lw.Lock()
		fmt.Fprintf(logf, "=== %s exit: %v\n", time.Now().Format(time.RFC3339Nano), err)
		lw.Unlock()
		logf.Close()
		p.mu.Lock()
		p.exitErr = err
		p.mu.Unlock()
		close(done)
	}()
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// waitReady waits for the ready line and returns its submatches.
func (p *proc) waitReady(timeout time.Duration) []string {
	p.t.Helper()
	p.mu.Lock()
	ch, done := p.readyCh, p.done
	p.mu.Unlock()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case m := <-ch:
		return m
	case <-done:
		p.t.Fatalf("%s exited before it was ready: %v\n%s", p.name, p.exitErr, p.logTail(40))
	case <-timer.C:
		p.t.Fatalf("%s not ready within %v\n%s", p.name, timeout, p.logTail(40))
	}
	return nil
}

func (p *proc) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cmd.Process.Pid
}

func (p *proc) signal(sig syscall.Signal) {
	p.t.Helper()
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if err := cmd.Process.Signal(sig); err != nil {
		p.t.Fatalf("%s: signal %v: %v", p.name, sig, err)
	}
}

// kill is kill -9 and waits for the process to be gone.
func (p *proc) kill() {
	p.t.Helper()
	p.signal(syscall.SIGKILL)
	<-p.done
}

// pause is SIGSTOP; resume is SIGCONT.
func (p *proc) pause() {
	p.signal(syscall.SIGSTOP)
	p.mu.Lock()
	p.stopped = true
	p.mu.Unlock()
}

func (p *proc) resume() {
	p.signal(syscall.SIGCONT)
	p.mu.Lock()
	p.stopped = false
	p.mu.Unlock()
}

func (p *proc) isStopped() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stopped
}

// stop sends SIGTERM and waits up to timeout for the process to exit 0.
// Its error says why not (it had exited already, it exited non-zero, or it
// did not exit in time and was killed) with the tail of its log. It does
// not fail the test, so it can run in its own goroutine.
func (p *proc) stop(timeout time.Duration) error {
	if p.exited() {
		return fmt.Errorf("%s had already exited (%s)\n%s", p.name, p.exitStatus(), p.logTail(40))
	}
	p.mu.Lock()
	cmd := p.cmd
	p.mu.Unlock()
	if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
		return fmt.Errorf("%s: SIGTERM: %v", p.name, err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.done:
	case <-timer.C:
		_ = cmd.Process.Kill()
		<-p.done
		return fmt.Errorf("%s did not exit within %v of SIGTERM\n%s", p.name, timeout, p.logTail(40))
	}
	if p.exitErr != nil {
		return fmt.Errorf("%s exited with %s\n%s", p.name, p.exitStatus(), p.logTail(40))
	}
	return nil
}

// exitStatus describes how the exited process ended ("exit status 0",
// "exit status 1", "signal: killed").
func (p *proc) exitStatus() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exitErr == nil {
		return "exit status 0"
	}
	return p.exitErr.Error()
}

// send writes one line to the process's stdin.
func (p *proc) send(line string) {
	p.t.Helper()
	p.mu.Lock()
	w := p.stdin
	p.mu.Unlock()
	if _, err := io.WriteString(w, line+"\n"); err != nil {
		p.t.Fatalf("%s: write %q to stdin: %v", p.name, line, err)
	}
}

func (p *proc) cleanup() {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
	default:
		_ = cmd.Process.Signal(syscall.SIGCONT)
		_ = cmd.Process.Kill()
		<-done
	}
	if p.t.Failed() {
		p.t.Logf("--- %s log (tail) ---\n%s", p.name, p.logTail(30))
	}
}

func (p *proc) logTail(n int) string {
	b, err := os.ReadFile(p.logPath)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	for i, l := range lines {
		if len(l) > 400 { // rangesvc logs whole stack traces
			lines[i] = l[:400] + "..."
		}
	}
	return strings.Join(lines, "\n")
}
