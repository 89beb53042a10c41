package main

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

// knownInternalOffenders are the exported features of the public packages
// allowed to name an internal type: none. TestNoExportedSignatureNamesAnInternalType
// fails on every offender not listed here, and on every entry that no
// longer matches a feature, so an entry cannot outlive its offender.
var knownInternalOffenders = []string{}

// internalPath matches a package path with an "internal" element followed
// by the name of one of its types, as a feature line prints it: this
// module's paths without the module prefix (internal/testing/hdr.Summary),
// other modules' in full (google.golang.org/grpc/internal/x.T).
var internalPath = regexp.MustCompile(`(?:^|[^\w./-])((?:[\w.-]+/)*internal(?:/[\w.-]+)*)\.[A-Za-z_]\w*`)

// internalTypes returns the internal packages a feature line names types of.
func internalTypes(line string) []string {
	var pkgs []string
	for _, m := range internalPath.FindAllStringSubmatch(line, -1) {
		pkgs = append(pkgs, m[1])
	}
	return pkgs
}

func TestInternalTypes(t *testing.T) {
	for _, c := range []struct {
		line string
		want []string
	}{
		{"pkg bench, type Report struct, Machine internal/testing/machine.Info", []string{"internal/testing/machine"}},
		{"pkg bench, type Report struct, ServerLatency map[string]internal/testing/hdr.Summary", []string{"internal/testing/hdr"}},
		{"pkg bench, type VerifySummary struct, MissingCodes []internal/testing/idcheck.Code", []string{"internal/testing/idcheck"}},
		{"pkg x, func F(*internal/a.T, func(internal/b.U)) (chan internal/c.V, error)", []string{"internal/a", "internal/b", "internal/c"}},
		{"pkg x, type T struct, embedded google.golang.org/grpc/internal/status.Status", []string{"google.golang.org/grpc/internal/status"}},
		{"pkg x, type Dur = internal/testing/report.Dur", []string{"internal/testing/report"}},
		// Not internal: public packages, names that merely contain the word.
		{"pkg rangeclient, func New(context.Context, Config) (*Client, error)", nil},
		{"pkg x, type T struct, Internal segment.Lease", nil},
		{"pkg x, func F(myinternal/a.T, internalx.U)", nil},
	} {
		if got := internalTypes(c.line); !slices.Equal(got, c.want) {
			t.Errorf("internalTypes(%q) = %q, want %q", c.line, got, c.want)
		}
	}
}

// TestNoExportedSignatureNamesAnInternalType: a type that appears in a
// public package's exported API must be one its callers can name, so no
// exported signature, field, alias or embedded type of a public package
// names a type of an internal package (this module's or another's).
func TestNoExportedSignatureNamesAnInternalType(t *testing.T) {
	if testing.Short() {
		t.Skip("lists the public API from compiler export data")
	}
	pkgs, err := publicPackages()
	if err != nil {
		t.Fatal(err)
	}
	lines, err := listing(pkgs)
	if err != nil {
		t.Fatal(err)
	}
	known := map[string]bool{}
	for _, l := range knownInternalOffenders {
		known[l] = true
	}
	seen := map[string]bool{}
	var bad []string
	for _, l := range lines {
		if len(internalTypes(l)) == 0 {
			continue
		}
		seen[l] = true
		if known[l] {
			t.Logf("allow-listed (knownInternalOffenders): %s", l)
			continue
		}
		bad = append(bad, "  "+l)
	}
	var stale []string
	for _, l := range knownInternalOffenders {
		if !seen[l] {
			stale = append(stale, "  "+l)
		}
	}
	t.Logf("%d public packages, %d features, %d name an internal type (%d allow-listed)",
		len(pkgs), len(lines), len(seen), len(seen)-len(bad))
	if len(bad) > 0 {
		t.Errorf("%d exported feature(s) of public packages name an internal type, which callers cannot name:\n%s",
			len(bad), strings.Join(bad, "\n"))
	}
	if len(stale) > 0 {
		t.Errorf("knownInternalOffenders lists %d feature(s) that no longer name an internal type; remove them:\n%s",
			len(stale), strings.Join(stale, "\n"))
	}
}
