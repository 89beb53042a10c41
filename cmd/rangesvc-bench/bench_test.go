package main

import (
	"strconv"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/benchrun"
)

// A --cpu-hog outside 0..MaxCPUHog is a usage error whose one line names
// the flag, and nothing runs.
func TestBenchCPUHogRefused(t *testing.T) {
	for _, v := range []string{"-1", strconv.Itoa(benchrun.MaxCPUHog() + 1), "two"} {
		code, out, errs := runCmd("bench", "--cpu-hog", v)
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, "cpu-hog") {
			t.Errorf("--cpu-hog %s: exit %d, stdout %q, stderr %q", v, code, out, errs)
		}
		if first := strings.SplitN(errs, "\n", 2)[0]; !strings.Contains(first, "cpu-hog") {
			t.Errorf("--cpu-hog %s: first line %q does not name the flag", v, first)
		}
	}
}
