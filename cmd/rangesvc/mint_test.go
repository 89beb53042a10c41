package main

import (
	"fmt"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/snowflake"
)

func TestMintFlagsDefaults(t *testing.T) {
	c, err := parseMintFlags([]string{"--target", "127.0.0.1:7070", "-n", "5"}, &strings.Builder{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Region != -1 {
		t.Fatalf("Region without --region = %d, want -1 (ask the service)", c.Region)
	}
	for r := range snowflake.MaxRegion + 1 {
		c, err := parseMintFlags([]string{"--target", "127.0.0.1:7070", "-n", "5", "--region", fmt.Sprint(r)}, &strings.Builder{})
		if err != nil || c.Region != r {
			t.Fatalf("--region %d: Region %d, %v", r, c.Region, err)
		}
	}
}

// checkMintRegion runs `rangesvc mint` (in process) against a replica of
// region at addr: without --region it mints IDs of that region; with
// another region, 0 included, it fails (exit 1) naming both and prints
// nothing on stdout.
func checkMintRegion(t *testing.T, addr string, region int, seen map[snowflake.ID]bool) {
	t.Helper()
	code, out, errs := runCmd("mint", "--target", addr, "-n", "200")
	if code != cli.ExitOK {
		t.Fatalf("mint without --region: exit %d, stderr %q", code, errs)
	}
	var ids []snowflake.ID
	for _, l := range strings.Fields(out) {
		id, err := snowflake.Parse(l)
		if err != nil {
			t.Fatalf("mint printed %q: %v", l, err)
		}
		ids = append(ids, id)
	}
	if len(ids) != 200 {
		t.Fatalf("mint -n 200 printed %d IDs", len(ids))
	}
	checkIDs(t, region, seen, ids)
	for _, other := range []int{0, (region + 1) % (snowflake.MaxRegion + 1)} {
		if other == region {
			continue
		}
		code, out, errs := runCmd("mint", "--target", addr, "-n", "1", "--region", fmt.Sprint(other))
		if code != cli.ExitFailure || out != "" {
			t.Fatalf("mint --region %d against region %d: exit %d, stdout %q, stderr %q", other, region, code, out, errs)
		}
		if !strings.Contains(errs, fmt.Sprint(other)) || !strings.Contains(errs, fmt.Sprintf("serves region %d", region)) {
			t.Errorf("mint --region %d against region %d: stderr %q should name both regions", other, region, errs)
		}
	}
}
