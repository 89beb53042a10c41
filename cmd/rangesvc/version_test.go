package main

import (
	"bytes"
	gobuildinfo "debug/buildinfo"
	"encoding/json"
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/server/buildinfo"
	"github.com/idrange/idrange/internal/server/cli"
	"github.com/idrange/idrange/internal/testing/testenv"
)

// runBinary runs bin with args and returns its stdout, failing t on a
// non-zero exit.
func runBinary(t *testing.T, bin string, args ...string) string {
	t.Helper()
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstderr: %s", filepath.Base(bin), args, err, stderr.String())
	}
	return stdout.String()
}

func versionJSON(t *testing.T, bin string) buildinfo.Info {
	t.Helper()
	var in buildinfo.Info
	out := runBinary(t, bin, "version", "-o", "json")
	if err := json.Unmarshal([]byte(out), &in); err != nil {
		t.Fatalf("version -o json printed %q: %v", out, err)
	}
	return in
}

// `rangesvc version` of a binary built in the checkout prints the module
// version and Go version the go command recorded in it (read back with
// debug/buildinfo, the same data `go version -m` prints) and the revision
// `git rev-parse HEAD` names.
func TestVersionSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the rangesvc binary")
	}
	// -buildvcs=true overrides a GOFLAGS=-buildvcs=false in the environment.
	bin := testenv.BuildWith(t, "-buildvcs=true")
	bi, err := gobuildinfo.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	got := versionJSON(t, bin)
	if got.Version != bi.Main.Version || got.Version == "" || got.GoVersion != bi.GoVersion {
		t.Fatalf("version -o json = %+v; the binary records version %q, go %q", got, bi.Main.Version, bi.GoVersion)
	}
	text := runBinary(t, bin, "version")
	if !strings.Contains(text, "version:  "+bi.Main.Version+"\n") || !strings.Contains(text, "go:       "+bi.GoVersion+"\n") {
		t.Fatalf("version printed\n%s\nwant version %q and go %q", text, bi.Main.Version, bi.GoVersion)
	}

	rev := ""
	for _, s := range bi.Settings {
		if s.Key == "vcs.revision" {
			rev = s.Value
		}
	}
	if rev == "" {
		// cmd/go stamps VCS data only when the module sits in a directory
		// with a .git directory: a git worktree (.git is a file) or a
		// source tree without git gets none.
		testenv.Missing(t, "a .git directory",
			fmt.Sprintf("the go command stamps a revision only in a git clone, not a worktree or an export (CI runs in a clone); module version %q checked, revision not", bi.Main.Version))
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("git rev-parse HEAD: %v", err)
	}
	if want := strings.TrimSpace(string(head)); got.Revision != want {
		t.Fatalf("version revision %q, want git HEAD %q", got.Revision, want)
	}
	if !strings.Contains(text, "revision: "+got.Revision) {
		t.Fatalf("version printed\n%s\nwant revision %s", text, got.Revision)
	}
}

// A release build sets the version at link time; version prints it.
func TestVersionLdflagsSubprocess(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the rangesvc binary")
	}
	bin := testenv.BuildWith(t, "-ldflags=-X github.com/idrange/idrange/internal/server/buildinfo.Version=v1.2.3")
	if got := versionJSON(t, bin); got.Version != "v1.2.3" {
		t.Fatalf("version = %q, want v1.2.3 (set by -ldflags -X)", got.Version)
	}
	if text := runBinary(t, bin, "version"); !strings.HasPrefix(text, "version:  v1.2.3\n") {
		t.Fatalf("version printed\n%s", text)
	}
}

func TestVersionInProcess(t *testing.T) {
	code, out, errs := runCmd("version", "-o", "json")
	if code != cli.ExitOK {
		t.Fatalf("exit %d: %s", code, errs)
	}
	var in buildinfo.Info
	if err := json.Unmarshal([]byte(out), &in); err != nil || in.GoVersion != runtime.Version() {
		t.Fatalf("version -o json = %q (%v)", out, err)
	}
	if code, _, errs := runCmd("version", "-o", "yaml"); code != cli.ExitUsage || !strings.Contains(errs, `-o "yaml"`) {
		t.Fatalf("version -o yaml: exit %d, stderr %q", code, errs)
	}
}
