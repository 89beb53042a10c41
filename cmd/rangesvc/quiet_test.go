package main

import (
	"bytes"
	"context"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/idrange/idrange/internal/testing/testenv"
	"github.com/idrange/idrange/snowflake"
)

// A replica left quiet for longer than a block lives, its minter's idle
// timeout (30 s) and several lease renewals still serves the default
// client (Codes 0, the shared path) at once: the first `rangesvc mint`
// after the quiet and the two after it each return within 1 s, with IDs
// of the replica's region that are unique and within the time bound. Until
// the replica's minter counted carves as demand, each of them failed after
// its full 20 s (docs/design.md, "The shared path": the demand rule).
//
// The quiet lasts quietPeriods: 90 s by default, and 75 s and 10 minutes
// as well with -tags soak.
func TestQuietReplicaServesTheDefaultClient(t *testing.T) {
	if testing.Short() {
		t.Skip("subprocess test: skipped with -short")
	}
	for _, quiet := range quietPeriods {
		t.Run(quiet.String(), func(t *testing.T) {
			t.Parallel() // each one mostly waits
			const region = 1
			srv := testenv.StartServe(t, testenv.ServeConfig{Region: region})
			all := mintTimed(t, srv.GRPCAddr, region, 3, 0) // works at once, as it did before
			time.Sleep(quiet)
			for i := range 3 {
				all = append(all, mintTimed(t, srv.GRPCAddr, region, 3, i+1)...)
			}
			checkFromRegion(t, all, region)
		})
	}
}

// mintTimed runs `rangesvc mint -n n` against target (a new default
// client, as a user runs it), fails the test unless it succeeds within
// 1 s with IDs within 1 s behind and the lead ahead of the moment it
// returned, and logs the time it took (try names the try in the log).
func mintTimed(t *testing.T, target string, region, n, try int) []snowflake.ID {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // well past the bound, well before mint's own 20 s
	defer cancel()
	cmd := exec.CommandContext(ctx, testenv.Binary(t), "mint", "--target", target, "-n", strconv.Itoa(n))
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	t.Logf("mint %d: %v", try, took.Round(time.Millisecond))
	if err != nil {
		t.Fatalf("rangesvc mint (try %d) failed after %v: %v\nstderr: %s", try, took, err, stderr.String())
	}
	if took > time.Second {
		t.Fatalf("rangesvc mint (try %d) took %v, want at most 1 s\nstderr: %s", try, took, stderr.String())
	}
	lines := strings.Fields(stdout.String())
	if len(lines) != n {
		t.Fatalf("rangesvc mint -n %d printed %d IDs: %q", n, len(lines), stdout.String())
	}
	ids := make([]snowflake.ID, n)
	for i, l := range lines {
		id, err := snowflake.Parse(l)
		if err != nil {
			t.Fatalf("rangesvc mint printed %q: %v", l, err)
		}
		at := id.Time()
		if at.Before(start.Add(-time.Second)) || at.After(start.Add(took).Add(15*time.Second)) {
			t.Fatalf("ID %d (try %d) has time %v, minted between %v and %v", id, try, at, start, start.Add(took))
		}
		ids[i] = id
	}
	return ids
}

// checkFromRegion fails unless ids are unique and all of region.
func checkFromRegion(t *testing.T, ids []snowflake.ID, region int) {
	t.Helper()
	seen := make(map[snowflake.ID]bool, len(ids))
	for _, id := range ids {
		if seen[id] {
			t.Fatalf("ID %d handed out twice", id)
		}
		seen[id] = true
		if r := id.Parts().Region; r != region {
			t.Fatalf("ID %d of region %d, want %d", id, r, region)
		}
	}
}
