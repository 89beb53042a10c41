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
// python3, openssl, an external etcd) or another precondition of the
// machine (an open-file limit, /proc, the OS): locally it skips t, saying
// what is missing and how to get it; in CI mode it fails t with the same
// words, so CI never turns green with a check that did not run. tool names
// what is missing; how says how to get it (".ci/run installs it" included).
// The other skips of the tree are -short (asked for) and SkipUnderRace.
func Missing(t testing.TB, tool, how string) {
	t.Helper()
	if CI() {
		t.Fatalf("%s is missing, and CI mode (CI=true or IDRANGE_CI=1) runs every test: %s", tool, how)
	}
	t.Skipf("skipped: %s is missing: %s (in CI mode, CI=true, this fails)", tool, how)
}

// RaceSkipPrefix begins the reason of every SkipUnderRace skip. scripts/test
// reads it (through internal/tools/testfilter -pinned): a test skipped with
// it must be one that scripts/test runs again, pinned, without -race.
const RaceSkipPrefix = "skipped under -race, pinned in scripts/test to run without it: "

// SkipUnderRace skips t when the race detector is on, saying why (a test
// too slow under it to run in the -race pass of scripts/test). It is the
// one way a test skips under -race: scripts/test runs such a test again
// by name without -race, and fails when a test skipped with this reason is
// not in its pinned list, so a skip cannot hide a test that nothing runs.
// Without the race detector it does nothing.
func SkipUnderRace(t testing.TB, why string) {
	t.Helper()
	if Race {
		t.Skipf("%s%s", RaceSkipPrefix, why)
	}
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
