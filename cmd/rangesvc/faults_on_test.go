//go:build idrange_faults

package main

import (
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
)

// The fault build (-tags idrange_faults) accepts the fault flags and lists
// them in serve -h.
func TestFaultBuildHasFaultFlags(t *testing.T) {
	if !faultsBuild {
		t.Fatal("faultsBuild is false with -tags idrange_faults")
	}
	c, err := parseServeFlags([]string{"--region", "0", "--fault-clock-offset", "-2s", "--fault-clock-file", "/tmp/x"}, &strings.Builder{})
	if err != nil || c.Faults.ClockOffset != -2e9 || c.Faults.ClockFile != "/tmp/x" {
		t.Fatalf("fault flags: %+v, %v", c, err)
	}
	code, _, errs := runCmd("serve", "-h")
	if code != cli.ExitOK || !strings.Contains(errs, "-fault-clock-offset") || !strings.Contains(errs, "-fault-clock-file") {
		t.Fatalf("serve -h: exit %d, stderr %q", code, errs)
	}
}
