//go:build !idrange_faults

package main

import (
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
)

// A release build has no fault flags: serve rejects them as unknown (exit
// 2) and its -h does not list them.
func TestReleaseBuildHasNoFaultFlags(t *testing.T) {
	if faultsBuild {
		t.Fatal("faultsBuild is true without -tags idrange_faults")
	}
	for _, flag := range []string{"--fault-clock-offset", "--fault-clock-file"} {
		code, out, errs := runCmd("serve", "--region", "0", flag, "2s")
		if code != cli.ExitUsage || out != "" || !strings.Contains(errs, "flag provided but not defined: "+flag[1:]) {
			t.Errorf("serve %s: exit %d, stdout %q, stderr %q; want exit %d, unknown flag", flag, code, out, errs, cli.ExitUsage)
		}
	}
	code, _, errs := runCmd("serve", "-h")
	if code != cli.ExitOK || !strings.Contains(errs, "-region") {
		t.Fatalf("serve -h: exit %d, stderr %q", code, errs)
	}
	if strings.Contains(errs, "-fault-") || strings.Contains(errs, "TEST ONLY") {
		t.Fatalf("serve -h of a release build lists fault flags:\n%s", errs)
	}
}
