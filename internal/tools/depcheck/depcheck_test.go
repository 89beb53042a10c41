package depcheck

import (
	"bufio"
	"bytes"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"testing"

	"github.com/idrange/idrange/internal/testing/testenv"
)

const module = "github.com/idrange/idrange"

// A rule is one library's dependency limit. A package is a violation when
// it matches a forbidden entry (a path ending in "/" forbids everything
// under it; any other path forbids that package and the packages under
// it), or, with stdlibOnly, when it is neither in the standard library nor
// a package of this module (this module's own packages are held to the
// same rule through their own imports). tags, if set, are the build tags
// the dependencies are listed with; allow exempts packages from forbidden.
type rule struct {
	pkg        string
	tags       string
	forbidden  []string
	allow      []string
	stdlibOnly bool
}

var rules = []rule{
	{pkg: "snowflake", stdlibOnly: true},
	{pkg: "tlsfiles", stdlibOnly: true},
	{pkg: "publicid", stdlibOnly: true},
	{pkg: "rangeclient", forbidden: clientForbidden},
	// The test double users link into their tests: the same limits as the
	// client, and no server part beyond the grant loop and its in-memory
	// storage.
	{pkg: "rangeclient/rangeclienttest", forbidden: clientForbidden},
	// The engine behind rangeclient: the client's limits, and nothing of
	// the server's group.
	{pkg: "internal/client/engine", forbidden: append([]string{module + "/internal/server/"}, clientForbidden...)},
	{pkg: "segment", forbidden: []string{"go.etcd.io/", "github.com/cockroachdb/"}},
	// The binaries: Prometheus's server module is required only for the
	// PromQL parser in internal/tools/monitorcheck's tests.
	{pkg: "cmd/rangesvc", forbidden: append([]string{prometheusServer}, notInServer...)},
	// The fault build (-tags idrange_faults) is what the fault suite and
	// the end-to-end tests run: the same server, so the same limits, but
	// for the offset clock its --fault-clock-file moves.
	{pkg: "cmd/rangesvc", tags: "idrange_faults", forbidden: append([]string{prometheusServer}, notInServer...),
		allow: []string{module + "/internal/testing/fakeclock"}},
	{pkg: "cmd/rangesvc-bench", forbidden: []string{prometheusServer}},
}

// clientForbidden is what a program that links the client (or its test
// double) must not link: etcd, zap, sentry, gogo, cockroachdb (errors and
// its dependencies) and Prometheus's server.
var clientForbidden = []string{
	"go.etcd.io/", "go.uber.org/zap", "github.com/getsentry/", "github.com/gogo/", "github.com/cockroachdb/",
	prometheusServer,
}

// notInServer is what the server binary must not link: the testing
// package (and testing/...), the benchmark packages, the test harnesses
// and the fault suite. What rangesvc runs lives in the public libraries
// and internal/server/.
var notInServer = []string{
	"testing",
	module + "/bench", module + "/compare",
	module + "/internal/testing/", module + "/internal/faultsuite/",
}

// prometheusServer is the Prometheus server module (not its client
// library, github.com/prometheus/client_golang).
const prometheusServer = "github.com/prometheus/prometheus/"

// dep is one line of `go list -deps`.
type dep struct {
	path     string
	standard bool
	imports  []string
}

// goTool finds the go command: the one of the toolchain that built this
// test first, then PATH.
func goTool(t *testing.T) string {
	if p := filepath.Join(runtime.GOROOT(), "bin", "go"); runtime.GOROOT() != "" {
		if _, err := exec.LookPath(p); err == nil {
			return p
		}
	}
	return testenv.LookTool(t, "go", "depcheck lists dependencies with the go command; found neither in GOROOT/bin nor on PATH")
}

// listDeps returns every package pkg depends on (itself included), in
// `go list -deps` order, keyed by import path.
func listDeps(t *testing.T, goBin, tags, pkg string) (map[string]dep, []string) {
	t.Helper()
	cmd := exec.Command(goBin, "list", "-deps", "-tags", tags, "-f", `{{.ImportPath}} {{.Standard}} {{join .Imports ","}}`, pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	deps := map[string]dep{}
	var order []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue
		}
		d := dep{path: f[0], standard: f[1] == "true"}
		if len(f) > 2 {
			d.imports = strings.Split(f[2], ",")
		}
		deps[d.path] = d
		order = append(order, d.path)
	}
	return deps, order
}

// chain is the shortest import chain from root to target.
func chain(deps map[string]dep, root, target string) string {
	prev := map[string]string{root: ""}
	queue := []string{root}
	for len(queue) > 0 {
		p := queue[0]
		queue = queue[1:]
		if p == target {
			var path []string
			for q := p; q != ""; q = prev[q] {
				path = append(path, strings.TrimPrefix(q, module+"/"))
			}
			slices.Reverse(path)
			return strings.Join(path, " -> ")
		}
		for _, i := range deps[p].imports {
			if _, seen := prev[i]; !seen {
				prev[i] = p
				queue = append(queue, i)
			}
		}
	}
	return target + " (no chain found)"
}

