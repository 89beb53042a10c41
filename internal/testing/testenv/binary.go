// Package testenv runs idrange's binaries for other packages' tests: it
// builds cmd/rangesvc once per test process (a release build, and a fault
// build with -tags idrange_faults for tests that move the service clock) and
// runs `rangesvc serve` and `rangesvc mint` as subprocesses.
//
// In-process regions (embedded etcd + store + service + gRPC, the same
// construction as `rangesvc serve`) are internal/testing/localregion; its
// test helpers are internal/testing/localregion/regiontest.
//
// Everything listens on 127.0.0.1 with random ports and is torn down by
// t.Cleanup. Nothing here is used outside tests.
//
// It also decides what a test does when a tool it needs is missing
// (Missing, LookTool): skip locally, saying so; fail in CI mode (CI).
package testenv

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// RangesvcPackage is the import path of the binary Binary builds.
const RangesvcPackage = "github.com/idrange/idrange/cmd/rangesvc"

// FaultsTag is the build tag that compiles serve's test-only fault flags
// (--fault-clock-offset, --fault-clock-file and the SIGUSR1 handler) into
// the binary; a release build has none.
const FaultsTag = "idrange_faults"

// build is one variant of the binary, built at most once per test process.
type build struct {
	tags string
	once sync.Once
	path string
	err  error
	out  []byte
}

var (
	releaseBuild = &build{}
	faultBuild   = &build{tags: FaultsTag}
	buildDirMu   sync.Mutex
	buildDirs    []string
)

// Binary builds cmd/rangesvc as released (no fault hooks) once per test
// process and returns the executable's path. The directory is removed by
// Cleanup (call it from TestMain if you care); otherwise it stays in
// os.TempDir.
func Binary(t testing.TB) string {
	t.Helper()
	return releaseBuild.get(t)
}

// FaultBinary is Binary built with -tags idrange_faults: serve accepts the
// fault flags.
func FaultBinary(t testing.TB) string {
	t.Helper()
	return faultBuild.get(t)
}

func (b *build) get(t testing.TB) string {
	t.Helper()
	b.once.Do(func() {
		dir, err := os.MkdirTemp("", "idrange-rangesvc-*")
		if err != nil {
			b.err = err
			return
		}
		buildDirMu.Lock()
		buildDirs = append(buildDirs, dir)
		buildDirMu.Unlock()
		b.path = filepath.Join(dir, "rangesvc")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-tags", b.tags, "-o", b.path, RangesvcPackage)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		b.out, b.err = cmd.CombinedOutput()
	})
	if b.err != nil {
		t.Fatalf("testenv: go build -tags %q %s: %v\n%s", b.tags, RangesvcPackage, b.err, b.out)
	}
	return b.path
}

// BuildWith builds cmd/rangesvc with extra `go build` flags (for example
// "-buildvcs=true" or "-ldflags=-X ...") into t.TempDir() and returns the
// executable's path. Unlike Binary it builds on every call: tests of the
// build itself (rangesvc version) use it.
func BuildWith(t testing.TB, flags ...string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "rangesvc")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	args := append(append([]string{"build"}, flags...), "-o", path, RangesvcPackage)
	cmd := exec.CommandContext(ctx, goTool(), args...)
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("testenv: go %v: %v\n%s", args, err, out)
	}
	return path
}

// Cleanup removes the binaries built by Binary and FaultBinary, if any.
func Cleanup() {
	buildDirMu.Lock()
	defer buildDirMu.Unlock()
	for _, d := range buildDirs {
		os.RemoveAll(d)
	}
	buildDirs = nil
}

// goTool finds the go command: $PATH first, then the toolchain that built
// the test binary.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
