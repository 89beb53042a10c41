package main

import (
	"context"
	"io"
	"os"
	"os/exec"
	"path/filepath"

	"github.com/cockroachdb/errors"

	"github.com/idrange/idrange/internal/server/cli"
)

// benchBinary is the binary that holds the measurement commands.
const benchBinary = "rangesvc-bench"

// lookBench finds rangesvc-bench: next to this executable first (installed
// together), then on $PATH. A variable so tests can point it elsewhere.
var lookBench = func() (string, error) {
	if self, err := os.Executable(); err == nil {
		p := filepath.Join(filepath.Dir(self), benchBinary)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	return exec.LookPath(benchBinary)
}

// forward runs `rangesvc-bench name args...` with this process's stdio and
// exits with its status, so `rangesvc compare` and `rangesvc bench` work as
// documented when both binaries are installed.
func forward(name string) func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	return func(ctx context.Context, args []string, stdout, stderr io.Writer) error {
		bin, err := lookBench()
		if err != nil {
			return errors.Newf("%s is in the %s binary, which is not installed next to rangesvc or on $PATH: "+
				"go install github.com/idrange/idrange/cmd/%s (or go run ./cmd/%s %s)", name, benchBinary, benchBinary, benchBinary, name)
		}
		cmd := exec.CommandContext(ctx, bin, append([]string{name}, args...)...)
		cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, stdout, stderr
		cmd.Cancel = func() error { return cmd.Process.Signal(os.Interrupt) } // let it stop its regions
		err = cmd.Run()
		var ee *exec.ExitError
		if errors.As(err, &ee) && ee.ExitCode() > 0 {
			return cli.ExitError{Code: ee.ExitCode()}
		}
		return err
	}
}