func (r rule) violates(d dep) bool {
	if r.stdlibOnly && !d.standard && d.path != module && !strings.HasPrefix(d.path, module+"/") {
		return true
	}
	if slices.Contains(r.allow, d.path) {
		return false
	}
	for _, f := range r.forbidden {
		if forbids(f, d.path) {
			return true
		}
	}
	return false
}

// forbids: f ending in "/" forbids every path under it; any other f
// forbids itself and the paths under it (not "testingx" for "testing").
func forbids(f, path string) bool {
	if strings.HasSuffix(f, "/") {
		return strings.HasPrefix(path, f)
	}
	return path == f || strings.HasPrefix(path, f+"/")
}

func TestForbids(t *testing.T) {
	for _, c := range []struct {
		f, path string
		want    bool
	}{
		{"testing", "testing", true},
		{"testing", "testing/synctest", true},
		{"testing", "testingx", false},
		{module + "/bench", module + "/bench", true},
		{module + "/bench", module + "/benchmark", false},
		{module + "/internal/testing/", module + "/internal/testing/hdr", true},
		{module + "/internal/testing/", module + "/internal/server/store", false},
		{"go.uber.org/zap", "go.uber.org/zap/zapcore", true},
		{"go.etcd.io/", "go.etcd.io/etcd/client/v3", true},
	} {
		if got := forbids(c.f, c.path); got != c.want {
			t.Errorf("forbids(%q, %q) = %v, want %v", c.f, c.path, got, c.want)
		}
	}
}

// TestDependencySets fails when a forbidden package enters a library's
// dependency set, naming the packages and, for the first of each
// top-level source, the import chain that brings it in.
func TestDependencySets(t *testing.T) {
	goBin := goTool(t)
	for _, r := range rules {
		name := r.pkg
		if r.tags != "" {
			name += "+" + r.tags
		}
		t.Run(name, func(t *testing.T) {
			root := module + "/" + r.pkg
			deps, order := listDeps(t, goBin, r.tags, root)
			var nonStd, own, bad []string
			for _, p := range order {
				d := deps[p]
				if d.standard {
					// Forbidden entries hold for the standard library
					// too ("testing" in a binary).
					if r.violates(d) {
						bad = append(bad, p)
					}
					continue
				}
				if p == root {
					continue
				}
				nonStd = append(nonStd, p)
				if strings.HasPrefix(p, module+"/") {
					own = append(own, strings.TrimPrefix(p, module+"/"))
				}
				if r.violates(d) {
					bad = append(bad, p)
				}
			}
			t.Logf("%s: %d non-standard packages (%d of this module: %v), %d forbidden",
				r.pkg, len(nonStd), len(own), own, len(bad))
			if len(bad) == 0 {
				return
			}
			// One chain per distinct first hop outside this module, so the
			// report names each way a forbidden package gets in.
			shown := map[string]bool{}
			var chains []string
			for _, p := range bad {
				c := chain(deps, root, p)
				hops := strings.Split(c, " -> ")
				key := c
				for _, h := range hops[1:] {
					if strings.Contains(h, ".") { // outside this module (trimmed above)
						key = prefix(h)
						break
					}
				}
				if !shown[key] {
					shown[key] = true
					chains = append(chains, "  "+c)
				}
			}
			t.Errorf("%s pulls %d forbidden package(s) (rule: %s):\n%s\nimport chains:\n%s",
				r.pkg, len(bad), r.describe(), summarize(bad), strings.Join(chains, "\n"))
		})
	}
}

func (r rule) describe() string {
	if r.stdlibOnly {
		return "standard library and stdlib-only packages of this module"
	}
	return "none of " + strings.Join(r.forbidden, " ")
}

// summarize lists the forbidden packages grouped by prefix, with counts.
func summarize(bad []string) string {
	counts := map[string]int{}
	var keys []string
	for _, p := range bad {
		k := prefix(p)
		if counts[k] == 0 {
			keys = append(keys, k)
		}
		counts[k]++
	}
	slices.Sort(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString("  " + k + " (" + itoa(counts[k]) + ")\n")
	}
	return strings.TrimRight(b.String(), "\n")
}

// prefix is the first three elements of an import path, roughly its module.
func prefix(p string) string {
	e := strings.SplitN(p, "/", 4)
	return strings.Join(e[:min(3, len(e))], "/")
}

func itoa(n int) string {
	var buf [20]byte
	i := len(buf)
	for {
		i--
		buf[i] = byte('0' + n%10)
		n /= 10
		if n == 0 {
			return string(buf[i:])
		}
	}
}
