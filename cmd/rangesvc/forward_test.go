package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
)

// `rangesvc compare` and `rangesvc bench` run rangesvc-bench with the same
// arguments and stdio and exit with its status.
func TestCompareAndBenchForward(t *testing.T) {
	fake := filepath.Join(t.TempDir(), benchBinary)
	script := "#!/bin/sh\necho \"args: $*\"\necho progress >&2\n[ \"$2\" = --fail ] && exit 3\nexit 0\n"
	if err := os.WriteFile(fake, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	saved := lookBench
	t.Cleanup(func() { lookBench = saved })
	lookBench = func() (string, error) { return fake, nil }

	code, out, errs := runCmd("compare", "--strategies", "local")
	if code != cli.ExitOK || out != "args: compare --strategies local\n" || errs != "progress\n" {
		t.Fatalf("compare: exit %d, stdout %q, stderr %q", code, out, errs)
	}
	code, out, errs = runCmd("bench", "--fail")
	if code != 3 || out != "args: bench --fail\n" || errs != "progress\n" {
		t.Fatalf("bench: exit %d, stdout %q, stderr %q; want rangesvc-bench's status 3 and nothing added", code, out, errs)
	}

	lookBench = func() (string, error) { return "", errors.New("not found") }
	code, out, errs = runCmd("bench")
	if code != cli.ExitFailure || out != "" || !strings.Contains(errs, "go install github.com/idrange/idrange/cmd/rangesvc-bench") {
		t.Fatalf("bench without rangesvc-bench: exit %d, stdout %q, stderr %q", code, out, errs)
	}
}
