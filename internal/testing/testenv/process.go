package testenv

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/cockroachdb/errors"
	"github.com/idrange/idrange/internal/server/embedetcd"
	"github.com/idrange/idrange/internal/testing/measure"
	"github.com/idrange/idrange/segment"
	"github.com/idrange/idrange/snowflake"
	"github.com/idrange/idrange/tlsfiles"
)

// ServeConfig describes a `rangesvc serve` subprocess. Zero values: region
// 0, DataDir t.TempDir(), embedded etcd on random loopback ports, gRPC and
// metrics on random loopback ports.
type ServeConfig struct {
	Region int
	// DataDir is the embedded etcd's data directory; reuse it to restart
	// on the same state. Ignored when Etcd is set.
	DataDir string
	// Etcd, if set, points the service at an external etcd (--etcd), with
	// --init-region: a test's external etcd is its own, so the first
	// replica initialises its region record (or checks the one there).
	Etcd []string
	// Listen, Metrics and HTTP (the HTTP/JSON API, --http) default to
	// 127.0.0.1:0.
	Listen, Metrics, HTTP string
	// Faults runs the fault build (FaultBinary) so the test-only flags
	// (--fault-clock-offset, --fault-clock-file) are accepted.
	Faults bool
	// Args are extra flags appended to the command line. StartServe passes
	// --drain-delay 0s before them (a SIGTERM stops at once, as before the
	// flag existed); Args may set it again.
	Args []string
	// StartTimeout bounds the wait for the "listening" log line. Default 60s.
	StartTimeout time.Duration
	// OpenFiles, if set, runs the process with its open-file limit (soft
	// and hard RLIMIT_NOFILE) at this value, through `sh -c 'ulimit -n N
	// && exec rangesvc ...'` (the process keeps the shell's pid).
	OpenFiles int
}

// Process is a running `rangesvc serve`.
type Process struct {
	Cmd *exec.Cmd
	// GRPCAddr and MetricsAddr are the bound addresses, from the
	// "msg=listening grpc=... metrics=..." log line (or its JSON form with
	// --log-format json).
	GRPCAddr, MetricsAddr string
	// HTTPAddr is the HTTP/JSON API's bound address, from the "http api
	// listening" log line ("" if that line did not come first).
	HTTPAddr string
	// DataDir is the data directory it was started with ("" with Etcd).
	DataDir string

	t      testing.TB
	stderr lockedBuffer
	done   chan struct{}
	err    error // Wait's result, valid after done is closed
}

// listeningRE matches serve's "listening" line in --log-format text and
// json.
var listeningRE = regexp.MustCompile(`msg=listening grpc=(\S+) metrics=(\S+)|"msg":"listening","grpc":"([^"]+)","metrics":"([^"]+)"`)

var httpListeningRE = regexp.MustCompile(`msg="http api listening" http=(\S+)|"msg":"http api listening","http":"([^"]+)"`)

// StartServe starts `rangesvc serve` with cfg and waits until it listens.
// The process is killed at the end of the test if still running.
func StartServe(t testing.TB, cfg ServeConfig) *Process {
	t.Helper()
	bin := Binary(t)
	if cfg.Faults {
		bin = FaultBinary(t)
	}
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Metrics == "" {
		cfg.Metrics = "127.0.0.1:0"
	}
	if cfg.HTTP == "" {
		cfg.HTTP = "127.0.0.1:0"
	}
	if cfg.StartTimeout == 0 {
		cfg.StartTimeout = 60 * time.Second
	}
	args := []string{"serve", "--region", strconv.Itoa(cfg.Region), "--listen", cfg.Listen, "--metrics", cfg.Metrics,
		"--http", cfg.HTTP}
	if len(cfg.Etcd) > 0 {
		args = append(args, "--etcd", strings.Join(cfg.Etcd, ","), "--init-region")
	} else {
		if cfg.DataDir == "" {
			cfg.DataDir = t.TempDir()
		}
		args = append(args, "--data-dir", cfg.DataDir,
			"--etcd-client-url", "https://127.0.0.1:0", "--etcd-peer-url", "https://127.0.0.1:0")
	}
	args = append(args, "--drain-delay", "0s")
	args = append(args, cfg.Args...)
	p := &Process{t: t, DataDir: cfg.DataDir, done: make(chan struct{})}
	p.Cmd = exec.Command(bin, args...)
	if cfg.OpenFiles > 0 {
		p.Cmd = exec.Command("sh", append([]string{"-c", `ulimit -n "$1" && shift && exec "$@"`, "sh",
			strconv.Itoa(cfg.OpenFiles), bin}, args...)...)
	}
	p.Cmd.Env = os.Environ()
	pipe, err := p.Cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := p.Cmd.Start(); err != nil {
		t.Fatalf("testenv: start %s: %v", bin, err)
	}
	t.Cleanup(func() { p.Kill() })

	addrs := make(chan [3]string, 1)
	go func() {
		sc := bufio.NewScanner(pipe)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		found, httpAddr := false, ""
		for sc.Scan() {
			line := sc.Text()
			p.stderr.WriteLine(line)
			if !found {
				if m := httpListeningRE.FindStringSubmatch(line); m != nil {
					httpAddr = m[1] + m[2] // one of them is empty
				}
				if m := listeningRE.FindStringSubmatch(line); m != nil {
					found = true
					if m[1] == "" { // the JSON form
						m = m[2:]
					}
					addrs <- [3]string{m[1], m[2], httpAddr}
				}
			}
		}
		io.Copy(io.Discard, pipe)
		p.err = p.Cmd.Wait()
		close(p.done)
	}()
	timer := time.NewTimer(cfg.StartTimeout)
	defer timer.Stop()
	select {
	case a := <-addrs:
		p.GRPCAddr, p.MetricsAddr, p.HTTPAddr = a[0], a[1], a[2]
	case <-p.done:
		t.Fatalf("testenv: rangesvc serve exited before listening: %v\nstderr:\n%s", p.err, p.Stderr())
	case <-timer.C:
		p.Kill()
		t.Fatalf("testenv: rangesvc serve did not listen within %v\nstderr:\n%s", cfg.StartTimeout, p.Stderr())
	}
	return p
}

