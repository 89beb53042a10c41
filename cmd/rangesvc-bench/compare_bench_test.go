package main

import (
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/comparerun"
)

func TestCompareAndBenchUsage(t *testing.T) {
	for _, args := range [][]string{
		{"compare", "--format", "xml"},
		{"compare", "--batch", "9-3"},
		{"compare", "--strategies", "local,carrier-pigeon"},
		{"compare", "--goroutines", "0"},
		{"compare", "extra"},
		{"bench", "--regions", "5"},
		{"bench", "--workers", "0"},
		{"bench", "--format", "yaml"},
		{"bench", "--prefetch", "1.5"},
		{"bench", "--out", "/tmp/x"},
		{"bench", "--sweep", "--sweep-blocks", "4096,zero"},
	} {
		code, out, errs := runCmd(args...)
		if code != cli.ExitUsage {
			t.Errorf("%q: exit %d, want %d (stderr %q)", args, code, cli.ExitUsage, errs)
		}
		if out != "" {
			t.Errorf("%q: stdout %q, want nothing", args, out)
		}
	}
}

// compare with only the strategies that need no service runs in well under
// a second and prints JSON that decodes.
func TestCompareLocalJSON(t *testing.T) {
	code, out, errs := runCmd("compare", "--strategies", "local,uuidv7", "--duration", "200ms", "--goroutines", "2", "--format", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var rep comparerun.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, out)
	}
	if len(rep.Results) != 2 || rep.Results[0].Name != "local" || rep.Results[1].Name != "uuidv7" {
		t.Fatalf("results %+v", rep.Results)
	}
	if !strings.Contains(errs, "compare: local") {
		t.Errorf("no progress on stderr: %q", errs)
	}
}

// The help's strategy list is exactly the built-in strategies, in
// comparerun.Default's order (the --strategies default), and not empty, so
// it cannot fall behind comparerun.Default nor pass on an empty list.
func TestCompareUsageListsStrategies(t *testing.T) {
	_, list, ok := strings.Cut(compareUsage, "\nstrategies (--strategies, default all, in this order):\n")
	list, _, _ = strings.Cut(list, "\n\n")
	var listed []string
	for _, line := range strings.Split(list, "\n") {
		if f := strings.Fields(line); len(f) > 0 && strings.HasPrefix(line, "  ") && !strings.HasPrefix(line, "   ") {
			listed = append(listed, f[0])
		}
	}
	want := defaultStrategyNames()
	if !ok || len(want) == 0 || !slices.Equal(listed, want) {
		t.Errorf("compare usage lists strategies %q, comparerun.Default has %q; want the same, not empty", listed, want)
	}
}

// The peer libraries run in the same process and run as the local
// strategies do, without a service.
func TestComparePeersJSON(t *testing.T) {
	code, out, errs := runCmd("compare", "--strategies", "local,bwmarrin,sonyflake", "--duration", "200ms", "--goroutines", "2", "--format", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d, stderr %s", code, errs)
	}
	var rep comparerun.Report
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("stdout is not the JSON report: %v\n%s", err, out)
	}
	if len(rep.Results) != 3 || rep.Results[1].Name != "bwmarrin" || rep.Results[2].Name != "sonyflake" {
		t.Fatalf("results %+v", rep.Results)
	}
	for _, res := range rep.Results {
		if res.Verify.Checked == 0 || res.Verify.Duplicates != 0 || res.Error != "" {
			t.Errorf("%s: verify %+v, error %q", res.Name, res.Verify, res.Error)
		}
	}
	if strings.Contains(errs, "starting an in-process region") {
		t.Error("the peers started a region they do not need")
	}
}
