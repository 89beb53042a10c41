// Package testenv stands up idrange regions for other packages' tests: in
// process (embedded etcd + segment.Store + internal/service on a loopback
// port, with handles to stop and restart each part) or as a real
// `rangesvc serve` subprocess built once per test process.
//
// Everything listens on 127.0.0.1 with random ports and is torn down by
// t.Cleanup. Nothing here is used outside tests.
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

var (
	buildOnce sync.Once
	buildPath string
	buildErr  error
	buildOut  []byte
)

// Binary builds cmd/rangesvc once per test process (go build into a
// temporary directory) and returns the executable's path. Later calls reuse
// it. The directory is removed by Cleanup (call it from TestMain if you
// care); otherwise it stays in os.TempDir.
func Binary(t testing.TB) string {
	t.Helper()
	buildOnce.Do(func() {
		dir, err := os.MkdirTemp("", "idrange-rangesvc-*")
		if err != nil {
			buildErr = err
			return
		}
		buildPath = filepath.Join(dir, "rangesvc")
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, goTool(), "build", "-o", buildPath, RangesvcPackage)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		buildOut, buildErr = cmd.CombinedOutput()
	})
	if buildErr != nil {
		t.Fatalf("testenv: go build %s: %v\n%s", RangesvcPackage, buildErr, buildOut)
	}
	return buildPath
}

// Cleanup removes the binary built by Binary, if any.
func Cleanup() {
	if buildPath != "" {
		os.RemoveAll(filepath.Dir(buildPath))
	}
}

// goTool finds the go command: $PATH first, then the toolchain that built
// the test binary.
func goTool() string {
	if p, err := exec.LookPath("go"); err == nil {
		return p
	}
	return filepath.Join(runtime.GOROOT(), "bin", "go")
}