// EmbeddedEtcd is how another process reaches the embedded etcd of a
// `rangesvc serve` started without Etcd: its URLs (from the "embedded etcd
// ready" log line) and the client certificate serve keeps in DataDir/pki.
type EmbeddedEtcd struct {
	Endpoint, Peer string // https://host:port
	PKI            embedetcd.PKI
}

var etcdReadyRE = regexp.MustCompile(`msg="embedded etcd ready" endpoints=(\S+) peer=(\S+)`)

// EmbeddedEtcd is p's embedded etcd; it fails t if p did not start one.
func (p *Process) EmbeddedEtcd(t testing.TB) EmbeddedEtcd {
	t.Helper()
	m := etcdReadyRE.FindStringSubmatch(p.Stderr())
	if m == nil || p.DataDir == "" {
		t.Fatalf("testenv: no embedded etcd in the log:\n%s", p.Stderr())
	}
	return EmbeddedEtcd{Endpoint: m[1], Peer: m[2], PKI: embedetcd.PKIFiles(p.DataDir)}
}

// Flags are the --etcd-cacert, --etcd-cert and --etcd-key flags of another
// replica pointed at e (ServeConfig.Args, with ServeConfig.Etcd =
// []string{e.Endpoint}).
func (e EmbeddedEtcd) Flags() []string {
	return []string{"--etcd-cacert", e.PKI.CACert, "--etcd-cert", e.PKI.ClientCert, "--etcd-key", e.PKI.ClientKey}
}

// Client is a clientv3 client of e with the client certificate, closed at
// the end of the test.
func (e EmbeddedEtcd) Client(t testing.TB) *clientv3.Client {
	t.Helper()
	tc, err := tlsfiles.Files{CA: e.PKI.CACert, Cert: e.PKI.ClientCert, Key: e.PKI.ClientKey}.ClientConfig()
	if err != nil {
		t.Fatal(err)
	}
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{e.Endpoint}, DialTimeout: 5 * time.Second, TLS: tc, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cli.Close() })
	return cli
}

// Stderr is everything the process wrote to stderr so far.
func (p *Process) Stderr() string { return p.stderr.String() }

// WaitStderr waits until a stderr line contains substr (or timeout) and
// reports whether it did.
func (p *Process) WaitStderr(substr string, timeout time.Duration) bool {
	return p.stderr.waitFor(substr, timeout)
}

// Kill sends SIGKILL (kill -9) and waits for the process to go. Killing a
// finished process is a no-op.
func (p *Process) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.Cmd.Process.Kill()
	<-p.done
}

// Signal sends sig to the process.
func (p *Process) Signal(sig os.Signal) error { return p.Cmd.Process.Signal(sig) }

// Stop sends SIGTERM and waits up to timeout for a graceful exit; it
// returns the exit error (nil for status 0). After the timeout it kills.
func (p *Process) Stop(timeout time.Duration) error {
	_ = p.Signal(syscall.SIGTERM)
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-p.done:
		return p.err
	case <-t.C:
		p.Kill()
		return errors.Newf("testenv: rangesvc did not stop within %v after SIGTERM", timeout)
	}
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// ExitErr is the process's exit error; valid after Done is closed.
func (p *Process) ExitErr() error { return p.err }

// Mint runs `rangesvc mint --target <this process> -n n` and returns the
// IDs it printed, failing the test on a non-zero exit, a bad line, or IDs
// that CheckIDs refuses (not n of them, not all distinct, of another
// region, or dated outside the minting).
func (p *Process) Mint(t testing.TB, region, n int) []snowflake.ID {
	t.Helper()
	return Mint(t, []string{p.GRPCAddr}, region, n)
}

