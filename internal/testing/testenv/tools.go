package testenv

import (
	"os"
	"os/exec"
	"strconv"
	"testing"
)

// CIVars are the environment variables that turn on CI mode: CI (set to
// true by CI services, and how CI runs .ci/run) and IDRANGE_CI (this
// project's own, for runs where CI means something else).
var CIVars = []string{"CI", "IDRANGE_CI"}

// CI reports whether the tests run in CI mode: one of CIVars is set to
// anything but a false value ("", "0", "false"). An unparsable value (for
// example CI=yes) counts as on, so a typo makes the run stricter, not
// looser.
func CI() bool {
	for _, name := range CIVars {
		v := os.Getenv(name)
		if v == "" {
			continue
		}
		if on, err := strconv.ParseBool(v); err != nil || on {
			return true
		}
	}
	return false
}

// Missing is the one place a test gives up for want of a tool (promtool,
// python3, openssl, an external etcd): locally it skips t, saying what is
// missing and how to get it; in CI mode it fails t with the same words, so
// CI never turns green with a check that did not run. tool names what is
// missing; how says how to get it (".ci/run installs it" included).
func Missing(t testing.TB, tool, how string) {
	t.Helper()
	if CI() {
		t.Fatalf("%s is missing, and CI mode (CI=true or IDRANGE_CI=1) runs every test: %s", tool, how)
	}
	t.Skipf("skipped: %s is missing: %s (in CI mode, CI=true, this fails)", tool, how)
}

// LookTool is exec.LookPath for a tool a test needs: the tool's path, or
// Missing (a skip locally, a failure in CI mode) when it is not on PATH.
func LookTool(t testing.TB, tool, how string) string {
	t.Helper()
	p, err := exec.LookPath(tool)
	if err != nil {
		Missing(t, tool, how+" ("+err.Error()+")")
	}
	return p
}
