package main

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/cockroachdb/errors"
	"go.uber.org/zap"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// A cockroachdb error (which carries a stack trace for %+v) logs as one
// line with its message only, in both formats; durations read as "1.5s".
func TestLoggerOneLineErrors(t *testing.T) {
	err := errors.Wrap(errors.New("connection refused"), "etcd probe")
	for _, format := range []string{logText, logJSON} {
		var buf bytes.Buffer
		log := newLogger(&buf, format, slog.LevelInfo)
		log.Warn("store unreachable", "err", err, "after", 1500*time.Millisecond)
		out := buf.String()
		if strings.Count(out, "\n") != 1 || strings.Contains(out, ".go:") || strings.Contains(out, "goroutine") {
			t.Fatalf("%s: not one line without a stack:\n%s", format, out)
		}
		if !strings.Contains(out, "etcd probe: connection refused") || !strings.Contains(out, "1.5s") {
			t.Fatalf("%s: %q lacks the error message or the duration", format, out)
		}
		if format == logJSON && !json.Valid([]byte(out)) {
			t.Fatalf("json: %q is not JSON", out)
		}
	}
}

// The embedded etcd's zap logs go through serve's handler: JSON in JSON
// mode, with zap's fields as attributes, one line (no errorVerbose stack),
// errors only, and nothing after quiet().
func TestEtcdLogsThroughSlog(t *testing.T) {
	var buf bytes.Buffer
	lg, quiet := etcdLogger(newLogger(&buf, logJSON, slog.LevelDebug))
	lg = lg.Named("raft").With(zap.String("member", "m1"))
	lg.Info("routine")
	lg.Warn("slow apply")
	lg.Error("failed to publish", zap.Error(errors.New("timeout")), zap.Duration("took", 2*time.Second))
	quiet()
	lg.Error("closing; logged as an error by etcd")

	out := strings.TrimSuffix(buf.String(), "\n")
	if strings.Count(out, "\n") != 0 {
		t.Fatalf("want exactly one line (the error), got:\n%s", out)
	}
	var rec map[string]any
	if err := json.Unmarshal([]byte(out), &rec); err != nil {
		t.Fatalf("%q: %v", out, err)
	}
	want := map[string]any{"level": "ERROR", "msg": "failed to publish", "component": "etcd", "logger": "raft",
		"member": "m1", "error": "timeout", "took": "2s"}
	for k, v := range want {
		if rec[k] != v {
			t.Errorf("%s = %v, want %v (record %s)", k, rec[k], v, out)
		}
	}
	if _, ok := rec["errorVerbose"]; ok {
		t.Errorf("errorVerbose (a stack trace) logged: %s", out)
	}
}

// etcd's Fatal (a WAL purge that hit "too many open files" in issue 24)
// exits 1 only after serve logs "serve failed" with etcd's message and
// error, also once the logs are quiet for an orderly stop.
func TestEtcdFatalLogsServeFailed(t *testing.T) {
	for _, quieted := range []bool{false, true} {
		var buf bytes.Buffer
		var code []int
		lg, quiet := etcdLoggerExiting(newLogger(&buf, logText, slog.LevelInfo), func(c int) { code = append(code, c) })
		if quieted {
			quiet()
		}
		lg.Fatal("failed to purge snap file", zap.Error(errors.New("open data/member/snap: too many open files")))
		out := buf.String()
		want := `msg="serve failed" err="embedded etcd: failed to purge snap file: open data/member/snap: too many open files"`
		if !strings.Contains(out, want) {
			t.Errorf("quiet %v: log\n%s\nlacks %s", quieted, out, want)
		}
		if len(code) != 1 || code[0] != cli.ExitFailure {
			t.Errorf("quiet %v: exit called with %v, want once with %d", quieted, code, cli.ExitFailure)
		}
	}
}

// Acceptance: serve --log-format json through a start on the
// embedded etcd, mints and a SIGTERM stop: every stderr line is a JSON
// object with time, level and msg. During the drain the replica reports
// NOT_SERVING ("shutting down") on /readyz while /livez stays 200.
func TestJSONLogsSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the rangesvc binary")
	}
	testenv.Binary(t) // build first: a cold build must not eat the test's deadline
	p := testenv.StartServe(t, testenv.ServeConfig{Region: 3,
		Args: []string{"--log-format", "json", "--log-level", "debug", "--drain-delay", "3s"}})
	seen := map[int64]bool{}
	for range 3 {
		for _, id := range p.Mint(t, 3, 500) {
			if seen[int64(id)] {
				t.Fatalf("duplicate ID %d", id)
			}
			seen[int64(id)] = true
		}
	}
	expectProbe(t, p, "/readyz", http.StatusOK, "SERVING")
	if err := p.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if !p.WaitStderr(`"msg":"reporting NOT_SERVING; draining"`, 10*time.Second) {
		t.Fatalf("no drain log; stderr:\n%s", p.Stderr())
	}
	expectProbe(t, p, "/readyz", http.StatusServiceUnavailable, "NOT_SERVING: shutting down")
	expectProbe(t, p, "/livez", http.StatusOK, "ok")
	select {
	case <-p.Done():
	case <-time.After(30 * time.Second):
		t.Fatalf("serve did not exit within 30s of SIGTERM")
	}
	if err := p.ExitErr(); err != nil {
		t.Fatalf("exit: %v", err)
	}

	lines := strings.Split(strings.TrimSuffix(p.Stderr(), "\n"), "\n")
	if len(lines) < 8 {
		t.Fatalf("only %d log lines:\n%s", len(lines), p.Stderr())
	}
	for i, l := range lines {
		var rec map[string]any
		if err := json.Unmarshal([]byte(l), &rec); err != nil {
			t.Fatalf("stderr line %d is not JSON (%v): %q", i+1, err, l)
		}
		for _, k := range []string{"time", "level", "msg"} {
			if _, ok := rec[k]; !ok {
				t.Fatalf("stderr line %d lacks %q: %s", i+1, k, l)
			}
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"msg":"stopped"`) {
		t.Errorf("last line %q, want the stopped message", last)
	}
	t.Logf("%d JSON log lines", len(lines))
	if testing.Verbose() {
		t.Log(p.Stderr())
	}
}

// A runtime failure after the logger exists is logged in the chosen format
// (one JSON line naming the error) and exits 1, instead of a plain
// "rangesvc serve: ..." line.
func TestServeFailureLoggedAsJSON(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens here now: etcd unreachable
	code, out, errs := runCmd("serve", "--region", "0", "--etcd", dead, "--etcd-timeout", "300ms",
		"--listen", "127.0.0.1:0", "--metrics", "127.0.0.1:0", "--log-format", "json")
	if code != cli.ExitFailure || out != "" {
		t.Fatalf("exit %d stdout %q, want %d and nothing", code, out, cli.ExitFailure)
	}
	lines := strings.Split(strings.TrimSuffix(errs, "\n"), "\n")
	for i, l := range lines {
		if !json.Valid([]byte(l)) {
			t.Fatalf("stderr line %d is not JSON: %q", i+1, l)
		}
	}
	if last := lines[len(lines)-1]; !strings.Contains(last, `"msg":"serve failed"`) || !strings.Contains(last, dead) {
		t.Fatalf("last line %q, want the failure with its error", last)
	}
}