// Mint runs `rangesvc mint` against targets and parses its stdout; it
// checks the IDs as Process.Mint does.
func Mint(t testing.TB, targets []string, region, n int) []snowflake.ID {
	t.Helper()
	return MintSkewed(t, targets, region, n, 0)
}

// MintSkewed is Mint for targets of which some run their service clock up
// to clockBack late (the fault build's --fault-clock-offset): their IDs
// may be dated that much earlier.
func MintSkewed(t testing.TB, targets []string, region, n int, clockBack time.Duration) []snowflake.ID {
	t.Helper()
	start := time.Now().Add(-clockBack)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, Binary(t), "mint", "--target", strings.Join(targets, ","),
		"-n", strconv.Itoa(n), "--region", strconv.Itoa(region))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("testenv: rangesvc mint: %v\nstderr: %s", err, stderr.String())
	}
	lines := strings.Split(strings.TrimSuffix(stdout.String(), "\n"), "\n")
	if len(lines) != n {
		t.Fatalf("testenv: rangesvc mint -n %d printed %d lines", n, len(lines))
	}
	ids := make([]snowflake.ID, n)
	for i, l := range lines {
		id, err := snowflake.Parse(l)
		if err != nil {
			t.Fatalf("testenv: rangesvc mint line %d %q: %v", i+1, l, err)
		}
		ids[i] = id
	}
	CheckIDs(t, ids, region, start)
	return ids
}

// MaxBehind is the most an ID's timestamp may lag the moment it is handed
// out (docs/design.md: a block is finished once the clock passes it, and a
// shared run's IDs are handed out within 1 s of its first millisecond).
const MaxBehind = time.Second

// CheckIDs fails t unless ids are what a region's replicas may hand out
// from start until now: at least one, all distinct, every one of region
// (any worker), and dated from MaxBehind before start to the service's
// default lead (segment.DefaultMaxLead) after now. It is the checker of
// internal/testing/measure (CheckResult.Err names the offending IDs).
// A test that moves a service clock back passes a start that much earlier.
func CheckIDs(t testing.TB, ids []snowflake.ID, region int, start time.Time) {
	t.Helper()
	c, err := measure.NewChecker(measure.CheckConfig{
		Expect:    measure.Codes([]int{region}, snowflake.MaxWorker+1),
		NotBefore: start.Add(-MaxBehind),
		NotAfter:  time.Now().Add(segment.DefaultMaxLead),
		Capacity:  len(ids),
	})
	if err != nil {
		t.Fatalf("testenv: CheckIDs(region %d): %v", region, err)
	}
	c.Add(ids...)
	if err := c.Check().Err(); err != nil {
		t.Fatalf("testenv: %d IDs minted in region %d since %s: %v", len(ids), region, start.Format(time.RFC3339Nano), err)
	}
}

// Scrape fetches http://MetricsAddr/metrics.
func (p *Process) Scrape(t testing.TB) string {
	t.Helper()
	return get(t, "http://"+p.MetricsAddr+"/metrics")
}

// Probe GETs http://MetricsAddr<path> (a probe such as /livez or /readyz)
// and returns the status code and body; any status is an answer, only a
// failed request fails t.
func (p *Process) Probe(t testing.TB, path string) (code int, body string) {
	t.Helper()
	resp, b := HTTPGet(t, "http://"+p.MetricsAddr+path, 10*time.Second)
	return resp.StatusCode, string(b)
}

// HTTPGet GETs url within timeout and returns the response (its body
// closed) and the body; any status is an answer, only a failed request
// fails t.
func HTTPGet(t testing.TB, url string, timeout time.Duration) (*http.Response, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("testenv: GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("testenv: GET %s: %v", url, err)
	}
	return resp, b
}

func get(t testing.TB, url string) string {
	t.Helper()
	resp, b := HTTPGet(t, url, 10*time.Second)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("testenv: GET %s: %s\n%s", url, resp.Status, b)
	}
	return string(b)
}

// lockedBuffer collects lines and lets a waiter block until one matches.
type lockedBuffer struct {
	mu   sync.Mutex
	buf  strings.Builder
	cond chan struct{} // closed and replaced on every write
}

func (b *lockedBuffer) WriteLine(s string) {
	b.mu.Lock()
	b.buf.WriteString(s)
	b.buf.WriteByte('\n')
	if b.cond != nil {
		close(b.cond)
		b.cond = nil
	}
	b.mu.Unlock()
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) waitFor(substr string, timeout time.Duration) bool {
	deadline := time.NewTimer(timeout)
	defer deadline.Stop()
	for {
		b.mu.Lock()
		if strings.Contains(b.buf.String(), substr) {
			b.mu.Unlock()
			return true
		}
		if b.cond == nil {
			b.cond = make(chan struct{})
		}
		c := b.cond
		b.mu.Unlock()
		select {
		case <-c:
		case <-deadline.C:
			return false
		}
	}
}
